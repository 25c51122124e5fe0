"""Decayed linear attention (`config.linear_attention_decay`, hf_settransformer/decay.py): the causal ops' `decay`
against float64 references, forward and backward (chunks, padding, key dropout, carried states, the prefix op, the
one-token step, long sequences, autocast); decayed decoders (cached decoding, generate, padding, checkpointing,
compile, the gate's initialisation, save/load, a state that does not grow); the refusals; the many-target heads."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import (
    VOCAB,
    check_cached_steps,
    decoder,
    family_classes,
    left_padded_batch,
    make_model,
    many_target_head,
    tiny_config,
)
from transformers import AutoModel

import hf_settransformer as hfst
from hf_settransformer.cache import LinearAttentionCache
from hf_settransformer.decay import DECAYS, FixedDecay, GatedDecay, decay_applies, retnet_log_decay
from hf_settransformer.linear_naive import phi
from hf_settransformer.linear_naive import naive_decayed_linear_attention as ref_decayed
from hf_settransformer.linear_ops import (
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
    prefix_causal_linear_attention,
)

FEATURE_MAPS = ["elu", "exp"]
B, H, D, E = 2, 2, 6, 3
ATOL, RTOL = 2e-5, 1e-4
# log g per position: weak ~ a long memory (as the fixed schedule), strong ~ a gate that forgets within a few tokens
STRENGTHS = {"weak": 0.05, "strong": 3.0}


# ---------------------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these small and sequential kernels ran 6x slower with two threads on two shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _inputs(n, m=None, scale=1.0, strength=0.05, seed=0, b=B, h=H, d=D, e=E):
    """q (b,h,n,d), k (b,h,m,d), v (b,h,m,e) and a log-decay (b,h,m) of -U(0, strength), float64."""
    m = n if m is None else m
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, m, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, m, e, generator=g, dtype=torch.float64)
    logd = -torch.rand(b, h, m, generator=g, dtype=torch.float64) * strength
    return q, k, v, logd


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _padding(kind, m):
    """(B, m) key masks whose every real query sees a real key: 'left' (row 1's first 4 keys padded) or 'middle'
    (row 0's keys 3, 4 and row 1's key 7 padded)."""
    mask = torch.ones(B, m, dtype=torch.bool)
    if kind == "left":
        mask[1, :4] = False
    else:
        mask[0, 3:5] = False
        mask[1, 7] = False
    return mask


def reference(q, k, v, logd, allowed, where, feature_map):
    """float64 w_ij = phi(q_i) . phi(k_j) exp(G_{where_i} - G_j) over the `allowed` (b or 1, h or 1, n, m) keys, G the
    cumulative sum of `logd` as given (zero it at padding first); the exp map in log space. A query that sees no key
    gives 0, with finite gradients (the package's reference gives NaN ones there: a softmax of -inf)."""
    q, k, v = q.double(), k.double(), v.double()
    g = logd.double().cumsum(dim=-1)
    allowed = allowed.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    gaps = (g[..., where][..., :, None] - g[..., None, :]).masked_fill(~allowed, float("-inf"))
    seen = allowed.any(dim=-1, keepdim=True)
    if feature_map == "elu":
        w = (phi(q, feature_map) @ phi(k, feature_map).transpose(-1, -2)) * torch.exp(gaps)
        den = w.sum(-1, keepdim=True)
        return (w @ v) / torch.where(seen, den, torch.ones_like(den))
    logw = torch.logsumexp(q[..., :, None, :] + k[..., None, :, :], dim=-1) + gaps
    logw = torch.where(seen, logw, torch.zeros_like(logw))
    return (torch.softmax(logw, dim=-1) * seen) @ v


def _causal_allowed(n, key_mask=None, keep=None):
    """(b or 1, h or 1, n, n): j <= i, a real key, a kept one (`keep` (b, h, n))."""
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if keep is not None:
        allowed = allowed & keep[:, :, None, :]
    return allowed


def _assert_grads_close(got_out, want_out, leaves, want_leaves, weight, names="qkvd", atol=ATOL, rtol=RTOL):
    got = torch.autograd.grad((got_out.double() * weight).sum(), leaves)
    want = torch.autograd.grad((want_out * weight).sum(), want_leaves)
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), f"d/d{name} not finite"
        torch.testing.assert_close(a.double(), b, atol=atol, rtol=rtol, msg=lambda m, name=name: f"d/d{name}: {m}")


def _weight(shape, seed=8):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# 1. the ops against the float64 references, forward and backward


# (feature map, chunk, decay, q/k scale): every chunk size with unit inputs; keys x30 (the exp map's steep path) for
# exp at chunks 1, 5 and 8 (elu's features underflow fp32 at x30, decay or not). A steep chunk of 64 (a strong decay,
# or keys x30) is where the exp kernel's gradient turns NaN: test_causal_exp_steep_chunk_gradients_are_finite
CHUNK_CASES = (
    [(f, c, s, 1.0) for f in FEATURE_MAPS for c in (1, 5, 8, 64) for s in STRENGTHS if (f, c, s) != ("exp", 64, "strong")]
    + [("exp", c, s, 30.0) for c in (1, 5, 8) for s in STRENGTHS]
)


@pytest.mark.parametrize("feature_map,chunk,strength,scale", CHUNK_CASES, ids=lambda x: str(x))
def test_causal_chunks_match_the_reference_forward_and_backward(feature_map, chunk, strength, scale):
    """n = 21 (not a multiple of 5 or 8; one short chunk at 64): out and d/d(q, k, v, decay) of the chunked op are
    those of `naive_decayed_linear_attention`. Keys x30 drive the exp kernel's steep (exact per-position) path."""
    n = 21
    q, k, v, logd = _inputs(n, scale=scale, strength=STRENGTHS[strength], seed=chunk)
    leaves = _leaves(q, k, v, logd)
    out, state = causal_linear_attention(*leaves[:3], feature_map=feature_map, chunk_size=chunk, decay=leaves[3])
    want_leaves = _leaves(q, k, v, logd)
    expected = ref_decayed(*want_leaves, None, feature_map)
    assert out.dtype == torch.float32 and state.kv.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape))


@pytest.mark.parametrize("decay", ["none", "weak_x30", "strong"])
def test_causal_exp_steep_chunk_gradients_are_finite(decay):
    """A chunk of 64 whose keys span 100+ nats (keys x30), or whose keys a strong gate (log g ~ -1.5 per token) takes
    back to the chunk's start, is steep: its outputs come from the exact per-position path, and are right. Their
    gradients must be finite too; the fast path's ratio, whose rows the exact path replaces, still divides by
    denominators that underflow (den^2 = 0 in DivBackward: 0 * inf = NaN in d/dq, d/dk and d/d(decay)). Fails at
    5c3d7a4 (linear_torch._causal_exp_linear_attention), also with no decay; a floor on that ratio's denominator passes."""
    # (q/k scale, decay strength, n): keys x30 with no decay or a weak one; unit keys with a strong decay
    scale, strength, n = {"none": (30.0, 0.0, 21), "weak_x30": (30.0, 0.05, 21), "strong": (1.0, 3.0, 128)}[decay]
    q, k, v, logd = _inputs(n, scale=scale, strength=strength, seed=2, d=8, e=8)  # seed 2: a NaN with no decay too
    leaves = _leaves(q, k, v, logd)
    op_decay = None if decay == "none" else leaves[3]
    out, _ = causal_linear_attention(*leaves[:3], feature_map="exp", chunk_size=64, decay=op_decay)
    want_leaves = _leaves(q, k, v, logd)
    expected = ref_decayed(*want_leaves[:3], want_leaves[3] * (decay != "none"), None, "exp")
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)
    names, leaves, want_leaves = ("qkv", leaves[:3], want_leaves[:3]) if decay == "none" else ("qkvd", leaves, want_leaves)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape), names=names)


@pytest.mark.parametrize("padding", ["left", "middle"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_padding_does_not_decay(feature_map, padding):
    """A padded key is out of every sum and its position does not decay (padding is not time): the reference's G is
    the cumulative log-decay over the real positions. Outputs and gradients of the real queries (a padded query's
    output is never read)."""
    n = 19
    q, k, v, logd = _inputs(n, strength=0.5, seed=2)
    mask = _padding(padding, n)
    leaves = _leaves(q, k, v, logd)
    out, _ = causal_linear_attention(*leaves[:3], mask, feature_map=feature_map, chunk_size=8, decay=leaves[3])
    want_leaves = _leaves(q, k, v, logd)
    expected = reference(*want_leaves[:3], want_leaves[3].masked_fill(~mask[:, None], 0.0), _causal_allowed(n, mask),
                         torch.arange(n), feature_map)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], expected[real], atol=ATOL, rtol=RTOL)
    # the package's reference agrees on the real queries
    torch.testing.assert_close(ref_decayed(q, k, v, logd, mask, feature_map)[real], expected[real].detach())
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape) * real)
    if padding == "middle":  # the padded positions' log-decay gets no gradient (it is not applied)
        got = torch.autograd.grad(
            causal_linear_attention(*leaves[:3], mask, feature_map=feature_map, chunk_size=8, decay=leaves[3])[0].sum(),
            leaves[3],
        )[0]
        assert torch.all(got[0, :, 3:5] == 0) and torch.all(got[1, :, 7] == 0)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_a_dropped_key_still_decays(feature_map):
    """Key dropout (`drop`, per head) leaves a key out of every sum, but its position is still time: the state decays
    there (unlike padding). Against the reference over the kept keys with G over every position; and it differs from
    the op that takes the dropped keys as padding (no decay there)."""
    n = 23
    q, k, v, logd = _inputs(n, strength=0.5, seed=3)
    keep = torch.rand(B, H, n, generator=torch.Generator().manual_seed(4)) >= 0.3
    keep[..., 0] = True  # every query sees a key
    mask = _padding("middle", n)
    leaves = _leaves(q, k, v, logd)
    out, _ = causal_linear_attention(*leaves[:3], mask, feature_map=feature_map, chunk_size=5, drop=keep,
                                     decay=leaves[3])
    want_leaves = _leaves(q, k, v, logd)
    expected = reference(*want_leaves[:3], want_leaves[3].masked_fill(~mask[:, None], 0.0),
                         _causal_allowed(n, mask, keep), torch.arange(n), feature_map)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], expected[real], atol=ATOL, rtol=RTOL)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape) * real)
    # had the dropped keys been padding, their positions would not decay: another result
    as_padding = reference(q, k, v, logd.masked_fill(~(mask[:, None] & keep), 0.0), _causal_allowed(n, mask, keep),
                           torch.arange(n), feature_map)
    assert (as_padding[real] - expected[real].detach()).abs().max() > 1e-3
    # the prefix op: dropped leading keys decay as well (6 leading keys, a prefix of 4 queries)
    n, m, prefix = 11, 17, 4
    q, k, v, logd = _inputs(n, m, strength=0.5, seed=13)
    keep = torch.rand(B, H, m, generator=torch.Generator().manual_seed(14)) >= 0.3
    keep[..., 0] = True
    out, _ = prefix_causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=4, prefix_length=prefix,
                                            drop=keep, decay=logd)
    where = torch.clamp(torch.arange(n) + (m - n), min=m - n + prefix - 1)  # each query's position
    allowed = (torch.arange(m)[None, :] <= where[:, None])[None, None] & keep[:, :, None, :]
    torch.testing.assert_close(out.double(), reference(q, k, v, logd, allowed, where, feature_map), atol=ATOL,
                               rtol=RTOL)


@pytest.mark.parametrize("split", [1, 7, 16])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_a_carried_state_continues_the_decay(feature_map, split):
    """The sequence in two calls (the second continuing the first's state), and one call then one-token steps, give
    the one-pass reference's outputs, and gradients through the carried state (left padding in row 1)."""
    n = 20
    q, k, v, logd = _inputs(n, strength=0.3, seed=5)
    mask = _padding("left", n)
    leaves = _leaves(q, k, v, logd)
    lq, lk, lv, ld = leaves
    first, state = causal_linear_attention(lq[:, :, :split], lk[:, :, :split], lv[:, :, :split], mask[:, :split],
                                           feature_map=feature_map, chunk_size=4, decay=ld[..., :split])
    second, _ = causal_linear_attention(lq[:, :, split:], lk[:, :, split:], lv[:, :, split:], mask[:, split:], state,
                                        feature_map=feature_map, chunk_size=4, decay=ld[..., split:])
    out = torch.cat([first, second], dim=2)
    want_leaves = _leaves(q, k, v, logd)
    expected = reference(*want_leaves[:3], want_leaves[3].masked_fill(~mask[:, None], 0.0), _causal_allowed(n, mask),
                         torch.arange(n), feature_map)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], expected[real], atol=ATOL, rtol=RTOL)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape) * real)
    # a call, then steps
    with torch.no_grad():
        prefill, state = causal_linear_attention(q[:, :, :split], k[:, :, :split], v[:, :, :split], mask[:, :split],
                                                 feature_map=feature_map, chunk_size=4, decay=logd[..., :split])
        outs = [prefill]
        for t in range(split, n):
            o, state = linear_attention_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], mask[:, t:t + 1],
                                             state, feature_map=feature_map, decay=logd[..., t:t + 1])
            outs.append(o)
    stepped = torch.cat(outs, dim=2).double()
    torch.testing.assert_close(stepped[real], expected[real].detach(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("strength", list(STRENGTHS))
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_one_token_steps_chained_over_a_sequence(feature_map, strength):
    """`linear_attention_step` from no state, token by token, gives the reference's outputs and gradients; with a
    (b, h, 1) decay per step, the state's sums (or the exp map's reference) decay before the token is added."""
    n = 12
    scale = 30.0 if feature_map == "exp" else 1.0
    q, k, v, logd = _inputs(n, scale=scale, strength=STRENGTHS[strength], seed=6)
    leaves = _leaves(q, k, v, logd)
    lq, lk, lv, ld = leaves
    outs, state = [], None
    for t in range(n):
        o, state = linear_attention_step(lq[:, :, t:t + 1], lk[:, :, t:t + 1], lv[:, :, t:t + 1], None, state,
                                         feature_map=feature_map, decay=ld[..., t:t + 1])
        outs.append(o)
    out = torch.cat(outs, dim=2)
    want_leaves = _leaves(q, k, v, logd)
    expected = ref_decayed(*want_leaves, None, feature_map)
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape))


PREFIX_CASES = {"prefix": (15, 15, 5), "leading_keys": (11, 17, 0), "prefix_and_leading_keys": (11, 17, 4)}


@pytest.mark.parametrize(
    "feature_map,case,keys",
    [(f, c, "unit") for f in FEATURE_MAPS for c in PREFIX_CASES] + [("exp", c, "x30_strong") for c in PREFIX_CASES],
)
def test_prefix_op_matches_the_reference_forward_and_backward(feature_map, case, keys):
    """`prefix_causal_linear_attention`: the L = m - n + prefix_length leading keys are one state, decayed to where
    they end, which the prefix's queries read; the other queries continue causally (chunks of 4). The reference reads
    the prefix at p = L - 1; with a key mask (row 1's first key padded) and a carried state before it. "x30_strong":
    exp keys x30 and a strong decay."""
    n, m, prefix = PREFIX_CASES[case]
    scale, strength = (30.0, STRENGTHS["strong"]) if keys == "x30_strong" else (1.0, 0.3)
    q, k, v, logd = _inputs(n, m, scale=scale, strength=strength, seed=7)
    mask = torch.ones(B, m, dtype=torch.bool)
    mask[1, 0] = False
    leaves = _leaves(q, k, v, logd)
    out, _ = prefix_causal_linear_attention(*leaves[:3], mask, feature_map=feature_map, chunk_size=4,
                                            prefix_length=prefix, decay=leaves[3])
    want_leaves = _leaves(q, k, v, logd)
    expected = ref_decayed(*want_leaves, mask, feature_map, prefix_length=prefix)
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)
    _assert_grads_close(out, expected, leaves, want_leaves, _weight(expected.shape))
    # continuing a state: 6 earlier keys (fed causally) before the same call
    q0, k0, v0, logd0 = _inputs(6, strength=0.3, seed=9)
    with torch.no_grad():
        _, state = causal_linear_attention(q0, k0, v0, feature_map=feature_map, chunk_size=4, decay=logd0)
        out, _ = prefix_causal_linear_attention(q, k, v, mask, state, feature_map=feature_map, chunk_size=4,
                                                prefix_length=prefix, decay=logd)
    all_mask = torch.cat([torch.ones(B, 6, dtype=torch.bool), mask], dim=1)
    expected = ref_decayed(q, torch.cat([k0, k], 2), torch.cat([v0, v], 2), torch.cat([logd0, logd], 2), all_mask,
                           feature_map, prefix_length=prefix)
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)


# ---------------------------------------------------------------------------------------------------------------
# 2. a decay of zeros is no decay


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_a_decay_of_zeros_is_the_undecayed_op(feature_map):
    n = 29
    q, k, v, _ = _inputs(n, seed=10)
    q, k, v = q.float(), k.float(), v.float()
    zeros = torch.zeros(B, H, n)
    mask = _padding("middle", n)
    a, sa = causal_linear_attention(q, k, v, mask, feature_map=feature_map, chunk_size=8)
    b, sb = causal_linear_attention(q, k, v, mask, feature_map=feature_map, chunk_size=8, decay=zeros)
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    a, _ = prefix_causal_linear_attention(q, k, v, mask, feature_map=feature_map, chunk_size=8, prefix_length=5)
    b, _ = prefix_causal_linear_attention(q, k, v, mask, feature_map=feature_map, chunk_size=8, prefix_length=5,
                                          decay=zeros)
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    step = dict(feature_map=feature_map)
    a, _ = linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, sa, **step)
    b, _ = linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, sb, decay=zeros[..., :1], **step)
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 3. long sequences; 4. autocast


def blockwise_reference(q, k, v, logd, feature_map, block=512):
    """float64 decayed causal linear attention by query blocks: a block's own keys in a block x block form, the keys
    before it in a (d, e) state decayed in float64 (phi = exp(x) as it is: the inputs here are a few units)."""
    q, k, v, logd = q.double(), k.double(), v.double(), logd.double()
    phi_q, phi_k = phi(q, feature_map), phi(k, feature_map)
    b, h, n, d = q.shape
    kv = q.new_zeros(b, h, d, v.shape[-1])
    z = q.new_zeros(b, h, d)
    outs = []
    for start in range(0, n, block):
        sl = slice(start, start + block)
        g = logd[..., sl].cumsum(-1)  # from the block's start
        c = g.shape[-1]
        gaps = (g[..., :, None] - g[..., None, :]).masked_fill(~torch.ones(c, c, dtype=torch.bool).tril(), -torch.inf)
        w = (phi_q[:, :, sl] @ phi_k[:, :, sl].transpose(-1, -2)) * torch.exp(gaps)
        read = phi_q[:, :, sl] * torch.exp(g)[..., None]  # the state before the block, decayed to each query
        num = w @ v[:, :, sl] + read @ kv
        den = w.sum(-1) + (read @ z[..., None]).squeeze(-1)
        outs.append(num / den[..., None])
        to_end = phi_k[:, :, sl] * torch.exp(g[..., -1:] - g)[..., None]
        kv = kv * torch.exp(g[..., -1])[..., None, None] + to_end.transpose(-1, -2) @ v[:, :, sl]
        z = z * torch.exp(g[..., -1])[..., None] + to_end.sum(-2)
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_32k_tokens_match_a_float64_reference_and_stay_finite_from_fp16(feature_map):
    """32768 tokens in chunks of 64, two heads with fixed decays (memories of 32 and 4096 tokens): the fp32 op is the
    float64 blockwise reference's, and fp16 inputs under fp16 autocast give the same fp32 result, finite (the ops
    read fp16 and sum in fp32)."""
    n, d = 32768, 8
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, n, d, generator=g).mul(2).half() for _ in range(3))
    logd = torch.log1p(-torch.tensor([2.0**-5, 2.0**-12]))[None, :, None].expand(1, 2, n)
    out, state = causal_linear_attention(q.float(), k.float(), v.float(), feature_map=feature_map, chunk_size=64,
                                         decay=logd)
    expected = blockwise_reference(q, k, v, logd, feature_map)
    assert torch.isfinite(out).all() and torch.isfinite(state.kv).all() and torch.isfinite(state.z).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    with torch.autocast("cpu", dtype=torch.float16):
        half_out, half_state = causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=64,
                                                       decay=logd.half())
    assert half_out.dtype == torch.float32 and half_state.kv.dtype == torch.float32
    assert torch.isfinite(half_out).all() and torch.isfinite(half_state.kv).all()
    # the fp16 decay rounds log(1 - 2^-12) by ~1e-4 relative: a memory of 4096 tokens changes by as much
    torch.testing.assert_close(half_out, out, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_autocast_gives_fp32_outputs_and_states_close_to_fp32(feature_map, dtype):
    """Under bf16/fp16 autocast on a CPU, the chunked op, the prefix op and the step return fp32 outputs and fp32
    states, those of fp32 (the inputs are read, not rounded: fp32 tensors stay fp32)."""
    n = 100
    q, k, v, logd = (t.float() for t in _inputs(n, scale=2.0, strength=0.3, seed=12, d=8, e=8))
    fp32, fp32_state = causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=16, decay=logd)
    fp32_prefix, _ = prefix_causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=16, prefix_length=9,
                                                    decay=logd)
    with torch.autocast("cpu", dtype=dtype):
        out, state = causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=16, decay=logd)
        prefix, _ = prefix_causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=16, prefix_length=9,
                                                   decay=logd)
        step, step_state = linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, state,
                                                 feature_map=feature_map, decay=logd[..., :1])
    for t in (out, prefix, step, state.kv, state.z, step_state.kv, step_state.z):
        assert t.dtype == torch.float32
    if feature_map == "exp":
        assert state.k_max.dtype == torch.float32
    torch.testing.assert_close(out, fp32, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefix, fp32_prefix, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.kv, fp32_state.kv, atol=1e-5, rtol=1e-5)
    # bf16/fp16 model states (what the projections give under autocast) read as those numbers in fp32
    low = [t.to(dtype) for t in (q, k, v)]
    with torch.autocast("cpu", dtype=dtype):
        out_low, _ = causal_linear_attention(*low, feature_map=feature_map, chunk_size=16, decay=logd)
    expected, _ = causal_linear_attention(*(t.float() for t in low), feature_map=feature_map, chunk_size=16, decay=logd)
    assert out_low.dtype == torch.float32
    torch.testing.assert_close(out_low, expected, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 5. decayed decoders

DECODER_CASES = [(f, d) for f in FEATURE_MAPS for d in ("fixed", "gated")]
DECODER_IDS = [f"{f}-{d}" for f, d in DECODER_CASES]
MODEL_ATOL = 1e-4


def decayed(feature_map, decay, **overrides):
    return decoder("linear", feature_map, linear_attention_decay=decay, **overrides)


@pytest.mark.parametrize("feature_map,decay", DECODER_CASES, ids=DECODER_IDS)
def test_cached_decoding_equals_the_full_forward(feature_map, decay):
    """A left-padded prefill and six one-token steps with the cache give the full forward's logits at every real
    position; a chunked prefill (5, 7, 9 tokens) those of one pass."""
    model = decayed(feature_map, decay)
    cache = check_cached_steps(model, atol=MODEL_ATOL)
    assert isinstance(cache, LinearAttentionCache) and cache.layers[0].decay == decay
    with torch.no_grad():
        ids = torch.randint(1, VOCAB, (2, 21))
        full = model(input_ids=ids, use_cache=False).logits
        cache, start = None, 0
        for size in (5, 7, 9):
            out = model(input_ids=ids[:, start:start + size], past_key_values=cache, use_cache=True)
            torch.testing.assert_close(out.logits, full[:, start:start + size], atol=MODEL_ATOL, rtol=0)
            cache, start = out.past_key_values, start + size


@pytest.mark.parametrize("feature_map,decay", DECODER_CASES, ids=DECODER_IDS)
def test_greedy_generate_is_the_argmax_of_full_forwards_and_padding_changes_nothing(feature_map, decay):
    """generate() with the cache gives the tokens it gives without, and row by row (unpadded) the argmax of full
    forwards; a left-padded row's logits are those of the row alone (padding is not time: it does not decay)."""
    model = decayed(feature_map, decay)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, 3:]).logits
    torch.testing.assert_close(padded[1, 3:], alone[0], atol=MODEL_ATOL, rtol=0)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, use_cache=True, **kwargs)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **kwargs))
    # the in-place (static) recurrent state, and beam search (which reorders the states)
    static = LinearAttentionCache(config=model.config, static=True)
    assert torch.equal(model.generate(ids, past_key_values=static, **kwargs), cached)
    assert torch.equal(model.generate(ids, num_beams=3, **kwargs), model.generate(ids, num_beams=3, use_cache=False,
                                                                                     **kwargs))
    for row, start in ((0, 0), (1, 3)):
        expected = ids[row:row + 1, start:]
        with torch.no_grad():
            for _ in range(8):
                nxt = model(input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)
                expected = torch.cat([expected, nxt], dim=1)
        assert torch.equal(cached[row, start:], expected[0])


def _loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("feature_map,decay", DECODER_CASES, ids=DECODER_IDS)
def test_gradient_checkpointing_gives_the_same_gradients(feature_map, decay):
    model = decayed(feature_map, decay).train()
    ids = torch.randint(1, VOCAB, (2, 19))
    loss, grads = _loss_and_grads(model, ids)
    model.activation_checkpointing_enable()  # transformers v5's name of gradient_checkpointing_enable
    assert model.model.gradient_checkpointing
    checkpointed_loss, checkpointed = _loss_and_grads(model, ids)
    torch.testing.assert_close(checkpointed_loss, loss)
    assert grads.keys() == checkpointed.keys()
    if decay == "gated":  # the gates are trained
        assert any("decay" in name and grads[name].abs().sum() > 0 for name in grads)
    for name in grads:
        torch.testing.assert_close(checkpointed[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_training_step_of_a_decayed_decoder_compiles_to_one_graph():
    """forward + loss of a gated exp decoder (the chunked exp kernel's compiled path, the gate in fp32) traces into one
    graph (fullgraph) whose loss and gradients are eager mode's. Dynamo with the "eager" backend, as
    tests/integration/test_compile_export.py (inductor's code generation takes tens of seconds on a CPU)."""
    model = decayed("exp", "gated").train()
    ids = torch.randint(1, VOCAB, (2, 10))
    loss, grads = _loss_and_grads(model, ids)

    def loss_of(ids):
        return model(input_ids=ids, labels=ids).loss

    torch._dynamo.reset()
    compiled = torch.compile(loss_of, fullgraph=True, backend="eager")
    model.zero_grad()
    compiled_loss = compiled(ids)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss.detach(), loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("decay", ["none", "fixed", "gated"])
def test_only_the_gated_decay_has_parameters_initialised_to_the_fixed_schedule(decay):
    model = decayed("elu", decay)
    parameters = [name for name, _ in model.named_parameters() if ".decay." in name]
    gates = [layer.attention.decay for layer in model.model.layers] if decay != "none" else []
    if decay == "none":
        assert parameters == [] and all(getattr(layer.attention, "decay", None) is None for layer in model.model.layers)
        return
    if decay == "fixed":
        assert parameters == [] and all(isinstance(gate, FixedDecay) for gate in gates)
        return
    assert len(parameters) == 2 * len(gates) and all(isinstance(gate, GatedDecay) for gate in gates)
    states = torch.randn(2, 5, 32)
    fixed = FixedDecay(32, 4)(states)
    for gate in gates:
        torch.testing.assert_close(gate.bias.detach(), gate.schedule_bias())
        assert gate.weight.abs().sum() > 0  # drawn like the other weights
        with torch.no_grad():
            at_zero = GatedDecay(32, 4)
            at_zero.weight.zero_()
            at_zero.bias.copy_(gate.bias)
            torch.testing.assert_close(at_zero(states), fixed, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fixed[0, :, 0], retnet_log_decay(4))


@pytest.mark.parametrize("feature_map,decay", DECODER_CASES, ids=DECODER_IDS)
def test_save_and_load_keep_the_decay_and_the_logits(tmp_path, feature_map, decay):
    """A decayed decoder saved and loaded gives equal logits; a gate trained away from its initialisation is loaded,
    not initialised again."""
    model = decayed(feature_map, decay)
    if decay == "gated":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.attention.decay.bias.add_(torch.randn(4))
    ids = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    loaded = hfst.TransformerDecoderForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.linear_attention_decay == decay
    for name, p in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, atol=0, rtol=0)


@pytest.mark.parametrize("feature_map,decay", DECODER_CASES, ids=DECODER_IDS)
def test_the_cache_state_does_not_grow_with_the_context(feature_map, decay):
    """The decayed decoder's recurrent state holds as many bytes after 128 tokens as after 8192 (and one step on)."""
    model = decayed(feature_map, decay, linear_attention_chunk_size=64)
    sizes = []
    with torch.no_grad():
        for length in (128, 8192):
            cache = model(input_ids=torch.randint(1, VOCAB, (1, length)), use_cache=True).past_key_values
            sizes.append(cache.state_nbytes())
            step = model(input_ids=torch.randint(1, VOCAB, (1, 1)), past_key_values=cache, use_cache=True)
            assert torch.isfinite(step.logits).all()
            assert step.past_key_values.state_nbytes() == sizes[-1]
            assert step.past_key_values.get_seq_length() == length + 1
    assert sizes[0] == sizes[1] > 0


# ---------------------------------------------------------------------------------------------------------------
# 6. refusals


def test_a_decay_needs_causal_order():
    """`decay_applies`, the rule the layers, the forward checks and train_lm.py's flags read: no decay applies anywhere,
    every other only to attention in causal order."""
    assert decay_applies("none", causal=False) and decay_applies("none", causal=True)
    for name in set(DECAYS) - {"none"}:
        assert decay_applies(name, causal=True) and not decay_applies(name, causal=False)


def test_non_causal_linear_attention_refuses_a_decay():
    q, k, v, logd = (t.float() for t in _inputs(5))
    with pytest.raises(ValueError, match="`linear_attention` is non-causal: its keys have no order to decay along"):
        linear_attention(q, k, v, decay=logd)


BAD_DECAYS = {
    "integer": lambda shape: torch.zeros(shape, dtype=torch.long),
    "bool": lambda shape: torch.ones(shape, dtype=torch.bool),
    "one_key_short": lambda shape: torch.zeros(*shape[:2], shape[2] - 1),
    "no_head_axis": lambda shape: torch.zeros(shape[0], shape[2]),
    "a_list": lambda shape: torch.zeros(shape).tolist(),
}


@pytest.mark.parametrize("bad", list(BAD_DECAYS))
def test_a_decay_of_the_wrong_shape_or_dtype_is_refused_by_name(bad):
    q, k, v, _ = (t.float() for t in _inputs(6))
    ops = {
        "causal_linear_attention": lambda decay: causal_linear_attention(q, k, v, decay=decay),
        "prefix_causal_linear_attention": lambda decay: prefix_causal_linear_attention(q, k, v, prefix_length=2,
                                                                                       decay=decay),
    }
    for name, op in ops.items():
        with pytest.raises(ValueError, match=rf"`decay` of {name} must be a float tensor of shape \(2, 2, 6\)"):
            op(BAD_DECAYS[bad]((B, H, 6)))
    with pytest.raises(ValueError, match=r"`decay` of linear_attention_step must be a float tensor of shape \(2, 2, 1\)"):
        linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], decay=BAD_DECAYS[bad]((B, H, 1)))


def test_an_unknown_decay_is_refused_naming_the_choices():
    choices = r"must be one of \['none', 'fixed', 'gated'\], got 'bogus'"
    with pytest.raises(StrictDataclassError, match=choices):
        tiny_config("decoder", "linear", "elu", linear_attention_decay="bogus")
    config = tiny_config("decoder", "linear", "elu", linear_attention_decay="fixed")
    with pytest.raises(StrictDataclassError, match=choices):
        config.linear_attention_decay = "bogus"
    assert config.linear_attention_decay == "fixed"


def test_a_decay_with_softmax_attention_warns_that_it_has_no_effect(caplog):
    from transformers.utils import logging

    logging.get_logger("transformers").warning_once.cache_clear()  # shown once per process: maybe already shown
    logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            config = tiny_config("decoder", "softmax", "elu", linear_attention_decay="gated")
    finally:
        logging.disable_propagation()
    assert "`linear_attention_decay='gated'` has no effect with `attention_type='softmax'`" in caplog.text
    model = make_model(hfst.TransformerDecoderForCausalLM, config)
    assert not [name for name, _ in model.named_parameters() if ".decay." in name]
    ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad():
        plain = decoder("softmax", "elu")(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids).logits, plain, atol=0, rtol=0)


HEAD_FAMILIES = ["encoder", "set_transformer", "perceiver_io"]


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_bidirectional_forward_with_a_decay_is_refused(family):
    """Every class of the family but the many-target next-token head (base models without `prefix_length`,
    classifiers, masked LMs) and the one-window head attend with no order to decay along: a ValueError naming the
    decay and the way out. The causal uses of the same weights run (a base model with `prefix_length`)."""
    config = tiny_config(family, "linear", "elu", linear_attention_decay="fixed")
    ids = torch.randint(1, VOCAB, (2, 8))
    refusal = r"`linear_attention_decay='fixed'` decays causal attention along the sequence, and .* no order to decay"
    refused = []
    for cls in family_classes(config).values():
        model = make_model(cls, config)
        if getattr(model, "objective", None) == "many_target_windows":
            continue
        refused.append(cls.__name__)
        with pytest.raises(ValueError, match=refusal):
            model(input_ids=ids)
    assert any(name.endswith("Model") for name in refused)
    assert any(name.endswith("ForSequenceClassification") for name in refused)
    base = make_model(family_classes(config)[AutoModel], config)
    with torch.no_grad():
        assert torch.isfinite(base(input_ids=ids, prefix_length=3).last_hidden_state).all()
    window = many_target_head(family, "linear", "elu", linear_attention_decay="fixed", next_token_mode="window")
    with pytest.raises(ValueError, match=refusal):
        window(input_ids=torch.randint(1, VOCAB, (2, 12)))
    many = many_target_head(family, "linear", "elu", linear_attention_decay="fixed")
    assert torch.isfinite(many(input_ids=torch.randint(1, VOCAB, (2, 12)), labels=torch.randint(0, VOCAB, (2, 12))).loss)


@pytest.mark.parametrize("made_by,continued_by", [("none", "fixed"), ("fixed", "gated"), ("gated", "none")])
def test_a_cache_of_another_decay_is_refused(made_by, continued_by):
    """A state decayed otherwise than the model would continue it gives wrong logits: refused by name; the model's
    own cache continues."""
    step = torch.randint(1, VOCAB, (1, 1))
    with torch.no_grad():
        cache = decayed("exp", made_by)(input_ids=torch.randint(1, VOCAB, (1, 5)), use_cache=True).past_key_values
    model = decayed("exp", continued_by)
    with pytest.raises(ValueError, match=f"decayed with linear_attention_decay='{made_by}', but this model's is "
                                         f"'{continued_by}'"):
        model(input_ids=step, past_key_values=cache)
    with torch.no_grad():
        own = model(input_ids=torch.randint(1, VOCAB, (1, 5)), use_cache=True).past_key_values
        assert torch.isfinite(model(input_ids=step, past_key_values=own).logits).all()


def test_a_cache_made_without_a_config_records_the_decay_of_its_first_model():
    """A `LinearAttentionCache(num_layers=...)` knows no config: the first model that fills it stamps its decay, and a
    model of another decay is refused as with a config-made cache."""
    cache = LinearAttentionCache(num_layers=2)
    with torch.no_grad():
        decayed("elu", "fixed")(input_ids=torch.randint(1, VOCAB, (1, 5)), past_key_values=cache, use_cache=True)
    assert {layer.decay for layer in cache.layers} == {"fixed"}
    with pytest.raises(ValueError, match="decayed with linear_attention_decay='fixed', but this model's is 'none'"):
        decayed("elu", "none")(input_ids=torch.randint(1, VOCAB, (1, 1)), past_key_values=cache)


def test_an_encoder_decoder_cross_attention_has_no_gate():
    """A decoder's cross-attention reads every encoder state (no order): it builds no decay, its self-attention does."""
    model = decayed("elu", "gated", add_cross_attention=True, is_decoder=True)
    names = [name for name, module in model.named_modules() if isinstance(module, GatedDecay)]
    assert names and all(".attention.decay" in name for name in names)
    assert not any("cross_attention" in name for name in names)


# ---------------------------------------------------------------------------------------------------------------
# 7. the many-target next-token heads


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_many_target_heads_train_their_gates(family, feature_map):
    """`...ForNextTokenPrediction` (next_token_mode="many") with a gated decay: a finite loss whose gradient reaches
    every gate (left padding in row 2): the attentions that never run causally (ISAB's inducing points) have none,
    whose parameters would get no gradient (and stop DDP without find_unused_parameters)."""
    model = many_target_head(family, "linear", feature_map, linear_attention_decay="gated").train()
    ids = torch.randint(1, VOCAB, (3, 12))
    mask = torch.ones_like(ids)
    mask[2, :3] = 0
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    assert torch.isfinite(loss)
    loss.backward()
    gates = [m for m in model.modules() if isinstance(m, GatedDecay)]
    assert gates
    grads = [p.grad for gate in gates for p in (gate.weight, gate.bias)]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)

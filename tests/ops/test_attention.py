"""Attention kernels and `MultiHeadAttention` against naive float64 references written from the math.

Shapes: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim (kept != d on purpose).
"""

import dataclasses
import math

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import tiny_config

import hf_settransformer as hfst
from hf_settransformer import TransformerEncoderConfig
from hf_settransformer.attention import (
    ATTENTION_KERNELS,
    MultiHeadAttention,
    attention_kernel,
    linear_kernel,
    register_attention_kernel,
    softmax_kernel,
)
from hf_settransformer.linear_naive import naive_causal_exp_logspace as ref_causal_exp_logspace
from hf_settransformer.linear_naive import naive_causal_linear_attention as ref_causal_linear
from hf_settransformer.linear_naive import naive_linear_attention as ref_linear
from hf_settransformer.linear_naive import naive_linear_visible as ref_linear_visible
from hf_settransformer.linear_naive import naive_softmax_attention as ref_softmax
from hf_settransformer.linear_naive import visible as _allowed
from hf_settransformer.linear_ops import (
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
    prefix_causal_linear_attention,
)
from hf_settransformer.masks import AttentionMask
from hf_settransformer.softmax_ops import softmax_attention

FEATURE_MAPS = ["elu", "exp"]
B, H, D, E = 2, 2, 4, 3
CHUNK = 8


# ---------------------------------------------------------------------------------------------------------------
# naive float64 references: hf_settransformer/linear_naive.py

# ---------------------------------------------------------------------------------------------------------------
# helpers


def _qkv(n, m=None, scale=1.0, seed=0, b=B, h=H, d=D, e=E):
    m = n if m is None else m
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g) * scale
    k = torch.randn(b, h, m, d, generator=g) * scale
    v = torch.randn(b, h, m, e, generator=g)
    return q, k, v


def _key_mask(kind, b, m, seed=1):
    """None; 'random' key padding (key 0 of row 0 kept); 'left' padding (row 0: first 3 keys masked)."""
    if kind == "none":
        return None
    mask = torch.ones(b, m, dtype=torch.bool)
    if kind == "random":
        g = torch.Generator().manual_seed(seed)
        mask = torch.rand(b, m, generator=g) > 0.4
        mask[0, 0] = True
    elif kind == "left":
        mask[0, : min(3, m)] = False
    elif kind == "row_masked":
        mask[1] = False
    else:
        raise ValueError(kind)
    return mask


def _check(got, expected, atol=1e-5, rtol=1e-4):
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected.to(got.dtype), atol=atol, rtol=rtol)


def _config(attention_type="softmax", feature_map="elu", hidden_size=32, heads=4, chunk=CHUNK):
    return TransformerEncoderConfig(
        vocab_size=10,
        hidden_size=hidden_size,
        num_attention_heads=heads,
        attention_type=attention_type,
        feature_map=feature_map,
        attention_probs_dropout_prob=0.0,
        linear_attention_chunk_size=chunk,
    )


def _module(attention_type, feature_map, causal=False, self_attention=True, seed=0, **kw):
    torch.manual_seed(seed)
    config = _config(attention_type, feature_map, **kw)
    return MultiHeadAttention(config, self_attention=self_attention, causal=causal).eval()


# ---------------------------------------------------------------------------------------------------------------
# 1. causal linear attention


@pytest.mark.parametrize("mask_kind", ["none", "random", "left"])
@pytest.mark.parametrize("n", [1, 7, 16, 37])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_linear_matches_naive(feature_map, n, mask_kind):
    q, k, v = _qkv(n)
    key_mask = _key_mask(mask_kind, B, n)
    out, state = causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)
    assert out.shape == (B, H, n, E) and out.dtype == torch.float32
    assert _state_shapes(state) == _expected_state_shapes(feature_map)  # independent of n
    _check(out, ref_causal_linear(q, k, v, key_mask, feature_map))
    if mask_kind == "left":  # queries that see only padding give exactly 0
        assert torch.equal(out[0, :, : min(3, n)], torch.zeros(H, min(3, n), E))


# ---------------------------------------------------------------------------------------------------------------
# 2. chunked prefill and the recurrent view


def _state_shapes(state):
    return state.kv.shape, state.z.shape, None if state.k_max is None else state.k_max.shape


def _expected_state_shapes(feature_map):
    return (B, H, D, E), (B, H, D), (B, H, D) if feature_map == "exp" else None


@pytest.mark.parametrize("split", [1, 5, 8, 13])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_linear_prefill_continues_from_state(feature_map, split):
    n = 29
    q, k, v = _qkv(n)
    key_mask = torch.ones(B, n, dtype=torch.bool)
    key_mask[0, :6] = False  # left padding; split 1 and 5 make row 0's first part fully masked
    full, full_state = causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)

    first, state = causal_linear_attention(
        q[:, :, :split],
        k[:, :, :split],
        v[:, :, :split],
        key_mask[:, :split],
        feature_map=feature_map,
        chunk_size=CHUNK,
    )
    assert _state_shapes(state) == _expected_state_shapes(feature_map)
    rest, last_state = causal_linear_attention(
        q[:, :, split:],
        k[:, :, split:],
        v[:, :, split:],
        key_mask[:, split:],
        state,
        feature_map=feature_map,
        chunk_size=CHUNK,
    )
    assert _state_shapes(last_state) == _expected_state_shapes(feature_map)
    _check(torch.cat([first, rest], dim=2), full)
    _check(torch.cat([first, rest], dim=2), ref_causal_linear(q, k, v, key_mask, feature_map))
    # the state after all tokens does not depend on how they were split
    _check(last_state.kv, full_state.kv)
    _check(last_state.z, full_state.z)
    if feature_map == "exp":
        _check(last_state.k_max, full_state.k_max)


@pytest.mark.parametrize("mask_kind", ["none", "left"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_step_matches_causal_kernel(feature_map, mask_kind):
    n = 19
    q, k, v = _qkv(n)
    key_mask = _key_mask(mask_kind, B, n)
    full, full_state = causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)

    state, outs = None, []
    for t in range(n):
        step_mask = None if key_mask is None else key_mask[:, t : t + 1]
        o, state = linear_attention_step(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], step_mask, state, feature_map=feature_map
        )
        assert o.shape == (B, H, 1, E)
        assert _state_shapes(state) == _expected_state_shapes(feature_map)  # constant size
        outs.append(o)
    steps = torch.cat(outs, dim=2)
    _check(steps, full)
    _check(steps, ref_causal_linear(q, k, v, key_mask, feature_map))
    _check(state.kv, full_state.kv)
    _check(state.z, full_state.z)
    if mask_kind == "left":
        assert torch.equal(steps[0, :, :3], torch.zeros(H, 3, E))


# ---------------------------------------------------------------------------------------------------------------
# 3. non-causal linear attention


@pytest.mark.parametrize("mask_kind", ["none", "random", "left"])
@pytest.mark.parametrize("n,m", [(6, 6), (3, 11)], ids=["self", "cross"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_matches_naive(feature_map, n, m, mask_kind):
    q, k, v = _qkv(n, m)
    key_mask = _key_mask(mask_kind, B, m)
    out, _ = linear_attention(q, k, v, key_mask, feature_map=feature_map)
    assert out.shape == (B, H, n, E) and out.dtype == torch.float32
    _check(out, ref_linear(q, k, v, key_mask, feature_map))


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_fully_masked_row_gives_zeros(feature_map):
    q, k, v = _qkv(4, 7)
    key_mask = _key_mask("row_masked", B, 7)  # batch row 1: every key masked
    out, _ = linear_attention(q, k, v, key_mask, feature_map=feature_map)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros(H, 4, E))
    _check(out[:1], ref_linear(q[:1], k[:1], v[:1], None, feature_map))
    # the causal kernel too
    q, k, v = _qkv(7)
    out, _ = causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros(H, 7, E))


# ---------------------------------------------------------------------------------------------------------------
# denominators that are small but not zero must not be floored (EPS is only meant for "no key at all")


@pytest.mark.parametrize("path", ["chunked", "step"])
def test_causal_exp_large_inputs_match_logspace_reference(path):
    """Keys ~ N(0, 25): the stabilised exp kernel must still give the exact ratio (no EPS floor kicking in)."""
    n = 128
    q, k, v = _qkv(n, scale=5.0, seed=3, d=8)
    if path == "chunked":
        out, _ = causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=CHUNK)
    else:
        state, outs = None, []
        for t in range(n):
            o, state = linear_attention_step(
                q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, state, feature_map="exp"
            )
            outs.append(o)
        out = torch.cat(outs, dim=2)
    _check(out, ref_causal_exp_logspace(q, k, v), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_linear_past_ignores_a_large_future_key(feature_map):
    """Causality in one kernel call: a key of 20 at the last position must not change earlier outputs."""
    q, k, v = _qkv(8)
    out, _ = causal_linear_attention(q, k, v, None, feature_map=feature_map, chunk_size=CHUNK)
    k_big = k.clone()
    k_big[:, :, -1] = 20.0
    out_big, _ = causal_linear_attention(q, k_big, v, None, feature_map=feature_map, chunk_size=CHUNK)
    _check(out_big[:, :, :-1], out[:, :, :-1])


def _keys_with(pattern, span, n=64, seed=5):
    """Keys of a few nats, plus `span` nats of structure in feature 0: a spike at the end, a spike at the start, a
    linear drift from 0 to `span`, or spikes every 10 positions."""
    q, k, v = _qkv(n, seed=seed, d=6)
    k = k.clone()
    if pattern == "late_spike":
        k[:, :, -3, 0] += span
    elif pattern == "early_spike":
        k[:, :, 2, 0] += span
    elif pattern == "drift":
        k[..., 0] += torch.linspace(0, span, n)
    else:  # "spikes"
        k[:, :, 5::10, 0] += span
    return q, k, v


@pytest.mark.parametrize("span", [10.0, 60.0, 100.0, 150.0, 300.0])
@pytest.mark.parametrize("pattern", ["late_spike", "early_spike", "drift", "spikes"])
@pytest.mark.parametrize("chunk", [1, 8, 64], ids=["chunk1", "chunk8", "chunk64"])
def test_causal_exp_kernel_is_exact_whatever_the_key_span(pattern, span, chunk):
    """Against a float64 log-space reference: the chunked exp kernel's stabilisers come from keys at or before each
    position (per-chunk running maxima, per-position ones in steep chunks), so a key hundreds of nats above the
    others, late, early or through a drift, neither zeroes nor blurs any output."""
    q, k, v = _keys_with(pattern, span)
    out, state = causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=chunk)
    _check(out, ref_causal_exp_logspace(q, k, v), atol=1e-5, rtol=1e-4)
    assert torch.equal(state.k_max, k.amax(dim=2))  # the state's reference: the maximum of every key seen


@pytest.mark.parametrize("span", [60.0, 150.0, 300.0])
@pytest.mark.parametrize("chunk", [8, 64], ids=["chunk8", "chunk64"])
def test_causal_exp_outputs_do_not_change_when_tokens_are_appended(span, chunk):
    """Prefix consistency: the outputs of the first 40 positions are the same when 24 tokens follow, among them one
    whose key is `span` nats above the rest, in the same chunk or a later one; and the same as the step path's."""
    q, k, v = _qkv(64, seed=7, d=6)
    k = k.clone()
    k[:, :, 45, 1] += span
    prefix, _ = causal_linear_attention(
        q[:, :, :40], k[:, :, :40], v[:, :, :40], None, feature_map="exp", chunk_size=chunk
    )
    whole, _ = causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=chunk)
    _check(whole[:, :, :40], prefix.double(), atol=1e-6, rtol=1e-5)
    state, steps = None, []
    for t in range(64):
        o, state = linear_attention_step(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, state, feature_map="exp"
        )
        steps.append(o)
    _check(whole, torch.cat(steps, dim=2).double(), atol=1e-5, rtol=1e-4)


def test_causal_exp_steep_chunks_with_padding_and_a_carried_state():
    """The per-position path with key padding, a carried state (chunked prefill) and gradients: outputs match the
    float64 reference on real positions, and the gradients are finite."""
    q, k, v = _keys_with("spikes", 200.0, n=48)
    key_mask = torch.ones(B, 48, dtype=torch.bool)
    key_mask[0, :5] = False
    key_mask[1, 20:23] = False
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    first, state = causal_linear_attention(
        q[:, :, :20], k[:, :, :20], v[:, :, :20], key_mask[:, :20], feature_map="exp", chunk_size=8
    )
    rest, _ = causal_linear_attention(
        q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], key_mask[:, 20:], state, feature_map="exp", chunk_size=8
    )
    out = torch.cat([first, rest], dim=2)
    expected = ref_causal_exp_logspace(q.detach(), k.detach(), v.detach(), key_mask)
    real = key_mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real].double(), expected[real], atol=1e-5, rtol=1e-4)
    out[real].sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_elu_uniform_weights_with_tiny_features(causal):
    """q = k = -9 everywhere: every weight phi(q).phi(k) is the same (tiny) number, so the output is the mean
    (running mean if causal) of the values, whatever the scale of the weights."""
    n = 8
    _, _, v = _qkv(n)
    q = torch.full((B, H, n, D), -9.0)
    k = torch.full((B, H, n, D), -9.0)
    if causal:
        out, _ = causal_linear_attention(q, k, v, None, feature_map="elu", chunk_size=CHUNK)
        expected = v.double().cumsum(-2) / torch.arange(1, n + 1, dtype=torch.float64)[:, None]
    else:
        out, _ = linear_attention(q, k, v, None, feature_map="elu")
        expected = v.double().mean(-2, keepdim=True).expand(B, H, n, E)
    _check(out, expected)


# ---------------------------------------------------------------------------------------------------------------
# 4. softmax kernels

SOFTMAX_CASES = {
    # name: (n, m, mask kind, causal)
    "no_mask": (6, 6, "none", False),
    "all_true_mask": (6, 6, "all_true", False),
    "key_padding": (6, 6, "random", False),
    "cross_padding": (3, 9, "random", False),
    "causal": (6, 6, "none", True),
    "causal_left_padding": (6, 6, "left", True),
    "causal_random_padding": (6, 6, "random", True),
    "causal_last_queries": (3, 7, "none", True),  # queries are the last n of m positions
    "causal_last_queries_padding": (3, 7, "left", True),
    "row_fully_masked": (5, 5, "row_masked", False),
    "causal_row_fully_masked": (5, 5, "row_masked", True),
}


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_kernels_match_naive(uncompiled_flex, case):
    """Every attn_implementation transformers runs on CPU gives the naive result, through ALL_ATTENTION_FUNCTIONS."""
    n, m, mask_kind, causal = SOFTMAX_CASES[case]
    q, k, v = _qkv(n, m, d=8)
    key_mask = torch.ones(B, m, dtype=torch.bool) if mask_kind == "all_true" else _key_mask(mask_kind, B, m)
    mask = AttentionMask.build(key_mask, causal=causal, num_queries=n)
    expected = ref_softmax(q, k, v, key_mask, causal)

    outputs = {}
    for implementation in ("sdpa", "eager", "flex_attention"):
        outputs[implementation], no_weights = softmax_attention(q, k, v, mask, implementation)
        assert no_weights is None
        assert outputs[implementation].shape == (B, H, n, E)
        _check(outputs[implementation], expected)
    out_eager, weights = softmax_attention(q, k, v, mask, "sdpa", need_weights=True)
    _check(out_eager, expected)

    # weights: (b, h, n, m), zero on invisible keys, rows sum to 1, or to 0 when the query sees no key
    allowed = _allowed(n, m, key_mask, causal).expand(B, H, n, m)
    assert weights.shape == (B, H, n, m)
    assert torch.isfinite(weights).all()
    assert torch.equal(weights[~allowed], torch.zeros_like(weights[~allowed]))
    has_key = allowed.any(-1)
    _check(weights.sum(-1), has_key.float())
    if mask_kind == "row_masked" or (mask_kind == "left" and n == m):  # some queries see only padding
        assert not has_key.all()
    if not has_key.all():  # rows without a visible key give exactly 0, not NaN
        for out in (*outputs.values(), out_eager):
            assert torch.equal(out[~has_key], torch.zeros_like(out[~has_key]))


# ---------------------------------------------------------------------------------------------------------------
# 5. numerics under reduced precision


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mha_linear_autocast_long_sequence(dtype, feature_map, causal):
    module = _module("linear", feature_map, causal=causal, hidden_size=64, heads=4, chunk=64)
    x = torch.randn(1, 2048, 64, generator=torch.Generator().manual_seed(0)) * 5
    with torch.no_grad():
        reference, _ = module(x)
        with torch.autocast("cpu", dtype=dtype):
            out, _ = module(x)
    assert torch.isfinite(reference).all()
    assert torch.isfinite(out).all()
    err = (out.float() - reference).abs().max()
    assert err <= 0.05 * reference.abs().max() + 0.02


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_kernels_accumulate_in_fp32_under_autocast(feature_map, causal):
    """The module docstring: all sums run in float32, also under fp16/bf16 autocast; the kernels return fp32."""
    q, k, v = _qkv(256, scale=2.0, d=8, e=8)

    def run():
        if causal:
            return causal_linear_attention(q, k, v, None, feature_map=feature_map, chunk_size=64)[0]
        return linear_attention(q, k, v, None, feature_map=feature_map)[0]

    expected = run()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run()
    assert out.dtype == torch.float32
    _check(out, expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_linear_fp16_inputs_long_sequence(feature_map):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4096, 8, generator=g).mul(3).half() for _ in range(3))
    out, state = causal_linear_attention(q, k, v, None, feature_map=feature_map, chunk_size=64)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert torch.isfinite(state.kv).all() and torch.isfinite(state.z).all()
    # fp16 inputs are only read: the result is that of the same numbers in fp32
    expected, _ = causal_linear_attention(q.float(), k.float(), v.float(), None, feature_map=feature_map, chunk_size=64)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# 6. MultiHeadAttention

ATTENTIONS = [("softmax", "elu"), ("linear", "elu"), ("linear", "exp")]
ATTENTION_IDS = ["softmax", "linear-elu", "linear-exp"]


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_mha_shapes_and_weights(attention_type, feature_map, masked, self_attention):
    b, n, hidden, heads = 2, 5, 32, 4
    m = n if self_attention else 7
    module = _module(attention_type, feature_map, self_attention=self_attention)
    x = torch.randn(b, n, hidden)
    context = None if self_attention else torch.randn(b, m, hidden)
    key_mask = _key_mask("random", b, m) if masked else None
    mask = AttentionMask.build(key_mask, num_queries=n)

    with torch.no_grad():
        out, no_weights = module(x, context, mask=mask)
        out_w, weights = module(x, context, mask=mask, output_attentions=True)
    assert out.shape == out_w.shape == (b, n, hidden)
    assert no_weights is None
    torch.testing.assert_close(out_w, out, atol=1e-5, rtol=1e-5)  # eager (weights) == default (sdpa) path
    if attention_type == "linear":
        assert weights is None
        return
    assert weights.shape == (b, heads, n, m)
    torch.testing.assert_close(weights.sum(-1), torch.ones(b, heads, n))
    if masked:
        dropped = ~key_mask[:, None, None, :].expand(b, heads, n, m)
        assert torch.equal(weights[dropped], torch.zeros_like(weights[dropped]))

    # the module computes o_proj(attention(q, k, v)) with the projections it owns
    with torch.no_grad():
        q, k, v = module.project(x, context)
        expected = ref_softmax(q, k, v, key_mask, causal=False).float()
        expected = module.o_proj(expected.transpose(1, 2).reshape(b, n, hidden))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("t", [0, 4, 9])
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_mha_causal_output_ignores_future(attention_type, feature_map, t):
    n, hidden = 12, 32
    module = _module(attention_type, feature_map, causal=True)
    x = torch.randn(2, n, hidden)
    x2 = x.clone()
    x2[:, t + 1 :] = torch.randn(2, n - t - 1, hidden)
    with torch.no_grad():
        out, _ = module(x)
        out2, _ = module(x2)
        out_w, _ = module(x2, output_attentions=True)
    torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :], atol=1e-3)  # the future does matter there
    torch.testing.assert_close(out_w, out2, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# key dropout: linear attention has no weight matrix to drop entries of; while training it drops keys, per head


@pytest.mark.parametrize("case", ["noncausal", "causal", "prefix", "leading_keys"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_key_dropout_leaves_the_dropped_keys_out_of_every_sum(feature_map, case):
    """`linear_kernel(..., dropout_p=p)` draws one keep mask per (batch, head, key), `torch.rand(b, h, m) >= p`, and
    its output is the float64 ratio over the kept, unpadded, visible keys: a dropped key is out of the numerator and
    the normaliser of every query, and a query whose own key is dropped still reads the others. Causal cases use keys
    with spikes 200 nats high, so the exp kernel's exact per-position path runs on queries whose keys are dropped."""
    n, p, prefix = 48, 0.3, 0
    m = n + 6 if case == "leading_keys" else n
    if case == "noncausal":
        q, k, v = _qkv(n, m)
    else:
        q, k, v = _keys_with("spikes", 200.0, n=n)
        if case == "leading_keys":  # a causal cross-attention: 6 keys before the queries' own positions
            _, k_lead, v_lead = _qkv(6, seed=9, d=6)
            k, v = torch.cat([k_lead, k], dim=2), torch.cat([v_lead, v], dim=2)
    key_mask = _key_mask("random", B, m)
    prefix = 10 if case == "prefix" else 0
    mask = AttentionMask(causal=case != "noncausal", key_mask=key_mask, prefix_length=prefix)
    torch.manual_seed(3)
    out, weights = linear_kernel(q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK, dropout_p=p)
    torch.manual_seed(3)
    kept = torch.rand(B, H, m) >= p
    assert weights is None and not kept.all() and (~kept & key_mask[:, None]).any()
    if case == "noncausal":
        expected = ref_linear(q, k, v, kept & key_mask[:, None], feature_map)
        _check(out, expected)
        return
    i = torch.arange(n)[:, None].clamp_min(prefix - 1) + (m - n)  # the last key each query sees
    visible = torch.arange(m)[None, :] <= i  # (n, m)
    allowed = visible & kept[:, :, None, :] & key_mask[:, None, None, :]
    expected = ref_linear_visible(q, k, v, allowed, feature_map)
    real = key_mask[:, None, -n:, None].expand_as(out)  # outputs at padded positions are never read
    torch.testing.assert_close(out[real].double(), expected[real], atol=1e-5, rtol=1e-4)


GRADIENT_CASES = ["noncausal", "causal", "causal_spikes", "prefix", "leading_keys", "prefix_leading_keys"]


@pytest.mark.parametrize("case", GRADIENT_CASES)
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_kernel_gradients_match_float64_references(feature_map, case):
    """Training needs the gradients, not only the outputs, to be those of the math: d(out . g)/d(q, k, v) of every
    linear path (with key padding) against autograd through the float64 references. The exp kernel's stabilisers
    (key maxima, per-query shifts) cancel in the ratio, so they must be constants everywhere or nowhere: a prefix's
    state carried into the chunked kernel, which holds its maxima constant, once kept them in autograd and gave the
    prefix's largest keys wrong gradients (the Perceiver AR, Set Transformer and encoder language models' leading
    keys and bidirectional prefixes). "causal_spikes": keys 60 nats apart, the exact per-position path."""
    n, lead = 24, 5 if case.endswith("leading_keys") else 0
    prefix = 7 if case.startswith("prefix") else 0
    if case == "causal_spikes":
        q, k, v = _keys_with("spikes", 60.0, n=n)
    else:
        q, k, v = _qkv(n, n + lead, d=6, seed=4)
    key_mask = _key_mask("random", B, n + lead)
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    g = torch.randn(B, H, n, E, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    mask = AttentionMask(causal=case != "noncausal", key_mask=key_mask, prefix_length=prefix)
    out, _ = linear_kernel(q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK)
    if case == "noncausal":
        expected = ref_linear(q, k, v, key_mask, feature_map)
        real = torch.ones_like(out, dtype=torch.bool)
    else:
        i = torch.arange(n)[:, None].clamp_min(prefix - 1) + lead  # the last key each query sees
        allowed = (torch.arange(n + lead)[None, :] <= i) & key_mask[:, None, None, :]
        expected = ref_linear_visible(q, k, v, allowed, feature_map)
        real = key_mask[:, None, lead:, None].expand_as(out)  # outputs at padded positions are never read
    got = torch.autograd.grad((out.double() * g * real).sum(), (q, k, v))
    want = torch.autograd.grad((expected * g * real).sum(), (q, k, v))
    for name, a, b in zip("qkv", got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-3, msg=lambda m, name=name: f"d/d{name}: {m}")


def test_causal_exp_key_dropout_keeps_the_exact_path_for_a_query_whose_key_is_dropped():
    """A key 200 nats up at position 9 makes chunk 8-15 steep for query 8 alone. With key 8 dropped, query 8 still
    reads keys 0-7 through the carried state and must get them exactly: the steepness check counts the queries that
    are used (unpadded), not the keys that are kept, else query 8's output underflows."""
    q, k, v = _qkv(16, seed=11, d=6)
    k = k.clone()
    k[:, :, 9, 0] += 200.0
    drop = torch.ones(B, H, 16, dtype=torch.bool)
    drop[:, :, 8] = False
    out, _ = causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=8, drop=drop)
    allowed = torch.ones(16, 16, dtype=torch.bool).tril() & drop[:, :, None, :]
    _check(out, ref_linear_visible(q, k, v, allowed, "exp"))


@pytest.mark.parametrize(
    "drop",
    [torch.ones(B, 16, dtype=torch.bool), torch.ones(B, H, 16), torch.ones(B, H, 15, dtype=torch.bool)],
    ids=["no_heads", "float", "too_short"],
)
@pytest.mark.parametrize("kernel", ["causal", "prefix"])
def test_a_key_dropout_mask_of_the_wrong_shape_or_type_is_refused(kernel, drop):
    """A (b, m) mask would broadcast against (b, h, m) into nonsense; a float one would not mask: both refused."""
    q, k, v = _qkv(16)
    with pytest.raises(ValueError, match=r"`drop` must be a bool tensor of shape \(2, 2, 16\)"):
        if kernel == "causal":
            causal_linear_attention(q, k, v, None, feature_map="elu", chunk_size=CHUNK, drop=drop)
        else:
            prefix_causal_linear_attention(
                q, k, v, None, feature_map="elu", chunk_size=CHUNK, prefix_length=4, drop=drop
            )


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_dropout_acts_only_while_training(feature_map, causal):
    """`attention_probs_dropout_prob` drops keys of a linear-attention layer in training mode only: two training calls
    differ (a fresh mask each), evaluation calls are deterministic and equal the layer without dropout, gradients are
    finite, and a causal layer's outputs up to t ignore tokens after t under the same mask."""
    n, hidden, t = 40, 32, 17
    torch.manual_seed(0)
    config = _config("linear", feature_map)
    config.attention_probs_dropout_prob = 0.5
    dropping = MultiHeadAttention(config, causal=causal)
    plain = MultiHeadAttention(_config("linear", feature_map), causal=causal)
    plain.load_state_dict(dropping.state_dict())
    x = torch.randn(2, n, hidden, requires_grad=True)
    first, second = dropping.train()(x)[0], dropping(x)[0]
    assert not torch.allclose(first, second, atol=1e-3)
    first.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(dropping.eval()(x)[0], plain.eval()(x)[0], atol=0, rtol=0)
        torch.testing.assert_close(plain.train()(x)[0], plain.eval()(x)[0], atol=0, rtol=0)
        if causal:
            x2 = x.detach().clone()
            x2[:, t + 1 :] = torch.randn(2, n - t - 1, hidden)
            torch.manual_seed(1)
            out = dropping.train()(x)[0]
            torch.manual_seed(1)
            out2 = dropping(x2)[0]
            torch.testing.assert_close(out2[:, : t + 1], out[:, : t + 1], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("decay", ["none", "per chunk", "per feature"])
@pytest.mark.parametrize("start", [False, True], ids=["zeros", "state"])
def test_chunk_scan_matches_a_plain_loop_and_its_gradient(decay, start):
    """`chunk_scan`: the state entering each chunk (and the last one) as a loop of out-of-place ops computes it, with
    no decay (a cumsum), a decay per chunk or a rescaling per feature, from zeros or a given state; gradients of the
    chunk states, the decay and the start checked numerically, also where one output is unused."""
    from hf_settransformer.linear_torch import chunk_scan

    g64 = {"dtype": torch.float64, "requires_grad": True}
    x = torch.randn(2, 3, 7, 4, 5, **g64)
    g = {"none": None, "per chunk": torch.rand(2, 3, 7, **g64), "per feature": torch.rand(2, 3, 7, 4, **g64)}[decay]
    s0 = torch.randn(2, 3, 4, 5, **g64) if start else None
    running, expected = torch.zeros(2, 3, 4, 5, dtype=torch.float64) if s0 is None else s0, []
    for i in range(7):
        expected.append(running)
        factor = 1.0 if g is None else g[:, :, i].reshape(*g.shape[:2], *g.shape[3:], *[1] * (5 - g.dim()))
        running = running * factor + x[:, :, i]
    before, last = chunk_scan(x, g, s0)
    torch.testing.assert_close(before, torch.stack(expected, dim=2))
    torch.testing.assert_close(last, running)
    if g is None and not start:
        torch.testing.assert_close(before, torch.cumsum(x, dim=2) - x)
    inputs = tuple(t for t in (x, g, s0) if t is not None)

    def scan(*args):
        args = iter(args)
        return chunk_scan(next(args), next(args) if g is not None else None, next(args) if start else None)

    assert torch.autograd.gradcheck(scan, inputs)
    for used in (0, 1):  # one output unused (a training step reads no last state): its gradient is never made
        assert torch.autograd.gradcheck(lambda *args: scan(*args)[used], inputs)
    one = tuple(t[:, :, :1] if t is x or t is g else t for t in inputs)  # one chunk, its last state unused
    assert torch.autograd.gradcheck(lambda *args: scan(*args)[0], one)


# ---------------------------------------------------------------------------------------------------------------
# the kernel registry


def test_unknown_attention_type_names_the_registered_kernels():
    with pytest.raises(ValueError, match=r"`attention_type` must be one of \['linear', 'softmax'\], got 'lineer'"):
        attention_kernel("lineer")
    with pytest.raises(StrictDataclassError, match="attention_type"):
        _config("lineer", "elu")


def test_kernel_is_chosen_when_the_layer_is_built():
    """A layer keeps the kernel it was built with: editing the config afterwards does not switch it."""
    module = _module("softmax", "elu")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        before = module(x)[0]
        module.config.attention_type = "linear"
        after = module(x)[0]
    assert module.kernel is ATTENTION_KERNELS["softmax"]
    torch.testing.assert_close(after, before)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_one_mask_serves_every_kernel(causal):
    """The same AttentionMask object, handed to a linear layer first and a softmax layer next (the padding trap of a
    mask built "for" one kind of kernel), keeps padded keys out of both: each output equals the output without them."""
    b, n, hidden = 2, 6, 32
    x = torch.randn(b, n, hidden)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    key_mask[1, 4:] = False  # row 1: two padded keys at the end
    mask = AttentionMask.build(key_mask, causal=causal, num_queries=n, num_keys=n)
    for attention_type, feature_map in [("linear", "elu"), ("linear", "exp"), ("softmax", "elu")]:
        module = _module(attention_type, feature_map, causal=causal)
        with torch.no_grad():
            padded = module(x, mask=mask)[0][1, :4]
            alone = module(x[1:, :4], mask=AttentionMask(causal=causal))[0][0]
        torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-4, msg=attention_type)


@pytest.fixture
def counting_kernel():
    """A registered kernel that counts its calls and computes softmax attention; removed after the test."""
    calls = []

    def forward(q, k, v, mask, state=None, **options):
        calls.append(state is not None)
        return softmax_kernel(q, k, v, mask, state, **options)

    softmax = ATTENTION_KERNELS["softmax"]
    register_attention_kernel("counted", dataclasses.replace(softmax, forward=forward))
    yield calls
    del ATTENTION_KERNELS["counted"]


@pytest.mark.parametrize("family", ["encoder", "decoder", "set_transformer", "perceiver_io"])
def test_a_registered_kernel_runs_in_every_family(counting_kernel, family):
    """One registry entry is all a new kernel needs: every family builds with it, gives the softmax model's outputs
    (same weights) and, in the decoder, keeps its cache through generate()."""
    from tests.helpers import family_classes, make_model, tiny_config
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    reference = make_model(family_classes(config)[AutoModelForCausalLM], config)
    counted = make_model(family_classes(config)[AutoModelForCausalLM], tiny_config(family, attention_type="counted"))
    counted.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 37, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(counted(ids, use_cache=False).logits, reference(ids, use_cache=False).logits)
    assert len(counting_kernel) > 0 and not any(counting_kernel)  # called, without a cache
    if family == "decoder":
        counting_kernel.clear()
        out = counted.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.equal(out, reference.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0))
        assert any(counting_kernel)  # the kernel was handed its cache layer


@pytest.mark.parametrize(
    "name, kernel, error, match",
    [
        ("", None, ValueError, "non-empty string"),
        (3, None, ValueError, "non-empty string"),
        ("mine", softmax_kernel, TypeError, "takes an AttentionKernel.*got function"),
    ],
)
def test_register_attention_kernel_refuses_what_is_not_a_kernel(name, kernel, error, match):
    """A bare forward function or a bad name is refused at registration, not when a model is built later."""
    kernel = ATTENTION_KERNELS["softmax"] if kernel is None else kernel
    before = dict(ATTENTION_KERNELS)
    with pytest.raises(error, match=match):
        register_attention_kernel(name, kernel)
    assert ATTENTION_KERNELS == before


def test_decoder_refuses_a_filled_cache_of_another_kernel():
    """A linear decoder handed a DynamicCache that already holds keys and values says so; an empty one is replaced by
    the kernel's own cache."""
    from tests.helpers import make_model, tiny_config
    from transformers.cache_utils import DynamicCache

    import hf_settransformer as hfst

    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", "linear", "elu"))
    ids = torch.randint(0, 37, (1, 5))
    with torch.no_grad():
        out = model(ids, past_key_values=DynamicCache(), use_cache=True)
        assert isinstance(out.past_key_values, hfst.cache.LinearAttentionCache)
        filled = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))(ids, use_cache=True)
        with pytest.raises(ValueError, match="keeps its past in a LinearAttentionCache, not a DynamicCache"):
            model(ids, past_key_values=filled.past_key_values, use_cache=True)


def test_attention_scales_by_head_dim():
    """The official Set Transformer scales by sqrt(hidden); here it is sqrt(head_dim) (eager path checked)."""
    config = tiny_config("encoder")
    attn = hfst.MultiHeadAttention(config).eval()
    x = torch.randn(1, 5, 32)
    _, weights = attn(x, output_attentions=True)
    q, k, _ = attn.project(x)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1)
    assert torch.allclose(weights, expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# one op signature: (q, k, v, mask, state, *, feature_map, ...) -> (out, state)

LINEAR_OPS = [linear_attention, causal_linear_attention, prefix_causal_linear_attention, linear_attention_step]


@pytest.mark.parametrize("op", LINEAR_OPS, ids=lambda op: op.__name__)
def test_linear_ops_share_one_signature(op):
    import inspect

    params = list(inspect.signature(op).parameters.values())
    assert [p.name for p in params[:5]] == ["q", "k", "v", "mask", "state"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:5])
    assert params[3].default is None and params[4].default is None
    assert all(p.kind is p.KEYWORD_ONLY for p in params[5:]) and "feature_map" in [p.name for p in params[5:]]
    q, k, v = _qkv(1)
    out, state = op(q, k, v, feature_map="exp")
    assert out.shape == (B, H, 1, E) and out.dtype == torch.float32
    if op is linear_attention:
        assert state is None
    else:
        assert state.kv.shape == (B, H, D, E) and state.k_max.shape == (B, H, D)


@pytest.mark.parametrize("op", LINEAR_OPS, ids=lambda op: op.__name__)
def test_linear_ops_name_a_state_given_as_the_mask(op):
    q, k, v = _qkv(1)
    _, state = causal_linear_attention(q, k, v)
    with pytest.raises(TypeError, match=r"`mask` of .* key mask.*got a LinearAttentionState.*\(q, k, v, mask, state\)"):
        op(q, k, v, state)
    with pytest.raises(ValueError, match=r"`mask` of .* must have shape \(2, 1\)"):
        op(q, k, v, torch.ones(B, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="`state` of .* LinearAttentionState or None; got a Tensor"):
        op(q, k, v, None, torch.zeros(B, H, D, E))


def test_non_causal_linear_attention_refuses_a_state():
    q, k, v = _qkv(4)
    _, state = causal_linear_attention(q, k, v)
    with pytest.raises(ValueError, match="non-causal and carries no state"):
        linear_attention(q, k, v, None, state)


def test_linear_attention_step_takes_one_token():
    q, k, v = _qkv(3)
    with pytest.raises(ValueError, match="takes one token; got 3 queries"):
        linear_attention_step(q, k, v)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("prefix_length", [0, 5])
def test_prefix_causal_state_continues_and_is_returned(feature_map, prefix_length):
    """The prefix op reads a carried state (keys every query sees) and returns the state after its last key: the
    same state as the causal op's over the same keys, which a later step continues."""
    n, lead = 12, 3
    q, k, v = _qkv(n, m=lead + n, seed=5)
    key_mask = _key_mask("random", B, lead + n)
    _, before = causal_linear_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2], feature_map=feature_map)
    opts = {"feature_map": feature_map, "chunk_size": CHUNK}
    out, state = prefix_causal_linear_attention(q, k, v, key_mask, before, prefix_length=prefix_length, **opts)
    _, want_state = causal_linear_attention(k, k, v, key_mask, before, **opts)  # the same keys, from the same state
    for got, want in zip(dataclasses.astuple(state), dataclasses.astuple(want_state)):
        assert (got is None) == (want is None)
        if got is not None:
            _check(got, want)
    # the carried keys count for every query: the reference sees them as leading keys of a longer sequence
    q2, k2, v2 = _qkv(2, seed=9)
    _, first = causal_linear_attention(q2, k2, v2, feature_map=feature_map)
    whole, _ = prefix_causal_linear_attention(
        q,
        torch.cat([k2, k], dim=2),
        torch.cat([v2, v], dim=2),
        _two_real_keys_before(key_mask),
        prefix_length=prefix_length,
        **opts,
    )
    carried, _ = prefix_causal_linear_attention(q, k, v, key_mask, first, prefix_length=prefix_length, **opts)
    _check(carried, whole)


def _two_real_keys_before(key_mask):
    return torch.cat([torch.ones(B, 2, dtype=torch.bool), key_mask], dim=1)


def test_prefix_causal_names_a_prefix_out_of_range():
    q, k, v = _qkv(6, m=4)
    with pytest.raises(ValueError, match=r"m - n \+ prefix_length >= 0\); got n=6 queries, m=4 keys, prefix_length=1"):
        prefix_causal_linear_attention(q, k, v, prefix_length=1)
    with pytest.raises(ValueError, match="prefix_length=7"):
        prefix_causal_linear_attention(q, k, v, prefix_length=7)


@pytest.mark.parametrize("op", LINEAR_OPS[1:], ids=lambda op: op.__name__)
def test_exp_ops_refuse_a_state_without_key_maxima(op):
    q, k, v = _qkv(1)
    _, elu_state = causal_linear_attention(q, k, v, feature_map="elu")
    with pytest.raises(ValueError, match=r"feature_map='exp' needs a state with the key maxima.*has none"):
        op(q, k, v, None, elu_state, feature_map="exp")

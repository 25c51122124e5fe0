"""The fused Triton kernels (hf_settransformer/linear_triton.py) against float64 references: outputs, final states and
gradients of q, k, v and of a carried state, for both feature maps, with key masks, key dropout, lengths that are not
a multiple of the chunk, low-precision inputs, exp keys hundreds of nats apart and packed rows (`seq_idx`), causal and
not; and the dispatch from `causal_linear_attention` and `linear_attention` and through a whole decoder and encoder.

Without a GPU the kernels run on CPU tensors in triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before
triton is imported): small shapes keep it fast. Skipped where triton is not installed.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tests.helpers import batch_of_tokens, decoder, make_model, tiny_config

import hf_settransformer as hfst

from hf_settransformer import linear_ops, linear_torch, linear_triton
from hf_settransformer.cache import LinearAttentionState
from hf_settransformer.feature_maps import FEATURE_MAPS as FEATURE_TABLE
from hf_settransformer.linear_naive import (
    cumulative_decay,
    naive_causal_linear_attention,
    naive_decayed_linear_attention,
    naive_linear_attention,
    naive_linear_visible,
    naive_packed_causal_linear_attention,
    normalise_rows,
    phi,
)
from hf_settransformer.linear_ops import causal_linear_attention, linear_attention
from hf_settransformer.linear_triton import (
    fused_causal_linear_attention,
    fused_causal_linear_attention_available,
    fused_decay_available,
    fused_linear_attention,
    fused_linear_attention_available,
    fused_linear_attention_step,
)

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FEATURE_MAPS = ["elu", "exp"]
B, H, D, E = 2, 2, 6, 5
CHUNK = 16  # the smallest the kernel takes: several chunks at small n


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    if DEVICE == "cpu":
        import triton

        if not triton.knobs.runtime.interpret:
            pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: no interpreter for CPU tensors")
    monkeypatch.delenv("HFST_DISABLE_TRITON", raising=False)
    monkeypatch.delenv("HFST_FORCE_TRITON", raising=False)


def _qkv(n, seed=0, b=B, h=H, d=D, e=E, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, n, d), (b, h, n, d), (b, h, n, e)]
    return tuple(torch.randn(shape, generator=g).to(DEVICE, dtype) for shape in shapes)


def _leaves(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def _key_mask(kind, n, seed=1):
    """None; 'random' key padding; 'left' padding (row 0: the first 3 keys masked, so its first queries see none)."""
    if kind == "none":
        return None
    if kind == "random":
        mask = torch.rand(B, n, generator=torch.Generator().manual_seed(seed)) > 0.4
    else:
        mask = torch.ones(B, n, dtype=torch.bool)
        mask[0, :3] = False
    return mask.to(DEVICE)


def _keys_with(pattern, span, n=64, seed=5):
    """As tests/ops/test_attention.py: keys of a few nats plus `span` nats in feature 0, as a spike near the end, a spike
    near the start, a drift from 0 to `span`, or spikes every 10 positions."""
    q, k, v = _qkv(n, seed=seed)
    if pattern == "late_spike":
        k[:, :, -3, 0] += span
    elif pattern == "early_spike":
        k[:, :, 2, 0] += span
    elif pattern == "drift":
        k[..., 0] += torch.linspace(0, span, n, device=DEVICE)
    else:  # "spikes"
        k[:, :, 5::10, 0] += span
    return q, k, v


def _reference(q, k, v, feature_map, keep=None, state=None):
    """Float64 causal linear attention continuing `state`: out_i = (A_i kv0' + sum_{j<=i} w_ij v_j) /
    (A_i . z0' + sum_{j<=i} w_ij), w_ij = sum_f phi(q_if) phi(k_jf) over kept keys (keep (b, 1 or h, n)), 0 where the
    denominator is 0; for exp the state's sums are in reference k_max (kv0' = exp(k_max) kv0). Returns (out, kv, z,
    k_max) after the last token, exp's kv and z in reference k_max = the maximum of k_max and every kept key (a
    constant, as in the kernels). Exact for keys of up to a few tens of nats."""
    q, k, v = q.double(), k.double(), v.double()
    keep = torch.ones_like(k[..., 0], dtype=torch.bool) if keep is None else keep.expand_as(k[..., 0])
    k_max = None
    if feature_map == "exp":
        k_max = k.detach().float().masked_fill(~keep[..., None], float("-inf")).amax(2)
        if state is not None:
            k_max = torch.maximum(k_max, state.k_max.float())
        k_max = k_max.clamp_min(-1e30).double()  # fp32's -1e30, as the kernels
    a, bk = phi(q, feature_map), phi(k, feature_map) * keep[..., None]
    n = q.shape[2]
    w = (a @ bk.transpose(-1, -2)) * torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    num, den = w @ v, w.sum(-1)
    if k_max is not None:  # phi(k) in reference k_max
        bk = torch.exp((k - k_max[:, :, None]).masked_fill(~keep[..., None], float("-inf")))
    kv, z = bk.transpose(-1, -2) @ v, bk.sum(2)
    if state is not None:
        kv0, z0 = state.kv.double(), state.z.double()
        if feature_map == "exp":
            a = a * torch.exp(state.k_max.double())[:, :, None, :]  # the state's sums in reference k_max
            kv0_now = kv0 * torch.exp(state.k_max.double() - k_max)[..., None]
            kv, z = kv + kv0_now, z + z0 * torch.exp(state.k_max.double() - k_max)
        else:
            kv, z = kv + kv0, z + z0
        num, den = num + a @ kv0, den + (a @ z0[..., None]).squeeze(-1)
    safe = torch.where(den > 0, den, torch.ones_like(den))[..., None]
    return torch.where(den[..., None] > 0, num / safe, torch.zeros_like(num)), kv, z, k_max


def _grads(outputs, inputs, seed=8):
    """d(sum_t outputs_t . g_t)/d inputs for fixed random g (float64)."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=g).to(o.device)).sum() for o in outputs)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _assert_close(got, want, atol, rtol, name=""):
    assert got.dtype != torch.float64 and torch.isfinite(got).all(), name
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


def _assert_grads_close(got, want, names, atol=2e-5, rtol=1e-3):
    for name, a, b in zip(names, got, want):
        _assert_close(a, b, atol, rtol, f"d/d{name}")


# ---------------------------------------------------------------------------------------------------------------
# the kernels


@pytest.mark.parametrize("mask_kind", ["none", "random", "left"])
@pytest.mark.parametrize("n", [1, 15, 16, 37])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_matches_float64_reference_with_gradients(feature_map, n, mask_kind):
    """Outputs, final state and d/d(q, k, v) against float64 autograd, for lengths below, at and past one chunk (the
    tail chunk is masked) and key padding; queries that see only padding give exactly 0."""
    q, k, v = _leaves(*_qkv(n))
    key_mask = _key_mask(mask_kind, n)
    out, state = fused_causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)
    assert out.shape == (B, H, n, E) and out.dtype == torch.float32
    keep = None if key_mask is None else key_mask[:, None]
    want_out, want_kv, want_z, want_max = _reference(q, k, v, feature_map, keep)
    if feature_map == "elu":
        torch.testing.assert_close(want_out, naive_causal_linear_attention(q, k, v, key_mask, "elu"))
        assert state.k_max is None
    else:  # the state's reference: the maximum of every key seen, exactly
        assert torch.equal(state.k_max.double(), want_max)
    _assert_close(out, want_out, 1e-5, 1e-4, "out")
    _assert_close(state.kv, want_kv, 1e-4, 1e-4, "kv")
    _assert_close(state.z, want_z, 1e-4, 1e-4, "z")
    if mask_kind == "left":
        assert torch.equal(out[0, :, : min(3, n)].cpu(), torch.zeros(H, min(3, n), E))
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want_out], (q, k, v)), "qkv")


@pytest.mark.parametrize("with_mask", [False, True], ids=["dropout", "dropout_and_padding"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_key_dropout_leaves_the_dropped_keys_out_of_every_sum(feature_map, with_mask):
    """A per-head keep mask (b, h, n), alone or with key padding: the float64 ratio over the kept, unpadded, earlier
    keys, and its gradients (a dropped key gets no gradient)."""
    n = 37
    q, k, v = _leaves(*_qkv(n, seed=2))
    drop = (torch.rand(B, H, n, generator=torch.Generator().manual_seed(3)) >= 0.3).to(DEVICE)
    key_mask = _key_mask("random", n) if with_mask else None
    out, _ = fused_causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, drop=drop, chunk_size=CHUNK)
    keep = drop if key_mask is None else drop & key_mask[:, None]
    allowed = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril() & keep[:, :, None, :]
    want = naive_linear_visible(q, k, v, allowed, feature_map)
    _assert_close(out, want, 1e-5, 1e-4, "out")
    got_grads = _grads([out], (q, k, v))
    _assert_grads_close(got_grads, _grads([want], (q, k, v)), "qkv")
    assert torch.equal(got_grads[1][~keep].cpu(), torch.zeros_like(got_grads[1][~keep]).cpu())


@pytest.mark.parametrize("split", [1, 16, 21])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_carries_a_state_with_its_gradient(feature_map, split):
    """Chunked prefill: the first `split` tokens' state carried into the rest gives the whole sequence's outputs and
    state (row 0's first 3 keys are padding: split 1 carries a state of no key); gradients flow through the carried
    state to the first part's k and v."""
    n = 37
    q, k, v = _leaves(*_qkv(n, seed=4))
    key_mask = _key_mask("left", n)
    first, state = fused_causal_linear_attention(
        q[:, :, :split],
        k[:, :, :split],
        v[:, :, :split],
        key_mask[:, :split],
        feature_map=feature_map,
        chunk_size=CHUNK,
    )
    rest, final = fused_causal_linear_attention(
        q[:, :, split:],
        k[:, :, split:],
        v[:, :, split:],
        key_mask[:, split:],
        state,
        feature_map=feature_map,
        chunk_size=CHUNK,
    )
    out = torch.cat([first, rest], dim=2)
    want_out, want_kv, want_z, _ = _reference(q, k, v, feature_map, key_mask[:, None])
    _assert_close(out, want_out, 1e-5, 1e-4, "out")
    _assert_close(final.kv, want_kv, 1e-4, 1e-4, "kv")
    _assert_close(final.z, want_z, 1e-4, 1e-4, "z")
    got = _grads([out, final.kv, final.z], (q, k, v))
    _assert_grads_close(got, _grads([want_out, want_kv, want_z], (q, k, v)), "qkv", atol=5e-5)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_gradients_of_a_given_state(feature_map):
    """A state given as leaves (kv0, z0; exp's k_max a constant reference): outputs, final state and the gradients of
    kv0 and z0 as well as of q, k, v."""
    q, k, v = _leaves(*_qkv(37, seed=5))
    g = torch.Generator().manual_seed(6)
    kv0 = torch.rand(B, H, D, E, generator=g).to(DEVICE) * 3
    kv0, z0 = _leaves(kv0, torch.rand(B, H, D, generator=g).to(DEVICE) + 1)
    k_max = torch.randn(B, H, D, generator=g).to(DEVICE) + 1 if feature_map == "exp" else None
    state = LinearAttentionState(kv0, z0, k_max)
    out, final = fused_causal_linear_attention(q, k, v, None, state, feature_map=feature_map, chunk_size=CHUNK)
    want_out, want_kv, want_z, _ = _reference(q, k, v, feature_map, None, state)
    _assert_close(out, want_out, 1e-5, 1e-4, "out")
    _assert_close(final.kv, want_kv, 1e-4, 1e-4, "kv")
    got = _grads([out, final.kv, final.z], (q, k, v, kv0, z0))
    want = _grads([want_out, want_kv, want_z], (q, k, v, kv0, z0))
    _assert_grads_close(got, want, ["q", "k", "v", "kv0", "z0"], atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_low_precision_inputs_read_in_place(feature_map, dtype):
    """bf16/fp16 q, k, v, as head views of one fused projection (b, n, 3, h, d) (strided, read in place): fp32 outputs
    and state, gradients in the input dtype, all within low-precision error of the float64 reference of the same
    (rounded) inputs; head dims 32 and 24 (padded to 32)."""
    n, d, e = 40, 32, 24
    qkv = torch.randn(B, n, 3, H, d, generator=torch.Generator().manual_seed(7)).to(DEVICE, dtype).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (b, h, n, d), strided
    v = v[..., :e]
    key_mask = _key_mask("random", n)
    out, state = fused_causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)
    assert out.dtype == state.kv.dtype == state.z.dtype == torch.float32
    want_out, want_kv, _, _ = _reference(q, k, v, feature_map, key_mask[:, None])
    _assert_close(out, want_out, 2e-2, 2e-2, "out")
    _assert_close(state.kv, want_kv, 1e-1, 2e-2, "kv")
    (got,) = _grads([out], (qkv,))
    (want,) = _grads([want_out], (qkv,))
    assert got.dtype == dtype
    _assert_close(got, want, 3e-2, 5e-2, "d/dqkv")


def test_fused_elu_feature_map_is_exact_for_negative_bf16_inputs():
    """q = k = -9 in bf16: elu(x) + 1 computed in bf16 is 0 (every weight 0, every output 0); in its exact form every
    weight is the same tiny number and each output is the running mean of the values."""
    n = 20
    _, _, v = _qkv(n, seed=9)
    q = torch.full((B, H, n, D), -9.0, device=DEVICE, dtype=torch.bfloat16)
    out, _ = fused_causal_linear_attention(q, q, v.to(torch.bfloat16), chunk_size=CHUNK)
    running_mean = v.to(torch.bfloat16).float().cumsum(2) / torch.arange(1, n + 1, device=DEVICE)[:, None]
    _assert_close(out, running_mean, 1e-2, 1e-2, "out")


@pytest.mark.parametrize("decay", [None, "gated"], ids=["no_decay", "decay"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_largest_heads(feature_map, decay):
    """Head dim 128 (the largest taken) and value dim 96 (two value blocks in the forward, the second padded), several
    chunks; without and with a decay (each value block decays its own part of the state, exp's reference alike)."""
    q, k, v = _leaves(*_qkv(70, seed=10, b=1, h=1, d=128, e=96))
    if decay is None:
        out, _ = fused_causal_linear_attention(q, k, v, None, feature_map=feature_map, chunk_size=32)
        want_out, _, _, _ = _reference(q, k, v, feature_map)
        inputs = (q, k, v)
    else:
        (logd,) = _leaves(_log_decay(70, decay, seed=11, b=1, h=1))
        out, state = fused_causal_linear_attention(q, k, v, None, feature_map=feature_map, chunk_size=32, decay=logd)
        want_out, want_state = _float64_op(q, k, v, None, None, logd, feature_map)
        _assert_close(state.kv, want_state.kv, 1e-4, 1e-4, "kv")
        inputs = (q, k, v, logd)
    _assert_close(out, want_out, 1e-5, 1e-4, "out")
    _assert_grads_close(_grads([out], inputs), _grads([want_out], inputs), "qkvd", atol=5e-5)


# ---------------------------------------------------------------------------------------------------------------
# the causal kernels with a decay

DECAY_SCALES = {"fixed": 0.05, "gated": 3.0}  # log g = -rand * scale: a RetNet-like slow decay, a strong gate


def _log_decay(n, kind, seed=50, b=B, h=H):
    """A log-decay (b, h, n) <= 0: -rand * DECAY_SCALES[kind] (or a given scale)."""
    scale = DECAY_SCALES.get(kind, kind)
    return (-torch.rand(b, h, n, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def _decayed_reference(q, k, v, logd, key_mask, drop, feature_map):
    """Float64 `naive_decayed_linear_attention` with key dropout's dropped keys (b, h, n) left out of every sum; they
    still decay (time passes), masked (padding) positions do not."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[2]
    g = cumulative_decay(logd, key_mask)  # (b, h, n)
    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() & drop[:, :, None, :]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    logdecay = (g[..., :, None] - g[..., None, :]).masked_fill(~allowed, float("-inf"))
    if feature_map == "elu":
        return normalise_rows((phi(q, "elu") @ phi(k, "elu").transpose(-1, -2)) * torch.exp(logdecay), v)
    logw = torch.logsumexp(q[..., :, None, :] + k[..., None, :, :], dim=-1) + logdecay
    return torch.softmax(logw, dim=-1) @ v


def _decay_inputs(n, kind, seed):
    """q, k, v, log-decay leaves; a random key mask and key dropout that keep key 0, so that every query sees a key
    (the float64 softmax's gradient is NaN for a row that sees none)."""
    q, k, v = _qkv(n, seed=seed)
    logd = _log_decay(n, kind, seed=seed + 1)
    key_mask = _key_mask("random", n, seed=seed + 2)
    key_mask[:, 0] = True
    drop = (torch.rand(B, H, n, generator=torch.Generator().manual_seed(seed + 3)) >= 0.25).to(DEVICE)
    drop[:, :, 0] = True
    return (*_leaves(q, k, v, logd), key_mask, drop)


@pytest.mark.parametrize("kind", ["fixed", "gated"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_decay_matches_float64_reference_with_gradients(feature_map, kind):
    """With a decay (slow, or a strong gate), key padding and key dropout, cut at token 21 into a first call and a
    second that continues its state (neither a multiple of the chunk): the outputs and the gradients of q, k, v and
    the decay (through the carried state too) equal the float64 reference's, which drops keys but lets them decay."""
    n, split = 37, 21
    q, k, v, logd, key_mask, drop = _decay_inputs(n, kind, seed=51)
    parts = []
    state = None
    for sl in (slice(0, split), slice(split, n)):
        out, state = fused_causal_linear_attention(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], key_mask[:, sl], state, feature_map=feature_map,
            drop=drop[..., sl], chunk_size=CHUNK, decay=logd[..., sl],
        )  # fmt: skip
        parts.append(out)
    out = torch.cat(parts, dim=2)
    want = _decayed_reference(q, k, v, logd, key_mask, drop, feature_map)
    everything = torch.ones_like(drop)
    torch.testing.assert_close(  # the reference is naive_decayed_linear_attention where no key is dropped
        _decayed_reference(q, k, v, logd, key_mask, everything, feature_map),
        naive_decayed_linear_attention(q, k, v, logd, key_mask, feature_map),
    )
    _assert_close(out, want, 1e-5, 1e-4, "out")
    got = _grads([out], (q, k, v, logd))
    _assert_grads_close(got, _grads([want], (q, k, v, logd)), ["q", "k", "v", "decay"], atol=5e-5)
    assert torch.equal(got[3][~key_mask[:, None].expand(B, H, n)].cpu(), torch.zeros(int((~key_mask).sum()) * H))


def _float64_op(q, k, v, key_mask, state, logd, feature_map, drop=None):
    """`linear_ops`' PyTorch chunks in float64 (chunks of 8): outputs and state, the reference of a carried state."""
    if state is not None:
        state = LinearAttentionState(state.kv.double(), state.z.double(), state.k_max)
        state = state if state.k_max is None else LinearAttentionState(state.kv, state.z, state.k_max.double())
    logd = linear_ops._log_decay(logd, key_mask).double()
    fmap = FEATURE_TABLE[feature_map]
    return linear_torch._causal_linear_attention(q.double(), k.double(), v.double(), key_mask, fmap, 8, state, drop, logd)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_decay_gradients_of_a_given_state(feature_map):
    """A state given as leaves (kv0, z0; exp's k_max a constant reference) and a strong gate: outputs, the final state
    (exp: its decayed reference, kv and z as stored) and the gradients of kv0, z0, q, k, v and the decay, through the
    outputs and the final state, equal the PyTorch op's in float64."""
    n = 37
    q, k, v, logd, key_mask, _ = _decay_inputs(n, "gated", seed=55)
    g = torch.Generator().manual_seed(56)
    kv0, z0 = _leaves(torch.rand(B, H, D, E, generator=g).to(DEVICE) * 3, torch.rand(B, H, D, generator=g).to(DEVICE))
    k_max = torch.randn(B, H, D, generator=g).to(DEVICE) + 1 if feature_map == "exp" else None
    state = LinearAttentionState(kv0, z0 + 1, k_max)
    out, final = fused_causal_linear_attention(
        q, k, v, key_mask, state, feature_map=feature_map, chunk_size=CHUNK, decay=logd
    )
    want, want_final = _float64_op(q, k, v, key_mask, state, logd, feature_map)
    _assert_close(out, want, 1e-5, 1e-4, "out")
    if feature_map == "exp":
        _assert_close(final.k_max, want_final.k_max, 1e-5, 1e-5, "k_max")
    else:
        assert final.k_max is None
    _assert_close(final.kv, want_final.kv, 1e-4, 1e-4, "kv")
    _assert_close(final.z, want_final.z, 1e-4, 1e-4, "z")
    leaves = (q, k, v, logd, kv0, z0)
    got = _grads([out, final.kv, final.z], leaves)
    want_grads = _grads([want, want_final.kv, want_final.z], leaves)
    _assert_grads_close(got, want_grads, ["q", "k", "v", "decay", "kv0", "z0"], atol=5e-5)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_decay_low_precision_inputs(feature_map):
    """bf16 q, k, v with a strong gate and key padding, head dims 32 and 24: fp32 outputs, gradients (q, k, v in bf16,
    the decay in fp32) within bf16 error of the float64 reference of the same (rounded) inputs."""
    n, d, e = 40, 32, 24
    q, k, v = _leaves(*(x.to(torch.bfloat16) for x in _qkv(n, seed=57, d=d, e=e)))
    (logd,) = _leaves(_log_decay(n, "gated", seed=58))
    key_mask = _key_mask("random", n, seed=59)
    key_mask[:, 0] = True
    out, _ = fused_causal_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK, decay=logd)
    assert out.dtype == torch.float32
    want = naive_decayed_linear_attention(q, k, v, logd, key_mask, feature_map)
    _assert_close(out, want, 2e-2, 2e-2, "out")
    got = _grads([out], (q, k, v, logd))
    assert [x.dtype for x in got] == [torch.bfloat16] * 3 + [torch.float32]
    for name, a, b in zip("qkvd", got, _grads([want], (q, k, v, logd))):
        _assert_close(a, b, 5e-2, 5e-2, f"d/d{name}")


def test_fused_exp_decay_needs_no_exact_path_for_a_strong_gate():
    """A gate of about 6 nats a token (~100 nats over a chunk of 16): the chunked form alone (spread = inf: no chunk
    may take the exact path) gives the float64 outputs and gradients, with no overflow or underflow warning from the
    interpreter: inside a chunk the decay is a mask on the raw keys, and the state keeps the decayed key maximum."""
    n = 40
    q, k, v = _qkv(n, seed=60)
    logd = _log_decay(n, 12.0, seed=61)
    q, k, v, logd = _leaves(q, k, v, logd)
    want = naive_decayed_linear_attention(q, k, v, logd, None, "exp")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, _ = fused_causal_linear_attention(
            q, k, v, None, feature_map="exp", chunk_size=CHUNK, spread=float("inf"), decay=logd
        )
        got = _grads([out], (q, k, v, logd))
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(got, _grads([want], (q, k, v, logd)), "qkvd", atol=5e-5)


def test_fused_exp_decay_takes_the_exact_path_for_steep_chunks():
    """With a decay, a chunk is steep where its keys are: a key 200 nats above the rest in the middle of a chunk. The
    kernels' exact path (forward and backward) gives the float64 outputs and gradients, and the chunked form alone
    (spread = inf) would not (the chunk's earlier queries' terms underflow)."""
    n = 40
    q, k, v = _qkv(n, seed=62)
    k[:, :, 21, 0] += 200.0
    logd = _log_decay(n, "gated", seed=63)
    q, k, v, logd = _leaves(q, k, v, logd)
    want = naive_decayed_linear_attention(q, k, v, logd, None, "exp")
    with warnings.catch_warnings():
        # on CPU: no inf or NaN either in the chunked terms the steep chunks drop (the interpreter's numpy would warn)
        warnings.simplefilter("error", RuntimeWarning)
        out, _ = fused_causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=CHUNK, decay=logd)
        got = _grads([out], (q, k, v, logd))
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(got, _grads([want], (q, k, v, logd)), "qkvd", atol=5e-5)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy: the underflow this test shows
        chunked, _ = fused_causal_linear_attention(
            q, k, v, None, feature_map="exp", chunk_size=CHUNK, spread=float("inf"), decay=logd
        )
    assert not torch.allclose(chunked.double(), want, atol=1e-3, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------------------
# the non-causal kernels


def _noncausal_inputs(n, m, seed, b=B, h=H, d=D, e=E, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, n, d), (b, h, m, d), (b, h, m, e)]
    return tuple(torch.randn(shape, generator=g).to(DEVICE, dtype) for shape in shapes)


def _noncausal_mask(kind, m, seed=1):
    """None; 'random' key padding (b, m) with row 1 all padding (its outputs are 0); 'dropout' per head (b, h, m), as
    `linear_attention` gets key dropout's kept keys with the padding."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "random":
        mask = torch.rand(B, m, generator=g) > 0.4
        mask[1] = False
    else:
        mask = (torch.rand(B, H, m, generator=g) >= 0.3) & (torch.rand(B, 1, m, generator=g) > 0.2)
    return mask.to(DEVICE)


@pytest.mark.parametrize("mask_kind", ["none", "random", "dropout"])
@pytest.mark.parametrize(("n", "m"), [(1, 1), (21, 37), (48, 16)])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_noncausal_matches_float64_reference_with_gradients(feature_map, n, m, mask_kind):
    """Non-causal (exp: Shen et al.'s softmax over the keys): outputs and d/d(q, k, v) against float64 autograd, for
    query and key counts that are not a multiple of the block, several splits of the sums (split 16), key padding
    (a row of all padding gives 0) and per-head key dropout (a dropped key gets no gradient)."""
    q, k, v = _leaves(*_noncausal_inputs(n, m, seed=20))
    key_mask = _noncausal_mask(mask_kind, m)
    out, _ = fused_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK, split=CHUNK)
    assert out.shape == (B, H, n, E) and out.dtype == torch.float32
    want = naive_linear_attention(q, k, v, key_mask, feature_map)
    _assert_close(out, want, 1e-5, 1e-4, "out")
    got_grads = _grads([out], (q, k, v))
    _assert_grads_close(got_grads, _grads([want], (q, k, v)), "qkv")
    if mask_kind == "random":
        assert torch.equal(out[1].cpu(), torch.zeros(H, n, E))
    if key_mask is not None:
        dropped = ~key_mask.expand(B, H, m) if key_mask.dim() == 3 else ~key_mask[:, None].expand(B, H, m)
        assert torch.equal(got_grads[1][dropped].cpu(), torch.zeros_like(got_grads[1][dropped]).cpu())


def test_fused_noncausal_exp_keys_hundreds_of_nats_apart():
    """Keys 300 nats apart in one feature: the per-feature maximum over every split (each split's sums rescaled to
    it) keeps the softmax over the keys exact, as in float64."""
    q, k, v = _noncausal_inputs(8, 40, seed=21)
    k[:, :, 33, 0] += 300.0
    k[:, :, 3, 1] -= 300.0
    q, k, v = _leaves(q, k, v)
    out, _ = fused_linear_attention(q, k, v, None, feature_map="exp", chunk_size=CHUNK, split=CHUNK)
    want = naive_linear_attention(q, k, v, None, "exp")
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want], (q, k, v)), "qkv")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_noncausal_low_precision_inputs_read_in_place(feature_map, dtype):
    """bf16/fp16 head views of one fused projection (strided, read in place), head dims 32 and 24: fp32 outputs,
    gradients in the input dtype, within low-precision error of the float64 reference of the same inputs."""
    n, d, e = 40, 32, 24
    qkv = torch.randn(B, n, 3, H, d, generator=torch.Generator().manual_seed(22)).to(DEVICE, dtype).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    v = v[..., :e]
    key_mask = _noncausal_mask("dropout", n)
    out, _ = fused_linear_attention(q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK)
    want = naive_linear_attention(q, k, v, key_mask, feature_map)
    _assert_close(out, want, 2e-2, 2e-2, "out")
    (got,) = _grads([out], (qkv,))
    (want,) = _grads([want], (qkv,))
    assert got.dtype == dtype
    _assert_close(got, want, 3e-2, 5e-2, "d/dqkv")


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_noncausal_largest_heads(feature_map):
    """Head dim 128 and value dim 96 (two value blocks in the forward, the second padded), the default split."""
    q, k, v = _leaves(*_noncausal_inputs(33, 70, seed=23, b=1, h=1, d=128, e=96))
    out, _ = fused_linear_attention(q, k, v, None, feature_map=feature_map)
    want = naive_linear_attention(q, k, v, None, feature_map)
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want], (q, k, v)), "qkv", atol=5e-5)


COMPILE_FOR_GPU = """
import sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hf_settransformer import linear_triton as lt
from hf_settransformer.feature_maps import FEATURE_MAPS

assert lt._import_triton()
arch, decayed_only = int(sys.argv[1]), sys.argv[2] == "decayed"
pointers = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "dq": "*bf16", "dk": "*bf16", "dv": "*bf16", "keep": "*u8",
            "real": "*u8", "ids": "*i32", "spread": "fp32"}
causal = [lt._forward_kernel, lt._backward_dq_kernel, lt._backward_dkv_kernel]
decayable = causal + [lt._step_kernel]
for feature_map, d in [("elu", 64), ("exp", 128)]:
    q = torch.empty(1, 1, 1, d, dtype=torch.bfloat16, device="meta")  # `_blocks` reads the shape and dtype only
    forward = [lt._forward_kernel, lt._key_sums_kernel, lt._output_kernel, lt._step_kernel]
    backward = [lt._backward_dq_kernel, lt._backward_dkv_kernel, lt._query_grads_kernel, lt._key_grads_kernel]
    for kernel in forward + backward:
        # the step kernel with its decay only; the causal ones with and without, and over packed rows (SEQ) with and
        # without; decayed_only: the decayed variants
        variants = [(False, False)] + ([(True, False)] if kernel in decayable else [])
        variants += [(False, True), (True, True)] if kernel in causal else []
        for decay, packed in variants:
            if (decayed_only or kernel is lt._step_kernel) and not decay:
                continue
            fn = triton.runtime.jit.JITFunction(kernel)
            blocks = lt._blocks(q, q, 64, backward=kernel in backward)
            options = {"num_warps": blocks.pop("num_warps"), "num_stages": blocks.pop("num_stages")}
            flags = {**lt._map_flags(FEATURE_MAPS[feature_map]), "HAS_KEEP": True, "HAS_REAL": True,
                     "HAS_STATE": True, "HAS_MAX": True, "HAS_DECAY": decay, "SEQ": packed}
            constexprs = {name: value for name, value in {**blocks, **flags}.items() if name in fn.arg_names}
            scalar = lambda name: "i32" if len(name) == 1 or name.startswith("s_") else "*fp32"
            signature = {n: "constexpr" if n in constexprs else pointers.get(n, scalar(n)) for n in fn.arg_names}
            compiled = triton.compile(ASTSource(fn, signature, constexprs), GPUTarget("cuda", arch, 32), options)
            assert compiled.asm["cubin"]
            print("compiled", kernel.__name__, feature_map, d, "decay" if decay else "", "packed" if packed else "")
"""


def _compile_for(arch, which):
    """Run COMPILE_FOR_GPU for sm_<arch> in a process of its own, without the interpreter: its stdout."""
    pytest.importorskip("triton.backends.nvidia", reason="triton without its NVIDIA backend")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when unset
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU, str(arch), which], check=False,
                            cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_kernels_compile_for_an_h100_without_one():
    """The interpreter runs the kernels as Python; a GPU runs what triton compiles. Compile all eight (causal and
    non-causal, the step) for sm_90 (H100), the causal ones also with a decay (the step with one only) and over packed
    rows with and without one, with the ptxas triton ships, as bf16 inputs with head dims 64 (elu) and 128 (exp)
    would (`_blocks`' sizes)."""
    stdout = _compile_for(90, "all")
    assert stdout.count("compiled ") == 34
    assert stdout.count(" decay") == 14
    assert stdout.count(" packed") == 12


@pytest.mark.slow
def test_decayed_kernels_compile_for_an_a100_without_one():
    """The decayed variants of the causal kernels (also over packed rows) and of the step, compiled for sm_80 (A100) as
    for sm_90."""
    stdout = _compile_for(80, "decayed")
    assert stdout.count("compiled ") == stdout.count(" decay") == 14
    assert stdout.count(" packed") == 6


# ---------------------------------------------------------------------------------------------------------------
# packed rows (seq_idx)

# sequence lengths per row, chunks of 16: row 0 a boundary inside the first chunk (3 | 13), one on its edge (16), two
# sequences of one token, one longer than a chunk (18) that crosses an edge; row 1 one sequence of a chunk and one of 24
PACKED = [[3, 13, 1, 1, 18, 4], [16, 24]]


def _packed_seq_idx(layouts=PACKED):
    rows = [torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]) for lengths in layouts]
    return torch.stack(rows).to(DEVICE)


def _packed_inputs(feature_map, decay, seed):
    """Leaves q, k, v and the log-decay (None, fixed or gated), key padding and key dropout for rows laid out as
    PACKED; exp: the first sequence's keys 60 nats above the rest, the fourth's (one token) 200 nats above, a key of
    the last 100 above (steep chunks, each on the exact path across a boundary; the last also past the row's end)."""
    n = sum(PACKED[0])
    q, k, v = _qkv(n, seed=seed)
    if feature_map == "exp":
        k[0, :, :3] += 60.0
        k[0, :, 17] += 200.0
        k[0, :, 37] += 100.0
    logd = None if decay is None else _log_decay(n, decay, seed=seed + 1)
    key_mask = _key_mask("random", n, seed=seed + 2)
    drop = (torch.rand(B, H, n, generator=torch.Generator().manual_seed(seed + 3)) >= 0.2).to(DEVICE)
    leaves = _leaves(q, k, v) if logd is None else _leaves(q, k, v, logd)
    return leaves, key_mask, drop


@pytest.mark.parametrize("decay", [None, "fixed", "gated"], ids=["no_decay", "fixed", "gated"])
@pytest.mark.parametrize("feature_map", ["elu", pytest.param("exp", marks=pytest.mark.slow)])  # exp: interpreter-slow
def test_fused_packed_rows_match_float64_reference_with_gradients(feature_map, decay):
    """Packed rows with key padding and key dropout: the outputs and the gradients of q, k, v (and the decay) equal
    the float64 reference, where no query sees a key of another sequence; the final state (the last sequence's, exp's
    key maxima included) equals the PyTorch op's in float64. No overflow or NaN on the way (the interpreter's numpy
    would warn)."""
    leaves, key_mask, drop = _packed_inputs(feature_map, decay, seed=70)
    q, k, v = leaves[:3]
    logd = leaves[3] if decay else None
    seq_idx = _packed_seq_idx()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, state = fused_causal_linear_attention(
            q, k, v, key_mask, feature_map=feature_map, drop=drop, chunk_size=CHUNK, decay=logd, seq_idx=seq_idx
        )
        got = _grads([out], leaves)
    want = naive_packed_causal_linear_attention(q, k, v, seq_idx, key_mask, feature_map, logd, drop)
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(got, _grads([want], leaves), ["q", "k", "v", "decay"], atol=5e-5)
    fmap = FEATURE_TABLE[feature_map]
    ld = None if logd is None else linear_ops._log_decay(logd, key_mask).double()
    _, want_state = linear_torch._causal_linear_attention(
        q.double(), k.double(), v.double(), key_mask, fmap, 8, None, drop, ld, seq_idx=seq_idx
    )
    _assert_close(state.kv, want_state.kv, 1e-5, 1e-4, "kv")
    _assert_close(state.z, want_state.z, 1e-5, 1e-4, "z")
    if feature_map == "exp":
        _assert_close(state.k_max, want_state.k_max, 1e-5, 1e-5, "k_max")


@pytest.mark.slow  # the interpreter runs each sequence alone too; the reference test above keeps the fast tier's
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_packed_rows_give_each_sequence_what_it_gets_alone(feature_map):
    """A gated decay, no padding: each sequence's outputs and gradients (q, k, v, decay) as the kernels give them for
    it alone, and one sequence per row gives what seq_idx=None gives."""
    leaves, _, _ = _packed_inputs(feature_map, "gated", seed=75)
    q, k, v, logd = leaves
    opts = {"feature_map": feature_map, "chunk_size": CHUNK}
    packed, _ = fused_causal_linear_attention(q, k, v, decay=logd, seq_idx=_packed_seq_idx(), **opts)
    rows = []
    for row, lengths in enumerate(PACKED):
        bounds = torch.tensor([0, *lengths]).cumsum(0).tolist()
        pieces = []
        for start, stop in zip(bounds[:-1], bounds[1:]):
            cut = (slice(row, row + 1), slice(None), slice(start, stop))
            pieces.append(fused_causal_linear_attention(q[cut], k[cut], v[cut], decay=logd[cut], **opts)[0])
        rows.append(torch.cat(pieces, dim=2))
    alone = torch.cat(rows)
    _assert_close(packed, alone, 1e-5, 1e-5, "out")
    _assert_grads_close(_grads([packed], leaves), _grads([alone], leaves), ["q", "k", "v", "decay"], 1e-5, 1e-5)
    one = torch.zeros(B, q.shape[2], dtype=torch.int32, device=DEVICE)
    whole, _ = fused_causal_linear_attention(q, k, v, decay=logd, seq_idx=one, **opts)
    unpacked, _ = fused_causal_linear_attention(q, k, v, decay=logd, **opts)
    _assert_close(whole, unpacked, 1e-6, 1e-6, "one sequence")
    _assert_grads_close(_grads([whole], leaves), _grads([unpacked], leaves), "qkvd", 1e-6, 1e-6)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_packed_rows_through_the_kernel_equal_the_pytorch_path(monkeypatch, count_fused, feature_map):
    """`causal_linear_attention(..., seq_idx=)` with key padding, key dropout and a decay runs the fused kernels where
    they are forced (chunks of 64 and 32 past the row's end of 40), with the PyTorch path's outputs, final state and
    gradients. (A slow decay: the op's chunks of 64
    lose ~1e-4 of a strong gate's gradient in fp32, packed or not; the kernels' float64 tests cover gates.)"""
    leaves, key_mask, drop = _packed_inputs(feature_map, "fixed", seed=80)
    q, k, v, logd = leaves
    seq_idx = _packed_seq_idx()

    def run():
        with warnings.catch_warnings():  # no overflow, not even where the kernels' blocks pass the row's end
            warnings.simplefilter("error", RuntimeWarning)
            out, new = causal_linear_attention(
                q, k, v, key_mask, feature_map=feature_map, chunk_size=8, drop=drop, decay=logd, seq_idx=seq_idx
            )
            return (out, new.kv, new.z, *_grads([out, new.kv], leaves))

    pytorch, fused = _both_paths(monkeypatch, run)
    assert count_fused == [True]
    for name, a, b in zip(["out", "kv", "z", "dq", "dk", "dv", "ddecay"], fused, pytorch):
        _assert_close(a, b, 2e-5, 1e-4, name)


@pytest.mark.parametrize("n", [1, 2, 19])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_token_alone_reads_only_itself(feature_map, n):
    """Every token its own sequence (rows of one token too): each output is its value, whatever the decay; a masked
    token's query sees nothing (0); the returned state holds the last token alone."""
    q, k, v = _qkv(n, seed=85)
    key_mask = torch.ones(B, n, dtype=torch.bool, device=DEVICE)
    key_mask[:, n // 2] = False
    seq_idx = torch.arange(n, device=DEVICE)[None].expand(B, n)
    out, state = fused_causal_linear_attention(
        q, k, v, key_mask, feature_map=feature_map, chunk_size=CHUNK, decay=_log_decay(n, "gated"), seq_idx=seq_idx
    )
    _assert_close(out, v * key_mask[:, None, :, None], 1e-6, 1e-6, "out")
    if n > 1:
        last = (slice(None), slice(None), slice(n - 1, n))
        _, alone = fused_causal_linear_attention(q[last], k[last], v[last], key_mask[:, -1:], feature_map=feature_map)
        _assert_close(state.kv, alone.kv, 1e-6, 1e-6, "kv")


def test_fused_packed_rows_refuse_a_state():
    q, k, v = _qkv(4)
    state = LinearAttentionState(torch.zeros(B, H, D, E, device=DEVICE), torch.zeros(B, H, D, device=DEVICE))
    with pytest.raises(ValueError, match="`seq_idx` must have shape \\(2, 4\\) .* state=None"):
        fused_causal_linear_attention(q, k, v, None, state, seq_idx=torch.zeros(B, 4, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------------------------
# exp: keys far apart


@pytest.mark.parametrize("pattern", ["late_spike", "early_spike", "drift", "spikes"])
def test_fused_exp_is_exact_for_keys_tens_of_nats_apart(pattern):
    """Keys 30 nats apart (no chunk steep enough for the exact path): the kernel's running per-feature maxima and
    state rescaling give the float64 log-space outputs and gradients."""
    q, k, v = _leaves(*_keys_with(pattern, 30.0))
    result = fused_causal_linear_attention(q, k, v, None, feature_map="exp", chunk_size=CHUNK)
    assert result is not None
    out, state = result
    want = naive_linear_visible(q, k, v, torch.ones(64, 64, dtype=torch.bool, device=DEVICE).tril(), "exp")
    _assert_close(out, want, 1e-5, 1e-4, "out")
    assert torch.equal(state.k_max, k.detach().amax(dim=2))
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want], (q, k, v)), "qkv", atol=5e-5)


@pytest.mark.parametrize("pattern", ["late_spike", "early_spike", "drift", "spikes"])
def test_fused_exp_is_exact_for_keys_hundreds_of_nats_apart(pattern):
    """Keys 300 nats apart: a chunk's maximum rises past EXP_CHUNK_SPREAD above a query's own running maximum, and
    the kernels' exact path (each query with its own running maximum, forward and backward) gives the float64
    log-space outputs and gradients, with the key padding of row 0."""
    q, k, v = _leaves(*_keys_with(pattern, 300.0))
    key_mask = _key_mask("left", 64)
    out, _ = fused_causal_linear_attention(q, k, v, key_mask, feature_map="exp", chunk_size=CHUNK)
    allowed = torch.ones(64, 64, dtype=torch.bool, device=DEVICE).tril() & key_mask[:, None, None, :]
    want = naive_linear_visible(q, k, v, allowed, "exp")
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want], (q, k, v)), "qkv", atol=5e-5)


def test_fused_exp_exact_path_with_a_carried_state_and_dropped_keys():
    """Chunked prefill (21 tokens, then 43 from their state) with key dropout, keys 17 and 40 200 nats up: query 16
    (the first of its chunk) has its own key dropped but reads keys 0-15, so the steepness check counts it (queries
    that are used, not keys that are kept); the exact path reads the carried state in its own reference. Outputs and
    gradients, through the state too, equal the float64 ones."""
    q, k, v = _qkv(64, seed=11)
    k[:, :, 17, 0] += 200.0
    k[:, :, 40, 1] += 200.0
    q, k, v = _leaves(q, k, v)
    drop = torch.ones(B, H, 64, dtype=torch.bool, device=DEVICE)
    drop[:, :, 16] = False
    drop[1, 0, 30:33] = False
    first, state = fused_causal_linear_attention(
        q[:, :, :21], k[:, :, :21], v[:, :, :21], None, feature_map="exp", drop=drop[..., :21], chunk_size=CHUNK
    )
    rest, _ = fused_causal_linear_attention(
        q[:, :, 21:], k[:, :, 21:], v[:, :, 21:], None, state, feature_map="exp", drop=drop[..., 21:], chunk_size=CHUNK
    )
    out = torch.cat([first, rest], dim=2)
    allowed = torch.ones(64, 64, dtype=torch.bool, device=DEVICE).tril() & drop[:, :, None, :]
    want = naive_linear_visible(q, k, v, allowed, "exp")
    _assert_close(out, want, 1e-5, 1e-4, "out")
    _assert_grads_close(_grads([out], (q, k, v)), _grads([want], (q, k, v)), "qkv", atol=5e-5)


@pytest.mark.parametrize("span", [30.0, 150.0])
def test_fused_exp_outputs_do_not_change_when_tokens_are_appended(monkeypatch, count_fused, span):
    """No output depends on a later key, numerically either: the first 40 outputs are the same when 24 tokens follow,
    one of them `span` nats above the rest in the same chunk (30: the chunked form; 150: the kernels' exact path)."""
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    q, k, v = _qkv(64, seed=7)
    k[:, :, 45, 1] += span
    prefix, _ = causal_linear_attention(q[:, :, :40], k[:, :, :40], v[:, :, :40], None, feature_map="exp")
    whole, _ = causal_linear_attention(q, k, v, None, feature_map="exp")
    _assert_close(whole[:, :, :40], prefix, 1e-6, 1e-5, "prefix")
    assert count_fused == [True, True]


# ---------------------------------------------------------------------------------------------------------------
# dispatch


def test_fused_kernel_is_chosen_by_device_and_environment(monkeypatch):
    """CUDA tensors in bf16 or fp16 (CPU tensors and fp32 too with HFST_FORCE_TRITON=1), the elu or exp map, head
    dims <= 128; never with HFST_DISABLE_TRITON=1."""
    q = torch.zeros(1, 1, 4, 8, device=DEVICE, dtype=torch.bfloat16)
    assert fused_causal_linear_attention_available(q) == (DEVICE == "cuda")
    assert fused_causal_linear_attention_available(q.half(), "exp") == (DEVICE == "cuda")
    assert not fused_causal_linear_attention_available(q.float())  # fp32: cuBLAS, unless forced
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    assert fused_causal_linear_attention_available(q)
    assert fused_causal_linear_attention_available(q.float(), "exp")
    assert not fused_causal_linear_attention_available(q, "softmax")
    assert not fused_causal_linear_attention_available(q.double())
    assert not fused_causal_linear_attention_available(torch.zeros(1, 1, 4, 129, device=DEVICE))
    assert not fused_linear_attention_available(q, "elu", torch.zeros(1, 1, 4, 129, device=DEVICE))  # value dim
    monkeypatch.setenv("HFST_DISABLE_TRITON", "1")
    assert not fused_causal_linear_attention_available(q)
    assert not fused_linear_attention_available(q)


def _count_calls(monkeypatch, name):
    """The calls of `linear_ops.<name>` (the `linear_library` custom op an entry point goes through): True for each
    that was told to use the fused kernels (its `fused` argument, the last) and launched a Triton kernel."""
    calls, launches, op, run = [], [], getattr(linear_ops, name), linear_triton._run

    def launch(*args, **kwargs):
        launches.append(True)
        return run(*args, **kwargs)

    def counted(*args, **kwargs):
        before = len(launches)
        result = op(*args, **kwargs)
        calls.append(bool(args[-1]) and len(launches) > before)
        return result

    monkeypatch.setattr(linear_triton, "_run", launch)
    monkeypatch.setattr(linear_ops, name, counted)
    return calls


@pytest.fixture
def count_fused(monkeypatch):
    """The calls of the fused causal kernels from `causal_linear_attention`."""
    return _count_calls(monkeypatch, "causal_op")


@pytest.fixture
def count_fused_noncausal(monkeypatch):
    """The calls of the fused non-causal kernels from `linear_attention`."""
    return _count_calls(monkeypatch, "noncausal_op")


def _both_paths(monkeypatch, run):
    """run() with the PyTorch kernels, then with the fused ones forced."""
    results = []
    for force in ["0", "1"]:
        monkeypatch.setenv("HFST_FORCE_TRITON", force)
        monkeypatch.setenv("HFST_DISABLE_TRITON", "0" if force == "1" else "1")
        results.append(run())
    return results


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_causal_linear_attention_through_the_kernel_equals_the_pytorch_path(monkeypatch, count_fused, feature_map):
    """`causal_linear_attention` with key padding, key dropout and a carried state: the same outputs, state and
    gradients whichever implementation runs."""
    n = 37
    q, k, v = _leaves(*_qkv(n, seed=12))
    key_mask = _key_mask("random", n)
    drop = (torch.rand(B, H, n, generator=torch.Generator().manual_seed(13)) >= 0.2).to(DEVICE)
    k_max = torch.randn(B, H, D, device=DEVICE) if feature_map == "exp" else None
    state = LinearAttentionState(torch.rand(B, H, D, E, device=DEVICE), torch.rand(B, H, D, device=DEVICE) + 1, k_max)

    def run():
        out, new = causal_linear_attention(q, k, v, key_mask, state, feature_map=feature_map, chunk_size=8, drop=drop)
        return (out, new.kv, new.z, *_grads([out, new.kv], (q, k, v)))

    pytorch, fused = _both_paths(monkeypatch, run)
    assert count_fused == [True]
    for name, a, b in zip(["out", "kv", "z", "dq", "dk", "dv"], fused, pytorch):
        _assert_close(a, b, 2e-5, 1e-4, name)


@pytest.mark.parametrize("prefix_length", [0, 9])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_prefix_causal_linear_attention_through_the_kernel_equals_the_pytorch_path(
    monkeypatch, count_fused, feature_map, prefix_length
):
    """`prefix_causal_linear_attention` (leading keys every query sees, a bidirectional prefix, then causal) with key
    padding, key dropout and a carried state: its causal part runs in the fused kernels from the prefix's state; the
    same outputs, final state and gradients (of q, k, v and the carried state) as the PyTorch path."""
    n, lead = 29, 5
    q, _, _ = _qkv(n, seed=30)
    _, k, v = _qkv(n + lead, seed=31)
    q, k, v = _leaves(q, k, v)
    key_mask = _key_mask("random", n + lead)
    drop = (torch.rand(B, H, n + lead, generator=torch.Generator().manual_seed(32)) >= 0.2).to(DEVICE)
    k_max = torch.randn(B, H, D, device=DEVICE) if feature_map == "exp" else None
    kv0, z0 = _leaves(torch.rand(B, H, D, E, device=DEVICE), torch.rand(B, H, D, device=DEVICE) + 1)
    state = LinearAttentionState(kv0, z0, k_max)

    def run():
        out, new = linear_ops.prefix_causal_linear_attention(
            q, k, v, key_mask, state, feature_map=feature_map, prefix_length=prefix_length, drop=drop
        )
        return (out, new.kv, new.z, *_grads([out, new.kv], (q, k, v, kv0, z0)))

    pytorch, fused = _both_paths(monkeypatch, run)
    assert count_fused == [True]
    for name, a, b in zip(["out", "kv", "z", "dq", "dk", "dv", "dkv0", "dz0"], fused, pytorch):
        _assert_close(a, b, 2e-5, 1e-4, name)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_decayed_ops_through_the_kernel_equal_the_pytorch_path(monkeypatch, count_fused, feature_map):
    """`causal_linear_attention` and `prefix_causal_linear_attention` (leading keys, a bidirectional prefix) with a
    decay, key padding, key dropout and a carried state: the fused kernels run (`fused_decay_available`), with the same
    outputs, final state (exp: its decayed reference) and gradients (q, k, v, decay, the carried state) as PyTorch."""
    assert fused_decay_available(feature_map) and not fused_decay_available("relu")
    n, lead = 29, 5
    q, _, _ = _qkv(n, seed=33)
    _, k, v = _qkv(n + lead, seed=34)
    logd = _log_decay(n + lead, "gated", seed=35)
    q, k, v, logd = _leaves(q, k, v, logd)
    key_mask = _key_mask("random", n + lead)
    drop = (torch.rand(B, H, n + lead, generator=torch.Generator().manual_seed(36)) >= 0.2).to(DEVICE)
    k_max = torch.randn(B, H, D, device=DEVICE) if feature_map == "exp" else None
    kv0, z0 = _leaves(torch.rand(B, H, D, E, device=DEVICE), torch.rand(B, H, D, device=DEVICE) + 1)
    state = LinearAttentionState(kv0, z0, k_max)

    def run():
        out, new = causal_linear_attention(
            q, k[:, :, lead:], v[:, :, lead:], key_mask[:, lead:], state, feature_map=feature_map, chunk_size=8,
            drop=drop[..., lead:], decay=logd[..., lead:],
        )  # fmt: skip
        pre, pre_new = linear_ops.prefix_causal_linear_attention(
            q, k, v, key_mask, state, feature_map=feature_map, prefix_length=9, drop=drop, decay=logd
        )
        states = [new.kv, new.z, pre_new.kv, pre_new.z] + ([] if k_max is None else [new.k_max, pre_new.k_max])
        return (out, pre, *states, *_grads([out, new.kv, pre, pre_new.z], (q, k, v, logd, kv0, z0)))

    pytorch, fused = _both_paths(monkeypatch, run)
    assert count_fused == [True, True]
    names = ["out", "prefix_out", "kv", "z", "prefix_kv", "prefix_z"] + ([] if k_max is None else ["k_max", "k_max_"])
    for name, a, b in zip(names + ["dq", "dk", "dv", "ddecay", "dkv0", "dz0"], fused, pytorch):
        _assert_close(a, b, 2e-5, 1e-4, name)


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train_key_dropout"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_decoder_gives_the_same_logits_and_gradients_with_the_kernel(monkeypatch, count_fused, feature_map, training):
    """A tiny linear decoder, forward and backward on a padded batch, with and without the fused kernels (in training
    mode with key dropout, drawn the same way by both): same logits, same parameter gradients."""
    model = decoder("linear", feature_map, attention_probs_dropout_prob=0.1 if training else 0.0).to(DEVICE)
    attention_mask = torch.ones(2, 7, dtype=torch.long, device=DEVICE)
    attention_mask[0, :2] = 0  # left padding
    _assert_same_step_with_the_kernel(monkeypatch, model.train(training), attention_mask)
    assert count_fused == [True] * model.config.num_hidden_layers


def _assert_same_step_with_the_kernel(monkeypatch, model, attention_mask):
    """One forward and backward of `model` (an LM head: labels = inputs) on a padded batch, with the PyTorch kernels
    and with the fused ones (key dropout drawn the same way by both): same logits, same parameter gradients."""
    input_ids = batch_of_tokens(*attention_mask.shape).to(DEVICE)

    def run():
        model.zero_grad()
        torch.manual_seed(0)
        output = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
        output.loss.backward()
        scores = output.loss if output.logits is None else output.logits  # a training head returns only its loss
        return scores, {name: p.grad for name, p in model.named_parameters()}  # None: unused

    pytorch, fused = _both_paths(monkeypatch, run)
    _assert_close(fused[0], pytorch[0], 1e-5, 1e-4, "logits")
    assert any(grad is not None for grad in fused[1].values())
    for name, grad in fused[1].items():
        assert (grad is None) == (pytorch[1][name] is None), name
        if grad is not None:
            _assert_close(grad, pytorch[1][name], 1e-5, 1e-4, name)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_through_the_kernel_equals_the_pytorch_path(monkeypatch, count_fused_noncausal, feature_map):
    """`linear_attention` with per-head kept keys: the same outputs and gradients whichever implementation runs; no
    query (n = 0) stays with the PyTorch op, inline."""
    q, k, v = _leaves(*_noncausal_inputs(19, 37, seed=24))
    kept = _noncausal_mask("dropout", 37)  # (b, h, m): key dropout's kept keys and the padding
    padding = kept.any(dim=1)  # (b, m): the keys some head keeps, as the real ones

    def run():
        out, _ = linear_attention(q, k, v, padding, feature_map=feature_map, drop=kept)
        return (out, *_grads([out], (q, k, v)))

    pytorch, fused = _both_paths(monkeypatch, run)
    assert count_fused_noncausal == [True]
    for name, a, b in zip(["out", "dq", "dk", "dv"], fused, pytorch):
        _assert_close(a, b, 2e-5, 1e-4, name)
    assert linear_attention(q[:, :, :0], k, v, None, feature_map=feature_map)[0].shape == (B, H, 0, E)
    assert count_fused_noncausal == [True]


@pytest.mark.slow
@pytest.mark.parametrize(("feature_map", "training"), [("elu", False), ("exp", True)], ids=["elu-eval", "exp-train"])
def test_encoder_gives_the_same_logits_and_gradients_with_the_kernel(
    monkeypatch, count_fused_noncausal, feature_map, training
):
    """A tiny linear encoder (masked LM), forward and backward on a padded batch, with and without the fused
    non-causal kernels (in training mode with key dropout, drawn the same way by both): same logits and gradients.
    (Two of the four cases: the decoder's test covers the rest of the model path.)"""
    config = tiny_config("encoder", "linear", feature_map, attention_probs_dropout_prob=0.1 if training else 0.0)
    model = make_model(hfst.TransformerEncoderForMaskedLM, config).to(DEVICE)
    attention_mask = torch.ones(2, 7, dtype=torch.long, device=DEVICE)
    attention_mask[0, 5:] = 0  # right padding
    _assert_same_step_with_the_kernel(monkeypatch, model.train(training), attention_mask)
    assert count_fused_noncausal == [True] * config.num_hidden_layers


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "perceiver_io"])
def test_next_token_head_gives_the_same_logits_and_gradients_with_the_kernel(monkeypatch, count_fused, family):
    """A tiny linear next-token head (many targets: a bidirectional prefix, then causal targets; Perceiver IO's
    causal cross-attention adds leading keys), exp map with key dropout, forward and backward on a padded batch: its
    prefix attention runs the fused causal kernels from the prefix's state, with the same logits and gradients."""
    config = tiny_config(family, "linear", "exp", attention_probs_dropout_prob=0.1, target_length=3)
    cls = (
        hfst.TransformerEncoderForNextTokenPrediction if family == "encoder" else hfst.PerceiverIOForNextTokenPrediction
    )
    model = make_model(cls, config).to(DEVICE)
    attention_mask = torch.ones(2, 7, dtype=torch.long, device=DEVICE)
    attention_mask[0, :2] = 0  # left padding
    _assert_same_step_with_the_kernel(monkeypatch, model.train(), attention_mask)
    assert count_fused and all(count_fused)


@pytest.fixture
def count_fused_step(monkeypatch):
    """The calls of the fused step kernel from `linear_attention_step`."""
    return _count_calls(monkeypatch, "step_op")


@pytest.mark.parametrize("decay", [None, "gated"], ids=["no_decay", "decay"])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("start", ["no_state", "state"])
def test_fused_step_equals_the_pytorch_step(feature_map, start, decay):
    """One generation step in the fused kernel: output and new state equal to the PyTorch step's, from no state or a
    carried state, with or without the token's decay (the masked row's does not apply); with a masked row and
    per-head dropped keys."""
    from hf_settransformer.linear_torch import _decayed_state, _linear_attention_step, with_dropped

    q, k, v = _qkv(1, seed=40, e=70)  # two value blocks of 64
    k = k * 3
    g = torch.Generator().manual_seed(41)
    state = None
    if start != "no_state":
        k_max = torch.randn(B, H, D, generator=g).to(DEVICE) if feature_map == "exp" else None
        state = LinearAttentionState(
            torch.rand(B, H, D, 70, generator=g).to(DEVICE), torch.rand(B, H, D).to(DEVICE) + 1, k_max
        )
    mask = torch.tensor([[True], [False]], device=DEVICE)  # row 1's key is padding
    drop = torch.tensor([[[True], [False]], [[True], [True]]], device=DEVICE)  # head 1 of row 0 drops its key
    with pytest.raises(ValueError, match="takes one token"):
        fused_linear_attention_step(*_qkv(2), feature_map=feature_map)
    logd = None if decay is None else _log_decay(1, decay, seed=43)
    out, new = fused_linear_attention_step(q, k, v, mask, state, feature_map=feature_map, drop=drop, decay=logd)
    fmap = FEATURE_TABLE[feature_map]
    decayed = _decayed_state(state, None if logd is None else linear_ops._log_decay(logd, mask)[..., 0], fmap)
    want, want_new = _linear_attention_step(q, k, v, decayed, with_dropped(mask, drop), fmap)
    _assert_close(out, want, 1e-6, 1e-5, "out")
    for name in ["kv", "z", "k_max"]:
        got, expected = getattr(new, name), getattr(want_new, name)
        assert (got is None) == (expected is None), name
        if got is not None:
            _assert_close(got, expected, 1e-6, 1e-5, name)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_fused_steps_continue_a_prefill_as_the_one_pass_forward(monkeypatch, count_fused_step, feature_map):
    """Token-by-token fused steps after a prefill give the one-pass causal outputs (keys 300 nats apart for exp); a
    step whose inputs need gradients takes the PyTorch path."""
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    n = 20
    q, k, v = _qkv(n, seed=42)
    if feature_map == "exp":
        k[:, :, 12, 0] += 300.0
    whole, _ = causal_linear_attention(q, k, v, feature_map=feature_map)
    _, state = causal_linear_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], feature_map=feature_map)
    steps = []
    with torch.no_grad():
        for t in range(8, n):
            sl = slice(t, t + 1)
            o, state = linear_ops.linear_attention_step(
                q[:, :, sl], k[:, :, sl], v[:, :, sl], None, state, feature_map=feature_map
            )
            steps.append(o)
    assert count_fused_step == [True] * (n - 8)
    _assert_close(torch.cat(steps, dim=2), whole[:, :, 8:], 1e-5, 1e-4, "steps")
    qq = q[:, :, :1].clone().requires_grad_()
    linear_ops.linear_attention_step(qq, k[:, :, :1], v[:, :, :1], None, state, feature_map=feature_map)
    assert len(count_fused_step) == n - 8


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_decayed_states_continue_across_implementations(monkeypatch, feature_map):
    """With a strong gate: a prefill's state from the fused kernels continued by PyTorch steps, and the PyTorch
    prefill's state continued by fused steps, both give the one-pass float64 outputs (exp: keys 300 nats apart): the
    kernels' state, exp's decayed reference included, is the PyTorch op's."""
    n, split = 20, 9
    q, k, v = _qkv(n, seed=44)
    if feature_map == "exp":
        k[:, :, 12, 0] += 300.0
    logd = _log_decay(n, "gated", seed=45)
    whole = naive_decayed_linear_attention(q, k, v, logd, None, feature_map)
    prefill = {}
    for force in ["1", "0"]:
        monkeypatch.setenv("HFST_FORCE_TRITON", force)
        monkeypatch.setenv("HFST_DISABLE_TRITON", "0" if force == "1" else "1")
        args = (q[:, :, :split], k[:, :, :split], v[:, :, :split])
        prefill[force] = causal_linear_attention(*args, feature_map=feature_map, decay=logd[..., :split])[1]
    for prefilled, step_force in [("1", "0"), ("0", "1")]:
        monkeypatch.setenv("HFST_FORCE_TRITON", step_force)
        monkeypatch.setenv("HFST_DISABLE_TRITON", "0" if step_force == "1" else "1")
        state, steps = prefill[prefilled], []
        for t in range(split, n):
            sl = slice(t, t + 1)
            o, state = linear_ops.linear_attention_step(
                q[:, :, sl], k[:, :, sl], v[:, :, sl], None, state, feature_map=feature_map, decay=logd[..., sl]
            )
            steps.append(o)
        _assert_close(torch.cat(steps, dim=2), whole[:, :, split:], 1e-5, 1e-4, f"steps after prefill {prefilled}")


@pytest.mark.slow
@pytest.mark.parametrize(("feature_map", "decay"), [("elu", "fixed"), ("exp", "gated")])
def test_decayed_decoder_trains_and_generates_the_same_with_the_kernels(
    monkeypatch, count_fused, count_fused_step, feature_map, decay
):
    """A tiny linear decoder with `linear_attention_decay`: a training step (key dropout) gives the same logits and
    gradients (the gate's too) with the fused causal kernels, and cached greedy generation the same tokens and scores
    with the fused prefill and steps."""
    model = decoder("linear", feature_map, linear_attention_decay=decay, attention_probs_dropout_prob=0.1).to(DEVICE)
    attention_mask = torch.ones(2, 7, dtype=torch.long, device=DEVICE)
    attention_mask[0, :2] = 0  # left padding
    _assert_same_step_with_the_kernel(monkeypatch, model.train(), attention_mask)
    assert count_fused == [True] * model.config.num_hidden_layers
    _assert_same_generation_with_the_kernels(monkeypatch, model.eval(), attention_mask[:, :5], count_fused_step)


def _assert_same_generation_with_the_kernels(monkeypatch, model, attention_mask, count_fused_step):
    """Cached greedy generation (4 tokens after 5): the same tokens and scores with the fused kernels (prefill and
    steps) as with the PyTorch ops, and the steps ran in the fused kernel."""
    input_ids = batch_of_tokens(2, 5).to(DEVICE)

    def run():
        out = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False, output_scores=True,
            return_dict_in_generate=True, pad_token_id=0,
        )  # fmt: skip
        return out.sequences, torch.stack(out.scores)

    pytorch, fused = _both_paths(monkeypatch, run)
    assert torch.equal(fused[0], pytorch[0])
    _assert_close(fused[1], pytorch[1], 1e-5, 1e-4, "scores")
    assert count_fused_step and all(count_fused_step)


@pytest.mark.slow
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_decoder_generates_the_same_with_the_fused_step(monkeypatch, count_fused_step, feature_map):
    """A tiny linear decoder's cached greedy generation, left-padded: the same tokens and scores with the fused
    kernels (prefill and steps) as with the PyTorch ops, and the steps ran in the fused kernel."""
    model = decoder("linear", feature_map).to(DEVICE)
    attention_mask = torch.ones(2, 5, dtype=torch.long, device=DEVICE)
    attention_mask[0, :2] = 0
    _assert_same_generation_with_the_kernels(monkeypatch, model, attention_mask, count_fused_step)

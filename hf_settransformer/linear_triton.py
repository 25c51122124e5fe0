"""Fused Triton kernels for linear attention with the feature maps they have code for (`KERNEL_IDS`: elu, exp): causal
(`_FusedCausal`) and non-causal (`_FusedNonCausal`), forward and backward, and the one-token step of generation; the
causal kernels and the step also with the causal ops' decay (`fused_decay_available`), the causal kernels also over
packed rows (`seq_idx`, `fused_sequences_available`). They compute what the PyTorch ops of `linear_ops.py` compute,
which `linear_naive.py`'s float64 references check in tests.

Shape legend: b batch, h heads, n tokens (queries), m keys, d query/key head dim, e value head dim, c chunk length
(`BT`). Inputs are read in their own dtype (bf16/fp16 as autocast gives them, fp32 in the tests) and strides; feature
maps, states and normalisers are fp32; dot products take bf16 operands for bf16 inputs, fp32 ones otherwise (tf32
for fp16: a long sequence's state overflows fp16's range), accumulating in fp32. Backwards recompute from the inputs.
Block sizes and warps (`_blocks`) come from the register use of the kernels compiled for an H100, not from timings.

Which implementation runs is decided once per call (`linear_ops.use_triton`) by `fused_linear_attention_available`:
bf16/fp16 CUDA tensors, triton installed and `HFST_DISABLE_TRITON` unset, eager or compiled (a compiled graph holds
the `linear_library` custom ops, whose bodies call `causal_forward`, `causal_backward`, `noncausal_forward`,
`noncausal_backward` and `fused_linear_attention_step`); `HFST_FORCE_TRITON=1` also sends fp32 and CPU tensors here,
where triton's interpreter runs the kernels (what the tests do). Nothing about it is saved in a checkpoint.
"""

from __future__ import annotations  # the kernels' `tl.constexpr` annotations are read by triton, not evaluated

import contextlib
import importlib.util
import os

import torch

from .cache import LinearAttentionState
from .feature_maps import FEATURE_MAPS, get_feature_map

__all__ = [
    "fused_causal_linear_attention",
    "fused_causal_linear_attention_available",
    "fused_decay_available",
    "fused_linear_attention",
    "fused_linear_attention_available",
    "fused_linear_attention_step",
]

# the `FeatureMap.triton_id`s the kernels have code for: an elementwise map's in `_phi` and `_phi_slope`, the
# stabilised map's (exp) in the kernels' `EXP` branches. The linear ops compute any other feature map in PyTorch.
KERNEL_IDS = (0, 1)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_HEAD_DIM = 128
FLOOR = -1e30  # the exp map's key reference while every key so far is masked, as in linear_ops
triton = tl = None  # imported on first use, where a kernel may run
_TRITON_FOUND = importlib.util.find_spec("triton") is not None  # without importing it


def _import_triton():
    """Whether triton can be imported (it is optional: without it the PyTorch ops in linear_ops.py run everywhere)."""
    global triton, tl
    if triton is None:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            return False
        for name in _HELPERS:  # the kernels call them as triton functions
            globals()[name] = triton.jit(globals()[name])
    return True


def _require_triton(op):
    if not _import_triton():
        raise ImportError(f"{op} needs triton (`pip install triton`).")


def _flag(name):
    return os.environ.get(name, "") not in ("", "0")


def _kernel_map(feature_map):
    """The `FEATURE_MAPS` entry named `feature_map` where the kernels have code for it, else None."""
    fmap = FEATURE_MAPS.get(feature_map) if isinstance(feature_map, str) else None
    return fmap if fmap is not None and fmap.triton_id in KERNEL_IDS else None


def _kernel_map_of(op, feature_map):
    """The entry of a feature map the kernels have code for; a ValueError for any other name."""
    fmap = _kernel_map(feature_map)
    if fmap is None:
        get_feature_map(feature_map)  # an unknown name: the config's message
        raise ValueError(
            f"`{op}` has no Triton code for feature_map={feature_map!r} (`linear_triton.KERNEL_IDS`); the PyTorch ops "
            "of linear_ops.py compute it."
        )
    return fmap


def _map_flags(fmap):
    """The kernels' feature-map constexprs: `EXP` the stabilised (exp) path, `PHI` the elementwise map of `_phi`."""
    return {"EXP": fmap.stabilised, "PHI": fmap.triton_id}


def fused_linear_attention_available(q, feature_map="elu", v=None, dots=True):
    """Whether the linear ops run the fused kernels for queries `q` (and values `v`): a feature map they have code for
    (`KERNEL_IDS`), head dims of at most 128, bf16 or fp16 inputs (autocast's), `HFST_DISABLE_TRITON` unset, triton
    installed, and `q` on a CUDA device, eager or under torch.compile (through the `linear_library` ops). `dots=False` (the
    one-token step, which has no matrix product) also takes fp32 inputs. `HFST_FORCE_TRITON=1` also takes fp32 inputs,
    and CPU tensors, which triton's interpreter then runs (`TRITON_INTERPRET=1`: slow, for tests)."""
    if _kernel_map(feature_map) is None or q.dtype not in _DTYPES or q.shape[-1] > MAX_HEAD_DIM:
        return False
    if v is not None and v.shape[-1] > MAX_HEAD_DIM:
        return False
    forced = _flag("HFST_FORCE_TRITON")
    if _flag("HFST_DISABLE_TRITON") or not (q.is_cuda or q.device.type == "cpu" and forced):
        return False
    if q.dtype == torch.float32 and dots and not forced:  # fp32 dots in triton are slow FMA loops; cuBLAS is faster
        return False
    if torch.compiler.is_compiling():  # no import while dynamo traces (a graph break): the ops' bodies import it
        return _TRITON_FOUND
    return _import_triton()


fused_causal_linear_attention_available = fused_linear_attention_available  # its first name


def fused_causal_linear_attention(
    q, k, v, mask=None, state=None, *, feature_map="elu", drop=None, chunk_size=64, spread=40.0, decay=None,
    seq_idx=None,
):
    """Causal linear attention in Triton kernels; the arguments and results of
    `linear_ops.causal_linear_attention(q, k, v, mask, state, feature_map=, drop=, decay=)`:

    q, k (b,h,n,d), v (b,h,n,e), mask (b,n) bool, drop (b,h,n) bool (the keys key dropout keeps), state a
    `LinearAttentionState` or None -> (out (b,h,n,e) fp32, `LinearAttentionState` after the last token, fp32). A
    masked or dropped key is left out of every sum; a query that sees no key gives 0. Gradients flow to q, k, v, the
    decay and the carried state's kv and z. `chunk_size` (a power of 2, >= 16) only sets how the work is cut. `"exp"`
    computes a chunk whose key maximum rises more than `spread` nats above a real query's running maximum
    (`linear_ops.EXP_CHUNK_SPREAD`) on its exact path. `decay` (b,h,n): each position's log-decay log g <= 0, or None
    (masked positions do not decay: it is taken as 0 there); exp's returned `k_max` is then the decayed reference,
    as the PyTorch op's. `seq_idx` (b,n): a packed row's sequences (`linear_ops.causal_linear_attention`), with no
    `state`: the state, the decay and exp's key maxima restart at every boundary."""
    fmap = _kernel_map_of("fused_causal_linear_attention", feature_map)
    if not _import_triton():
        raise ImportError("fused_causal_linear_attention needs triton (`pip install triton`).")
    if seq_idx is not None and (state is not None or tuple(seq_idx.shape) != (q.shape[0], q.shape[2])):
        raise ValueError(
            f"`seq_idx` must have shape {(q.shape[0], q.shape[2])} (batch, tokens) and come with state=None (a packed "
            f"batch carries no cache); got shape {tuple(seq_idx.shape)} and a state of {type(state).__name__}."
        )
    exp = fmap.stabilised
    keep, real = causal_masks(mask, drop, fmap)
    kv0 = z0 = m0 = None
    if state is not None:
        kv0, z0 = state.kv.float(), state.z.float()
        m0 = state.k_max.float() if exp and state.k_max is not None else None
    logd = _decay_arg(decay, mask, q.shape[:3])
    args = (q, k.to(q.dtype), v.to(q.dtype), keep, real, kv0, z0, m0, logd)
    out, kv, z, k_max = _FusedCausal.apply(*args, fmap, chunk_size, spread, seq_idx)
    return out, LinearAttentionState(kv=kv, z=z, k_max=k_max if exp else None)


def causal_masks(mask, drop, fmap):
    """The causal kernels' masks from the key mask (b, n) and key dropout's kept keys (b, h, n), either None: `keep`,
    the keys every sum uses, (b, h, n) or (b, 1, n) (one for every head); `real`, the queries exp's steepness check
    counts, (b, 1, n) or None."""
    if drop is not None:
        keep = drop if mask is None else drop & mask[:, None, :]  # (b, h, n)
    else:
        keep = None if mask is None else mask[:, None, :]  # (b, 1, n): every head
    real = mask[:, None, :] if fmap.stabilised and mask is not None else None
    return keep, real


def fused_decay_available(feature_map):
    """Whether the fused causal kernels and step take a decay for `feature_map`: every map they have code for."""
    return _kernel_map(feature_map) is not None


def fused_sequences_available():
    """Whether the fused causal kernels take a packed row's sequence ids (`seq_idx`): they do."""
    return True


def _sequence_arg(seq_idx):
    """The kernels' packed-row ids from `seq_idx` (b, n): int32 (b, n) contiguous, counted from 0 in each row, a new
    one wherever seq_idx changes (non-decreasing, as the kernels' boundary tests need); or None."""
    if seq_idx is None:
        return None
    change = (seq_idx[:, 1:] != seq_idx[:, :-1]).to(torch.int32)
    return torch.cat([change.new_zeros(change.shape[0], 1), change.cumsum(dim=1, dtype=torch.int32)], dim=1)


def _decay_arg(decay, mask, shape):
    """The kernels' log-decay: fp32 (b, h, n) contiguous, 0 at masked positions (padding is not time); or None."""
    if decay is None:
        return None
    if tuple(decay.shape) != tuple(shape):
        raise ValueError(f"`decay` must have shape {tuple(shape)} (batch, heads, tokens); got {tuple(decay.shape)}.")
    decay = decay.float()
    return (decay if mask is None else decay.masked_fill(~mask[:, None, :], 0.0)).contiguous()


def fused_linear_attention(
    q, k, v, mask=None, state=None, *, feature_map="elu", drop=None, chunk_size=64, split=None
):
    """Non-causal linear attention in Triton kernels; the arguments and results of
    `linear_ops.linear_attention(q, k, v, mask, state, feature_map=, drop=)`:

    q (b,h,n,d), k (b,h,m,d), v (b,h,m,e), mask (b,m) bool, or (b,h,m) (per head: key dropout's kept keys, with the
    padding), drop (b,h,m) bool -> (out (b,h,n,e) fp32, None); a masked key is left out of every sum, and where no
    key is left the output is 0. `state` must be None (non-causal attention carries none). `"exp"` is Shen et al.'s
    efficient attention (a softmax over the keys per feature). Gradients flow to q, k, v. `chunk_size` (a power of 2,
    >= 16) and `split` (the tokens one program sums over; None: from the length) only set how the work is cut.
    The output is None where there is no query or no key (the PyTorch op handles those)."""
    fmap = _kernel_map_of("fused_linear_attention", feature_map)
    if state is not None:
        raise ValueError("`fused_linear_attention` is non-causal and carries no state: pass state=None.")
    if not _import_triton():
        raise ImportError("fused_linear_attention needs triton (`pip install triton`).")
    if not q.shape[2] or not k.shape[2]:
        return None, None
    keep = None if mask is None else mask[:, None, :] if mask.dim() == 2 else mask  # (b, 1 or h, m)
    if drop is not None:
        keep = drop if keep is None else drop & keep
    out = _FusedNonCausal.apply(q, k.to(q.dtype), v.to(q.dtype), keep, fmap, chunk_size, split)
    return out, None


def fused_linear_attention_step(q, k, v, mask=None, state=None, *, feature_map="elu", drop=None, decay=None):
    """One causal step of generation in one Triton kernel; the arguments and results of
    `linear_ops.linear_attention_step(q, k, v, mask, state, feature_map=, drop=, decay=)`:

    q, k (b,h,1,d), v (b,h,1,e), mask (b,1) bool, drop (b,h,1) bool, state a `LinearAttentionState` or None, decay
    (b,h,1) the token's log-decay or None -> (out (b,h,1,e) fp32, the state after this token, fp32). One program per
    (batch, head, value block of 64) reads the token and the state, decays the state (exp: lowers its reference by
    log g), updates it (exp: rescaled to the new per-feature key maxima) and writes the output and the new state: one
    launch where the PyTorch step makes about a dozen. No autograd: for generation (the PyTorch step serves a step
    whose inputs need gradients)."""
    fmap = _kernel_map_of("fused_linear_attention_step", feature_map)
    if not _import_triton():
        raise ImportError("fused_linear_attention_step needs triton (`pip install triton`).")
    if q.shape[2] != 1 or k.shape[2] != 1 or v.shape[2] != 1:
        raise ValueError(f"`fused_linear_attention_step` takes one token; got q {tuple(q.shape)}, k {tuple(k.shape)}.")
    b, h, _, d = q.shape
    e = v.shape[-1]
    exp = fmap.stabilised
    keep = None if mask is None else mask[:, None, :]  # (b, 1, 1)
    if drop is not None:
        keep = drop if keep is None else drop & keep
    f32 = {"device": q.device, "dtype": torch.float32}
    out, kv1, z1 = torch.empty(b, h, 1, e, **f32), torch.empty(b, h, d, e, **f32), torch.empty(b, h, d, **f32)
    m1 = torch.empty(b, h, d, **f32) if exp else z1
    kv0 = z0 = m0 = None
    if state is not None:
        kv0, z0 = state.kv.float().contiguous(), state.z.float().contiguous()
        m0 = state.k_max.float().contiguous() if exp and state.k_max is not None else None
    keep, s_mb, s_mh, _ = _mask_args(keep, q)
    logd = _decay_arg(decay, mask, (b, h, 1))
    be = min(64, max(16, triton.next_power_of_2(e)))
    _run(
        _step_kernel, (b * h, triton.cdiv(e, be)),
        q, k, v, keep, kv0 if kv0 is not None else kv1, z0 if z0 is not None else z1, m0 if m0 is not None else m1,
        logd if logd is not None else z1,
        out, kv1, z1, m1, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), s_mb, s_mh,
        h, d, e, **_map_flags(fmap), HAS_KEEP=keep is not q, HAS_STATE=kv0 is not None, HAS_MAX=m0 is not None,
        HAS_DECAY=logd is not None, BK=max(16, triton.next_power_of_2(d)), BE=be,
    )  # fmt: skip
    return out, LinearAttentionState(kv=kv1, z=z1, k_max=m1 if exp else None)


def _inner_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _run(kernel, grid, *args, **kwargs):
    """Launch `kernel` on the device of its first argument: compiled by triton, or run by triton's interpreter on CPU
    tensors (where TRITON_INTERPRET=1 was set before triton was first imported)."""
    if kernel not in _JITTED:
        _JITTED[kernel] = triton.jit(kernel)
    device = args[0].device
    if device.type == "cpu" and isinstance(_JITTED[kernel], triton.runtime.jit.JITFunction):  # compiled: GPU only
        raise RuntimeError(
            "The fused linear-attention kernel runs on CPU tensors only in triton's interpreter: set "
            "TRITON_INTERPRET=1 before triton is first imported."
        )
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():  # triton's current device
        _JITTED[kernel][grid](*args, **kwargs)


_JITTED = {}


def _blocks(q, v, chunk_size, backward):
    """Block sizes (powers of 2, >= 16 as tl.dot needs), warps, and the dot operands' dtype and precision.

    Chosen so that the kernels compiled for an H100 (sm_90, ptxas) spill no or few registers at head dims 64: the
    forward in chunks of 64 over value blocks of 64, the backward (which holds a d x e state and more tiles) in chunks
    of 32; half that at head dims 128 (the backward's 128 x 128 reverse state still spills some). Not timed on a GPU.
    The backward's chunks nest in the forward's; it decides exp's exact path for its own chunks (either path is exact
    where it is taken)."""
    d, e = q.shape[-1], v.shape[-1]
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"The fused kernel's chunk_size must be a power of 2 of at least 16, got {chunk_size}.")
    bk, be = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(e))
    wide = max(bk, be) > 64
    bt = min(chunk_size, (16 if wide else 32) if backward else (32 if wide else 64))
    if q.dtype == torch.bfloat16:
        # bf16 operands (`precision` applies to fp32 ones only). Triton's interpreter (CPU tensors) multiplies bf16
        # operands wrongly (their raw bits), so there they are rounded to bf16 and multiplied in fp32: the same numbers
        rd, dt, precision = tl.bfloat16, tl.float32 if q.device.type == "cpu" else tl.bfloat16, "tf32"
    else:  # fp32 inputs: fp32 dots, tf32 where torch's matmuls may use it; fp16: tf32 (fp16 overflows on the state)
        exact = q.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"
        rd, dt, precision = tl.float32, tl.float32, "ieee" if exact else "tf32"
    return {
        "BT": bt, "BK": bk, "BE": be if backward else min(be, 64), "RD": rd, "DT": dt, "PRECISION": precision,
        "num_warps": 8 if max(bk, be) > 32 else 4, "num_stages": 2,
    }  # fmt: skip


def _mask_args(mask, q):
    """A (b, 1 or h, n) bool mask as uint8 and its (b, h, n) strides (head stride 0 for one mask for every head); a
    dummy pointer and zeros for None."""
    if mask is None:
        return q, 0, 0, 0
    mask = mask.view(torch.uint8) if mask.dtype == torch.bool else mask.to(torch.uint8)
    return mask, mask.stride(0), mask.stride(1) if mask.shape[1] > 1 else 0, mask.stride(2)


class _FusedCausal(torch.autograd.Function):
    """`linear_ops.causal_linear_attention` fused: quadratic inside a chunk of c tokens, a d x e state carried between
    chunks without leaving the program; each program walks the chunks in order, per (batch, head, value block of 64)
    in the forward, per (batch, head) in the backward ((batch, head) in the grid's first dimension, which takes up to
    2^31 - 1 programs; the others 65,535). A carried-in state (kv0, z0, m0) starts the walk:
    `linear_ops.prefix_causal_linear_attention` folds its leading keys into one in PyTorch and runs the rest here.

    elu + 1 in its exact form, where(x >= 0, x + 1, exp(min(x, 0))) (in bf16 `elu(x) + 1` cancels to 0 for negative
    x). exp with the chunked PyTorch op's stabilisers, which never look ahead: keys scaled by R_c, the running
    per-feature key maximum through the chunk's end, the carried state rescaled from R_{c-1} to R_c, each query shifted
    by max_f (q_f + R_c,f). Where a chunk's R_c rises more than `spread` (`EXP_CHUNK_SPREAD`) nats above the running
    maximum at a real query that sees a key (the PyTorch op's test), that chunk takes the exact path (`_exact_chunk`):
    each query its own running maximum M_i, w_ij = sum_f exp(q_if + k_jf - s_i), s_i = max_f (q_if + M_if), the
    carried state read in reference R_{c-1}; every exponent is <= 0 and none comes from a later key. No host read.

    A decay (`logd`, see the comment above the kernels) weighs key j by exp(G_i - G_j) at query i inside a chunk and
    decays the carried state between chunks (exp: by moving its reference, which keeps the decayed key maximum); its
    gradient (of G, then summed from the end) comes from the same two backward kernels.

    The backward saves only the inputs (and with a decay the final state): one kernel walks the chunks forwards for dq
    (and the per-query normalisers and output-gradient dot products, b x h x n fp32 each, and for exp the chunks' key
    maxima, b x h x n/c x d), taking
    the exact-path decision on its own (smaller) chunks; a second walks them backwards for dk, dv and the gradient of a
    carried-in state, following that decision."""

    @staticmethod
    def forward(q, k, v, keep, real, kv0, z0, m0, logd, fmap, chunk_size, spread, seq_idx):
        return causal_forward(q, k, v, keep, real, kv0, z0, m0, logd, fmap, chunk_size, spread, seq_idx)

    @staticmethod
    def setup_context(ctx, inputs, output):  # apart from forward, as torch.func transforms need
        q, k, v, keep, real, kv0, z0, m0, logd, fmap, chunk_size, spread, seq_idx = inputs
        _, kv1, z1, m1 = output
        # with a decay the backward also needs the final state (its gradient w.r.t. the last position's decay)
        final = (kv1, z1) if logd is not None else (None, None)
        ctx.save_for_backward(q, k, v, keep, real, kv0, z0, m0, logd, *final, seq_idx)
        ctx.fmap, ctx.chunk_size, ctx.spread = fmap, chunk_size, float(spread)
        ctx.mark_non_differentiable(m1)

    @staticmethod
    def backward(ctx, dout, dkv1, dz1, _dm1):
        *saved, seq_idx = ctx.saved_tensors
        grads = causal_backward(dout, dkv1, dz1, *saved, ctx.fmap, ctx.chunk_size, ctx.spread, seq_idx)
        return *grads[:3], None, None, *grads[3:5], None, grads[5], None, None, None, None



def _start_reference(m0, b, h, d, f32):
    """exp's carried-in key reference (b, h, d) as the kernels read it: FLOOR where none, finite."""
    return torch.full((b, h, d), FLOOR, **f32) if m0 is None else m0.float().contiguous().clamp_min(FLOOR)


def causal_forward(q, k, v, keep, real, kv0, z0, m0, logd, fmap, chunk_size, spread, seq_idx=None):
    """`_FusedCausal`'s forward: q, k, v (b,h,n,d|e) in one dtype, `keep`/`real` from `causal_masks`, the carried
    state kv0 (b,h,d,e), z0, m0 (b,h,d) fp32 or None, logd (b,h,n) fp32 or None, seq_idx (b,n) a packed row's
    sequences or None -> out (b,h,n,e), kv1, z1, m1 fp32 (m1 FLOOR for an elementwise map)."""
    _require_triton("causal_forward")
    ids = _sequence_arg(seq_idx)
    logd = None if logd is None else logd.float().contiguous()  # (b, h, n), read as contiguous
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    b, h, n, d = q.shape
    e = v.shape[-1]
    f32 = {"device": q.device, "dtype": torch.float32}
    out = torch.empty(b, h, n, e, **f32)
    kv1, z1 = torch.empty(b, h, d, e, **f32), torch.empty(b, h, d, **f32)
    m1 = torch.full((b, h, d), FLOOR, **f32)
    has_state = kv0 is not None
    if has_state:
        kv0, z0 = kv0.contiguous(), z0.contiguous()
    m0 = _start_reference(m0, b, h, d, f32)
    if n:
        blocks = _blocks(q, v, chunk_size, backward=False)  # value blocks of at most 64: more programs
        _run(
            _forward_kernel, (b * h, triton.cdiv(e, blocks["BE"])),
            q, k, v, *_mask_args(keep, q), *_mask_args(real, q),
            kv0 if has_state else kv1, z0 if has_state else z1, m0, logd if logd is not None else m0,
            ids if ids is not None else m0, out, kv1, z1, m1, float(spread),
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            h, n, d, e, **_map_flags(fmap), HAS_KEEP=keep is not None, HAS_REAL=real is not None,
            HAS_STATE=has_state, HAS_DECAY=logd is not None, SEQ=ids is not None,
            **blocks,
        )  # fmt: skip
    else:  # no tokens: the state passes through
        kv1.copy_(kv0) if has_state else kv1.zero_()
        z1.copy_(z0) if has_state else z1.zero_()
        m1.copy_(m0)
    return out, kv1, z1, m1


def causal_backward(
    dout, dkv1, dz1, q, k, v, keep, real, kv0, z0, m0, logd, kv1, z1, fmap, chunk_size, spread, seq_idx=None
):
    """`_FusedCausal`'s backward from the forward's inputs (and, with a decay, its final state kv1, z1): the
    gradients of the outputs out, kv1, z1 (None: zero) -> dq, dk, dv in their dtypes, dkv0, dz0 (None without a
    carried state) and the log-decay's dlogd (None without one)."""
    _require_triton("causal_backward")
    ids = _sequence_arg(seq_idx)
    logd = None if logd is None else logd.float().contiguous()  # (b, h, n), read as contiguous
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    b, h, n, d = q.shape
    e = v.shape[-1]
    f32 = {"device": q.device, "dtype": torch.float32}
    has_state = kv0 is not None
    if has_state:
        kv0, z0 = kv0.contiguous(), z0.contiguous()
    m0 = _start_reference(m0, b, h, d, f32)
    dkv1 = torch.zeros(b, h, d, e, **f32) if dkv1 is None else dkv1.float().contiguous()
    dz1 = torch.zeros(b, h, d, **f32) if dz1 is None else dz1.float().contiguous()
    dout = torch.zeros(b, h, n, e, **f32) if dout is None else _inner_contiguous(dout)
    dq, dk, dv = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))  # contiguous
    dkv0, dz0 = torch.empty(b, h, d, e, **f32), torch.empty(b, h, d, **f32)
    has_decay = logd is not None
    dg = torch.empty(b, h, n, **f32) if has_decay else None  # dL/dG, G the cumulative log-decay
    if n:
        blocks = _blocks(q, v, chunk_size, backward=True)
        den = torch.empty(b, h, n, **f32)  # the normalisers, 1 where no key
        r = torch.empty(b, h, n, **f32)  # -dout . out / normaliser
        chunks = triton.cdiv(n, blocks["BT"])
        exp = fmap.stabilised
        refs = torch.empty(b, h, chunks, d, **f32) if exp else den  # R_c (exp)
        urefs = torch.empty(b, h, chunks, d, **f32) if exp and (has_decay or ids is not None) else den  # U_c
        steeps = torch.empty(b, h, chunks, **f32) if exp else den  # exp: 1 for a chunk on the exact path
        strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
        flags = {**_map_flags(fmap), "HAS_KEEP": keep is not None, "HAS_DECAY": has_decay, "SEQ": ids is not None}
        flags.update(blocks)
        decay_args = (logd, dg, ids) if has_decay else (den, den, ids)
        decay_args = decay_args if ids is not None else (*decay_args[:2], den)  # the ids, or a dummy pointer
        _run(
            _backward_dq_kernel, (b * h,),
            q, k, v, dout, kv0 if has_state else dkv0, z0 if has_state else dz0, m0, *decay_args, dq, den, r,
            refs, urefs, steeps, float(spread), *_mask_args(keep, q), *_mask_args(real, q), *strides, h, n, d, e,
            HAS_REAL=real is not None, HAS_STATE=has_state, **flags,
        )  # fmt: skip
        _run(
            _backward_dkv_kernel, (b * h,),
            q, k, v, dout, den, r, refs, urefs, steeps, m0, *decay_args, dkv1, dz1, dk, dv, dkv0, dz0,
            *_mask_args(keep, q), *strides, h, n, d, e, **flags,
        )  # fmt: skip
    else:
        dkv0.copy_(dkv1)
        dz0.copy_(dz1)
    dlogd = None
    if has_decay and n:
        # the final state scales with exp(G_n) as a whole: its own term at the last position; then
        # log g_t enters every G_s, s >= t: the reversed cumulative sum
        dg[..., -1] += (dkv1 * kv1).sum((-2, -1)) + (dz1 * z1).sum(-1)
        dlogd = dg.flip(-1).cumsum(-1).flip(-1)
    elif has_decay:
        dlogd = torch.zeros_like(logd)
    if not has_state:
        dkv0 = dz0 = None
    return dq, dk, dv, dkv0, dz0, dlogd


def _split(length, bt, split):
    """The tokens one program of a split sum takes (a multiple of the block `bt`; by default at least 4 blocks and at
    most 64 programs per (batch, head)) and the number of splits."""
    split = max(4 * bt, triton.cdiv(length, 64)) if split is None else split
    split = triton.cdiv(split, bt) * bt
    return split, triton.cdiv(length, split)


def _key_sums(kv_part, z_part, mx_part, exp):
    """The splits' partial key sums (b, h, splits, ...) -> S (b,h,d,e), z (b,h,d) and, for exp, K (b,h,d) the keys'
    maximum and s (b,h,d) the softmax's denominator (1 where no key); S and z then of the softmax-normalised keys."""
    if not exp:
        return kv_part.sum(2), z_part.sum(2), None, None
    k_ref = mx_part.amax(2)
    scale = torch.exp(mx_part - k_ref[:, :, None])  # each split's reference to the common one, <= 1
    total = (z_part * scale).sum(2)
    total = torch.where(total > 0, total, 1.0)  # no key: every sum is 0
    kv = (kv_part * scale[..., None]).sum(2) / total[..., None]
    return kv, (z_part * scale).sum(2) / total, k_ref, total


class _FusedNonCausal(torch.autograd.Function):
    """`linear_ops.linear_attention` fused (exp is Shen et al.'s efficient attention, a softmax over the keys per
    feature), in four kernels: the key sums S = phi(K)^T V and z = phi(K)^T 1 (for exp with a running per-feature key
    maximum, so keys any distance apart stay exact), one program per split of the keys (at most 64 per (batch, head)),
    whose partial sums the host adds (exp: rescaled to the common maximum); the outputs, one program per block of
    queries; in the backward, the query gradients with the partial sums of dS and dz per split of the queries, then the
    key and value gradients per block of keys. Key padding and key dropout arrive as one (b, m) or (b, h, m) mask."""

    @staticmethod
    def forward(ctx, q, k, v, keep, fmap, chunk_size, split):
        out, kv, z, k_ref, k_sum = noncausal_forward(q, k, v, keep, fmap, chunk_size, split)
        ctx.save_for_backward(q, k, v, keep, kv, z, k_ref, k_sum)
        ctx.fmap, ctx.chunk_size, ctx.split = fmap, chunk_size, split
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = noncausal_backward(dout, *ctx.saved_tensors, ctx.fmap, ctx.chunk_size, ctx.split)
        return dq, dk, dv, None, None, None, None


def noncausal_forward(q, k, v, keep, fmap, chunk_size, split):
    """`_FusedNonCausal`'s forward: q, k, v (b,h,n|m,d|e) in one dtype, `keep` (b, 1 or h, m) bool or None -> out
    (b,h,n,e) fp32 and what the backward reads: the key sums kv (b,h,d,e), z (b,h,d), and for exp the keys' maximum
    k_ref and the softmax's denominator k_sum (b,h,d) (None for an elementwise map)."""
    _require_triton("noncausal_forward")
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    (b, h, n, d), m, e = q.shape, k.shape[2], v.shape[-1]
    f32 = {"device": q.device, "dtype": torch.float32}
    blocks = _blocks(q, v, chunk_size, backward=False)  # value blocks of at most 64
    length, splits = _split(m, blocks["BT"], split)
    kv_part = torch.empty(b, h, splits, d, e, **f32)
    z_part, mx_part = torch.empty(b, h, splits, d, **f32), torch.empty(b, h, splits, d, **f32)
    _run(
        _key_sums_kernel, (b * h, splits, triton.cdiv(e, blocks["BE"])),
        k, v, *_mask_args(keep, q), kv_part, z_part, mx_part, *k.stride()[:3], *v.stride()[:3],
        h, m, d, e, length, **_map_flags(fmap), HAS_KEEP=keep is not None, **blocks,
    )  # fmt: skip
    kv, z, k_ref, k_sum = _key_sums(kv_part, z_part, mx_part, fmap.stabilised)
    out = torch.empty(b, h, n, e, **f32)
    _run(
        _output_kernel, (b * h, triton.cdiv(n, blocks["BT"]), triton.cdiv(e, blocks["BE"])),
        q, kv, z, out, *q.stride()[:3], h, n, d, e, **_map_flags(fmap), **blocks,
    )  # fmt: skip
    return out, kv, z, k_ref, k_sum


def noncausal_backward(dout, q, k, v, keep, kv, z, k_ref, k_sum, fmap, chunk_size, split):
    """`_FusedNonCausal`'s backward from its inputs and what its forward returned besides the output -> dq, dk, dv."""
    _require_triton("noncausal_backward")
    q, k, v = _inner_contiguous(q), _inner_contiguous(k), _inner_contiguous(v)
    (b, h, n, d), m, e = q.shape, k.shape[2], v.shape[-1]
    dout = _inner_contiguous(dout.float())
    dq, dk, dv = (torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v))  # contiguous
    blocks = _blocks(q, v, chunk_size, backward=True)
    length, splits = _split(n, blocks["BT"], split)
    dkv = torch.empty(b, h, splits, d, e, device=q.device, dtype=torch.float32)
    dz = torch.empty(b, h, splits, d, device=q.device, dtype=torch.float32)
    _run(
        _query_grads_kernel, (b * h, splits),
        q, dout, kv, z, dq, dkv, dz, *q.stride()[:3], *dout.stride()[:3], h, n, d, e, length,
        **_map_flags(fmap), **blocks,
    )  # fmt: skip
    dkv, dz = dkv.sum(2), dz.sum(2)
    exp = fmap.stabilised
    shift = (dkv * kv).sum(-1) + dz * z if exp else dz  # exp: sum_j B_jf dB_jf
    _run(
        _key_grads_kernel, (b * h, triton.cdiv(m, blocks["BT"])),
        k, v, *_mask_args(keep, q), dkv, dz, shift, k_ref if exp else dz, k_sum if exp else dz, dk, dv,
        *k.stride()[:3], *v.stride()[:3], h, m, d, e, **_map_flags(fmap), HAS_KEEP=keep is not None, **blocks,
    )  # fmt: skip
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------------------------
# Kernels. Each program owns one (batch, head) and walks its chunks in order (reverse order for dk, dv), holding the
# d x e state and the d normaliser in fp32. Tiles are padded to powers of 2: padded features and tokens past n get
# phi = 0 explicitly (elu's phi(0) = 1 would count them), and keys a mask drops get phi = 0.
#
# With A = phi(q), B = phi(k) * keep, P_ij = A_i . B_j for j <= i, S = kv0 + sum_j B_j v_j^T, z = z0 + sum_j B_j:
#   out_i = num_i / den_i,  num_i = sum_{j<=i} P_ij v_j + A_i S_<c,  den_i = sum_{j<=i} P_ij + A_i . z_<c;
# backward, with g_i = dout_i / den_i and r_i = -(dout_i . out_i) / den_i (as linear_ops._ratio: where den_i = 0,
# g_i = dout_i and r_i = 0), dP_ij = g_i . v_j + r_i (j <= i):
#   dA_i = sum_j dP_ij B_j + S_<c g_i + r_i z_<c,
#   dB_j = sum_i dP_ij A_i + dS_>c v_j + dz_>c,    dv_j = sum_i P_ij g_i + dS_>c^T B_j,
# where the reverse state dS = dkv1 + sum_i A_i g_i^T, dz = dz1 + sum_i r_i A_i is the gradient of (kv0, z0).
# r_i needs no recomputed output: dout_i . num_i / den_i = sum_j P_ij (g_i . v_j) + A_i . (S g_i).
#
# exp: in chunk c, A_i = exp(q_i + R_c - s_i), s_i = max_f (q_if + R_c,f), and B_j = exp(k_j - R_c); the stabilisers
# are constants (they cancel in the ratio), so dq = dA * A and dk = dB * B. The state S, z is kept in reference R_c
# (multiplied by exp(R_{c-1} - R_c) <= 1 on entering chunk c), the reverse state dS, dz likewise (multiplied by
# exp(R_{c-1} - R_c) on leaving chunk c backwards); kv0 and z0 are in reference m0, the state's k_max.
#
# A decay (logd (b, h, n), log g <= 0; G its cumulative sum, b_i the cumulative sum inside the chunk through i, B the
# chunk's whole): key j weighs exp(G_i - G_j) at query i. elu: P_ij gets exp(b_i - b_j), query i reads the carried
# state times exp(b_i), and the state leaves the chunk as exp(B) S + sum_j exp(B - b_j) B_j v_j^T (every exponent
# <= 0); the backward puts the same factors on dP, on what a key reads of dS_>c, and on the reverse state. exp, as
# `linear_ops._causal_exp_linear_attention`: inside a chunk the raw keys and R_c (the carried state's reference and
# the chunk's keys) with the decay the same mask exp(b_i - b_j) and read exp(b_i); the state keeps the *decayed*
# maximum U_c = max(R_{c-1}, max_j (k_j - b_j)) >= R_c, a key entering it as exp(k_j - b_j - U_c), and leaves the
# chunk in reference U_c + B (a state decays by moving its reference), so a decayed-away key stops setting it and no
# decay, however strong, makes a chunk steep. The exact path of a steep chunk takes the keys back to the chunk's
# start, k_j - b_j (query i's factor exp(b_i) cancels in the ratio). The decay's gradient: the output is a function
# of A_i exp(G_i) and B_j exp(-G_j) (exp: of q_i + G_i and k_j - G_j) and the final state is exp(G_n) times one, so
#   dL/dG_t = A_t . dA_t - B_t . dB_t (exp: sum_f dq_tf - sum_f dk_tf) + [t = n - 1] (dkv1 . kv1 + dz1 . z1),
# the first from the dq kernel, the second from the dkv kernel, the last on the host, which then sums it from the
# end (log g_t is in every G_s, s >= t).
#
# A packed row (SEQ, `ids` (b, n) its sequence ids, non-decreasing): each chunk loads its positions' ids with its
# tokens. P is masked to pairs of one sequence; only the queries of the carried state's sequence read it; the state
# handed on is the carried one only where no boundary lies in the chunk (`carry`), plus the chunk's last sequence's
# keys; the backward follows the same masks (the reverse state stops at a boundary). exp: R_c leaves out the carried
# state's reference where the chunk starts a sequence, U_c is over the last sequence (and the carried state where it
# continues), and the steepness check and the exact path use each query's running maximum over its own sequence
# (`_packed_running_max`, a scan that restarts where the id changes). The decay's gradient keeps its form: the output
# depends on G only through differences inside a sequence.


# Helpers shared by the kernels (made triton functions by `_import_triton`).


def _phi(x, PHI: tl.constexpr):
    """The elementwise feature map whose `FeatureMap.triton_id` is PHI (feature_maps.py), in fp32. A new map is a
    branch here and in `_phi_slope`, and its id in `KERNEL_IDS`."""
    if PHI == 0:  # elu(x) + 1 in its exact form: `elu(x) + 1` in bf16 cancels to 0 for negative x
        y = tl.where(x >= 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        tl.static_assert(False, "`_phi` has no branch for this FeatureMap.triton_id")
    return y


def _phi_slope(x, PHI: tl.constexpr):
    """d phi(x) / dx of `_phi`."""
    if PHI == 0:
        y = tl.where(x >= 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    else:
        tl.static_assert(False, "`_phi_slope` has no branch for this FeatureMap.triton_id")
    return y


def _op(x, RD: tl.constexpr, DT: tl.constexpr):
    """A dot operand: rounded to RD (bf16 for bf16 inputs), held as DT (see `_blocks`)."""
    return x.to(RD).to(DT)


def _head(i_bh, H, s_b, s_h):
    """The offset of (batch, head) number i_bh in a tensor of batch stride s_b and head stride s_h."""
    return i_bh // H * s_b + i_bh % H * s_h


def _offsets(i_e, BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, D, E):
    """Offsets of a block: tokens (int64: n x stride may pass 2^31), features, the values of value block i_e; which
    features and values are real; the causal (c, c) mask."""
    o_t, o_k, o_e = tl.arange(0, BT).to(tl.int64), tl.arange(0, BK), i_e * BE + tl.arange(0, BE)
    return o_t, o_k, o_e, o_k < D, o_e < E, o_t[:, None] >= o_t[None, :]


def _heads(q, k, v, keep, i_bh, H, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_mb, s_mh):
    """q, k, v and the key mask moved to (batch, head) number i_bh."""
    return (q + _head(i_bh, H, s_qb, s_qh), k + _head(i_bh, H, s_kb, s_kh), v + _head(i_bh, H, s_vb, s_vh),
            keep + _head(i_bh, H, s_mb, s_mh))  # fmt: skip


def _rows(x, pos, s_n, offs, mask):
    """The rows `pos` (int64) and columns `offs` of a tensor whose rows are s_n apart and columns adjacent, as fp32,
    0 outside `mask`."""
    return tl.load(x + pos[:, None] * s_n + offs[None, :], mask, other=0.0).to(tl.float32)


def _kept(keep, pos, s_mn, in_t, HAS_KEEP: tl.constexpr):
    """Which of the tokens `pos` are keys that count: real (in_t) and, with a mask, kept by it."""
    if HAS_KEEP:
        return in_t & (tl.load(keep + pos * s_mn, in_t, other=0) != 0)
    return in_t


def _tokens(q, k, keep, pos, s_qn, s_kn, s_mn, o_k, in_k, N, HAS_KEEP: tl.constexpr):
    """A block of tokens `pos`: whether each is one (pos < N), the (c, d) tile mask, q and k rows in fp32 (0 past N),
    which keys count (real and kept) and their tile mask."""
    in_t = pos < N
    tile_k = in_t[:, None] & in_k[None, :]
    key = _kept(keep, pos, s_mn, in_t, HAS_KEEP)
    xq = _rows(q, pos, s_qn, o_k, tile_k)
    xk = _rows(k, pos, s_kn, o_k, tile_k)
    return in_t, tile_k, xq, xk, key, key[:, None] & in_k[None, :]


def _exp_reference(ref, xk, tile_key):
    """exp: the keys with the masked ones at -inf, the new per-feature reference R = max(ref, the block's maximum),
    and exp(ref - R) <= 1, the factor that moves a state from ref to R."""
    xk = tl.where(tile_key, xk, float("-inf"))
    r = tl.maximum(ref, tl.max(xk, axis=0))
    return xk, r, tl.exp(ref - r)


def _exp_queries(xq, r, in_k, tile_k):
    """exp(q_f + R_f - s), s = max_f (q_f + R_f) (a per-query constant: it cancels in the ratio), 0 on padding."""
    xq = tl.where(in_k[None, :], xq + r[None, :], float("-inf"))  # tokens past n: a finite row maximum
    return tl.where(tile_k, tl.exp(xq - tl.max(xq, axis=1)[:, None]), 0.0)


def _query_features(xq, in_k, tile_k, EXP: tl.constexpr, PHI: tl.constexpr):
    """Non-causal query features (c, d) and their derivatives: exp(q - max_f q) (Shen et al.'s softmax over the
    features but for its per-query normaliser, which cancels in the ratio), or phi(q); 0 on padding."""
    if EXP:
        a = _exp_queries(xq, tl.zeros_like(in_k).to(tl.float32), in_k, tile_k)
        da_dx = a
    else:  # (an `if` that returns would not stop triton from compiling what follows it)
        a, da_dx = tl.where(tile_k, _phi(xq, PHI), 0.0), _phi_slope(xq, PHI)
    return a, da_dx


def _max(a, b):
    return tl.maximum(a, b)


def _chunk_decay(logd, pos, in_t, HAS_DECAY: tl.constexpr):
    """A chunk's decay: b (c,) the cumulative log-decay inside it through each position and B its whole decay (zeros
    without a decay)."""
    ld = tl.zeros_like(pos).to(tl.float32)
    if HAS_DECAY:
        ld = tl.load(logd + pos, in_t, other=0.0)
    return tl.cumsum(ld, 0), tl.sum(ld, 0)


def _exp_decayed(ref, r_c, xk, local, HAS_DECAY: tl.constexpr):
    """exp: the keys taken back to the chunk's start, k_j - b_j (masked ones stay -inf), and U_c, the reference the
    state leaves the chunk in before it decays: max(ref, their maximum) (R_c without a decay)."""
    back, u_c = xk, r_c
    if HAS_DECAY:
        back = xk - local[:, None]
        u_c = tl.maximum(ref, tl.max(back, axis=0))
    return back, u_c


def _gaps(local, causal):
    """exp(b_i - b_j) for j <= i in the chunk, 0 elsewhere: how much key j has decayed when query i reads it."""
    return tl.exp(tl.where(causal, local[:, None] - local[None, :], float("-inf")))


def _steep(ref, r_c, xk, key, in_t, real, pos, s_rn, o_t, spread, BT: tl.constexpr, HAS_REAL: tl.constexpr):
    """exp: whether a chunk is too steep for the chunked form: its reference R_c lies more than `spread` nats above
    the running key maximum at its first real query that sees a key (the running maxima grow along the chunk; a query
    that sees none gives 0 at any scale). `ref` is R_{c-1}, xk the chunk's keys with the masked ones at -inf."""
    first = in_t & (o_t >= tl.where(tl.max(ref, axis=0) > -1e30, 0, tl.min(tl.where(key, o_t, BT))))
    if HAS_REAL:
        first = first & (tl.load(real + pos * s_rn, in_t, other=0) != 0)
    i0 = tl.min(tl.where(first, o_t, BT))
    at = tl.maximum(ref, tl.max(tl.where((o_t <= i0)[:, None], xk, float("-inf")), axis=0))
    return tl.max(tl.where(i0 < BT, r_c - at, 0.0), axis=0) > spread


def _steep_decayed(
    ref, r_c, back, local, key, in_t, real, pos, s_rn, o_t, spread, BT: tl.constexpr, HAS_REAL: tl.constexpr
):
    """exp with a decay: whether R_c lies more than `spread` nats above some real query's own decayed running maximum,
    max(ref, max_{j <= i} (k_j - b_j)) + b_i (these do not grow along the chunk: every query is checked), among the
    queries that see a key. `back`: the keys k_j - b_j, the masked ones at -inf."""
    own = tl.maximum(ref[None, :], tl.associative_scan(back, 0, _max)) + local[:, None]  # (c, d)
    sees = in_t & (o_t >= tl.where(tl.max(ref, axis=0) > -1e30, 0, tl.min(tl.where(key, o_t, BT))))
    if HAS_REAL:
        sees = sees & (tl.load(real + pos * s_rn, in_t, other=0) != 0)
    return tl.max(tl.where(sees, tl.max(r_c[None, :] - own, axis=1), 0.0), axis=0) > spread


def _exact_term(xq, xk, s, mask, o_k, f):
    """exp(q_if + k_jf - s_i) for feature f over `mask` (c, c), 0 elsewhere."""
    qf = tl.max(tl.where(o_k[None, :] == f, xq, float("-inf")), axis=1)  # column f of the tile
    kf = tl.max(tl.where(o_k[None, :] == f, xk, float("-inf")), axis=1)
    return tl.exp(tl.where(mask, qf[:, None] + kf[None, :] - s[:, None], float("-inf")))


def _segment_max(a_id, a_x, b_id, b_x):
    """The combine of a running maximum that restarts where the (non-decreasing) sequence id changes."""
    return b_id, tl.where(a_id == b_id, tl.maximum(a_x, b_x), b_x)


def _packed_running_max(ref, xk, sid, reads):
    """A packed row's running key maximum through each position over its own sequence (c, d), starting from the
    carried state's reference `ref` where the query reads that state (`reads`), FLOOR where nothing is seen yet."""
    _, run = tl.associative_scan((tl.broadcast_to(sid[:, None], xk.shape), xk), 0, _segment_max)
    return tl.maximum(tl.where(reads[:, None], ref[None, :], -1e30), run)


def _steep_packed(ref, r_c, back, local, sid, reads, in_t, real, pos, s_rn, spread, HAS_REAL: tl.constexpr):
    """exp over a packed row: whether R_c lies more than `spread` nats above some real query's own running maximum
    over its sequence (`_packed_running_max` of the keys taken back to the chunk's start, plus b_i), among the queries
    that see a key."""
    top = _packed_running_max(ref, back, sid, reads)  # (c, d)
    sees = in_t & (tl.max(top, axis=1) > -1e30)
    if HAS_REAL:
        sees = sees & (tl.load(real + pos * s_rn, in_t, other=0) != 0)
    return tl.max(tl.where(sees, tl.max(r_c[None, :] - (top + local[:, None]), axis=1), 0.0), axis=0) > spread


def _exact_chunk(xq, xk, ref, mask, in_k, tile_k, o_k, D, sid, reads, SEQ: tl.constexpr):
    """exp's exact path for a steep chunk, each query i with its own running key maximum M_i (through its position):
    the shift s_i = max_f (q_if + M_if), the carried state's query features exp(q_i + ref - s_i) (the state in
    reference `ref`, R_{c-1} <= M_i), and the weights w_ij = sum_f exp(q_if + k_jf - s_i) over `mask` (c, c), an
    explicit sum over the features. Every exponent is <= 0 and none comes from a later key. xk: masked keys at -inf.
    SEQ (a packed row): M_i over query i's sequence (`sid`), and only the queries that `reads` read the state."""
    if SEQ:
        at = _packed_running_max(ref, xk, sid, reads)  # (c, d): M_i
    else:
        at = tl.maximum(ref[None, :], tl.associative_scan(xk, 0, _max))  # (c, d): M_i
    s = tl.max(tl.where(in_k[None, :], xq + at, float("-inf")), axis=1)  # (c,)
    logits = xq + ref[None, :] - s[:, None]
    if SEQ:  # another sequence's reference may lie far above M_i: masked before the exp
        logits = tl.where(reads[:, None], logits, float("-inf"))
    a_prev = tl.where(tile_k, tl.exp(logits), 0.0)  # (c, d)
    w = tl.where(mask, 0.0, 0.0)
    for f in range(D):
        w += _exact_term(xq, xk, s, mask, o_k, f)
    return s, a_prev, w


def _exact_grads(xq, xk, s, dp, mask, o_k, D, AXIS: tl.constexpr):
    """The exact path's gradients through w: sum_j dp_ij exp(q_if + k_jf - s_i) (AXIS 1: d/dq) or sum_i of the same
    (AXIS 0: d/dk), as a (c, d) tile."""
    out = tl.zeros_like(xq)
    for f in range(D):
        col = tl.sum(dp * _exact_term(xq, xk, s, mask, o_k, f), axis=AXIS)
        out = tl.where(o_k[None, :] == f, col[:, None], out)
    return out


def _exact_dq(xq, xk, ref, mask, in_k, tile_k, o_k, D, sid, reads, SEQ: tl.constexpr, vv, do, state, norm,
              RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr):
    """The backward's exact path for a steep chunk (`_exact_chunk`), with the carried `state`/`norm` in reference
    `ref` (R_{c-1}): -> (dq (c, d), the per-query normalisers (c,), the per-query output-gradient terms r (c,))."""
    s_i, a_prev, w = _exact_chunk(xq, xk, ref, mask, in_k, tile_k, o_k, D, sid, reads, SEQ)
    den = tl.sum(w, axis=1) + tl.sum(a_prev * norm[None, :], axis=1)
    seen = den > 0
    den = tl.where(seen, den, 1.0)
    g = _op(do / den[:, None], RD, DT)
    gv = tl.dot(g, tl.trans(vv), input_precision=PRECISION)
    sg = tl.dot(g, tl.trans(_op(state, RD, DT)), input_precision=PRECISION)
    r = tl.where(seen, -(tl.sum(w * gv, axis=1) + tl.sum(a_prev * sg, axis=1)) / den, 0.0)
    dp = tl.where(mask, gv + r[:, None], 0.0)
    dq = _exact_grads(xq, xk, s_i, dp, mask, o_k, D, 1) + (sg + r[:, None] * norm[None, :]) * a_prev
    return dq, den, r


def _packed_handover(state, norm, b32, back, local, total, r_c, u_c, last, carry, EXP: tl.constexpr,
                     HAS_DECAY: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr):
    """A packed row's state after a chunk, before its keys are added: the carried state where no boundary lies in the
    chunk (decayed; exp: moved from R_c to U_c), else nothing; and the keys that enter it, the chunk's last
    sequence's (decayed to the chunk's end; exp: exp(k_j - b_j - U_c))."""
    if EXP:
        factor = tl.exp(tl.where(carry, r_c - u_c, float("-inf")))  # (d,), 0 at a boundary (masked before the exp)
        state = state * factor[:, None]
        norm = norm * factor
        bk = tl.exp(tl.where(last[:, None], back, float("-inf")) - u_c[None, :])
    else:
        bk = tl.where(last[:, None], b32, 0.0)
        g = tl.where(carry, 1.0, 0.0)
        if HAS_DECAY:
            g = tl.where(carry, tl.exp(total), 0.0)
            bk = bk * tl.exp(total - local)[:, None]
        state = state * g
        norm = norm * g
    return state, norm, _op(bk, RD, DT)


def _chunk_sequences(ids, pos, in_t, prev):
    """A packed row's chunk (`ids` the row's sequence ids, non-decreasing; `prev` the id before the chunk): each
    position's id (c,); which queries read the carried state (its sequence's) (c,); which keys are in the chunk's
    last sequence, the one whose state it hands on (c,); whether the carried state continues through the chunk (no
    boundary in it) and whether its first query reads it; the last id. Positions past the row's end are in a sequence
    of their own (-1), which no real query or key shares."""
    sid = tl.load(ids + pos, in_t, other=-1)
    last_id = tl.max(tl.where(in_t, sid, -1), axis=0)
    first_id = tl.min(tl.where(in_t, sid, last_id), axis=0)
    return sid, sid == prev, sid == last_id, last_id == prev, first_id == prev, last_id


def _state_tile(x, i_bh, o_k, o_e, D, E):
    """The (d, e) block `o_k` x `o_e` of a contiguous fp32 (b, h, d, e) state, 0 on padding."""
    return tl.load(x + i_bh * D * E + o_k[:, None] * E + o_e[None, :], (o_k < D)[:, None] & (o_e < E)[None, :], 0.0)


def _store_state(x, value, i_bh, o_k, o_e, D, E):
    tl.store(x + i_bh * D * E + o_k[:, None] * E + o_e[None, :], value, (o_k < D)[:, None] & (o_e < E)[None, :])


_HELPERS = [
    "_phi", "_phi_slope", "_op", "_head", "_offsets", "_heads", "_rows", "_kept", "_tokens", "_exp_reference",
    "_exp_queries", "_state_tile", "_store_state", "_query_features", "_max", "_steep", "_exact_term", "_exact_chunk",
    "_exact_grads", "_exact_dq", "_chunk_decay", "_gaps", "_exp_decayed", "_steep_decayed", "_segment_max",
    "_packed_running_max", "_steep_packed", "_chunk_sequences", "_packed_handover",
]  # fmt: skip


def _forward_kernel(
    q, k, v, keep, s_mb, s_mh, s_mn, real, s_rb, s_rh, s_rn,
    kv0, z0, m0, logd, ids, out, kv1, z1, m1, spread,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
    H, N, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_REAL: tl.constexpr, HAS_STATE: tl.constexpr,
    HAS_DECAY: tl.constexpr, SEQ: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh, i_e = tl.program_id(0).to(tl.int64), tl.program_id(1)  # (batch, head), value block
    o_t, o_k, o_e, in_k, in_e, causal = _offsets(i_e, BT, BK, BE, D, E)
    q, k, v, keep = _heads(q, k, v, keep, i_bh, H, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_mb, s_mh)
    real += i_bh // H * s_rb
    out += i_bh * N * E
    logd += i_bh * N  # contiguous (b, h, n)
    ids += i_bh // H * N  # contiguous (b, n)
    prev = 0  # SEQ: the sequence of the state carried into the chunk
    if SEQ:
        prev = tl.load(ids)
    state = tl.zeros([BK, BE], dtype=tl.float32)  # sum_j B_j v_j^T, (d, e)
    norm = tl.zeros([BK], dtype=tl.float32)  # sum_j B_j, (d,)
    if HAS_STATE:
        state += _state_tile(kv0, i_bh, o_k, o_e, D, E)
        norm += tl.load(z0 + i_bh * D + o_k, in_k, other=0.0)
    ref = tl.load(m0 + i_bh * D + o_k, in_k, other=-1e30)  # exp: the reference R the state is in, (d,)
    for t in range(tl.cdiv(N, BT)):
        pos = t * BT + o_t
        in_t, tile_k, xq, xk, key, tile_key = _tokens(q, k, keep, pos, s_qn, s_kn, s_mn, o_k, in_k, N, HAS_KEEP)
        tile_e = in_t[:, None] & in_e[None, :]
        vv = _op(_rows(v, pos, s_vn, o_e, tile_e), RD, DT)  # (c, e)
        local, total = _chunk_decay(logd, pos, in_t, HAS_DECAY)
        pairs, sid, reads = causal, o_t, in_t  # the (query, key) pairs that may meet; SEQ: their sequences
        if SEQ:
            sid, reads, last, carry, cont, prev = _chunk_sequences(ids, pos, in_t, prev)
            pairs = causal & (sid[:, None] == sid[None, :])
        back, r_c, u_c = xk, ref, ref
        if EXP:
            ref_in = ref
            if SEQ:  # a chunk that starts a sequence does not scale its keys by the carried state's reference
                ref_in = tl.where(cont, ref, -1e30)
            xk, r_c, scale = _exp_reference(ref_in, xk, tile_key)
            back, u_c = _exp_decayed(ref, r_c, xk, local, HAS_DECAY)
            if SEQ:  # the state handed on: the last sequence's keys (and the carried state where it continues)
                u_c = tl.maximum(tl.where(carry, ref, -1e30), tl.max(tl.where(last[:, None], back, float("-inf")), 0))
                steep = _steep_packed(ref, r_c, back, local, sid, reads, in_t, real, pos, s_rn, spread, HAS_REAL)
            elif HAS_DECAY:
                steep = _steep_decayed(ref, r_c, back, local, key, in_t, real, pos, s_rn, o_t, spread, BT, HAS_REAL)
            else:
                steep = _steep(ref, r_c, xk, key, in_t, real, pos, s_rn, o_t, spread, BT, HAS_REAL)
            exact = tl.zeros([BT, BE], dtype=tl.float32)
            if steep:  # rare: the outputs with each query's own running maximum, from the state in reference R_{c-1}
                mask = pairs & key[None, :]
                _, a_prev, w = _exact_chunk(xq, back, ref, mask, in_k, tile_k, o_k, D, sid, reads, SEQ)
                den_x = tl.sum(w, axis=1) + tl.sum(a_prev * norm[None, :], axis=1)
                num_x = tl.dot(_op(w, RD, DT), vv, input_precision=PRECISION)
                num_x += tl.dot(_op(a_prev, RD, DT), _op(state, RD, DT), input_precision=PRECISION)
                exact = num_x / tl.where(den_x > 0, den_x, 1.0)[:, None]
            state = state * scale[:, None]
            norm = norm * scale
            a = _exp_queries(xq, r_c, in_k, tile_k)  # (c, d), <= 1
            bk = tl.exp(xk - r_c[None, :])  # (c, d), <= 1, 0 where masked
            ref = u_c
        else:
            a = tl.where(tile_k, _phi(xq, PHI), 0.0)  # (c, d)
            bk = tl.where(tile_key, _phi(xk, PHI), 0.0)  # (c, d)
        b32 = bk
        a, bk = _op(a, RD, DT), _op(bk, RD, DT)

        p = tl.where(pairs, tl.dot(a, tl.trans(bk), input_precision=PRECISION), 0.0)  # (c, c)
        read = tl.zeros([BT], dtype=tl.float32) + 1.0  # how each query reads the carried state: exp(b_i)
        if HAS_DECAY:
            p = p * _gaps(local, pairs)
            read = tl.exp(local)
        if SEQ:
            read = tl.where(reads, read, 0.0)
        den = tl.sum(p, axis=1) + tl.sum(a.to(tl.float32) * norm[None, :], axis=1) * read  # (c,)
        if EXP:  # a steep chunk's outputs are the exact path's; a tiny den here would overflow
            den = tl.where(steep, 1.0, den)
        num = tl.dot(_op(p, RD, DT), vv, input_precision=PRECISION)
        num += tl.dot(a, _op(state, RD, DT), input_precision=PRECISION) * read[:, None]  # (c, e)
        o = num / tl.where(den > 0, den, 1.0)[:, None]  # no key: num = 0, out = 0
        if EXP:
            o = tl.where(steep, exact, o)
        tl.store(out + pos[:, None] * E + o_e[None, :], o.to(out.dtype.element_ty), tile_e)

        if SEQ:
            state, norm, bk = _packed_handover(state, norm, b32, back, local, total, r_c, u_c, last, carry, EXP,
                                               HAS_DECAY, RD, DT)  # fmt: skip
        elif HAS_DECAY and not EXP:  # the state decays over the chunk, each key from its position to the chunk's end
            state *= tl.exp(total)
            norm *= tl.exp(total)
            bk = _op(b32 * tl.exp(total - local)[:, None], RD, DT)
        elif HAS_DECAY and EXP:  # the state moves to U_c >= R_c; each key enters it taken back to the chunk's start
            state *= tl.exp(r_c - u_c)[:, None]
            norm *= tl.exp(r_c - u_c)
            bk = _op(tl.exp(back - u_c[None, :]), RD, DT)
        state += tl.dot(tl.trans(bk), vv, input_precision=PRECISION)
        norm += tl.sum(bk.to(tl.float32), axis=0)
        if HAS_DECAY and EXP:  # the state decays: its reference moves down by the chunk's decay
            ref += total
    _store_state(kv1, state, i_bh, o_k, o_e, D, E)
    if i_e == 0:
        tl.store(z1 + i_bh * D + o_k, norm, in_k)
        if EXP:
            tl.store(m1 + i_bh * D + o_k, ref, in_k)


def _backward_dq_kernel(
    q, k, v, dout, kv0, z0, m0, logd, dg, ids, dq, den_out, r_out, refs, urefs, steeps, spread,
    keep, s_mb, s_mh, s_mn, real, s_rb, s_rh, s_rn,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_db, s_dh, s_dn,
    H, N, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_REAL: tl.constexpr, HAS_STATE: tl.constexpr,
    HAS_DECAY: tl.constexpr, SEQ: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh = tl.program_id(0).to(tl.int64)
    o_t, o_k, o_e, in_k, in_e, causal = _offsets(0, BT, BK, BE, D, E)
    q, k, v, keep = _heads(q, k, v, keep, i_bh, H, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_mb, s_mh)
    dout += _head(i_bh, H, s_db, s_dh)
    dq += i_bh * N * D  # contiguous (b, h, n, d)
    den_out += i_bh * N
    r_out += i_bh * N
    logd += i_bh * N  # contiguous (b, h, n), as dg
    dg += i_bh * N
    real += i_bh // H * s_rb
    ids += i_bh // H * N  # contiguous (b, n)
    prev = 0  # SEQ: the sequence of the state carried into the chunk
    if SEQ:
        prev = tl.load(ids)
    nt = tl.cdiv(N, BT)
    refs += i_bh * nt * D
    urefs += i_bh * nt * D
    steeps += i_bh * nt
    state = tl.zeros([BK, BE], dtype=tl.float32)
    norm = tl.zeros([BK], dtype=tl.float32)
    if HAS_STATE:
        state += _state_tile(kv0, i_bh, o_k, o_e, D, E)
        norm += tl.load(z0 + i_bh * D + o_k, in_k, other=0.0)
    ref = tl.load(m0 + i_bh * D + o_k, in_k, other=-1e30)
    for t in range(nt):
        pos = t * BT + o_t
        in_t, tile_k, xq, xk, key, tile_key = _tokens(q, k, keep, pos, s_qn, s_kn, s_mn, o_k, in_k, N, HAS_KEEP)
        tile_e = in_t[:, None] & in_e[None, :]
        vv = _op(_rows(v, pos, s_vn, o_e, tile_e), RD, DT)
        do = _rows(dout, pos, s_dn, o_e, tile_e)
        local, total = _chunk_decay(logd, pos, in_t, HAS_DECAY)
        pairs, sid, reads = causal, o_t, in_t  # as in the forward
        if SEQ:
            sid, reads, last, carry, cont, prev = _chunk_sequences(ids, pos, in_t, prev)
            pairs = causal & (sid[:, None] == sid[None, :])
        back, r_c, u_c = xk, ref, ref
        if EXP:
            ref_in = ref
            if SEQ:
                ref_in = tl.where(cont, ref, -1e30)
            xk, r_c, scale = _exp_reference(ref_in, xk, tile_key)
            back, u_c = _exp_decayed(ref, r_c, xk, local, HAS_DECAY)
            tl.store(refs + t * D + o_k, r_c, in_k)
            if SEQ:
                u_c = tl.maximum(tl.where(carry, ref, -1e30), tl.max(tl.where(last[:, None], back, float("-inf")), 0))
                tl.store(urefs + t * D + o_k, u_c, in_k)
                steep = _steep_packed(ref, r_c, back, local, sid, reads, in_t, real, pos, s_rn, spread, HAS_REAL)
            elif HAS_DECAY:
                tl.store(urefs + t * D + o_k, u_c, in_k)
                steep = _steep_decayed(ref, r_c, back, local, key, in_t, real, pos, s_rn, o_t, spread, BT, HAS_REAL)
            else:
                steep = _steep(ref, r_c, xk, key, in_t, real, pos, s_rn, o_t, spread, BT, HAS_REAL)
            tl.store(steeps + t, steep.to(tl.float32))
            dq_x = tl.zeros([BT, BK], dtype=tl.float32)
            den_x = tl.zeros([BT], dtype=tl.float32)
            r_x = tl.zeros([BT], dtype=tl.float32)
            if steep:  # rare: the exact path's gradients (see `_exact_chunk`), from the state in reference R_{c-1}
                dq_x, den_x, r_x = _exact_dq(
                    xq, back, ref, pairs & key[None, :], in_k, tile_k, o_k, D, sid, reads, SEQ, vv, do, state, norm,
                    RD, DT, PRECISION,
                )
            state = state * scale[:, None]
            norm = norm * scale
            a32 = _exp_queries(xq, r_c, in_k, tile_k)
            da_dx = a32  # d exp(x + const) / dx
            bk = tl.exp(xk - r_c[None, :])
            ref = u_c
        else:
            a32 = tl.where(tile_k, _phi(xq, PHI), 0.0)
            da_dx = _phi_slope(xq, PHI)
            bk = tl.where(tile_key, _phi(xk, PHI), 0.0)
        b32 = bk
        a, bk = _op(a32, RD, DT), _op(bk, RD, DT)

        p = tl.where(pairs, tl.dot(a, tl.trans(bk), input_precision=PRECISION), 0.0)  # (c, c)
        read = tl.zeros([BT], dtype=tl.float32) + 1.0  # exp(b_i) with a decay, as in the forward
        gaps = p
        if HAS_DECAY:
            gaps = _gaps(local, pairs)
            p = p * gaps
            read = tl.exp(local)
        if SEQ:
            read = tl.where(reads, read, 0.0)
        den = tl.sum(p, axis=1) + tl.sum(a.to(tl.float32) * norm[None, :], axis=1) * read
        if EXP:  # a steep chunk's chunked terms are dropped below; a tiny den there would overflow into inf and NaN
            den = tl.where(steep, 1.0, den)
        seen = den > 0
        den = tl.where(seen, den, 1.0)  # as linear_ops._ratio: no key, num / 1 (no reciprocal: a tiny den overflows it)
        g = _op(do / den[:, None], RD, DT)  # (c, e)
        gv = tl.dot(g, tl.trans(vv), input_precision=PRECISION)  # (c, c): g_i . v_j
        sg = tl.dot(g, tl.trans(_op(state, RD, DT)), input_precision=PRECISION) * read[:, None]  # (c, d): S g_i
        r = tl.where(seen, -(tl.sum(p * gv, axis=1) + tl.sum(a.to(tl.float32) * sg, axis=1)) / den, 0.0)  # (c,)
        dp = tl.where(pairs, gv + r[:, None], 0.0)
        if HAS_DECAY:
            dp = dp * gaps
        da = tl.dot(_op(dp, RD, DT), bk, input_precision=PRECISION) + sg + (r * read)[:, None] * norm[None, :]
        row = tl.sum(da * a32, axis=1)  # elu: A_i . dA_i, what query i adds to dL/dG_i
        da = da * da_dx
        if EXP:
            da = tl.where(steep, dq_x, da)
            den = tl.where(steep, den_x, den)
            r = tl.where(steep, r_x, r)
            row = tl.sum(da, axis=1)  # exp: G_i enters as a shift of q_i, so dL/dG_i gets sum_f dq_if
        tl.store(dq + pos[:, None] * D + o_k[None, :], da.to(dq.dtype.element_ty), tile_k)
        tl.store(den_out + pos, den, in_t)
        tl.store(r_out + pos, r, in_t)
        if HAS_DECAY:
            tl.store(dg + pos, row, in_t)

        if SEQ:
            state, norm, bk = _packed_handover(state, norm, b32, back, local, total, r_c, u_c, last, carry, EXP,
                                               HAS_DECAY, RD, DT)  # fmt: skip
        elif HAS_DECAY and not EXP:
            state *= tl.exp(total)
            norm *= tl.exp(total)
            bk = _op(b32 * tl.exp(total - local)[:, None], RD, DT)
        elif HAS_DECAY and EXP:
            state *= tl.exp(r_c - u_c)[:, None]
            norm *= tl.exp(r_c - u_c)
            bk = _op(tl.exp(back - u_c[None, :]), RD, DT)
        state += tl.dot(tl.trans(bk), vv, input_precision=PRECISION)
        norm += tl.sum(bk.to(tl.float32), axis=0)
        if HAS_DECAY and EXP:
            ref += total


def _backward_dkv_kernel(
    q, k, v, dout, den_in, r_in, refs, urefs, steeps, m0, logd, dg, ids, dkv1, dz1, dk, dv, dkv0, dz0,
    keep, s_mb, s_mh, s_mn, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_db, s_dh, s_dn,
    H, N, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_DECAY: tl.constexpr, SEQ: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh = tl.program_id(0).to(tl.int64)
    o_t, o_k, o_e, in_k, in_e, causal = _offsets(0, BT, BK, BE, D, E)
    q, k, v, keep = _heads(q, k, v, keep, i_bh, H, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_mb, s_mh)
    dk += i_bh * N * D  # contiguous, as dv
    dv += i_bh * N * E
    logd += i_bh * N  # contiguous (b, h, n), as dg
    dg += i_bh * N
    dout += _head(i_bh, H, s_db, s_dh)
    den_in += i_bh * N
    r_in += i_bh * N
    ids += i_bh // H * N  # contiguous (b, n)
    nt = tl.cdiv(N, BT)
    refs += i_bh * nt * D
    urefs += i_bh * nt * D
    steeps += i_bh * nt
    dstate = _state_tile(dkv1, i_bh, o_k, o_e, D, E)  # (d, e) fp32
    dnorm = tl.load(dz1 + i_bh * D + o_k, in_k, other=0.0)  # (d,)
    ref0 = tl.load(m0 + i_bh * D + o_k, in_k, other=-1e30)
    for i in range(nt):
        t = nt - 1 - i
        pos = t * BT + o_t
        in_t, tile_k, xq, xk, key, tile_key = _tokens(q, k, keep, pos, s_qn, s_kn, s_mn, o_k, in_k, N, HAS_KEEP)
        local, total = _chunk_decay(logd, pos, in_t, HAS_DECAY)
        pairs, sid, reads = causal, o_t, in_t  # as in the forward
        if SEQ:  # the sequence before the chunk: of its previous position (the first chunk's carries nothing)
            sid, reads, last, carry, cont, _ = _chunk_sequences(ids, pos, in_t, tl.load(ids + tl.maximum(t * BT - 1, 0)))
            pairs = causal & (sid[:, None] == sid[None, :])
        if EXP:
            r_c = tl.load(refs + t * D + o_k, in_k, other=-1e30)  # the chunk's reference, R_c
            u_c = r_c  # the state's, U_c
            before = tl.load(refs + tl.maximum(t - 1, 0) * D + o_k, in_k, other=-1e30)
            if HAS_DECAY or SEQ:  # U_{c-1} (decayed by chunk c-1), as the dq kernel carried it
                u_c = tl.load(urefs + t * D + o_k, in_k, other=-1e30)
                before = tl.load(urefs + tl.maximum(t - 1, 0) * D + o_k, in_k, other=-1e30)
            if HAS_DECAY:
                prev = (t - 1) * BT + o_t
                before += tl.sum(tl.load(logd + prev, (prev >= 0) & (prev < N), other=0.0), 0)
            before = tl.where(t > 0, before, ref0)
            xk = tl.where(tile_key, xk, float("-inf"))
            back = xk
            if HAS_DECAY:  # the keys taken back to the chunk's start
                back = xk - local[:, None]
            a = _exp_queries(xq, r_c, in_k, tile_k)
            b32 = tl.exp(xk - r_c[None, :])
            db_dx = b32
            if SEQ:  # only the chunk's last sequence enters the state it hands on
                to_state = tl.exp(tl.where(last[:, None], back, float("-inf")) - u_c[None, :])
            else:
                to_state = tl.exp(back - u_c[None, :])  # how each key enters the state (b32 without a decay)
        else:
            a = tl.where(tile_k, _phi(xq, PHI), 0.0)
            b32 = tl.where(tile_key, _phi(xk, PHI), 0.0)
            db_dx = tl.where(tile_key, _phi_slope(xk, PHI), 0.0)
            to_state = b32
            if SEQ:
                to_state = tl.where(last[:, None], b32, 0.0)
        a32 = a
        a, bk = _op(a, RD, DT), _op(b32, RD, DT)
        tile_e = in_t[:, None] & in_e[None, :]
        vv = _op(_rows(v, pos, s_vn, o_e, tile_e), RD, DT)
        do = _rows(dout, pos, s_dn, o_e, tile_e)
        den = tl.load(den_in + pos, in_t, other=1.0)
        r = tl.load(r_in + pos, in_t, other=0.0)
        g = _op(do / den[:, None], RD, DT)

        p = tl.where(pairs, tl.dot(a, tl.trans(bk), input_precision=PRECISION), 0.0)  # (c, c), query i, key j
        dp = tl.where(pairs, tl.dot(g, tl.trans(vv), input_precision=PRECISION) + r[:, None], 0.0)
        later = tl.dot(vv, tl.trans(_op(dstate, RD, DT)), input_precision=PRECISION) + dnorm[None, :]  # dS_>c, dz_>c
        if SEQ:  # only the last sequence's keys reach the state after the chunk
            later = tl.where(last[:, None], later, 0.0)
        carried = tl.dot(_op(to_state, RD, DT), _op(dstate, RD, DT), input_precision=PRECISION)  # (c, e): dS_>c^T B_j
        dp_x = dp  # the exact path's (its weights carry the decay)
        if HAS_DECAY:  # query i reads key j decayed by exp(b_i - b_j)
            gaps = _gaps(local, pairs)
            p, dp = p * gaps, dp * gaps
        if HAS_DECAY and not EXP:  # key j reaches the chunk's end decayed by exp(B - b_j)
            to_end = tl.exp(total - local)[:, None]
            later, carried = later * to_end, carried * to_end
        d_b = tl.dot(tl.trans(_op(dp, RD, DT)), a, input_precision=PRECISION)  # (c, d): dL/dB inside the chunk
        if EXP:  # what a key adds to the state, exp(k_j - b_j - U_c), and inside the chunk, exp(k_j - R_c)
            db = d_b * db_dx + later * to_state
        else:
            d_b += later
            db = d_b * db_dx
        dvv = tl.dot(tl.trans(_op(p, RD, DT)), g, input_precision=PRECISION) + carried  # (c, e)
        if EXP:
            # the reverse state into the reference of the chunk before (or of kv0, z0): the state entering the chunk
            # reaches its end times exp(before - U_c), and its queries read it times exp(before - R_c) exp(b_i)
            through = before - u_c
            if SEQ:  # a boundary in the chunk: the state entering it does not reach its end (masked before the exp)
                through = tl.where(carry, through, float("-inf"))
            dstate_x = dstate * tl.exp(through)[:, None]
            dnorm_x = dnorm * tl.exp(through)
            steep = tl.load(steeps + t) != 0  # the dq kernel's exact path: its den and r are those of each query's
            if steep:  # own running maximum (see `_exact_chunk`), and its queries read the state in reference R_{c-1}
                mask = pairs & key[None, :]
                s_i, a_prev, w = _exact_chunk(xq, back, before, mask, in_k, tile_k, o_k, D, sid, reads, SEQ)
                db = _exact_grads(xq, back, s_i, dp_x, mask, o_k, D, 0) + later * to_state
                dvv = tl.dot(tl.trans(_op(w, RD, DT)), g, input_precision=PRECISION) + carried
                dstate_x += tl.dot(tl.trans(_op(a_prev, RD, DT)), g, input_precision=PRECISION)
                dnorm_x += tl.sum(r[:, None] * a_prev, axis=0)
            else:
                read = a
                if HAS_DECAY:
                    read = _op(a32 * tl.exp(local)[:, None], RD, DT)
                lift = before - r_c
                if SEQ:  # only the carried state's sequence reads it; R_c may lie below its reference where none does
                    read = tl.where(reads[:, None], read, 0.0).to(read.dtype)
                    lift = tl.where(cont, lift, float("-inf"))
                scale = tl.exp(lift)
                dstate_x += tl.dot(tl.trans(read), g, input_precision=PRECISION) * scale[:, None]
                dnorm_x += tl.sum(r[:, None] * read.to(tl.float32), axis=0) * scale
            dstate, dnorm = dstate_x, dnorm_x
            col = tl.sum(db, axis=1)  # exp: G_j enters as a shift of k_j by -G_j
        else:
            col = tl.sum(d_b * b32, axis=1)  # elu: B_j . dB_j
            if SEQ:  # the state entering the chunk reaches its end only without a boundary; its sequence reads it
                reach = tl.where(carry, 1.0, 0.0)
                read = tl.where(reads, 1.0, 0.0)
                if HAS_DECAY:
                    reach = tl.where(carry, tl.exp(total), 0.0)
                    read = tl.where(reads, tl.exp(local), 0.0)
                dstate = dstate * reach + tl.dot(tl.trans(_op(a32 * read[:, None], RD, DT)), g, input_precision=PRECISION)
                dnorm = dnorm * reach + tl.sum((r * read)[:, None] * a32, axis=0)
            elif HAS_DECAY:  # the state entering the chunk decays by exp(B) to its end, query i reads exp(b_i) of it
                dstate = dstate * tl.exp(total) + tl.dot(tl.trans(_op(a32 * tl.exp(local)[:, None], RD, DT)), g,
                                                         input_precision=PRECISION)  # fmt: skip
                dnorm = dnorm * tl.exp(total) + tl.sum((r * tl.exp(local))[:, None] * a32, axis=0)
            else:
                dstate += tl.dot(tl.trans(a), g, input_precision=PRECISION)
                dnorm += tl.sum(r[:, None] * a.to(tl.float32), axis=0)
        tl.store(dk + pos[:, None] * D + o_k[None, :], db.to(dk.dtype.element_ty), tile_k)
        tl.store(dv + pos[:, None] * E + o_e[None, :], dvv.to(dv.dtype.element_ty), tile_e)
        if HAS_DECAY:  # dL/dG_t: what position t adds as a query (the dq kernel's), less what it adds as a key
            tl.store(dg + pos, tl.load(dg + pos, in_t, other=0.0) - col, in_t)
    _store_state(dkv0, dstate, i_bh, o_k, o_e, D, E)
    tl.store(dz0 + i_bh * D + o_k, dnorm, in_k)


# ---------------------------------------------------------------------------------------------------------------
# Non-causal kernels. With A = phi(q) (n, d), B = phi(k) * keep (m, d), S = B^T V (d, e), z = B^T 1 (d):
#   out_i = A_i S / A_i . z;
# backward, with g_i, r_i as in the causal kernels: dA_i = S g_i + r_i z, dS = sum_i A_i g_i^T, dz = sum_i r_i A_i,
#   dB_j = dS v_j + dz, dv_j = dS^T B_j.
# exp (Shen et al.): B_jf = exp(k_jf - K_f) keep_j / s_f, K_f the keys' maximum and s_f = sum_j exp(k_jf - K_f) keep_j
# (a softmax over the keys), so dk_jf = B_jf (dB_jf - c_f), c_f = sum_j B_jf dB_jf = sum_e dS_fe S_fe + dz_f z_f; the
# queries' softmax over features is exp(q_i - max_f q_if) up to a per-query factor, which cancels in the ratio, so
# dq = dA * A as in the causal kernel.
# The sums over keys (S, z, and for exp K and s) and over queries (dS, dz) are cut into splits of L tokens, one
# program each, whose partial sums the host adds (exp: rescaled to the largest maximum first).


def _key_sums_kernel(
    k, v, keep, s_mb, s_mh, s_mn, kv_part, z_part, mx_part,
    s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
    H, M, D, E, L,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh, i_s, i_e = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # (b, h), split, value block
    o_t, o_k, o_e, in_k, in_e, _ = _offsets(i_e, BT, BK, BE, D, E)
    k += _head(i_bh, H, s_kb, s_kh)
    v += _head(i_bh, H, s_vb, s_vh)
    keep += _head(i_bh, H, s_mb, s_mh)
    state = tl.zeros([BK, BE], dtype=tl.float32)  # sum_j B_j v_j^T over the split (exp: in reference `ref`)
    norm = tl.zeros([BK], dtype=tl.float32)
    ref = tl.full([BK], -1e30, dtype=tl.float32)  # exp: the running per-feature key maximum
    for t in range(L // BT):  # L: a multiple of BT
        pos = i_s * L + t * BT + o_t
        key = _kept(keep, pos, s_mn, pos < M, HAS_KEEP)
        tile_key = key[:, None] & in_k[None, :]
        xk = _rows(k, pos, s_kn, o_k, tile_key)
        if EXP:
            xk, r_c, scale = _exp_reference(ref, xk, tile_key)
            state *= scale[:, None]
            norm *= scale
            bk = tl.exp(xk - r_c[None, :])  # 0 where masked
            ref = r_c
        else:
            bk = tl.where(tile_key, _phi(xk, PHI), 0.0)
        bk = _op(bk, RD, DT)
        vv = _op(_rows(v, pos, s_vn, o_e, key[:, None] & in_e[None, :]), RD, DT)
        state += tl.dot(tl.trans(bk), vv, input_precision=PRECISION)
        norm += tl.sum(bk.to(tl.float32), axis=0)
    part = i_bh * tl.num_programs(1) + i_s
    _store_state(kv_part, state, part, o_k, o_e, D, E)
    if i_e == 0:
        tl.store(z_part + part * D + o_k, norm, in_k)
        tl.store(mx_part + part * D + o_k, ref, in_k)


def _output_kernel(
    q, kv, zs, out,
    s_qb, s_qh, s_qn,
    H, N, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh, i_t, i_e = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # (b, h), queries, value block
    o_t, o_k, o_e, in_k, in_e, _ = _offsets(i_e, BT, BK, BE, D, E)
    pos = i_t * BT + o_t
    in_t = pos < N
    tile_k = in_t[:, None] & in_k[None, :]
    a, _ = _query_features(_rows(q + _head(i_bh, H, s_qb, s_qh), pos, s_qn, o_k, tile_k), in_k, tile_k, EXP, PHI)
    a = _op(a, RD, DT)
    num = tl.dot(a, _op(_state_tile(kv, i_bh, o_k, o_e, D, E), RD, DT), input_precision=PRECISION)  # (c, e)
    den = tl.sum(a.to(tl.float32) * tl.load(zs + i_bh * D + o_k, in_k, other=0.0)[None, :], axis=1)
    o = num / tl.where(den > 0, den, 1.0)[:, None]  # no key: num = 0, out = 0
    tl.store(out + i_bh * N * E + pos[:, None] * E + o_e[None, :], o, in_t[:, None] & in_e[None, :])


def _query_grads_kernel(
    q, dout, kv, zs, dq, dkv_part, dz_part,
    s_qb, s_qh, s_qn, s_db, s_dh, s_dn,
    H, N, D, E, L,
    EXP: tl.constexpr, PHI: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)  # (batch, head), split of the queries
    o_t, o_k, o_e, in_k, in_e, _ = _offsets(0, BT, BK, BE, D, E)
    q += _head(i_bh, H, s_qb, s_qh)
    dout += _head(i_bh, H, s_db, s_dh)
    dq += i_bh * N * D  # contiguous (b, h, n, d)
    kv_op = _op(_state_tile(kv, i_bh, o_k, o_e, D, E), RD, DT)  # S (d, e)
    norm = tl.load(zs + i_bh * D + o_k, in_k, other=0.0)  # z (d,)
    dstate = tl.zeros([BK, BE], dtype=tl.float32)  # sum_i A_i g_i^T over the split
    dnorm = tl.zeros([BK], dtype=tl.float32)  # sum_i r_i A_i
    for t in range(L // BT):
        pos = i_s * L + t * BT + o_t
        in_t = pos < N
        tile_k = in_t[:, None] & in_k[None, :]
        a, da_dx = _query_features(_rows(q, pos, s_qn, o_k, tile_k), in_k, tile_k, EXP, PHI)
        a = _op(a, RD, DT)
        num = tl.dot(a, kv_op, input_precision=PRECISION)  # (c, e)
        den = tl.sum(a.to(tl.float32) * norm[None, :], axis=1)
        seen = den > 0
        den = tl.where(seen, den, 1.0)  # as linear_ops._ratio
        g = _op(_rows(dout, pos, s_dn, o_e, in_t[:, None] & in_e[None, :]) / den[:, None], RD, DT)  # (c, e)
        r = tl.where(seen, -tl.sum(g.to(tl.float32) * num, axis=1) / den, 0.0)  # -(dout_i . out_i) / den_i
        da = tl.dot(g, tl.trans(kv_op), input_precision=PRECISION) + r[:, None] * norm[None, :]  # (c, d)
        tl.store(dq + pos[:, None] * D + o_k[None, :], (da * da_dx).to(dq.dtype.element_ty), tile_k)
        dstate += tl.dot(tl.trans(a), g, input_precision=PRECISION)
        dnorm += tl.sum(r[:, None] * a.to(tl.float32), axis=0)
    part = i_bh * tl.num_programs(1) + i_s
    _store_state(dkv_part, dstate, part, o_k, o_e, D, E)
    tl.store(dz_part + part * D + o_k, dnorm, in_k)


def _key_grads_kernel(
    k, v, keep, s_mb, s_mh, s_mn, dkv, dz, shift, k_ref, k_sum, dk, dv,
    s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
    H, M, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr, RD: tl.constexpr, DT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i_bh, i_t = tl.program_id(0).to(tl.int64), tl.program_id(1)  # (batch, head), keys
    o_t, o_k, o_e, in_k, in_e, _ = _offsets(0, BT, BK, BE, D, E)
    pos = i_t * BT + o_t
    in_t = pos < M
    tile_k = in_t[:, None] & in_k[None, :]
    tile_e = in_t[:, None] & in_e[None, :]
    key = _kept(keep + _head(i_bh, H, s_mb, s_mh), pos, s_mn, in_t, HAS_KEEP)
    tile_key = key[:, None] & in_k[None, :]
    xk = _rows(k + _head(i_bh, H, s_kb, s_kh), pos, s_kn, o_k, tile_k)
    if EXP:
        ref = tl.load(k_ref + i_bh * D + o_k, in_k, other=0.0)
        total = tl.load(k_sum + i_bh * D + o_k, in_k, other=1.0)  # 1 where no key
        b32 = tl.exp(tl.where(tile_key, xk, float("-inf")) - ref[None, :]) / total[None, :]
    else:
        b32 = tl.where(tile_key, _phi(xk, PHI), 0.0)
    vv = _op(_rows(v + _head(i_bh, H, s_vb, s_vh), pos, s_vn, o_e, tile_e), RD, DT)
    ds = _op(_state_tile(dkv, i_bh, o_k, o_e, D, E), RD, DT)  # dS (d, e)
    db = tl.dot(vv, tl.trans(ds), input_precision=PRECISION) + tl.load(dz + i_bh * D + o_k, in_k, other=0.0)[None, :]
    if EXP:  # through the softmax over the keys
        db = b32 * (db - tl.load(shift + i_bh * D + o_k, in_k, other=0.0)[None, :])
    else:
        db *= tl.where(tile_key, _phi_slope(xk, PHI), 0.0)
    tl.store(dk + i_bh * M * D + pos[:, None] * D + o_k[None, :], db.to(dk.dtype.element_ty), tile_k)
    dvv = tl.dot(_op(b32, RD, DT), ds, input_precision=PRECISION)  # (c, e)
    tl.store(dv + i_bh * M * E + pos[:, None] * E + o_e[None, :], dvv.to(dv.dtype.element_ty), tile_e)


def _step_kernel(
    q, k, v, keep, kv0, z0, m0, logd, out, kv1, z1, m1, s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_mb, s_mh, H, D, E,
    EXP: tl.constexpr, PHI: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_STATE: tl.constexpr, HAS_MAX: tl.constexpr,
    HAS_DECAY: tl.constexpr, BK: tl.constexpr, BE: tl.constexpr,
):  # fmt: skip
    """One token of generation for (batch, head) i_bh and value block i_e: the state (b*h, D, E) contiguous fp32
    decayed by g (logd (b*h,) log g; exp: its reference lowered by log g, as `linear_ops._decayed_state`) and updated
    with phi(k) v^T, the output phi(q) S / phi(q) z. exp: the keys scaled by the new running per-feature maximum (the
    state rescaled to it), the query shifted by max_f (q_f + M_f), as `linear_ops._causal_features`."""
    i_bh, i_e = tl.program_id(0), tl.program_id(1)
    o_k, o_e = tl.arange(0, BK), i_e * BE + tl.arange(0, BE)
    in_k, in_e = o_k < D, o_e < E
    row = i_bh.to(tl.int64) * D + o_k  # this head's entries of the (b*h, D) normaliser and key maxima
    xq = tl.load(q + _head(i_bh, H, s_qb, s_qh) + o_k, in_k, other=0.0).to(tl.float32)
    xk = tl.load(k + _head(i_bh, H, s_kb, s_kh) + o_k, in_k, other=0.0).to(tl.float32)
    xv = tl.load(v + _head(i_bh, H, s_vb, s_vh) + o_e, in_e, other=0.0).to(tl.float32)
    kept = tl.full((BK,), 1, tl.int1)
    if HAS_KEEP:
        kept = tl.full((BK,), 1, tl.int1) & (tl.load(keep + _head(i_bh, H, s_mb, s_mh)) != 0)
    tile = i_bh.to(tl.int64) * D * E + o_k[:, None] * E + o_e[None, :]
    in_s = in_k[:, None] & in_e[None, :]
    kv = tl.zeros((BK, BE), tl.float32)
    z = tl.zeros((BK,), tl.float32)
    log_g = 0.0
    if HAS_DECAY:
        log_g = tl.load(logd + i_bh).to(tl.float32)
    if HAS_STATE:
        kv = tl.load(kv0 + tile, in_s, other=0.0)
        z = tl.load(z0 + row, in_k, other=0.0)
        if HAS_DECAY and not EXP:
            kv = kv * tl.exp(log_g)
            z = z * tl.exp(log_g)
    if EXP:
        key = tl.where(kept, xk, float("-inf"))
        before = tl.full((BK,), float("-inf"), tl.float32)
        if HAS_MAX:
            before = tl.load(m0 + row, in_k, other=0.0) + log_g
        ref = tl.maximum(tl.maximum(before, key), -1e30)
        if HAS_STATE and HAS_MAX:
            scale = tl.exp(before - ref)
            kv = kv * scale[:, None]
            z = z * scale
        phi_k = tl.where(in_k & kept, tl.exp(key - ref), 0.0)
        fold = tl.where(in_k, xq + ref, float("-inf"))
        phi_q = tl.where(in_k, tl.exp(fold - tl.max(fold, 0)), 0.0)
    else:
        phi_k = tl.where(in_k & kept, _phi(xk, PHI), 0.0)
        phi_q = tl.where(in_k, _phi(xq, PHI), 0.0)
    kv = kv + phi_k[:, None] * xv[None, :]
    z = z + phi_k
    num = tl.sum(phi_q[:, None] * kv, 0)  # (BE,)
    den = tl.sum(phi_q * z, 0)
    tl.store(out + i_bh.to(tl.int64) * E + o_e, num / tl.where(den > 0, den, 1.0), in_e)
    tl.store(kv1 + tile, kv, in_s)
    if i_e == 0:
        tl.store(z1 + row, z, in_k)
        if EXP:
            tl.store(m1 + row, ref, in_k)

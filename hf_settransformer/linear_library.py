"""The linear ops as `torch.library` custom ops: `torch.compile(fullgraph=True)` and `torch.export` keep each as one
node of their graphs, forward and backward, and call it; nothing in it is traced or decomposed. fla wraps its
kernels in `torch.compiler.disable`, which breaks the graph; Inductor's compilation of the PyTorch ops of a chunked
scan is slow, and for exp with a prefix it failed on triton 3.6. `linear_ops` decides which calls go through these
ops (`linear_ops.through_op`); it computes the others inline.

One op per entry point, each with one body for every device (namespace `NAMESPACE`):

- `causal_linear_attention(q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, feature_map, chunk_size, prefix_length,
  fused) -> (out, kv1, z1, m1)`: causal, continuing a carried state (kv0, z0, m0), with leading keys (m > n) and a
  bidirectional prefix (`prefix_length`): the many-target heads; or over a packed row's sequences (`seq_idx` (b, n),
  with no carried state, no leading keys and no prefix);
- `linear_attention(q, k, v, keep, feature_map, fused) -> (out, kv, z, k_ref, k_sum)`: non-causal;
- `linear_attention_step(q, k, v, mask, drop, kv0, z0, m0, logd, feature_map, fused) -> (out, kv1, z1, m1)`: one
  token of generation; no autograd (the linear ops send a step whose inputs need gradients to PyTorch inline);
- `causal_linear_attention_backward`, `linear_attention_backward`: the first two's gradients, themselves ops, so a
  compiled backward graph holds them whole as well.

`fused` is `linear_ops.use_triton`'s choice, made before the call and passed in (a constant of a compiled graph): True
runs the Triton kernels of `linear_triton.py`, False the PyTorch ops of `linear_torch.py`. Where the Triton kernels
have a backward of their own (causal without leading keys, non-causal) the backward op runs it from the inputs (and
the forward's extra outputs); elsewhere it recomputes the forward with autograd and differentiates that (the PyTorch
ops; the prefix's fold of its leading keys). Shapes and arguments as in `linear_ops`: `mask` (b, m) the key mask,
`drop` (b, h, m) key dropout's kept keys, `logd` (b, h, m) the log-decay as `linear_ops._log_decay` gives it (0 at
padding), kv0 (b,h,d,e) / z0 (b,h,d) / m0 (b,h,d) the carried state, any of them None. Outputs are fp32; an
elementwise map's m1 is FLOOR everywhere (its state has no key maxima); absent extra outputs and gradients are
empty (0,) tensors.

The namespace is "hfst" in the installed package; a checkpoint's copy of these files, imported as remote code under
another module name, registers its ops under a namespace of its own, so two copies never claim one name.
"""

import contextlib
import hashlib
from typing import Optional

import torch
from torch import Tensor

from .linear_torch import EXP_CHUNK_SPREAD
from .linear_torch import causal_linear_attention as torch_causal
from .linear_torch import linear_attention as torch_linear
from .linear_torch import linear_attention_step as torch_step
from .linear_torch import prefix_causal_linear_attention as torch_prefix
from .linear_triton import (
    FLOOR,
    causal_backward,
    causal_forward,
    causal_masks,
    fused_causal_linear_attention,
    fused_linear_attention_step,
    noncausal_backward,
    noncausal_forward,
)
from .cache import LinearAttentionState
from .feature_maps import get_feature_map

NAMESPACE = (
    "hfst"
    if __name__ == "hf_settransformer.linear_library"
    else "hfst_" + hashlib.sha1(__name__.encode()).hexdigest()[:12]
)
FUSED_CHUNK = 64  # the chunk the fused causal kernels are asked for (they cut their own blocks within it)


def _empty(like):
    """An absent output or gradient: a (0,) fp32 tensor on `like`'s device."""
    return like.new_empty(0, dtype=torch.float32)


def _like(x, dtype=None):
    """A contiguous tensor of `x`'s shape, device and dtype (or `dtype`): a gradient as the backward ops return it."""
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


def _or_empty(x, like):
    return _empty(like) if x is None else x


def _state(kv0, z0, m0):
    return None if kv0 is None else LinearAttentionState(kv=kv0, z=z0, k_max=m0)


def _own(outputs, inputs):
    """An op's outputs as a custom op must return them: contiguous (as the fake ones), none sharing an input's
    memory (a state passed through unchanged is copied)."""
    taken = [x if x._base is None else x._base for x in inputs if x is not None]
    outputs = [x.contiguous() for x in outputs]
    shared = (any(x is t or x._base is t for t in taken) for x in outputs)
    return tuple(x.clone() if s else x for x, s in zip(outputs, shared))


def _state_outputs(q, v):
    """The fake outputs of the causal and step ops: out (b, h, n, e), kv1 (b, h, d, e), z1, m1 (b, h, d), fp32."""
    (b, h, n, d), e = q.shape, v.shape[-1]
    f32 = {"dtype": torch.float32}
    return (
        q.new_empty(b, h, n, e, **f32), q.new_empty(b, h, d, e, **f32), q.new_empty(b, h, d, **f32),
        q.new_empty(b, h, d, **f32),
    )  # fmt: skip


def _reference(state, like, fmap):
    """A state's key maxima as the ops return them: FLOOR (b, h, d) for an elementwise map's state."""
    if state.k_max is not None and fmap.stabilised:
        return state.k_max
    return torch.full(like.shape, FLOOR, device=like.device, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# causal (with a carried state, leading keys and a bidirectional prefix)


def _fused_causal(q, k, v, mask, state, fmap, chunk_size, drop, logd, seq_idx=None):
    """The Triton causal kernels in `linear_torch`'s causal signature (with autograd): the prefix's rest."""
    return fused_causal_linear_attention(
        q, k, v, mask, state, feature_map=fmap.name, drop=drop, spread=EXP_CHUNK_SPREAD, decay=logd, seq_idx=seq_idx
    )


def _sync_free_causal(q, k, v, mask, state, fmap, chunk_size, drop, logd, seq_idx=None):
    """The PyTorch causal op with no host read (an op's body may run inside a CUDA graph)."""
    return torch_causal(q, k, v, mask, state, fmap, chunk_size, drop, logd, sync_free=True, seq_idx=seq_idx)


def _causal_with_autograd(q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, fmap, chunk_size, prefix_length, fused):
    """The causal op's forward as autograd functions (the PyTorch ops, or the prefix's fold and the fused kernels):
    what the backward op differentiates where the Triton kernels' own backward does not apply."""
    causal = _fused_causal if fused else _sync_free_causal
    state = _state(kv0, z0, m0)
    if k.shape[2] == q.shape[2] and not prefix_length:
        out, state = causal(q, k, v, mask, state, fmap, chunk_size, drop, logd, seq_idx)
    else:
        _refuse_packed_prefix(seq_idx)
        out, state = torch_prefix(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, logd, causal)
    return out, state.kv, state.z, _reference(state, state.z, fmap)


def _refuse_packed_prefix(seq_idx):
    if seq_idx is not None:
        raise ValueError(
            "The causal op takes `seq_idx` (packed sequences) only with one key per query and no prefix "
            "(prefix_length=0); pass seq_idx=None here."
        )


def _kernels_own_backward(q, k, prefix_length, fused):
    return fused and k.shape[2] == q.shape[2] and not prefix_length


def _triton_causal_args(q, k, v, mask, drop, kv0, z0, m0, fmap):
    """`linear_triton.causal_forward`'s and `causal_backward`'s leading arguments from the op's."""
    keep, real = causal_masks(mask, drop, fmap)
    if kv0 is not None:
        kv0, z0 = kv0.float(), z0.float()
    m0 = m0.float() if kv0 is not None and fmap.stabilised and m0 is not None else None
    return q, k.to(q.dtype), v.to(q.dtype), keep, real, kv0, z0, m0


def _causal_body(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    drop: Optional[Tensor],
    kv0: Optional[Tensor],
    z0: Optional[Tensor],
    m0: Optional[Tensor],
    logd: Optional[Tensor],
    seq_idx: Optional[Tensor],
    feature_map: str,
    chunk_size: int,
    prefix_length: int,
    fused: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    fmap = get_feature_map(feature_map)
    if _kernels_own_backward(q, k, prefix_length, fused):
        args = _triton_causal_args(q, k, v, mask, drop, kv0, z0, m0, fmap)
        return causal_forward(*args, logd, fmap, FUSED_CHUNK, EXP_CHUNK_SPREAD, seq_idx=seq_idx)
    with torch.no_grad():
        outputs = _causal_with_autograd(
            q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, fmap, chunk_size, prefix_length, fused
        )
    return _own(outputs, (q, k, v, kv0, z0, m0, logd))


causal_linear_attention = torch.library.custom_op(f"{NAMESPACE}::causal_linear_attention", mutates_args=())(
    _causal_body
)


@causal_linear_attention.register_fake
def _(q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, feature_map, chunk_size, prefix_length, fused):
    return _state_outputs(q, v)


def _causal_backward_body(
    dout: Tensor,
    dkv1: Tensor,
    dz1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    drop: Optional[Tensor],
    kv0: Optional[Tensor],
    z0: Optional[Tensor],
    m0: Optional[Tensor],
    logd: Optional[Tensor],
    seq_idx: Optional[Tensor],
    kv1: Tensor,
    z1: Tensor,
    feature_map: str,
    chunk_size: int,
    prefix_length: int,
    fused: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    fmap = get_feature_map(feature_map)
    if _kernels_own_backward(q, k, prefix_length, fused):
        args = _triton_causal_args(q, k, v, mask, drop, kv0, z0, m0, fmap)
        dq, dk, dv, dkv0, dz0, dlogd = causal_backward(
            dout, dkv1, dz1, *args, logd, kv1, z1, fmap, FUSED_CHUNK, EXP_CHUNK_SPREAD, seq_idx=seq_idx
        )
        grads = (dq, dk.to(k.dtype), dv.to(v.dtype), dkv0, dz0, dlogd)
    else:
        inputs = (q, k, v, kv0, z0, logd)
        grads = _recomputed_grads(
            lambda q, k, v, kv0, z0, logd: _causal_with_autograd(
                q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, fmap, chunk_size, prefix_length, fused
            )[:3],
            inputs,
            (dout, dkv1, dz1),
        )
    return tuple(_or_empty(None if g is None else g.contiguous(), q) for g in grads)


causal_linear_attention_backward = torch.library.custom_op(
    f"{NAMESPACE}::causal_linear_attention_backward", mutates_args=()
)(_causal_backward_body)


@causal_linear_attention_backward.register_fake
def _(
    dout, dkv1, dz1, q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, kv1, z1, feature_map, chunk_size, prefix_length,
    fused,
):
    return (
        *(_like(x) for x in (q, k, v)),
        *(_or_empty(None if x is None else _like(x, torch.float32), q) for x in (kv0, z0, logd)),
    )  # fmt: skip


def _causal_setup(ctx, inputs, output):
    q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, feature_map, chunk_size, prefix_length, fused = inputs
    _, kv1, z1, m1 = output
    ctx.save_for_backward(q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, kv1, z1)
    ctx.options = (feature_map, chunk_size, prefix_length, fused)
    ctx.mark_non_differentiable(m1)  # the key maxima: a constant of the function, out of autograd


def _causal_backward(ctx, dout, dkv1, dz1, _dm1):  # unused outputs' gradients arrive as zeros (materialised)
    q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, kv1, z1 = ctx.saved_tensors
    dq, dk, dv, dkv0, dz0, dlogd = causal_linear_attention_backward(
        dout, dkv1, dz1, q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, kv1, z1, *ctx.options
    )
    present = (None if x is None else g for x, g in ((kv0, dkv0), (z0, dz0), (logd, dlogd)))
    dkv0, dz0, dlogd = present
    return dq, dk, dv, None, None, dkv0, dz0, None, dlogd, None, None, None, None, None


causal_linear_attention.register_autograd(_causal_backward, setup_context=_causal_setup)


# ---------------------------------------------------------------------------------------------------------------
# non-causal


def _noncausal_keep(keep):
    return None if keep is None else keep[:, None, :] if keep.dim() == 2 else keep  # (b, 1 or h, m)


def _noncausal_body(
    q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], feature_map: str, fused: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    fmap = get_feature_map(feature_map)
    if fused:
        out, kv, z, k_ref, k_sum = noncausal_forward(
            q, k.to(q.dtype), v.to(q.dtype), _noncausal_keep(keep), fmap, FUSED_CHUNK, None
        )
        return out, kv, z, _or_empty(k_ref, q), _or_empty(k_sum, q)
    with torch.no_grad():
        out = torch_linear(q, k, v, keep, fmap)
    return out.contiguous(), _empty(q), _empty(q), _empty(q), _empty(q)


linear_attention = torch.library.custom_op(f"{NAMESPACE}::linear_attention", mutates_args=())(_noncausal_body)


@linear_attention.register_fake
def _(q, k, v, keep, feature_map, fused):
    (b, h, n, d), e = q.shape, v.shape[-1]
    f32 = {"dtype": torch.float32}
    out = q.new_empty(b, h, n, e, **f32)
    if not fused:
        return out, _empty(q), _empty(q), _empty(q), _empty(q)
    exp = get_feature_map(feature_map).stabilised
    reference = (lambda: q.new_empty(b, h, d, **f32)) if exp else (lambda: _empty(q))
    return out, q.new_empty(b, h, d, e, **f32), q.new_empty(b, h, d, **f32), reference(), reference()


def _noncausal_backward_body(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Optional[Tensor],
    kv: Tensor,
    z: Tensor,
    k_ref: Tensor,
    k_sum: Tensor,
    feature_map: str,
    fused: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    fmap = get_feature_map(feature_map)
    if fused:
        exp = fmap.stabilised
        dq, dk, dv = noncausal_backward(
            dout, q, k.to(q.dtype), v.to(q.dtype), _noncausal_keep(keep), kv, z, k_ref if exp else None,
            k_sum if exp else None, fmap, FUSED_CHUNK, None,
        )  # fmt: skip
        return dq, dk.to(k.dtype), dv.to(v.dtype)
    grads = _recomputed_grads(lambda q, k, v: (torch_linear(q, k, v, keep, fmap),), (q, k, v), (dout,))
    return tuple(g.contiguous() for g in grads)


linear_attention_backward = torch.library.custom_op(f"{NAMESPACE}::linear_attention_backward", mutates_args=())(
    _noncausal_backward_body
)


@linear_attention_backward.register_fake
def _(dout, q, k, v, keep, kv, z, k_ref, k_sum, feature_map, fused):
    return _like(q), _like(k), _like(v)


def _noncausal_setup(ctx, inputs, output):
    q, k, v, keep, feature_map, fused = inputs
    ctx.save_for_backward(q, k, v, keep, *output[1:])
    ctx.options = (feature_map, fused)
    ctx.mark_non_differentiable(*output[1:])


def _noncausal_backward(ctx, dout, *_):
    q, k, v, keep, kv, z, k_ref, k_sum = ctx.saved_tensors
    dq, dk, dv = linear_attention_backward(dout, q, k, v, keep, kv, z, k_ref, k_sum, *ctx.options)
    return dq, dk, dv, None, None, None


linear_attention.register_autograd(_noncausal_backward, setup_context=_noncausal_setup)


# ---------------------------------------------------------------------------------------------------------------
# one step of generation (no autograd)


def _step_body(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    drop: Optional[Tensor],
    kv0: Optional[Tensor],
    z0: Optional[Tensor],
    m0: Optional[Tensor],
    logd: Optional[Tensor],
    feature_map: str,
    fused: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    fmap = get_feature_map(feature_map)
    state = _state(kv0, z0, m0 if fmap.stabilised else None)
    if fused:
        out, state = fused_linear_attention_step(q, k, v, mask, state, feature_map=feature_map, drop=drop, decay=logd)
    else:
        out, state = torch_step(q, k, v, mask, state, fmap, drop, logd)
    return _own((out, state.kv, state.z, _reference(state, state.z, fmap)), (q, k, v, kv0, z0, m0, logd))


linear_attention_step = torch.library.custom_op(f"{NAMESPACE}::linear_attention_step", mutates_args=())(_step_body)


@linear_attention_step.register_fake
def _(q, k, v, mask, drop, kv0, z0, m0, logd, feature_map, fused):
    return _state_outputs(q, v)


# ---------------------------------------------------------------------------------------------------------------


def _recomputed_grads(forward, inputs, grads):
    """The gradients of `forward(*inputs)` (a tuple of tensors, computed again with autograd) with respect to
    `inputs` (floating tensors or None), given the gradients of its outputs: None for an absent input, zeros for one
    the outputs do not depend on. An op's body runs below autograd, its dispatch keys excluded: they are let back in
    for the recomputation."""
    with _autograd_inside_op(), torch.enable_grad():
        leaves = tuple(None if x is None else x.detach().requires_grad_() for x in inputs)
        outputs = forward(*leaves)
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        wanted = [x for x in leaves if x is not None]
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
    found = iter(torch.zeros_like(x) if g is None else g for x, g in zip(wanted, found))
    return [None if x is None else next(found) for x in leaves]


@contextlib.contextmanager
def _autograd_inside_op():
    keys = torch._C.DispatchKey
    with (
        torch._C._SetExcludeDispatchKeyGuard(keys.AutogradFunctionality, False),
        torch._C._SetExcludeDispatchKeyGuard(keys.AutogradOther, False),
    ):
        yield


def causal_op(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, logd, fused, seq_idx=None):
    """The causal op on the linear ops' arguments -> (out (b,h,n,e) fp32, `LinearAttentionState`)."""
    kv0, z0, m0 = (None, None, None) if state is None else (state.kv, state.z, state.k_max)
    out, kv1, z1, m1 = causal_linear_attention(
        q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, fmap.name, chunk_size, prefix_length, fused
    )
    return out, LinearAttentionState(kv=kv1, z=z1, k_max=m1 if fmap.stabilised else None)


def noncausal_op(q, k, v, keep, fmap, fused):
    """The non-causal op: keep (b, m) or (b, h, m) the keys used, or None -> out (b,h,n,e) fp32."""
    return linear_attention(q, k, v, keep, fmap.name, fused)[0]


def step_op(q, k, v, mask, state, fmap, drop, logd, fused):
    """The step op -> (out (b,h,1,e) fp32, the new `LinearAttentionState`)."""
    kv0, z0, m0 = (None, None, None) if state is None else (state.kv, state.z, state.k_max)
    out, kv1, z1, m1 = linear_attention_step(q, k, v, mask, drop, kv0, z0, m0, logd, fmap.name, fused)
    return out, LinearAttentionState(kv=kv1, z=z1, k_max=m1 if fmap.stabilised else None)

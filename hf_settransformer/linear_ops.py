"""The linear attention ops: one signature, checked arguments, and the choice of implementation, made once per call:
the PyTorch ops of `linear_torch.py` (fp32, with autograd), or the fused Triton kernels of `linear_triton.py`
(`use_triton`), called inline or through the `torch.library` custom ops of `linear_library.py` (`through_op`), which
a compiled graph keeps whole.

Shape legend: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim.

Every op has one signature, `op(q, k, v, mask=None, state=None, *, feature_map="elu", ...) -> (out, state)`:
q (b,h,n,d), k (b,h,m,d), v (b,h,m,e) -> out (b,h,n,e) fp32; `mask` the (b, m) key mask (True for real keys) or
None; `state` a `LinearAttentionState` (what earlier keys contribute) or None, which the causal ops continue and
return; `feature_map` a name in `feature_maps.FEATURE_MAPS`, whose entry says how phi is computed. Causal attention
runs in chunks (quadratic inside a chunk, a d x e state carried between chunks), so no n x d x e tensor is built;
`linear_attention_step` advances the same state one token at a time (the RNN view of Katharopoulos et al. 2020).

The causal ops take an optional `decay` (b,h,m): log g_t <= 0 per head and key position, the state's decay
S_t = g_t S_{t-1} + phi(k_t) v_t^T (and the normaliser likewise): key j weighs exp(G_i - G_j) at query i, G the
cumulative log-decay (RetNet's fixed per-head gamma, Sun et al. 2023; simple GLA's gate, Yang et al. 2024). Inside a
chunk the decay is a mask of cumulative log-gates, between chunks a scaled state. A masked (padding) position does not
decay (padding is not time); a dropped key still does. Non-causal attention has no order to decay along: refused.
The naive float64 references these ops are tested against are in `linear_naive.py`.

`causal_linear_attention` also takes a packed batch (transformers' `DataCollatorWithFlattening`: sequences
concatenated into one row, b = 1): `seq_idx` (b, n) int32/int64, each position's sequence, a new sequence wherever it
changes (non-decreasing ids, as positions restarting at 0 give). Query i sees key j <= i only in its own sequence:
the state (and exp's key maxima, and a decay) restarts at every boundary, so each sequence gets what it gets alone.
It carries no cache (`state` must be None); the returned state is the last sequence's. The prefix op and the step
refuse it.

Which path runs where (eager or compiled, CPU or CUDA, by precision): the table in the README's "Install and test";
`HFST_DISABLE_TRITON=1` takes the kernels out, `HFST_FORCE_TRITON=1` takes them for fp32 and CPU tensors too
(triton's interpreter on CPU: the tests).
"""

import torch

from .linear_library import causal_op, noncausal_op, step_op
from .linear_torch import causal_linear_attention as torch_causal
from .linear_torch import linear_attention as torch_linear
from .linear_torch import linear_attention_step as torch_step
from .linear_torch import prefix_causal_linear_attention as torch_prefix
from .linear_torch import with_dropped
from .cache import LinearAttentionState
from .feature_maps import get_feature_map
from .linear_triton import fused_decay_available, fused_linear_attention_available, fused_sequences_available


def _check_drop(drop, k):
    """Key dropout's mask must be a bool (b, h, m) tensor, one entry per head and key of `k` (b, h, m, d)."""
    if drop is not None and (drop.dtype != torch.bool or drop.shape != k.shape[:3]):
        raise ValueError(
            f"`drop` must be a bool tensor of shape {tuple(k.shape[:3])} (batch, heads, keys): the keys key dropout "
            f"keeps; got {drop.dtype} of shape {tuple(drop.shape)}."
        )


def _check_op_inputs(op, q, k, mask, state, drop, feature_map, decay=None):
    """The arguments every op shares, checked by type and shape (no value is read): `feature_map` a `FEATURE_MAPS`
    name, whose entry this returns, `mask` a (b, m) key mask tensor, `state` a `LinearAttentionState` (with key maxima
    for a stabilised map), `drop` a (b, h, m) bool tensor."""
    fmap = get_feature_map(feature_map)
    if mask is not None:
        if not torch.is_tensor(mask):
            raise TypeError(
                f"`mask` of {op} is the (batch, keys) key mask, a tensor or None; got a {type(mask).__name__}. The "
                "linear ops take (q, k, v, mask, state)."
            )
        if mask.dim() != 2 or tuple(mask.shape) != (k.shape[0], k.shape[2]):
            raise ValueError(
                f"`mask` of {op} must have shape {(k.shape[0], k.shape[2])} (batch, keys); got {tuple(mask.shape)}."
            )
    if state is not None and not isinstance(state, LinearAttentionState):
        raise TypeError(f"`state` of {op} must be a LinearAttentionState or None; got a {type(state).__name__}.")
    if state is not None and fmap.stabilised and state.k_max is None:
        raise ValueError(
            f"{op} with feature_map={fmap.name!r} needs a state with the key maxima its sums are scaled by (`k_max`); "
            "this state has none: an unstabilised feature map's state."
        )
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, heads and head dim (b, h, *, d)."
        )
    _check_drop(drop, k)
    if decay is not None and (
        not torch.is_tensor(decay) or not decay.is_floating_point() or tuple(decay.shape) != tuple(k.shape[:3])
    ):
        raise ValueError(
            f"`decay` of {op} must be a float tensor of shape {tuple(k.shape[:3])} (batch, heads, keys): each key "
            f"position's log-decay log g <= 0; got {_describe(decay)}."
        )
    return fmap


def _check_seq_idx(op, seq_idx, q, state):
    """A packed row's `seq_idx`: an int32/int64 (b, n) tensor on the queries' device (its values are not read), and no
    carried state."""
    if seq_idx is None:
        return
    if (
        not torch.is_tensor(seq_idx)
        or seq_idx.dtype not in (torch.int32, torch.int64)
        or tuple(seq_idx.shape) != (q.shape[0], q.shape[2])
        or seq_idx.device != q.device
    ):
        raise ValueError(
            f"`seq_idx` of {op} must be an int32 or int64 tensor of shape {(q.shape[0], q.shape[2])} (batch, tokens) "
            f"on {q.device}: each position's sequence in a packed row; got {_describe(seq_idx)}"
            + (f" on {seq_idx.device}." if torch.is_tensor(seq_idx) else ".")
        )
    if state is not None:
        raise ValueError(
            f"{op}: `seq_idx` (a packed batch) carries no cache: pass state=None (each sequence starts from nothing)."
        )


def _refuse_seq_idx(op, seq_idx):
    if seq_idx is not None:
        raise ValueError(
            f"`{op}` does not take `seq_idx` (packed sequences): pass seq_idx=None; `causal_linear_attention` takes it."
        )


def _describe(x):
    return f"{x.dtype} of shape {tuple(x.shape)}" if torch.is_tensor(x) else f"a {type(x).__name__}"


def _log_decay(decay, mask):
    """The ops' log-decay (b, h, m) in float32, 0 at masked (padding) positions: padding is not time. None: none."""
    if decay is None:
        return None
    decay = decay.float()
    return decay if mask is None else decay.masked_fill(~mask[:, None, :], 0.0)


def use_triton(q, k, v, state, fmap, step=False, decay=None, seq_idx=None):
    """The Triton-or-PyTorch choice, made once at the top of each op and passed down (into the custom op as its
    `fused` argument): the fused kernels where they have code for the feature map `fmap` and take these inputs
    (`linear_triton.fused_linear_attention_available`: CUDA or forced, dtypes, head dims, the environment, triton
    installed); for the one-token `step`, which has no matrix product and so also takes fp32, only where no gradient
    is needed (the fused step has no backward); for a packed row (`seq_idx`) only where the kernels take one."""
    if step and _needs_grad(q, k, v, state, decay):
        return False
    if seq_idx is not None and not fused_sequences_available():
        return False
    if decay is not None and not fused_decay_available(fmap.name):
        return False
    return fused_linear_attention_available(q, fmap.name, v, dots=not step)


def through_op(q, fused):
    """Whether an op runs through its `linear_library` custom op rather than inline: wherever the Triton kernels run
    (`fused`), and under torch.compile on any device but the CPU, where the graph then holds the op (Inductor's own
    code for these scans is slow on a GPU, and for exp with a prefix it failed on triton 3.6). On the CPU Inductor
    compiles the PyTorch ops themselves, fusing their elementwise work (an op would run them eagerly and recompute
    its forward for the backward)."""
    return fused or (torch.compiler.is_compiling() and q.device.type != "cpu")


def _needs_grad(q, k, v, state, decay=None):
    """Whether a step's result needs autograd (the fused step has none; generation never does)."""
    tensors = [q, k, v] + ([] if state is None else [state.kv, state.z]) + ([] if decay is None else [decay])
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ---------------------------------------------------------------------------------------------------------------


def linear_attention(q, k, v, mask=None, state=None, *, feature_map="elu", drop=None, decay=None):
    """Non-causal linear attention: every query sees every (real, kept) key. q (b,h,n,d), k (b,h,m,d), v (b,h,m,e),
    mask (b,m), drop (b,h,m) -> (out (b,h,n,e) fp32, None). `state` must be None: a non-causal op carries no state.
    A stabilised map (exp) is Shen et al.'s efficient attention: a softmax over the features for queries and over the
    sequence for keys (the denominator is then exactly 1)."""
    fmap = _check_op_inputs("linear_attention", q, k, mask, state, drop, feature_map)
    if state is not None:
        raise ValueError(
            "`linear_attention` is non-causal and carries no state: pass state=None (the causal ops continue one)."
        )
    if decay is not None:
        raise ValueError(
            "`linear_attention` is non-causal: its keys have no order to decay along; pass decay=None (the causal "
            "ops take one)."
        )
    keep = with_dropped(mask, drop)
    fused = use_triton(q, k, v, state, fmap) and q.shape[2] > 0 and k.shape[2] > 0  # the kernels need both
    if through_op(q, fused):
        return noncausal_op(q, k, v, keep, fmap, fused), None
    return torch_linear(q, k, v, keep, fmap), None


def causal_linear_attention(
    q, k, v, mask=None, state=None, *, feature_map="elu", chunk_size=64, drop=None, decay=None, seq_idx=None
):
    """Causal linear attention in chunks: query i sees keys j <= i (and everything in `state`).

    q, k (b,h,n,d), v (b,h,n,e), mask (b,n) -> (out (b,h,n,e) fp32, LinearAttentionState after the last token).
    `state` continues from earlier tokens (chunked prefill, generation). `drop` (b,h,n) bool: the keys key dropout
    keeps; a dropped key is left out of every sum as a masked one is, but its own query still reads the others.
    A stabilised map (exp) cannot normalise keys over the sequence (that would read the future): it is the ratio
    phi(q) S / phi(q) z with phi = exp, stabilised by key maxima that never look ahead
    (`linear_torch._causal_exp_linear_attention`). `decay` (b,h,n): each position's log-decay (see the module's
    docstring), or None. `seq_idx` (b,n): a packed row's sequences (see the module's docstring), or None: one.
    """
    fmap = _check_op_inputs("causal_linear_attention", q, k, mask, state, drop, feature_map, decay)
    _check_seq_idx("causal_linear_attention", seq_idx, q, state)
    return _causal(q, k, v, mask, state, fmap, chunk_size, 0, drop, decay, seq_idx)


def _causal(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, decay, seq_idx=None):
    fused = use_triton(q, k, v, state, fmap, decay=decay, seq_idx=seq_idx)
    logd = _log_decay(decay, mask)
    if through_op(q, fused):
        return causal_op(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, logd, fused, seq_idx=seq_idx)
    if k.shape[2] == q.shape[2] and not prefix_length:
        return torch_causal(q, k, v, mask, state, fmap, chunk_size, drop, logd, seq_idx=seq_idx)
    return torch_prefix(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, logd)


def prefix_causal_linear_attention(
    q, k, v, mask=None, state=None, *, feature_map="elu", chunk_size=64, prefix_length=0, drop=None, decay=None,
    seq_idx=None,
):
    """Causal linear attention whose first keys are seen by every query (`AttentionMask.prefix_length`, and the
    m - n leading keys of a causal cross-attention): q (b,h,n,d), k (b,h,m,d), v (b,h,m,e), mask (b,m) ->
    (out (b,h,n,e) fp32, LinearAttentionState after the last key). `drop` (b,h,m): the keys key dropout keeps, as in
    `causal_linear_attention`; `state`: earlier keys, seen by every query.

    The K = m - n + prefix_length leading keys are folded into one state (continuing `state`); the first
    `prefix_length` queries read that state alone (the bidirectional prefix), the others continue it causally, in
    the fused kernels where `use_triton` says (which take the prefix's state as a carried state and give it its
    gradients). `decay` (b,h,m): as in `causal_linear_attention`, over the m key positions (the queries are the last
    n). The leading keys decay to where they end, where the prefix's queries read them: the bidirectional prefix is
    one step of the decay, as it is one state. `seq_idx` must be None (no packed rows here)."""
    fmap = _check_op_inputs("prefix_causal_linear_attention", q, k, mask, state, drop, feature_map, decay)
    _refuse_seq_idx("prefix_causal_linear_attention", seq_idx)
    n, m = q.shape[2], k.shape[2]
    if not 0 <= prefix_length <= n or m - n + prefix_length < 0:
        raise ValueError(
            f"`prefix_causal_linear_attention` needs 0 <= prefix_length <= n and one key per query after the prefix "
            f"(m - n + prefix_length >= 0); got n={n} queries, m={m} keys, prefix_length={prefix_length}."
        )
    return _causal(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, decay)


def linear_attention_step(
    q, k, v, mask=None, state=None, *, feature_map="elu", drop=None, decay=None, seq_idx=None
):
    """One causal step (the RNN view): q, k (b,h,1,d), v (b,h,1,e), mask (b,1) -> (out (b,h,1,e), new state).

    Cost and memory are independent of the number of tokens already in `state`. Where `use_triton` says (it needs no
    gradient: generation), one fused kernel computes it (`linear_triton.fused_linear_attention_step`).
    No branch on values and no host read:
    it compiles to one graph (`torch.compile(fullgraph=True)`), the same at every step; a `RecurrentStateLayer` built
    with `static=True` copies the new state into fixed buffers, which CUDA graphs replay on.
    `decay` (b,h,1): the token's log-decay, applied to `state` before the token is added. `seq_idx` must be None (a
    packed batch carries no cache to step).
    """
    fmap = _check_op_inputs("linear_attention_step", q, k, mask, state, drop, feature_map, decay)
    _refuse_seq_idx("linear_attention_step", seq_idx)
    if q.shape[2] != 1 or k.shape[2] != 1:
        raise ValueError(
            f"`linear_attention_step` takes one token; got {q.shape[2]} queries and {k.shape[2]} keys "
            "(use causal_linear_attention for several)."
        )
    fused = use_triton(q, k, v, state, fmap, step=True, decay=decay)
    logd = _log_decay(decay, mask)
    if through_op(q, fused) and not _needs_grad(q, k, v, state, decay):  # the step op has no backward
        return step_op(q, k, v, mask, state, fmap, drop, logd, fused)
    return torch_step(q, k, v, mask, state, fmap, drop, logd)

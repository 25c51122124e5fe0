"""The linear ops in PyTorch: fp32 whatever autocast says (their sums over the sequence overflow in fp16), with
autograd, on any device. `linear_ops` calls them where the Triton kernels do not run (`linear_ops.use_triton`); the
custom ops of `linear_library.py` run them as their PyTorch implementation. Arguments arrive checked, the feature map
as its `FEATURE_MAPS` entry and a decay as the log-decay `linear_ops._log_decay` gives (0 at padding).

Shape legend: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim, c chunk length,
k number of chunks. Causal attention runs in chunks (quadratic inside a chunk, a d x e state carried between chunks),
so no n x d x e tensor is built; the step advances the same state one token at a time. With a decay (log g_t <= 0
per head and key position) key j weighs exp(G_i - G_j) at query i, G the cumulative log-decay: inside a chunk a mask
of cumulative log-gates, between chunks a scaled state. No decay is a log-decay of zero: each op has one path, which
skips the decay's factors (all 1) where `logd` is None. The float64 references are in `linear_naive.py`.

A packed row (several sequences concatenated, `seq_idx` (b, n) the sequence of each position, a new one wherever it
changes) restarts the causal ops at every boundary: inside a chunk the quadratic form is also masked to the same
sequence, the carried state reaches only the queries of the sequence it holds, and a chunk with a boundary hands on
only its last sequence's keys (the scan's factor is 0 there: a reset, not a decay). The exp map's key maxima are
running maxima over each sequence alone (`_sequence_running_max`, a scan of log n steps).
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .cache import LinearAttentionState


def _ratio(num, den):
    """num / den, and 0 where den is 0 (a query that sees no real key); no floor that would bias tiny denominators."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _no_autocast(tensor):
    """The linear kernels run in float32 whatever autocast says: their sums over the sequence overflow in fp16."""
    return torch.autocast(device_type=tensor.device.type, enabled=False)


def _keep(key_mask):
    """A linear kernel's key mask, (b, m) (every head) or (b, h, m) (per head), as a (b, 1 or h, m, 1) multiplier."""
    return None if key_mask is None else (key_mask[:, None, :, None] if key_mask.dim() == 2 else key_mask[..., None])


def _decayed_state(state, log_g, fmap):
    """`state` decayed by log g (b, h): sums scaled by g; a stabilised map's sums are kept and their reference
    lowered by log g instead (its sums are stored divided by exp(k_max)), which never under- or overflows."""
    if state is None or log_g is None:
        return state
    if fmap.stabilised:
        return LinearAttentionState(kv=state.kv, z=state.z, k_max=state.k_max + log_g[..., None])
    g = torch.exp(log_g)
    return LinearAttentionState(kv=state.kv * g[..., None, None], z=state.z * g[..., None], k_max=state.k_max)


def with_dropped(key_mask, drop):
    """The key mask (b, m) or None, and key dropout's kept keys (b, h, m) or None -> the keys to use, (b, h, m)."""
    if drop is None:
        return key_mask
    return drop if key_mask is None else drop & key_mask[:, None, :]


def _linear_attention(q, k, v, key_mask, fmap):
    keep = _keep(key_mask)  # (b, 1 or h, m, 1)
    if not fmap.stabilised:
        phi_q, phi_k = fmap.phi(q), fmap.phi(k)
        if keep is not None:
            phi_k = phi_k * keep
    else:  # Shen et al.: softmax over features for queries, over the sequence for keys
        phi_q = torch.softmax(q, dim=-1)
        if keep is not None:
            k = k.masked_fill(~keep, float("-inf"))
        k_max = k.amax(dim=-2, keepdim=True).clamp_min(torch.finfo(k.dtype).min)  # (b, h, 1, d), finite
        phi_k = torch.exp(k - k_max)  # masked keys -> exp(-inf) = 0
        phi_k = _ratio(phi_k, phi_k.sum(dim=-2, keepdim=True))
    kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (b, h, d, e)
    z = phi_k.sum(dim=-2)  # (b, h, d)
    num = torch.matmul(phi_q, kv)  # (b, h, n, e)
    den = torch.matmul(phi_q, z.unsqueeze(-1))  # (b, h, n, 1)
    return _ratio(num, den)


def _causal_features(q, k, key_mask, fmap, state):
    """Feature maps of the causal kernels; for a stabilised map (exp) also rescales `state` to the new key maxima."""
    keep = _keep(key_mask)  # (b, 1 or h, n, 1)
    if not fmap.stabilised:
        phi_q, phi_k = fmap.phi(q), fmap.phi(k)
        if keep is not None:
            phi_k = phi_k * keep
        return phi_q, phi_k, state, None
    k_masked = k if keep is None else k.masked_fill(~keep, float("-inf"))
    # the key maxima are a stabiliser, a constant of the function (they cancel in the ratio) and out of autograd, as in
    # the chunked kernel: a state made here (a prefix's) is carried on there, which treats its maxima as constants
    with torch.no_grad():
        k_max = k_masked.amax(dim=-2)  # (b, h, d)
        if state is not None and state.k_max is not None:
            k_max = torch.maximum(k_max, state.k_max)
        k_max = k_max.clamp_min(-1e30)  # all masked so far: any finite reference works
    if state is not None:
        scale = torch.exp(state.k_max - k_max) if state.k_max is not None else 1.0  # (b, h, d), <= 1
        state = LinearAttentionState(kv=state.kv * scale[..., None], z=state.z * scale, k_max=k_max)
    phi_k = torch.exp(k_masked - k_max[:, :, None, :])  # (b, h, n, d), <= 1, 0 where masked
    # exp(q_f) * exp(k_f) = exp(q_f + k_max_f) * exp(k_f - k_max_f): fold the key maxima into the queries
    q_fold = q + k_max[:, :, None, :]
    phi_q = torch.exp(q_fold - q_fold.amax(dim=-1, keepdim=True))  # per-query shift cancels in the ratio
    return phi_q, phi_k, state, k_max


class _ChunkScan(torch.autograd.Function):
    """`chunk_scan`'s loop: in-place updates of one running state, one autograd node for the whole scan (autograd
    would record two ops per chunk)."""

    @staticmethod
    def forward(x, g, start):
        g = None if g is None else _per_chunk(g, x)
        before = torch.empty_like(x)
        running = torch.zeros_like(x[:, :, 0]) if start is None else start.clone()
        for i in range(x.shape[2]):
            before[:, :, i] = running
            if g is not None:
                running.mul_(g[:, :, i])
            running.add_(x[:, :, i])
        return before, running

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, g, start = inputs
        wants_dg = g is not None and g.requires_grad
        ctx.x_shape, ctx.g_shape, ctx.has_start = x.shape, None if g is None else g.shape, start is not None
        ctx.save_for_backward(None if g is None else _per_chunk(g, x), output[0] if wants_dg else None)
        # an unused output's gradient stays None: a last state that nothing reads (training) sends none back to the
        # last chunk, nor, with one chunk, to any
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, d_before, d_last):
        g, before = ctx.saved_tensors
        grad = None if d_last is None else d_last.clone()  # of the state each chunk hands on, from the last one back
        dx = dg = None
        for i in reversed(range(ctx.x_shape[2])):
            if grad is not None:
                if dx is None:
                    dx = grad.new_zeros(ctx.x_shape)
                    dg = None if before is None else grad.new_zeros(g.shape)
                dx[:, :, i] = grad
                if dg is not None:
                    dg[:, :, i] = (grad * before[:, :, i]).sum_to_size(dg[:, :, i].shape)
                if g is not None:
                    grad.mul_(g[:, :, i])
            if d_before is not None:
                grad = d_before[:, :, i].clone() if grad is None else grad.add_(d_before[:, :, i])
        return dx, None if dg is None else dg.reshape(ctx.g_shape), grad if ctx.has_start else None


def _per_chunk(g, x):
    """g (b, h, k, ...) with ones appended to broadcast against x (b, h, k, ...)."""
    return g.reshape(*g.shape, *[1] * (x.dim() - g.dim()))


def chunk_scan(x, g=None, start=None):
    """The scan over chunk states x (b, h, k, ...): the state entering chunk i, before[:, :, i], is handed on as
    g_i * before_i + x_i -> (before, the state after the last chunk). g (b, h, k, ...), broadcast against the chunk
    states (a decay per chunk, or a rescaling per feature), None: 1; start (b, h, ...): the state entering the first
    chunk, None: zeros.

    On the CPU, and wherever there is a g, a loop of in-place updates (`_ChunkScan`): torch.cumsum over this
    non-innermost dim (plus the flips of its backward) measured slower on the CPU than k in-place additions of whole
    chunk states, each a large contiguous block (forward+backward of the chunked kernel at n = 16384, 8 heads of 64,
    chunk 64: 1125 ms with cumsum, 936 ms with the loop; benchmarks/bench_attention.py). Elsewhere, where each update
    is a kernel launch, an undecayed scan is a cumsum."""
    if g is None and x.device.type != "cpu":
        before = torch.cumsum(x, dim=2) - x
        before = before if start is None else before + start[:, :, None]
        return before, before[:, :, -1] + x[:, :, -1]
    return _ChunkScan.apply(x, g, start)


class _Sequences(NamedTuple):
    """Where a packed row's sequences lie, chunk by chunk (`_chunk_sequences`); masks with a head dim of 1."""

    ids: torch.Tensor  # (b, k * c) each position's sequence, counted from 0 in each row (padding: the last one)
    same: torch.Tensor  # (b, 1, k, c, c) query i and key j of a chunk in one sequence
    reads: torch.Tensor  # (b, 1, k, c) the query is in the sequence of the state carried into its chunk
    last: torch.Tensor  # (b, 1, k, c) the key is in the chunk's last sequence, the one whose state it hands on
    carry: torch.Tensor  # (b, 1, k) the state carried into the chunk continues through its end (no boundary)
    cont: torch.Tensor  # (b, 1, k) the chunk's first query reads the carried state


def _chunk_sequences(seq_idx, pad, c):
    """seq_idx (b, n), sequence ids that change at each boundary (a new sequence wherever the id changes) -> the
    `_Sequences` of chunks of c positions after `pad` padding positions, which join the last sequence."""
    b = seq_idx.shape[0]
    ids = F.pad((seq_idx[:, 1:] != seq_idx[:, :-1]).cumsum(dim=1), (1, 0))  # (b, n)
    if pad:
        ids = torch.cat([ids, ids[:, -1:].expand(b, pad)], dim=1)
    s = ids.reshape(b, -1, c)  # (b, k, c)
    prev = torch.cat([s[:, :1, 0], s[:, :-1, -1]], dim=1)  # (b, k) the sequence of the state entering each chunk
    return _Sequences(
        ids=ids,
        same=(s[..., :, None] == s[..., None, :])[:, None],
        reads=(s == prev[..., None])[:, None],
        last=(s == s[..., -1:])[:, None],
        carry=(prev == s[..., -1])[:, None],
        cont=(prev == s[..., 0])[:, None],
    )


def _sequence_running_max(x, ids, logd=None):
    """The running maximum along dim 2 of x (b, h, n, d) over each position's own sequence (`ids` (b, n),
    non-decreasing), decayed: M_p = max_j (x_j + sum_{j < t <= p} logd_t) over j <= p in p's sequence, `logd`
    (b, h, n) or None (0). A scan of log2 n doubling steps (Hillis and Steele): after the step of offset s, M_p covers
    the 2s positions ending at p, and `window` the log-decay of the s positions ending at p. The maximum is a
    stabiliser (used the same way everywhere), so sums of log-decays that round differently do no harm."""
    n = x.shape[2]
    window = logd
    offset = 1
    while offset < n:
        inside = (ids[:, offset:] == ids[:, :-offset])[:, None, :, None]  # (b, 1, n - s, 1)
        earlier = x[:, :, :-offset] if window is None else x[:, :, :-offset] + window[:, :, offset:, None]
        x = torch.cat([x[:, :, :offset], torch.maximum(x[:, :, offset:], earlier.masked_fill(~inside, -math.inf))], 2)
        if window is not None:
            window = torch.cat([window[:, :, :offset], window[:, :, offset:] + window[:, :, :-offset]], dim=2)
        offset *= 2
    return x


# Inside a chunk the exp kernel scales every key by the running key maximum at the chunk's end. Where that maximum
# rises by more than this many nats after a query's position, the query's terms would be scaled by a later key (fp32
# keeps ~87 nats of exponent below 1): such chunks are recomputed with each position's own running maximum.
EXP_CHUNK_SPREAD = 40.0


def _causal_exp_linear_attention(
    q, k, v, key_mask, chunk_size, state, drop=None, logd=None, sync_free=False, seq_idx=None
):
    """Causal linear attention with Shen et al.'s exp feature map, w_ij = sum_f exp(q_if + k_jf) for j <= i, whose
    stabilisers never look ahead: no position's output depends on later keys, numerically as well as exactly.

    Chunk c scales its keys by R_c, the running per-feature key maximum through its end; the state carried into it is
    rescaled from R_{c-1} to R_c (as `linear_attention_step` does per token), and its queries fold R_c in. A chunk
    where R_c exceeds the running maximum at some real query's position by more than `EXP_CHUNK_SPREAD` nats is
    recomputed for that query with its own running maximum M_i: w_ij = sum_f exp(q_if + k_jf - s_i),
    s_i = max_f (q_if + M_if), an explicit (c x c x d) sum. The stabilisers are constants of the function (they cancel
    in the ratio) and are kept out of autograd.

    With a decay (`logd`, b,h,n; b_j its cumulative sum inside a chunk), w_ij = sum_f exp(q_if + k_jf) exp(b_i - b_j):
    inside a chunk the keys keep the reference R_c (the carried state's reference, decayed, and the chunk's keys) and
    the decay is a mask; the state keeps the *decayed* maximum, so a key that has decayed away stops setting it: a
    key enters it as exp(k_j - b_j - U_c), U_c = max(reference before the chunk, max_j (k_j - b_j)), the state after
    the chunk is in reference U_c + B_c (B_c the chunk's decay), and that is the `k_max` a state carries. The exact
    path takes the keys back to the chunk's start, k_j - b_j, whose per-query factor exp(b_i) cancels in the ratio.

    With a packed row's sequences (`seq_idx`, no carried `state`) every reference is over one sequence: each position's
    running maximum M_i over its own sequence (`_sequence_running_max`, decayed), the state's reference after a chunk
    M at its end, R_c the maximum of the chunk's keys and, where its first query reads it, the carried state's
    reference; a chunk whose sequences' keys lie far apart is steep and takes the exact path."""
    b, h, n, d = q.shape
    e = v.shape[-1]
    c = min(chunk_size, n)
    pad = (-n) % c
    nk = (n + pad) // c
    real = None  # the queries whose outputs are used (masked and padded ones do not count in the stability check)
    if key_mask is not None or pad:
        real = key_mask if key_mask is not None else torch.ones(b, n, dtype=torch.bool, device=q.device)
        real = torch.cat([real, real.new_zeros(b, pad)], dim=1).reshape(b, 1, nk, c)
    keep = _keep(with_dropped(key_mask, drop))
    k = k if keep is None else k.masked_fill(~keep, float("-inf"))  # masked and dropped keys: exp(-inf) = 0
    if pad:
        q = F.pad(q, (0, 0, 0, pad))
        k = F.pad(k, (0, 0, 0, pad), value=float("-inf"))
        v = F.pad(v, (0, 0, 0, pad))
    seqs = None if seq_idx is None else _chunk_sequences(seq_idx, pad, c)
    q, k, v = q.reshape(b, h, nk, c, d), k.reshape(b, h, nk, c, d), v.reshape(b, h, nk, c, e)
    floor = -1e30  # reference while every key so far is masked: any finite value works
    start = state.k_max.clamp_min(floor) if state is not None else k.new_full((b, h, d), floor)
    back = k  # the keys taken back to their chunk's start
    if logd is not None:
        local = F.pad(logd, (0, pad)).reshape(b, h, nk, c).cumsum(dim=-1)  # b_j, (b, h, k, c)
        total = local[..., -1]  # B_c, (b, h, k)
        back = k - local[..., None]
    with torch.no_grad():
        if seqs is not None:  # M_i, each position's own running maximum (decayed to it), (b, h, k, c, d)
            flat_logd = None if logd is None else F.pad(logd, (0, pad))
            own = _sequence_running_max(k.reshape(b, h, nk * c, d), seqs.ids, flat_logd).clamp_min(floor)
            own = own.reshape(b, h, nk, c, d)
            ends = own[:, :, :, -1]  # the state's reference after each chunk, (b, h, k, d)
            running = ends if logd is None else ends - total[..., None]  # U_c, before the chunk's decay
            entering = torch.cat([start[:, :, None], ends[:, :, :-1]], dim=2).masked_fill(~seqs.cont[..., None], floor)
            ref = torch.maximum(entering, k.amax(dim=3)).clamp_min(floor)
        else:
            # U_c = G_c + max(start, max over the keys so far of k_j - G_j), G the decay before chunk c; without a
            # decay it is R_c, the reference the chunk's keys are scaled by too
            top = back.amax(dim=3)  # (b, h, k, d)
            if logd is not None:
                offset = chunk_scan(total.detach())[0][..., None]  # G_c, (b, h, k, 1)
                top = top - offset
            running = torch.cummax(torch.maximum(top, start[:, :, None]), dim=2).values
            running = ref = (running if logd is None else running + offset).clamp_min(floor)
            if logd is not None:  # R_c: the decayed reference the state hands the chunk, and the chunk's keys
                ends = running + total[..., None]  # the state's reference after each chunk
                ref = torch.maximum(torch.cat([start[:, :, None], ends[:, :, :-1]], dim=2), k.amax(dim=3))
                ref = ref.clamp_min(floor)
        shift = (q + ref[:, :, :, None]).amax(dim=-1, keepdim=True)  # per query, cancels in the ratio
    # the carried state's reference before each chunk (decayed by the chunk before: the decay keeps its gradient)
    last = running[:, :, :-1] if logd is None else running[:, :, :-1] + total[:, :, :-1, None]
    before = torch.cat([start[:, :, None], last], dim=2)
    phi_k = torch.exp(k - ref[:, :, :, None])  # (b, h, k, c, d), <= 1
    phi_q = torch.exp(q + ref[:, :, :, None] - shift)  # <= 1
    to_state = phi_k if logd is None else torch.exp(back - running[:, :, :, None])  # <= 1
    if seqs is not None:  # only the chunk's last sequence is handed on, in its own reference
        to_state = torch.exp(back.masked_fill(~seqs.last[..., None], float("-inf")) - running[:, :, :, None])
    kv_chunks = torch.matmul(to_state.transpose(-1, -2), v)  # (b, h, k, d, e)
    z_chunks = to_state.sum(dim=-2)  # (b, h, k, d)

    # the carried state, a scan over chunks that rescales it to each chunk's U_c before adding the chunk
    gap = before - running
    if seqs is not None:  # 0 where a boundary lies in the chunk (masked before the exp: no inf times 0)
        gap = gap.masked_fill(~seqs.carry[..., None], float("-inf"))
    scale = torch.exp(gap)  # (b, h, k, d), <= 1
    kv_before, kv_run = chunk_scan(kv_chunks, scale, None if state is None else state.kv)  # (b, h, k, d, e)
    z_before, z_run = chunk_scan(z_chunks, scale, None if state is None else state.z)  # (b, h, k, d)

    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if seqs is not None:
        causal = causal & seqs.same  # (b, 1, k, c, c)
    scores = torch.matmul(phi_q, phi_k.transpose(-1, -2))  # (b, h, k, c, c)
    read = phi_q
    if logd is None:  # exp(b_i - b_j) = 1 where j <= i
        scores = scores * causal
    else:
        gaps = (local[..., :, None] - local[..., None, :]).masked_fill(~causal, float("-inf"))  # b_i - b_j
        scores = scores * torch.exp(gaps)
        read = phi_q * torch.exp(local)[..., None]  # the carried state decayed to each query
    lift = scale if logd is None else torch.exp(before - ref)  # the carried state in reference R_c, <= 1
    if seqs is not None:  # only the queries of the carried state's sequence read it
        lift = torch.exp((before - ref).masked_fill(~seqs.cont[..., None], float("-inf")))
        read = read * seqs.reads[..., None]
    num = torch.matmul(scores, v) + torch.matmul(read, kv_before * lift[..., None])  # (b, h, k, c, e)
    den = scores.sum(dim=-1) + torch.matmul(read, (z_before * lift).unsqueeze(-1)).squeeze(-1)  # (b, h, k, c)

    with torch.no_grad():
        # each query's own reference, and how far the chunk's reference lies above it
        # cummax along the innermost dim: along the chunk's positions (dim 3) it measured 2.9x slower on the CPU
        if seqs is None:
            at = torch.cummax(back.transpose(-1, -2).contiguous(), dim=-1).values.transpose(-1, -2)
            at = torch.maximum(at, before.detach()[:, :, :, None]).clamp_min(floor)
            own = at if logd is None else at + local[..., None]
        else:  # taken back to the chunk's start as `back`
            at = own if logd is None else own - local[..., None]
        spread = (ref[:, :, :, None] - own).amax(dim=-1)  # (b, h, k, c)
        if real is not None:
            spread = spread.masked_fill(~real, 0.0)
        steep = spread.amax(dim=-1) > EXP_CHUNK_SPREAD  # (b, h, k)
    # a steep chunk's terms here may underflow; they are replaced below, and kept out of the ratio's gradient
    # (a zero gradient times 1/den^2 of an underflowed den would be NaN)
    num = num.masked_fill(steep[..., None, None], 0.0)
    out = _ratio(num, den.masked_fill(steep[..., None], 1.0).unsqueeze(-1))
    if sync_free or torch.compiler.is_compiling():
        # one graph under torch.compile / torch.export, no data-dependent branch: the exact path for every chunk,
        # selected where a chunk is steep (its exponents are all <= 0, so the unselected chunks cannot give NaN).
        # torch.cond would skip it when no chunk is steep, but inductor (torch 2.13) fails on its backward
        # ("strides of the two branches' output doesn't match")
        exact = _exp_chunks_exact(q, back, v, at, before, kv_before, z_before, *_exact_masks(seqs, h))
        out = torch.where(steep[..., None, None], exact, out)
    elif steep.any():  # rare
        idx = steep.nonzero(as_tuple=True)
        masks = (None if x is None else x[idx] for x in _exact_masks(seqs, h))
        exact = _exp_chunks_exact(
            q[idx], back[idx], v[idx], at[idx], before[idx], kv_before[idx], z_before[idx], *masks
        )
        out = out.index_put(idx, exact)
    out = out.reshape(b, h, nk * c, e)[:, :, :n]
    k_max = running[:, :, -1]
    if logd is not None:  # the state's reference moves by the last chunk's decay; the sums carry its gradient
        k_max = k_max + total[:, :, -1, None].detach()
        grad = torch.exp(total[:, :, -1] - total[:, :, -1].detach())  # 1, with the decay's gradient
        kv_run, z_run = kv_run * grad[..., None, None], z_run * grad[..., None]
    return out, LinearAttentionState(kv=kv_run, z=z_run, k_max=k_max)


def _exact_masks(seqs, h):
    """A packed row's masks as `_exp_chunks_exact` takes them, (b, h, k, c, c) and (b, h, k, c); None, None without."""
    if seqs is None:
        return None, None
    return seqs.same.expand(-1, h, -1, -1, -1), seqs.reads.expand(-1, h, -1, -1)


def _exp_chunks_exact(q, k, v, at, before, carried_kv, carried_z, same=None, reads=None):
    """The exp kernel's exact path for chunks (any leading dims ...): q, k (..., c, d), v (..., c, e), `at` (..., c, d)
    each position's running key maximum, `before` (..., d) the carried state's reference, carried_kv (..., d, e) and
    carried_z (..., d) the state before the chunk -> (..., c, e). w_ij = sum_f exp(q_if + k_jf - s_i), j <= i in the
    chunk, with s_i = max_f (q_if + at_if): every exponent <= 0, none from a later key. A packed row's `same`
    (..., c, c) (query and key in one sequence) and `reads` (..., c) (the query reads the carried state), or None."""
    c = q.shape[-2]
    own = (q + at).amax(dim=-1, keepdim=True).detach()  # (..., c, 1)
    logits = q[..., :, None, :] + k[..., None, :, :] - own[..., None]  # (..., c, c, d), <= 0 where j <= i
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if same is not None:
        causal = causal & same
    w = torch.exp(logits.masked_fill(~causal[..., None], float("-inf"))).sum(dim=-1)  # (..., c, c)
    state_logits = q + before[..., None, :] - own  # the carried state is in `before` <= at_i
    if reads is not None:  # masked before the exp: another sequence's reference may lie far above at_i
        state_logits = state_logits.masked_fill(~reads[..., None], float("-inf"))
    phi_q = torch.exp(state_logits)
    num = torch.matmul(w, v) + torch.matmul(phi_q, carried_kv)
    den = w.sum(dim=-1) + torch.matmul(phi_q, carried_z.unsqueeze(-1)).squeeze(-1)
    return _ratio(num, den.unsqueeze(-1))


def _causal_linear_attention(
    q, k, v, key_mask, fmap, chunk_size, state, drop=None, logd=None, sync_free=False, seq_idx=None
):
    """Causal linear attention in chunks of `chunk_size` (the exp map: `_causal_exp_linear_attention`). Inside a chunk,
    key j weighs exp(b_i - b_j) at query i (b the cumulative log-decay in the chunk, 0 without a decay); a chunk reads
    the state carried into it scaled by exp(b_i), and hands on exp(B) times it plus its keys decayed to its end,
    exp(B - b_j) (B its whole decay): every exponent <= 0. Without a decay (`logd` None) those factors are 1 and
    skipped. `seq_idx` (b, n) or None: a packed row's sequences (the module's docstring), with no carried `state`."""
    if fmap.stabilised:
        return _causal_exp_linear_attention(q, k, v, key_mask, chunk_size, state, drop, logd, sync_free, seq_idx)
    b, h, n, d = q.shape
    e = v.shape[-1]
    phi_q, phi_k, state, _ = _causal_features(q, k, with_dropped(key_mask, drop), fmap, state)
    c = min(chunk_size, n)
    pad = (-n) % c
    seqs = None if seq_idx is None else _chunk_sequences(seq_idx, pad, c)
    if pad:
        phi_q = F.pad(phi_q, (0, 0, 0, pad))
        phi_k = F.pad(phi_k, (0, 0, 0, pad))
        v = F.pad(v, (0, 0, 0, pad))
    nk = (n + pad) // c
    phi_q = phi_q.reshape(b, h, nk, c, d)
    phi_k = phi_k.reshape(b, h, nk, c, d)
    v = v.reshape(b, h, nk, c, e)

    # inside each chunk: a masked quadratic form
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if seqs is not None:
        causal = causal & seqs.same  # (b, 1, k, c, c)
    scores = torch.matmul(phi_q, phi_k.transpose(-1, -2))  # (b, h, k, c, c)
    read, to_end, g = phi_q, phi_k, None  # the queries reading the carried state, the keys it hands on, its decay
    if logd is None:
        scores = scores * causal
    else:
        local = F.pad(logd, (0, pad)).reshape(b, h, nk, c).cumsum(dim=-1)  # b, (b, h, k, c)
        total = local[..., -1]  # B, (b, h, k)
        gaps = (local[..., :, None] - local[..., None, :]).masked_fill(~causal, float("-inf"))  # b_i - b_j, j <= i
        scores = scores * torch.exp(gaps)
        read = phi_q * torch.exp(local)[..., None]
        to_end = phi_k * torch.exp(total[..., None] - local)[..., None]
        g = torch.exp(total)
    if seqs is not None:  # a boundary: the state reaches the queries of its own sequence; the last one's is handed on
        read = read * seqs.reads[..., None]
        to_end = to_end * seqs.last[..., None]
        g = seqs.carry.float() if g is None else g * seqs.carry
    num = torch.matmul(scores, v)  # (b, h, k, c, e)
    den = scores.sum(dim=-1)  # (b, h, k, c)

    # across chunks: the state before each chunk, a scan of the chunk states
    kv_chunks = torch.matmul(to_end.transpose(-1, -2), v)  # (b, h, k, d, e)
    z_chunks = to_end.sum(dim=-2)  # (b, h, k, d)
    kv_before, kv_run = chunk_scan(kv_chunks, g, None if state is None else state.kv)
    z_before, z_run = chunk_scan(z_chunks, g, None if state is None else state.z)
    num = num + torch.matmul(read, kv_before)  # (b, h, k, c, e)
    den = den + torch.matmul(read, z_before.unsqueeze(-1)).squeeze(-1)  # (b, h, k, c)
    out = _ratio(num, den.unsqueeze(-1)).reshape(b, h, nk * c, e)[:, :, :n]
    return out, LinearAttentionState(kv=kv_run, z=z_run)


def prefix_causal_linear_attention(q, k, v, mask, state, fmap, chunk_size, prefix_length, drop, logd, causal=None):
    """Causal linear attention whose first keys every query sees (`linear_ops.prefix_causal_linear_attention`, whose
    arguments it takes checked, `logd` as `_log_decay` gives it): the K = m - n + prefix_length leading keys are
    folded into one state (continuing `state`), the first `prefix_length` queries read that state alone, the others
    continue it with `causal` (`causal_linear_attention` by default; the fused kernels' entry point where the op chose
    them, which take the prefix's state as a carried state and give it its gradients). With a decay the leading keys
    decay to where they end, where the prefix's queries read them: the bidirectional prefix is one step of the decay."""
    causal = causal_linear_attention if causal is None else causal
    n, m = q.shape[2], k.shape[2]
    with _no_autocast(q):
        lead = m - n + prefix_length
        if lead:
            lead_mask = with_dropped(None if mask is None else mask[:, :lead], _slice(drop, 0, lead))
            k_lead, v_lead = k[:, :, :lead].float(), v[:, :, :lead].float()
            to_end = None
            if logd is not None:
                cumulative = logd[:, :, :lead].cumsum(dim=-1)
                state = _decayed_state(state, cumulative[..., -1], fmap)
                to_end = (cumulative[..., -1:] - cumulative)[..., None]  # (b, h, lead, 1), <= 0
                k_lead = k_lead + to_end if fmap.stabilised else k_lead
            _, phi_k, state, k_max = _causal_features(k_lead[:, :, :1], k_lead, lead_mask, fmap, state)
            if to_end is not None and not fmap.stabilised:
                phi_k = phi_k * torch.exp(to_end)
            kv = torch.matmul(phi_k.transpose(-1, -2), v_lead)  # (b, h, d, e)
            z = phi_k.sum(dim=-2)
            if state is not None:  # rescaled to the new key maxima by _causal_features
                kv, z = kv + state.kv, z + state.z
            state = LinearAttentionState(kv=kv, z=z, k_max=k_max)
        outs = []
        if prefix_length:
            phi_q = _query_features(q[:, :, :prefix_length].float(), fmap, state.k_max)
            num = torch.matmul(phi_q, state.kv)  # (b, h, prefix, e)
            den = torch.matmul(phi_q, state.z.unsqueeze(-1))  # (b, h, prefix, 1)
            outs.append(_ratio(num, den))
        if prefix_length < n:
            rest_mask = None if mask is None else mask[:, lead:]
            q_rest, k_rest, v_rest = q[:, :, prefix_length:], k[:, :, lead:], v[:, :, lead:]
            out, state = causal(
                q_rest,
                k_rest,
                v_rest,
                rest_mask,
                state,
                fmap,
                chunk_size,
                _slice(drop, lead, m),
                _slice(logd, lead, m),
            )
            outs.append(out)
        return (torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]), state


def _slice(drop, start, stop):
    return None if drop is None else drop[..., start:stop]


def _query_features(q, fmap, k_max):
    if not fmap.stabilised:
        return fmap.phi(q)
    q_fold = q + k_max[:, :, None, :]  # as in _causal_features
    return torch.exp(q_fold - q_fold.amax(dim=-1, keepdim=True))


def _linear_attention_step(q, k, v, state, key_mask, fmap):
    phi_q, phi_k, state, k_max = _causal_features(q, k, key_mask, fmap, state)
    kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (b, h, d, e)
    z = phi_k.squeeze(-2)  # (b, h, d)
    if state is not None:
        kv, z = kv + state.kv, z + state.z
    num = torch.matmul(phi_q, kv)  # (b, h, 1, e)
    den = torch.matmul(phi_q, z.unsqueeze(-1))  # (b, h, 1, 1)
    return _ratio(num, den), LinearAttentionState(kv=kv, z=z, k_max=k_max)


def linear_attention(q, k, v, keep, fmap):
    """Non-causal linear attention (`linear_ops.linear_attention`, checked): keep (b, m) or (b, h, m) the keys used
    (padding and key dropout together) or None -> out (b, h, n, e) fp32."""
    with _no_autocast(q):
        return _linear_attention(q.float(), k.float(), v.float(), keep, fmap)


def causal_linear_attention(q, k, v, mask, state, fmap, chunk_size, drop, logd, sync_free=False, seq_idx=None):
    """Causal linear attention in chunks (`linear_ops.causal_linear_attention`, checked; `logd` as `_log_decay` gives
    it) -> (out (b, h, n, e) fp32, `LinearAttentionState` after the last token). `sync_free`: the exp map's exact path
    for steep chunks is selected on the device, as under torch.compile, with no host read deciding whether any chunk
    needs it (inside a custom op, which a CUDA graph may replay). `seq_idx` (b, n): a packed row's sequences, with no
    `state`; None: one sequence."""
    with _no_autocast(q):
        return _causal_linear_attention(
            q.float(), k.float(), v.float(), mask, fmap, chunk_size, state, drop, logd, sync_free, seq_idx
        )


def linear_attention_step(q, k, v, mask, state, fmap, drop, logd):
    """One causal step (`linear_ops.linear_attention_step`, checked) -> (out (b, h, 1, e) fp32, the new state)."""
    with _no_autocast(q):
        state = _decayed_state(state, None if logd is None else logd[..., 0], fmap)
        return _linear_attention_step(q.float(), k.float(), v.float(), state, with_dropped(mask, drop), fmap)

"""Naive float64 references of the attention ops, written from the math (no chunks, no stabilisers beyond what float64
needs): what `linear_ops.py` and `softmax_ops.py` are tested against, and what a fused kernel is checked against.

Shape legend: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim. Every function returns
float64 (b, h, n, e); queries that see no key give 0.
"""

import math

import torch

from .feature_maps import get_feature_map


def phi(x, feature_map):
    """The feature map `feature_map` (a `FEATURE_MAPS` name) in its exact form, unstabilised (exp as it is)."""
    return get_feature_map(feature_map).exact(x)


def normalise_rows(w, v):
    """out_i = sum_j w_ij v_j / sum_j w_ij, and 0 for rows with sum_j w_ij == 0."""
    den = w.sum(-1, keepdim=True)
    out = (w @ v) / torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, out, torch.zeros_like(out))


def visible(n, m, key_mask=None, causal=False):
    """(b or 1, 1, n, m) bool: key j visible to query i. Causal queries are the last n of the m positions."""
    allowed = torch.ones(1, 1, n, m, dtype=torch.bool)
    if causal:
        i = torch.arange(n)[:, None] + (m - n)
        j = torch.arange(m)[None, :]
        allowed = allowed & (j <= i)
    if key_mask is not None:
        allowed = allowed & key_mask.bool()[:, None, None, :]
    return allowed


def naive_causal_linear_attention(q, k, v, key_mask=None, feature_map="elu"):
    """Causal linear attention, w_ij = phi(q_i) . phi(k_j) for j <= i."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    w = phi(q, feature_map) @ phi(k, feature_map).transpose(-1, -2)  # (b, h, n, n)
    return normalise_rows(w * visible(n, n, key_mask, causal=True), v)


def naive_causal_exp_logspace(q, k, v, key_mask=None):
    """Causal exp linear attention for inputs too large for `exp` even in float64: log w_ij = logsumexp_f (q_if + k_jf),
    then a softmax over the visible j."""
    n = q.shape[-2]
    return naive_linear_visible(q, k, v, visible(n, n, key_mask, causal=True), "exp")


def naive_linear_visible(q, k, v, allowed, feature_map):
    """out_i = sum_j w_ij v_j / sum_j w_ij over the `allowed` (b, h or 1, n, m) keys, w_ij = phi(q_i) . phi(k_j); for
    the stabilised map (exp) in log space, so that keys hundreds of nats apart stay exact."""
    q, k, v = q.double(), k.double(), v.double()
    if not get_feature_map(feature_map).stabilised:
        return normalise_rows((phi(q, feature_map) @ phi(k, feature_map).transpose(-1, -2)) * allowed, v)
    logw = torch.logsumexp(q[..., :, None, :] + k[..., None, :, :], dim=-1).masked_fill(~allowed, float("-inf"))
    return torch.softmax(logw, dim=-1).nan_to_num(0.0) @ v


def naive_linear_attention(q, k, v, key_mask=None, feature_map="elu"):
    """Non-causal linear attention; the stabilised map (exp) is Shen et al.'s efficient attention (softmax over the
    features for queries, over the unmasked keys for keys). `key_mask` (b, m), or (b, h, m) per head."""
    q, k, v = q.double(), k.double(), v.double()
    keep = torch.ones(k.shape[0], 1, k.shape[-2], 1, dtype=torch.float64)
    if key_mask is not None:
        keep = key_mask.double()[:, None, :, None] if key_mask.dim() == 2 else key_mask.double()[..., None]
    if not get_feature_map(feature_map).stabilised:
        phi_q, phi_k = phi(q, feature_map), phi(k, feature_map) * keep
    else:
        eq = torch.exp(q)
        phi_q = eq / eq.sum(-1, keepdim=True)
        ek = torch.exp(k) * keep
        sk = ek.sum(-2, keepdim=True)
        phi_k = ek / torch.where(sk > 0, sk, torch.ones_like(sk))
    return normalise_rows(phi_q @ phi_k.transpose(-1, -2), v)


def naive_softmax_attention(q, k, v, key_mask=None, causal=False):
    """softmax(q k^T / sqrt(d)) v over the visible keys."""
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = visible(n, m, key_mask, causal).expand_as(scores)
    w = torch.exp(scores - scores.amax(-1, keepdim=True)) * allowed
    return normalise_rows(w, v)


def cumulative_decay(log_decay, key_mask=None):
    """G (b, h, m) float64, G_p = sum_{t <= p} log g_t: the log-decay from the start through position p. A masked
    (padding) position does not decay: padding is not time."""
    logd = log_decay.double()
    if key_mask is not None:
        logd = logd.masked_fill(~key_mask.bool()[:, None, :], 0.0)
    return logd.cumsum(dim=-1)


def naive_decayed_linear_attention(q, k, v, log_decay, key_mask=None, feature_map="elu", prefix_length=0):
    """Causal linear attention with a decay: w_ij = phi(q_i) . phi(k_j) * exp(G_{p_i} - G_j) over the visible keys,
    G from `cumulative_decay`. The n queries are the last n of the m positions (p_i = m - n + i); the first
    `prefix_length` queries see the whole prefix (the L = m - n + prefix_length leading keys) and read it where it ends,
    p_i = L - 1, as the ops' prefix state. `log_decay` (b, h, m), log g <= 0; the stabilised map (exp) in log space."""
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    lead = m - n + prefix_length
    where = torch.clamp(torch.arange(n) + (m - n), min=lead - 1)  # (n,) each query's position
    g = cumulative_decay(log_decay, key_mask)  # (b, h, m)
    allowed = torch.arange(m)[None, :] <= where[:, None]  # (n, m)
    if key_mask is not None:
        allowed = allowed & key_mask.bool()[:, None, None, :]
    logdecay = (g[..., where][..., :, None] - g[..., None, :]).masked_fill(~allowed, float("-inf"))  # (b, h, n, m)
    if not get_feature_map(feature_map).stabilised:
        w = (phi(q, feature_map) @ phi(k, feature_map).transpose(-1, -2)) * torch.exp(logdecay)
        return normalise_rows(w, v)
    logw = torch.logsumexp(q[..., :, None, :] + k[..., None, :, :], dim=-1) + logdecay
    return torch.softmax(logw, dim=-1).nan_to_num(0.0) @ v


def sequence_ids(seq_idx):
    """seq_idx (b, n), a packed row's sequence of each position -> (b, n) int64 ids counted from 0 in each row, a new
    one wherever seq_idx changes (a boundary)."""
    change = (seq_idx[:, 1:] != seq_idx[:, :-1]).long()
    return torch.cat([change.new_zeros(change.shape[0], 1), change.cumsum(dim=1)], dim=1)


def naive_packed_causal_linear_attention(
    q, k, v, seq_idx, key_mask=None, feature_map="elu", log_decay=None, drop=None
):
    """Causal linear attention over a packed row: query i sees key j <= i only in its own sequence (`seq_idx` (b, n),
    `sequence_ids`), a dense mask. `key_mask` (b, n) padding (which does not decay), `drop` (b, h, n) the keys key
    dropout keeps (a dropped key still decays), `log_decay` (b, h, n) or None: key j weighs exp(G_i - G_j) at query
    i, G from `cumulative_decay` (a sequence's first position's decay never enters: nothing before it is seen). The
    stabilised map (exp) in log space."""
    q, k, v = q.double(), k.double(), v.double()
    n = q.shape[-2]
    ids = sequence_ids(seq_idx)
    allowed = visible(n, n, key_mask, causal=True) & (ids[:, None, :, None] == ids[:, None, None, :])  # (b, 1, n, n)
    if drop is not None:
        allowed = allowed & drop.bool()[:, :, None, :]
    logdecay = torch.zeros(1, dtype=torch.float64)
    if log_decay is not None:
        g = cumulative_decay(log_decay, key_mask)  # (b, h, n)
        logdecay = (g[..., :, None] - g[..., None, :]).masked_fill(~allowed, 0.0)
    if not get_feature_map(feature_map).stabilised:
        w = (phi(q, feature_map) @ phi(k, feature_map).transpose(-1, -2)) * torch.exp(logdecay) * allowed
        return normalise_rows(w, v)
    logw = torch.logsumexp(q[..., :, None, :] + k[..., None, :, :], dim=-1) + logdecay
    return torch.softmax(logw.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0) @ v

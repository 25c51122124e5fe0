"""Softmax attention ops (Vaswani et al. 2017): `q (b,h,n,d), k (b,h,m,d), v (b,h,m,e), mask, dropout_p -> (out
(b,h,n,e), weights (b,h,n,m) or None)`, one per transformers `config._attn_implementation`: `"sdpa"`
(`torch.nn.functional.scaled_dot_product_attention`) or `"eager"` (explicit weights, returned on request).

Shape legend: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim.
"""

import torch
import torch.nn.functional as F

from .masks import AttentionMask, causal_pattern

# ---------------------------------------------------------------------------------------------------------------


def softmax_attention_sdpa(q, k, v, mask: AttentionMask, dropout_p=0.0):
    attn_mask, has_keys = mask.dense_form(q.device)
    is_causal = mask.causal and attn_mask is None
    n, m = q.shape[-2], k.shape[-2]
    if is_causal and n == 1:  # one new token sees every cached key
        is_causal = False
    elif is_causal and n != m:  # SDPA's is_causal aligns top-left; queries here are the last n of m positions
        attn_mask, is_causal = causal_pattern(n, m, device=q.device), False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    if has_keys is not None:
        out = out * has_keys
    return out, None


def softmax_attention_eager(q, k, v, mask: AttentionMask, dropout_p=0.0):
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (b, h, n, m)
    allowed, has_keys = mask.dense_form(q.device)
    if allowed is None and mask.causal:
        n, m = scores.shape[-2:]
        allowed = causal_pattern(n, m, device=q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if has_keys is not None:
        weights = weights * has_keys
    weights = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    return torch.matmul(weights, v), weights


SOFTMAX_KERNELS = {"sdpa": softmax_attention_sdpa, "eager": softmax_attention_eager}

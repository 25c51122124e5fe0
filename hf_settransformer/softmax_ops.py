"""Softmax attention (Vaswani et al. 2017) through transformers' attention interfaces: `config._attn_implementation`
(`"sdpa"`, `"eager"`, `"flash_attention_2"`, `"flex_attention"`, or any name registered with `AttentionInterface`)
picks the function from `ALL_ATTENTION_FUNCTIONS`, as in `modeling_llama.py`; the `AttentionMask` is converted to the
form that function's family takes, as `masking_utils` does for Llama:

- eager: a 4-D additive float mask, (b or 1, 1, n or 1, m);
- sdpa (and any other registered name): a 4-D bool mask, or none and `is_causal`;
- flex_attention: a `BlockMask` made from the mask's rule (no dense (n, m) tensor);
- flash_attention_2/3/4: a packed row as its boundaries (varlen); padding as sequence lengths: a (b, m) key mask when
  queries and keys are the same tokens
  (self-attention, where a padded query's output is 0) or a single query, cu_seqlens for a bidirectional
  cross-attention (Set Transformer PMA/ISAB, Perceiver IO latents). Masks it cannot express (a bidirectional prefix,
  a static cache's slots, padding in a causal attention whose queries are the last n of m keys) raise at call time.

Shape legend: b batch, h heads, n queries, m keys, d query/key head dim, e value head dim.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    eager_mask,
    flash_attention_mask,
    flex_attention_mask,
    sdpa_mask,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .masks import AttentionMask, causal_pattern


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, has_keys=None, **kwargs):
    """`modeling_llama.eager_attention_forward` without grouped keys: q (b,h,n,d), k (b,h,m,d), v (b,h,m,e),
    additive `attention_mask` (b or 1, 1, n or 1, m) -> (out (b,n,h,e), weights (b,h,n,m)). `has_keys` (b or 1, 1,
    n or 1, 1) bool: the weights of queries that see no key are 0, before the output is computed from them (the
    returned weights are the ones the output used: their gradients exist)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (b, h, n, m)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if has_keys is not None:
        weights = weights * has_keys
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights  # (b, n, h, e)


# ---------------------------------------------------------------------------------------------------------------
# One converter per mask family: (mask, q, k, v) -> (k, v, attention_mask, keyword arguments, has_keys). `has_keys`
# (b or 1, 1, n or 1, 1) bool, or None, marks the queries that see a key: the others' output (and weights) is set to 0.


def _dense_bool(mask: AttentionMask, q, k):
    dense, has_keys = mask.dense_form(q.device)
    n, m = q.shape[-2], k.shape[-2]
    if dense is None and mask.causal and n > 1 and n != m:  # queries are the last n of m positions
        dense = causal_pattern(n, m, device=q.device)[None, None]
    return dense, has_keys


def _eager_inputs(mask, q, k, v):
    dense, has_keys = _dense_bool(mask, q, k)
    if dense is None and mask.causal and q.shape[-2] > 1:
        dense = causal_pattern(q.shape[-2], k.shape[-2], device=q.device)[None, None]
    additive = None if dense is None else mask.additive_form(dense, q.dtype)
    return k, v, additive, {}, has_keys


def _sdpa_inputs(mask, q, k, v):
    dense, has_keys = _dense_bool(mask, q, k)
    # transformers' SDPA takes `is_causal` only without a mask and aligns it top-left: here n == m
    is_causal = dense is None and mask.causal and q.shape[-2] == k.shape[-2] > 1
    return k, v, dense, {"is_causal": is_causal}, has_keys


def _flex_inputs(mask, q, k, v):
    return k, v, mask.block_mask(q.shape[-2], k.shape[-2], q.device), {}, None


def _flash_inputs(mask, q, k, v):
    n, m = q.shape[-2], k.shape[-2]
    if mask.prefix_length or mask.query_positions is not None:
        what = "a bidirectional prefix" if mask.prefix_length else "a static cache"
        raise ValueError(
            f"flash attention takes padding as sequence lengths and cannot express {what}: use "
            "attn_implementation='sdpa', 'eager' or 'flex_attention' for this model."
        )
    key_mask = mask.key_mask
    causal = mask.causal and n > 1  # flash-attn >= 2.1 aligns causal masks bottom-right, as AttentionMask does
    if mask.packing is not None:  # a packed row: flash attention's own varlen form (the boundaries)
        cu, longest = mask.packing.boundaries().to(q.device), mask.packing.max_length
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
        return k, v, None, {"is_causal": causal, **varlen}, None
    if key_mask is None or n == m or n == 1:  # transformers unpads queries with the keys' mask, or keeps one query
        return k, v, key_mask, {"is_causal": causal}, None
    if causal:
        raise ValueError(
            "flash attention cannot express padded keys in a causal attention whose queries are the last n of m "
            "keys: use attn_implementation='sdpa', 'eager' or 'flex_attention' for this model, or unpadded inputs."
        )
    # A bidirectional cross-attention with padded keys: every query is kept, the keys are packed (the host reads the
    # key counts, as transformers' own unpadding does).
    b, h, _, d = k.shape
    key_mask = key_mask.to(k.device)
    index = key_mask.flatten().nonzero().squeeze(-1)  # (total keys,)
    lengths = F.pad(key_mask.sum(-1).cumsum(0), (1, 0)).to(torch.int32)  # (b + 1,)
    k = k.transpose(1, 2).reshape(b * m, h, d)[index].transpose(0, 1)[None]  # (1, h, total, d)
    v = v.transpose(1, 2).reshape(b * m, h, v.shape[-1])[index].transpose(0, 1)[None]  # (1, h, total, e)
    varlen = {
        "cu_seq_lens_q": torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=q.device),
        "cu_seq_lens_k": lengths,
        "max_length_q": n,
        "max_length_k": m,
    }
    return k, v, None, {"is_causal": False, **varlen}, None


MASK_FORMS = {
    eager_mask: _eager_inputs,
    sdpa_mask: _sdpa_inputs,
    flex_attention_mask: _flex_inputs,
    flash_attention_mask: _flash_inputs,
}
"""transformers' mask function of an implementation (`ALL_MASK_ATTENTION_FUNCTIONS`) -> our converter to that form;
an implementation without one of these mask functions gets SDPA's form."""


class _Standalone(nn.Module):
    """The `module` transformers' interfaces read (`config._attn_implementation`, `training`, `is_causal`) when an op
    is called outside a `MultiHeadAttention`."""

    def __init__(self, implementation):
        super().__init__()
        self.config = type("Config", (), {"_attn_implementation": implementation})()
        self.is_causal = False
        self.proj = nn.Linear(1, 1)  # flash attention reads the dtype of the module's first Linear


def softmax_attention(q, k, v, mask: AttentionMask, implementation="sdpa", *, module=None, dropout_p=0.0,
                      need_weights=False):
    """q (b,h,n,d), k (b,h,m,d), v (b,h,m,e) -> (out (b,h,n,e), weights (b,h,n,m) or None), computed by
    `ALL_ATTENTION_FUNCTIONS[implementation]` (by our `eager_attention_forward` when weights are asked for).
    `module`: the calling attention layer, which transformers' interfaces read."""
    implementation = implementation or "sdpa"  # a layer built outside a model: its config has no implementation set
    if need_weights or implementation == "eager":
        implementation, interface = "eager", eager_attention_forward
    else:
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    convert = MASK_FORMS.get(ALL_MASK_ATTENTION_FUNCTIONS.get(implementation), _sdpa_inputs)
    k, v, attention_mask, kwargs, has_keys = convert(mask, q, k, v)
    if interface is eager_attention_forward:  # ours zeroes the weights of keyless queries itself
        kwargs["has_keys"], has_keys = has_keys, None
    module = module if module is not None else _Standalone(implementation)
    out, weights = interface(
        module, q, k, v, attention_mask, scaling=q.shape[-1] ** -0.5, dropout=dropout_p, **kwargs
    )  # out (b, n, h, e)
    out = out.transpose(1, 2)  # (b, h, n, e)
    if has_keys is not None:
        out = out * has_keys
    return out, weights if need_weights else None

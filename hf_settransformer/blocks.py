"""The one block every model here is built from, and the Set Transformer blocks made of it.

`MAB(X, Y) = H + FF(Norm(H))`, `H = X + MultiHead(Norm(X), Norm(Y))` (Lee et al. 2019, eq. 6-7, pre-normalised as
in Nguyen & Salazar 2019). With Y = X it is the encoder block / SAB; causal, with an optional cross-attention
sublayer, it is the decoder block; ISAB and PMA choose other query and context streams.

Departures from the official Set Transformer code, on purpose: attention is scaled by the head dimension
(the official `1/sqrt(dim_V)` scales by the full width), blocks are pre-normalised with ScaleNorm instead of
post-norm LayerNorm, PMA applies the paper's rFF to its input (the official code omits it), and every block
honours an `attention_mask` (the official code has none).
"""

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import MultiHeadAttention
from .layers import FeedForward, LearnedVectors, make_norm
from .set_packing import SetAttention


class MAB(GradientCheckpointingLayer):
    """Multihead attention block: queries from `hidden_states`, keys/values from `context` (itself when None)."""

    def __init__(
        self, config, self_attention=True, causal=False, num_heads=None, cross_attention=False, layer_idx=None,
        ordered=True,
    ):
        super().__init__()
        self.attn_norm = make_norm(config)
        self.context_norm = None if self_attention else make_norm(config)
        self.attention = MultiHeadAttention(
            config, self_attention=self_attention, causal=causal, num_heads=num_heads, layer_idx=layer_idx,
            ordered=ordered,
        )
        self.cross_attention = None
        if cross_attention:  # decoder block of an encoder-decoder (Vaswani et al. 2017, fig. 1)
            self.cross_norm = make_norm(config)
            self.cross_context_norm = make_norm(config)
            self.cross_attention = MultiHeadAttention(
                config, self_attention=False, layer_idx=layer_idx, ordered=False  # every query reads every state
            )
        self.ffn_norm = make_norm(config)
        self.ffn = FeedForward(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states,
        context=None,
        mask=None,
        cross_states=None,
        cross_mask=None,
        output_attentions=False,
        past_key_values=None,
    ):
        """(b, n, hidden), (b, m, hidden) -> (out (b, n, hidden), weights or None, cross weights or None).

        `mask` may be a `SetAttention` (a packed row of sets, `set_packing.py`): the attention then runs along its
        route, between the packed elements and the per-set vectors, and gives no weights.
        `past_key_values`: the causal stack's `DecoderCache` (or None), handed to both attention layers, which take
        their own cache layers from it (see `MultiHeadAttention.forward`)."""
        normed = self.attn_norm(hidden_states)
        context = normed if self.context_norm is None else self.context_norm(context)
        if isinstance(mask, SetAttention):
            attended, weights = mask(self.attention, normed, context), None
        else:
            attended, weights = self.attention(
                normed, context, mask=mask, output_attentions=output_attentions, past_key_values=past_key_values
            )
        hidden_states = hidden_states + self.dropout(attended)
        cross_weights = None
        if self.cross_attention is not None and cross_states is not None:
            cached = past_key_values is not None and past_key_values.cross_cached(self.cross_attention.layer_idx)
            attended, cross_weights = self.cross_attention(
                self.cross_norm(hidden_states),
                None if cached else self.cross_context_norm(cross_states),  # cached: the encoder's keys and values
                cross_mask,
                output_attentions,
                past_key_values,
            )
            hidden_states = hidden_states + self.dropout(attended)
        hidden_states = hidden_states + self.dropout(self.ffn(self.ffn_norm(hidden_states)))
        return hidden_states, weights, cross_weights


class SAB(MAB):
    """Set attention block `SAB(X) = MAB(X, X)` (Lee et al. eq. 8): the Set Transformer's encoder layer without
    inducing points, and its decoder layer. Its own class so that output recording and sharding units can name it."""


class ISAB(nn.Module):
    """Induced set attention block: `ISAB_m(X) = MAB(X, MAB(I, X))` with m learned inducing points I (Lee et al. eq. 9)."""

    def __init__(self, config):
        super().__init__()
        self.inducing_points = LearnedVectors(config.num_inducing_points, config.hidden_size)
        self.induce = MAB(config, self_attention=False, ordered=False)  # I attends to X: a set of queries
        self.broadcast = MAB(config, self_attention=False)  # X attends to H

    def forward(self, hidden_states, mask=None, output_attentions=False, broadcast_mask=None, keys_from=None):
        """(b, n, hidden) -> ((b, n, hidden), (weights I<-X, weights X<-H) or None).

        `mask`: the elements the inducing points read. `broadcast_mask`: the keys each element reads in the second
        MAB, the m induced vectors H first; with `keys_from` = p the elements from p on are keys too, after H
        (m + n - p keys). The model that builds the masks decides what they mean (SetTransformerModel: a set of the
        first p elements, then a sequence). A packed row of sets: `mask` and `broadcast_mask` are the `SetAttention`
        routes "pool" and "broadcast", and each of the S sets has its own m induced vectors, (S, m, hidden)."""
        inducing = self.inducing_points(batch_of(hidden_states, mask))  # (b or S, m, hidden)
        induced, w_in, _ = self.induce(inducing, hidden_states, mask=mask, output_attentions=output_attentions)
        if keys_from is not None:
            induced = torch.cat([induced, hidden_states[:, keys_from:]], dim=1)  # (b, m + n - p, hidden)
        out, w_out, _ = self.broadcast(
            hidden_states, induced, mask=broadcast_mask, output_attentions=output_attentions
        )
        return out, (w_in, w_out)


class PMA(nn.Module):
    """Pooling by multihead attention: `PMA_k(X) = MAB(S, rFF(X))` with k learned seeds S (Lee et al. eq. 11)."""

    def __init__(self, config, num_seeds=1):
        super().__init__()
        self.seeds = LearnedVectors(num_seeds, config.hidden_size)
        self.ffn = FeedForward(config)
        self.pool = MAB(config, self_attention=False)

    def forward(self, hidden_states, mask=None, output_attentions=False, queries=None):
        """(b, n, hidden) -> ((b, k, hidden), weights (b, h, k, n) or None).

        `queries` (b, t, hidden): one pooling query per target instead of the k shared seeds: each is the mean seed
        plus that target's state (the many-target language-model heads, with a causal `mask`) -> (b, t, hidden).
        A packed row of sets (`mask` the `SetAttention` route "pool"): (1, total, hidden) -> (S, k, hidden)."""
        seeds = self.seeds(batch_of(hidden_states, mask))  # (b or S, k, hidden)
        if queries is not None:
            seeds = seeds.mean(dim=1, keepdim=True) + queries  # (b, t, hidden)
        out, weights, _ = self.pool(seeds, self.ffn(hidden_states), mask=mask, output_attentions=output_attentions)
        return out, weights


def batch_of(hidden_states, mask):
    """The batch of the learned vectors read with `hidden_states`: one copy per set of a packed row, else per row."""
    return mask.num_sets if isinstance(mask, SetAttention) else hidden_states.shape[0]


BLOCKS = (MAB, ISAB, PMA)


def outermost_block_names(model):
    """The class names of the blocks in `model` that no other block contains, sorted: the units that sharding (FSDP's
    transformer-based wrapping) and `device_map="auto"` keep whole. A block's own MABs stay inside it."""
    names, todo = set(), list(model.children())
    while todo:
        module = todo.pop()
        if isinstance(module, BLOCKS):
            names.add(type(module).__name__)
        else:
            todo.extend(module.children())
    return sorted(names)


def masked_mean(hidden_states, key_mask=None, sets=None):
    """(b, n, hidden), (b, n) bool -> (b, hidden); a row with no real element gives zeros. A packed row of sets
    (`sets`, a `set_packing.SetBlocks`): (1, total, hidden) -> (S, hidden)."""
    if sets is not None:
        return sets.mean_per_set(hidden_states)
    if key_mask is None:
        return hidden_states.mean(dim=1)
    weights = key_mask.to(hidden_states.dtype).unsqueeze(-1)  # (b, n, 1)
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)

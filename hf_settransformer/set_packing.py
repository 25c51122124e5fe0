"""Packed batches of sets: S sets of different sizes concatenated into one row, (1, total, hidden), each computed as if
alone and on its real elements only (no padding, no total x total mask).

The element states stay packed, so norms and feed-forwards touch real elements only; the vectors each set owns
(inducing points, PMA seeds, latents, pooled vectors) are an ordinary batch (S, m, hidden). Three routes of attention
connect them (`SetAttention`, handed to a `MAB` in place of its mask):

- "pool": the regular queries of each set over its own packed keys (ISAB's first MAB, PMA, Perceiver IO's encoder
  cross-attention). The keys are cut into blocks of `BLOCK_SIZE` elements, each set's last block padded; softmax
  takes each set's maximum over its blocks (a segmented max), then sums exp-weights and weighted values per block and
  adds the blocks of a set (`index_add`); linear attention adds per-block key-value sums per set. Small tensors:
  (blocks, h, m, B) at most.
- "broadcast": packed queries over their own set's regular keys (ISAB's second MAB, Perceiver IO's per-position
  decoder): each block of queries reads its set's m keys, an ordinary batched attention the layer's kernel computes.
- "self": full self-attention within each set (a Set Transformer of SABs): softmax pairs each block of queries with
  each block of keys of its set and combines a query block's pairs under one maximum per query (the work of the sum
  of the squared set sizes, not S times the largest squared); linear attention reads its set's key-value sums.

Softmax runs under `attn_implementation` "sdpa" or "eager" (the "pool" and "self" routes are segmented softmaxes of
their own, in fp32, as eager attention's);
attention dropout and linear attention's key dropout (one draw per key and head, as in a padded batch) are honoured.

Shape legend: S sets, total elements, nb blocks, B block length, h heads, m per-set vectors, d head dim, e value dim.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .feature_maps import get_feature_map
from .linear_ops import linear_attention
from .masks import AttentionMask
from .softmax_ops import softmax_attention

BLOCK_SIZE = 64
"""Elements per block: each set wastes less than one block (its last one's padding); the largest tensors the routes
make are (blocks, h, m, B) ("pool") and (block pairs, h, B, B) ("self")."""

PACKED_SET_IMPLEMENTATIONS = ("sdpa", "eager")
PACKED_SET_KERNELS = ("softmax", "linear")


@dataclass(eq=False)
class SetBlocks:
    """Where the elements of a packed row of sets are, and the blocked view of them.

    seq_idx: (total,) int64, the set of each element. cu: (S + 1,) int64 boundaries. lengths: (S,) int64.
    index: (nb, B) int64, the element at each slot of each block (0 at a padding slot). valid: (nb, B) bool, real
    slots. block_set: (nb,) int64, the set of each block. slot: (total,) int64, each element's flat slot
    (block * B + place in block). packing: the `packing.Packing` they were made from.
    """

    seq_idx: torch.Tensor
    cu: torch.Tensor
    lengths: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor
    block_set: torch.Tensor
    slot: torch.Tensor
    packing: object
    block_size: int
    _pairs: tuple | None = field(default=None, repr=False)  # made on first use, shared by the "self" layers

    @property
    def num_sets(self):
        return self.cu.shape[0] - 1

    @classmethod
    def from_packing(cls, packing, device, block_size=BLOCK_SIZE):
        """From a `packing.Packing`. The number of blocks is exact where the checks read the lengths, else the bound
        ceil(total / B) + S (the spare blocks are all padding); no value is read back here."""
        cu = packing.boundaries().to(device).long()
        total, num_sets, b = packing.total, cu.shape[0] - 1, block_size
        lengths = cu.diff()
        if packing.lengths is not None:
            num_blocks = sum(-(-length // b) for length in packing.lengths)
        else:
            num_blocks = (total + num_sets * (b - 1)) // b
        first_block = F.pad(((lengths + b - 1) // b).cumsum(0), (1, 0))  # (S + 1,)
        blocks = torch.arange(num_blocks, device=device)
        block_set = torch.searchsorted(first_block[1:], blocks, right=True).clamp_max(num_sets - 1)  # (nb,)
        offsets = (blocks - first_block[block_set])[:, None] * b + torch.arange(b, device=device)  # (nb, B)
        valid = offsets < lengths[block_set][:, None]
        index = torch.where(valid, cu[block_set][:, None] + offsets, 0)
        seq_idx = packing.seq_idx[0].to(device)
        place = torch.arange(total, device=device) - cu[seq_idx]  # (total,)
        slot = (first_block[seq_idx] + place // b) * b + place % b
        return cls(seq_idx, cu, lengths, index, valid, block_set, slot, packing, b)

    def route(self, name):
        """The `SetAttention` of one route ("pool", "broadcast" or "self") over these sets."""
        return SetAttention(self, name)

    def to_blocks(self, x):
        """(1, h, total, d) packed -> (nb, h, B, d) blocked (padding slots hold element 0: mask or drop them)."""
        per_element = x[0].transpose(0, 1)  # (total, h, d)
        blocked = per_element.index_select(0, self.index.flatten())  # (nb * B, h, d); its backward adds by index
        return blocked.view(*self.index.shape, *per_element.shape[1:]).permute(0, 2, 1, 3)  # (nb, h, B, d)

    def from_blocks(self, y):
        """(nb, h, B, e) blocked -> (1, h, total, e) packed (the padding slots dropped)."""
        nb, h, b, e = y.shape
        flat = y.permute(0, 2, 1, 3).reshape(nb * b, h, e)
        return flat.index_select(0, self.slot).transpose(0, 1)[None]  # (1, h, total, e)

    def pairs(self):
        """The (query block, key block) pairs of the same set, (P,) int64 each, P the sum over sets of their blocks
        squared: the "self" route's work. Made from the lengths the checks read (read here where they were not)."""
        if self._pairs is None:
            self._pairs = self._make_pairs()
        return self._pairs

    def _make_pairs(self):
        b, device = self.block_size, self.cu.device
        lengths = self.packing.lengths or tuple(self.lengths.tolist())
        counts = [-(-length // b) for length in lengths]
        per_set = torch.tensor(counts, device=device)  # (S,)
        first_block = F.pad(per_set.cumsum(0), (1, 0))  # (S + 1,)
        first_pair = F.pad((per_set * per_set).cumsum(0), (1, 0))  # (S + 1,)
        pair = torch.arange(sum(c * c for c in counts), device=device)  # (P,)
        owner = torch.searchsorted(first_pair[1:], pair, right=True)  # (P,) the set of each pair
        local, count = pair - first_pair[owner], per_set[owner]
        return first_block[owner] + local // count, first_block[owner] + local % count

    def per_block(self, x):
        """(S, ...) per set -> (nb, ...) each block's set's."""
        return x.index_select(0, self.block_set)

    def per_element(self, x):
        """(S, ...) per set -> (total, ...) each element's set's."""
        return x.index_select(0, self.seq_idx)

    def sum_per_set(self, x):
        """(total, ...) per element -> (S, ...) summed over each set."""
        return x.new_zeros(self.num_sets, *x.shape[1:]).index_add(0, self.seq_idx, x)

    def mean_per_set(self, hidden_states):
        """(1, total, hidden) -> (S, hidden), the mean of each set's elements."""
        sums = self.sum_per_set(hidden_states[0])
        return sums / self.lengths.to(sums.dtype)[:, None]


def sets_of(packing, device):
    """The `SetBlocks` of a packed batch, or None for an ordinary one: made once per forward and device (the base
    model's routes and its head's pooling share them)."""
    if packing is None:
        return None
    key = ("sets", torch.device(device))
    if key not in packing.memo:
        packing.memo[key] = SetBlocks.from_packing(packing, device)
    return packing.memo[key]


def check_packed_sets(config, output_attentions=False, prefix_length=None):
    """What a packed batch of sets cannot be given, refused by name (the models call it where `packing` is given)."""
    if prefix_length is not None:
        raise ValueError("`prefix_length` (the many-target language model) takes padded batches, not a packed batch of "
                         "sets.")
    if output_attentions:
        raise ValueError("`output_attentions=True` is not available for a packed batch of sets (its attention is "
                         "computed per block, never as a matrix): pass a padded batch to read attention weights.")
    if config.attention_type not in PACKED_SET_KERNELS:
        raise ValueError(f"A packed batch of sets runs attention_type {list(PACKED_SET_KERNELS)}; this model's is "
                         f"{config.attention_type!r}: pass padded batches.")
    implementation = config._attn_implementation or "sdpa"
    if config.attention_type == "softmax" and implementation not in PACKED_SET_IMPLEMENTATIONS:
        raise ValueError(
            f"A packed batch of sets runs softmax attention under attn_implementation {list(PACKED_SET_IMPLEMENTATIONS)} "
            f"(its pooling and self-attention are segmented softmaxes of its own); this model's is {implementation!r}: call "
            "`model.set_attn_implementation('sdpa')`, or pass padded batches."
        )


def self_route_applies(config, output_attentions=False):
    """Whether a packed row's bidirectional self-attention runs the "self" route (segmented: the work of the sum of
    the squared lengths) rather than the block-diagonal `AttentionMask.packing` that transformers' attention functions
    take (flex and flash attention, and the weights `output_attentions` asks for)."""
    implementation = config._attn_implementation or "sdpa"
    return config.attention_type in PACKED_SET_KERNELS and not output_attentions and (
        config.attention_type != "softmax" or implementation in PACKED_SET_IMPLEMENTATIONS
    )


@dataclass(eq=False)
class SetAttention:
    """One route of attention over a packed row of sets (see the module's docstring), handed to a `MAB` as its mask.
    `num_sets` is the batch of the per-set vectors (inducing points, seeds, latents) the blocks make."""

    sets: SetBlocks
    name: str

    @property
    def num_sets(self):
        return self.sets.num_sets

    def __call__(self, attention, hidden_states, context):
        """`attention`, a `MultiHeadAttention`, along this route: "pool" (S, m, hidden) queries, (1, total, hidden)
        context; "broadcast" the other way round; "self" (1, total, hidden) both -> the attention's output, shaped as
        `hidden_states`."""
        q, k, v = attention.project(hidden_states, context)  # (b, h, n, d), (b', h, m, d), (b', h, m, e)
        kernel = attention.config.attention_type
        options = {
            "dropout_p": attention.dropout if attention.training else 0.0,
            "feature_map": attention.kernel_options.get("feature_map"),
            "attention": attention,
        }
        out = ROUTES[self.name][kernel](q, k, v, self.sets, **options)  # (b, h, n, e)
        b, _, n, _ = out.shape
        out = out.to(hidden_states.dtype).transpose(1, 2).reshape(b, n, attention.hidden_size)  # (b, n, hidden)
        return attention.o_proj(out)


# ---------------------------------------------------------------------------------------------------------------
# The routes, one function per (route, attention type): (q, k, v, sets, dropout_p, feature_map, attention) -> out.


def _pool_softmax(q, k, v, sets, dropout_p, feature_map, attention):
    """q (S, h, m, d) over packed k (1, h, total, d), v (1, h, total, e) -> (S, h, m, e). Each set's softmax is
    shifted by its own maximum over all its blocks, so the per-block sums add up exactly. In fp32 (as eager attention's
    softmax), whatever autocast says."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        qb = sets.per_block(q.float())  # (nb, h, m, d)
        kb, vb = sets.to_blocks(k.float()), sets.to_blocks(v.float())  # (nb, h, B, d), (nb, h, B, e)
        scores = torch.matmul(qb, kb.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (nb, h, m, B)
        scores = scores.masked_fill(~sets.valid[:, None, None, :], float("-inf"))
        with torch.no_grad():  # a shift: softmax does not depend on it
            block_max = scores.amax(dim=-1)  # (nb, h, m)
            set_max = _max_per(sets.block_set, block_max, sets.num_sets)  # (S, h, m), finite: no set is empty
        weights = torch.exp(scores - sets.per_block(set_max)[..., None])  # (nb, h, m, B), 0 at padding
        den = set_max.new_zeros(set_max.shape).index_add(0, sets.block_set, weights.sum(-1))  # (S, h, m)
        # attention dropout drops entries of the normalised weights (and scales the kept ones), as eager attention
        kept = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        num = torch.matmul(kept, vb)  # (nb, h, m, e)
        num = num.new_zeros(sets.num_sets, *num.shape[1:]).index_add(0, sets.block_set, num)  # (S, h, m, e)
        return num / den[..., None]


def _max_per(index, x, size):
    """(rows, ...) values, (rows,) group ids -> (size, ...) each group's maximum (-inf for a group without rows)."""
    out = x.new_full((size, *x.shape[1:]), float("-inf"))
    return out.scatter_reduce(0, index.view(-1, *[1] * (x.dim() - 1)).expand_as(x), x, "amax")


def _key_drop(shape, dropout_p, device):
    """Linear attention's key dropout: the keys kept, one draw per key and head (`attention.linear_kernel`)."""
    return torch.rand(shape, device=device) >= dropout_p if dropout_p > 0 else None


def _ratio(num, den):
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _linear_sums(k, v, sets, fmap, drop):
    """Each set's key-value and key sums of non-causal linear attention (`linear_ops.linear_attention`'s function):
    packed k (1, h, total, d), v (1, h, total, e), kept keys `drop` (1, h, total) or None -> kv (S, h, d, e),
    z (S, h, d), added block by block. exp (Shen et al.): each set's keys softmaxed over the set, per feature."""
    keys = k[0].transpose(0, 1)  # (total, h, d)
    kept = None if drop is None else drop[0].transpose(0, 1)[..., None]  # (total, h, 1)
    if not fmap.stabilised:
        phi_k = fmap.phi(keys) if kept is None else fmap.phi(keys) * kept
    else:
        if kept is not None:
            keys = keys.masked_fill(~kept, float("-inf"))
        with torch.no_grad():  # a shift: the softmax over the set does not depend on it
            k_max = _max_per(sets.seq_idx, keys, sets.num_sets).clamp_min(torch.finfo(keys.dtype).min)  # (S, h, d)
        phi_k = torch.exp(keys - sets.per_element(k_max))  # (total, h, d), 0 where dropped
        phi_k = _ratio(phi_k, sets.per_element(sets.sum_per_set(phi_k)))
    z = sets.sum_per_set(phi_k)  # (S, h, d)
    kb = sets.to_blocks(phi_k.transpose(0, 1)[None]) * sets.valid[:, None, :, None]  # (nb, h, B, d)
    kv = torch.matmul(kb.transpose(-1, -2), sets.to_blocks(v))  # (nb, h, d, e)
    return kv.new_zeros(sets.num_sets, *kv.shape[1:]).index_add(0, sets.block_set, kv), z  # (S, h, d, e)


def _query_features(q, fmap):
    """phi(q); a stabilised map (exp, Shen et al.): a softmax over the features."""
    return torch.softmax(q, dim=-1) if fmap.stabilised else fmap.phi(q)


def _pool_linear(q, k, v, sets, dropout_p, feature_map, attention):
    """Linear attention of q (S, h, m, d) over each set's packed keys -> (S, h, m, e)."""
    fmap = get_feature_map(feature_map)
    with torch.autocast(device_type=q.device.type, enabled=False):  # fp32, as the linear ops
        q, k, v = q.float(), k.float(), v.float()
        kv, z = _linear_sums(k, v, sets, fmap, _key_drop(k.shape[:3], dropout_p, k.device))
        phi_q = _query_features(q, fmap)
        return _ratio(torch.matmul(phi_q, kv), torch.matmul(phi_q, z[..., None]))  # (S, h, m, e)


def _broadcast_softmax(q, k, v, sets, dropout_p, feature_map, attention):
    """Packed q (1, h, total, d) over each set's own k (S, h, m, d), v (S, h, m, e) -> (1, h, total, e): every block of
    queries reads its set's keys, one batched attention through the layer's `attn_implementation`."""
    qb = sets.to_blocks(q)  # (nb, h, B, d)
    kb, vb = sets.per_block(k), sets.per_block(v)  # (nb, h, m, d)
    out, _ = softmax_attention(qb, kb, vb, AttentionMask(), attention.config._attn_implementation, module=attention,
                               dropout_p=dropout_p)
    return sets.from_blocks(out)


def _broadcast_linear(q, k, v, sets, dropout_p, feature_map, attention):
    drop = _key_drop(k.shape[:3], dropout_p, k.device)  # (S, h, m): one draw per set, as a padded batch has
    qb = sets.to_blocks(q)
    kb, vb = sets.per_block(k), sets.per_block(v)
    out, _ = linear_attention(qb, kb, vb, None, feature_map=feature_map,
                              drop=None if drop is None else sets.per_block(drop))
    return sets.from_blocks(out)


def _self_softmax(q, k, v, sets, dropout_p, feature_map, attention):
    """Full softmax attention within each set, packed q, k (1, h, total, d), v (1, h, total, e) -> (1, h, total, e):
    each block of queries against each block of keys of its own set (`SetBlocks.pairs`, sum over sets of
    blocks squared), the pairs of a query block combined under one maximum per query (a segmented softmax)."""
    with torch.autocast(device_type=q.device.type, enabled=False):  # fp32, as eager attention's softmax
        pq, pk = sets.pairs()  # (P,) query block, key block
        qb, kb, vb = (sets.to_blocks(x.float()) for x in (q, k, v))  # (nb, h, B, d)
        scores = torch.matmul(qb.index_select(0, pq), kb.index_select(0, pk).transpose(-1, -2))  # (P, h, B, B)
        scores = (scores * q.shape[-1] ** -0.5).masked_fill(~sets.valid.index_select(0, pk)[:, None, None, :],
                                                           float("-inf"))
        with torch.no_grad():  # a shift: softmax does not depend on it
            row_max = _max_per(pq, scores.amax(dim=-1), qb.shape[0])  # (nb, h, B)
        weights = torch.exp(scores - row_max.index_select(0, pq)[..., None])  # (P, h, B, B), 0 at padded keys
        den = row_max.new_zeros(row_max.shape).index_add(0, pq, weights.sum(-1))  # (nb, h, B)
        kept = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights  # as eager attention drops weights
        num = torch.matmul(kept, vb.index_select(0, pk))  # (P, h, B, e)
        num = num.new_zeros(*qb.shape[:3], num.shape[-1]).index_add(0, pq, num)  # (nb, h, B, e)
        return sets.from_blocks(_ratio(num, den[..., None]))  # a spare block (no pair) has den 0: 0, not NaN


def _self_linear(q, k, v, sets, dropout_p, feature_map, attention):
    """Non-causal linear attention within each set: its key-value sums, read by each of its (packed) queries."""
    fmap = get_feature_map(feature_map)
    with torch.autocast(device_type=q.device.type, enabled=False):  # fp32, as the linear ops
        q, k, v = q.float(), k.float(), v.float()
        kv, z = _linear_sums(k, v, sets, fmap, _key_drop(k.shape[:3], dropout_p, k.device))  # one draw per key
        phi_q = sets.to_blocks(_query_features(q, fmap))  # (nb, h, B, d)
        out = _ratio(torch.matmul(phi_q, sets.per_block(kv)), torch.matmul(phi_q, sets.per_block(z)[..., None]))
        return sets.from_blocks(out)


ROUTES = {
    "pool": {"softmax": _pool_softmax, "linear": _pool_linear},
    "broadcast": {"softmax": _broadcast_softmax, "linear": _broadcast_linear},
    "self": {"softmax": _self_softmax, "linear": _self_linear},
}

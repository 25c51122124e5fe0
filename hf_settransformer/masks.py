"""Which keys each query sees: `AttentionMask`, built once per forward and shared by every attention layer, and the
causal pattern it is made from.

Shape legend: b batch, n queries, m keys.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMask:
    """Which keys each query sees: built once per forward and handed to every attention layer that shares it. Each
    kernel reads the form it needs: the linear kernels `key_mask` and `causal`, the softmax kernels the form of their
    `attn_implementation` (`dense_form`, `additive_form`, `block_mask`, or `key_mask` for flash attention), made
    from them on first use (so no mask is "for" one kind of kernel).

    key_mask: (b, m) bool, True for real keys, or None when every key is real.
    causal: query i sees keys j <= i + (m - n): the n queries are the last n of the m key positions (self-attention
        has n = m; a causal cross-attention, as Perceiver AR's, sees the m - n leading keys from every query).
    prefix_length: with `causal`, the first `prefix_length` queries form a bidirectional prefix: they see the keys of
        the prefix (and the m - n leading keys), every later query sees the whole prefix and its own past.
    num_queries, num_keys: n and m, needed for a causal `dense_form` (m defaults to `key_mask`'s length).
    query_positions: (n,) long tensor, or None: with `causal`, query i sees keys j <= query_positions[i] instead of
        j <= i + m - n. A static cache's keys are its fixed slots, of which the first ones are written: its queries'
        slots are a tensor (the cache's counter plus 0..n-1), so a compiled step's mask has the same shape and no
        Python int that changes from step to step.
    packing: a `packing.Packing` (a packed row of several sequences, b = 1, queries and keys the same n = m
        positions), or None: query i sees key j only where both are in the same sequence (and j <= i if `causal`).

    Everything made from it (`dense_form`) is made on the device of the queries it is used with.
    """

    key_mask: torch.Tensor | None = None
    causal: bool = False
    prefix_length: int = 0
    num_queries: int | None = None
    num_keys: int | None = None
    query_positions: torch.Tensor | None = None
    packing: object = None
    _forms: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # the forms made, by use

    @classmethod
    def build(cls, key_mask, causal=False, num_queries=None, num_keys=None, prefix_length=0, query_positions=None,
              packing=None):
        """`key_mask` (b, m), 1/True for real keys, or None. `num_queries` is needed when `causal`; `num_keys` when
        `causal` and there is no `key_mask` but a prefix or a causal cross-attention needs a dense mask.

        Reads no values (no host sync): a mask whose keys are all real is dropped once per batch, by the model's
        input check (`checks.check_input_values`), not here."""
        if prefix_length and not causal:
            raise ValueError("`prefix_length` needs a causal mask (a bidirectional prefix, causal after it).")
        if query_positions is not None and (prefix_length or not causal):
            raise ValueError("`query_positions` needs a causal mask without a prefix.")
        if packing is not None and (prefix_length or query_positions is not None):
            raise ValueError("A packed row's mask takes no `prefix_length` and no `query_positions`.")
        key_mask = None if key_mask is None else key_mask.bool()
        return cls(key_mask, causal, prefix_length, num_queries, num_keys, query_positions, packing)

    @property
    def segments(self):
        """(1, n) int64 sequence ids of a packed row, or None."""
        return None if self.packing is None else self.packing.seq_idx

    def dense_form(self, device):
        """(dense, has_keys) for the softmax kernels, made on first use on `device` (the queries' device; a mask
        without `key_mask` has no device of its own) and kept for the other layers that share this mask.

        dense: (b or 1, 1, n or 1, m) bool, or None (no mask, or plain causal: the kernel's own causal path).
        has_keys: (b or 1, 1, n or 1, 1) bool, False for queries that see no key at all (their output is set to 0),
        or None."""
        device = torch.device(device)
        return self._memo(("dense", device), lambda: self._make_dense(device))

    def additive_form(self, dense, dtype):
        """`dense` (a bool form of this mask) as the additive float mask eager attention takes: 0 where a key is seen,
        the dtype's minimum elsewhere; kept for the other layers."""
        return self._memo(
            ("additive", dense.shape, dense.device, dtype),
            lambda: torch.zeros((), dtype=dtype, device=dense.device).masked_fill(~dense, torch.finfo(dtype).min),
        )

    def block_mask(self, n, m, device):
        """flex attention's `BlockMask` for n queries and m keys, made from the mask's rule (`mask_mod`), or None when
        every query sees every key; kept for the other layers of the same shapes."""
        device = torch.device(device)
        if self.key_mask is None and self.packing is None and not (
            self.causal and (n > 1 or self.query_positions is not None)
        ):
            return None
        return self._memo(("block", n, m, device), lambda: self._make_block_mask(n, m, device))

    def _make_block_mask(self, n, m, device):
        from torch.nn.attention.flex_attention import create_block_mask

        key_mask = None if self.key_mask is None else self.key_mask.to(device)
        positions = None if self.query_positions is None else self.query_positions.to(device)
        segments = None if self.packing is None else self.segments.to(device)
        offset, prefix, causal = m - n, self.prefix_length, self.causal

        def mask_mod(batch, head, q, kv):
            allowed = kv >= 0
            if causal:  # causal_pattern's rule; a static cache's queries sit at their slots
                allowed = kv <= (q + offset if positions is None else positions[q])
                if prefix:
                    allowed = allowed | ((q < prefix) & (kv < offset + prefix))
            if segments is not None:  # a packed row: each sequence to itself (a document mask)
                allowed = allowed & (segments[batch, q] == segments[batch, kv])
            return allowed if key_mask is None else allowed & key_mask[batch, kv]

        batch = None if key_mask is None and segments is None else 1 if key_mask is None else key_mask.shape[0]
        return create_block_mask(mask_mod, batch, None, n, m, device=device)

    def _memo(self, key, make):
        if key not in self._forms:
            self._forms[key] = make()
        return self._forms[key]

    def _make_dense(self, device):
        key_mask = None if self.key_mask is None else self.key_mask.to(device)
        if key_mask is None and not self.prefix_length and self.query_positions is None and self.packing is None:
            return None, None
        dense = key_mask[:, None, None, :] if key_mask is not None else None  # (b, 1, 1, m)
        if self.packing is not None:  # a packed row: block-diagonal, each sequence to itself
            segments = self.segments.to(device)
            same = segments[:, None, :, None] == segments[:, None, None, :]  # (1, 1, n, n)
            dense = same if dense is None else dense & same
        if self.causal:
            m = key_mask.shape[-1] if key_mask is not None else self.num_keys
            if self.num_queries is None or m is None:
                raise ValueError("A causal AttentionMask with padding or a prefix needs `num_queries` and `num_keys`.")
            if self.query_positions is not None:
                tri = torch.arange(m, device=device) <= self.query_positions.to(device)[:, None]  # (n, m)
            else:
                tri = causal_pattern(self.num_queries, m, self.prefix_length, device)  # (n, m)
            dense = tri[None, None] if dense is None else dense & tri  # (b or 1, 1, n, m)
        if self.packing is not None and key_mask is None:
            return dense, None  # every query of a packed row sees itself
        has_keys = dense.any(-1, keepdim=True)  # (b, 1, n or 1, 1)
        # Rows without any key would give NaN in softmax: let them attend to everything, then zero them.
        return dense | ~has_keys, has_keys


def causal_pattern(n, m, prefix_length=0, device=None):
    """(n, m) bool: query i sees key j <= i + m - n; the first `prefix_length` queries see the keys before
    m - n + prefix_length (a bidirectional prefix)."""
    allowed = torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n)
    if prefix_length:
        allowed[:prefix_length, : m - n + prefix_length] = True
    return allowed

"""Which keys each query sees: `AttentionMask`, built once per forward and shared by every attention layer, and the
causal pattern it is made from.

Shape legend: b batch, n queries, m keys.
"""

from dataclasses import dataclass

import torch


@dataclass
class AttentionMask:
    """Which keys each query sees: built once per forward and handed to every attention layer that shares it. Each
    kernel reads the form it needs: the linear kernels `key_mask` and `causal`, the softmax kernels `dense_form`,
    which is made from them on first use (so no mask is "for" one kind of kernel).

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

    Everything made from it (`dense_form`) is made on the device of the queries it is used with.
    """

    key_mask: torch.Tensor | None = None
    causal: bool = False
    prefix_length: int = 0
    num_queries: int | None = None
    num_keys: int | None = None
    query_positions: torch.Tensor | None = None

    @classmethod
    def build(cls, key_mask, causal=False, num_queries=None, num_keys=None, prefix_length=0, query_positions=None):
        """`key_mask` (b, m), 1/True for real keys, or None. `num_queries` is needed when `causal`; `num_keys` when
        `causal` and there is no `key_mask` but a prefix or a causal cross-attention needs a dense mask.

        Reads no values (no host sync): a mask whose keys are all real is dropped once per batch, by the model's
        input check (`modeling_common.check_input_values`), not here."""
        if prefix_length and not causal:
            raise ValueError("`prefix_length` needs a causal mask (a bidirectional prefix, causal after it).")
        if query_positions is not None and (prefix_length or not causal):
            raise ValueError("`query_positions` needs a causal mask without a prefix.")
        key_mask = None if key_mask is None else key_mask.bool()
        return cls(key_mask, causal, prefix_length, num_queries, num_keys, query_positions)

    def dense_form(self, device):
        """(dense, has_keys) for the softmax kernels, made on first use on `device` (the queries' device; a mask
        without `key_mask` has no device of its own) and kept for the other layers that share this mask.

        dense: (b or 1, 1, n or 1, m) bool, or None (no mask, or plain causal: the kernel's own causal path).
        has_keys: (b or 1, 1, n or 1, 1) bool, False for queries that see no key at all (their output is set to 0),
        or None."""
        forms = self.__dict__.setdefault("_dense", {})
        device = torch.device(device)
        if device not in forms:
            forms[device] = self._make_dense(device)
        return forms[device]

    def _make_dense(self, device):
        key_mask = None if self.key_mask is None else self.key_mask.to(device)
        if key_mask is None and not self.prefix_length and self.query_positions is None:
            return None, None
        dense = key_mask[:, None, None, :] if key_mask is not None else None  # (b, 1, 1, m)
        if self.causal:
            m = key_mask.shape[-1] if key_mask is not None else self.num_keys
            if self.num_queries is None or m is None:
                raise ValueError("A causal AttentionMask with padding or a prefix needs `num_queries` and `num_keys`.")
            if self.query_positions is not None:
                tri = torch.arange(m, device=device) <= self.query_positions.to(device)[:, None]  # (n, m)
            else:
                tri = causal_pattern(self.num_queries, m, self.prefix_length, device)  # (n, m)
            dense = tri[None, None] if dense is None else dense & tri  # (b or 1, 1, n, m)
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

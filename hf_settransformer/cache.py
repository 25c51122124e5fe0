"""The cache of causal linear attention: one recurrent state per layer (Katharopoulos et al. 2020, sec. 3.4).

A causal linear-attention decoder is an RNN: everything the past contributes to layer l is `sum phi(k) v^T`
(h x d x e) and `sum phi(k)` (h x d), plus, for the `"exp"` feature map, the per-feature key maxima those sums are
scaled by. Each new token updates them in place of appending keys and values, so memory and time per token do not
grow with the context. Softmax attention uses transformers' own `DynamicCache` instead.

`LinearAttentionCache` is a transformers `Cache`, so `generate()` handles it like any other: beam search reorders it
(`reorder_cache`), `num_return_sequences`/contrastive search expand it (`batch_repeat_interleave`), and
`get_seq_length()` counts the tokens seen.
"""

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class LinearAttentionState:
    """Recurrent state of causal linear attention for one layer: everything the past contributes.

    kv: (b, h, d, e) sum of phi(k) v^T;  z: (b, h, d) sum of phi(k);
    k_max: (b, h, d) per-feature key maximum the sums are scaled by (`"exp"` only; None for `"elu"`).
    The sizes do not depend on how many tokens were seen.
    """

    kv: torch.Tensor
    z: torch.Tensor
    k_max: torch.Tensor | None = None


class RecurrentStateLayer(CacheLayerMixin):
    """One layer's `LinearAttentionState` and the number of tokens folded into it."""

    is_compileable = False
    is_sliding = False
    supports_early_init = False

    def __init__(self, **kwargs):
        super().__init__()
        self.state: LinearAttentionState | None = None
        self.seen_tokens = 0

    def lazy_initialization(self, *args, **kwargs):
        pass

    def update(self, *args, **kwargs):
        raise TypeError("A linear-attention layer keeps a recurrent state, not keys and values: use `set_state`.")

    def set_state(self, state: LinearAttentionState, new_tokens: int):
        self.state = state
        self.seen_tokens += new_tokens
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state = None
        self.seen_tokens = 0
        self.is_initialized = False

    def _map(self, fn):
        if self.state is not None:
            s = self.state
            self.state = LinearAttentionState(kv=fn(s.kv), z=fn(s.z), k_max=None if s.k_max is None else fn(s.k_max))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("A linear-attention state is a sum over the past: tokens cannot be removed.")

    def offload(self):
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        pass


class LinearAttentionCache(Cache):
    """Per-layer recurrent states of causal linear attention; its size does not depend on the context length."""

    def __init__(self, config=None, num_layers=None):
        num_layers = num_layers if num_layers is not None else config.num_hidden_layers
        super().__init__(layers=[RecurrentStateLayer() for _ in range(num_layers)])

    def get_state(self, layer_idx: int) -> LinearAttentionState | None:
        return self.layers[layer_idx].state

    def set_state(self, layer_idx: int, state: LinearAttentionState, new_tokens: int) -> None:
        self.layers[layer_idx].set_state(state, new_tokens)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def state_nbytes(self) -> int:
        """Bytes held by all the states (constant once the first token has been seen)."""
        total = 0
        for layer in self.layers:
            if layer.state is not None:
                for t in (layer.state.kv, layer.state.z, layer.state.k_max):
                    total += 0 if t is None else t.numel() * t.element_size()
        return total


def cache_layer(cache: Cache, layer_idx: int) -> CacheLayerMixin:
    """The layer `layer_idx` of `cache`, created first where the cache grows its layers lazily (a `DynamicCache()`
    made without a config, as `generate()` of an `EncoderDecoderModel` hands over)."""
    if cache.layer_class_to_replicate is not None:
        while len(cache.layers) <= layer_idx:
            cache.layers.append(cache.layer_class_to_replicate())
    return cache.layers[layer_idx]


def cache_holds(cache: Cache, layer_class: type) -> bool:
    """Whether every layer of `cache` (also those it will grow) is a `layer_class`."""
    grown = cache.layer_class_to_replicate
    return all(isinstance(layer, layer_class) for layer in cache.layers) and (
        grown is None or issubclass(grown, layer_class)
    )

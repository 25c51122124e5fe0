"""The cache of causal linear attention: one recurrent state per layer (Katharopoulos et al. 2020, sec. 3.4).

A causal linear-attention decoder is an RNN: everything the past contributes to layer l is `sum phi(k) v^T`
(h x d x e) and `sum phi(k)` (h x d), plus, for the `"exp"` feature map, the per-feature key maxima those sums are
scaled by. Each new token updates them in place of appending keys and values, so memory and time per token do not
grow with the context. Softmax attention uses transformers' own `DynamicCache` instead.

`LinearAttentionCache` is a transformers `Cache`, so `generate()` handles it like any other: beam search reorders it
(`reorder_cache`), `num_return_sequences`/contrastive search expand it (`batch_repeat_interleave`), and
`get_seq_length()` counts the tokens seen. Built with `static=True`, it keeps its states at fixed addresses and counts
in a tensor, for a compiled (CUDA-graphed) decoding step: the recurrent state needs no `StaticCache`, its size is fixed
already. `static_cache_length` recognises transformers' `StaticCache` (softmax attention's fixed-size keys and values).
"""

from dataclasses import dataclass, fields

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, StaticLayer


@dataclass
class LinearAttentionState:
    """Recurrent state of causal linear attention for one layer: everything the past contributes.

    kv: (b, h, d, e) sum of phi(k) v^T;  z: (b, h, d) sum of phi(k) (with a decay, each term decayed to now);
    k_max: (b, h, d) per-feature key maximum the sums are scaled by (`"exp"` only; None for `"elu"`); with a decay,
    the maximum of the decayed keys k_j + log(decay from j to now), which a decay step lowers by log g.
    The sizes do not depend on how many tokens were seen.
    """

    kv: torch.Tensor
    z: torch.Tensor
    k_max: torch.Tensor | None = None


def _state_tensors(state: LinearAttentionState):
    return [getattr(state, f.name) for f in fields(state)]  # kv, z, k_max (None for "elu")


def _same_layout(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


class RecurrentStateLayer(CacheLayerMixin):
    """One layer's `LinearAttentionState` and the number of tokens folded into it.

    `static=True`, for a compiled decoding step (inference): each new state is copied into the buffers the first one
    was put in (the prefill's), whose addresses stay fixed (`torch._dynamo.mark_static_address`, as transformers'
    `StaticLayer` does for keys and values: CUDA graphs replay on fixed addresses), and the tokens are counted in a
    tensor, `cumulative_length`, advanced in place and returned by `get_seq_length()`: a Python count would be a
    constant of the compiled graph, recompiled at every step. The states are detached (no gradient flows through them).

    `is_compileable` stays False even then: `generate()` would compile the forward on a GPU and feed it an attention
    mask that grows by one column per step (a new shape each step); compile the step yourself (see
    `benchmarks/bench_generation.py --compile`)."""

    can_drop_tokens = False  # a sum over the past: `crop` cannot take tokens out (assisted generation needs it)

    is_compileable = False
    is_sliding = False
    supports_early_init = False

    def __init__(self, static=False, feature_map=None, decay=None, **kwargs):
        super().__init__()
        self.feature_map = feature_map  # the config's that made this layer (None: unknown); a cache continues only it
        self.decay = decay  # likewise its `linear_attention_decay`
        self.state: LinearAttentionState | None = None
        self.seen_tokens = 0
        self.static = static
        self.cumulative_length = torch.zeros((), dtype=torch.long) if static else None

    def lazy_initialization(self, *args, **kwargs):
        pass

    def update(self, *args, **kwargs):
        raise TypeError("A linear-attention layer keeps a recurrent state, not keys and values: use `set_state`.")

    def set_state(self, state: LinearAttentionState, new_tokens: int):
        if self.static:
            self._write_in_place(state)
            self.cumulative_length.add_(new_tokens)  # in place: the counter keeps its (static) address
        else:
            self.state = state
            self.seen_tokens += new_tokens
        self.is_initialized = True

    def _write_in_place(self, state: LinearAttentionState):
        old = self.state
        if old is not None and all(map(_same_layout, _state_tensors(old), _state_tensors(state))):
            for buffer, new in zip(_state_tensors(old), _state_tensors(state)):
                if buffer is not None:
                    buffer.copy_(new)
            return
        # the first state (or one of a new batch size or dtype): new buffers, whose addresses every later step keeps
        self.state = LinearAttentionState(*(None if t is None else t.detach().clone() for t in _state_tensors(state)))
        self.cumulative_length = self.cumulative_length.to(state.kv.device)
        self._mark_static()

    def _mark_static(self):
        # not while tracing (dynamo refuses it there), as transformers' StaticLayer: the prefill runs eagerly
        if self.static and not torch.compiler.is_compiling():
            for t in [*_state_tensors(self.state), self.cumulative_length]:
                if t is not None:
                    torch._dynamo.mark_static_address(t)

    def get_seq_length(self):
        """The tokens folded into the state: an int, or with `static=True` the counter tensor (0 before the first)."""
        if self.static:
            return self.cumulative_length if self.is_initialized else 0
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state = None
        self.seen_tokens = 0
        if self.static:
            self.cumulative_length.zero_()
        self.is_initialized = False

    def _map(self, fn):
        if self.state is not None:
            self.state = LinearAttentionState(*(None if t is None else fn(t) for t in _state_tensors(self.state)))
            self._mark_static()  # new tensors (beam search, a new batch): fixed from here on

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

    def __init__(self, config=None, num_layers=None, static=False):
        """`static=True`: states updated in place at fixed addresses and tokens counted in a tensor, for a compiled
        or CUDA-graphed decoding step (see `RecurrentStateLayer`). Each layer records `config.feature_map` and
        `config.linear_attention_decay`: a model of another refuses to continue it (`cache_checks.check_cache_fits`)."""
        num_layers = num_layers if num_layers is not None else config.num_hidden_layers
        made_by = {"feature_map": getattr(config, "feature_map", None), "decay": getattr(config, "linear_attention_decay", None)}
        super().__init__(layers=[RecurrentStateLayer(static=static, **made_by) for _ in range(num_layers)])

    def get_seq_length(self, layer_idx: int = 0):
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


def static_cache_layouts(cache: Cache | None) -> set | None:
    """{(layer class name, max_cache_len)} of a cache with `StaticLayer`s, None for any other cache. A static cache
    here holds one plain `StaticLayer` per layer, of one length (`checks.check_cache`)."""
    if cache is None or not any(isinstance(layer, StaticLayer) for layer in cache.layers):
        return None
    return {(type(layer).__name__, getattr(layer, "max_cache_len", None)) for layer in cache.layers}


def static_cache_length(cache: Cache | None) -> int | None:
    """The number of key slots of a cache of fixed-size key and value buffers (transformers' `StaticCache`, from
    `generate(cache_implementation="static")`), or None for any other cache (one that grows, or a recurrent state).
    Slot i holds the token at position i of the sequence."""
    if cache is None or not any(isinstance(layer, StaticLayer) for layer in cache.layers):
        return None
    return cache.layers[0].max_cache_len


def cache_batch_size(cache: Cache | None) -> int | None:
    """The batch size the states in `cache` were made for (keys and values, or recurrent states), None while it holds
    none: a cache of one batch fed another would pair each row with another row's past (or broadcast a batch of one)."""
    if cache is None:
        return None
    for layer in cache.layers:
        state = getattr(layer, "state", None)
        if state is not None:
            return state.kv.shape[0]
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_initialized", False) and torch.is_tensor(keys) and keys.dim() == 4:
            return keys.shape[0]
    return None

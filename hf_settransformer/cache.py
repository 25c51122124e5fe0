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

`DecoderCache` is what one forward of a decoder knows of its cache (which cache, of which kind, how many tokens it
holds, a static cache's slots), worked out once and handed down to every block.
"""

from dataclasses import dataclass, fields

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, EncoderDecoderCache, StaticLayer


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
        made_by = {"feature_map": getattr(config, "feature_map", None)}
        made_by["decay"] = getattr(config, "linear_attention_decay", None)
        super().__init__(layers=[RecurrentStateLayer(static=static, **made_by) for _ in range(num_layers)])

    def get_seq_length(self, layer_idx: int = 0):
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def record_model(self, config):
        """Record `config`'s feature map and decay on the layers that record none and hold no state yet (a cache made
        without a config, about to be filled by its first model)."""
        for layer in self.layers:
            if layer.state is None and layer.feature_map is None:
                layer.feature_map = config.feature_map
            if layer.state is None and layer.decay is None:
                layer.decay = config.linear_attention_decay

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


def static_cache_length(cache: Cache | None) -> int | None:
    """The number of key slots of a cache of fixed-size key and value buffers (transformers' `StaticCache`, from
    `generate(cache_implementation="static")`), or None for any other cache (one that grows, or a recurrent state).
    Slot i holds the token at position i of the sequence."""
    if cache is None or not any(isinstance(layer, StaticLayer) for layer in cache.layers):
        return None
    return cache.layers[0].max_cache_len


@dataclass
class DecoderCache:
    """A decoder's `past_key_values` as one forward reads and extends it: worked out once (`read`, by the checks of the
    outermost call or by the forward itself) and handed to every block as it is; each attention layer takes its own
    cache layer by its `layer_idx`, as Llama's attention calls `past_key_values.update(k, v, self.layer_idx)`."""

    returned: Cache | None  # the cache the forward returns: the one given, or the one made
    self_attention: Cache | None  # the causal self-attention's cache, None without one
    pair: EncoderDecoderCache | None  # the given or made `EncoderDecoderCache` (cross-attention keys and values)
    kind: str | None  # "own" (the kernel's `cache_class`), "static" (a `StaticCache`), "other" (another kind that holds
    # states already: refused by `cache_checks.check_cache`); None without a cache
    past_length: int | torch.Tensor  # tokens seen before this forward (a tensor where the cache counts on the device)
    static_length: int | None  # a static cache's number of key slots (slot i holds position i)

    @classmethod
    def read(cls, kernel, config, past_key_values, use_cache=True, cross_attention=False) -> "DecoderCache":
        """The facts of `past_key_values` for a decoder of `config` whose attention is `kernel` (an `AttentionKernel`).

        None given and `use_cache`: a new cache, the kernel's `cache_class` (in an `EncoderDecoderCache` when
        `cross_attention`). An empty self-attention cache of another kind (generate() of `EncoderDecoderModel` hands
        over a `DynamicCache`) is replaced by the kernel's own. A `LinearAttentionCache` made without a config records
        this model's feature map and decay (its first model; another is then refused)."""
        if past_key_values is None and use_cache:
            past_key_values = kernel.cache_class(config=config)
            if cross_attention:
                past_key_values = EncoderDecoderCache(past_key_values, DynamicCache(config=config))
        pair = past_key_values if isinstance(past_key_values, EncoderDecoderCache) else None
        self_cache = past_key_values if pair is None else pair.self_attention_cache
        if self_cache is None:
            return cls(None, None, None, None, 0, None)
        static_length = static_cache_length(self_cache)
        kind = "static" if static_length is not None else "own"
        if kind == "own" and not cache_holds(self_cache, kernel.cache_layer_class):
            kind = "other"
            if not self_cache.get_seq_length():  # empty: the model makes its own
                kind, self_cache = "own", kernel.cache_class(config=config)
                if pair is None:
                    past_key_values = self_cache
                else:
                    pair.self_attention_cache = self_cache
        if kind == "own" and isinstance(self_cache, LinearAttentionCache):
            self_cache.record_model(config)
        # a tensor for a static cache: slots and positions are computed from it, never read back
        return cls(past_key_values, self_cache, pair, kind, self_cache.get_seq_length(), static_length)

    def layer(self, layer_idx: int) -> CacheLayerMixin | None:
        """The self-attention cache layer of block `layer_idx`, which its kernel reads and extends; None without one."""
        return None if self.self_attention is None else cache_layer(self.self_attention, layer_idx)

    def cross_cached(self, layer_idx: int) -> bool:
        """Whether the cross-attention layer of block `layer_idx` holds the encoder's keys and values already."""
        return self.pair is not None and bool(self.pair.is_updated.get(layer_idx))

    def cross_keys_values(self, layer_idx: int, keys=None, values=None):
        """The cross-attention keys and values of block `layer_idx`: those cached (`cross_cached`), or `keys` and
        `values` (b, h, m, d), kept in the cache for the next forwards where there is one."""
        if self.pair is None:
            return keys, values
        layer = cache_layer(self.pair.cross_attention_cache, layer_idx)
        if self.cross_cached(layer_idx):
            return layer.keys, layer.values
        self.pair.is_updated[layer_idx] = True
        return layer.update(keys, values)

"""The checks of a decoder's `past_key_values` (part of `checks.check_forward`): a cache continues only the model
that made it, so one of another kind (softmax keys and values, a linear-attention state), another linear-attention
feature map, another width (heads, head size) or depth (layers), or another batch is refused, naming both sides,
instead of failing inside torch or running on with a past the model never computed."""

import torch

from .attention import attention_kernel
from .cache import DecoderCache
from .families import family_for_model_type
from .feature_maps import get_feature_map


def check_cache(model, inputs, b, n):
    """A decoder's `past_key_values` and its mask -> (past length, a tensor where the cache counts on the device;
    static cache slots or None). A given cache is read once here (`DecoderCache.read`), and `inputs` hand the forward
    that `DecoderCache` in its place."""
    mask, given = inputs.get("attention_mask"), inputs.get("past_key_values")
    if mask is not None and mask.dim() == 4:
        # transformers' generate() builds them for a static cache, unless the model's `create_masks_for_generate`
        # says otherwise, as this decoder's does; EncoderDecoderModel's does not
        raise ValueError(
            f"This decoder takes a 2-D `attention_mask` (batch, length), got {tuple(mask.shape)}: a 4-D mask, as "
            'generate() makes with `cache_implementation="static"` for a model that wraps this decoder '
            "(EncoderDecoderModel). Generate with the default dynamic cache there."
        )
    if given is None:
        return 0, None
    kernel = attention_kernel(model.config)
    cache = DecoderCache.read(kernel, model.config, given)
    if cache.kind == "static":
        layers = cache.self_attention.layers
        layouts = {(type(layer).__name__, getattr(layer, "max_cache_len", None)) for layer in layers}
        if len(layouts) != 1 or next(iter(layouts))[0] != "StaticLayer":
            raise ValueError(
                "A static cache here must hold one `StaticLayer` per layer, all of one `max_cache_len` (slot i holds "
                f"position i; sliding-window layers reuse slots), got {sorted(layouts, key=str)}."
            )
        check_static_cache(kernel, model.config)
    elif cache.kind == "other":
        raise ValueError(
            f"This decoder's attention keeps its past in a {kernel.cache_class.__name__}, not a "
            f"{type(cache.self_attention).__name__} that already holds other states."
        )
    check_cache_fits(model.config, cache.self_attention)
    cached = cache_batch_size(cache.self_attention)
    if cached is not None and cached != b:
        raise ValueError(
            f"`past_key_values` hold the past of a batch of {cached}, but the inputs are a batch of {b}: continue a "
            "cache with the batch it was made for (generate() handles beams and repeats itself)."
        )
    slots = cache.static_length
    if slots is not None and mask is not None and mask.shape[-1] != slots:
        raise ValueError(
            f"With a static cache of {slots} slots, `attention_mask` must have one column per slot, (batch, {slots}), "
            f"0 past the tokens seen so far (generate() pads it so); got {tuple(mask.shape)}."
        )
    inputs["past_key_values"] = cache
    return cache.past_length, slots


def cache_batch_size(cache):
    """The batch size the states in `cache` were made for (keys and values, or recurrent states), None while it holds
    none: a cache of one batch fed another would pair each row with another row's past (or broadcast a batch of one)."""
    for layer in cache.layers:
        state = getattr(layer, "state", None)
        if state is not None:
            return state.kv.shape[0]
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_initialized", False) and torch.is_tensor(keys) and keys.dim() == 4:
            return keys.shape[0]
    return None


def check_static_cache(kernel, config):
    """Refuse a `StaticCache` (fixed-size keys and values) where the attention kernel cannot extend one."""
    if kernel.static_cache_layer_class is None:
        _, words = kernel.describe(config)
        raise ValueError(
            f'{words} attention cannot use a static cache (`cache_implementation="static"` or a `StaticCache`): it '
            f"keeps no keys and values but its own state, a {kernel.cache_class.__name__}, whose size does not grow "
            "with the context. Generate without `cache_implementation`; for a compiled (CUDA-graphed) step, use "
            f"`{kernel.cache_class.__name__}(config=config, static=True)`, which keeps that state at fixed addresses."
        )


def check_no_cache(model, past_key_values):
    """A cache handed to a family that keeps none would be dropped without a word (`use_cache` passes, as in BERT)."""
    if past_key_values is not None and not model.keeps_a_cache:
        family = family_for_model_type(model.config.model_type).name
        raise ValueError(
            f"{type(model).__name__} (family {family!r}) keeps no cache, so `past_key_values` has nothing to "
            "continue: an encoder reads its whole input at every call. Pass the whole sequence, without "
            "`past_key_values` (the decoder family is the one that continues a cache)."
        )


def check_assisted_generation(model):
    """Assisted generation (`assistant_model=`, `prompt_lookup_num_tokens=`) runs candidate tokens through the model in
    one forward, then drops the rejected ones from its cache: it needs a cache whose tokens can be dropped
    (transformers would say only "assisted decoding requires a cache")."""
    how = "`assistant_model` or `prompt_lookup_num_tokens`"
    if not model.keeps_a_cache:
        raise ValueError(
            f"Assisted generation ({how}) needs a cache to drop rejected candidate tokens from, and "
            f"{type(model).__name__} keeps none (it reads its whole window at each step). Generate without them."
        )
    kernel = attention_kernel(model.config)
    if not getattr(kernel.cache_layer_class, "can_drop_tokens", True):
        raise ValueError(
            f"Assisted generation ({how}) is not supported with attention_type={model.config.attention_type!r}: it "
            "checks several candidate tokens in one forward, then drops the rejected ones from the cache, and a "
            "recurrent state (a sum over the past) cannot drop tokens. Generate without them: greedy search, "
            "sampling and beam search run on the state."
        )


def check_cache_fits(config, cache):
    """A cache of this model's kind that another model made: its layer count, each layer's heads and head size, and a
    linear-attention state's feature map and decay (recorded by the `LinearAttentionCache`: from the config it was made
    with, or from the model that filled it first; the map is seen in the state too, as an `"exp"` state keeps key
    maxima) must be this model's; continued, a past of another feature map gives wrong logits, one of another width a
    shape error inside torch."""
    layers = config.num_hidden_layers
    grows = cache.layer_class_to_replicate is not None
    if len(cache.layers) < layers and not grows or len(cache.layers) > layers and cache.get_seq_length() > 0:
        raise ValueError(
            f"`past_key_values` hold {len(cache.layers)} layers, but this model has {layers} "
            "(`num_hidden_layers`): a cache continues only the model that made it."
        )
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    for index, layer in enumerate(cache.layers):
        recorded = getattr(layer, "feature_map", None)
        if recorded is not None and recorded != config.feature_map:
            refuse_feature_map(f"the {recorded!r} feature map", config.feature_map)
        decay = getattr(layer, "decay", None)
        if decay is not None and decay != config.linear_attention_decay:
            raise ValueError(
                f"`past_key_values` hold linear-attention states decayed with linear_attention_decay={decay!r}, but "
                f"this model's is {config.linear_attention_decay!r}: its past would be decayed otherwise than it was "
                "made (wrong logits). Continue a cache with the model that made it."
            )
        state = getattr(layer, "state", None)
        if state is not None:
            shape = tuple(state.kv.shape[1:])  # (h, d, e)
            if (state.k_max is not None) != get_feature_map(config.feature_map).stabilised:
                made = "with" if state.k_max is not None else "without"
                refuse_feature_map(f"a feature map {made} key maxima (as 'exp' keeps)", config.feature_map)
        else:
            keys = getattr(layer, "keys", None)
            if not (getattr(layer, "is_initialized", False) and torch.is_tensor(keys) and keys.dim() == 4):
                continue
            shape = (keys.shape[1], keys.shape[3], keys.shape[3])
        if shape != (heads, head_dim, head_dim):
            raise ValueError(
                f"`past_key_values` layer {index} holds {shape[0]} heads of size {shape[1]} (hidden size "
                f"{shape[0] * shape[1]}), but this model has {heads} heads of size {head_dim} (`hidden_size` "
                f"{config.hidden_size}, `num_attention_heads` {heads}): a cache continues only the model that made it."
            )


def refuse_feature_map(made, feature_map):
    raise ValueError(
        f"`past_key_values` hold linear-attention states of {made}, but this model's "
        f"`feature_map` is {feature_map!r}: its past would be read as another map's sums (wrong logits). Continue a "
        "cache with the model that made it."
    )

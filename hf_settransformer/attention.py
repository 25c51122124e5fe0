"""The attention kernel registry and `MultiHeadAttention`.

Shape legend: b batch, n queries, m keys, h heads, d query/key head dim, e value head dim.

Two questions are kept apart:
- *what* is computed, `config.attention_type`: `"softmax"` (Vaswani et al. 2017) or `"linear"` with
  `config.feature_map`, an entry of `feature_maps.FEATURE_MAPS` (`"elu"`, `"exp"`);
- *how* softmax is computed, transformers' `config._attn_implementation` (`"sdpa"`, `"eager"`, `"flash_attention_2"`,
  `"flex_attention"`, ...): the softmax kernel calls `ALL_ATTENTION_FUNCTIONS`, as Llama does (`softmax_ops.py`).
  Linear attention has no softmax to compute: it runs under `"sdpa"` (the default) or `"eager"` and refuses others.

The ops live one concern a file: `masks.py` (`AttentionMask`), `softmax_ops.py`, `linear_ops.py` (with their naive
references in `linear_naive.py`). `ATTENTION_KERNELS` maps each `attention_type` to an `AttentionKernel` entry (its
forward, its cache, whether it has weights); `MultiHeadAttention` takes its kernel from there when it is built. A new
kernel is one entry (`register_attention_kernel`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.cache_utils import DynamicCache, DynamicLayer, StaticLayer

from .cache import LinearAttentionCache, LinearAttentionState, RecurrentStateLayer
from .decay import decay_applies, decay_module
from .linear_ops import (
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
    prefix_causal_linear_attention,
)
from .masks import AttentionMask, causal_pattern
from .softmax_ops import softmax_attention

__all__ = [
    "ATTENTION_KERNELS",
    "AttentionKernel",
    "AttentionMask",
    "LinearAttentionState",
    "MultiHeadAttention",
    "attention_kernel",
    "causal_pattern",
    "linear_kernel",
    "register_attention_kernel",
    "softmax_kernel",
]


# ---------------------------------------------------------------------------------------------------------------
# The kernel registry: one entry per `config.attention_type`. Everything that depends on the attention type (the
# computation, the cache `generate()` keeps, whether weights exist, the config fields read) is asked of the entry.


def softmax_kernel(
    q, k, v, mask, state=None, *, dropout_p=0.0, need_weights=False, implementation="sdpa", module=None, **_
):
    """Softmax attention (Vaswani et al. 2017): q (b,h,n,d), k (b,h,m,d), v (b,h,m,e) -> (out (b,h,n,e), weights
    (b,h,n,m) when `need_weights` else None).

    `state`: the layer's `DynamicLayer` while generating: the new keys and values are appended to it and the queries
    attend to all of them; or a `StaticLayer` (transformers' `StaticCache`): they are written into its fixed buffers,
    all of whose slots the queries see, the unwritten ones masked by `mask.query_positions` (the same shapes at every
    step). `implementation`: transformers' `config._attn_implementation`, the `ALL_ATTENTION_FUNCTIONS` entry that
    computes it (weights are computed eagerly); `module`: the calling layer, which those functions read."""
    options = {"module": module, "dropout_p": dropout_p, "need_weights": need_weights}
    if state is None:
        return softmax_attention(q, k, v, mask, implementation, **options)
    k, v = state.update(k, v)  # (b, h, past + n, d); a StaticLayer's (b, h, max_cache_len, d)
    # A growing cache has a new key length at every step. SDPA's cuDNN backend (preferred on Hopper GPUs) builds an
    # execution graph per shape, tens to hundreds of ms each (seen with cuDNN attention in pytorch/torchtune#1652,
    # sgl-project/sglang#4650, ml-explore/mlx#2743): decoding steps use the other backends, which need no planning.
    with sdpa_kernel(_DECODE_BACKENDS):
        return softmax_attention(q, k, v, mask, implementation, **options)


_DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def linear_kernel(
    q, k, v, mask, state=None, *, feature_map="elu", chunk_size=64, linear_attention_decay="none", dropout_p=0.0,
    module=None, key_states=None, **_
):
    """Linear attention (Katharopoulos et al. 2020; Shen et al. 2021): shapes as `softmax_kernel`, out in fp32,
    weights always None. Causal masks run chunked (`causal_linear_attention`), with a bidirectional prefix or leading
    keys through `prefix_causal_linear_attention`; `state` (the layer's `RecurrentStateLayer` while generating) is
    read and advanced, one token at a time by `linear_attention_step`. A packed row (`mask.packing`) restarts the
    causal state at each sequence (`seq_idx`).

    `dropout_p` (the layer's attention dropout while training): there is no weight matrix to drop entries of, so each
    key is dropped, per head, with this probability: left out of every query's sums (numerator and normaliser), as a
    masked key is. The weights the other keys get are renormalised by the ratio itself; this is DropKey (Li et al.
    2023) with one mask for all the queries of a head, which keeps the cost linear.

    A layer with a decay (`config.linear_attention_decay`, `decay.DECAYS`) has it as `module.decay`, which gives each
    key position's log-decay from `key_states` (the stream the keys were projected from); causal attention only: a
    non-causal mask has no order, and runs undecayed."""
    drop = torch.rand(k.shape[:3], device=k.device) >= dropout_p if dropout_p > 0 else None  # (b, h, m)
    options = {"feature_map": feature_map, "drop": drop}
    if mask.packing is not None:  # a packed row: the causal ops restart their state at each sequence
        if not mask.causal or state is not None:
            raise ValueError("Linear attention takes a packed row only causally and without a cache.")
        options["seq_idx"] = mask.segments
    if not mask.causal:
        out, _ = linear_attention(q, k, v, mask.key_mask, **options)
        return out, None
    gate = getattr(module, "decay", None)
    if gate is not None:
        options["decay"] = gate(key_states)  # (b, h, m)
    if state is None and (mask.prefix_length or k.shape[2] != q.shape[2]):
        out, _ = prefix_causal_linear_attention(
            q, k, v, mask.key_mask, chunk_size=chunk_size, prefix_length=mask.prefix_length, **options
        )
        return out, None
    n = q.shape[2]
    key_mask = None if mask.key_mask is None else mask.key_mask[:, -n:]  # the new tokens: the past is in the state
    past = None if state is None else state.state
    if n == 1 and past is not None:
        out, new = linear_attention_step(q, k, v, key_mask, past, **options)
    else:
        out, new = causal_linear_attention(q, k, v, key_mask, past, chunk_size=chunk_size, **options)
    if state is not None:
        state.set_state(new, n)
    return out, None


def _no_layer_options(config):
    return {}


def _describe_by_type(config):
    return config.attention_type, config.attention_type


def _linear_layer_options(config):
    return {
        "feature_map": config.feature_map,
        "chunk_size": config.linear_attention_chunk_size,
        "linear_attention_decay": config.linear_attention_decay,
    }


def _linear_layer_modules(config, num_heads, ordered=True):
    if not decay_applies(config.linear_attention_decay, causal=ordered):
        return {}
    module = decay_module(config.linear_attention_decay, config.hidden_size, num_heads)
    return {} if module is None else {"decay": module}


def _describe_linear(config):
    decay = config.linear_attention_decay
    if decay == "none":
        return f"linear-{config.feature_map}", f"linear ({config.feature_map} feature map)"
    return f"linear-{config.feature_map}-{decay}", f"linear ({config.feature_map} feature map, {decay} decay)"


def _no_layer_modules(config, num_heads, ordered=True):
    return {}


@dataclass(frozen=True)
class AttentionKernel:
    """One attention type.

    forward: `(q, k, v, mask, state, **options) -> (out, weights or None)`, shapes as in `softmax_kernel`.
        `mask` is an `AttentionMask`; `state` is this layer's cache layer (a `cache_layer_class`) when a causal
        self-attention reads and extends a cache, else None: the kernel extends it in place (as transformers' cache
        layers are updated). `options`: the layer's `layer_options(config)` and, per
        call, `dropout_p`, `need_weights`, `implementation` (`config._attn_implementation`), `module` (the calling
        `MultiHeadAttention`) and `key_states` (the states the keys were projected from; None where a cross-attention
        reads them from its cache): keywords a kernel may ignore.
    cache_class: the `Cache` a causal model builds for `generate()`, as `cache_class(config=config)`; its layers are
        `cache_layer_class`.
    static_cache_layer_class: the layer of transformers' `StaticCache` (fixed-size key and value buffers, for a
        compiled decoding step: `generate(cache_implementation="static")`) when `forward` can extend one, else None
        (linear attention: its recurrent state has a fixed size already, see `LinearAttentionCache(static=True)`).
    layer_options: config -> the keyword options fixed when a layer is built.
    layer_modules: (config, number of heads, ordered) -> {name: module}: modules with the kernel's own parameters,
        built on each layer as `layer.<name>` (their weights are the layer's); `forward` reads them on `module`.
        `ordered` is False for a layer that never runs causally (ISAB's inducing points, an encoder-decoder's
        cross-attention), which then needs no module that an order would use.
    config_fields: the config fields `layer_options` reads; setting another kernel's field draws a warning.
    returns_weights: whether `output_attentions=True` can return attention weights.
    describe: config -> (short tag, words) naming the kernel as configured, for model cards and result tables
        (`("linear-elu", "linear (elu feature map)")`); default: the `attention_type` twice.
    implementations: the `attn_implementation` values the kernel runs under (others are refused when a layer is
        called), or None for all: softmax, which transformers' `ALL_ATTENTION_FUNCTIONS` computes.
    """

    forward: Callable
    cache_class: type
    cache_layer_class: type
    static_cache_layer_class: type | None = None
    layer_options: Callable = _no_layer_options
    layer_modules: Callable = _no_layer_modules
    config_fields: tuple = ()
    returns_weights: bool = False
    describe: Callable = _describe_by_type
    implementations: tuple | None = None


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "softmax": AttentionKernel(
        forward=softmax_kernel,
        cache_class=DynamicCache,
        cache_layer_class=DynamicLayer,
        static_cache_layer_class=StaticLayer,
        returns_weights=True,
    ),
    "linear": AttentionKernel(
        forward=linear_kernel,
        cache_class=LinearAttentionCache,
        cache_layer_class=RecurrentStateLayer,
        layer_options=_linear_layer_options,
        layer_modules=_linear_layer_modules,
        config_fields=("feature_map", "linear_attention_chunk_size", "linear_attention_decay"),
        describe=_describe_linear,
        implementations=("sdpa", "eager"),  # the default, and the one asked for attention weights
    ),
}


def register_attention_kernel(name: str, kernel: AttentionKernel) -> None:
    """Make `config.attention_type=name` select `kernel` (an existing name is replaced)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"An attention kernel's name must be a non-empty string, got {name!r}.")
    if not isinstance(kernel, AttentionKernel):
        raise TypeError(
            f"register_attention_kernel({name!r}, ...) takes an AttentionKernel (for instance "
            f"`dataclasses.replace(ATTENTION_KERNELS['softmax'], forward=...)`), got {type(kernel).__name__}."
        )
    ATTENTION_KERNELS[name] = kernel


def attention_kernel(config_or_name) -> AttentionKernel:
    """The registry entry of a config's `attention_type` (or of a name): the one place the attention type is read."""
    name = config_or_name if isinstance(config_or_name, str) else config_or_name.attention_type
    if name not in ATTENTION_KERNELS:
        raise ValueError(f"`attention_type` must be one of {sorted(ATTENTION_KERNELS)}, got {name!r}.")
    return ATTENTION_KERNELS[name]


# ---------------------------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Queries from `hidden_states`, keys and values from `context` (the same stream for self-attention), combined by
    the config's attention kernel (chosen here, once).

    Self-attention uses one fused q/k/v projection; cross-attention a query projection and a fused k/v one.
    `layer_idx`: this layer's place in a causal stack's cache. `ordered=False`: the layer never runs causally (its
    queries are a set, or read every key), so it builds none of the kernel's modules an order needs (a decay).
    """

    def __init__(self, config, self_attention=True, causal=False, num_heads=None, layer_idx=None, ordered=True):
        super().__init__()
        self.config = config  # read at call time: `model.set_attn_implementation` may change it
        self.hidden_size = config.hidden_size
        self.num_heads = num_heads or config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.self_attention = self_attention
        self.causal = causal
        self.layer_idx = layer_idx
        self.kernel = attention_kernel(config)
        self.kernel_options = self.kernel.layer_options(config)
        for name, kernel_module in self.kernel.layer_modules(config, self.num_heads, ordered).items():
            self.add_module(name, kernel_module)
        self.is_causal = causal  # read by transformers' attention functions
        self.dropout = config.attention_probs_dropout_prob
        if self_attention:
            self.qkv_proj = nn.Linear(self.hidden_size, 3 * self.hidden_size)
        else:
            self.q_proj = nn.Linear(self.hidden_size, self.hidden_size)
            self.kv_proj = nn.Linear(self.hidden_size, 2 * self.hidden_size)
        self.o_proj = nn.Linear(self.hidden_size, self.hidden_size)

    def __getstate__(self):
        # pickled (and deep-copied) by name: a registered kernel may hold lambdas, which pickle cannot store
        return dict(super().__getstate__(), kernel=self.config.attention_type)

    def __setstate__(self, state):
        name = state["kernel"]
        if isinstance(name, str):
            if name not in ATTENTION_KERNELS:
                raise ValueError(
                    f"This model uses attention_type={name!r}, which is not registered in this process: call "
                    f"`register_attention_kernel({name!r}, ...)` before unpickling it."
                )
            state = dict(state, kernel=ATTENTION_KERNELS[name])
        super().__setstate__(state)

    def _split_heads(self, x):
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, n, d)

    def project(self, hidden_states, context=None, past_key_values=None):
        """(b, n, hidden), (b, m, hidden) -> q (b,h,n,d), k (b,h,m,d), v (b,h,m,e).

        A cross-attention with a `DecoderCache` that keeps cross-attention keys and values projects the encoder
        states into it once, and reads them from it at the later steps (`context` is then None)."""
        if self.self_attention:
            q, k, v = self.qkv_proj(hidden_states).chunk(3, dim=-1)  # 3 x (b, n, hidden)
            return self._split_heads(q), self._split_heads(k), self._split_heads(v)
        q = self._split_heads(self.q_proj(hidden_states))
        if past_key_values is not None and past_key_values.cross_cached(self.layer_idx):
            return q, *past_key_values.cross_keys_values(self.layer_idx)
        k, v = self.kv_proj(context).chunk(2, dim=-1)  # 2 x (b, m, hidden)
        k, v = self._split_heads(k), self._split_heads(v)
        if past_key_values is not None:
            k, v = past_key_values.cross_keys_values(self.layer_idx, k, v)
        return q, k, v

    def forward(self, hidden_states, context=None, mask=None, output_attentions=False, past_key_values=None):
        """Returns (output (b, n, hidden), weights (b, h, n, m) or None).

        `past_key_values`: the causal stack's `DecoderCache`, or None. A self-attention hands its kernel its own cache
        layer (`past_key_values.layer(layer_idx)`, the kernel's `cache_layer_class` or a `StaticLayer`) as `state`,
        which the kernel reads and extends; a cross-attention keeps the projected encoder states there."""
        mask = mask if mask is not None else AttentionMask(causal=self.causal)
        q, k, v = self.project(hidden_states, context, past_key_values)
        state = past_key_values.layer(self.layer_idx) if self.self_attention and past_key_values is not None else None
        out, weights = self.kernel.forward(
            q,
            k,
            v,
            mask,
            state,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=output_attentions,
            implementation=self.config._attn_implementation,
            module=self,
            key_states=hidden_states if self.self_attention else context,
            **self.kernel_options,
        )
        b, _, n, _ = out.shape
        out = out.to(hidden_states.dtype) if out.dtype != hidden_states.dtype else out
        out = out.transpose(1, 2).reshape(b, n, self.hidden_size)  # (b, n, hidden)
        return self.o_proj(out), weights

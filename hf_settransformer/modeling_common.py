"""What every family's models share: the `PreTrainedModel` base (initialisation, saving with the modeling code,
cache refusal, generation argument checks), the output dataclasses of the set models, and output recording
(`record_outputs`). Input checks are in `checks.py`, heads in `heads.py`, losses in `losses.py`."""

import copy
import functools
import inspect
import math
import os
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import custom_object_save
from transformers.generation import GenerationMode
from transformers.utils import ModelOutput, logging
from transformers.utils.output_capturing import capture_outputs

from .attention import AttentionMask, attention_kernel
from .blocks import outermost_block_names
from .cache_checks import check_assisted_generation
from .checks import check_built_config, check_generation_config, check_model_config, check_resize, forward_names
from .configuration_base import built_fields
from .decay import GatedDecay
from .families import family_for_model_type
from .layers import AdaptiveProjection, FeatureProjection, LearnedVectors, ScaleNorm, position_ids_from_mask

logger = logging.get_logger(__name__)


@dataclass
class SetModelOutput(ModelOutput):
    """Output of models that pool a set.

    last_hidden_state: (b, n, hidden) one vector per element (permutation equivariant).
    pooler_output: (b, k, hidden) the k pooled vectors (permutation invariant).
    hidden_states: embeddings and the output of every encoder layer, when asked.
    attentions: softmax weights of every attention, when asked (two per ISAB: inducing<-set, set<-inducing).
    """

    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class PerceiverIOModelOutput(ModelOutput):
    """Output of [`PerceiverIOModel`].

    last_hidden_state: (b, q, hidden) the decoded output queries (one per input position unless learned).
    latent_hidden_state: (b, num_latents, hidden) the latents after the last block.
    hidden_states: the embedded inputs, then the latents after the cross-attention and after every self-attention.
    attentions: self-attention weights over the latents, when asked.
    cross_attentions: (encoder cross-attention, decoder cross-attention) weights, when asked.
    """

    last_hidden_state: torch.FloatTensor | None = None
    latent_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


def warn_if_no_weights(config, output_attentions):
    if output_attentions and not attention_kernel(config).returns_weights:
        logger.warning_once(
            "output_attentions=True: this attention kernel (linear attention) never forms an attention matrix, so "
            "`attentions` is None."
        )


def record_outputs(func=None, *, tie_last_hidden_states=True):
    """A base model's forward decorator: transformers' `capture_outputs` (hidden states and attentions recorded by hooks
    on the modules the class's `_can_record_outputs` names), around which it keeps this package's contract:

    - the flags take the config's defaults, also when passed positionally (`capture_outputs` reads keywords only);
      `output_attentions` is False for a kernel that forms no weights (linear attention: `attentions` is None, with a
      one-time warning, not an empty tuple); `output_hidden_states` is a flag, or as in transformers an index or a
      list of indices (negative ones counted from the end) selecting the states kept, the others None;
    - an attention that recorded nothing (`cross_attentions` of a decoder given no `encoder_hidden_states`) is None;
    - `return_dict=False`, passed or in the config, gives `to_tuple()`, as `can_return_tuple` does."""

    def decorate(func):
        names = [n for n, p in inspect.signature(func).parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD][1:]
        captured = capture_outputs(func, tie_last_hidden_states=tie_last_hidden_states)

        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            kwargs.update(zip(names, args))
            return_dict = kwargs.pop("return_dict", None)
            return_dict = self.config.return_dict if return_dict is None else return_dict
            attentions, hidden_states = resolve_output_flags(
                self.config, kwargs.pop("output_attentions", None), kwargs.pop("output_hidden_states", None)
            )
            selected = selected_hidden_states(hidden_states)
            outputs = captured(self, **kwargs, output_attentions=attentions, output_hidden_states=bool(hidden_states),
                               return_dict=True)
            if selected is not None and outputs.hidden_states is not None:
                # selected here, not by the hooks: their per-recorder layer counts do not index a family whose states
                # come from several kinds of layer (Set Transformer, Perceiver IO)
                count = len(outputs.hidden_states)
                keep = {i % count for i in selected if -count <= i < count}
                outputs.hidden_states = tuple(h if i in keep else None for i, h in enumerate(outputs.hidden_states))
            empty = [key for key in ("attentions", "cross_attentions") if getattr(outputs, key, None) == ()]
            if empty:  # a ModelOutput keeps a field set to None in its tuple: build it again without them
                outputs = type(outputs)(**{key: outputs[key] for key in outputs.keys() if key not in empty})
            return outputs if return_dict else outputs.to_tuple()

        return wrapper

    return decorate if func is None else decorate(func)


def selected_hidden_states(output_hidden_states):
    """The indices an `output_hidden_states` given as an int or a list of ints selects (as in transformers), or None
    for a flag."""
    if isinstance(output_hidden_states, bool) or output_hidden_states is None:
        return None
    return [output_hidden_states] if isinstance(output_hidden_states, int) else list(output_hidden_states)


def resolve_output_flags(config, output_attentions, output_hidden_states):
    """The flags, with the config's defaults; `output_attentions` is False for a kernel without weights (linear
    attention reports None, not a tuple of Nones)."""
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    warn_if_no_weights(config, output_attentions)
    return output_attentions and attention_kernel(config).returns_weights, output_hidden_states


def defining_class(cls):
    """`cls`, or for a subclass that a wrapper made at run time (FSDP2's `fully_shard`: `FSDP<Name>`, defined in
    torch), the model class it wraps: the first class of its MRO defined outside torch."""
    return next(c for c in cls.__mro__ if not c.__module__.startswith("torch."))


class HfstPreTrainedModel(PreTrainedModel):
    """Base of every hf_settransformer model. Every forward is `checks.checked`: the outermost call checks the inputs
    once; a base model builds its masks once, in `embed_inputs`."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    # softmax attention goes through transformers' ALL_ATTENTION_FUNCTIONS (`softmax_ops.py`), so every
    # attn_implementation is accepted; linear attention refuses all but "sdpa" (the default) and "eager" when called
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # set per model in `post_init` to the blocks it holds (`outermost_block_names`): accelerate's FSDP wrapping and
    # `device_map="auto"` refuse a class name the model does not contain
    _no_split_modules = None
    # only the decoder continues a `past_key_values`; the other families read their whole input at every call
    keeps_a_cache = False
    # takes a packed row of several sequences or sets (`packing.py`), each computed as if alone; others refuse one
    takes_packed_batches = False
    # What a forward of the class is, as the checks (`checks.py`) and the toolkit read it; heads set their own (heads.py)
    objective = None  # the toolkit's OBJECTIVES row it is trained and scored by (None: a base model)
    attends_causally = False  # in causal order (`decay.decay_applies`); a base model also when given `prefix_length`
    own_prefix_length = False  # `prefix_length` is where the head's targets begin in its window, checked with its labels
    predicts_tokens = False  # needs `vocab_size`
    predicts_every_position = False  # one output per input position (Perceiver IO: no learned output queries)
    pools_each_target = False  # one PMA query per target: needs `pooling="pma"`
    # config fields besides the family's own (`configuration_base.built_fields`) that the class's modules are built from
    built_from = ()

    def check_labels(self, inputs, b, n):
        """A forward's `labels` (in `inputs`, by name), for (b, n) inputs -> (the `label_checks.ClassLabels` to read, the
        length its base model sees). A head checks its own (`label_checks.masked_lm_labels`, ...); a base model takes none."""
        return (), n

    @classmethod
    def in_mode(cls, next_token_mode):
        """What the class is in a config of `next_token_mode` (its attributes above): the class itself, but for the
        next-token head, whose mode picks its objective."""
        return cls

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        check_model_config(self)
        # the values the modules are built from, compared with the config at every checked forward and at save
        # (`checks.check_built_config`): a later change would be ignored by the modules and written by a save
        self.built_config = {name: copy.deepcopy(getattr(config, name)) for name in built_fields(config) + [
            *self.built_from]}
        forward_names(type(self))  # cached now: a compiled forward's checks read it without `inspect`
        if not config.vocab_size and config.input_size:
            # continuous inputs: generic code (Trainer, pipelines) reads the input's name here, as for audio models
            self.main_input_name = "input_features"

    def post_init(self):
        self._no_split_modules = outermost_block_names(self)
        super().post_init()

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, FeatureProjection):
            init.normal_(module.weight, mean=0.0, std=module.in_features**-0.5)
            init.zeros_(module.bias)
        elif isinstance(module, AdaptiveProjection):
            init.normal_(module.weight, mean=0.0, std=module.in_features**-0.5)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, ScaleNorm):
            init.constant_(module.weight, math.sqrt(module.hidden_size))
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, LearnedVectors):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, GatedDecay):  # starts as the fixed schedule (decay.py)
            init.normal_(module.weight, mean=0.0, std=std)
            init.copy_(module.bias, module.schedule_bias().to(module.bias.device))

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As transformers', and the modeling code travels with the weights with an `auto_map` naming every class of
        the family (`families.FAMILIES`; transformers writes only the saved class, and only for registered ones). The
        code copied is this package's also for a model that a wrapper subclassed (FSDP2's `fully_shard` makes
        `FSDP<Name>`, defined in torch), and a `state_dict` gathered from shards (FSDP's full state dict, ZeRO-3)
        stores tied weights once, as the model's own would. A config changed since the model was built is refused
        (`checks.check_built_config`) before anything is written."""
        check_built_config(self)
        family = family_for_model_type(self.config.model_type)
        own_class = defining_class(type(self))
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **family.auto_map}
        if not self.is_remote_code() and own_class.__name__ in family.models and kwargs.get("is_main_process", True):
            # a head without an Auto class, or a wrapper's subclass: transformers would copy no code, or torch's
            # (before the save: a push uploads it)
            os.makedirs(save_directory, exist_ok=True)
            custom_object_save(own_class, save_directory)
        if kwargs.get("state_dict") is not None:  # gathered copies: transformers finds tied weights by shared storage
            kwargs["state_dict"] = {k: v for k, v in kwargs["state_dict"].items() if k not in self.all_tied_weights_keys}
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def is_remote_code(cls):
        """transformers' test, false for a wrapper's subclass (`save_pretrained` copies the code of the class it wraps)."""
        return super().is_remote_code() and defining_class(cls) is cls

    def _prepare_generation_config(self, generation_config, **kwargs):
        """As `GenerationMixin`'s (the heads that generate list it), then the values transformers 5.23 does not check
        (`checks.check_generation_config`)."""
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        check_generation_config(self, generation_config, model_kwargs)
        return generation_config, model_kwargs

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        if generation_mode == GenerationMode.ASSISTED_GENERATION:
            check_assisted_generation(self)
        super()._validate_generation_mode(generation_mode, generation_config, generation_mode_kwargs)

    def embed_inputs(
        self,
        input_ids=None,
        input_features=None,
        inputs_embeds=None,
        attention_mask=None,
        position_ids=None,
        causal=False,
        past_length=0,
        prefix_length=0,
        cache_slots=None,
        packing=None,
    ):
        """Embeds the inputs and builds the attention mask once for the stack.

        Positions are counted from the first real token of each row (left padding does not shift them), after
        `past_length` cached tokens (an int, or a tensor where the cache counts on the device: never read back).
        `attention_mask` covers the cached tokens too. `prefix_length` > 0 (with `causal`): the first positions attend
        to each other bidirectionally, the later ones causally. `cache_slots` (with `causal`): the length of a static
        cache's key buffers (transformers' `StaticCache`): `attention_mask` then covers every slot, (b, cache_slots),
        and the new tokens are written to the slots `past_length + 0..n-1`, which give their positions and, as
        `AttentionMask.query_positions`, the keys they see (the later slots, unwritten, are masked).
        Returns (hidden_states (b, n, hidden), position_ids or None, AttentionMask)."""
        source = next(x for x in (input_ids, input_features, inputs_embeds) if x is not None)
        b, n = source.shape[:2]
        slots = None if cache_slots is None else torch.arange(n, device=source.device) + past_length  # (n,)
        key_mask = None if attention_mask is None else attention_mask.bool()
        if position_ids is None and self.config.position_embedding_type != "none":
            if packing is not None:
                position_ids = packing.positions()
            elif key_mask is not None and slots is not None:
                position_ids = position_ids_from_mask(key_mask, cache_slots)[:, slots]  # (b, n)
            elif key_mask is not None:
                position_ids = position_ids_from_mask(key_mask, n)
            else:
                position_ids = (torch.arange(n, device=source.device) + past_length).expand(b, -1)
        if inputs_embeds is not None and inputs_embeds.dtype != self.dtype:
            inputs_embeds = inputs_embeds.to(self.dtype)  # as `input_features` are: float64 in, the model's dtype out
        padding = None
        if key_mask is not None:  # the new tokens' padding, zeroed by the embeddings
            padding = ~(key_mask[:, key_mask.shape[1] - n :] if slots is None else key_mask[:, slots])  # (b, n)
        hidden_states = self.embeddings(input_ids, input_features, inputs_embeds, position_ids, padding=padding)
        mask = AttentionMask.build(
            key_mask,
            causal=causal,
            num_queries=n,
            num_keys=n if slots is None else cache_slots,
            prefix_length=prefix_length,
            query_positions=slots,
            packing=packing,
        )
        return hidden_states, position_ids, mask

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, *args, **kwargs):
        """As transformers', refused where an adaptive layer (input or output) would need new clusters
        (`checks.check_resize`)."""
        size = self.config.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of:
            size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
        check_resize(self, size)
        adaptive = self.config.adaptive_input_cutoffs or self.config.adaptive_softmax_cutoffs
        if adaptive:  # the same size: nothing to resize (transformers would rebuild the layer as an nn.Embedding)
            return self.get_input_embeddings()
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, *args, **kwargs)
        for module in self.modules():  # the model and its base model now run with the new vocabulary
            if isinstance(module, HfstPreTrainedModel):
                module.built_config["vocab_size"] = self.config.vocab_size
        return embeddings

    def get_input_embeddings(self):
        # continuous inputs: the feature projection is the input embedding (a vision model's patch embedding), which
        # `enable_input_require_grads` hooks for adapters with gradient checkpointing
        embeddings = self.base_model.embeddings
        return embeddings.embed_tokens if embeddings.embed_tokens is not None else embeddings.feature_projection

    def set_input_embeddings(self, value):
        embeddings = self.base_model.embeddings
        if embeddings.embed_tokens is None and embeddings.feature_projection is not None:
            embeddings.feature_projection = value
        else:
            embeddings.embed_tokens = value

"""What every family's models share: the `PreTrainedModel` base (initialisation, remote-code `auto_map`), input
and mask checks, and the sequence-level heads (classification, next-token prediction) written once."""

import difflib
import functools
import inspect
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput, SequenceClassifierOutput
from transformers.utils import ModelOutput, can_return_tuple, logging
from transformers.utils.output_capturing import capture_outputs

from .attention import AttentionMask, attention_kernel
from .blocks import PMA, masked_mean, outermost_block_names
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
    key_mask: (b, n) bool, the padding mask the model used (None when every element is real); set only for this
        package's heads (`_return_key_mask`, see `HfstPreTrainedModel`).
    """

    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    key_mask: torch.BoolTensor | None = None


@dataclass
class PerceiverIOModelOutput(ModelOutput):
    """Output of [`PerceiverIOModel`].

    last_hidden_state: (b, q, hidden) the decoded output queries (one per input position unless learned).
    latent_hidden_state: (b, num_latents, hidden) the latents after the last block.
    hidden_states: the embedded inputs, then the latents after the cross-attention and after every self-attention.
    attentions: self-attention weights over the latents, when asked.
    cross_attentions: (encoder cross-attention, decoder cross-attention) weights, when asked.
    key_mask: (b, n) bool, the inputs' padding mask the model used (None when every input is real); set only for this
        package's heads (`_return_key_mask`, see `HfstPreTrainedModel`).
    """

    last_hidden_state: torch.FloatTensor | None = None
    latent_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    key_mask: torch.BoolTensor | None = None


def check_attention_mask(attention_mask, batch_size, length, name="attention_mask"):
    """(b, n) mask, 1 / True for real elements and 0 / False for padding -> bool (b, n), or None. Checks the shape and
    reads no values: the base model's `embed_inputs` checks them, once per batch (`check_input_values`). A `length`
    that is a tensor (a cache counting on the device) is not read: only the batch size is checked then."""
    if attention_mask is None:
        return None
    if (
        attention_mask.dim() != 2
        or attention_mask.shape[0] != batch_size
        or (not torch.is_tensor(length) and attention_mask.shape[1] != length)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length) = ({batch_size}, {length}) matching the inputs, "
            f"got {tuple(attention_mask.shape)}."
        )
    return attention_mask.bool()


def check_input_values(input_ids=None, attention_mask=None, vocab_size=None, position_ids=None, max_positions=None,
                       labels=()):
    """The one place a forward reads values back from the device: once per batch, in one read. `input_ids` must lie in
    the vocabulary and `position_ids` (learned positions, given by the caller) below `max_positions` (a CUDA embedding
    would fail with a device-side assert); `attention_mask` must hold only 0 and 1 (bool, integer or float; 0.5, -1 or
    NaN are refused, not cast). Returns whether every element is real (an all-ones mask is then dropped, so that the
    kernels take their unmasked paths).

    A row of padding only is legal (an empty set or sequence): attention over no key gives 0, so its outputs are
    what the model's positions, biases and learned queries (seeds, inducing points, latents) give alone.

    `labels`: the labels a head handed its base model (`_labels_to_check`, dtypes checked by `check_token_labels`),
    read in the same read: token labels (tensors) outside [0, vocab_size), and a classification head's
    `ClassLabels` outside [0, num_labels), other than -100, are refused.

    Under `torch.compile` nothing is read (no graph break, no check) and a mask is kept as given."""
    if torch.compiler.is_compiling():
        return attention_mask is None
    labels = [x if isinstance(x, ClassLabels) else ClassLabels(x, vocab_size, "token") for x in labels]
    labels = [x for x in labels if x.labels.numel()]
    checks = [torch.stack([labels_outside(*x[:2]).any() for x in labels]).any()] if labels else []
    if position_ids is not None and position_ids.numel():
        checks += list(torch.aminmax(position_ids))
    if input_ids is not None and (
        not vocab_size or not input_ids.numel() or input_ids.is_floating_point() or input_ids.dim() != 2
    ):
        input_ids = None  # nothing to read, or refused by its shape or type when it is embedded
    if input_ids is not None:
        checks += list(torch.aminmax(input_ids))
    if attention_mask is not None:
        if attention_mask.is_complex():
            raise ValueError(f"`attention_mask` must hold 0 (padding) and 1 (real), got a {attention_mask.dtype} tensor.")
        real = attention_mask == 1
        checks += [(real | (attention_mask == 0)).all(), real.all()]
    if not checks:
        return attention_mask is None
    values = torch.stack([c.to(torch.float64) for c in checks]).tolist()  # the one host sync
    if labels:
        labels_bad, values = values[0], values[1:]
        if labels_bad:
            _refuse_labels(labels)
    if position_ids is not None and position_ids.numel():
        (first, last), values = values[:2], values[2:]
        if first < 0:
            raise ValueError(f"`position_ids` must be non-negative, got values down to {int(first)}.")
        check_position_count(int(last) + 1, max_positions)
    if input_ids is not None:
        (low, high), values = values[:2], values[2:]
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"`input_ids` hold ids in [{int(low)}, {int(high)}], outside the vocabulary [0, {vocab_size - 1}]."
            )
    if attention_mask is None:
        return True
    binary, all_real = values[:2]
    if not binary:
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].unique()[:5].tolist()
        raise ValueError(
            f"`attention_mask` must hold only 0 (padding) and 1 (real element), as bool, integer or float; got other "
            f"values such as {bad}."
        )
    return bool(all_real)


# keyword inputs that transformers' Trainer, generate() and tokenizers pass to a model besides its named arguments
PASSED_THROUGH = frozenset({"num_items_in_batch", "shift_labels", "cache_position", "prefix_length", "return_dict",
                            "token_type_ids", "return_loss", "logits_to_keep", "use_cache", "past_key_values",
                            "position_ids", "output_attentions", "output_hidden_states", "labels"})


def _forward_names(cls):
    names = cls.__dict__.get("_hfst_forward_names")
    if names is None:
        names = frozenset(n for n, p in inspect.signature(cls.forward).parameters.items()
                          if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self")
        setattr(cls, "_hfst_forward_names", names)
    return names


def check_keyword_names(cls, kwargs):
    """Refuses a keyword input one typo away from one of `cls.forward`'s (`attention_masks=`, `label=`): transformers
    models take `**kwargs` and would drop it without a word (no padding mask, no loss). Other unknown names pass."""
    names = _forward_names(cls)
    for key in kwargs:
        if key in names or key in PASSED_THROUGH:
            continue
        near = difflib.get_close_matches(key, sorted(names | PASSED_THROUGH), n=1, cutoff=0.85)
        if near:
            raise ValueError(f"`{key}` is not an input of {cls.__name__}.forward (did you mean `{near[0]}`?).")


def check_position_count(count, max_positions):
    # a tensor count (a cache counting on the device) is not read back: no host sync in a compiled step
    if max_positions is not None and not torch.is_tensor(count) and count > max_positions:
        raise ValueError(
            f"Sequence needs {count} positions but `max_position_embeddings` is {max_positions} (learned position "
            "embeddings cannot extrapolate)."
        )


def input_shape(input_ids=None, input_features=None, inputs_embeds=None):
    """(b, n) of the inputs, refusing shapes that have no batch and sequence axes, and empty sequences (a sequence or
    set of no element has nothing to attend to or pool)."""
    for name, x, dims in (("input_ids", input_ids, "(batch, length)"),
                          ("input_features", input_features, "(batch, set size, input_size)"),
                          ("inputs_embeds", inputs_embeds, "(batch, length, hidden_size)")):
        if x is None:
            continue
        if x.dim() != dims.count(",") + 1:
            hint = "; pass continuous inputs as `input_features`" if name == "input_ids" and x.is_floating_point() else ""
            raise ValueError(f"`{name}` must have shape {dims}, got {tuple(x.shape)} {x.dtype}{hint}.")
        if x.shape[1] == 0:
            raise ValueError(f"`{name}` holds sequences of length 0, shape {tuple(x.shape)}: pass at least one element.")
        return x.shape[0], x.shape[1]
    raise ValueError("Pass exactly one of `input_ids`, `input_features` or `inputs_embeds`; got none.")


def check_prefix_length(prefix_length, length):
    """`prefix_length` of a base model: an int in [0, length), so that at least one position follows the prefix (a
    bool, a negative or a too large value would build masks for another sequence: silently, or deep inside torch)."""
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or not 0 <= prefix_length < length:
        raise ValueError(
            f"`prefix_length` must be an integer in [0, {length}) (the inputs hold {length} positions, and at least "
            f"one must follow the prefix), got {prefix_length!r}."
        )


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
            if len(args) > len(names):
                raise TypeError(f"{type(self).__name__}.forward takes {len(names)} positional inputs, got {len(args)}.")
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
    selected = [output_hidden_states] if isinstance(output_hidden_states, int) else output_hidden_states
    if not isinstance(selected, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in selected
    ):
        raise ValueError(
            "`output_hidden_states` must be a bool, or an index or a list of indices of the hidden states to return, "
            f"got {output_hidden_states!r}."
        )
    return list(selected)


def resolve_output_flags(config, output_attentions, output_hidden_states):
    """The flags, with the config's defaults; `output_attentions` is False for a kernel without weights (linear
    attention reports None, not a tuple of Nones)."""
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    warn_if_no_weights(config, output_attentions)
    return output_attentions and attention_kernel(config).returns_weights, output_hidden_states


# generate()'s token-id arguments, and what an id outside the vocabulary did in transformers 5.23
GENERATION_TOKEN_IDS = {
    "pad_token_id": "generate() emits it as padding",
    "bos_token_id": "generate() starts an empty prompt with it",
    "eos_token_id": "generation never meets it and runs to max_new_tokens",
    "forced_bos_token_id": "the logits processor fails with an IndexError",
    "forced_eos_token_id": "the logits processor fails with an IndexError",
    "suppress_tokens": "it is ignored",
    "begin_suppress_tokens": "it is ignored",
}


def check_generation_token_ids(generation_config, vocab_size):
    """Every token id `generate()` is given lies in the vocabulary (the config refuses its own; generate()'s
    arguments and a generation config's are checked here)."""
    for name, effect in GENERATION_TOKEN_IDS.items():
        value = getattr(generation_config, name, None)
        ids = value if isinstance(value, (list, tuple)) else [value]
        if vocab_size and any(isinstance(i, int) and not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"`{name}` must lie in the vocabulary [0, {vocab_size - 1}], got {value!r}: {effect}.")


# generation parameters whose out-of-range values transformers 5.23 ignores (it adds the logits processor only inside
# the range): name -> (test, the range in words). NaN fails every test.
GENERATION_RANGES = {
    "top_p": (lambda v: 0 <= v <= 1, "in [0, 1] (1 keeps every token)"),
    "typical_p": (lambda v: 0 < v <= 1, "in (0, 1] (1 keeps every token)"),
    "epsilon_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "eta_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "min_new_tokens": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer"),
    "no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
    "encoder_no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
}


def defining_class(cls):
    """`cls`, or for a subclass that a wrapper made at run time (FSDP2's `fully_shard`: `FSDP<Name>`, defined in
    torch), the model class it wraps: the first class of its MRO defined outside torch."""
    return next(c for c in cls.__mro__ if not c.__module__.startswith("torch."))


class HfstPreTrainedModel(PreTrainedModel):
    """Base of every hf_settransformer model.

    A base model builds its masks once, in `embed_inputs`, and takes two keywords that only this package's heads pass:
    `_labels_to_check`, the head's token labels, read with the inputs in the forward's one host read
    (`check_input_values`), and `_return_key_mask=True` (pooling bases), which puts in the output's `key_mask` the
    (b, n) bool padding mask the base model built (None when every element is real), so the head pools with that mask
    and builds none. Without them the outputs are transformers' (no `key_mask`, the same tuples)."""

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

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
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

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As transformers', and the modeling code travels with the weights with an `auto_map` naming every class of
        the family (`families.FAMILIES`; transformers writes only the saved class, and only for registered ones). The
        code copied is this package's also for a model that a wrapper subclassed (FSDP2's `fully_shard` makes
        `FSDP<Name>`, defined in torch), and a `state_dict` gathered from shards (FSDP's full state dict, ZeRO-3)
        stores tied weights once, as the model's own would."""
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

    def __call__(self, *args, **kwargs):
        if kwargs and not torch.compiler.is_compiling():
            check_keyword_names(type(self), kwargs)
            self.check_no_cache(kwargs.get("past_key_values"))
        return super().__call__(*args, **kwargs)

    def check_no_cache(self, past_key_values):
        """Refuses a cache handed to a family that keeps none (they take `**kwargs`, so it would be dropped without a
        word). `use_cache` passes, as in transformers' encoder-only models (BERT without `is_decoder`): no cache is
        returned."""
        if past_key_values is not None and not self.keeps_a_cache:
            family = family_for_model_type(self.config.model_type).name
            raise ValueError(
                f"{type(self).__name__} (family {family!r}) keeps no cache, so `past_key_values` has nothing to "
                "continue: an encoder reads its whole input at every call. Pass the whole sequence, without "
                "`past_key_values` (the decoder family is the one that continues a cache)."
            )

    def _prepare_generation_config(self, generation_config, **kwargs):
        """As `GenerationMixin`'s (the heads that generate list it), then values that transformers 5.23 does not check:
        `num_beams=0` divides by zero deep inside, a negative one fails on a tensor shape, and
        `num_return_sequences=0` returns one sequence each; a sampling parameter out of its range (`top_p=1.5`,
        `typical_p=2`, `epsilon_cutoff=1`, NaN) or a negative length or n-gram size turns its logits processor off
        without a word; a token id outside the vocabulary (`GENERATION_TOKEN_IDS`). A `past_key_values` for a family
        without a cache is refused as in the forward."""
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        for name in ("num_beams", "num_return_sequences", "num_beam_groups"):
            value = getattr(generation_config, name, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name, (inside, allowed) in GENERATION_RANGES.items():
            value = getattr(generation_config, name, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not inside(value)):
                raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")
        check_generation_token_ids(generation_config, self.config.vocab_size)
        self.check_no_cache(model_kwargs.get("past_key_values"))
        return generation_config, model_kwargs

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
        labels=(),
    ):
        """Checks the inputs and the mask, embeds the inputs and builds the attention mask once for the stack.

        Positions are counted from the first real token of each row (left padding does not shift them), after
        `past_length` cached tokens (an int, or a tensor where the cache counts on the device: never read back).
        `attention_mask` covers the cached tokens too. `prefix_length` > 0 (with `causal`): the first positions attend
        to each other bidirectionally, the later ones causally. `cache_slots` (with `causal`): the length of a static
        cache's key buffers (transformers' `StaticCache`): `attention_mask` then covers every slot, (b, cache_slots),
        and the new tokens are written to the slots `past_length + 0..n-1`, which give their positions and, as
        `AttentionMask.query_positions`, the keys they see (the later slots, unwritten, are masked). `labels`: a head's
        token labels, read with the inputs (`check_input_values`).
        Returns (hidden_states (b, n, hidden), position_ids or None, AttentionMask)."""
        b, n = input_shape(input_ids, input_features, inputs_embeds)
        check_prefix_length(prefix_length, n)
        source = next(x for x in (input_ids, input_features, inputs_embeds) if x is not None)
        slots = None if cache_slots is None else torch.arange(n, device=source.device) + past_length  # (n,)
        key_length = past_length + n if cache_slots is None else cache_slots
        if slots is not None and attention_mask is not None and attention_mask.shape[-1] != cache_slots:
            raise ValueError(
                f"With a static cache of {cache_slots} slots, `attention_mask` must have one column per slot, "
                f"(batch, {cache_slots}), 0 past the tokens seen so far (generate() pads it so); got "
                f"{tuple(attention_mask.shape)}."
            )
        key_mask = check_attention_mask(attention_mask, b, key_length)
        if position_ids is not None and (
            position_ids.is_floating_point() or position_ids.dtype == torch.bool or position_ids.dim() != 2
            or position_ids.shape[0] not in (1, b) or position_ids.shape[1] != n
        ):
            raise ValueError(
                f"`position_ids` must be integers of shape (batch, length) = ({b}, {n}) or (1, {n}), got "
                f"{position_ids.dtype} of shape {tuple(position_ids.shape)}."
            )
        learned = self.config.position_embedding_type == "learned"
        max_positions = self.config.max_position_embeddings if learned else None
        user_positions = position_ids if learned else None
        if check_input_values(input_ids, attention_mask, self.config.vocab_size, user_positions, max_positions,
                              labels=labels):
            key_mask = None  # every element real: the unmasked paths
        if position_ids is None and self.config.position_embedding_type != "none":
            check_position_count(key_length, max_positions)  # derived positions: known without a read
            if key_mask is not None and slots is not None:
                position_ids = position_ids_from_mask(key_mask, cache_slots)[:, slots]  # (b, n)
            elif key_mask is not None:
                position_ids = position_ids_from_mask(key_mask, n)
            else:
                position_ids = (torch.arange(n, device=source.device) + past_length).expand(b, -1)
        if inputs_embeds is not None and inputs_embeds.is_floating_point() and inputs_embeds.dtype != self.dtype:
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
        )
        return hidden_states, position_ids, mask

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, *args, **kwargs):
        """As transformers', refused with a clear error where an adaptive layer (input or output) would need new
        clusters: its ids are ordered by frequency, so new tokens have no place (transformers would resize only the
        input embedding and leave the output layer predicting the old vocabulary)."""
        size = self.config.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of:
            size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
        adaptive = [f"`{name}`" for name in ("adaptive_input_cutoffs", "adaptive_softmax_cutoffs")
                    if getattr(self.config, name, None)]
        if adaptive and size != self.config.vocab_size:
            raise ValueError(
                f"Cannot resize the vocabulary of {type(self).__name__} from {self.config.vocab_size} to {size}: it "
                f"has {' and '.join(adaptive)} (adaptive layers cluster ids by frequency; new tokens have no place). "
                "Train a new model with the new vocabulary instead."
            )
        if adaptive:  # the same size: nothing to resize (transformers would rebuild the layer as an nn.Embedding)
            return self.get_input_embeddings()
        return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, *args, **kwargs)

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


class SequencePool(nn.Module):
    """Sequence -> one vector: PMA with one seed (Lee et al. 2019) or a masked mean, per `config.pooling`."""

    def __init__(self, config):
        super().__init__()
        self.pma = PMA(config, num_seeds=1) if config.pooling == "pma" else None

    def forward(self, hidden_states, key_mask=None):
        """(b, n, hidden), (b, n) bool -> (b, hidden)."""
        if self.pma is None:
            return masked_mean(hidden_states, key_mask)
        mask = AttentionMask.build(key_mask)
        return self.pma(hidden_states, mask)[0][:, 0]


class PooledHeadMixin:
    """A head that reads one vector per example from the base model. Families override `pool_outputs`."""

    def make_head_pool(self, config):
        return SequencePool(config)

    def pool_outputs(self, outputs, key_mask):
        """Default: pool the per-element states with this head's own `SequencePool`."""
        return self.head_pool(outputs.last_hidden_state, key_mask)

    def run_base_model(self, attention_mask, output_attentions, output_hidden_states, labels_to_check=(), **inputs):
        """-> (the base model's output, (b, hidden) pooled), pooled with the key mask the base model built."""
        inputs = {k: v for k, v in inputs.items() if v is not None and k != "num_items_in_batch"}
        outputs = self.model(
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            _labels_to_check=labels_to_check,
            _return_key_mask=True,
            **inputs,
        )
        return outputs, self.pool_outputs(outputs, outputs.key_mask)


class LMHeadMixin:
    """A vocabulary projection `lm_head`, tied to the input embedding when `config.tie_word_embeddings`."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}

    def make_lm_head(self, config):
        if not config.vocab_size:
            raise ValueError(f"`vocab_size` must be set for {type(self).__name__} (it predicts tokens).")
        if config.adaptive_softmax_cutoffs:  # Grave et al. 2017; ids ordered by decreasing frequency
            return nn.AdaptiveLogSoftmaxWithLoss(
                config.hidden_size,
                config.vocab_size,
                config.adaptive_softmax_cutoffs,
                div_value=float(config.adaptive_softmax_div_value),
            )
        return nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def adaptive_output(self):
        return isinstance(self.lm_head, nn.AdaptiveLogSoftmaxWithLoss)

    def lm_logits(self, hidden_states):
        """(..., hidden) -> (..., vocab): logits, or the adaptive softmax's exact log-probabilities (which softmax,
        argmax, sampling and cross-entropy treat exactly as logits)."""
        if not self.adaptive_output:
            return self.lm_head(hidden_states)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        with torch.autocast(device_type=flat.device.type, enabled=False):  # its index_copy_ mixes dtypes otherwise
            log_probs = self.lm_head.log_prob(flat.to(self.lm_head.head.weight.dtype))
        return log_probs.view(*hidden_states.shape[:-1], -1)

    def lm_loss(self, hidden_states, targets, divisor=None):
        """Summed cross-entropy of `targets` (-100 ignored) from (..., hidden) states, / `divisor` (default: the
        number of counted targets; 0 with a zero gradient when there are none).

        The full output layer reads no values (no host sync). The adaptive softmax computes only the targets' rows and
        clusters: selecting them is data-dependent (a host sync, as in `nn.AdaptiveLogSoftmaxWithLoss` itself), which
        is what makes it the choice for a CPU."""
        hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
        targets = targets.reshape(-1).to(hidden.device)
        keep = targets != -100
        if self.adaptive_output:
            hidden, targets = hidden[keep], targets[keep]
            with torch.autocast(device_type=hidden.device.type, enabled=False):  # as in lm_logits
                total = -self.lm_head(hidden.to(self.lm_head.head.weight.dtype), targets).output.float().sum()
        else:
            total = F.cross_entropy(self.lm_head(hidden).float(), targets, ignore_index=-100, reduction="sum")
        return total / (keep.sum().clamp_min(1) if divisor is None else divisor)

    def get_output_embeddings(self):
        return None if self.adaptive_output else self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum over rows of -log softmax(hidden @ weight^T)[label] / divisor, `chunk` rows at a time.

    The gradient is computed in the forward, chunk by chunk (softmax - one-hot, times the weight and the hidden
    states), so the (rows x vocabulary) logits, their log-softmax and its gradient never exist whole; the backward
    only scales the stored gradients. Rows labelled -100 count for nothing. Not differentiable twice."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, divisor):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start : start + chunk], labels[start : start + chunk]
            logits = (h @ weight.t()).float()  # (c, vocab)
            keep = (y != -100).unsqueeze(1)
            target = y.clamp_min(0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            total += ((lse - logits.gather(1, target)) * keep).sum()
            if grad_hidden is None and grad_weight is None:
                continue
            grad = logits.sub_(lse).exp_()  # softmax, in place of the logits
            grad.scatter_add_(1, target, -torch.ones_like(lse))  # minus the one-hot label
            grad = (grad * keep).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.t().float(), h.float())
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.divisor, ctx.weight_dtype = divisor, weight.dtype
        return total / divisor

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output / ctx.divisor
        return (
            None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def chunked_causal_lm_loss(hidden_states, weight, labels, chunk_size, num_items_in_batch=None, shift_labels=None):
    """The causal-LM loss of `transformers`' `ForCausalLMLoss` (labels shifted left, -100 ignored, mean over the
    counted tokens or sum / `num_items_in_batch`) computed by `_ChunkedLinearCrossEntropy` from the hidden states
    and the output layer's weight, without the full logits."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    shift_labels = shift_labels.reshape(-1).to(hidden.device)
    if num_items_in_batch is not None:
        divisor = num_items_in_batch.to(hidden.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
    else:
        divisor = (shift_labels != -100).sum().clamp_min(1)
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, shift_labels, chunk_size, divisor)


class ForMaskedLMMixin(LMHeadMixin):
    """Masked language modelling: a vocabulary projection of every position; loss where labels are not -100."""

    objective = "masked_lm"  # the toolkit's OBJECTIVES row: how it is trained and scored

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` of shape (batch, length)): token ids to predict, -100 elsewhere.

        With an adaptive softmax (`adaptive_softmax_cutoffs`) the logits are exact log-probabilities, and a training
        forward with `labels` computes only the loss (`logits=None`): the masked positions are a small share of the
        block, and full log-probabilities of every position would cost most of the step."""
        labels_to_check = check_token_labels(labels)
        model_kwargs = {k: v for k, v in kwargs.items() if k not in ("num_items_in_batch",)}
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            _labels_to_check=labels_to_check,
            **model_kwargs,
        )
        hidden = outputs.last_hidden_state
        loss = logits = None
        if self.adaptive_output and labels is not None:
            divisor = kwargs.get("num_items_in_batch")
            loss = self.lm_loss(hidden, labels, divisor=divisor.to(hidden.device) if torch.is_tensor(divisor) else divisor)
            if not self.training:
                logits = self.lm_logits(hidden)
        else:
            logits = self.lm_logits(hidden)  # (b, n, vocab)
            if labels is not None:
                if labels.shape != logits.shape[:-1]:
                    raise ValueError(f"`labels` must have the inputs' shape {tuple(logits.shape[:-1])} (-100 where "
                                     f"nothing is predicted), got {tuple(labels.shape)}.")
                loss = token_loss(logits, labels, kwargs.get("num_items_in_batch"))
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output


class ForSequenceClassificationMixin(PooledHeadMixin):
    """Set/sequence classification or regression, with transformers' `problem_type` conventions."""

    accepts_loss_kwargs = False  # mean loss: the Trainer scales it for gradient accumulation

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.head_pool = self.make_head_pool(config)
        self.head_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        input_features=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` of shape (batch,), or float (batch, num_labels) for multi-label/regression)."""
        outputs, pooled = self.run_base_model(
            attention_mask,
            output_attentions,
            output_hidden_states,
            labels_to_check=class_labels_to_check(labels, self.config),
            input_ids=input_ids,
            input_features=input_features,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self.classifier(self.head_dropout(pooled))  # (b, num_labels)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=check_classification_labels(labels, logits, self.config),
                                      pooled_logits=logits, config=self.config)
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output


def check_token_labels(*labels):
    """Token `labels` of the LM heads: integers in [0, vocab_size) or -100 (ignored). A float or bool dtype is refused
    here, naming it, and so is an integer dtype other than torch.long (cross-entropy would say "expected target dtype
    to be Long"; `labels.long()` is the fix). Returns the labels given (None left
    out), which the head hands its base model as `_labels_to_check`: ids outside the vocabulary (cross-entropy's
    "Target 109 is out of bounds", a device-side assert on CUDA) are flagged on the device and read with the inputs,
    in the one read of `check_input_values`. Nothing is read under `torch.compile`."""
    given = tuple(x for x in labels if x is not None)
    for x in given:
        if not torch.is_tensor(x) or x.dtype != torch.long:
            kind = x.dtype if torch.is_tensor(x) else type(x).__name__
            hint = " (use labels.long())" if torch.is_tensor(x) and x.dtype in _INTEGER_DTYPES else ""
            raise ValueError(
                f"`labels` must be token ids (torch.long, -100 where nothing is predicted), got {kind}{hint}."
            )
    return given


_INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)


class ClassLabels(NamedTuple):
    """Labels a head hands its base model's one read (`_labels_to_check`), with the ids they may hold: [0, bound), or
    -100 (ignored). Token labels (plain tensors) are read against the vocabulary; a classification head hands its
    class indices against `num_labels`."""

    labels: torch.Tensor
    bound: int
    kind: str = "class"


def labels_outside(labels, bound):
    """Bool tensor shaped like `labels`: True for ids outside [0, bound) that are not -100 (ignored)."""
    return ((labels < 0) & (labels != -100)) | (labels >= bound)


def _refuse_labels(labels):
    """The error path only (a second read is fine): name the first labels with ids out of their range."""
    for x, bound, kind in labels:
        bad = x[labels_outside(x, bound)]
        if bad.numel():
            values = bad.unique()[:5].tolist()
            if kind == "token":
                raise ValueError(
                    f"`labels` hold ids outside the vocabulary [0, {bound - 1}] (and not -100, the ignored label): "
                    f"{values}."
                )
            raise ValueError(
                f"`labels` hold class indices outside [0, {bound - 1}] (`num_labels` is {bound}; -100 is ignored): "
                f"{values}."
            )


def class_labels_to_check(labels, config):
    """A classification head's labels for its base model's one read: the class indices of a single-label problem (as
    `problem_type_of` infers it) as `ClassLabels`, else nothing (their dtype and shape are checked after the
    forward)."""
    if not torch.is_tensor(labels):
        return ()
    problem, integer = problem_type_of(labels, config.num_labels, config)
    return (ClassLabels(labels, config.num_labels),) if problem == "single_label_classification" and integer else ()


def problem_type_of(labels, num_labels, config):
    """(`config.problem_type`, or what transformers infers from the labels as `ForSequenceClassificationLoss` does;
    whether the labels are integers)."""
    integer = not labels.is_floating_point() and labels.dtype != torch.bool and not labels.is_complex()
    problem = config.problem_type or (
        "regression" if num_labels == 1 else "single_label_classification" if integer else "multi_label_classification"
    )
    return problem, integer


def check_classification_labels(labels, logits, config):
    """`labels` as transformers' `ForSequenceClassificationLoss` needs them for `config.problem_type` (inferred as it
    does, without setting it on a bad batch): class indices (integers, (b,)) for single-label classification, (b,
    num_labels) 0/1 values for multi-label (integers are cast to float), numbers for regression (likewise). Anything
    else is refused naming the labels' dtype and shape; transformers would read float class indices as multi-label
    targets and fail on the shapes, or pass integer regression targets to MSELoss."""
    if not torch.is_tensor(labels):
        raise ValueError(f"`labels` must be a tensor, got {type(labels).__name__}.")
    batch, num_labels = logits.shape
    problem, integer = problem_type_of(labels, num_labels, config)
    got = f"got {labels.dtype} of shape {tuple(labels.shape)}"
    if problem == "single_label_classification":
        if not integer or labels.shape not in ((batch,), (batch, 1)):
            raise ValueError(
                f"`labels` for single-label classification must be class indices, integers of shape ({batch},), "
                f"{got}. Use labels.long() for float class ids; for multi-label classification pass ({batch}, "
                f"{num_labels}) 0/1 labels with problem_type='multi_label_classification'; for regression set "
                "num_labels=1 or problem_type='regression'."
            )
        return labels
    if labels.dtype == torch.bool or labels.is_complex():
        if labels.dtype != torch.bool or problem != "multi_label_classification":
            raise ValueError(f"`labels` for {problem} must be real numbers, {got}.")
    if problem == "multi_label_classification":
        if labels.shape != (batch, num_labels):
            hint = " (class indices? use labels.long())" if labels.shape == (batch,) else ""
            raise ValueError(
                f"`labels` for multi-label classification must be 0/1 values of shape ({batch}, {num_labels}), "
                f"{got}{hint}. For single-label classification pass integer class indices of shape ({batch},)."
            )
    elif labels.numel() != batch * num_labels:
        raise ValueError(f"`labels` for regression must hold {num_labels} value(s) per example ({batch} examples), {got}.")
    return labels.to(logits.dtype)


def causal_lm_loss(logits, labels, num_items_in_batch=None, shift_labels=None):
    """transformers' causal-LM loss (`ForCausalLMLoss`): position i predicts `labels[:, i + 1]` (or `shift_labels[:, i]`,
    already aligned), -100 ignored, summed over / `num_items_in_batch` or the counted labels; over no label at all
    it is 0 with a zero gradient, where transformers' mean gives NaN."""
    if shift_labels is None:
        if labels.shape != logits.shape[:-1]:
            raise ValueError(
                f"`labels` must have the inputs' shape {tuple(logits.shape[:-1])} (usually `input_ids`; shifted "
                f"inside), got {tuple(labels.shape)}."
            )
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return token_loss(logits, shift_labels, num_items_in_batch)


def token_loss(logits, labels, num_items_in_batch=None):
    """Cross-entropy of (..., vocab) `logits` against (...) `labels` at the same positions (no shift), -100 ignored:
    summed, / `num_items_in_batch` (the Trainer's count over a gradient-accumulation step) or / the counted labels.
    No labels to count gives 0 with a zero gradient (transformers' mean reduction gives NaN), and no row is selected
    (no host sync)."""
    labels = labels.to(logits.device)
    total = F.cross_entropy(logits.flatten(0, -2).float(), labels.reshape(-1), ignore_index=-100, reduction="sum")
    if num_items_in_batch is None:
        return total / (labels != -100).sum().clamp_min(1)
    divisor = num_items_in_batch.to(total.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
    return total / (divisor.clamp_min(1) if torch.is_tensor(divisor) else max(divisor, 1))


class NextTokenHeadBase(PooledHeadMixin, LMHeadMixin):
    """What the two next-token heads share (the design document's WikiText-2 model): the family's base model over the
    last `context_length` tokens, a pooling (`head_pool`), a vocabulary projection (`lm_head`), and `generate()`, which
    slides the window over the last `context_length` tokens (the family's class lists `GenerationMixin` after its
    `PreTrainedModel`, as transformers requires). Each head adds its forward, objective and label contract."""

    accepts_loss_kwargs = False  # mean loss: the Trainer scales it for gradient accumulation

    def __init__(self, config):
        super().__init__(config)
        self.check_head_config(config)
        self.model = self.base_model_class(config)
        self.head_pool = self.make_head_pool(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    def check_head_config(self, config):
        """Refuses a config this head cannot run (before any module is built)."""

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, inputs_embeds=None, **kwargs):
        # generate() would feed only the newest token once it believes a cache exists: feed the whole window.
        window = self.config.context_length
        inputs = {"input_ids": input_ids[:, -window:]}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask[:, -window:]
        return inputs

    def _supports_default_dynamic_cache(self):
        return False


class ManyTargetsHeadMixin(NextTokenHeadBase):
    """Many targets per window (`next_token_mode="many"`): one pass over a window of up to `context_length` tokens
    predicts the next token at each of its last `target_length` positions. The positions before them are a prefix that
    the base model reads bidirectionally (`prefix_length`: encoder, Set Transformer, whose inducing points summarise
    the prefix) or through a causal cross-attention (Perceiver IO, as Perceiver AR); a target position sees the prefix
    and the positions up to itself, never its own target or a later token. The pooling query of each target is the PMA
    seed plus that position's state: a shared seed alone gives every target the same query, whose softmax weights over
    the keys cannot depend on where the target is, so it cannot single out the most recent tokens.

    `input_ids` (b, n) -> `logits` (b, n, vocab): the predictions of the last `target_length` positions (of the last
    `context_length` tokens), zeros (a uniform distribution) at the prefix positions, which predict nothing. `labels`
    (b, n) are causal-LM labels (usually `input_ids`; shifted inside, as transformers' causal LMs do); the loss counts
    the target positions only."""

    objective = "many_target_windows"  # the toolkit's OBJECTIVES row: how it is trained and scored

    def check_head_config(self, config):
        if config.pooling != "pma":
            raise ValueError(
                "`next_token_mode='many'` pools every target with its own PMA query: set `pooling='pma'`, or use "
                "`next_token_mode='window'` for mean pooling."
            )

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` of shape (batch, length)): causal-LM labels (-100 ignored), shifted inside.
        prefix_length (`int`, *optional*, a keyword argument): where the prefix of the (last `context_length` tokens of
        the) window ends; every later position is a target. Default: all but the last `target_length` positions. The
        same prefix gives a target the same prediction in any window that ends at or after it (evaluation passes it
        for the short windows at the start of a text).
        shift_labels (`torch.LongTensor` of shape (batch, length), *optional*, a keyword argument): targets already
        aligned with the positions (`shift_labels[:, i]` is what position i predicts), as transformers' causal LMs
        take them under sequence/context parallelism; they replace `labels`."""
        kwargs.pop("use_cache", None)  # no cache: every step reads the whole window
        shift_labels = kwargs.pop("shift_labels", None)
        if shift_labels is not None:
            labels = shift_labels
        labels_to_check = check_token_labels(labels)
        source = input_ids if input_ids is not None else inputs_embeds
        if source is None:
            raise ValueError(f"{type(self).__name__} needs `input_ids` or `inputs_embeds`.")
        b, full_length = source.shape[0], source.shape[1]
        if labels is not None and tuple(labels.shape) != (b, full_length):
            raise ValueError(
                f"`labels` of {type(self).__name__} (next_token_mode='many') are causal-LM labels shaped like the "
                f"inputs, ({b}, {full_length}); got {tuple(labels.shape)}. For one target per window use "
                "next_token_mode='window'."
            )
        window = self.config.context_length
        input_ids, inputs_embeds, attention_mask = (
            None if x is None else x[:, -window:] for x in (input_ids, inputs_embeds, attention_mask)
        )
        length = min(full_length, window)
        num_targets = length - self.window_prefix_length(kwargs.pop("prefix_length", None), length)
        outputs = self.model(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            prefix_length=length - num_targets,  # every base model: a bidirectional prefix, then the targets
            _labels_to_check=labels_to_check,
            _return_key_mask=True,
            **{k: v for k, v in kwargs.items() if k != "num_items_in_batch"},
        )
        states = self.target_states(outputs, num_targets, outputs.key_mask)  # (b, t, hidden)
        if labels is not None and shift_labels is None:
            labels = F.pad(labels, (0, 1), value=-100)[:, 1:]  # position i predicts token i + 1
        loss, logits = self.target_loss_and_logits(states, None if labels is None else labels[:, -num_targets:], full_length)
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def window_prefix_length(self, prefix_length, length):
        """The prefix of a window of `length` tokens: `prefix_length` if given (checked), else all but the last
        `target_length` positions."""
        if prefix_length is None:
            return length - min(self.config.target_length, length)
        if isinstance(prefix_length, int) and not isinstance(prefix_length, bool) and 0 <= prefix_length < length:
            return prefix_length
        raise ValueError(
            f"`prefix_length` must be an integer in [0, {length}) (the window has {length} tokens), got {prefix_length!r}."
        )

    def target_states(self, outputs, num_targets, key_mask):
        """(base model outputs, t, (b, n) bool or None) -> (b, t, hidden). Default (encoder, Perceiver AR): one PMA
        query per target (the seed plus the target's state) reads the states up to the target."""
        states = outputs.last_hidden_state  # (b, m, hidden), the last t of them the targets'
        m = states.shape[1]
        mask = AttentionMask.build(
            None if key_mask is None else key_mask[:, -m:],
            causal=True,
            num_queries=num_targets,
            num_keys=m,
        )
        pooled, _ = self.head_pool.pma(states, mask, queries=states[:, -num_targets:])
        return pooled

    def target_loss_and_logits(self, states, targets, length):
        """(b, t, hidden) states, (b, t) targets or None -> (loss or None, logits (b, length, vocab) or None: zeros
        before the targets). A training step with targets computes the loss only."""
        if targets is not None and self.training and torch.is_grad_enabled():
            return self.lm_loss(states, targets), None  # no full logits while training
        target_logits = self.lm_logits(states)  # (b, t, vocab)
        loss = None if targets is None else token_loss(target_logits, targets)
        logits = target_logits.new_zeros(states.shape[0], length, target_logits.shape[-1])
        logits[:, length - states.shape[1] :] = target_logits
        return loss, logits


class WindowHeadMixin(NextTokenHeadBase):
    """One target per window (`next_token_mode="window"`, the design document's literal model): the window through
    the base model, pooled (PMA or mean, `config.pooling`), predicts the token after it: `logits` (b, 1, vocab).
    `labels` (b,) hold that token, or are causal-LM labels shaped like `input_ids`, read as "predict each row's last
    token from the tokens before it"."""

    objective = "one_target_window"  # the toolkit's OBJECTIVES row: how it is trained and scored

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor`): shape (batch,), the token after each window, or causal-LM labels shaped like
        `input_ids` (the last token of each row is then the target, and the window ends before it).
        shift_labels (`torch.LongTensor` of shape (batch, length), *optional*, a keyword argument): targets already
        aligned with the positions; the last one, the token after the window, is the target; they replace `labels`."""
        kwargs.pop("use_cache", None)  # no cache: every step reads the whole window
        if kwargs.get("prefix_length") is not None:
            raise ValueError(
                "`prefix_length` applies to next_token_mode='many' (where the targets of a window begin); "
                "next_token_mode='window' predicts the one token after the window from all of it."
            )
        kwargs.pop("prefix_length", None)
        shift_labels = kwargs.pop("shift_labels", None)
        labels_to_check = check_token_labels(labels if shift_labels is None else shift_labels)
        if shift_labels is not None:
            labels = shift_labels[:, -1]  # the target of the window's last position: the token after it
        elif labels is not None and labels.dim() == 2 and input_ids is not None and labels.shape == input_ids.shape:
            input_ids, labels = input_ids[:, :-1], labels[:, -1]
            attention_mask = None if attention_mask is None else attention_mask[:, :-1]
        window = self.config.context_length
        outputs, pooled = self.run_base_model(
            None if attention_mask is None else attention_mask[:, -window:],
            output_attentions,
            output_hidden_states,
            labels_to_check=labels_to_check,
            input_ids=None if input_ids is None else input_ids[:, -window:],
            inputs_embeds=None if inputs_embeds is None else inputs_embeds[:, -window:],
            **kwargs,
        )
        logits = self.lm_logits(pooled).unsqueeze(1)  # (b, 1, vocab)
        loss = None
        if labels is not None:
            if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
                raise ValueError(
                    "`labels` of a next-token prediction head hold the one token that follows each window: shape "
                    f"(batch,) = ({logits.shape[0]},), or causal-LM labels shaped like `input_ids`; got "
                    f"{tuple(labels.shape)}."
                )
            loss = F.cross_entropy(logits[:, 0].float(), labels, ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


class ForNextTokenPredictionMixin(ManyTargetsHeadMixin, WindowHeadMixin):
    """Both next-token heads under one class: `config.next_token_mode` picks `ManyTargetsHeadMixin` ("many") or
    `WindowHeadMixin` ("window") at each call. One class, because transformers maps a config class to one causal-LM
    class and checkpoints of either mode name it; the two heads have the same modules, so the same parameters."""

    @property
    def next_token_head(self):
        return ManyTargetsHeadMixin if self.config.next_token_mode == "many" else WindowHeadMixin

    @property
    def objective(self):
        return self.next_token_head.objective

    def check_head_config(self, config):
        self.next_token_head.check_head_config(self, config)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        """The forward of `next_token_head`: see `ManyTargetsHeadMixin.forward` and `WindowHeadMixin.forward`."""
        return self.next_token_head.forward(
            self, input_ids, attention_mask, inputs_embeds, labels, output_attentions, output_hidden_states, **kwargs
        )

"""Fields and validation shared by every hf_settransformer config.

As transformers' own configs (`configuration_llama.py`), each config is a `@strict` dataclass: every field is annotated
with its type and default, a choice is a `Literal`, a range an `interval` (or a validator of its own), and @strict
checks each value whenever it is set (construction, `from_dict`, `update`, `update_from_string`, `config.x = ...`),
raising `StrictDataclassFieldValidationError` that names the field. Rules across fields are `validate_*` methods,
run by `validate()`: at construction, after `from_dict`/`from_pretrained`'s keyword arguments, at `save_pretrained`,
when a model is built and at each checked forward (`checks.py`), so two assignments in a row may pass through a state
that only the second makes valid (`hidden_size`, then `num_attention_heads`). They raise
`StrictDataclassClassValidationError`, with the fields and the fix in its message.

A family's config subclasses `HfstConfig` (or `PooledHeadsConfig`, for the families with pooled and window heads), is
itself decorated with `@strict` (each class collects its own validators) and declares only the fields its models read.
"""

import dataclasses
import difflib
import importlib
import os
import sys
from typing import ClassVar, Literal

from huggingface_hub.dataclasses import strict, validated_field
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import PreTrainedConfig
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils import logging
from transformers.utils.type_validators import activation_fn_key, interval

from .decay import check_decay
from .families import family_for_model_type
from .feature_maps import get_feature_map

logger = logging.get_logger(__name__)

# the kernels of `attention.ATTENTION_KERNELS` that this package defines -> the config fields each reads; the config
# checks `attention_type` against this table without importing the attention ops, or against the registry itself
# where that module is loaded (a kernel a user registers with `register_attention_kernel` is valid then)
BUILT_IN_KERNEL_FIELDS = {
    "softmax": (),
    "linear": ("feature_map", "linear_attention_chunk_size", "linear_attention_decay"),
}
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
# transformers' flags that are no field of most configs but are given to any (the Trainer's `use_cache`,
# EncoderDecoderModel's `is_decoder`; `output_attentions` is a property): a string such as "no" would read as true
GENERIC_FLAGS = ("use_cache", "is_decoder", "add_cross_attention", "output_attentions")
# the fields of the family configs that a model reads at each call, or only while initialising weights: they may change
# after a model is built (its next forward honours them, and a save writes what it ran with). transformers' own fields
# (`output_hidden_states`, `return_dict`, `id2label`, `problem_type`, ...) are read at each call too. Every other field
# shapes the modules a model builds, and is fixed then (`built_fields`, `checks.check_built_config`).
CALL_TIME_FIELDS = frozenset({
    "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id", "use_cache", "is_decoder",
    "lm_loss_chunk_size", "context_length", "target_length", "num_blocks",
})


def built_fields(config):
    """The fields of `config` that a model's modules are built from: its family's own fields, but those read at each
    call (`CALL_TIME_FIELDS`)."""
    return [field.name for field in dataclasses.fields(config)
            if field.name not in PreTrainedConfig.__dataclass_fields__ and field.name not in CALL_TIME_FIELDS]


def kernel_config_fields():
    """attention_type -> the config fields its kernel reads, for every kernel registered in this process."""
    attention = sys.modules.get(f"{__package__}.attention")
    if attention is None:
        return BUILT_IN_KERNEL_FIELDS
    return {name: kernel.config_fields for name, kernel in attention.ATTENTION_KERNELS.items()}


def check_attention_type(value):
    kernels = kernel_config_fields()
    if value not in kernels:
        raise ValueError(f"`attention_type` must be one of {sorted(kernels)}, got {value!r}.")


def check_cutoffs(value):
    """An adaptive layer's cluster boundaries (`vocab_size` bounds the last, in `validate_architecture`)."""
    if value is not None and (not value or any(b <= a for a, b in zip([0] + value, value))):
        raise ValueError(f"Value must be a list of increasing positive integers, got {value!r}.")


def token_ids(value):
    """A pad/bos/eos field's ids: eos may be a list, any may be None."""
    return value if isinstance(value, list) else [] if value is None else [value]


def check_token_ids(value):
    """`validate_token_ids` checks them against the vocabulary."""
    if any(token < 0 for token in token_ids(value)):
        raise ValueError(f"Value must be a token id (a non-negative integer), got {value!r}.")


def check_labels(value):
    if value is not None and not value:
        raise ValueError("Value must map at least one class id to its name (it sets `num_labels`), got {}.")


def check_num_labels(value):
    if type(value) is not int or value < 1:
        raise ValueError(f"Value must be a positive integer, got {value!r}.")


def check_flag(value):
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"Value must be True or False, got {value!r}.")


def optional(validated, default=None):
    """The field `validated` (a validated-field factory such as `interval(min=1)`) makes, with None also allowed."""
    (check,) = validated().metadata["validator"]
    return validated_field(lambda value: value is None or check(value), default=default)


def check_field(name, check, value):
    """`check(value)`, its refusal raised as @strict raises a field's (for the values no @strict field holds)."""
    try:
        check(value)
    except ValueError as err:
        raise StrictDataclassFieldValidationError(field=name, cause=err) from err


def checked_property(parent, name, check):
    """`parent`, a property of PreTrainedConfig (so no field @strict checks), with `check` run on every value set."""

    def fset(self, value):
        check_field(name, check, value)
        parent.fset(self, value)

    return property(parent.fget, fset, doc=parent.__doc__)


def check_divisible(hidden_name, hidden_size, heads_name, num_heads):
    if hidden_size % num_heads != 0:
        raise ValueError(f"`{hidden_name}` ({hidden_size}) must be divisible by `{heads_name}` ({num_heads}).")


def family_configs():
    """The family configs of this package loaded in this process (in a remote-code checkpoint: the ones its folder
    holds)."""
    found, pending = [], [HfstConfig]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.model_type and cls.__module__.rpartition(".")[0] == __package__:
            found.append(cls)
    return found


def check_extra_keys(config_class, kwargs):
    """The keywords that are no field of `config_class`. transformers' flags (`GENERIC_FLAGS`) must be True or False.
    Another family's field (`pooling` given to the decoder: none of its models would read it) or a key one typo away
    from a field (`num_inducing_point=4` would be kept while `num_inducing_points` kept its default) is refused, naming
    the field. Other keys are kept as attributes, as transformers keeps them (`architectures`, a user's note)."""
    own = sorted(f.name for f in dataclasses.fields(config_class))
    for key, value in kwargs.items():
        if key in GENERIC_FLAGS:
            check_field(key, check_flag, value)
        if key.startswith("_") or key in GENERIC_FLAGS or hasattr(config_class, key):
            continue
        owners = sorted(cls.__name__ for cls in family_configs() if key in cls.__dataclass_fields__)
        if owners:
            raise ValueError(
                f"{config_class.__name__} has no field `{key}`: it is a field of {', '.join(owners)}, which none of "
                f"{config_class.__name__}'s models reads."
            )
        near = difflib.get_close_matches(key, own, n=1, cutoff=0.85)
        if near:
            raise ValueError(
                f"{config_class.__name__} has no field `{key}`; did you mean `{near[0]}`? (An unknown key would be "
                f"kept as an extra attribute while `{near[0]}` kept its default.)"
            )


def check_adaptive_tie(config):
    """`tie_adaptive_weights=True` shares each adaptive input cluster with the adaptive softmax cluster that holds the
    same ids at the same width: both layers must exist and cut the vocabulary alike."""
    input_cutoffs, output_cutoffs = config.adaptive_input_cutoffs, config.adaptive_softmax_cutoffs
    if input_cutoffs is None or output_cutoffs is None:
        raise ValueError(
            "`tie_adaptive_weights=True` needs both an adaptive input and an adaptive softmax (`adaptive_input_cutoffs` "
            f"and `adaptive_softmax_cutoffs`); got adaptive_input_cutoffs={input_cutoffs!r}, "
            f"adaptive_softmax_cutoffs={output_cutoffs!r}."
        )
    if input_cutoffs != output_cutoffs:
        raise ValueError(
            "`tie_adaptive_weights=True` needs `adaptive_input_cutoffs` equal to `adaptive_softmax_cutoffs` (the tied "
            f"clusters must hold the same ids); got {input_cutoffs!r} and {output_cutoffs!r}."
        )
    if float(config.adaptive_input_div_value) != float(config.adaptive_softmax_div_value):
        raise ValueError(
            "`tie_adaptive_weights=True` needs `adaptive_input_div_value` equal to `adaptive_softmax_div_value` (the "
            f"tied clusters must have the same widths); got {config.adaptive_input_div_value} and "
            f"{config.adaptive_softmax_div_value}."
        )
    # nn.AdaptiveLogSoftmaxWithLoss's widths; the adaptive input keeps at least 1
    div = float(config.adaptive_softmax_div_value)
    widths = [int(config.hidden_size // div**i) for i in range(len(output_cutoffs) + 1)]
    if min(widths) < 1:
        raise ValueError(
            f"`tie_adaptive_weights=True`: with `hidden_size={config.hidden_size}` and "
            f"`adaptive_softmax_div_value={config.adaptive_softmax_div_value}` the cluster widths are {widths}; the "
            "adaptive input keeps at least 1 where the adaptive softmax has 0, so the clusters cannot be shared. Use "
            "fewer clusters or a smaller div value."
        )


positive = interval(min=1)
probability = interval(min=0.0, max=1.0, exclude_max=True)
unit_scale = interval(min=0.0, max=1.0, exclude_min=True)  # an inf epsilon zeroes every output, an inf std gives NaN
div_value = interval(min=1.0, max=float("inf"), exclude_max=True)


@strict
class HfstConfig(PreTrainedConfig):
    """Base of the hf_settransformer configs: the fields every family shares. With neither `vocab_size` nor
    `input_size`, a model takes `inputs_embeds` of size `hidden_size`. Linear attention's `feature_map` is a name of
    `feature_maps.FEATURE_MAPS`, its `linear_attention_decay` one of `decay.DECAYS` ("fixed": RetNet's per-head
    gamma_h = 1 - 2^(-5-h), Sun et al. 2023; "gated": a per-token, per-head gate as simple GLA, Yang et al. 2024; causal
    attention only). The adaptive layers (Grave et al. 2017 for the output, Baevski & Auli 2019 for the input) need token
    ids ordered by decreasing frequency; with one, logits are log-probabilities. `tie_adaptive_weights` shares the
    adaptive input's cluster tables with the adaptive softmax's word matrices (Baevski & Auli 2019), and with
    `tie_adaptive_projections` each cluster's input projection with its output projection (read transposed): both
    layers must then cut the same clusters at the same widths."""

    # whether the family has the pooled and window heads (`PooledHeadsConfig`)
    windowed_heads: ClassVar[bool] = False

    vocab_size: int | None = optional(positive)  # token vocabulary (token inputs, language-model heads)
    input_size: int | None = optional(positive)  # continuous inputs: `input_features` of shape (b, n, input_size)
    hidden_size: int = positive(default=256)  # width of every block
    num_attention_heads: int = positive(default=4)  # heads of every attention layer
    intermediate_size: int | None = optional(positive)  # feed-forward width; None: 4 * hidden_size
    hidden_act: str = activation_fn_key(default="relu")  # feed-forward activation, a key of transformers' ACT2FN
    hidden_dropout_prob: int | float = probability(default=0.1)  # on embeddings and on every residual branch
    # on softmax weights; linear attention (no weight matrix) drops each key, per head, for all queries instead
    attention_probs_dropout_prob: int | float = probability(default=0.1)
    max_position_embeddings: int = positive(default=512)  # longest sequence for learned positions
    # "sinusoidal" (Vaswani et al.), "learned", or "none" (a permutation-equivariant model)
    position_embedding_type: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    scale_embedding: bool = True  # token embeddings times sqrt(hidden_size) (Vaswani et al.)
    norm_type: Literal["scalenorm", "layernorm"] = "scalenorm"  # ScaleNorm (Nguyen & Salazar 2019) or LayerNorm
    norm_eps: int | float = unit_scale(default=1e-5)  # floor of the norm in ScaleNorm, epsilon of LayerNorm
    attention_type: str = validated_field(check_attention_type, default="softmax")  # a kernel: "softmax", "linear"
    feature_map: str = validated_field(get_feature_map, default="elu")  # linear attention's: elu(x)+1 or exp
    linear_attention_chunk_size: int = positive(default=64)  # chunk length of causal linear attention
    linear_attention_decay: str = validated_field(check_decay, default="none")  # causal linear attention's state
    adaptive_softmax_cutoffs: list[int] | None = validated_field(check_cutoffs, default=None)  # adaptive output layer
    adaptive_softmax_div_value: int | float = div_value(default=4.0)  # width divisor of each next output cluster
    adaptive_input_cutoffs: list[int] | None = validated_field(check_cutoffs, default=None)  # adaptive embedding
    adaptive_input_div_value: int | float = div_value(default=4.0)  # width divisor of each next input cluster
    tie_adaptive_weights: bool = False  # adaptive input tables shared with the adaptive softmax's word matrices
    tie_adaptive_projections: bool = True  # with tie_adaptive_weights: the cluster projections shared too
    initializer_range: int | float = unit_scale(default=0.02)  # std of the normal initialisation
    pad_token_id: int | None = validated_field(check_token_ids, default=None)  # padding (`generate` pads with it)
    bos_token_id: int | None = validated_field(check_token_ids, default=None)  # what an empty prompt starts with
    eos_token_id: int | list[int] | None = validated_field(check_token_ids, default=None)  # ends generation
    tie_word_embeddings: bool | None = None  # None: tied unless an adaptive layer (it has no matrix to share)

    # transformers' own fields, annotated again: configuration_utils' string annotations (`from __future__ import
    # annotations`) leave them unchecked by @strict
    output_hidden_states: bool | None = False  # return every block's hidden states
    return_dict: bool | None = True  # return a ModelOutput, not a tuple
    is_encoder_decoder: bool = False  # a seq2seq config's flag: False for these
    id2label: dict[int, str] | dict[str, str] | None = validated_field(check_labels, default=None)  # sets num_labels
    # the sequence-classification loss: mean squared error, cross-entropy, or binary cross-entropy per label
    problem_type: Literal["regression", "single_label_classification", "multi_label_classification"] | None = None
    # and two of its properties, checked on assignment as the fields are
    num_labels = checked_property(PreTrainedConfig.num_labels, "num_labels", check_num_labels)
    output_attentions = checked_property(PreTrainedConfig.output_attentions, "output_attentions", check_flag)

    def __post_init__(self, **kwargs):
        check_extra_keys(type(self), kwargs)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.tie_word_embeddings is None:
            self.tie_word_embeddings = self.adaptive_softmax_cutoffs is None and self.adaptive_input_cutoffs is None
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Rules across fields (and the kernel registry, which may have changed since `attention_type` was set)."""
        super().validate_architecture()
        check_attention_type(self.attention_type)
        check_divisible("hidden_size", self.hidden_size, "num_attention_heads", self.num_attention_heads)
        for prefix, layer in (("adaptive_softmax", "the adaptive output layer"), ("adaptive_input", "the adaptive input")):
            cutoffs = getattr(self, f"{prefix}_cutoffs")
            if cutoffs is not None and (self.vocab_size is None or cutoffs[-1] >= self.vocab_size):
                raise ValueError(f"`{prefix}_cutoffs` must end below `vocab_size` ({self.vocab_size}), got {cutoffs!r}.")
            if cutoffs is not None and self.tie_word_embeddings:
                raise ValueError(
                    f"`tie_word_embeddings=True` cannot hold with `{prefix}_cutoffs`: {layer} has no vocabulary x "
                    "hidden matrix to share (leave it unset or False)."
                )
        if self.tie_adaptive_weights:
            check_adaptive_tie(self)
        read = kernel_config_fields()[self.attention_type]
        for name, default in (("feature_map", "elu"), ("linear_attention_decay", "none")):
            if name not in read and getattr(self, name) != default:
                logger.warning_once(
                    f"`{name}={getattr(self, name)!r}` has no effect with `attention_type={self.attention_type!r}` "
                    "(it configures linear attention)."
                )

    def validate_token_ids(self):
        """pad/bos/eos ids must be ids of the vocabulary, or `generate` emits them (transformers' own check warns)."""
        if self.vocab_size is None:
            return
        for name in TOKEN_ID_FIELDS:
            value = getattr(self, name)
            if any(token >= self.vocab_size for token in token_ids(value)):
                raise ValueError(
                    f"`{name}` must be a token id in [0, {self.vocab_size - 1}] (the vocabulary), got {value!r}."
                )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """As transformers', but a checkpoint of another model type is refused, naming both: another family's weights
        can load into this family's classes without a missing or unexpected key (the names coincide), and then mean
        something else. (transformers only warns.) `AutoConfig` picks the class from the file and is not affected."""
        config_dict, _ = cls.get_config_dict(pretrained_model_name_or_path, **dict(kwargs))
        found = config_dict.get("model_type")
        if getattr(cls, "model_type", "") and found and found != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a `{found}` checkpoint; {cls.__name__} is `{cls.model_type}`. "
                f"Load it with its own family's class, or with the Auto classes (AutoModel, AutoModelForCausalLM, ...), "
                "which pick the class from the checkpoint."
            )
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """As transformers'; the keyword arguments it sets after building the config (`from_pretrained(ckpt,
        target_length=1)`) are validated with the rest, as the constructor's are."""
        loaded = super().from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()
        return loaded

    def save_pretrained(self, save_directory, push_to_hub=False, **kwargs):
        """As transformers', and a config folder is enough to build any of the family's models from scratch
        (`AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, trust_remote_code=True),
        trust_remote_code=True)`, e.g. run_clm.py's `--config_name`): `auto_map` lists every class of the family
        (`families.FAMILIES`) and the modeling code is copied beside the configuration code. An invalid config (one
        changed field by field) is refused before anything is written."""
        self.validate()
        if self._auto_class is not None:
            family = family_for_model_type(self.model_type)
            self.auto_map = {**(getattr(self, "auto_map", None) or {}), **family.auto_map}
            model_class = _loaded_class(family.models["AutoModel"])
            if model_class is not None:
                os.makedirs(save_directory, exist_ok=True)
                custom_object_save(model_class, save_directory)  # the modeling file and its siblings
            else:
                logger.warning(
                    f"{type(self).__name__}.save_pretrained: the family's modeling code is not loaded here (a config "
                    "loaded alone as remote code), so the folder gets the configuration code only; save a model of "
                    "the family, or save from where hf_settransformer is installed, for a folder that builds models."
                )
        return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)


@strict
class PooledHeadsConfig(HfstConfig):
    """Base of the configs of the families with sequence-level heads, which pool the sequence
    (`*ForSequenceClassification`) or read it in windows (`*ForNextTokenPrediction`): encoder, Set Transformer and
    Perceiver IO, not the decoder. `next_token_mode="many"`: the last `target_length` positions of a window each
    predict their next token in one pass, after a bidirectional prefix (encoder, Set Transformer) or through a causal
    cross-attention (Perceiver AR), none seeing its own target or a later token; `"window"`: the design document's
    literal model, one prediction per window (logits of shape (batch, 1, vocab))."""

    windowed_heads: ClassVar[bool] = True

    pooling: Literal["pma", "mean"] = "pma"  # attention pooling with one seed (Lee et al. 2019) or masked mean
    context_length: int = positive(default=64)  # tokens seen by the `*ForNextTokenPrediction` heads
    next_token_mode: Literal["many", "window"] = "many"  # how a next-token head reads its window (above)
    target_length: int | None = optional(positive)  # predictions per window in "many" mode; None: context_length // 2

    def __post_init__(self, **kwargs):
        if self.target_length is None:
            self.target_length = max(self.context_length // 2, 1)
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        if self.target_length > self.context_length:
            raise ValueError(
                f"`target_length` ({self.target_length}) cannot exceed `context_length` ({self.context_length})."
            )
        if self.next_token_mode == "many" and self.target_length < 2:
            # position i predicts token i + 1: the last position's target lies outside the window, so with one
            # target position (or a one-token window) no target is ever scored and the loss is always 0
            raise ValueError(
                f"`next_token_mode='many'` needs `target_length` >= 2 and `context_length` >= 2 (the last position's "
                f"target lies after the window); got target_length={self.target_length}, "
                f"context_length={self.context_length}. Use next_token_mode='window' for one target per window."
            )


def _loaded_class(path):
    """`"module.Class"` of this package, or of the same remote-code repository: transformers 5.23 caches each
    remote-code entry file (the config's, the model's) with its own imports in a folder named by their hash, so when
    this file was loaded as remote code the modeling file may sit in a sibling folder of the same repository.
    None where it is not loaded at all."""
    module_name, class_name = path.split(".")
    try:
        return getattr(importlib.import_module(f"{__package__}.{module_name}"), class_name)  # lazily: it imports this
    except ModuleNotFoundError:
        repository = __package__.rsplit(".", 1)[0] + "."  # transformers_modules.<repository>.<hash> -> its repository
        for name, module in list(sys.modules.items()):
            if name.startswith(repository) and name.endswith(f".{module_name}") and hasattr(module, class_name):
                return getattr(module, class_name)
    return None

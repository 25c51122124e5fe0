"""Fields and validation shared by every hf_settransformer config.

Each family's config (encoder, decoder, Set Transformer, Perceiver IO) subclasses `HfstConfig` and adds its
own fields; the families with pooled and window heads (all but the decoder) through `PooledHeadsConfig`. Every
config has its own `__init__(..., **kwargs)` (transformers 5 wraps configs without one and would skip a
parent's), and invalid values are rejected with a `ValueError` that names the field and the allowed values.

A config is valid however it was built or changed, as transformers' strict config dataclasses are (their fields are
type-checked on assignment, their `validate()` runs at construction and at save). Each field's own check
(`field_checks`: type and range) runs on every assignment once the config is built (`config.x = ...`, `update`,
`update_from_string`, the keyword arguments `from_pretrained`/`from_dict` set after reading a file); the whole
`check_fields` (with the checks that read several fields: heads dividing `hidden_size`, `target_length` against
`context_length`, token ids against `vocab_size`, ...) runs at construction, after `from_dict`/`from_pretrained`
(file and keyword arguments), after `update`/`update_from_string` (which undo their changes when refused), at
`save_pretrained`, when a model is built and at every checked forward. Two assignments in a row may so pass through
a state that only the second makes valid (`hidden_size`, then `num_attention_heads`); `update` takes both at once.
"""

import contextlib
import copy
import difflib
import functools
import importlib
import inspect
import math
import os
import sys

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils import logging

from .families import family_for_model_type
from .decay import check_decay
from .feature_maps import get_feature_map

logger = logging.get_logger(__name__)

NORM_TYPES = ("scalenorm", "layernorm")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned", "none")
POOLING_TYPES = ("pma", "mean")
NEXT_TOKEN_MODES = ("many", "window")
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
# flags a config may carry (ours, or transformers' generic ones passed through **kwargs): a string such as "no" would
# read as true and silently switch the feature on
BOOL_FIELDS = (
    "scale_embedding",
    "tie_word_embeddings",
    "add_cross_attention",
    "is_decoder",
    "use_cache",
    "is_encoder_decoder",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
)


# the kernels of `attention.ATTENTION_KERNELS` that this package defines -> the config fields each reads; the config
# checks `attention_type` against this table without importing the attention ops, or against the registry itself
# where that module is loaded (a kernel a user registers with `register_attention_kernel` is valid then)
BUILT_IN_KERNEL_FIELDS = {
    "softmax": (),
    "linear": ("feature_map", "linear_attention_chunk_size", "linear_attention_decay"),
}


def kernel_config_fields():
    """attention_type -> the config fields its kernel reads, for every kernel registered in this process."""
    attention = sys.modules.get(f"{__package__}.attention")
    if attention is None:
        return BUILT_IN_KERNEL_FIELDS
    return {name: kernel.config_fields for name, kernel in attention.ATTENTION_KERNELS.items()}


def check_attention_type(value):
    kernels = kernel_config_fields()
    if not isinstance(value, str) or value not in kernels:
        raise ValueError(f"`attention_type` must be one of {sorted(kernels)}, got {value!r}.")


def check_choice(name, value, choices):
    if not any(type(value) is type(choice) and value == choice for choice in choices):  # 1 is no True, [] no choice
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")


def check_activation(value):
    if not isinstance(value, str) or value not in ACT2FN:
        raise ValueError(f"`hidden_act` must be one of {sorted(ACT2FN)}, got {value!r}.")


def check_labels(id2label):
    if id2label is not None and (not isinstance(id2label, dict) or not id2label):
        raise ValueError(f"`id2label` must map at least one class id to its name (it sets `num_labels`), got {id2label!r}.")


def check_positive(name, value, allow_none=False, allow_zero=False):
    if value is None and allow_none:
        return
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"`{name}` must be {what} integer, got {value!r}.")


def check_probability(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}.")


def check_bool(name, value, allow_none=False):
    if not isinstance(value, bool) and not (value is None and allow_none):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")


def check_token_id(name, value, vocab_size=None):
    """pad/bos/eos ids (eos may be a list) must be token ids of the vocabulary, or `generate` emits them."""
    ids = value if isinstance(value, (list, tuple)) else [value]
    for token in ids:
        if token is None:
            continue
        valid = isinstance(token, int) and not isinstance(token, bool) and token >= 0
        if not valid or (vocab_size is not None and token >= vocab_size):
            vocabulary = f"[0, {vocab_size - 1}]" if vocab_size else "non-negative integers"
            raise ValueError(f"`{name}` must be a token id in {vocabulary} (the vocabulary), got {value!r}.")


def check_cutoffs(name, cutoffs):
    """An adaptive layer's cluster boundaries: None (off) or increasing positive integers (`vocab_size` bounds the last,
    in `check_adaptive`)."""
    if cutoffs is None:
        return
    integers = isinstance(cutoffs, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in cutoffs)
    if not integers or not cutoffs or any(b <= a for a, b in zip([0] + cutoffs, cutoffs)):
        raise ValueError(f"`{name}` must be a list of increasing positive integers, got {cutoffs!r}.")


def check_div_value(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value < float("inf"):
        raise ValueError(f"`{name}` must be a finite number >= 1, got {value!r}.")


def check_finite_range(name, value, low, high):
    """A real number in (low, high]: an inf norm epsilon zeroes every output, an inf init std gives NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low < value <= high) or math.isnan(value):
        raise ValueError(f"`{name}` must be a number in ({low}, {high}], got {value!r}.")


def own_field_names(config_class):
    """The arguments of every hf_settransformer `__init__` in the class's hierarchy."""
    names = set()
    for cls in config_class.__mro__:
        if issubclass(cls, HfstConfig) and "__init__" in vars(cls):
            names.update(n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs"))
    return names


def check_unknown_keys(config_class, kwargs):
    """A keyword that is no field but is one typo away from one (`num_inducing_point=4`) would be stored as an extra
    attribute while the real field keeps its default: refuse it, naming the field. Other extra keys are kept, as
    transformers does (saved configs carry keys such as `architectures`)."""
    own = own_field_names(config_class)
    generic = set(inspect.signature(PreTrainedConfig.__init__).parameters)
    for key in kwargs:
        if key in own or key in generic or key.startswith("_"):
            continue
        near = difflib.get_close_matches(key, sorted(own), n=1, cutoff=0.85)
        if near:
            raise ValueError(
                f"{config_class.__name__} has no field `{key}`; did you mean `{near[0]}`? (An unknown key would be "
                f"kept as an extra attribute while `{near[0]}` kept its default.)"
            )


def other_family_fields(config_class):
    """Field -> names of the family configs that have it, for the fields of this package's other configs (those
    defined here: in a remote-code checkpoint, the ones its folder holds) that `config_class` lacks. transformers'
    generic flags (`use_cache`, `is_decoder`, ...) are left out: transformers itself sets them on any config."""
    own = own_field_names(config_class)
    owners = {}
    pending = list(HfstConfig.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.rpartition(".")[0] != __package__:  # a user's subclass is no family of this package
            continue
        for name in own_field_names(cls) - own - set(BOOL_FIELDS):
            owners.setdefault(name, set())
            if getattr(cls, "model_type", ""):
                owners[name].add(cls.__name__)
    return owners


def drop_other_family_fields(config_class, config_dict, log):
    """Remove from `config_dict`, in place, the fields of other families' configs, saying so through `log`: kept, they
    would be saved in config.json as if this family's models read them."""
    if not set(config_dict) - own_field_names(config_class):
        return
    owners = other_family_fields(config_class)
    dropped = sorted(key for key in config_dict if key in owners)
    for key in dropped:
        del config_dict[key]
    if dropped:
        named = "; ".join(f"`{key}` ({', '.join(sorted(owners[key])) or 'another family'})" for key in dropped)
        log(
            f"{config_class.__name__} drops fields that only other families' configs have, which none of its models "
            f"reads, so they are neither kept nor saved: {named}."
        )


def check_heads(hidden_name, hidden_size, heads_name, num_heads):
    if hidden_size % num_heads != 0:
        raise ValueError(f"`{hidden_name}` ({hidden_size}) must be divisible by `{heads_name}` ({num_heads}).")


class HfstConfig(PreTrainedConfig):
    r"""
    Base of the hf_settransformer configs. Arguments shared by every family:

    vocab_size (`int`, *optional*): size of the token vocabulary (token inputs, language-model heads).
    input_size (`int`, *optional*): size of continuous input features (`input_features` of shape (b, n, input_size)).
        With neither, the model takes `inputs_embeds` of size `hidden_size`.
    hidden_size (`int`, defaults to 256): width of every block.
    num_hidden_layers (`int`, defaults to 4): number of blocks in the main stack.
    num_attention_heads (`int`, defaults to 4): heads of every attention layer.
    intermediate_size (`int`, *optional*): width of the feed-forward layers; defaults to `4 * hidden_size`.
    hidden_act (`str`, defaults to `"relu"`): feed-forward activation (a key of `transformers.activations.ACT2FN`).
    hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and on every residual branch.
    attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on softmax attention weights; linear attention,
        which has no weight matrix, drops each key (per head, for all queries) with this probability instead.
    max_position_embeddings (`int`, defaults to 512): longest sequence for learned positions.
    position_embedding_type (`str`): `"sinusoidal"` (Vaswani et al.), `"learned"` or `"none"` (permutation
        equivariant model).
    scale_embedding (`bool`, defaults to `True`): multiply token embeddings by sqrt(hidden_size) (Vaswani et al.).
    norm_type (`str`, defaults to `"scalenorm"`): `"scalenorm"` (Nguyen & Salazar 2019) or `"layernorm"`.
    norm_eps (`float`, defaults to 1e-5): floor of the norm in ScaleNorm, epsilon of LayerNorm.
    attention_type (`str`, defaults to `"softmax"`): `"softmax"` or `"linear"`.
    feature_map (`str`, defaults to `"elu"`): linear attention's feature map, a name in `feature_maps.FEATURE_MAPS`:
        `"elu"` (elu(x)+1, Katharopoulos et al. 2020) or `"exp"` (Shen et al. 2021).
    linear_attention_chunk_size (`int`, defaults to 64): chunk length of causal linear attention.
    linear_attention_decay (`str`, defaults to `"none"`): the decay of causal linear attention's state, a name in
        `decay.DECAYS`: `"none"`, `"fixed"` (RetNet's per-head gamma_h = 1 - 2^(-5-h), Sun et al. 2023) or `"gated"`
        (a per-token, per-head gate, logsigmoid(x W^T + b) / 16, as simple GLA, Yang et al. 2024). Causal attention
        only: a forward with no causal attention (a set, a classifier) is refused.
    adaptive_softmax_cutoffs (`list[int]`, *optional*): replace every language-model head's output layer by an
        adaptive softmax (Grave et al. 2017, `torch.nn.AdaptiveLogSoftmaxWithLoss`) with these cluster boundaries;
        token ids must be ordered by decreasing frequency. Logits are then log-probabilities, and the output layer
        is not tied to the input embedding.
    adaptive_softmax_div_value (`float`, defaults to 4.0): width divisor of each successive adaptive cluster.
    adaptive_input_cutoffs (`list[int]`, *optional*): replace the token embedding by an adaptive input (Baevski &
        Auli 2019) with these cluster boundaries: the ids of cluster i (after the i-th boundary) get vectors of width
        `hidden_size // adaptive_input_div_value**i`, projected to `hidden_size`, so rare tokens hold few parameters.
        Token ids must be ordered by decreasing frequency. Not tied to the output layer; usually the same boundaries
        as `adaptive_softmax_cutoffs`.
    adaptive_input_div_value (`float`, defaults to 4.0): width divisor of each successive adaptive input cluster.
    initializer_range (`float`, defaults to 0.02): std of the normal initialisation.

    Each family's config holds, and writes to config.json, only the fields its models read. Other keyword arguments:
    a near miss of a field (`num_inducing_point`) is refused, naming the field; a field of another family's config
    (`pooling` given to the decoder, or carried by a config.json that an older version wrote with every field on every
    family) is dropped, with a logged note (a warning when passed to the constructor, an info line when read from a
    file by `from_pretrained`/`from_dict`); any other key is kept as an attribute, as transformers does.
    """

    # whether the family has the pooled and window heads (`*ForSequenceClassification`, `*ForNextTokenPrediction`)
    # that read `pooling`, `context_length`, `target_length` and `next_token_mode` (`PooledHeadsConfig`)
    windowed_heads = False

    def __init__(
        self,
        vocab_size=None,
        input_size=None,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=None,
        hidden_act="relu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        position_embedding_type="sinusoidal",
        scale_embedding=True,
        norm_type="scalenorm",
        norm_eps=1e-5,
        attention_type="softmax",
        feature_map="elu",
        linear_attention_chunk_size=64,
        linear_attention_decay="none",
        adaptive_softmax_cutoffs=None,
        adaptive_softmax_div_value=4.0,
        adaptive_input_cutoffs=None,
        adaptive_input_div_value=4.0,
        initializer_range=0.02,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=None,
        **kwargs,
    ):
        drop_other_family_fields(type(self), kwargs, logger.warning)
        check_unknown_keys(type(self), kwargs)
        for name in BOOL_FIELDS:  # transformers' own flags, before its __init__ stores or drops them
            if name in kwargs and kwargs[name] is not None:
                check_bool(name, kwargs[name])
        if "num_labels" in kwargs and kwargs.get("id2label") is None:
            check_positive("num_labels", kwargs["num_labels"])
        check_choice("problem_type", kwargs.get("problem_type"), PROBLEM_TYPES)
        check_labels(kwargs.get("id2label"))  # transformers' __init__ reads it as a dict
        self.vocab_size = vocab_size
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = 4 * hidden_size if intermediate_size is None else intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.position_embedding_type = position_embedding_type
        self.scale_embedding = scale_embedding
        self.norm_type = norm_type
        self.norm_eps = norm_eps
        self.attention_type = attention_type
        self.feature_map = feature_map
        self.linear_attention_chunk_size = linear_attention_chunk_size
        self.linear_attention_decay = linear_attention_decay
        self.adaptive_softmax_cutoffs = _cutoff_list(adaptive_softmax_cutoffs)
        self.adaptive_softmax_div_value = adaptive_softmax_div_value
        self.adaptive_input_cutoffs = _cutoff_list(adaptive_input_cutoffs)
        self.adaptive_input_div_value = adaptive_input_div_value
        if tie_word_embeddings is None:  # an adaptive layer has no vocabulary x hidden matrix to tie
            tie_word_embeddings = self.adaptive_softmax_cutoffs is None and self.adaptive_input_cutoffs is None
        self.initializer_range = initializer_range
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings
        super().__init__(**kwargs)
        self.check_fields()

    # field -> its check, on the value alone (type and range); families extend the table. A check that reads several
    # fields is in `check_fields`.
    field_checks = {
        "vocab_size": lambda v: check_positive("vocab_size", v, allow_none=True),
        "input_size": lambda v: check_positive("input_size", v, allow_none=True),
        **{
            name: functools.partial(check_positive, name)
            for name in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "linear_attention_chunk_size",
            )
        },
        "hidden_dropout_prob": functools.partial(check_probability, "hidden_dropout_prob"),
        "attention_probs_dropout_prob": functools.partial(check_probability, "attention_probs_dropout_prob"),
        "attention_type": check_attention_type,
        "feature_map": get_feature_map,  # refuses a name not in the table, naming its names
        "linear_attention_decay": check_decay,
        "norm_type": lambda v: check_choice("norm_type", v, NORM_TYPES),
        "position_embedding_type": lambda v: check_choice("position_embedding_type", v, POSITION_EMBEDDING_TYPES),
        "hidden_act": check_activation,
        **{name: functools.partial(check_token_id, name) for name in TOKEN_ID_FIELDS},
        **{name: functools.partial(check_cutoffs, name) for name in ("adaptive_softmax_cutoffs", "adaptive_input_cutoffs")},
        **{
            name: functools.partial(check_div_value, name)
            for name in ("adaptive_softmax_div_value", "adaptive_input_div_value")
        },
        # an init std of 0 would train a model of zeros; above 1 (or inf) the first layers already overflow
        "norm_eps": lambda v: check_finite_range("norm_eps", v, 0, 1),
        "initializer_range": lambda v: check_finite_range("initializer_range", v, 0, 1),
        **{name: functools.partial(check_bool, name, allow_none=True) for name in BOOL_FIELDS},
        "problem_type": lambda v: check_choice("problem_type", v, PROBLEM_TYPES),
        "id2label": check_labels,  # sets `num_labels`: an empty map makes a head of no classes
    }

    def __setattr__(self, key, value):
        """As transformers' strict config fields: once the config is built (`_post_init_done`, transformers' own
        marker), an assignment is checked before it is made; the checks across fields run at `check_fields`."""
        if key in self.field_checks and self.__dict__.get("_post_init_done"):
            self.field_checks[key](value)
        elif key == "num_labels" and self.__dict__.get("_post_init_done"):
            check_positive("num_labels", value)
        super().__setattr__(key, value)

    def check_fields(self):
        """Raise a `ValueError` naming the first invalid field: each field's own check, then those across fields.
        Families extend both."""
        values = self.__dict__  # read directly: transformers' attribute lookup would make this ~5x slower per forward
        for name, check in self.field_checks.items():
            if name not in TOKEN_ID_FIELDS:  # `check_special_tokens`, against the vocabulary
                check(values[name] if name in values else getattr(self, name, None))
        check_heads("hidden_size", self.hidden_size, "num_attention_heads", self.num_attention_heads)
        self.check_special_tokens()
        self.check_adaptive("adaptive_softmax", "the adaptive output layer")
        self.check_adaptive("adaptive_input", "the adaptive input")
        fields = kernel_config_fields()[self.attention_type]
        if "feature_map" not in fields and self.feature_map != "elu":
            logger.warning_once(
                f"`feature_map={self.feature_map!r}` has no effect with `attention_type={self.attention_type!r}` (it "
                "selects linear attention's feature map)."
            )
        if "linear_attention_decay" not in fields and self.linear_attention_decay != "none":
            logger.warning_once(
                f"`linear_attention_decay={self.linear_attention_decay!r}` has no effect with "
                f"`attention_type={self.attention_type!r}` (it selects the decay of linear attention's state)."
            )

    def update(self, config_dict):
        """As transformers', checked: each value as it is set, then the whole config; a refused update is undone."""
        with self.checked_change():
            super().update(config_dict)

    def update_from_string(self, update_str):
        """As transformers' (`"target_length=8,pooling=mean"`), checked and undone when refused, as `update`; a number
        that does not parse as the field's type is refused naming the field (transformers' error names neither)."""
        for key, _, text in (pair.partition("=") for pair in update_str.split(",")):
            kind = type(getattr(self, key, None))
            if kind in (int, float):
                try:
                    kind(text)
                except ValueError:
                    what = "an integer" if kind is int else "a number"
                    raise ValueError(f"`{key}` must be {what}, got {text!r} (update_from_string).") from None
        with self.checked_change():
            super().update_from_string(update_str)

    @contextlib.contextmanager
    def checked_change(self):
        """Run `check_fields` after the changes made inside; restore the config as it was when they are refused."""
        before = copy.copy(self.__dict__)
        try:
            yield
            self.check_fields()
        except Exception:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

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
        """As transformers'. A config.json written before each family had its own fields carries every family's
        (`pooling`, `context_length`, ... on a decoder): they are dropped with an info line, not the constructor's
        warning, since the file's reader did not choose them."""
        config_dict = dict(config_dict)
        drop_other_family_fields(cls, config_dict, logger.info)
        loaded = super().from_dict(config_dict, **kwargs)
        # the keyword arguments (`from_pretrained(ckpt, target_length=1)`) are set after construction: check them with
        # the rest
        (loaded[0] if isinstance(loaded, tuple) else loaded).check_fields()
        return loaded

    def check_special_tokens(self):
        """pad/bos/eos ids (eos may be a list) must be token ids of the vocabulary, or `generate` emits them."""
        for name in TOKEN_ID_FIELDS:
            check_token_id(name, getattr(self, name, None), self.vocab_size)

    def save_pretrained(self, save_directory, push_to_hub=False, **kwargs):
        """As transformers', and a config folder is enough to build any of the family's models from scratch
        (`AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, trust_remote_code=True),
        trust_remote_code=True)`, e.g. run_clm.py's `--config_name`): `auto_map` lists every class of the family
        (`families.FAMILIES`) and the modeling code is copied beside the configuration code. An invalid config (one
        changed field by field) is refused before anything is written, as transformers' `validate()` at save."""
        self.check_fields()
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

    def check_adaptive(self, prefix, layer):
        """`{prefix}_cutoffs` and `{prefix}_div_value` of an adaptive layer (`layer`, for the messages)."""
        cutoffs = getattr(self, f"{prefix}_cutoffs")
        if cutoffs is None:
            return
        if self.vocab_size is None or cutoffs[-1] >= self.vocab_size:
            raise ValueError(f"`{prefix}_cutoffs` must end below `vocab_size` ({self.vocab_size}), got {cutoffs!r}.")
        if self.tie_word_embeddings:
            raise ValueError(
                f"`tie_word_embeddings=True` cannot hold with `{prefix}_cutoffs`: {layer} has no vocabulary x hidden "
                "matrix to share (leave it unset or False)."
            )


class PooledHeadsConfig(HfstConfig):
    r"""
    Base of the configs of the families with sequence-level heads, which pool the sequence
    (`*ForSequenceClassification`) or read it in windows (`*ForNextTokenPrediction`): encoder, Set Transformer and
    Perceiver IO, not the decoder. Takes every argument of [`HfstConfig`], plus:

    pooling (`str`, defaults to `"pma"`): how sequence-level heads pool: `"pma"` (attention pooling with one seed,
        Lee et al. 2019) or `"mean"` (masked mean).
    context_length (`int`, defaults to 64): tokens seen by the `*ForNextTokenPrediction` heads.
    next_token_mode (`str`, defaults to `"many"`): how a `*ForNextTokenPrediction` head reads its window. `"many"`:
        the last `target_length` positions each predict their next token in one pass, the positions before them are
        a bidirectional prefix (encoder, Set Transformer) or reached through a causal cross-attention (Perceiver
        AR); no prediction sees its own target or a later token. `"window"`: the design document's literal model,
        one prediction per window (logits of shape (batch, 1, vocab)).
    target_length (`int`, *optional*): predictions per window in `"many"` mode; defaults to `context_length // 2`.
    """

    windowed_heads = True

    def __init__(self, pooling="pma", context_length=64, next_token_mode="many", target_length=None, **kwargs):
        self.pooling = pooling
        self.context_length = context_length
        self.next_token_mode = next_token_mode
        if target_length is None and isinstance(context_length, int):
            target_length = max(context_length // 2, 1)
        self.target_length = target_length
        super().__init__(**kwargs)

    field_checks = {
        **HfstConfig.field_checks,
        "pooling": lambda v: check_choice("pooling", v, POOLING_TYPES),
        "context_length": functools.partial(check_positive, "context_length"),
        "next_token_mode": lambda v: check_choice("next_token_mode", v, NEXT_TOKEN_MODES),
        "target_length": functools.partial(check_positive, "target_length"),
    }

    def check_fields(self):
        super().check_fields()
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


def _cutoff_list(value):
    """Cluster boundaries as a list (a JSON config gives one, Python callers may pass a tuple); None or empty: off.
    Anything else is kept as given, for `check_adaptive` to refuse by name."""
    if isinstance(value, (list, tuple)):
        return list(value) or None
    return value


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

import dataclasses
import json

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PreTrainedConfig

import hf_settransformer as hfst
from tests.helpers import CONFIG_CLASSES

# a refused value: @strict's errors (a field's own check, or a rule across fields), or ValueError (an unknown keyword)
CONFIG_ERRORS = (StrictDataclassError, ValueError)


def names_field(message, field):
    """@strict writes the field as 'field', our own messages as `field`."""
    return f"'{field}'" in message or f"`{field}`" in message


@pytest.mark.parametrize("family", list(CONFIG_CLASSES))
def test_defaults_are_valid_and_registered(family):
    config_class = CONFIG_CLASSES[family]
    config = config_class()
    assert config.model_type.startswith("hfst_")
    assert isinstance(AutoConfig.for_model(config.model_type), config_class)
    assert config.intermediate_size == 4 * config.hidden_size
    assert config.attention_type == "softmax" and config.feature_map == "elu" and config.norm_type == "scalenorm"


def test_quick_start_config():
    cfg = AutoConfig.for_model(
        "hfst_set_transformer",
        input_size=2,
        hidden_size=64,
        num_inducing_points=16,
        attention_type="linear",
        feature_map="elu",
    )
    assert isinstance(cfg, hfst.SetTransformerConfig)
    assert (cfg.input_size, cfg.hidden_size, cfg.num_inducing_points) == (2, 64, 16)
    assert cfg.position_embedding_type == "none"


def test_round_trip(tmp_path):
    config = hfst.PerceiverIOConfig(
        hidden_size=64,
        num_latents=7,
        num_blocks=3,
        num_self_attends_per_block=2,
        attention_type="linear",
        feature_map="exp",
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, hfst.PerceiverIOConfig)
    for key in (
        "hidden_size",
        "num_latents",
        "num_blocks",
        "num_self_attends_per_block",
        "attention_type",
        "feature_map",
        "num_hidden_layers",
    ):
        assert getattr(loaded, key) == getattr(config, key)
    assert loaded.num_hidden_layers == 6


BAD = [
    ({"attention_type": "performer"}, "attention_type", "softmax"),
    ({"feature_map": "relu"}, "feature_map", "elu"),
    ({"linear_attention_decay": "exponential"}, "linear_attention_decay", "gated"),
    ({"norm_type": "rmsnorm"}, "norm_type", "scalenorm"),
    ({"position_embedding_type": "rotary"}, "position_embedding_type", "sinusoidal"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size", "divisible"),
    ({"hidden_size": 0}, "hidden_size", "greater or equal to 1"),
    ({"num_hidden_layers": -1}, "num_hidden_layers", "greater or equal to 1"),
    ({"num_attention_heads": 0}, "num_attention_heads", "greater or equal to 1"),
    ({"intermediate_size": 0}, "intermediate_size", "greater or equal to 1"),
    ({"vocab_size": 0}, "vocab_size", "greater or equal to 1"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob", "greater or equal to 0.0 and smaller than 1.0"),
    ({"hidden_act": "nope"}, "hidden_act", "gelu"),
]


@pytest.mark.parametrize("family", list(CONFIG_CLASSES))
@pytest.mark.parametrize("kwargs,field,hint", BAD, ids=[b[1] + "-" + str(list(b[0].values())[0]) for b in BAD])
def test_bad_values_raise_naming_the_field(family, kwargs, field, hint):
    if family == "set_transformer" and field == "position_embedding_type":
        kwargs, hint = {"position_embedding_type": "sinusoidal"}, "('none',)"  # a set has no order
    if family == "perceiver_io" and field == "num_hidden_layers":
        hint = "num_blocks"  # derived there: the error says what to set instead
    with pytest.raises(CONFIG_ERRORS) as err:
        CONFIG_CLASSES[family](**kwargs)
    assert names_field(str(err.value), field) and hint in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "family,kwargs,field",
    [
        ("encoder", {"pooling": "max"}, "pooling"),
        ("set_transformer", {"pooling": "max"}, "pooling"),
        ("perceiver_io", {"pooling": "max"}, "pooling"),
        ("set_transformer", {"num_seeds": 0}, "num_seeds"),
        ("set_transformer", {"initializer_range": 0.0}, "initializer_range"),
        ("set_transformer", {"initializer_range": -0.05}, "initializer_range"),
        ("set_transformer", {"norm_eps": 0}, "norm_eps"),
        ("set_transformer", {"num_inducing_points": -2}, "num_inducing_points"),
        ("set_transformer", {"num_decoder_layers": -1}, "num_decoder_layers"),
        ("perceiver_io", {"num_latents": 0}, "num_latents"),
        ("perceiver_io", {"num_blocks": 0}, "num_blocks"),
        ("perceiver_io", {"num_cross_attention_heads": 3}, "num_cross_attention_heads"),
        ("perceiver_io", {"output_query_type": "random"}, "output_query_type"),
        ("perceiver_io", {"output_query_type": "positions", "position_embedding_type": "none"}, "output_query_type"),
    ],
)
def test_family_fields_are_checked(family, kwargs, field):
    with pytest.raises(CONFIG_ERRORS, match=field):
        CONFIG_CLASSES[family](**kwargs)


WINDOW_FIELDS = {"pooling", "context_length", "next_token_mode", "target_length"}


def test_a_new_decoder_config_has_no_window_fields(tmp_path):
    """The decoder has no pooled or window head: its config neither holds nor writes their fields."""
    config = hfst.TransformerDecoderConfig()
    assert not WINDOW_FIELDS & set(config.to_dict())
    assert not any(hasattr(config, name) for name in WINDOW_FIELDS)
    config.save_pretrained(tmp_path)
    assert not WINDOW_FIELDS & set(json.loads((tmp_path / "config.json").read_text()))


@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_families_with_pooled_heads_keep_the_window_fields(tmp_path, family):
    config = CONFIG_CLASSES[family](pooling="mean", context_length=10, next_token_mode="window", target_length=4)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {name: saved[name] for name in WINDOW_FIELDS} == {
        "pooling": "mean", "context_length": 10, "next_token_mode": "window", "target_length": 4
    }
    assert AutoConfig.from_pretrained(tmp_path).target_length == 4


@pytest.mark.parametrize(
    "family,key,owners",
    [
        ("decoder", "pooling", "PerceiverIOConfig, SetTransformerConfig, TransformerEncoderConfig"),
        ("decoder", "context_length", "PerceiverIOConfig, SetTransformerConfig, TransformerEncoderConfig"),
        ("decoder", "num_latents", "PerceiverIOConfig"),
        ("encoder", "lm_loss_chunk_size", "TransformerDecoderConfig"),
        ("encoder", "num_inducing_points", "SetTransformerConfig"),
    ],
)
def test_another_familys_field_is_refused_naming_its_families(family, key, owners):
    """None of the family's models would read it, and config.json would carry it as if they did."""
    with pytest.raises(ValueError, match=f"has no field `{key}`: it is a field of {owners}"):
        CONFIG_CLASSES[family](**{key: 3})


def test_a_misspelt_field_is_refused_and_a_key_of_no_family_kept():
    with pytest.raises(ValueError, match="did you mean `context_length`"):
        hfst.TransformerEncoderConfig(context_lenght=16)
    assert hfst.TransformerDecoderConfig(my_note="kept").my_note == "kept"  # as transformers keeps it


def test_transformers_generic_flags_are_not_another_familys_fields():
    """`use_cache`, `is_decoder`, `add_cross_attention` are the decoder's fields, but transformers sets them on any
    config (the Trainer, EncoderDecoderModel): an encoder config given them does not drop them as the decoder's."""
    config = hfst.TransformerEncoderConfig(is_decoder=False, add_cross_attention=False)
    assert config.is_decoder is False and config.add_cross_attention is False


# per family, configs that between them take every branch that reads a field (linear attention's fields, learned
# positions, the adaptive layers, both next-token modes, mean pooling, learned output queries, continuous inputs)
FIELD_VARIANTS = {
    "encoder": [{}, {"attention_type": "linear", "position_embedding_type": "learned", "next_token_mode": "window",
                     "pooling": "mean", "adaptive_input_cutoffs": [10], "adaptive_softmax_cutoffs": [10]}],
    "decoder": [{}, {"attention_type": "linear", "position_embedding_type": "learned", "lm_loss_chunk_size": 4,
                     "adaptive_input_cutoffs": [10], "adaptive_softmax_cutoffs": [10]}],
    "set_transformer": [{}, {"attention_type": "linear", "next_token_mode": "window", "pooling": "mean",
                             "adaptive_input_cutoffs": [10], "adaptive_softmax_cutoffs": [10]},
                        {"vocab_size": None, "input_size": 2, "num_inducing_points": 0}],
    "perceiver_io": [{}, {"attention_type": "linear", "position_embedding_type": "learned", "next_token_mode": "window",
                          "pooling": "mean", "adaptive_input_cutoffs": [10], "adaptive_softmax_cutoffs": [10]},
                     {"output_query_type": "learned", "num_output_queries": 2}],
}
TOKEN_HEADS = ("MaskedLM", "NextTokenPrediction", "CausalLM")


@pytest.mark.parametrize("family", list(CONFIG_CLASSES))
def test_config_json_holds_only_fields_the_familys_models_read(monkeypatch, family):
    """Every key of the family's config.json (less the keys transformers writes on every config) is read by one of
    its models (built, run forward with labels in training mode, and generating where it can)."""
    from tests.helpers import tiny_config

    config_class = CONFIG_CLASSES[family]
    read = set()
    original = config_class.__getattribute__

    def recording(self, name):
        read.add(name)
        return original(self, name)

    written = set()
    for overrides in FIELD_VARIANTS[family]:
        config = tiny_config(family, **overrides)
        written |= set(config.to_dict())
        monkeypatch.setattr(config_class, "__getattribute__", recording)
        for cls in hfst.FAMILIES[family].model_classes().values():
            torch.manual_seed(0)
            try:
                model = cls(config)
            except ValueError:  # a head this variant is not for (no vocabulary, no per-input output queries, ...)
                continue
            tokens = any(head in cls.__name__ for head in TOKEN_HEADS)
            if config.vocab_size:
                inputs = {"input_ids": torch.randint(0, config.vocab_size, (2, 8))}
            else:
                inputs = {"input_features": torch.randn(2, 8, config.input_size)}
            labels = inputs.get("input_ids") if tokens else None
            model.train()(**inputs, labels=labels)
            if tokens and hasattr(model, "generate"):
                model.eval().generate(**inputs, max_new_tokens=2, do_sample=False)
        monkeypatch.undo()
    # written on every config, or read by transformers' own classes (GenerationConfig, EncoderDecoderModel)
    generic = set(PreTrainedConfig().to_dict()) | {"pad_token_id", "bos_token_id", "eos_token_id", "is_decoder"}
    assert written - generic - read == set()


# ------------------------------------------------------------------------------------------------------ refused values

CONFIGS = {
    "encoder": hfst.TransformerEncoderConfig,
    "decoder": hfst.TransformerDecoderConfig,
    "set_transformer": hfst.SetTransformerConfig,
    "perceiver_io": hfst.PerceiverIOConfig,
}


CONFIG_CASES = [
    # (family, kwargs, words the error must contain)
    ("set_transformer", {"num_inducing_point": 4}, ["num_inducing_point", "did you mean `num_inducing_points`"]),
    ("perceiver_io", {"num_latent": 8}, ["num_latent", "did you mean `num_latents`"]),
    ("decoder", {"add_cross_attention": "no"}, ["add_cross_attention", "expected bool"]),
    ("encoder", {"scale_embedding": "no"}, ["scale_embedding", "expected bool"]),
    ("encoder", {"scale_embedding": 0.5}, ["scale_embedding", "expected bool"]),
    ("encoder", {"tie_word_embeddings": "no"}, ["tie_word_embeddings", "expected bool"]),
    ("decoder", {"use_cache": "no"}, ["use_cache", "expected bool"]),
    ("encoder", {"use_cache": "no"}, ["use_cache", "True or False"]),  # no field of the encoder: checked as given
    ("encoder", {"output_attentions": 1}, ["output_attentions", "True or False"]),  # a property, no field
    ("encoder", {"num_labels": -1}, ["num_labels", "positive integer"]),
    ("encoder", {"num_labels": 0}, ["num_labels", "positive integer"]),
    ("encoder", {"problem_type": "foo"}, ["problem_type", "single_label_classification"]),
    ("encoder", {"norm_eps": float("inf")}, ["norm_eps", "greater than 0.0 and smaller or equal to 1.0"]),
    ("encoder", {"norm_eps": float("nan")}, ["norm_eps", "greater than 0.0 and smaller or equal to 1.0"]),
    ("decoder", {"initializer_range": float("inf")}, ["initializer_range", "greater than 0.0 and smaller or equal"]),
    ("set_transformer", {"initializer_range": 1e30}, ["initializer_range", "greater than 0.0 and smaller or equal"]),
]


@pytest.mark.parametrize("family,kwargs,words", CONFIG_CASES, ids=[f"{c[0]}-{list(c[1])[0]}" for c in CONFIG_CASES])
def test_bad_config_values_are_refused_naming_the_field(family, kwargs, words):
    with pytest.raises(CONFIG_ERRORS) as err:
        CONFIGS[family](vocab_size=100, **kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


NEW_CONFIG_CASES = [  # once accepted, then silently wrong
    ("encoder", {"target_length": 1}, ["target_length", ">= 2", "target_length=1", "next_token_mode='window'"]),
    ("set_transformer", {"context_length": 1}, ["context_length", ">= 2", "context_length=1"]),
    ("perceiver_io", {"context_length": 8, "target_length": 1}, ["target_length", ">= 2"]),
    ("encoder", {"vocab_size": 50, "pad_token_id": 999}, ["pad_token_id", "[0, 49]", "999"]),
    ("decoder", {"vocab_size": 50, "bos_token_id": -5}, ["bos_token_id", "non-negative", "-5"]),  # refused alone
    ("decoder", {"vocab_size": 50, "eos_token_id": 10**9}, ["eos_token_id", "[0, 49]"]),
    ("decoder", {"vocab_size": 50, "eos_token_id": [2, 50]}, ["eos_token_id", "[0, 49]", "[2, 50]"]),
    ("encoder", {"vocab_size": 50, "pad_token_id": True}, ["pad_token_id", "True"]),
]


@pytest.mark.parametrize("family,kwargs,words", NEW_CONFIG_CASES, ids=[str(c[1]) for c in NEW_CONFIG_CASES])
def test_configs_that_would_be_silently_wrong_are_refused(family, kwargs, words):
    with pytest.raises(CONFIG_ERRORS) as err:
        CONFIGS[family](**kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_valid_special_tokens_pass():
    config = hfst.TransformerDecoderConfig(vocab_size=50, pad_token_id=0, bos_token_id=49, eos_token_id=[1, 2])
    assert config.eos_token_id == [1, 2]


@pytest.mark.parametrize("loaded", ["decoder", "encoder"])
def test_a_checkpoint_of_another_family_is_refused_by_our_classes_naming_both(tmp_path, loaded):
    from tests.helpers import tiny_config

    saved = "encoder" if loaded == "decoder" else "decoder"
    source = {"encoder": hfst.TransformerEncoderForMaskedLM, "decoder": hfst.TransformerDecoderForCausalLM}
    source[saved](tiny_config(saved)).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        source[loaded].from_pretrained(tmp_path)
    assert f"hfst_{saved}" in str(err.value) and f"hfst_{loaded}" in str(err.value) and "Auto classes" in str(err.value)
    assert type(source[saved].from_pretrained(tmp_path)) is source[saved]  # its own family still loads


def test_unrelated_extra_config_keys_are_kept_as_transformers_does():
    """Keys far from every field (a saved config's `architectures`, a user's note) stay extra attributes."""
    config = hfst.TransformerEncoderConfig(vocab_size=100, my_note="kept", architectures=["X"])
    assert config.my_note == "kept" and config.architectures == ["X"]
    assert hfst.TransformerEncoderConfig(vocab_size=100, num_labels=3).num_labels == 3


def test_feature_map_with_softmax_attention_warns(caplog):
    from transformers.utils import logging

    logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            hfst.TransformerDecoderConfig(vocab_size=100, attention_type="softmax", feature_map="exp")
    finally:
        logging.disable_propagation()
    assert "has no effect with `attention_type='softmax'`" in caplog.text


# ---------------------------------------------------------------------------------------------------------------
# Every field, however a value arrives: the constructor, `from_pretrained`'s keyword arguments (set after
# the file is read), a hand-edited config.json, `update`, `update_from_string` and plain assignment.

POSITIVE = [0, 2.0, -1, True, "4", [4]]
NON_NEGATIVE = [-1, 1.5, True, "0"]
PROBABILITY = [1.0, "0.1", -0.1, True, None]
FINITE = [0, "1e-5", -1e-5, float("inf"), float("nan"), True, None]
CHOICE = ["nope", ["x"], 1, None]
FLAG = ["no", 1, 0.0]
CUTOFFS = [[5, 3], "10", [0, 4], [True], [2.0]]
DIV_VALUE = [0.5, "4", float("inf"), True, None]
TOKEN_ID = [-1, 1.5, True, "3"]

BASE_BAD = {
    **dict.fromkeys(("vocab_size", "input_size"), POSITIVE),
    **dict.fromkeys(("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "linear_attention_chunk_size"), POSITIVE),
    **dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob"), PROBABILITY),
    **dict.fromkeys(("attention_type", "feature_map", "linear_attention_decay", "norm_type", "position_embedding_type",
                     "hidden_act"), CHOICE),
    **dict.fromkeys(("norm_eps", "initializer_range"), FINITE),
    **dict.fromkeys(("adaptive_softmax_cutoffs", "adaptive_input_cutoffs"), CUTOFFS),
    **dict.fromkeys(("adaptive_softmax_div_value", "adaptive_input_div_value"), DIV_VALUE),
    **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id"), TOKEN_ID),
    **dict.fromkeys(("scale_embedding", "tie_word_embeddings", "tie_adaptive_weights", "tie_adaptive_projections",
                     "return_dict", "output_hidden_states", "output_attentions", "is_encoder_decoder"), FLAG),
    "problem_type": ["regress", 1],
    "num_labels": [0, -1, 1.5, True, "2"],
    "id2label": [{}, ["a", "b"]],
}
FAMILY_BAD = {
    "encoder": {},
    "decoder": {"lm_loss_chunk_size": NON_NEGATIVE, **dict.fromkeys(("use_cache", "is_decoder", "add_cross_attention"), FLAG)},
    "set_transformer": {"num_inducing_points": NON_NEGATIVE, "num_seeds": POSITIVE, "num_decoder_layers": NON_NEGATIVE,
                        "position_embedding_type": CHOICE + ["sinusoidal"]},
    "perceiver_io": {**dict.fromkeys(("num_latents", "num_blocks", "num_self_attends_per_block",
                                      "num_cross_attention_heads", "num_output_queries"), POSITIVE),
                     "output_query_type": CHOICE},
}
POOLED_BAD = {"pooling": CHOICE, "next_token_mode": CHOICE, "context_length": POSITIVE, "target_length": POSITIVE}
SMALL = {"vocab_size": 50, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}
PATHS = ["constructor", "from_pretrained", "config_json", "update", "update_from_string", "setattr"]
IN_MEMORY = ["constructor", "update", "update_from_string", "setattr"]


def small_config(family, **changes):
    extra = {"num_blocks": 1, "num_self_attends_per_block": 2} if family == "perceiver_io" else {"num_hidden_layers": 2}
    return CONFIG_CLASSES[family](**{**SMALL, **extra, **changes})


def bad_cases():
    for family, config_class in CONFIG_CLASSES.items():
        table = {**BASE_BAD, **(POOLED_BAD if config_class.windowed_heads else {}), **FAMILY_BAD[family]}
        for field, values in table.items():
            for path in PATHS:
                # through the files: a range error and a type error (each file path saves and loads: slower)
                chosen = values[:2] if path in ("from_pretrained", "config_json") else values
                yield pytest.param(family, field, chosen, path, id=f"{family}-{field}-{path}")


def apply_through(path, family, changes, tmp_path, config=None):
    """The config `family` gets with `changes`, made through `path` (to `config`, for the paths that change one)."""
    if path == "constructor":
        return small_config(family, **changes)
    config = small_config(family) if config is None else config
    if path == "setattr":
        for key, value in changes.items():
            setattr(config, key, value)
        return config
    if path == "update":
        config.update(changes)
        return config
    if path == "update_from_string":
        config.update_from_string(",".join(f"{key}={value}" for key, value in changes.items()))
        return config
    config.save_pretrained(tmp_path)
    if path == "from_pretrained":
        return AutoConfig.from_pretrained(tmp_path, **changes)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, **changes}))  # a hand-edited file
    return AutoConfig.from_pretrained(tmp_path)


def test_every_field_of_every_config_has_a_check():
    """A new field is checked by its type (and validator) on every path; this test gives it bad values."""
    generic = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    for family, config_class in CONFIG_CLASSES.items():
        ours = {f.name for f in dataclasses.fields(config_class)} - generic
        table = {**BASE_BAD, **(POOLED_BAD if config_class.windowed_heads else {}), **FAMILY_BAD[family]}
        assert ours <= set(table), (family, ours - set(table))


@pytest.mark.parametrize("family,field,values,path", list(bad_cases()))
def test_a_bad_value_is_refused_however_it_arrives(tmp_path, family, field, values, path):
    """`from_pretrained(ckpt, target_length=0)`, `config.update_from_string("hidden_size=0")`, `config.x = 2.0`: each
    path refuses the value, naming the field (@strict checks a field whenever it is set), and leaves an existing
    config as it was."""
    for value in values:
        config = small_config(family) if path in IN_MEMORY[1:] else None
        if path == "update_from_string":
            # transformers parses the string as the current value's type (int, float, bool or str; others are
            # refused with its TypeError), so only a string field can receive a string, a flag only what parses as
            # a bool
            current = getattr(config, field)
            if type(current) not in (int, float, str) or isinstance(value, str) != isinstance(current, str):
                continue
            if not isinstance(value, (int, float, str)) or "," in str(value):
                continue
            try:
                type(current)(str(value))
            except ValueError:
                continue  # refused by transformers' own parse (test_update_from_string_refuses_a_value_that_does_not_parse)
        before = None if config is None else config.to_dict()
        with pytest.raises(CONFIG_ERRORS) as err:
            if config is None:
                apply_through(path, family, {field: value}, tmp_path)
            elif path == "setattr":
                setattr(config, field, value)
            elif path == "update":
                config.update({field: value})
            else:
                config.update_from_string(f"{field}={value}")
        names = [field, "num_blocks"] if field == "num_hidden_layers" and family == "perceiver_io" else [field]
        assert any(names_field(str(err.value), name) for name in names), (value, str(err.value))
        if config is not None:
            assert config.to_dict() == before  # a refused change is not made


CROSS = [  # (family, changes, words): values valid alone, invalid together with the rest of the config
    ("encoder", {"target_length": 1}, "`target_length` >= 2"),  # every loss 0.0
    ("encoder", {"context_length": 3, "target_length": 4}, "cannot exceed `context_length`"),
    ("decoder", {"num_attention_heads": 3}, "divisible by `num_attention_heads`"),
    ("set_transformer", {"num_attention_heads": 3}, "divisible by `num_attention_heads`"),
    ("perceiver_io", {"num_cross_attention_heads": 3}, "divisible by `num_cross_attention_heads`"),
    ("decoder", {"pad_token_id": 50}, "`pad_token_id` must be a token id in [0, 49]"),
    ("encoder", {"vocab_size": 4, "bos_token_id": 7}, "`bos_token_id` must be a token id in [0, 3]"),
    ("decoder", {"adaptive_softmax_cutoffs": [10, 60], "tie_word_embeddings": False}, "must end below `vocab_size`"),
    ("decoder", {"adaptive_input_cutoffs": [10, 20], "tie_word_embeddings": True}, "`tie_word_embeddings=True` cannot"),
]


def escaped(words):
    return words.replace("[", r"\[").replace("]", r"\]")


@pytest.mark.parametrize("path", ["constructor", "from_pretrained", "config_json"])
@pytest.mark.parametrize("family,changes,words", CROSS)
def test_values_valid_alone_but_not_together_are_refused_when_a_config_is_built(tmp_path, path, family, changes, words):
    with pytest.raises(StrictDataclassError, match=escaped(words)):
        apply_through(path, family, changes, tmp_path)


@pytest.mark.parametrize("path", ["setattr", "update", "update_from_string"])
@pytest.mark.parametrize("family,changes,words", CROSS)
def test_changes_that_only_together_are_invalid_are_refused_at_validate_save_build_and_forward(tmp_path, path, family,
                                                                                               changes, words):
    """As transformers' strict configs: a change is checked field by field (the next may make the pair valid); the
    rules across fields run at `validate()`, `save_pretrained`, when a model is built from the config and at its
    forward."""
    from transformers import AutoModel

    config = small_config(family)
    if path == "update_from_string" and any(type(getattr(config, key)) not in (int, str) for key in changes):
        return  # transformers' string form parses as the current value's type: a list or a None is refused there
    model = AutoModel.from_config(config).eval()
    apply_through(path, family, changes, tmp_path, config=model.config)  # the model's config is `config`
    for refused in (model.config.validate, lambda: model.config.save_pretrained(tmp_path),
                    lambda: AutoModel.from_config(model.config), lambda: model(input_ids=torch.ones(1, 4, dtype=torch.long))):
        with pytest.raises(StrictDataclassError, match=escaped(words)):
            refused()
    assert not (tmp_path / "config.json").exists()


def test_the_reported_from_pretrained_keywords_are_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    config = small_config("encoder", context_length=8)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    for kwargs, words in [
        ({"target_length": 1}, "`target_length` >= 2"),
        ({"context_length": 0}, "'context_length':\n    ValueError: Value must be greater or equal to 1, got 0"),
        ({"num_attention_heads": 3}, "divisible by `num_attention_heads`"),
    ]:
        with pytest.raises(StrictDataclassError, match=words):
            AutoModelForCausalLM.from_pretrained(tmp_path, **kwargs)
    legal = AutoModelForCausalLM.from_pretrained(tmp_path, target_length=3)
    assert legal.config.target_length == 3


def test_legal_changes_pass_on_every_path(tmp_path):
    config = small_config("encoder", context_length=8)
    config.update({"hidden_size": 30, "num_attention_heads": 3})  # valid together, not one at a time
    assert (config.hidden_size, config.num_attention_heads) == (30, 3)
    config.update_from_string("target_length=3,pooling=mean,hidden_dropout_prob=0.25")
    assert (config.target_length, config.pooling, config.hidden_dropout_prob) == (3, "mean", 0.25)
    config.initializer_range = 0.05
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path, context_length=16, target_length=8)
    assert (loaded.context_length, loaded.target_length, loaded.initializer_range) == (16, 8, 0.05)


def test_perceiver_layers_follow_their_factors_on_assignment(tmp_path):
    config = small_config("perceiver_io")
    config.num_blocks = 3
    assert config.num_hidden_layers == 6
    config.update_from_string("num_self_attends_per_block=1")
    assert config.num_hidden_layers == 3
    with pytest.raises(StrictDataclassError, match="num_blocks \\* num_self_attends_per_block = 3"):
        config.num_hidden_layers = 4
    config.num_hidden_layers = 3  # what a config.json written when it was saved repeats
    config.save_pretrained(tmp_path)
    assert "num_hidden_layers" not in json.loads((tmp_path / "config.json").read_text())  # derived, not saved


def test_update_from_string_refuses_a_value_that_does_not_parse():
    """transformers' own parse of the string (its message names the value, not the field)."""
    config = small_config("decoder")
    with pytest.raises(ValueError, match="'2.5'"):
        config.update_from_string("hidden_size=2.5")
    assert config.hidden_size == 16


def test_attention_type_is_checked_without_the_attention_ops_and_accepts_registered_kernels():
    """The config reads the kernel registry only where `attention.py` is loaded (it does not import the ops); a
    kernel registered there is valid, and no longer once it is removed."""
    import dataclasses

    from hf_settransformer.attention import ATTENTION_KERNELS, register_attention_kernel

    assert "from .attention import" not in open(hfst.configuration_base.__file__).read()
    register_attention_kernel("my_softmax", dataclasses.replace(ATTENTION_KERNELS["softmax"]))
    try:
        config = small_config("decoder", attention_type="my_softmax")
        config.attention_type = "softmax"
        config.attention_type = "my_softmax"
    finally:
        del ATTENTION_KERNELS["my_softmax"]
    with pytest.raises(StrictDataclassError, match="`attention_type` must be one of \\['linear', 'softmax'\\]"):
        config.validate()  # the registry changed since the value was set
    with pytest.raises(StrictDataclassError, match="`attention_type` must be one of \\['linear', 'softmax'\\]"):
        config.attention_type = "my_softmax"

import json
import logging

import pytest
import torch
from transformers import AutoConfig, PreTrainedConfig

import hf_settransformer as hfst
from conftest import CONFIG_CLASSES


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
    ({"norm_type": "rmsnorm"}, "norm_type", "scalenorm"),
    ({"position_embedding_type": "rotary"}, "position_embedding_type", "sinusoidal"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size", "divisible"),
    ({"hidden_size": 0}, "hidden_size", "positive"),
    ({"num_hidden_layers": -1}, "num_hidden_layers", "positive"),
    ({"num_attention_heads": 0}, "num_attention_heads", "positive"),
    ({"intermediate_size": 0}, "intermediate_size", "positive"),
    ({"vocab_size": 0}, "vocab_size", "positive"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob", "probability"),
    ({"hidden_act": "nope"}, "hidden_act", "gelu"),
]


@pytest.mark.parametrize("family", list(CONFIG_CLASSES))
@pytest.mark.parametrize("kwargs,field,hint", BAD, ids=[b[1] + "-" + str(list(b[0].values())[0]) for b in BAD])
def test_bad_values_raise_naming_the_field(family, kwargs, field, hint):
    if family == "set_transformer" and field == "position_embedding_type":
        kwargs = {"position_embedding_type": "sinusoidal"}  # any order-aware positions are refused for sets
    if family == "perceiver_io" and field == "num_hidden_layers":
        hint = "num_blocks"  # derived there: the error says what to set instead
    with pytest.raises(ValueError) as err:
        CONFIG_CLASSES[family](**kwargs)
    assert field in str(err.value)
    if not (family == "set_transformer" and field == "position_embedding_type"):
        assert hint in str(err.value)


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
    with pytest.raises(ValueError, match=field):
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


def test_another_familys_field_is_dropped_with_a_warning_and_a_misspelt_one_refused(caplog):
    with caplog.at_level(logging.INFO, logger="hf_settransformer"):
        decoder = hfst.TransformerDecoderConfig(pooling="mean", num_latents=3, my_note="kept")
        encoder = hfst.TransformerEncoderConfig(lm_loss_chunk_size=8, num_inducing_points=2)
    assert not any(hasattr(decoder, name) for name in ("pooling", "num_latents"))
    assert not any(hasattr(encoder, name) for name in ("lm_loss_chunk_size", "num_inducing_points"))
    assert decoder.my_note == "kept"  # a key of no family is kept, as transformers keeps it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "`num_latents` (PerceiverIOConfig)" in warnings[0] and "`pooling` (PerceiverIOConfig" in warnings[0]
    assert "`lm_loss_chunk_size` (TransformerDecoderConfig)" in warnings[1]
    assert "`num_inducing_points` (SetTransformerConfig)" in warnings[1]
    with pytest.raises(ValueError, match="did you mean `context_length`"):
        hfst.TransformerEncoderConfig(context_lenght=16)


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
    from conftest import tiny_config

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
    if family == "perceiver_io":
        generic.add("num_hidden_layers")  # derived (num_blocks * num_self_attends_per_block) for tools counting layers
    assert written - generic - read == set()

import pytest
from transformers import AutoConfig

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
    ({"pooling": "max"}, "pooling", "pma"),
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

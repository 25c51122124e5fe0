"""The family table (`families.py`): every class it names exists and is registered, every public model class is in
it, and a saved config or checkpoint carries the family's whole `auto_map`."""

import json

import pytest
import transformers
from tests.helpers import make_model, tiny_config
from transformers import PreTrainedModel

import hf_settransformer as hfst
from hf_settransformer.families import family_for_model_type


@pytest.mark.parametrize("name", list(hfst.FAMILIES))
def test_rows_name_real_registered_classes(name):
    family = hfst.FAMILIES[name]
    config_class = family.config_class()
    assert config_class.model_type == family.model_type
    assert family.config.startswith(f"configuration_{name}.") and "AutoModel" in family.models
    for auto_name, cls in family.model_classes().items():
        assert cls.config_class is config_class, cls.__name__
        auto_class = getattr(transformers, auto_name, None)
        if auto_class is None:  # a head without an Auto class is listed under its own name
            assert auto_name == cls.__name__
        else:
            assert type(auto_class.from_config(tiny_config(name))) is cls


def test_every_public_model_class_is_in_the_table():
    listed = {cls for family in hfst.FAMILIES.values() for cls in family.model_classes().values()}
    public = {
        obj
        for obj in (getattr(hfst, name) for name in hfst.__all__)
        if isinstance(obj, type) and issubclass(obj, PreTrainedModel)
    }
    assert public == listed
    assert hfst.SetTransformerForMixtureOfGaussians in listed


def test_unknown_model_type_is_named():
    with pytest.raises(ValueError, match="No hf_settransformer family has model_type 'bert'"):
        family_for_model_type("bert")


@pytest.mark.parametrize("name", list(hfst.FAMILIES))
def test_saved_checkpoints_and_configs_carry_the_whole_auto_map(tmp_path, name):
    family = hfst.FAMILIES[name]
    config = tiny_config(name)
    model = make_model(family.model_classes()["AutoModel"], config)
    model.save_pretrained(tmp_path / "model")
    config.save_pretrained(tmp_path / "config")
    for folder in ("model", "config"):
        saved = json.loads((tmp_path / folder / "config.json").read_text())
        assert saved["auto_map"] == family.auto_map, folder
        assert (tmp_path / folder / f"modeling_{name}.py").exists(), folder
        assert (tmp_path / folder / "families.py").exists(), folder  # the table travels with the code that reads it


def test_mixture_of_gaussians_checkpoint_names_its_head(tmp_path):
    """The head without an Auto class: its save writes its code and names it in `auto_map` (it was missing)."""
    config = tiny_config("set_transformer", vocab_size=None, input_size=2, num_seeds=3)
    make_model(hfst.SetTransformerForMixtureOfGaussians, config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    name = "SetTransformerForMixtureOfGaussians"
    assert saved["auto_map"][name] == f"modeling_set_transformer.{name}"
    assert saved["architectures"] == [name]
    assert (tmp_path / "modeling_set_transformer.py").exists()

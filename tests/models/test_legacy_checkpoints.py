"""Checkpoints and configs saved by an earlier version still load, through their class and their Auto class, with
every weight and field in place, and give the outputs they gave then.

The fixtures under `tests/fixtures/legacy_checkpoints/` were written by commit a0f1d95 with
`tests/fixtures/make_legacy_checkpoints.py` (its docstring says how; each `fixture.json` names the commit). Add a
fixture there, never rewrite one with the current code: a refactor that renames a weight, a config key or a class, or
changes what a checkpoint computes, fails here. A deliberate change of outputs needs a new fixture and a CHANGELOG line,
or, where it changes some rows of an existing fixture's outputs (a fix for padded rows), a `revised.json` beside them
(the commit, the CHANGELOG line, the rows) and `revised.safetensors`: the outputs are then compared with the revision,
and the revision with the original at every row it does not name.
One edit was made by hand, once: that version wrote the window heads' fields (`pooling`, `context_length`,
`next_token_mode`, `target_length`) on every family, and they were removed from the two decoder checkpoints'
config.json (a decoder config refuses another family's fields); nothing else in them changed.

`tests/fixtures/saved_configs/<family>/config.json` were written by commit 3e0f57f (the last version whose configs
were not dataclasses), one config per family with most fields away from their defaults, by `save_pretrained` (the
copied `.py` files removed).
"""

import importlib
import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import hf_settransformer as hfst

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_checkpoints"
NAMES = sorted(path.name for path in ROOT.iterdir() if path.is_dir())


def fixture(name):
    meta = json.loads((ROOT / name / "fixture.json").read_text())
    inputs = {
        key: torch.tensor(value["data"], dtype=getattr(torch, value["dtype"])) for key, value in meta["inputs"].items()
    }
    expected = load_file(ROOT / name / "expected.safetensors")
    if (ROOT / name / "revised.json").exists():  # a deliberate change of some rows' outputs
        revision = json.loads((ROOT / name / "revised.json").read_text())
        revised = load_file(ROOT / name / "revised.safetensors")
        assert revised.keys() == expected.keys() and revision["changelog"] and revision["commit"], revision
        kept = [i for i in range(inputs["input_ids"].shape[0]) if i not in revision["rows"]]
        for key, value in expected.items():
            if value.dim() > 0:  # per-row outputs: the rows the revision does not name are the original's
                torch.testing.assert_close(revised[key][kept], value[kept], rtol=0, atol=0)
        expected = revised
    return meta, inputs, expected


def test_the_fixtures_are_there_and_small():
    assert len(NAMES) >= 7, NAMES
    size = sum(path.stat().st_size for path in ROOT.rglob("*") if path.is_file())
    assert size < 1_000_000, size
    assert not list(ROOT.rglob("*.py")), "the old version's remote code is not kept: the test loads the installed one"


@pytest.mark.parametrize("loader", ["class", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_legacy_checkpoint_loads_and_gives_the_same_outputs(name, loader):
    meta, inputs, expected = fixture(name)
    cls = getattr(hfst, meta["model_class"])
    load = cls if loader == "class" else getattr(transformers, meta["auto_class"])
    model, info = load.from_pretrained(ROOT / name, output_loading_info=True)
    assert type(model) is cls
    for problem in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info[problem], (problem, info[problem])
    model.eval()
    with torch.no_grad():
        outputs = model(**inputs, return_dict=True)
    for key, value in expected.items():
        # the fixtures' outputs were computed on another CPU: its kernels sum in another order (up to 1.2e-5 apart on
        # an AVX2-only machine); a checkpoint loaded wrongly is off by far more
        torch.testing.assert_close(outputs[key], value, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name} {key}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_legacy_auto_map_names_current_classes(name):
    """The `module.Class` paths of a checkpoint's `auto_map` still name classes of the package's files: a Hub repo
    whose code files are updated keeps its config.json, and loads with `trust_remote_code=True` through these paths."""
    config = json.loads((ROOT / name / "config.json").read_text())
    for path in config["auto_map"].values():
        module_name, class_name = path.split(".")
        assert hasattr(importlib.import_module(f"hf_settransformer.{module_name}"), class_name), path


ADDED_SINCE_DEFAULTS = {  # fields newer than the legacy checkpoints
    "linear_attention_decay": "none", "tie_adaptive_weights": False, "tie_adaptive_projections": True,
}
DERIVED = {"num_hidden_layers"}  # Perceiver IO's, derived from its factors since: read, checked, no longer written


@pytest.mark.parametrize("name", NAMES)
def test_legacy_config_resaves_the_fields_it_had(tmp_path, caplog, name):
    """A re-saved legacy config gains only the fields added since (at their defaults, the old behaviour), and loses
    only a derived one; loading it says nothing."""
    saved = json.loads((ROOT / name / "config.json").read_text())
    with caplog.at_level(logging.INFO, logger="hf_settransformer"):
        config = transformers.AutoConfig.from_pretrained(ROOT / name)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("hf_settransformer")]
    config.save_pretrained(tmp_path)
    resaved = json.loads((tmp_path / "config.json").read_text())
    assert set(resaved) - {"auto_map"} - set(ADDED_SINCE_DEFAULTS) <= set(saved), "a re-saved legacy config gains no field"
    assert set(saved) - set(resaved) <= DERIVED
    assert {key: resaved[key] for key in ADDED_SINCE_DEFAULTS.keys() & resaved} == ADDED_SINCE_DEFAULTS
    for key in set(saved) & set(resaved) - {"transformers_version", "auto_map", "dtype"}:
        assert resaved[key] == saved[key], key


SAVED_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "saved_configs"
FAMILY_NAMES = sorted(path.name for path in SAVED_CONFIGS.iterdir())
WRITTEN_BY_TRANSFORMERS = {"model_type", "transformers_version", "auto_map"}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_config_saved_before_configs_were_dataclasses_loads_with_every_field(tmp_path, family):
    saved = json.loads((SAVED_CONFIGS / family / "config.json").read_text())
    config = transformers.AutoConfig.from_pretrained(SAVED_CONFIGS / family)
    assert type(config) is hfst.FAMILIES[family].config_class()
    assert config.model_type == saved["model_type"]
    label_keys = {"id2label", "label2id"}  # JSON keys are strings; the config holds int class ids
    for key in set(saved) - WRITTEN_BY_TRANSFORMERS - label_keys:
        assert getattr(config, key) == saved[key], key
    if "id2label" in saved:
        assert config.id2label == {int(i): name for i, name in saved["id2label"].items()}
    config.save_pretrained(tmp_path)
    resaved = json.loads((tmp_path / "config.json").read_text())
    assert {key: resaved.get(key) for key in set(saved) - WRITTEN_BY_TRANSFORMERS - DERIVED} == {
        key: saved[key] for key in set(saved) - WRITTEN_BY_TRANSFORMERS - DERIVED
    }

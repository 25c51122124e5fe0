"""Checkpoints saved by an earlier version still load, through their class and their Auto class, with every weight in
place, and give the outputs they gave then.

The fixtures under `tests/fixtures/legacy_checkpoints/` were written by commit a0f1d95 with
`tests/fixtures/make_legacy_checkpoints.py` (its docstring says how; each `fixture.json` names the commit). Add a
fixture there, never rewrite one with the current code: a refactor that renames a weight, a config key or a class, or
changes what a checkpoint computes, fails here. A deliberate change of outputs needs a new fixture and a CHANGELOG line.
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
    return meta, inputs, load_file(ROOT / name / "expected.safetensors")


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


WINDOW_FIELDS = {"pooling", "context_length", "next_token_mode", "target_length"}
ADDED_SINCE_DEFAULTS = {"linear_attention_decay": "none"}  # fields newer than the legacy checkpoints
ADDED_SINCE = set(ADDED_SINCE_DEFAULTS)


@pytest.mark.parametrize("name", NAMES)
def test_legacy_config_keeps_its_familys_fields_and_drops_the_rest_quietly(tmp_path, caplog, name):
    """The older version wrote the window heads' fields on every family. Loaded, a decoder's config drops them with
    an info line (no warning: the reader did not choose them) and saves without them; the other families keep them."""
    saved = json.loads((ROOT / name / "config.json").read_text())
    assert WINDOW_FIELDS <= set(saved)
    with caplog.at_level(logging.INFO, logger="hf_settransformer"):
        config = transformers.AutoConfig.from_pretrained(ROOT / name)
    ours = [r for r in caplog.records if r.name.startswith("hf_settransformer")]
    assert not [r.getMessage() for r in ours if r.levelno >= logging.WARNING]
    config.save_pretrained(tmp_path)
    resaved = json.loads((tmp_path / "config.json").read_text())
    if config.windowed_heads:
        assert {key: getattr(config, key) for key in WINDOW_FIELDS} == {key: saved[key] for key in WINDOW_FIELDS}
        assert WINDOW_FIELDS <= set(resaved)
    else:
        assert not any(hasattr(config, key) for key in WINDOW_FIELDS)
        assert not WINDOW_FIELDS & set(resaved)
        assert "drops" in " ".join(r.getMessage() for r in ours if r.levelno == logging.INFO)
    # no field of another family; the fields added since (their defaults, the old behaviour) are written as they are
    assert set(resaved) - {"auto_map"} - ADDED_SINCE <= set(saved), "a re-saved legacy config gains no field"
    assert {key: resaved[key] for key in ADDED_SINCE & set(resaved)} == ADDED_SINCE_DEFAULTS

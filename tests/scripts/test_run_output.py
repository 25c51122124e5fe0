"""What a run prints concerns its user: no warning of a library about a setting the run does not use (DeepSpeed's
accelerator detection, pinned memory without an accelerator) and no report of missing keys that are tied weights."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from tests.helpers import ROOT, common_args, write_corpus

NOISE = ["Setting accelerator to CPU", "pin_memory", "missing keys"]


def run_output(script, *args):
    """The script's stdout and stderr, run as a user runs it: without the DS_ACCELERATOR the tests' conftest sets."""
    env = {name: value for name, value in os.environ.items() if name != "DS_ACCELERATOR"}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)], capture_output=True,
                            text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
def test_a_language_model_run_prints_no_library_noise(tmp_path):
    """A tied decoder in fp32 on the CPU (DataLoaders with transformers' default pinned memory, no use_cpu), with
    DeepSpeed installed (the `dev` extra), saving checkpoints and reloading the best one at the end."""
    assert importlib.util.find_spec("deepspeed") is not None  # what makes DeepSpeed warn at the first save
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    output = run_output("train_lm.py", *common_args(corpus, out, steps=20, extra=[
        "--precision", "fp32", "--eval_strategy", "steps", "--eval_steps", 10, "--save_strategy", "steps",
        "--save_steps", 10]))
    assert not [noise for noise in NOISE if noise in output], output[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["precision"] == "fp32" and results["selected_step"] in (10, 20)  # the best checkpoint, reloaded
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] and "lm_head.weight" not in load_file(out / "model.safetensors")


@pytest.mark.slow
def test_a_set_task_run_prints_no_library_noise(tmp_path):
    output = run_output("train_sets.py", "--task", "max_regression", "--output_dir", tmp_path / "run", "--max_steps",
                        5, "--eval_sets", 20, "--report_to", "none", "--disable_tqdm", "true")
    assert not [noise for noise in NOISE if noise in output], output[-3000:]
    assert "mae" in json.loads((tmp_path / "run" / "all_results.json").read_text())

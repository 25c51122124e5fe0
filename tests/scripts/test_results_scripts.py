"""scripts/lm_results.py and scripts/set_results.py on the runs a user has: a smoke run that scored only its
validation split, a run with one periodic evaluation, a masked LM, a figure edited into text."""

import json
import subprocess
import sys

import matplotlib
import pytest
from tests.helpers import ROOT, import_from

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GRID = ROOT / "results" / "wikitext2-90min-v2"


def grid_run(name, **changes):
    """A kept grid run's all_results.json with `changes` (a value None: the key removed)."""
    result = json.loads((GRID / name / "all_results.json").read_text())
    result.update(changes)
    return {key: value for key, value in result.items() if value is not None}


def write_runs(folder, runs):
    for name, result in runs.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "all_results.json").write_text(json.dumps(result))


def run_results(script, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def smoke_run():
    """What the README's smoke run records: no --do_predict (no test split), one periodic evaluation."""
    return grid_run("decoder-softmax", test_perplexity=None, test_accuracy=None, test_cpu_seconds=None,
                    test_wall_seconds=None, test_nll=None, test_tokens_scored=None, validation_cpu_seconds=60.0,
                    validation_curve=[{"seconds": 30.0, "step": 250, "eval_loss": 6.5}])


def test_a_run_without_a_test_split_shows_its_validation_and_test_not_measured(tmp_path):
    write_runs(tmp_path, {"smoke": smoke_run(), "test-only": grid_run("encoder-softmax", validation_perplexity=None)})
    result = run_results("lm_results", tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    # validation 124.2 with its evaluation's CPU-minute (60 s), test not measured
    assert "| 9,750 | 124.2 | not measured | not measured | 1.0 |" in result.stdout, result.stdout
    # a run that scored only the test split is listed too, its validation not measured
    assert "| 12,250 | not measured | 114.4 | 0.259 | 4.3 |" in result.stdout, result.stdout


def test_a_curve_of_one_evaluation_is_drawn_as_a_point(tmp_path):
    lm_results = import_from("scripts", "lm_results")
    runs = [dict(smoke_run(), name="smoke")]
    plt.close("all")
    assert lm_results.plot(runs, tmp_path / "curve.png")
    (line,) = plt.gcf().axes[0].lines
    assert line.get_marker() == "o" and list(line.get_xdata()) == [0.5]  # 30 CPU-seconds
    plt.close("all")


def test_runs_without_a_curve_write_no_empty_picture_and_say_so(tmp_path):
    write_runs(tmp_path / "runs", {"smoke": dict(smoke_run(), validation_curve=[])})
    result = run_results("lm_results", tmp_path / "runs", "--plot", tmp_path / "curve.png")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"no plot written to {tmp_path / 'curve.png'}: no run recorded a validation curve" in result.stderr
    assert not (tmp_path / "curve.png").exists()


def test_the_design_column_reads_the_record():
    design = import_from("scripts", "lm_results").design
    assert design(grid_run("decoder-softmax")) == "causal LM"
    assert design(grid_run("encoder-softmax")) == "many targets"
    assert design(grid_run("encoder-window-softmax")) == "one target / window"
    # a masked LM records no next-token mode: it was shown as a one-target head
    assert design(dict(grid_run("encoder-softmax"), objective="mlm", next_token_mode=None)) == "masked LM"
    # runs before `next_token_mode` was recorded (results/wikitext2/): one head per family
    first = json.loads((ROOT / "results" / "wikitext2" / "encoder-softmax" / "all_results.json").read_text())
    assert "next_token_mode" not in first and design(first) == "one target / window"
    assert design(dict(first, family="decoder")) == "causal LM"


def test_a_figure_edited_into_text_skips_its_run_aloud(tmp_path):
    write_runs(tmp_path, {"edited": grid_run("decoder-softmax", test_perplexity="116.1"),
                          "fine": grid_run("decoder-linear-elu")})
    result = run_results("lm_results", tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"skipped {tmp_path / 'edited' / 'all_results.json'}: test_perplexity is '116.1', not a number" in (
        result.stderr)
    assert "| 122.1 |" in result.stdout and "116.1" not in result.stdout


@pytest.mark.slow
def test_set_results_shows_a_run_without_its_metric_and_skips_a_metric_in_text(tmp_path):
    run = {"task": "max_regression", "model": "deepsets_max", "parameters": 16_833, "steps": 100, "batch_size": 128,
           "lr_scheduler": "cosine", "train_wall_seconds": 60.0, "mae": 0.01, "paper": {"rFF+max": 0.1355}}
    write_runs(tmp_path, {"measured": run, "unmeasured": dict(run, mae=None, model="deepsets_sum"),
                          "text": dict(run, mae="0.01", model="deepsets_mean")})
    result = run_results("set_results", tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "| rFF+max | - | - | 16,833 | 100 x 128 | cosine | MAE | 0.0100 | 0.1355 | 1.0 min |" in result.stdout
    assert "| rFF+sum | - | - | 16,833 | 100 x 128 | cosine | MAE | not measured | - | 1.0 min |" in result.stdout
    assert f"skipped {tmp_path / 'text' / 'all_results.json'}: mae is '0.01', not a number" in result.stderr
    assert "rFF+mean" not in result.stdout

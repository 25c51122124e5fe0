"""The scripts run as their docstrings say (tiny modes: seconds, nothing asserted about speed)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_generation_tiny(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_generation.py"), "--tiny", "--output_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| batch | context | softmax ms/step | linear ms/step |" in result.stdout
    report = json.loads((tmp_path / "bench_generation.json").read_text())
    assert {(r["batch"], r["context"]) for r in report["rows"]} == {(1, 16), (1, 64), (2, 16), (2, 64)}
    for row in report["rows"]:
        for name in ("softmax", "linear"):
            assert row[name]["ms_per_token"] > 0 and row[name]["cache_mib"] > 0
    by_context = {r["context"]: r for r in report["rows"] if r["batch"] == 1}
    # the softmax cache grows with the context, the linear state does not
    assert by_context[64]["softmax"]["cache_mib"] == 4 * by_context[16]["softmax"]["cache_mib"]
    assert by_context[64]["linear"]["cache_mib"] == by_context[16]["linear"]["cache_mib"]
    assert set(report["summary"]) == {"batch 1", "batch 2"}


def test_lm_results_table_and_plot(tmp_path):
    run = tmp_path / "runs" / "decoder-softmax"
    run.mkdir(parents=True)
    result = {
        "family": "decoder",
        "attention": "softmax",
        "feature_map": "elu",
        "parameters": 5_050_633,
        "train_tokens": 3_000_000,
        "train_tokens_per_second": 1700.0,
        "validation_perplexity": 250.0,
        "test_perplexity": 240.0,
        "test_accuracy": 0.2,
        "wall_time_seconds": 1800.0,
        "validation_curve": [
            {"seconds": 60, "step": 100, "eval_loss": 6.0},
            {"seconds": 120, "step": 200, "eval_loss": 5.5},
        ],
    }
    (run / "all_results.json").write_text(json.dumps(result))
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "lm_results.py"),
            str(tmp_path / "runs"),
            "--copy_to",
            str(tmp_path / "kept"),
            "--plot",
            str(tmp_path / "curve.png"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| decoder | softmax | 5.05M | 3.00M | 1,700 | 250.0 | 240.0 | 0.200 | 30.0 min |" in out.stdout
    assert (tmp_path / "kept" / "decoder-softmax" / "all_results.json").exists()
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_bench_sets_tiny(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_sets.py"), "--tiny", "--output_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "bench_sets.json").read_text())
    rows = {r["size"]: r for r in report["rows"]}
    assert set(rows) == {32, 128}
    for row in rows.values():
        for name in ("SAB", "ISAB", "ISAB linear"):
            assert row[name]["ms"] > 0 and row[name]["saved_mib"] > 0
    # what SAB keeps for backward grows faster with the set than what ISAB keeps
    sab = rows[128]["SAB"]["saved_mib"] / rows[32]["SAB"]["saved_mib"]
    isab = rows[128]["ISAB"]["saved_mib"] / rows[32]["ISAB"]["saved_mib"]
    assert sab > isab
    assert (tmp_path / "bench_sets.png").exists()

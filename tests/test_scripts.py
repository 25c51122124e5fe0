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

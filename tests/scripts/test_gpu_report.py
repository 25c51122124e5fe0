"""benchmarks/gpu_report.py on a CPU: its dry run lists every row and contender of the four sections (built on the
meta device) and writes nothing unless given --output_dir; without CUDA a real run refuses, writing nothing."""

import time
from types import SimpleNamespace

import pytest
import torch
from tests.helpers import FAMILIES, ROOT, import_from

gpu_report = import_from("benchmarks", "gpu_report")

ATTENTIONS = ["softmax", "linear elu", "linear exp"]
FLA_GATED = "fla chunk_simple_gla causal elu, gated decay (unnormalised)"  # bench_attention.py's name


def files_under(*folders):
    return {path for folder in folders for path in folder.rglob("*")}


@pytest.fixture
def dry_run(tmp_path, monkeypatch, capsys):
    """gpu_report.main(flags + --dry_run) from an empty working folder -> (exit code, stdout, files it made)."""
    monkeypatch.chdir(tmp_path)
    before = files_under(ROOT / "results", ROOT / "benchmarks")

    def run(*flags):
        code = gpu_report.main(["--dry_run", *map(str, flags)])
        return code, capsys.readouterr().out, files_under(tmp_path, ROOT / "results", ROOT / "benchmarks") - before

    return run


def test_dry_run_lists_every_row_and_contender_and_writes_nothing(dry_run):
    code, out, made = dry_run()
    assert code == 0 and made == set()
    # every family x attention, undecayed; and decayed wherever the causal LM head takes a decay: linear attention,
    # every family's (the decoder's causal LM and the others' many-target next-token heads attend causally)
    rows = [f"{family} / {attention} / {decay}" for family in FAMILIES for attention in ATTENTIONS
            for decay in ("none", "fixed", "gated") if decay == "none" or attention != "softmax"]
    listed = [line[2:].split(":")[0] for line in out.splitlines() if line.startswith("- ") and " / " in line]
    assert listed == rows
    assert "softmax / fixed" not in out and "failed" not in out
    for contender in gpu_report.THROUGHPUT:
        assert f"- {contender.name} (" in out
    assert "compiled causal linear elu step >= 1.3x GPT-2's at context 4,096" in out
    assert "gpu preset's compiled step >= 1.0x GPT-2's at 512" in out
    assert "python benchmarks/bench_attention.py --device cuda --lengths 1024 4096 16384" in out
    assert "python benchmarks/bench_generation.py --contexts 128 2048 --batch_sizes 1 --dtype bfloat16 --cache " \
           "static --compile" in out
    for contender in ("softmax_static_compiled", "linear_compiled"):
        assert contender in out
    for name, (title, budget) in gpu_report.SECTIONS.items():
        assert f"## {title} ({budget} s" in out


def test_dry_run_with_output_dir_writes_a_readme_that_says_so(dry_run, tmp_path):
    code, out, made = dry_run("--output_dir", tmp_path / "report", "--sections", "throughput")
    assert code == 0 and made == {tmp_path / "report", tmp_path / "report" / "README.md"}
    readme = (tmp_path / "report" / "README.md").read_text()
    assert readme.startswith("# GPU report: dry run") and "GPT-2 sdpa, compiled" in readme


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_a_real_run_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = files_under(ROOT / "results")
    assert gpu_report.main(["--output_dir", str(tmp_path / "report")]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert files_under(tmp_path, ROOT / "results") == before


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx-4090")])
def test_the_report_folder_names_the_gpu(name, slug):
    assert gpu_report.gpu_slug(name) == slug


def test_fused_launches_counts_the_kernels_a_step_ran(monkeypatch):
    """The training table's "Triton launches/step": the fused kernels one call launched (forward and both backward
    kernels of the causal op here, in triton's interpreter), 0 where the PyTorch ops ran."""
    pytest.importorskip("triton")
    from hf_settransformer.linear_ops import causal_linear_attention

    q, k, v = (torch.randn(1, 2, 20, 4, requires_grad=True) for _ in range(3))

    def step():
        causal_linear_attention(q, k, v, feature_map="elu")[0].sum().backward()

    monkeypatch.setenv("HFST_DISABLE_TRITON", "1")
    assert gpu_report.fused_launches(step) == 0
    monkeypatch.delenv("HFST_DISABLE_TRITON")
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    assert gpu_report.fused_launches(step) == 3


def test_a_report_never_goes_into_a_folder_that_holds_files(tmp_path):
    """An explicit --output_dir must be empty or new; the default folder of a day and GPU already written gets a
    numbered sibling, so a second run keeps the first's files."""
    default = tmp_path / "gpu-2026-11-27-h100"
    assert gpu_report.report_folder(None, default) == default
    default.mkdir()
    assert gpu_report.report_folder(None, default) == default  # empty: taken
    (default / "README.md").write_text("an earlier report")
    assert gpu_report.report_folder(None, default) == tmp_path / "gpu-2026-11-27-h100-2"
    assert gpu_report.report_folder(str(default), default) is None
    assert gpu_report.report_folder(str(tmp_path / "new"), default) == tmp_path / "new"


def test_results_are_written_whole_by_a_rename(tmp_path, monkeypatch):
    """bench_common.write_whole (every benchmark's JSON, the report's README): the old file stays until the new one
    is complete; a write that fails midway leaves the old file and no other."""
    bench_common = import_from("benchmarks", "bench_common")
    path = tmp_path / "report.json"
    bench_common.write_whole(path, "old")
    assert path.read_text() == "old" and {p.name for p in tmp_path.iterdir()} == {"report.json"}

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(bench_common.os, "replace", broken_replace)
    with pytest.raises(OSError):
        bench_common.write_whole(path, "new")
    assert path.read_text() == "old" and {p.name for p in tmp_path.iterdir()} == {"report.json"}


def test_a_stopped_attention_benchmark_keeps_its_measured_lengths(tmp_path, monkeypatch):
    """bench_attention.py writes its JSON after each length: the report shows the lengths a run killed at the
    section's budget measured, says where it stopped, and shows a contender that raised as failed, with why."""
    out, logs = tmp_path / "report", tmp_path / "report" / "logs"
    logs.mkdir(parents=True)
    rows = [{"length": 1024, "SDPA causal": {"ms": 1.5, "peak_mib": 40.0, "first_call_s": 0.1},
             FLA_GATED: {"failed": "RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper"}}]
    monkeypatch.setattr(gpu_report, "ROOT", tmp_path)
    (tmp_path / "benchmarks").mkdir()  # a stub bench: writes one length, then hangs until the section's budget ends
    (tmp_path / "benchmarks" / "stub.py").write_text("import json, sys, time\nfrom pathlib import Path\n"
                      "out = Path(sys.argv[sys.argv.index('--output_dir') + 1])\n"
                      f"(out / 'stub.json').write_text(json.dumps({{'complete': False, 'rows': {rows!r}}}))\n"
                      "print('measured n=1024', flush=True)\ntime.sleep(60)\n")
    args = SimpleNamespace(precision="bf16")
    result = gpu_report.benchmark_section("stub.py", [], args, out, logs, hard=time.time() + 5)
    assert result["exit_code"] is None and result["rows"] == rows
    text = "\n".join(gpu_report.attention_lines(result, args))
    assert "**Stopped after n = 1,024**: bench_attention.py stopped at the section's time budget" in text
    assert "| SDPA causal | 1.50 ms, 40 MiB |" in text
    assert f"| {FLA_GATED} | **failed**: RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper |" \
           in text


def test_gpt2_names_its_loss_so_its_compiled_step_has_no_graph_break(monkeypatch):
    """GPT2LMHeadModel's class name names no loss, so transformers' `loss_function` logs a warning on each call,
    a graph break under torch.compile: the report's GPT-2 names the loss it falls back on."""
    import transformers.modeling_utils

    warned = []
    monkeypatch.setattr(transformers.modeling_utils.logger, "warning_once", lambda *a, **k: warned.append(a))
    with torch.device("meta"):
        model = gpu_report.build_contender(gpu_report.THROUGHPUT[4])
    assert isinstance(model, gpu_report.GPT2LMHeadModel)
    assert model.loss_function is transformers.modeling_utils.LOSS_MAPPING["ForCausalLM"] and warned == []

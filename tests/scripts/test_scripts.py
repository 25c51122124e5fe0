"""The scripts run as their docstrings say (tiny modes: seconds, nothing asserted about speed): the benchmarks, the
results tables, and train_sets.py end to end (train_lm.py has its own file, test_train_lm.py)."""

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from tests.helpers import FAMILIES, ROOT, import_from

from hf_settransformer.toolkit.checkpoint_files import COMPLETE_MARKER

def script_path(script):
    """benchmarks/bench_*.py, else scripts/<script>."""
    return ROOT / ("benchmarks" if script.startswith("bench_") else "scripts") / script


def run_script(script, *args, timeout=300):
    """Runs benchmarks/<script> or scripts/<script> with these arguments, asserts that it succeeded, returns its
    stdout."""
    result = subprocess.run(
        [sys.executable, str(script_path(script)), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_tiny(script, tmp_path):
    stdout = run_script(script, "--tiny", "--output_dir", tmp_path)
    return stdout, json.loads((tmp_path / script.replace(".py", ".json")).read_text())


@pytest.mark.slow
def test_bench_generation_tiny(tmp_path):
    stdout, report = run_tiny("bench_generation.py", tmp_path)
    assert "| batch | context | softmax ms/step | linear ms/step |" in stdout
    assert {(r["batch"], r["context"]) for r in report["rows"]} == {(1, 16), (1, 64), (2, 16), (2, 64)}
    for row in report["rows"]:
        for name in ("softmax", "linear"):
            assert row[name]["ms_per_token"] > 0 and row[name]["cache_mib"] > 0
    by_context = {r["context"]: r for r in report["rows"] if r["batch"] == 1}
    # the softmax cache grows with the context, the linear state does not
    assert by_context[64]["softmax"]["cache_mib"] == 4 * by_context[16]["softmax"]["cache_mib"]
    assert by_context[64]["linear"]["cache_mib"] == by_context[16]["linear"]["cache_mib"]
    assert set(report["summary"]) == {"batch 1", "batch 2"}


@pytest.mark.slow
def test_bench_generation_static_cache_compiled_steps_and_profile(tmp_path):
    """--cache static and --compile add their contenders to the same table (compiled by dynamo's eager backend here:
    no code generation on the test machine); --profile writes a profiler table per contender."""
    flags = ["--cache", "static", "--compile", "--compile_backend", "eager", "--profile", "--batch_sizes", "1"]
    stdout = run_script("bench_generation.py", "--tiny", "--contexts", "16", *flags, "--output_dir", tmp_path)
    names = ["softmax", "linear", "softmax_static", "softmax_static_compiled", "linear_compiled"]
    assert "| batch | context | " + " | ".join(f"{n} ms/step" for n in names) in stdout
    report = json.loads((tmp_path / "bench_generation.json").read_text())
    assert report["contenders"] == names and len(report["rows"]) == 1
    row = report["rows"][0]
    assert all(row[n]["ms_per_token"] > 0 for n in names)
    assert row["softmax_static"]["cache_mib"] > row["softmax"]["cache_mib"]  # buffers for every step to come
    assert row["linear_compiled"]["cache_mib"] == row["linear"]["cache_mib"]
    profile = (tmp_path / "bench_generation_profile.txt").read_text()
    assert all(f"## {n}, batch 1, context 16: 2 steps" in profile for n in names)
    assert "decode_step" in profile


@pytest.mark.slow
def test_lm_results_table_and_plot(tmp_path):
    run = tmp_path / "runs" / "decoder-softmax"
    run.mkdir(parents=True)
    result = {
        "family": "decoder",
        "attention": "softmax",
        "feature_map": "elu",
        "parameters": 5_050_633,
        "train_tokens": 3_000_000,
        "train_tokens_per_wall_second": 1700.0,
        "train_tokens_per_cpu_second": 3_000_000 / 1680,
        "validation_perplexity": 250.0,
        "test_perplexity": 240.0,
        "test_accuracy": 0.2,
        "wall_time_seconds": 1800.0,
        "train_wall_seconds": 1500.0,
        "threads_per_process": 1,
        "resumed_from_step": 500,
        "budget_clock": "wall",
        "train_wall_seconds_whole_run": 1680.0,
        "train_cpu_minutes": 28.0,
        "validation_curve": [
            {"seconds": 60, "step": 100, "eval_loss": 6.0},
            {"seconds": 120, "step": 200, "eval_loss": 5.5},
        ],
    }
    (run / "all_results.json").write_text(json.dumps(result))
    adaptive = dict(result, attention="linear", parameters=2_200_000, precision="bf16", selected_step=6000,
                    validation_perplexity=150.0, test_perplexity=140.0, adaptive_softmax_cutoffs=[2000, 10000],
                    adaptive_input_cutoffs=[2000, 10000], validation_cpu_seconds=120.0, test_cpu_seconds=180.0)
    (tmp_path / "runs" / "decoder-linear-elu").mkdir()
    (tmp_path / "runs" / "decoder-linear-elu" / "all_results.json").write_text(json.dumps(adaptive))
    gated = dict(adaptive, feature_map="exp", linear_attention_decay="gated", test_perplexity=130.0)
    (tmp_path / "runs" / "decoder-linear-exp-gated").mkdir()
    (tmp_path / "runs" / "decoder-linear-exp-gated" / "all_results.json").write_text(json.dumps(gated))
    config = {"model_type": "hf_settransformer_decoder", "linear_attention_decay": "gated", "transformers_version": "5.0"}
    (tmp_path / "runs" / "decoder-linear-exp-gated" / "config.json").write_text(json.dumps(config))  # a saved model
    (tmp_path / "runs" / "decoder-linear-exp-gated" / "README.md").write_text("# its card")
    # resumed from a checkpoint that did not record the time before it
    no_clock = dict(result, train_wall_seconds_whole_run=None, train_cpu_minutes=None, train_tokens_per_cpu_second=None)
    (tmp_path / "runs" / "encoder-softmax").mkdir()
    (tmp_path / "runs" / "encoder-softmax" / "all_results.json").write_text(
        json.dumps(dict(no_clock, family="encoder", next_token_mode="many"))
    )
    stdout = run_script(
        "lm_results.py",
        tmp_path / "runs",
        "--copy_to",
        tmp_path / "kept",
        "--plot",
        tmp_path / "curve.png",
        timeout=120,
    )
    # a resumed run shows the whole run's training CPU-minutes (28 min x 1 thread), not this process's (25 min), and
    # its tokens per CPU-second over them (3M / 1,680 s), not this process's per wall second (1,700); a run without a
    # best-checkpoint selection and the evaluation's CPU time says so
    row = ("| decoder | causal LM | softmax | 5.05M | full | fp32 | 1 | 28.0 | 0 | 3.00M | 1,786 | last | 250.0 | 240.0 "
           "| 0.200 | 0.0 wall |")
    assert row in stdout
    # a run with the adaptive layers, its selected checkpoint and the evaluation's CPU time
    assert ("| decoder | causal LM | linear elu | 2.20M | adaptive in+out | bf16 | 1 | 28.0 | 0 | 3.00M | 1,786 | 6,000 "
            "| 150.0 | 140.0 | 0.200 | 5.0 |") in stdout
    # a decayed run names its decay (`linear_attention_decay` in all_results.json)
    assert "| decoder | causal LM | linear exp, gated decay | 2.20M |" in stdout
    # no record of the whole run's time: CPU-minutes unknown, tokens per wall second of this process, marked
    assert "| encoder | many targets | softmax | 5.05M | full | fp32 | 1 | ? | 0 | 3.00M | 1,700 wall | last |" in stdout
    assert json.loads((tmp_path / "kept" / "decoder-softmax" / "all_results.json").read_text()) == result
    # a saved model's config goes with the kept results (its card is written again from them), the card does not
    kept = json.loads((tmp_path / "kept" / "decoder-linear-exp-gated" / "all_results.json").read_text())
    assert kept == dict(gated, config=config, transformers_version="5.0")
    assert not list((tmp_path / "kept").glob("*/README.md"))
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_the_kept_results_use_todays_keys():
    """Every all_results.json kept in results/ names its durations and speeds by their clock, as train_lm.py and
    train_sets.py write them today, and a language-model run records its budget clock: the tables and the model
    cards read the files as they are."""
    undated = {"train_seconds", "train_seconds_this_process", "train_seconds_before", "train_seconds_whole_run",
               "train_tokens_per_second", "train_model_flops_per_second", "validation_seconds", "test_seconds"}
    files = sorted((ROOT / "results").glob("**/all_results.json"))
    assert len(files) > 50
    for path in files:
        results = json.loads(path.read_text())
        assert not undated & set(results), (path, undated & set(results))
        if "family" in results:
            assert results["budget_clock"] in ("wall", "cpu") and "train_tokens_per_cpu_second" in results, path


def test_lm_results_curves_tell_the_literal_head_from_the_many_target_one():
    curve_label_and_style = import_from("scripts", "lm_results").curve_label_and_style
    run = {"family": "encoder", "attention": "softmax", "feature_map": "elu"}
    assert curve_label_and_style(dict(run, next_token_mode="many")) == ("encoder, softmax", "-")
    assert curve_label_and_style(dict(run, next_token_mode="window")) == ("encoder, softmax, one target / window", "-.")
    assert curve_label_and_style(dict(run, family="decoder", attention="linear", feature_map="exp")) == (
        "decoder, linear exp", ":")


def test_lm_results_curves_tell_decays_apart():
    curve_colors = import_from("scripts", "lm_results").curve_colors
    elu = {"family": "decoder", "attention": "linear", "feature_map": "elu"}
    runs = [{"family": "decoder", "attention": "softmax", "feature_map": "elu"}, dict(elu),
            dict(elu, linear_attention_decay="fixed"), dict(elu, linear_attention_decay="gated"),
            dict(elu, feature_map="exp", linear_attention_decay="gated"), dict(elu, family="perceiver_io")]
    colors = curve_colors(runs)
    # the three elu decoders draw the same line style: only their colours tell none, fixed and gated apart
    assert len(set(colors[1:4])) == 3
    assert colors[0] == colors[1] and colors[3] == colors[4]  # same family and decay, one colour
    assert colors[5] not in colors[:5]  # another family


@pytest.mark.slow
@pytest.mark.parametrize("script,args,flag,nearest", [
    ("push_run.py", ["run", "user/name", "--privte"], "--privte", "--private"),
    ("lm_results.py", ["runs", "--copy_tp", "kept"], "--copy_tp", "--copy_to"),
    ("set_results.py", ["runs", "--copy-too", "kept"], "--copy-too", "--copy_to"),
])
def test_the_results_and_push_scripts_name_a_misspelt_flag_with_the_nearest_one(tmp_path, script, args, flag,
                                                                                nearest):
    result = subprocess.run([sys.executable, str(script_path(script)), *args], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and f"unknown flag {flag} (did you mean {nearest}?)" in result.stderr, result.stderr


@pytest.mark.slow
def test_set_results_table(tmp_path):
    runs = {
        "mog": {
            "task": "mixture_of_gaussians",
            "model": "ISAB(16)+PMA, softmax",
            "parameters": 400_000,
            "steps": 10_000,
            "batch_size": 10,
            "lr_scheduler": "linear",
            "train_wall_seconds": 3000.0,
            "log_likelihood_per_point": -1.51234,
            "oracle_log_likelihood_per_point": -1.47,
            "num_hidden_layers": 3,
            "num_decoder_layers": 2,
            "paper": {"ISAB(16)+PMA": -1.5009, "SAB+PMA": -1.5145},
            "continued_from": "outputs/sets/mog-30k",  # --model_name_or_path: its steps and time come first
            "steps_before": 30_000,
            "train_wall_seconds_before": 6000.0,
        },
        "rff": {
            "task": "max_regression",
            "model": "deepsets_max",
            "parameters": 16_833,
            "steps": 100,
            "batch_size": 128,
            "lr_scheduler": "cosine",
            "train_wall_seconds": None,  # resumed from a checkpoint that did not record the time before it
            "mae": 0.01,
            "paper": {"SAB+PMA": 0.2085, "rFF+max": 0.1355},
        },
        "lm": {"family": "decoder", "validation_perplexity": 1.0},  # not a set run: left out
    }
    for name, result in runs.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "all_results.json").write_text(json.dumps(result))
    stdout = run_script("set_results.py", tmp_path / "runs", "--copy_to", tmp_path / "kept", timeout=120)
    lines = stdout.splitlines()
    assert len(lines) == 4  # header, rule, two set runs: max regression first, then the mixture
    assert lines[2] == "| max_regression | rFF+max | - | - | 16,833 | 100 x 128 | cosine | MAE | 0.0100 | 0.1355 | ? |"
    assert lines[3] == (
        "| mixture_of_gaussians | ISAB(16)+PMA | 3 + 2 | softmax | 400,000 | 30,000 + 10,000 x 10 | linear "
        "| log-likelihood / point | -1.5123 (oracle -1.4700) | -1.5009 | 150.0 min |"
    )
    assert (tmp_path / "kept" / "mog" / "all_results.json").exists()
    assert not (tmp_path / "kept" / "lm").exists()


@pytest.mark.slow
def test_bench_sets_tiny(tmp_path):
    stdout, report = run_tiny("bench_sets.py", tmp_path)
    rows = {r["size"]: r for r in report["rows"]}
    assert set(rows) == {32, 128}
    assert "hidden 32, feed-forward 32," in report["setup"]  # the set models' width: rFF as wide as the hidden size
    for row in rows.values():
        for name in ("SAB", "ISAB", "ISAB linear"):
            assert row[name]["ms"] > 0 and row[name]["saved_mib"] > 0
    # what SAB keeps for backward grows faster with the set than what ISAB keeps
    sab = rows[128]["SAB"]["saved_mib"] / rows[32]["SAB"]["saved_mib"]
    isab = rows[128]["ISAB"]["saved_mib"] / rows[32]["ISAB"]["saved_mib"]
    assert sab > isab
    assert (tmp_path / "bench_sets.png").exists()


@pytest.mark.slow
def test_bench_attention_tiny(tmp_path):
    stdout, report = run_tiny("bench_attention.py", tmp_path)
    assert "| n | softmax (SDPA) |" in stdout
    rows = {r["length"]: r for r in report["rows"]}
    assert set(rows) == {32, 64}
    has_ft = importlib.util.find_spec("fast_transformers") is not None
    for row in rows.values():
        for name, cell in row.items():
            if name == "length":
                continue
            if "fast-transformers" in name and not has_ft:
                assert cell == {"skipped": "not installed (pytorch-fast-transformers)"}
            else:
                assert cell["ms"] > 0 and cell["peak_mib"] > 0, name
    assert [s["length"] for s in report["chunk_sweep"]] == [64]
    assert set(report["chunk_sweep"][0]) == {"length", "8", "16"}
    assert (tmp_path / "bench_attention.png").exists()


def test_bench_attention_keeps_going_past_a_contender_that_raises_and_keeps_each_length(tmp_path, monkeypatch):
    """A peer that refuses (fla's gated kernel on Hopper with triton < 3.7.1 raises in its backward) costs its own
    cells, which say why; the JSON is written after each length, so a run stopped later keeps the lengths measured."""
    bench = import_from("benchmarks", "bench_attention")
    table, _ = bench.cpu_contenders(SimpleNamespace(chunk_size=8))

    def refuses(q, k, v):
        out = bench.linear_attention(q, k, v, feature_map="elu")[0]
        if q.shape[2] == 64:  # the second length: the run is stopped there, as a time limit would
            raise KeyboardInterrupt
        return refuses_in_backward.apply(out)

    class refuses_in_backward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results\nmore")

    small = {name: table[name] for name in ("softmax (SDPA)", "linear elu")}
    monkeypatch.setattr(bench, "contenders", lambda args: ({**small, "peer": refuses}, {}))
    monkeypatch.setattr(sys, "argv", ["bench_attention.py", "--tiny", "--output_dir", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        bench.main()
    report = json.loads((tmp_path / "bench_attention.json").read_text())
    assert report["complete"] is False and [r["length"] for r in report["rows"]] == [32]
    row = report["rows"][0]
    assert row["peer"] == {"failed": "RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect "
                                     "results"}
    for name in small:
        assert row[name]["ms"] > 0 and row[name]["first_call_s"] > 0


@pytest.mark.slow
def test_bench_crossover_tiny(tmp_path):
    stdout, report = run_tiny("bench_crossover.py", tmp_path)
    assert [r["length"] for r in report["rows"]] == [16, 32, 64]
    for row in report["rows"]:
        for mode in ("forward", "training step", "generation"):
            assert row[mode]["softmax"] > 0 and row[mode]["linear"] > 0
    assert set(report["crossover"]) == {"forward", "training step", "generation"}
    assert (tmp_path / "bench_crossover.png").exists()


def test_crossover_is_where_linear_stays_faster():
    crossover = import_from("benchmarks", "bench_crossover").crossover
    lengths = [100, 200, 400, 800]
    # softmax / linear = 0.5, 2 (faster), 0.9 (slower again), then 4: linear stays faster from 800 only
    first, estimate = crossover(lengths, [1, 2, 0.9, 4], [2, 1, 1, 1])
    assert first == 800
    # log-log interpolation between (400, ratio 0.9) and (800, ratio 4)
    t = -math.log(0.9) / (math.log(4) - math.log(0.9))
    assert estimate == pytest.approx(math.exp(math.log(400) + t * math.log(2)))
    assert crossover(lengths, [1, 1, 1, 1], [2, 2, 2, 2]) == (None, None)  # never faster
    assert crossover(lengths, [3, 3, 3, 3], [1, 1, 1, 1]) == (100, None)  # faster everywhere measured


def test_peak_memory_counts_what_the_call_allocates():
    peak_memory_bytes = import_from("benchmarks", "bench_common").peak_memory_bytes
    import torch

    held = []
    peak = peak_memory_bytes(lambda: held.append(torch.ones(1_000_000) * 2), "cpu")  # two 4 MB tensors at once
    assert 8_000_000 <= peak < 9_000_000
    assert peak_memory_bytes(lambda: None, "cpu") == 0


TRAINING_CONTENDERS = {  # name in the report -> the package it needs
    "hfst decoder (softmax)": "hf_settransformer",
    "hfst decoder (softmax, gelu_new)": "hf_settransformer",
    "hfst decoder (softmax, chunked loss)": "hf_settransformer",
    "hfst decoder (linear elu)": "hf_settransformer",
    "hfst decoder (linear exp)": "hf_settransformer",
    "transformers GPT2LMHeadModel": "transformers",
    "x-transformers decoder": "x_transformers",
}


@pytest.mark.slow
def test_bench_training_tiny(tmp_path):
    stdout, report = run_tiny("bench_training.py", tmp_path)
    assert "| contender | parameters | ms/step | tokens/s |" in stdout
    assert "hfst decoder (softmax) / GPT-2 tokens/s = " in stdout
    rows = {r["contender"]: r for r in report["rows"]}
    assert set(rows) == set(TRAINING_CONTENDERS)
    assert report["matmul_flops_per_second"] > 0
    for name, package in TRAINING_CONTENDERS.items():
        row = rows[name]
        if importlib.util.find_spec(package) is None:
            assert row["status"] == "skipped (not installed)" and row["tokens_per_second"] is None
            continue
        assert row["status"] == "ok"
        assert row["tokens_per_second"] > 0 and row["mfu"] > 0 and row["flops_per_step"] > 0
    ours, gpt2 = rows["hfst decoder (softmax)"]["parameters"], rows["transformers GPT2LMHeadModel"]["parameters"]
    assert abs(ours - gpt2) <= 0.1 * gpt2
    # same model sizes: the FLOPs of a step agree (the activation's elementwise work is not counted)
    assert (
        rows["hfst decoder (softmax, gelu_new)"]["flops_per_step"] == rows["hfst decoder (softmax)"]["flops_per_step"]
    )
    # the chunked loss does the output layer's three matmuls too, in pieces
    chunked = rows["hfst decoder (softmax, chunked loss)"]["flops_per_step"]
    assert chunked == rows["hfst decoder (softmax)"]["flops_per_step"]
    assert (tmp_path / "bench_training.png").exists()


@pytest.mark.slow
def test_bench_lm_step_tiny(tmp_path):
    """One contender end to end (the adaptive output layer, fp32): its table row and its record."""
    stdout = run_script("bench_lm_step.py", "--tiny", "--families", "encoder", "--heads", "adaptive", "--no_bf16",
                        "--output_dir", tmp_path)
    report = json.loads((tmp_path / "bench_lm_step.json").read_text())
    assert "| contender | parameters | ms/step | tokens/s | vs adaptive fp32 | GFLOP/s | % of peak |" in stdout
    assert "| encoder / adaptive / fp32 |" in stdout
    [row] = report["results"]
    assert row["contender"] == "encoder / adaptive / fp32"
    assert row["tokens_per_second"] > 0 and row["flops_per_step"] > 0
    assert row["achieved_flops"] > 0 and row["peak_flops"] > 0


def test_bench_lm_step_contenders_and_what_it_counts_of_each():
    """The contenders of `--tiny` (every family x output layer, fp32 and bf16; compile skipped) and the counts its table
    reports, of the models it builds: the adaptive head counts fewer FLOPs than the full projection (only the clusters
    a target falls in), and the adaptive input holds far fewer parameters than the vocabulary x hidden embedding."""
    bench = import_from("benchmarks", "bench_lm_step")
    args = bench.parse_args(["--tiny", "--families", *FAMILIES])
    assert {bench.contender_name(family, *v) for family in args.families for v in bench.variants(args)} == {
        f"{family} / {head} / {precision}"
        for family in FAMILIES
        for head in ("full", "adaptive", "adaptive-in-out")
        for precision in ("fp32", "bf16")
    }
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len))
    for family in FAMILIES:
        models = {head: bench.build(family, head, args) for head in bench.HEADS}
        flops = {head: bench.step_flops(model, ids, False, torch.device("cpu")) for head, model in models.items()}
        parameters = {head: sum(p.numel() for p in model.parameters()) for head, model in models.items()}
        assert flops["adaptive"] < flops["full"], family
        assert parameters["adaptive-in-out"] < parameters["adaptive"] - 200 * 32 // 2, family
    assert bench.step_flops(models["full"], ids, True, torch.device("cpu")) == flops["full"]  # bf16: the same matmuls


@pytest.mark.slow
def test_bench_lm_step_runs_another_checkout_beside_this_one(tmp_path):
    """`--baseline DIR` imports DIR's hf_settransformer as `hfst_baseline` and times every contender with both
    packages in the same run; here the baseline is this very tree, so the two build the same models (same parameter
    and FLOP counts), and each of this tree's rows gets a ratio."""
    stdout = run_script("bench_lm_step.py", "--tiny", "--families", "decoder", "--heads", "full", "--no_bf16",
                        "--baseline", ROOT, "--output_dir", tmp_path)
    rows = {r["contender"]: r for r in json.loads((tmp_path / "bench_lm_step.json").read_text())["results"]}
    assert set(rows) == {"decoder / full / fp32", "baseline: decoder / full / fp32"}
    ours, theirs = rows["decoder / full / fp32"], rows["baseline: decoder / full / fp32"]
    assert ours["parameters"] == theirs["parameters"] and ours["flops_per_step"] == theirs["flops_per_step"]
    assert "| % of peak | vs baseline |" in stdout
    line = next(line for line in stdout.splitlines() if line.startswith("| decoder / full / fp32 |"))
    assert line.rstrip(" |").endswith("x")
    with pytest.raises(AssertionError, match="no hf_settransformer/__init__.py there"):
        run_script("bench_lm_step.py", "--tiny", "--baseline", tmp_path, "--output_dir", tmp_path)
    for row in rows.values():
        assert row["tokens_per_second"] > 0 and 0 < row["achieved_flops"] and row["peak_flops"] > 0


PERCEIVER_CONTENDERS = {  # contender -> the package it needs
    "hfst PerceiverIOModel (softmax)": "hf_settransformer",
    "hfst PerceiverIOModel (linear elu)": "hf_settransformer",
    "transformers PerceiverModel": "transformers",
    "perceiver-pytorch PerceiverIO": "perceiver_pytorch",
}


@pytest.mark.slow
def test_bench_perceiver_tiny(tmp_path):
    stdout, report = run_tiny("bench_perceiver.py", tmp_path)
    assert "| contender | parameters | ms / step | examples/s | vs transformers | peak MiB |" in stdout
    assert "hfst PerceiverIOModel (softmax) / transformers PerceiverModel = " in stdout
    results = report["results"]
    assert set(results) == set(PERCEIVER_CONTENDERS)
    for name, package in PERCEIVER_CONTENDERS.items():
        row = results[name]
        if importlib.util.find_spec(package) is None:
            assert row["skipped"] == "skipped (not installed)"
            continue
        assert "skipped" not in row, f"{name} skipped although {package} is importable"
        assert row["examples_per_s"] > 0 and row["median_s"] > 0 and row["parameters"] > 0
        assert row["peak_mib"] >= 0
    ours = results["hfst PerceiverIOModel (softmax)"]["parameters"]
    theirs = results["transformers PerceiverModel"]["parameters"]
    assert abs(ours / theirs - 1) <= 0.15, (ours, theirs)
    assert results["transformers PerceiverModel"]["vs_transformers"] == 1.0
    assert [r["length"] for r in report["sweep"]] == [32, 128]
    assert (tmp_path / "bench_perceiver.png").stat().st_size > 1000


@pytest.mark.slow
def test_offline_metrics_load_by_the_names_transformers_example_scripts_use(tmp_path):
    """run_clm/run_mlm/run_glue call evaluate.load("accuracy") (and "mse" for regression); run from
    scripts/metrics/, those names resolve to the folders there, with no Hub access."""
    code = (
        "import evaluate\n"
        "a = evaluate.load('accuracy').compute(predictions=[1, 2, 3, 4], references=[1, 2, 0, 4])\n"
        "m = evaluate.load('mse').compute(predictions=[1.0, 2.0], references=[1.0, 0.0])\n"
        "print(a['accuracy'], m['mse'])\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "scripts" / "metrics", env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0.75", "2.0"]


# ------------------------------------------------------------------------------------------------ train_sets.py


def train_sets(output_dir, *flags, check=True):
    """scripts/train_sets.py with `flags`, quiet (no reports, no progress bars), in a subprocess."""
    args = [sys.executable, str(ROOT / "scripts" / "train_sets.py"), "--output_dir", str(output_dir)]
    args += ["--report_to", "none", "--disable_tqdm", "true", *map(str, flags)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "task,extra",
    [
        ("max_regression", ["--learning_rate", "3e-3"]),
        ("max_regression", ["--model", "deepsets_max", "--learning_rate", "3e-3"]),
        ("mixture_of_gaussians", ["--min_size", "40", "--max_size", "80", "--attention_type", "linear"]),
        (
            "point_clouds",
            ["--min_size", "64", "--max_size", "128", "--norm_type", "layernorm", "--initializer_range", "0.03"],
        ),
    ],
)
def test_train_sets_a_few_steps_lower_the_loss(tmp_path, task, extra):
    train_sets(tmp_path, "--task", task, "--max_steps", 20, "--per_device_train_batch_size", 16,
               "--per_device_eval_batch_size", 32, "--eval_sets", 64, "--hidden_size", 32, "--logging_steps", 1,
               "--save_strategy", "no", "--learning_rate", "2e-3", *extra)
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert sum(losses[-5:]) / 5 < losses[0], losses
    results = json.loads((tmp_path / "all_results.json").read_text())
    metric = {"max_regression": "mae", "mixture_of_gaussians": "log_likelihood_per_point", "point_clouds": "accuracy"}[
        task
    ]
    assert math.isfinite(results[metric])
    assert results["lr_scheduler"] == "linear" and results["batch_size"] == 16 and results["steps"] == 20
    if "--model" not in extra:  # a Set Transformer (the rFF baselines have no config)
        config = json.loads((tmp_path / "config.json").read_text())
        norm = extra[extra.index("--norm_type") + 1] if "--norm_type" in extra else "scalenorm"
        assert config["norm_type"] == norm and (norm in results["model"]) == (norm != "scalenorm")
        # the init std: given, or the task's default (0.05 for the mixture of Gaussians), named when not 0.02
        std = float(extra[extra.index("--initializer_range") + 1]) if "--initializer_range" in extra else None
        std = std or {"max_regression": 0.02, "mixture_of_gaussians": 0.05, "point_clouds": 0.02}[task]
        assert config["initializer_range"] == results["initializer_range"] == std
        assert (f"init {std:g}" in results["model"]) == (std != 0.02)


@pytest.mark.slow
def test_train_sets_resume_from_checkpoint_true_starts_fresh_then_continues(tmp_path):
    def run(max_steps, seed):
        result = train_sets(tmp_path, "--task", "max_regression", "--max_steps", max_steps,
                            "--per_device_train_batch_size", 8, "--eval_sets", 16, "--hidden_size", 16,
                            "--logging_steps", 1, "--save_steps", 3, "--resume_from_checkpoint", "true", "--seed", seed)
        run.stdout = result.stdout
        return json.loads((tmp_path / "trainer_state.json").read_text())

    first = run(3, seed=0)  # no checkpoint yet: "true" means start from scratch, not an error
    assert first["global_step"] == 3 and (tmp_path / "checkpoint-3").is_dir()
    assert f"[train_sets] no complete checkpoint in {tmp_path}: training starts at step 0" in run.stdout
    # picks up checkpoint-3 (the same seed: a resume keeps the run's settings; that it resumed, not restarted, is the
    # training time below, which counts the first run's)
    second = run(6, seed=0)
    losses = {e["step"]: e["loss"] for e in second["log_history"] if "loss" in e}
    assert second["global_step"] == 6 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert [losses[i] for i in (1, 2, 3)] == [e["loss"] for e in first["log_history"] if "loss" in e]
    # the checkpoints carry the package's completion marker; the resumed run reports the whole run's training time
    assert (tmp_path / "checkpoint-6" / COMPLETE_MARKER).is_file()
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert results["train_wall_seconds"] > results["train_wall_seconds_this_process"] > 0
    assert "train_seconds" not in results
    # restarted after its last checkpoint: evaluates again without a 7th step
    third = run(6, seed=0)
    assert third["global_step"] == 6
    assert {e["step"]: e["loss"] for e in third["log_history"] if "loss" in e} == losses


def run_train_sets(output_dir, *extra, check=True):
    return train_sets(output_dir, "--per_device_train_batch_size", 4, "--eval_sets", 8, "--min_size", 20,
                      "--max_size", 40, "--save_strategy", "no", *extra, check=check)


@pytest.mark.slow
def test_train_sets_model_name_or_path_continues_a_saved_model(tmp_path):
    mog = ["--task", "mixture_of_gaussians"]
    run_train_sets(tmp_path / "first", *mog, "--max_steps", 5, "--hidden_size", 16, "--num_decoder_layers", 2)
    first = json.loads((tmp_path / "first" / "all_results.json").read_text())
    # at learning rate 0 the continued model is the saved one: the same log-likelihood on the same fresh sets
    run_train_sets(
        tmp_path / "second", *mog, "--max_steps", 3, "--learning_rate", 0, "--model_name_or_path", tmp_path / "first"
    )
    second = json.loads((tmp_path / "second" / "all_results.json").read_text())
    assert second["log_likelihood_per_point"] == pytest.approx(first["log_likelihood_per_point"], rel=1e-6)
    assert second["parameters"] == first["parameters"] and second["hidden_size"] == 16
    assert second["num_decoder_layers"] == 2  # from the checkpoint's config, not the task default (1)
    assert second["steps"] == 3 and second["steps_before"] == 5
    assert second["train_wall_seconds_before"] == pytest.approx(first["train_wall_seconds"])
    # the architecture comes from the checkpoint: giving it too is an error, as is another task's checkpoint
    clash = run_train_sets(
        tmp_path / "x",
        *mog,
        "--max_steps",
        1,
        "--hidden_size",
        32,
        "--model_name_or_path",
        tmp_path / "first",
        check=False,
    )
    assert clash.returncode != 0 and "--hidden_size: the model comes from --model_name_or_path" in clash.stderr
    other = run_train_sets(
        tmp_path / "y",
        "--task",
        "point_clouds",
        "--max_steps",
        1,
        "--model_name_or_path",
        tmp_path / "first",
        check=False,
    )
    assert other.returncode != 0
    assert "the point_clouds task needs a SetTransformerForSequenceClassification" in other.stderr

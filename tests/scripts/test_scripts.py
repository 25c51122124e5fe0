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
from hf_settransformer.toolkit.objectives import set_objective

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


def test_lm_results_methods_table_names_each_runs_methods_and_seed_and_keeps_them_apart(tmp_path):
    """A training-methods search (<root>/<method>/<run>, scripts/wikitext2_methods.sh): a row per run naming the methods
    it recorded and its seed, and --copy_to keeps runs of the same name apart by their method's folder."""
    base = {"family": "decoder", "attention": "linear", "feature_map": "elu", "linear_attention_decay": "gated",
            "parameters": 2_200_073, "cpu_model": "AMD EPYC", "precision": "bf16", "threads_per_process": 1,
            "train_cpu_minutes": 90.0, "train_steps": 16_000, "selected_step": 15_750, "validation_perplexity": 118.0,
            "test_perplexity": 111.0, "command": "python scripts/train_lm.py --family decoder",
            "hyperparameters": {"sequence_length": 128, "optimizer": "adamw", "lr_scheduler_type": "cosine",
                                "decay_fraction": None}}
    combined = dict(base, parameters=1_496_721, test_perplexity=101.0, command=base["command"] + " --seed 1",
                    cpu_fast_bf16=True,  # recorded by runs since the base one
                    hyperparameters=dict(base["hyperparameters"], optimizer="muon", decay_fraction=0.2,
                                         lr_scheduler_type="warmup_stable_decay"),
                    average_weights="last", average_fraction=0.2, selected_by="last weight average")
    for method, result in (("base", base), ("combined-seed1", combined)):
        (tmp_path / "runs" / method / "decoder-linear-elu-gated").mkdir(parents=True)
        (tmp_path / "runs" / method / "decoder-linear-elu-gated" / "all_results.json").write_text(json.dumps(result))
    # the tie is read from the saved model's config where the results do not record it
    (tmp_path / "runs" / "combined-seed1" / "decoder-linear-elu-gated" / "config.json").write_text(
        json.dumps({"tie_adaptive_weights": True}))
    stdout = run_script("lm_results.py", tmp_path / "runs", "--methods", "--copy_to", tmp_path / "kept", timeout=120)
    assert ("| decoder, linear elu, gated decay | AdamW + cosine | 42 | 128 | 2.20M | AMD EPYC | bf16 | 1 | 90.0 | 16,000 "
            "| 15,750 | 118.0 | 111.0 |") in stdout
    assert ("| decoder, linear elu, gated decay | Muon + tied adaptive + WSD 20% + last average 20% | 1 | 128 | 1.50M "
            "| AMD EPYC, avx512_bf16 / amx | bf16 | 1 | 90.0 | 16,000 | last weight average | 118.0 | 101.0 |") in stdout
    for method in ("base", "combined-seed1"):
        assert (tmp_path / "kept" / method / "decoder-linear-elu-gated" / "all_results.json").is_file()
    # two folders holding runs of the same name would keep one of them: refused, naming the run
    result = subprocess.run([sys.executable, str(script_path("lm_results.py")), str(tmp_path / "runs" / "base"),
                             str(tmp_path / "runs" / "combined-seed1"), "--methods"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and "Two runs of the same name" in result.stderr
    assert "decoder-linear-elu-gated" in result.stderr


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


# ------------------------------------------------------------------------------------------------ the benchmarks
# Each benchmark's test runs one small contender of the package end to end; what a run of every contender would show
# (the contenders, what each builds and counts, the arithmetic of the tables and summaries) is checked in this process,
# with tiny models and made-up timings.

TRAINING_CONTENDERS = {  # name in the report -> the package it needs
    "hfst decoder (softmax)": "hf_settransformer",
    "hfst decoder (softmax, chunked loss)": "hf_settransformer",
    "hfst decoder (softmax, gelu_new)": "hf_settransformer",
    "hfst decoder (linear elu)": "hf_settransformer",
    "hfst decoder (linear exp)": "hf_settransformer",
    "transformers GPT2LMHeadModel": "transformers",
    "x-transformers decoder": "x_transformers",
}
PERCEIVER_CONTENDERS = {  # contender -> the package it needs
    "hfst PerceiverIOModel (softmax)": "hf_settransformer",
    "hfst PerceiverIOModel (linear elu)": "hf_settransformer",
    "transformers PerceiverModel": "transformers",
    "perceiver-pytorch PerceiverIO": "perceiver_pytorch",
}
FAST_TRANSFORMERS = "causal linear elu (fast-transformers)"
ATTENTION_CPU_CONTENDERS = [  # chunk 64: the decoder config's default
    "softmax (SDPA)", "softmax causal (SDPA)", "linear elu", "linear exp", "causal linear elu (chunked, c=64)",
    "causal linear elu, fixed decay (chunked)", "causal linear elu, gated decay (chunked)", "causal linear exp (chunked)",
    "causal linear exp, fixed decay (chunked)", "causal linear exp, gated decay (chunked)",
    "causal linear elu (naive cumsum)", FAST_TRANSFORMERS,
]
GENERATION_CONTENDERS = ["softmax", "linear", "softmax_static", "softmax_static_compiled", "linear_compiled"]
CONTENDERS_OF = {  # benchmark -> the contenders of its `--tiny` run on a CPU, in its order
    "bench_training": list(TRAINING_CONTENDERS),
    "bench_perceiver": list(PERCEIVER_CONTENDERS),
    "bench_attention": ATTENTION_CPU_CONTENDERS,
    "bench_generation": GENERATION_CONTENDERS[:2],
    "bench_crossover": ["softmax", "linear"],
    "bench_sets": ["SAB", "ISAB", "ISAB linear"],
}


def installed(package):
    return importlib.util.find_spec(package) is not None


def report_of(tmp_path, script):
    return json.loads((tmp_path / script.replace(".py", ".json")).read_text())


def table_line(stdout, first_cell):
    """The line of a printed Markdown table whose first cell is `first_cell`."""
    return next(line for line in stdout.splitlines() if line.startswith(f"| {first_cell} |"))


@pytest.mark.parametrize("benchmark", list(CONTENDERS_OF))
def test_each_benchmark_runs_every_contender_unless_told_and_refuses_one_it_lacks(benchmark, capsys):
    """`--contenders` chooses some, run in the benchmark's order; without it every one runs; a name the benchmark
    lacks is refused, listing its names."""
    bench = import_from("benchmarks", benchmark)
    names = CONTENDERS_OF[benchmark]
    assert bench.parse_args(["--tiny", "--device", "cpu"]).contenders == names
    assert bench.parse_args(["--tiny", "--device", "cpu", "--contenders", names[-1], names[0]]).contenders == [
        names[0], names[-1]]
    with pytest.raises(SystemExit) as refused:
        bench.parse_args(["--tiny", "--device", "cpu", "--contenders", names[0], "nope"])
    assert refused.value.code == 2
    assert (f"argument --contenders: invalid choice: 'nope' (choose from {', '.join(map(repr, names))})"
            in capsys.readouterr().err)


# ------------------------------------------------------------------------------------------------ bench_training.py

SOFTMAX_DECODER, GPT2 = "hfst decoder (softmax)", "transformers GPT2LMHeadModel"


def training_ids(args):
    return torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
def test_bench_training_tiny(tmp_path):
    """One contender end to end (our softmax decoder, without GPT-2): its table row and record, the plot."""
    stdout = run_script("bench_training.py", "--tiny", "--contenders", SOFTMAX_DECODER, "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_training.py")
    assert "| contender | parameters | ms/step | tokens/s | vs GPT-2 | GFLOP/step | achieved GFLOP/s | MFU |" in stdout
    assert "| GPT-2 not run |" in table_line(stdout, SOFTMAX_DECODER)
    [row] = report["rows"]
    assert row["contender"] == SOFTMAX_DECODER and row["status"] == "ok" and row["ratio_to_gpt2"] is None
    assert row["tokens_per_second"] > 0 and row["mfu"] > 0 and row["flops_per_step"] > 0
    assert report["matmul_flops_per_second"] > 0
    assert report["summary"]["hfst_softmax_over_gpt2_tokens_per_second"] is None
    assert (tmp_path / "bench_training.png").exists()


def test_bench_training_builds_its_contenders_alike_and_counts_their_flops():
    """What `--tiny` builds of each contender (untimed): a model of each installed package, GPT-2's parameters within
    10% of ours, and the FLOPs of a step: the same with GPT-2's activation (its elementwise work is not counted) and
    with the chunked loss (the output layer's three matmuls, in pieces)."""
    bench = import_from("benchmarks", "bench_training")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    built = bench.build_all(args, training_ids(args))
    assert list(built) == list(TRAINING_CONTENDERS)
    for name, package in TRAINING_CONTENDERS.items():
        assert (built[name] is None) == (not installed(package)), name
    counts = {name: entry[1] for name, entry in built.items() if entry is not None}
    assert all(c["parameters"] > 0 and c["flops_per_step"] > 0 for c in counts.values())
    ours, gpt2 = counts[SOFTMAX_DECODER]["parameters"], counts[GPT2]["parameters"]
    assert abs(ours - gpt2) <= 0.1 * gpt2
    flops = counts[SOFTMAX_DECODER]["flops_per_step"]
    assert counts["hfst decoder (softmax, gelu_new)"]["flops_per_step"] == flops
    assert counts["hfst decoder (softmax, chunked loss)"]["flops_per_step"] == flops


def test_bench_training_records_a_peer_that_is_not_installed_as_skipped(monkeypatch):
    bench = import_from("benchmarks", "bench_training")
    monkeypatch.setattr(bench, "optional_peer", lambda module: None)
    args = bench.parse_args(["--tiny", "--device", "cpu", "--contenders", GPT2, "x-transformers decoder"])
    built = bench.build_all(args, training_ids(args))
    assert built == {GPT2: None, "x-transformers decoder": None}
    rows = bench.result_rows(built, {}, 64, 1e9)
    assert rows == [{"contender": name, "status": "skipped (not installed)", "tokens_per_second": None,
                     "ratio_to_gpt2": None} for name in built]
    assert bench.table_rows(rows)[0] == [GPT2, "skipped (not installed)"] + ["-"] * 6
    assert bench.summarize(rows)[1] == []


def test_bench_training_mfu_ratios_and_summary_of_made_up_timings():
    bench = import_from("benchmarks", "bench_training")
    counts = {"parameters": 1_000, "attention": "sdpa", "flops_per_step": 4e9}
    names = [SOFTMAX_DECODER, "hfst decoder (linear elu)", GPT2]
    built = {name: (None, counts) for name in names}
    timings = {name: {"median_s": s, "samples_s": [s, 2 * s]} for name, s in zip(names, (0.5, 0.25, 1.0))}
    rows = bench.result_rows(built, timings, tokens=1_000, matmul=1e10)
    # 1,000 tokens in 0.5 s; 4 GFLOP in 0.5 s = 8 GFLOP/s, 80% of the matmul's 10; twice GPT-2's 1,000 tokens/s
    assert rows[0] == {"contender": SOFTMAX_DECODER, "status": "ok", **counts, "ms_per_step": 500.0,
                       "samples_s": [0.5, 1.0], "tokens_per_second": 2000.0, "achieved_flops_per_second": 8e9,
                       "mfu": pytest.approx(0.8), "ratio_to_gpt2": 2.0}
    assert [r["ratio_to_gpt2"] for r in rows] == [2.0, 4.0, 1.0]
    assert bench.table_rows(rows)[0] == [SOFTMAX_DECODER, "1,000", "500.0", "2,000", "2.00x", "4.00", "8.0", "80.0%"]
    summary, lines = bench.summarize(rows)
    assert summary == {"hfst_softmax_over_gpt2_tokens_per_second": 2.0, "target": 1.2,
                       "hfst_chunked_loss_over_gpt2_tokens_per_second": None,
                       "hfst_linear_elu_over_gpt2_tokens_per_second": 4.0,
                       "hfst_linear_exp_over_gpt2_tokens_per_second": None}
    assert lines == ["hfst decoder (softmax) / GPT-2 tokens/s = 2.00x (target >= 1.2x)",
                     "hfst decoder (linear elu) / GPT-2 tokens/s = 4.00x (target >= 1.5x on a GPU, bf16, 4096 tokens)"]
    # without GPT-2: no ratios, and the table says why
    alone = bench.result_rows({SOFTMAX_DECODER: built[SOFTMAX_DECODER]}, timings, 1_000, 1e10)
    assert alone[0]["ratio_to_gpt2"] is None and bench.table_rows(alone)[0][4] == "GPT-2 not run"
    assert bench.summarize(alone)[1] == []


# ------------------------------------------------------------------------------------------------ bench_perceiver.py

SOFTMAX_PERCEIVER, TRANSFORMERS_PERCEIVER = "hfst PerceiverIOModel (softmax)", "transformers PerceiverModel"


@pytest.mark.slow
def test_bench_perceiver_tiny(tmp_path):
    """One contender end to end (our softmax model, without transformers'): its table row and record, the sweep over
    input lengths, the plot."""
    stdout = run_script("bench_perceiver.py", "--tiny", "--contenders", SOFTMAX_PERCEIVER, "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_perceiver.py")
    assert "| contender | parameters | ms / step | examples/s | vs transformers | peak MiB |" in stdout
    assert "| transformers not run |" in table_line(stdout, SOFTMAX_PERCEIVER)
    assert f"{SOFTMAX_PERCEIVER} / {TRANSFORMERS_PERCEIVER}: not measured ({TRANSFORMERS_PERCEIVER} not run)" in stdout
    [(name, row)] = report["results"].items()
    assert name == SOFTMAX_PERCEIVER and "vs_transformers" not in row
    assert row["examples_per_s"] > 0 and row["median_s"] > 0 and row["parameters"] > 0 and row["peak_mib"] >= 0
    assert [r["length"] for r in report["sweep"]] == [32, 128]
    assert all(r[SOFTMAX_PERCEIVER]["examples_per_s"] > 0 for r in report["sweep"])
    assert (tmp_path / "bench_perceiver.png").stat().st_size > 1000


def test_bench_perceiver_builds_its_contenders_alike_and_steps_each():
    """What `--tiny` builds of each contender (untimed): a model of each installed package, each decoding the same
    queries at the same width and taking a step; ours within 15% of transformers' parameters."""
    bench = import_from("benchmarks", "bench_perceiver")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    built = bench.build_all(args)
    assert list(built) == list(PERCEIVER_CONTENDERS)
    x = bench.inputs(args, args.input_length)
    parameters = {}
    for name, package in PERCEIVER_CONTENDERS.items():
        if not installed(package):
            assert built[name] == "skipped (not installed)"
            continue
        model, forward = built[name]
        assert forward(x).shape == (args.batch_size, args.num_output_queries, args.d_latents), name
        bench.make_step(model, forward, x)()
        parameters[name] = sum(p.numel() for p in model.parameters())
    assert abs(parameters[SOFTMAX_PERCEIVER] / parameters[TRANSFORMERS_PERCEIVER] - 1) <= 0.15, parameters


def test_bench_perceiver_records_a_peer_that_is_not_installed_as_skipped(monkeypatch):
    bench = import_from("benchmarks", "bench_perceiver")
    monkeypatch.setattr(bench, "optional_peer", lambda module: None)
    args = bench.parse_args(["--tiny", "--device", "cpu", "--contenders", "perceiver-pytorch PerceiverIO"])
    built = bench.build_all(args)
    assert built == {"perceiver-pytorch PerceiverIO": "skipped (not installed)"}
    results = bench.records(built, {}, {}, args.batch_size)
    assert results == {"perceiver-pytorch PerceiverIO": {"skipped": "skipped (not installed)"}}
    assert bench.table_rows(results) == [["perceiver-pytorch PerceiverIO", "skipped (not installed)"] + ["-"] * 4]


def test_bench_perceiver_examples_per_second_and_ratios_of_made_up_timings():
    bench = import_from("benchmarks", "bench_perceiver")
    built = {SOFTMAX_PERCEIVER: ("model", "forward"), TRANSFORMERS_PERCEIVER: ("model", "forward"),
             "perceiver-pytorch PerceiverIO": "skipped (not installed)"}
    timings = {SOFTMAX_PERCEIVER: {"median_s": 0.25, "samples_s": [0.25]},
               TRANSFORMERS_PERCEIVER: {"median_s": 0.5, "samples_s": [0.5]}}
    results = bench.records(built, timings, {SOFTMAX_PERCEIVER: 2**20, TRANSFORMERS_PERCEIVER: 3 * 2**20}, 2)
    assert results[SOFTMAX_PERCEIVER] == {"median_s": 0.25, "samples_s": [0.25], "examples_per_s": 8.0,
                                          "peak_mib": 1.0, "vs_transformers": 2.0}
    assert results[TRANSFORMERS_PERCEIVER]["vs_transformers"] == 1.0
    assert results["perceiver-pytorch PerceiverIO"] == {"skipped": "skipped (not installed)"}
    for record in results.values():
        record["parameters"] = 1_000_000
    assert bench.table_rows(results)[0] == [SOFTMAX_PERCEIVER, "1.00M", "250", "8.00", "2.00x", "1.0"]
    sweep = [{"length": 32, SOFTMAX_PERCEIVER: {"vs_transformers": 1.0}},
             {"length": 128, SOFTMAX_PERCEIVER: {"vs_transformers": 3.0}}]
    assert bench.summarize(results, sweep) == (
        {"ours_over_transformers": 2.0, "target": 1.5, "median_ratio_over_lengths": 2.0},
        f"{SOFTMAX_PERCEIVER} / {TRANSFORMERS_PERCEIVER} = 2.00x (target >= 1.5x)")
    # without transformers' model: no ratio, and the table, the sweep's column and the summary say why
    alone = bench.records({SOFTMAX_PERCEIVER: built[SOFTMAX_PERCEIVER]}, timings, None, 2)
    assert alone == {SOFTMAX_PERCEIVER: {"median_s": 0.25, "samples_s": [0.25], "examples_per_s": 8.0}}
    assert bench.ratio_cell(alone, SOFTMAX_PERCEIVER) == "transformers not run"
    assert bench.summarize(alone, []) == (
        {"ours_over_transformers": None, "target": 1.5, "median_ratio_over_lengths": None},
        f"{SOFTMAX_PERCEIVER} / {TRANSFORMERS_PERCEIVER}: not measured ({TRANSFORMERS_PERCEIVER} not run)")


# ------------------------------------------------------------------------------------------------ bench_attention.py

CHUNKED = "causal linear elu (chunked, c=64)"


@pytest.mark.slow
def test_bench_attention_tiny(tmp_path):
    """One contender end to end (our linear elu kernel) and the chunk sweep: its table, its records, the plot."""
    stdout = run_script("bench_attention.py", "--tiny", "--contenders", "linear elu", "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_attention.py")
    assert "| n | linear elu |" in stdout
    assert report["complete"] is True and [r["length"] for r in report["rows"]] == [32, 64]
    for row in report["rows"]:
        assert set(row) == {"length", "linear elu"}
        cell = row["linear elu"]
        assert cell["ms"] > 0 and cell["peak_mib"] > 0 and cell["first_call_s"] > 0
    assert [s["length"] for s in report["chunk_sweep"]] == [64]
    assert set(report["chunk_sweep"][0]) == {"length", "8", "16"}
    assert (tmp_path / "bench_attention.png").exists()


def test_bench_attention_cpu_contenders_agree_with_the_reference_and_run_backward():
    """Every CPU contender of `--tiny` agrees with the fp32 PyTorch op (`check`; a wrong one stops the run) and runs a
    forward+backward; fast-transformers' kernel, where it is not installed, is skipped and says why."""
    bench = import_from("benchmarks", "bench_attention")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    table, skipped = bench.contenders(args)
    assert list(table) == ATTENTION_CPU_CONTENDERS
    assert (table[FAST_TRANSFORMERS] is None) == (not installed("fast_transformers"))
    assert skipped == {FAST_TRANSFORMERS: "not installed (pytorch-fast-transformers)"}
    active = {name: fn for name, fn in table.items() if fn is not None}
    assert bench.check(active, args) == {}
    qkv, grad = bench.inputs(args, 32)
    for name, fn in active.items():
        bench.forward_backward(fn, qkv, grad)()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in qkv), name


def test_bench_attention_names_the_gpu_contenders_without_a_gpu():
    """`--contenders` on CUDA checks its names before any GPU is touched: the same names the GPU's table has."""
    bench = import_from("benchmarks", "bench_attention")
    args = SimpleNamespace(cuda=True, device="cpu", dtype="bfloat16", head_dim=8, chunk_size=64)
    names = bench.contender_names(args)
    assert names == list(bench.gpu_contenders(args)[0])
    assert names[:2] == ["SDPA", "SDPA causal"] and "ours causal elu, gated decay (Triton)" in names
    assert names[-2:] == [bench.FLA, bench.FLA_GATED]


def test_bench_attention_records_each_length_and_summarizes_made_up_timings():
    bench = import_from("benchmarks", "bench_attention")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    naive, fixed = "causal linear elu (naive cumsum)", "causal linear elu, fixed decay (chunked)"
    table = [CHUNKED, FAST_TRANSFORMERS, naive, "linear elu"]
    row = bench.length_row(8192, table, {CHUNKED: {"median_s": 0.002}}, {CHUNKED: 3 * 2**20}, {CHUNKED: 0.5},
                           {"linear elu": "RuntimeError: no"}, {FAST_TRANSFORMERS: "not installed (x)"})
    assert row == {"length": 8192, CHUNKED: {"ms": 2.0, "peak_mib": 3.0, "first_call_s": 0.5},
                   FAST_TRANSFORMERS: {"skipped": "not installed (x)"},
                   naive: {"skipped": "longer than this contender's limit"}, "linear elu": {"failed": "RuntimeError: no"}}
    assert bench.table_rows([row], table) == [[8192, "2.0 ms, 3 MiB", "skipped", "skipped", "failed"]]
    # fast-transformers' kernel over the chunked one at 8192, the chunked one's memory to 16384, a decay's cost
    rows = [{"length": n, CHUNKED: {"ms": ms, "peak_mib": mib}, FAST_TRANSFORMERS: {"ms": 3.0 * n / 8192},
             fixed: {"ms": 1.25 * ms}} for n, ms, mib in ((8192, 2.0, 10.0), (16384, 4.0, 20.0))]
    summary = bench.summarize(rows, [CHUNKED, FAST_TRANSFORMERS, fixed], args)
    assert summary == {
        "fast_transformers_over_chunked_at_8192": 1.5, "chunked_peak_memory_16384_over_8192": 2.0,
        "elu_fixed_over_undecayed_at_8192": 1.25,
        "lines": ["fast-transformers / chunked time at 8192 = 1.50x (target >= 1, i.e. ours no slower)",
                  "chunked causal linear peak memory 16384 / 8192 = 2.00x (target <= 2.1x)",
                  "causal elu, fixed decay / undecayed time at 8192 = 1.25x"]}
    rows[0][FAST_TRANSFORMERS] = {"skipped": "not installed (pytorch-fast-transformers)"}
    lines = bench.summarize(rows, [CHUNKED, FAST_TRANSFORMERS, fixed], args)["lines"]
    assert lines[0] == "fast-transformers at 8192: not installed (pytorch-fast-transformers)"
    only_fixed = [{name: cell for name, cell in r.items() if name in ("length", fixed)} for r in rows]
    lines = bench.summarize(only_fixed, [fixed], args)["lines"]  # neither the plain chunked kernel nor the peer ran
    assert lines == [f"fast-transformers / chunked time at 8192: {FAST_TRANSFORMERS} not run"]


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
    monkeypatch.setattr(bench, "contender_names", lambda args: [*small, "peer"])
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


# ------------------------------------------------------------------------------------------------ bench_generation.py


@pytest.mark.slow
def test_bench_generation_tiny(tmp_path):
    """One contender end to end (linear attention's recurrent state) at every batch size x context of `--tiny`: its
    table rows and records; its state does not grow with the context."""
    stdout = run_script("bench_generation.py", "--tiny", "--contenders", "linear", "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_generation.py")
    assert "| batch | context | linear ms/step | softmax / linear | linear state MiB |" in stdout
    assert "| softmax not run |" in table_line(stdout, "1 | 64")
    assert report["contenders"] == ["linear"]
    assert {(r["batch"], r["context"]) for r in report["rows"]} == {(1, 16), (1, 64), (2, 16), (2, 64)}
    for row in report["rows"]:
        assert set(row) == {"batch", "context", "linear"}
        assert row["linear"]["ms_per_token"] > 0 and row["linear"]["cache_mib"] > 0
    by_context = {r["context"]: r for r in report["rows"] if r["batch"] == 1}
    assert by_context[64]["linear"]["cache_mib"] == by_context[16]["linear"]["cache_mib"]
    assert set(report["summary"]) == {"batch 1", "batch 2"}
    assert report["summary"]["batch 1"]["softmax_over_linear_at_longest"] is None
    assert (tmp_path / "bench_generation.png").exists()


@pytest.mark.slow
def test_bench_generation_compiled_steps_and_profile(tmp_path):
    """`--compile`'s two contenders end to end at one point, compiled by dynamo's eager backend here (no code
    generation on the test machine), each on its fixed-shape cache; `--profile` writes a profiler table of each."""
    names = ["softmax_static_compiled", "linear_compiled"]
    flags = ["--cache", "static", "--compile", "--compile_backend", "eager", "--profile", "--batch_sizes", "1",
             "--contexts", "16", "--contenders", *names]
    stdout = run_script("bench_generation.py", "--tiny", *flags, "--output_dir", tmp_path)
    assert "| batch | context | softmax_static_compiled ms/step | linear_compiled ms/step | softmax / linear |" in stdout
    report = report_of(tmp_path, "bench_generation.py")
    assert report["contenders"] == names and len(report["rows"]) == 1
    row = report["rows"][0]
    assert all(row[n]["ms_per_token"] > 0 and row[n]["cache_mib"] > 0 for n in names)
    profile = (tmp_path / "bench_generation_profile.txt").read_text()
    assert all(f"## {n}, batch 1, context 16: 2 steps" in profile for n in names)
    assert "decode_step" in profile


def test_bench_generation_contenders_and_their_columns():
    """`--cache static` and `--compile` add their contenders to the same table, a time column each; the default's
    header is as it was."""
    bench = import_from("benchmarks", "bench_generation")
    args = bench.parse_args(["--tiny", "--device", "cpu", "--cache", "static", "--compile"])
    assert args.contenders == GENERATION_CONTENDERS
    assert bench.table_header(GENERATION_CONTENDERS).split("\n")[0] == (
        "| batch | context | " + " | ".join(f"{n} ms/step" for n in GENERATION_CONTENDERS)
        + " | softmax / linear | softmax cache MiB | linear state MiB | softmax_static cache MiB |")
    assert bench.table_header(["softmax", "linear"]) == (
        "| batch | context | softmax ms/step | linear ms/step | softmax / linear | softmax cache MiB | linear state MiB |"
        "\n|---|---|---|---|---|---|---|")


def test_bench_generation_what_each_contenders_cache_holds():
    """After a context (untimed): softmax's keys and values grow with it, linear's state does not; the static cache
    holds buffers for every step to come, the in-place state of `linear_compiled` is the size of linear's; an eager
    step adds one position to softmax's cache and nothing to linear's state; `--profile`'s table of each eager one."""
    bench = import_from("benchmarks", "bench_generation")
    args = bench.parse_args(["--tiny", "--device", "cpu", "--cache", "static", "--compile"])
    chosen = bench.contenders(args)
    assert chosen["softmax_static_compiled"].model is chosen["softmax"].model  # one model per attention
    nbytes, caches = {}, {}
    for context in (16, 64):
        ids = torch.randint(0, args.vocab_size, (1, context), generator=torch.Generator().manual_seed(context))
        for name, contender in chosen.items():
            caches[name] = bench.prefill(contender.model, ids, args.prefill_chunk, contender.new_cache(args, 1, context))
            nbytes[name, context] = bench.cache_nbytes(caches[name][0])
    assert nbytes["softmax", 64] == 4 * nbytes["softmax", 16] > 0
    assert nbytes["linear", 64] == nbytes["linear", 16] > 0
    assert nbytes["softmax_static", 64] > nbytes["softmax", 64]
    assert nbytes["linear_compiled", 64] == nbytes["linear", 64]
    for name, grown in (("softmax", 65 / 64), ("linear", 1), ("softmax_static", 1)):
        chosen[name].start(args)
        _, token, cache = bench.step(chosen[name], caches[name][1], caches[name][0], "cpu")
        assert bench.cache_nbytes(cache) == grown * nbytes[name, 64], name
        profile = bench.profile_steps(args, name, chosen[name], {"token": token, "cache": cache}, "context 64")
        assert profile.startswith(f"## {name}, context 64: 2 steps") and "decode_step" in profile


def test_bench_generation_table_and_summary_of_made_up_timings():
    bench = import_from("benchmarks", "bench_generation")
    args = bench.parse_args(["--tiny", "--device", "cpu", "--batch_sizes", "1"])  # contexts 16 and 64

    def record(ms, mib):
        return {"ms_per_token": ms, "cache_mib": mib, "step_peak_mib": None}

    rows = [{"batch": 1, "context": 16, "softmax": record(2.0, 0.5), "linear": record(1.0, 0.125)},
            {"batch": 1, "context": 64, "softmax": record(6.0, 2.0), "linear": record(1.5, 0.125)}]
    assert bench.table_line(1, 64, {n: rows[1][n] for n in ("softmax", "linear")}) == (
        "| 1 | 64 | 6.00 | 1.50 | 4.0x | 2.00 | 0.125 |")
    assert bench.summarize(rows, args) == (
        {"batch 1": {"linear_latency_ratio_longest_vs_shortest": 1.5, "softmax_over_linear_at_longest": 4.0}},
        ["batch 1: linear ms/step at 64 / at 16 = 1.50x (target <= 1.2x); softmax / linear at 64 = 4.0x "
         "(target >= 5x)"])
    # linear alone: no ratio to softmax, and the table and the summary say why
    alone = [{name: value for name, value in r.items() if name != "softmax"} for r in rows]
    assert bench.table_line(1, 64, {"linear": alone[1]["linear"]}) == "| 1 | 64 | 1.50 | softmax not run | 0.125 |"
    assert bench.summarize(alone, args) == (
        {"batch 1": {"linear_latency_ratio_longest_vs_shortest": 1.5, "softmax_over_linear_at_longest": None}},
        ["batch 1: linear ms/step at 64 / at 16 = 1.50x (target <= 1.2x); softmax / linear at 64 = softmax not run"])


# ------------------------------------------------------------------------------------------------ bench_crossover.py


@pytest.mark.slow
def test_bench_crossover_tiny(tmp_path):
    """One contender end to end (the linear decoder) in the three modes at every length of `--tiny`: its table, its
    records, a summary that says the crossover needs softmax, the plot."""
    stdout = run_script("bench_crossover.py", "--tiny", "--contenders", "linear", "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_crossover.py")
    assert ("| n | forward linear ms | softmax / linear | training step linear ms | softmax / linear | generation "
            "linear ms | softmax / linear |") in stdout
    assert [r["length"] for r in report["rows"]] == [16, 32, 64]
    for row in report["rows"]:
        for mode in ("forward", "training step", "generation"):
            assert set(row[mode]) == {"linear"} and row[mode]["linear"] > 0
    assert set(report["crossover"]) == {"forward", "training step", "generation"}
    assert all(c["not_run"] == "softmax" for c in report["crossover"].values())
    assert (tmp_path / "bench_crossover.png").exists()


def test_bench_crossover_models_differ_only_in_attention_and_run_each_mode():
    bench = import_from("benchmarks", "bench_crossover")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    models = {name: bench.build(args, name) for name in args.contenders}
    assert len({sum(p.numel() for p in model.parameters()) for model in models.values()}) == 1
    ids = torch.randint(0, args.vocab_size, (args.batch_size, 16), generator=torch.Generator().manual_seed(0))
    for name, model in models.items():
        tasks = bench.tasks(model, ids, args)
        assert list(tasks) == list(bench.MODES)
        for task in tasks.values():
            task()


def test_bench_crossover_table_and_summary_of_made_up_timings():
    bench = import_from("benchmarks", "bench_crossover")
    # softmax / linear = 0.5 at 16, 2 at 32: linear faster from 32, the ratio crossing 1 at 16 * sqrt(2) (log-log)
    rows = [{"length": n, **{mode: {"softmax": ms, "linear": 2.0} for mode in bench.MODES}}
            for n, ms in ((16, 1.0), (32, 4.0))]
    header, cells = bench.table(rows, ["softmax", "linear"])
    assert header == ["n", "forward softmax ms", "forward linear ms", "softmax / linear", "training step softmax ms",
                      "training step linear ms", "softmax / linear", "generation softmax ms", "generation linear ms",
                      "softmax / linear"]
    assert cells[1] == [32] + ["4.00", "2.00", "2.00x"] * 3
    summary, lines = bench.summarize([16, 32], rows, ["softmax", "linear"])
    assert summary["forward"] == {"first_faster_length": 32, "interpolated_crossover": pytest.approx(16 * 2**0.5)}
    assert lines[0] == "forward: linear faster from n = 32 on (ratio crosses 1 near n = 23)"
    # linear alone: no crossover, and the table and the summary say why
    alone = [{"length": r["length"], **{mode: {"linear": 2.0} for mode in bench.MODES}} for r in rows]
    header, cells = bench.table(alone, ["linear"])
    assert header[:3] == ["n", "forward linear ms", "softmax / linear"]
    assert cells[0] == [16] + ["2.00", "softmax not run"] * 3
    summary, lines = bench.summarize([16, 32], alone, ["linear"])
    assert summary == {mode: {"first_faster_length": None, "interpolated_crossover": None, "not_run": "softmax"}
                       for mode in bench.MODES}
    assert lines == [f"{mode}: no crossover (softmax not run)" for mode in bench.MODES]


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


# ------------------------------------------------------------------------------------------------ bench_sets.py


@pytest.mark.slow
def test_bench_sets_tiny(tmp_path):
    """One contender end to end (SAB) at both set sizes of `--tiny`: its table rows and records, the plot."""
    stdout = run_script("bench_sets.py", "--tiny", "--contenders", "SAB", "--output_dir", tmp_path)
    report = report_of(tmp_path, "bench_sets.py")
    assert "| set size | SAB ms | SAB / ISAB | SAB MiB |" in stdout
    assert "| ISAB not run |" in table_line(stdout, 128)
    rows = {r["size"]: r for r in report["rows"]}
    assert set(rows) == {32, 128}
    assert "hidden 32, feed-forward 32," in report["setup"]  # the set models' width: rFF as wide as the hidden size
    for row in rows.values():
        assert set(row) == {"size", "SAB"} and row["SAB"]["ms"] > 0 and row["SAB"]["saved_mib"] > 0
    assert rows[128]["SAB"]["saved_mib"] > rows[32]["SAB"]["saved_mib"]
    assert (tmp_path / "bench_sets.png").exists()


def test_bench_sets_what_each_contender_keeps_for_backward():
    """Every contender's forward+backward keeps tensors for the backward (untimed); what SAB keeps grows faster with
    the set than what ISAB keeps (its n x n attention against n x m)."""
    bench = import_from("benchmarks", "bench_sets")
    args = bench.parse_args(["--tiny", "--device", "cpu"])
    models = {name: bench.build(args, bench.CONTENDERS[name]) for name in args.contenders}
    saved = {}
    for size in (32, 128):
        g = torch.Generator().manual_seed(size)
        x = torch.randn(args.batch_size, size, args.input_size, generator=g)
        labels = torch.randint(0, 10, (args.batch_size,), generator=g)
        for name, model in models.items():
            saved[name, size] = bench.one_pass(model, x, labels, "cpu")[1]
    assert all(nbytes > 0 for nbytes in saved.values())
    assert saved["SAB", 128] / saved["SAB", 32] > saved["ISAB", 128] / saved["ISAB", 32]


def test_bench_sets_table_of_made_up_timings():
    bench = import_from("benchmarks", "bench_sets")
    names = ["SAB", "ISAB", "ISAB linear"]
    assert bench.table_header(names) == (
        "| set size | SAB ms | ISAB ms | ISAB linear ms | SAB / ISAB | SAB MiB | ISAB MiB | ISAB linear MiB |\n"
        "|---|---|---|---|---|---|---|---|")
    memory = {name: {"saved_mib": mib, "cuda_peak_mib": None} for name, mib in zip(names, (4.0, 1.0, 0.5))}
    row = bench.size_row(128, names, {"SAB": [0.004, 0.006, 0.1], "ISAB": [0.002], "ISAB linear": [0.001]}, memory)
    assert row["SAB"] == {"ms": pytest.approx(6.0), "saved_mib": 4.0, "cuda_peak_mib": None}
    assert bench.table_line(row, names) == "| 128 | 6.0 | 2.0 | 1.0 | 3.0x | 4.0 | 1.0 | 0.5 |"
    # SAB past --sab_max at this size
    big = bench.size_row(256, names, {"ISAB": [0.002], "ISAB linear": [0.001]}, memory)
    assert big["SAB"] is None
    assert bench.table_line(big, names) == "| 256 | skipped | 2.0 | 1.0 | - | skipped | 1.0 | 0.5 |"
    # SAB alone: no ratio, and the table says why
    alone = bench.size_row(128, ["SAB"], {"SAB": [0.004]}, memory)
    assert bench.table_line(alone, ["SAB"]) == "| 128 | 4.0 | ISAB not run | 4.0 |"


@pytest.mark.slow
def test_bench_sets_variable_tiny(tmp_path):
    """`--variable --tiny` end to end, one contender: its table row (padded and packed steps, their ratios) and record."""
    stdout = run_script("bench_sets.py", "--variable", "--tiny", "--contenders", "Perceiver IO linear", "--output_dir",
                        tmp_path)
    assert "| model | padded ms | packed ms | speed-up | padded MiB | packed MiB |" in stdout
    assert table_line(stdout, "Perceiver IO linear").endswith("| - |")  # no CUDA peak on a CPU
    report = json.loads((tmp_path / "bench_sets_variable.json").read_text())
    assert list(report["rows"]) == ["Perceiver IO linear"] and len(report["sizes"]) == 6
    for form in ("padded", "packed"):
        assert report["rows"]["Perceiver IO linear"][form]["ms"] > 0


def test_bench_sets_variable_sizes_vary_eightfold_and_packed_keeps_less_for_backward():
    """The full-size draw: 32 sets from 50 to 4,000 points, max / mean >= 8. At `--tiny` size, every contender's packed
    step keeps less for the backward than its padded one (untimed), and takes the same batch of sets."""
    bench = import_from("benchmarks", "bench_sets")
    sizes = bench.variable_sizes(bench.parse_args(["--variable", "--device", "cpu"]))
    assert len(sizes) == 32 and min(sizes) >= 50 and max(sizes) == 4000
    assert max(sizes) / (sum(sizes) / len(sizes)) >= 8
    args = bench.parse_args(["--variable", "--tiny", "--device", "cpu"])
    assert args.contenders == list(bench.VARIABLE_CONTENDERS)
    padded, packed = bench.variable_batches(args, bench.variable_sizes(args))
    assert packed["input_features"].shape[1] == padded["attention_mask"].sum() and torch.equal(
        packed["labels"], padded["labels"])
    for name in args.contenders:
        model = bench.build_variable(args, name)
        assert bench.one_step(model, packed, "cpu")[1] < bench.one_step(model, padded, "cpu")[1], name


def test_bench_sets_variable_table_of_made_up_timings():
    bench = import_from("benchmarks", "bench_sets")
    row = {"padded": {"ms": 300.0, "saved_mib": 80.0, "cuda_peak_mib": None},
           "packed": {"ms": 60.0, "saved_mib": 20.0, "cuda_peak_mib": None}}
    assert bench.variable_line("ISAB", row) == "| ISAB | 300.0 | 60.0 | 5.0x | 80.0 | 20.0 | 0.25x | - |"
    row["padded"]["cuda_peak_mib"], row["packed"]["cuda_peak_mib"] = 512.0, 100.4
    assert bench.variable_line("ISAB", row).endswith("| 0.25x | 512 / 100 |")


def test_peak_memory_counts_what_the_call_allocates():
    peak_memory_bytes = import_from("benchmarks", "bench_common").peak_memory_bytes

    held = []
    peak = peak_memory_bytes(lambda: held.append(torch.ones(1_000_000) * 2), "cpu")  # two 4 MB tensors at once
    assert 8_000_000 <= peak < 9_000_000
    assert peak_memory_bytes(lambda: None, "cpu") == 0


# ------------------------------------------------------------------------------------------------ bench_lm_step.py


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
@pytest.mark.parametrize("task", ["point_clouds", "mixture_of_gaussians"])
def test_train_sets_packing_trains_as_padded_batches_do(tmp_path, task):
    """The same sets, seed and steps: packed batches give the padded run's losses and metric (fp32, no dropout)."""
    common = ["--task", task, "--max_steps", 4, "--hidden_size", 16, "--logging_steps", 1, "--min_size", 5,
              "--max_size", 60, "--num_inducing_points", 4]
    run_train_sets(tmp_path / "padded", *common)
    run_train_sets(tmp_path / "packed", *common, "--packing", "true")
    runs = {name: json.loads((tmp_path / name / "all_results.json").read_text()) for name in ("padded", "packed")}
    assert runs["packed"]["packing"] is True and runs["padded"]["packing"] is False
    losses = {name: [e["loss"] for e in json.loads((tmp_path / name / "trainer_state.json").read_text())[
        "log_history"] if "loss" in e] for name in runs}
    assert len(losses["packed"]) == 4 and losses["packed"] == pytest.approx(losses["padded"], rel=1e-4)
    metric = set_objective(task).metric[0]
    assert runs["packed"][metric] == pytest.approx(runs["padded"][metric], rel=1e-4)


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


def test_the_methods_search_runs_each_method_with_its_flags_in_a_folder_of_its_own(tmp_path):
    """scripts/wikitext2_methods.sh through the grid script, its launcher replaced by `echo`: the train_lm.py command
    of each method (no training)."""
    env = {**os.environ, "HFST_LAUNCH": "echo", "HFST_SEED": "1"}
    plain = ["--optimizer adamw", "--lr_scheduler_type cosine", "--average_weights none", "tie_adaptive_weights=false"]
    methods = {"base": plain, "muon": ["--optimizer muon", *plain[1:]], "tied": [*plain[:3], "tie_adaptive_weights=true"],
               "wsd": ["--lr_scheduler_type warmup_stable_decay --decay_fraction 0.2", plain[0], *plain[2:]],
               "average": ["--average_weights last --average_fraction 0.2", *plain[:2], plain[3]],
               "context256": [*plain, "--block_size 256"],
               "deep": [*plain[:3], "--config_overrides tie_adaptive_weights=false,num_hidden_layers=8"],
               "combined": ["--optimizer muon", "tie_adaptive_weights=true", "--lr_scheduler_type warmup_stable_decay "
                            "--decay_fraction 0.2", "--average_weights last"]}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "wikitext2_methods.sh"), str(tmp_path),
                             "decoder-linear-elu-gated", *methods], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    commands = result.stdout.strip().splitlines()
    assert len(commands) == len(methods)
    for command, (method, flags) in zip(commands, methods.items()):
        assert f"--output_dir {tmp_path}/{method}-seed1/decoder-linear-elu-gated" in command and "--seed 1" in command
        assert "--linear_attention_decay gated" in command and "--max_train_minutes 90" in command
        assert all(flag in command for flag in flags), (method, command)
    assert "muon" not in commands[0] and "warmup_stable_decay" not in commands[0]  # the plain training, spelled out
    unknown = subprocess.run(["bash", str(ROOT / "scripts" / "wikitext2_methods.sh"), str(tmp_path), "decoder-softmax",
                              "adam"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert unknown.returncode == 2 and "unknown method: adam" in unknown.stderr

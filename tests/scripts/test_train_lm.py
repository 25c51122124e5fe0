"""scripts/train_lm.py end to end (tiny presets): a run for every family and the masked-LM objective, two-process
data parallelism with accelerate, kill-and-resume, a push to a Hub double, the README's command and bad flags. The
package pieces it calls are tested in test_language_modeling.py and test_training.py."""

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import hf_settransformer
from hf_settransformer import toolkit
from hf_settransformer.toolkit import lm_arguments
from hf_settransformer.toolkit.checkpoint_files import COMPLETE_MARKER
from tests.helpers import ROOT, common_args, free_port, write_corpus

SCRIPT = ROOT / "scripts" / "train_lm.py"



@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def run(args, env=None, timeout=300, launcher=None):
    command = (launcher or [sys.executable]) + [str(SCRIPT)] + [str(a) for a in args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


# ------------------------------------------------------------------------------------------------ runs


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder", "encoder", "set_transformer", "perceiver_io"])
def test_tiny_run_for_every_family(tmp_path, corpus, family):
    attention = {"decoder": "linear", "encoder": "softmax", "set_transformer": "linear", "perceiver_io": "softmax"}
    out = tmp_path / family
    result = run(
        common_args(
            corpus,
            out,
            family,
            steps=20,
            extra=[
                "--attention_type",
                attention[family],
                "--eval_strategy",
                "steps",
                "--eval_steps",
                10,
                "--per_device_train_batch_size",
                16,
                "--logging_steps",
                1,
            ],
        )
    )
    results = json.loads((out / "all_results.json").read_text())
    # --precision auto: bf16 autocast where the CPU has a fast bf16 path, fp32 elsewhere; recorded as it ran
    fast_bf16 = any(flag in Path("/proc/cpuinfo").read_text() for flag in ("avx512_bf16", "amx_bf16"))
    assert results["precision"] == ("bf16" if fast_bf16 else "fp32")
    assert f"{results['precision']}, 1 threads" in result.stdout or f"{results['precision']}, " in result.stdout
    for key in (
        "train_perplexity",
        "validation_perplexity",
        "test_perplexity",
        "train_tokens_per_wall_second",
        "train_tokens_per_cpu_second",
        "train_wall_seconds",
        "train_cpu_minutes",
        "parameters",
        "wall_time_seconds",
        "validation_wall_seconds",
        "test_wall_seconds",
        "validation_accuracy",
        "test_accuracy",
        "validation_cpu_seconds",
        "test_cpu_seconds",
    ):
        assert key in results and math.isfinite(results[key]), key
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert results["validation_perplexity"] < vocab  # better than guessing uniformly
    # the sizes and hyper-parameters the run trained with, as a tuning table compares them (tiny preset)
    hyper = results["hyperparameters"]
    assert (hyper["hidden_size"], hyper["layers"], hyper["sequence_length"]) == (32, 2, 16)
    assert (hyper["examples_per_step"], hyper["learning_rate"], hyper["dropout"]) == (16, 3e-3, 0.1)
    assert hyper["target_length"] == (None if family == "decoder" else 8)
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert sum(losses[-10:]) / 10 < losses[0]  # the first step's loss vs the last ten
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation")
    assert f"{results['test_perplexity']:.2f}" in card and "scripts/train_lm.py" in card
    assert (out / "tokenizer.json").exists() and (out / "model.safetensors").exists()
    assert [point["step"] for point in results["validation_curve"]] == [10, 20]
    # model FLOPs of the saved model at the run's sequence length; on a CPU no MFU, and why
    from transformers import AutoModelForCausalLM

    flops, formula = toolkit.language_modeling.lm_flops_per_token(AutoModelForCausalLM.from_pretrained(out), 16)
    assert results["model_flops_per_token"] == flops > 0 and results["model_flops_formula"] == formula
    assert results["train_model_flops_per_wall_second"] == pytest.approx(results["train_tokens_per_wall_second"] * flops)
    # every duration and speed names its clock, alike in all_results.json, the printed table and the card
    old = {"train_seconds", "train_seconds_whole_run", "train_tokens_per_second", "validation_seconds", "test_seconds"}
    assert not old & set(results) and results["train_cpu_seconds_whole_run"] > 0
    for key in ("train_tokens_per_wall_second", "train_tokens_per_cpu_second", "train_wall_seconds",
                "train_cpu_minutes"):
        assert f"| {key} " in result.stdout, key
    speeds = (f"{results['train_tokens_per_cpu_second']:,.0f} tokens per CPU-second; "
              f"{results['train_tokens_per_wall_second']:,.0f} tokens per wall second")
    assert f"| training speed | {speeds} on " in card
    assert results["mfu"] is None and results["mfu_note"] == "no peak table for CPUs"
    assert results["gpu_name"] is None and results["preset"] == "tiny"
    assert "| model FLOPs |" in card and "MFU not measured: no peak table for CPUs" in card
    # with --disable_tqdm (no progress bars) the final evaluation says what it is doing and prints as it goes
    assert "[train_lm] evaluating validation:" in result.stdout and "[train_lm] evaluating test:" in result.stdout
    assert f"[train_lm] test perplexity {results['test_perplexity']:.2f}" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("family,objective", [("decoder", []), ("encoder", ["--objective", "mlm"])])
def test_packing_trains_on_the_lines_and_the_card_says_so(tmp_path, corpus, family, objective):
    out = tmp_path / "packed"
    run(common_args(corpus, out, family, steps=6, extra=["--attention_type", "linear", "--packing", "true", *objective]))
    results = json.loads((out / "all_results.json").read_text())
    assert results["packing"] is True and results["train_steps"] == 6
    assert math.isfinite(results["test_perplexity"]) and math.isfinite(results["train_loss"])
    assert "packed (train_lm.py --packing): each line a sequence of its own" in (out / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "perceiver_io"])
def test_masked_lm_objective_trains_and_fills_masks(tmp_path, corpus, family):
    """--objective mlm: the family's *ForMaskedLM head trains on masked blocks (the loss falls), is evaluated on fixed
    masked positions (masked-token perplexity below the vocabulary size), writes a fill-mask model card, and the
    saved folder works in transformers' fill-mask pipeline through remote code."""
    from transformers import pipeline

    out = tmp_path / family
    run(common_args(corpus, out, family, steps=100, extra=["--objective", "mlm", "--logging_steps", 1]))
    results = json.loads((out / "all_results.json").read_text())
    assert results["objective"] == "mlm" and "masked" in results["eval_protocol"]
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    assert results["validation_perplexity"] < 0.9 * vocab and results["validation_tokens_scored"] > 0  # learns
    losses = [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert sum(losses[-10:]) / 10 < losses[0]
    assert (out / "README.md").read_text().startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask")
    fill = pipeline("fill-mask", model=str(out), trust_remote_code=True)
    assert fill.model.__class__.__name__.endswith("ForMaskedLM")
    answers = fill("the of and <mask> to a")
    assert len(answers) == 5 and all(a["sequence"].split()[3] == a["token_str"].strip() for a in answers)
    # the card written again from the folder (lm_results.py --refresh_cards) is the one the run wrote
    assert results["mlm_probability"] == 0.15 and results["command"].startswith("python scripts/train_lm.py")
    card = (out / "README.md").read_text()
    assert toolkit.refresh_model_card(out).read_text() == card


@pytest.mark.slow
def test_offline_dataset_gives_a_clear_message(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--do_train", "--output_dir", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode != 0
    assert "--train_file" in result.stderr and "--validation_file" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_two_process_data_parallel_run(tmp_path, corpus):
    out = tmp_path / "ddp"
    # accelerate 1.15: --cpu would start one process; --multi_gpu starts two (torchrun), the script puts them on CPUs
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    result = run(common_args(corpus, out, "decoder", steps=20), launcher=launcher, timeout=400)
    results = json.loads((out / "all_results.json").read_text())
    assert len(results["replica_checksums"]) == 2
    assert results["replica_checksums"][0] == results["replica_checksums"][1]  # both processes hold one model
    assert results["device"].endswith("x 2")
    state = json.loads((out / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert losses[-1] < losses[0], losses
    assert "[train_lm]" in result.stdout


@pytest.mark.slow
def test_two_process_run_with_muon_a_fitted_decay_and_an_average(tmp_path, corpus):
    """Data parallel: both replicas step Muon on the same all-reduced gradients and keep the same average, so they
    end holding one model, the average."""
    out = tmp_path / "ddp"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    methods = ["--optimizer", "muon", "--lr_scheduler_type", "warmup_stable_decay", "--average_weights", "ema",
               "--ema_decay", "0.5"]
    run(common_args(corpus, out, "decoder", steps=10, extra=methods), launcher=launcher, timeout=400)
    results = json.loads((out / "all_results.json").read_text())
    assert len(results["replica_checksums"]) == 2
    assert results["replica_checksums"][0] == results["replica_checksums"][1]
    assert results["hyperparameters"]["decay_fraction"] == 0.2 and results["averaged_steps"] == 2
    assert results["averaged_weights_applied"] and results["device"].endswith("x 2")


@pytest.mark.slow
def test_sigkill_and_resume_equals_an_uninterrupted_run(tmp_path, corpus):
    extra = ["--save_strategy", "steps", "--save_steps", 4, "--save_total_limit", 5, "--max_eval_tokens", 200]
    extra += ["--eval_strategy", "steps", "--eval_steps", 4, "--logging_steps", 1]
    straight = tmp_path / "straight"
    run(common_args(corpus, straight, "decoder", steps=16, extra=extra))

    killed = tmp_path / "killed"
    args = common_args(corpus, killed, "decoder", steps=16, extra=extra)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT)] + [str(a) for a in args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 200
    while not (killed / "checkpoint-8" / COMPLETE_MARKER).exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before checkpoint-8"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "all_results.json").exists()
    # a checkpoint the kill left half-written must not be resumed from
    half = killed / "checkpoint-100"
    half.mkdir(exist_ok=True)
    (half / "model.safetensors").write_bytes(b"partial")
    result = run(args + ["--resume_from_checkpoint", "true"])
    assert "never completely written" in result.stdout and (killed / "incomplete-checkpoint-100").is_dir()

    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ra, rb = (json.loads((d / "all_results.json").read_text()) for d in (straight, killed))
    assert ra["validation_perplexity"] == rb["validation_perplexity"]
    assert ra["test_perplexity"] == rb["test_perplexity"]
    # --max_eval_tokens 200: the results and the card say how many of each split's tokens were scored
    assert ra["validation_tokens_evaluated"] == ra["validation_tokens_scored"] == 200 < ra["validation_split_tokens"]
    assert (f"200 tokens of the first 200 of the split's {ra['validation_split_tokens']:,} (`--max_eval_tokens`)"
            in (straight / "README.md").read_text())
    # the resumed run's training time and validation curve include the part before the kill
    assert ra["resumed_from_step"] is None and rb["resumed_from_step"] >= 8
    # the CPU time the checkpoint's marker recorded is carried into the whole run's
    before = json.loads((killed / f"checkpoint-{rb['resumed_from_step']}" / COMPLETE_MARKER).read_text())
    assert before["clock"] == "cpu" and rb["train_cpu_seconds_whole_run"] > before["train_seconds"] > 0
    # on CPU the budget clock is this process's CPU time (a 1-thread run: CPU-minutes are its CPU time)
    assert ra["budget_clock"] == rb["budget_clock"] == "cpu"
    assert rb["train_cpu_minutes"] == pytest.approx(rb["train_cpu_seconds_whole_run"] / 60)
    # the training loss averages the whole run (logged every step here), not only the steps after the resume
    assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-5)
    assert [p["step"] for p in rb["validation_curve"]] == [p["step"] for p in ra["validation_curve"]] == [4, 8, 12, 16]
    assert [p["eval_loss"] for p in rb["validation_curve"]] == [p["eval_loss"] for p in ra["validation_curve"]]
    # the model card's wall time is the last process's, and says so
    assert f"(the last process: resumed at step {rb['resumed_from_step']:,})" in (killed / "README.md").read_text()


@pytest.mark.slow
def test_resume_from_the_final_checkpoint_only_evaluates(tmp_path, corpus):
    """A run stopped after its last checkpoint (during the final evaluation, say) and restarted trains no further step:
    same weights, same step count, same perplexities."""
    out = tmp_path / "run"
    args = common_args(corpus, out, "decoder", steps=8, extra=["--save_strategy", "steps", "--save_steps", 4])
    run(args)
    first = json.loads((out / "all_results.json").read_text())
    weights = load_file(out / "model.safetensors")
    result = run(args + ["--resume_from_checkpoint", "true"])
    again = json.loads((out / "all_results.json").read_text())
    assert again["resumed_from_step"] == 8 and again["train_steps"] == 8, result.stdout[-2000:]
    resumed = load_file(out / "model.safetensors")
    for name in weights:
        assert torch.equal(weights[name], resumed[name]), name
    assert again["test_perplexity"] == first["test_perplexity"]


@pytest.mark.slow
def test_muon_a_fitted_decay_and_a_weight_average_train_and_resume(tmp_path, corpus):
    """--optimizer muon, --lr_scheduler_type warmup_stable_decay --decay_fraction and --average_weights last in one
    tiny run: all_results.json and the card record them, the saved model is the final checkpoint's average (not its
    last weights), a restart after the last checkpoint evaluates that same average, and a resume with another
    optimizer is refused."""
    out = tmp_path / "run"
    methods = ["--optimizer", "muon", "--lr_scheduler_type", "warmup_stable_decay", "--decay_fraction", "0.5",
               "--average_weights", "last", "--save_strategy", "steps", "--save_steps", 5, "--logging_steps", 1]
    args = common_args(corpus, out, "decoder", steps=10, extra=methods)
    run(args)
    results = json.loads((out / "all_results.json").read_text())
    hyper = results["hyperparameters"]
    assert (hyper["optimizer"], hyper["muon_adjust_lr_fn"], hyper["decay_fraction"]) == ("muon", "match_rms_adamw", 0.5)
    assert hyper["muon_parameters"] > 0 and hyper["lr_scheduler_type"] == "warmup_stable_decay"
    assert hyper["seed"] == 0 and results["tie_adaptive_weights"] is False  # common_args' --seed 0; untied
    assert (results["average_weights"], results["averaged_steps"], results["averaged_from_step"]) == ("last", 5, 6)
    assert results["averaged_weights_applied"] and results["selected_by"] == "last weight average"
    state = json.loads((out / "trainer_state.json").read_text())
    lrs = {e["step"]: e["learning_rate"] for e in state["log_history"] if "learning_rate" in e}
    assert lrs[6] == 3e-3 > lrs[7] > lrs[10] > 0  # the decay: steps 5 to 10 of the planned 10
    card = (out / "README.md").read_text()
    assert "Muon for the attention and feed-forward weight matrices" in card
    assert "the last 50% of the 10 planned steps decay" in card and "the mean of the weights after steps 6 to 10" in card
    saved, average = load_file(out / "model.safetensors"), load_file(out / "checkpoint-10" / "weight_average.safetensors")
    last = load_file(out / "checkpoint-10" / "model.safetensors")
    assert set(average) <= set(saved)
    assert all(torch.equal(saved[name], average[name]) for name in average)
    assert not all(torch.equal(saved[name], last[name]) for name in average)

    again = run(args + ["--resume_from_checkpoint", "true"])
    resumed = json.loads((out / "all_results.json").read_text())
    assert resumed["resumed_from_step"] == 10 and resumed["averaged_weights_applied"], again.stdout[-2000:]
    assert resumed["validation_perplexity"] == results["validation_perplexity"]
    assert resumed["test_perplexity"] == results["test_perplexity"]
    assert all(torch.equal(load_file(out / "model.safetensors")[name], average[name]) for name in average)

    refused = subprocess.run([sys.executable, str(SCRIPT)] + [str(a) for a in args] + [
        "--resume_from_checkpoint", "true", "--optimizer", "adamw"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode != 0 and "optimizer: the checkpoint's run has 'muon'" in refused.stderr + refused.stdout


LOAD_FROM_HUB = """
import json, sys
sys.modules["hf_settransformer"] = None  # the code must come with the checkpoint
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
inputs = tokenizer(["the of and in to"], return_tensors="pt")
out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
print(json.dumps({"ids": out[0].tolist(), "text": tokenizer.decode(out[0])}))
"""


@pytest.mark.slow
def test_push_to_a_hub_and_load_without_the_package(tmp_path, corpus):
    from tests.toolkit.hub_server import LocalHub

    out = tmp_path / "pushed"
    with LocalHub(tmp_path / "hub") as hub:
        env = hub.client_env(tmp_path / "home_push")
        args = common_args(
            corpus,
            out,
            "decoder",
            steps=20,
            extra=[
                "--attention_type",
                "linear",
                "--push_to_hub",
                "--hub_model_id",
                "user/wt2-tiny",
                "--hub_strategy",
                "end",
            ],
        )
        result = subprocess.run(
            [sys.executable, str(SCRIPT)] + [str(a) for a in args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        assert "pushed to user/wt2-tiny" in result.stdout
        repo = hub.repo("model", "user/wt2-tiny")
        files = set(repo["commits"][repo["branches"]["main"]]["files"])
        loaded = subprocess.run(
            [sys.executable, "-c", LOAD_FROM_HUB, "user/wt2-tiny"],
            cwd=tmp_path,
            env=hub.client_env(tmp_path / "home_load"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert loaded.returncode == 0, loaded.stderr[-5000:]
        # the same finished folder published again afterwards under another name (scripts/push_run.py)
        again = subprocess.run([sys.executable, str(ROOT / "scripts" / "push_run.py"), str(out), "user/renamed"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
        assert f"pushed {out} to user/renamed" in again.stdout
        renamed = hub.repo("model", "user/renamed")
        renamed_files = renamed["commits"][renamed["branches"]["main"]]["files"]
        first_files = repo["commits"][repo["branches"]["main"]]["files"]
    remote = json.loads(loaded.stdout.strip().splitlines()[-1])
    # the same files, the same weights; the card now loads the new name (and names it in its model-index)
    assert set(renamed_files) == set(first_files)
    assert renamed_files["model.safetensors"]["sha256"] == first_files["model.safetensors"]["sha256"]
    card = (out / "README.md").read_text()
    assert "- name: user/renamed\n" in card and "\n# user/renamed\n" in card
    assert card.count('from_pretrained("user/renamed", trust_remote_code=True)') == 2
    assert card.count("user/wt2-tiny") == 1  # only in the training command, which did push there

    import hf_settransformer  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer(["the of and in to"], return_tensors="pt")
    local = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0].tolist()
    assert remote["ids"] == local and len(local) == 13
    for name in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "README.md",
        "modeling_decoder.py",
        "attention.py",
        "linear_ops.py",
        "masks.py",
        "softmax_ops.py",
        "cache.py",
    ):
        assert name in files, name
    assert not any(name.startswith("checkpoint-") for name in files)
    # nothing uploaded in any commit is a pickle: safetensors, JSON, code and text only
    uploaded = {name for commit in repo["commits"].values() for name in commit["files"]}
    assert "training_args.json" in uploaded and "training_args.bin" not in uploaded
    uploaded.discard(".gitattributes")  # the Hub writes it when it creates the repository
    assert {Path(name).suffix for name in uploaded} <= {".safetensors", ".json", ".py", ".md", ".txt"}, uploaded


@pytest.mark.slow
def test_a_push_without_do_predict_carries_a_card_of_what_was_measured(tmp_path, corpus):
    """train_lm.py --push_to_hub without --do_predict, then push_run.py of the same folder: both repositories
    get a model card, with the validation perplexity and no test result (no "None" or "nan" in its place)."""
    from tests.toolkit.hub_server import LocalHub

    out = tmp_path / "no-test"
    args = [a for a in common_args(corpus, out, "decoder", steps=6) if a != "--do_predict"]
    with LocalHub(tmp_path / "hub") as hub:
        env = hub.client_env(tmp_path / "home")
        result = subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--push_to_hub", "--hub_model_id",
                                 "user/no-test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        first = hub.repo("model", "user/no-test")
        first_files = first["commits"][first["branches"]["main"]]["files"]
        pushed_card = (out / "README.md").read_text()
        again = subprocess.run([sys.executable, str(ROOT / "scripts" / "push_run.py"), str(out), "user/again"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-5000:]
        second = hub.repo("model", "user/again")
        second_files = second["commits"][second["branches"]["main"]]["files"]
    assert "README.md" in first_files and "README.md" in second_files
    assert "and the model card README.md" in result.stdout
    results = json.loads((out / "all_results.json").read_text())
    assert "test_perplexity" not in results and "validation_perplexity" in results
    for card, repo_id in ((pushed_card, "user/no-test"), ((out / "README.md").read_text(), "user/again")):
        assert f"\n# {repo_id}\n" in card and f"- name: {repo_id}\n" in card
        assert f"| validation perplexity | **{results['validation_perplexity']:.2f}**" in card
        assert "split: validation" in card and "split: test" not in card and "| test perplexity" not in card
        assert "None" not in card.split("```json")[0] and "nan" not in card.lower()


@pytest.mark.slow
def test_a_run_writes_its_card_whenever_it_trains_with_what_it_measured(tmp_path, corpus):
    """What the README says: like the Trainer's `create_model_card`, every run that trains (or pushes) writes a card
    with what it measured, a perplexity for each split it evaluated and none without evaluation; a run that only
    evaluates writes all_results.json and no card."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("a model card (`README.md`, written by every run that trains or pushes: a perplexity for each split it "
            "evaluated, none without `--do_eval` or `--do_predict`) in `--output_dir`, and prints a table of what it "
            "measured; a run that only evaluates writes `all_results.json`") in readme
    script = train_lm_module()

    def main(out, *drop, extra=()):
        args = [str(a) for a in common_args(corpus, out, "decoder", steps=4, extra=extra)]
        for flag in drop:  # a switch, or a flag with its value
            i = args.index(flag)
            del args[i : i + (1 if flag.startswith("--do_") else 2)]
        script.main(args)
        return (out / "README.md").read_text() if (out / "README.md").exists() else None

    validated = main(tmp_path / "validated", "--do_predict")
    assert "| validation perplexity |" in validated and "| test perplexity |" not in validated
    assert re.findall(r"split: (\w+)", validated) == ["validation"]
    # without a validation split there is no periodic evaluation to imply --do_eval (as transformers implies it)
    trained = main(tmp_path / "trained", "--do_eval", "--do_predict", "--validation_file")
    assert "| training tokens |" in trained and "perplexity |" not in trained and "model-index" not in trained
    evaluated = main(tmp_path / "evaluated", "--do_train", "--do_predict",
                     extra=["--model_name_or_path", tmp_path / "validated"])
    results = json.loads((tmp_path / "evaluated" / "all_results.json").read_text())
    assert evaluated is None and results["validation_perplexity"] > 0 and "train_tokens" not in results
    # no optimizer, schedule or learning rate acted on its weights: none recorded, so the card a push writes names none
    hyper = results["hyperparameters"]
    assert hyper["sequence_length"] == 16 and not {"optimizer", "learning_rate", "decay_fraction"} & set(hyper)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "validated")
    card = toolkit.write_lm_model_card(tmp_path / "evaluated", model, results, 16, "evaluated", results["command"])
    text = card.read_text()
    assert "| validation perplexity |" in text and "Muon" not in text and "warmup-stable-decay" not in text


LOAD_TOKENIZER = """
import sys
if sys.argv[2] == "package":
    import hf_settransformer  # registers the model types (the README's line)
else:
    sys.modules["hf_settransformer"] = None  # the tokenizer's files alone: nothing of the package
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
print("loaded", tokenizer("the of and")["input_ids"])
"""


@pytest.mark.slow
def test_autotokenizer_loads_a_run_folders_tokenizer_without_a_prompt_or_a_warning(tmp_path, corpus):
    """The README's `AutoTokenizer.from_pretrained(run_folder)`, no trust_remote_code: a plain tokenizer (a transformers
    class, no auto_map) that loads with stdin closed (a "Do you wish to run the custom code? [y/N]" prompt would read
    no and be followed by transformers' "model of type ``" warning) and nothing on stderr; its files alone need no
    package at all. The model still loads as remote code."""
    script = train_lm_module()
    out = tmp_path / "run"
    script.main([str(a) for a in common_args(corpus, out, "decoder", steps=2) if a not in ("--do_eval", "--do_predict")])
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend") and "auto_map" not in config
    alone = tmp_path / "tokenizer-files"
    alone.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (alone / name).write_bytes((out / name).read_bytes())
    expected = f"loaded {[int(i) for i in script.AutoTokenizer.from_pretrained(out)('the of and')['input_ids']]}"
    for folder, mode in ((out, "package"), (alone, "bare")):
        loaded = subprocess.run([sys.executable, "-c", LOAD_TOKENIZER, str(folder), mode], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert loaded.returncode == 0 and loaded.stdout.strip() == expected, loaded.stdout + loaded.stderr[-3000:]
        assert loaded.stderr == "", loaded.stderr[-3000:]  # no prompt, no warning about the model type
    remote = subprocess.run([sys.executable, "-c", LOAD_FROM_HUB, str(out)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr[-3000:]


@pytest.mark.slow
def test_push_run_refuses_unfinished_and_locked_folders(tmp_path):
    """scripts/push_run.py names what a folder lacks, and does not publish a folder a live run holds."""
    script = [sys.executable, str(ROOT / "scripts" / "push_run.py")]

    def refused(folder, repo_id="user/x"):
        result = subprocess.run(script + [str(folder), repo_id], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and "pushed" not in result.stdout
        return result.stderr

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "configuration_decoder.X"}}))
    assert "not a finished train_lm.py run: no all_results.json, model.safetensors, tokenizer.json" in refused(folder)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("x")
    (folder / "all_results.json").write_text(json.dumps({"validation_perplexity": 9.0}))  # no test: still a run
    assert "auto_map names modeling code that is not there (configuration_decoder.py)" in refused(folder)
    (folder / "configuration_decoder.py").write_text("")
    assert "expected namespace/name" in refused(folder, "no-namespace")
    card = folder / "README.md"
    card.write_text("the card as it was")
    long_id = "user/" + "x" * 200
    assert "is not a valid Hub repository id" in refused(folder, long_id)  # refused before anything is written
    assert card.read_text() == "the card as it was"
    hold = ("import sys, time; from hf_settransformer.toolkit import OutputDirLock; "
            "lock = OutputDirLock(sys.argv[1], 'a live run').acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        message = refused(folder)
    finally:
        holder.kill()
        holder.wait()
    assert f"Not publishing {folder}" in message and "a live run" in message


@pytest.mark.slow
def test_a_push_that_cannot_reach_the_hub_leaves_the_folder_as_it_was(tmp_path, corpus, monkeypatch):
    """push_run.py offline, with the Hub unreachable, or with an upload that breaks: a message naming the cause, no
    traceback, and the folder's card as it was (the card used to be rewritten first)."""
    out = tmp_path / "run"
    run(common_args(corpus, out, steps=2))
    card = out / "README.md"
    card.write_text("the card as it was")
    script = [sys.executable, str(ROOT / "scripts" / "push_run.py"), str(out), "user/x"]
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for variables in ({"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": closed, "HF_TOKEN": "hf_test"}):
        env = {**os.environ, **variables}
        result = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert f"Not published, and {out} is as it was: could not create or reach the Hub" in result.stderr
        assert card.read_text() == "the card as it was"

    # the repository is there, then the upload breaks: the card written for the push is taken back
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import push_run

    class BrokenUpload:
        def upload_folder(self, **_):
            raise ConnectionError("connection reset")

    monkeypatch.setattr(toolkit.hub, "reach_hub", lambda *a, **k: BrokenUpload())
    with pytest.raises(SystemExit, match="is as it was: the upload of .* failed: connection reset"):
        push_run.main([str(out), "user/x"])
    assert card.read_text() == "the card as it was"


def readme_training_command(marker="--max_train_minutes 90"):
    """The README's `python scripts/train_lm.py` command whose block holds `marker` (the headline 90-minute command
    by default), as argv."""
    import re
    import shlex

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(python scripts/train_lm\.py .*?)```", readme, flags=re.S)
    (command,) = [block for block in blocks if marker in block.replace("\\\n", " ")]
    return shlex.split(command.replace("\\\n", " "))[2:]


@pytest.mark.slow
def test_readme_smoke_command_runs(tmp_path, corpus):
    """The README's two-minute smoke command (tiny preset, half a CPU-minute, 4,096 validation tokens), run as written
    on the test corpus at a few seconds' budget."""
    argv = readme_training_command("--preset tiny")
    assert {"--preset", "--max_train_minutes", "--max_eval_tokens"} <= set(argv)
    replace = {"--train_file": corpus / "train.txt", "--validation_file": corpus / "valid.txt",
               "--output_dir": tmp_path / "smoke"}
    argv = [str(replace.get(argv[i - 1], a)) if i else a for i, a in enumerate(argv)]
    run(argv + ["--max_train_minutes", "0.05", "--eval_steps", "5", "--logging_steps", "5"])
    results = json.loads((tmp_path / "smoke" / "all_results.json").read_text())
    assert results["train_steps"] >= 1 and results["validation_perplexity"] > 0
    assert 0 < results["validation_tokens_scored"] <= 4096
    # the README's next step: the results table of the run, which scored no test split
    table = subprocess.run([sys.executable, str(ROOT / "scripts" / "lm_results.py"), str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and f"| {results['validation_perplexity']:.1f} | not measured |" in table.stdout, (
        table.stderr[-3000:])


@pytest.mark.slow
def test_readme_training_command_runs_with_the_tuned_defaults(tmp_path, corpus):
    """The README's command sets data, output, family, attention and the 90-minute budget, nothing else: the
    hyper-parameters behind the README's numbers are train_lm.py's defaults. Run as written on the test corpus, at the
    tiny preset and a few seconds' budget."""
    argv = readme_training_command()
    flags = {a for a in argv if a.startswith("--")}
    assert flags == {
        "--family", "--attention_type", "--do_train", "--do_eval", "--do_predict", "--train_file",
        "--validation_file", "--test_file", "--output_dir", "--max_train_minutes",
    }
    assert argv[argv.index("--max_train_minutes") + 1] == "90"
    replace = {"--train_file": corpus / "train.txt", "--validation_file": corpus / "valid.txt",
               "--test_file": corpus / "test.txt", "--output_dir": tmp_path / "readme"}
    argv = [str(replace.get(argv[i - 1], a)) if i else a for i, a in enumerate(argv)]
    argv += ["--preset", "tiny", "--max_train_minutes", "0.1", "--eval_steps", "5", "--logging_steps", "5"]
    run(argv)
    results = json.loads((tmp_path / "readme" / "all_results.json").read_text())
    assert results["max_train_minutes"] == 0.1 and results["train_steps"] >= 1
    assert results["train_cpu_minutes"] <= 0.1 * results["threads_per_process"] * 1.5
    state = json.loads((tmp_path / "readme" / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert losses[-1] < losses[0]
    budget = json.loads((tmp_path / "readme" / "time_budget.json").read_text())
    assert budget["max_steps"] == results["max_steps"] and budget["minutes"] == 0.1
    assert budget["evaluation_every"] == 5 and budget["seconds_per_evaluation"] > 0  # validations are planned for


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra,message",
    [
        (["--max_train_minutes", "5", "--max_steps", "10"], "pass it or --max_steps / --train_token_budget"),
        (["--max_train_minutes", "0"], "--max_train_minutes must be a positive number"),
        (["--block_size", "8", "--eval_stride", "9"], "must be smaller than --block_size"),
        (["--block_size", "8", "--eval_stride", "8"], "must be smaller than --block_size"),
        (["--block_size", "-4"], "--block_size must be a positive integer"),
        (["--family", "set_transformer", "--config_overrides", "num_inducing_point=4"], "did you mean 'num_inducing_points'"),
    ],
)
def test_bad_flags_are_refused_with_the_flag_named(tmp_path, corpus, extra, message):
    args = ["--do_train", "--train_file", corpus / "train.txt", "--output_dir", tmp_path, "--preset", "tiny", *extra]
    result = subprocess.run(
        [sys.executable, str(SCRIPT)] + [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ best checkpoint


def train_lm_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hfst_script_train_lm_best", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_checkpoint_default_follows_the_save_and_eval_steps(tmp_path):
    """Without a weight average, on by default where every checkpoint has a validation; off where it could not be (an
    explicit request that cannot hold is transformers' error, naming the flag). Off with the default average (the run
    ends with it)."""

    def parsed(*flags, average="none"):
        return lm_arguments.parse_arguments(["--output_dir", str(tmp_path), "--use_cpu", "true", "--average_weights",
                                             average, *flags])[2]

    assert not parsed(average="auto").load_best_model_at_end
    assert parsed().load_best_model_at_end  # save and validate every 250 steps
    assert parsed("--save_steps", "500").load_best_model_at_end
    assert not parsed("--save_strategy", "no").load_best_model_at_end
    assert not parsed("--save_steps", "3").load_best_model_at_end
    assert not parsed("--eval_strategy", "no").load_best_model_at_end
    assert not parsed("--load_best_model_at_end", "false").load_best_model_at_end
    with pytest.raises(SystemExit, match="load_best_model_at_end"):  # the script ends with the message (parse_flags)
        parsed("--save_steps", "3", "--load_best_model_at_end", "true")


@pytest.mark.slow
def test_a_run_ends_with_its_best_checkpoint(tmp_path, corpus):
    """A learning rate too high to stay stable makes later validations worse: the run's result (the saved model, the
    evaluation, all_results.json) is the checkpoint of the lowest periodic validation loss, and a second run on the
    finished folder loads that one again."""
    out = tmp_path / "best"
    extra = ["--save_strategy", "steps", "--save_steps", 4, "--eval_strategy", "steps", "--eval_steps", 4,
             "--learning_rate", 0.5, "--lr_scheduler_type", "constant", "--warmup_steps", 0,
             "--optimizer", "adamw", "--average_weights", "none", "--resume_from_checkpoint", "true"]
    run(common_args(corpus, out, "decoder", steps=24, extra=extra))
    results = json.loads((out / "all_results.json").read_text())
    state = json.loads((out / "trainer_state.json").read_text())
    evals = [(entry["eval_loss"], entry["step"]) for entry in state["log_history"] if "eval_loss" in entry]
    best_loss, best_step = min(evals)
    assert len(evals) == 6 and best_step < 24, evals  # the late steps diverge: the last is not the best
    assert results["selected_by"] == "best eval_loss" and results["selected_step"] == best_step
    assert results["best_periodic_eval_loss"] == pytest.approx(best_loss)
    saved, best = load_file(out / "model.safetensors"), load_file(out / f"checkpoint-{best_step}" / "model.safetensors")
    assert saved.keys() == best.keys() and all(torch.equal(saved[k], best[k]) for k in saved)

    card = (out / "README.md").read_text()
    assert f"| weights | step {best_step} of 24: the checkpoint with the lowest validation loss" in card

    run(common_args(corpus, out, "decoder", steps=24, extra=extra))  # finished: only loads, then evaluates
    again = json.loads((out / "all_results.json").read_text())
    assert again["selected_step"] == best_step
    assert again["test_perplexity"] == pytest.approx(results["test_perplexity"], rel=1e-6)


@pytest.mark.slow
def test_refresh_model_card_writes_the_card_again_from_what_the_run_recorded(tmp_path, corpus):
    """lm_results.py --refresh_cards: a run's card is written again from its all_results.json (the recorded command and
    sequence length), replacing whatever card is there; a folder of results alone is passed over; a run that did not
    record its command or sequence length is refused, naming what is missing (an old card is not parsed for them)."""
    out = tmp_path / "run"
    run(common_args(corpus, out, "decoder", steps=8))
    results = json.loads((out / "all_results.json").read_text())
    command = results["command"]
    (out / "README.md").write_text("# an old card\n\n## Training\n\n```bash\npython an old command\n```\n")
    (tmp_path / "copied").mkdir()  # a results folder as --copy_to keeps it
    (tmp_path / "copied" / "all_results.json").write_text(json.dumps(results))
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "lm_results.py"), str(tmp_path), "--refresh_cards"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"refreshed {out / 'README.md'}" in result.stdout
    assert f"not refreshed {tmp_path / 'copied'}: no saved model" in result.stdout  # results alone: nothing to read
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert "| weights | the mean of the weights after steps 7 to 8 of 8 (2 steps)" in card  # the default average
    shown = command.replace(f"--output_dir {out}", f"--output_dir {out.name}")  # the machine's path cut to the folder
    assert shown != command and f"```bash\n{shown}\n```" in card and "an old command" not in card
    assert f"{results['test_perplexity']:.2f}" in card and "| context | 16 tokens |" in card  # the tiny preset's block
    # the run read local files that are not WikiText-2's: the card keeps the command and says so
    assert results["data_files"]["train"] == {"path": str(corpus / "train.txt"), "sha256": hashlib.sha256(
        (corpus / "train.txt").read_bytes()).hexdigest()}
    assert "The run read local text files (`train.txt`, `valid.txt`, `test.txt`), which are not published" in card

    (out / "README.md").write_text(card.replace(shown, "python an old command"))
    del results["command"], results["hyperparameters"]  # a run made before train_lm.py recorded them
    (out / "all_results.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="does not record the run's command, hyperparameters.sequence_length"):
        toolkit.refresh_model_card(out)
    assert "python an old command" in (out / "README.md").read_text()  # left as it was


def test_the_preset_follows_the_device_and_a_given_flag_beats_the_preset(tmp_path):
    """--preset auto is `small` on a CPU, with today's tuned hyper-parameters and no GPU settings; a GPU preset by
    name brings its own hyper-parameters (not the GPU's Trainer settings on a CPU), and a flag the command gives wins
    over it, in every spelling argparse accepts."""

    def parsed(*flags):
        model_args, _, args, _ = lm_arguments.parse_arguments(["--output_dir", str(tmp_path), *flags])
        return (model_args.preset, args.learning_rate, args.per_device_train_batch_size, args.warmup_steps,
                args.weight_decay, args.torch_compile, args.dataloader_num_workers, args.per_device_eval_batch_size)

    assert parsed() == ("small", 2e-3, 16, 0.02, 0.01, False, 0, 32)
    assert parsed("--preset", "gpu") == ("gpu", 1e-3, 32, 0.05, 0.1, False, 0, 32)
    assert parsed("--preset", "gpu", "--learning_rate", "5e-4") == ("gpu", 5e-4, 32, 0.05, 0.1, False, 0, 32)
    assert parsed("--preset=gpu-small", "--learning-rate=5e-4", "--per_device_train", "8")[:3] == ("gpu-small", 5e-4, 8)
    assert lm_arguments.resolve_preset("auto", is_cuda=True) == "gpu"
    assert lm_arguments.resolve_preset("auto", is_cuda=False) == "small"
    assert lm_arguments.resolve_preset("tiny", is_cuda=True) == "tiny"


def test_a_json_command_gets_the_preset_and_keeps_its_values(tmp_path, monkeypatch):
    """`train_lm.py args.json`: its keys are the given flags, the preset fills the rest."""
    values = {"output_dir": str(tmp_path), "preset": "gpu", "learning_rate": 5e-4, "use_cpu": True}
    (tmp_path / "args.json").write_text(json.dumps(values))
    monkeypatch.setattr(sys, "argv", ["train_lm.py", str(tmp_path / "args.json")])
    model_args, _, args, command = lm_arguments.parse_arguments(None)
    assert (model_args.preset, args.learning_rate, args.per_device_train_batch_size) == ("gpu", 5e-4, 32)
    assert command == str(tmp_path / "args.json")


def test_a_misspelt_flag_is_named_with_the_nearest_one(tmp_path, monkeypatch):
    """A flag the script does not have, on the command line or as a key of a JSON command, ends the run naming it and
    the nearest flag it has (transformers' own message suggests nothing), before anything is created."""
    script = train_lm_module()
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as err:
        script.main(["--do_train", "--output_dir", str(out), "--max_train_minuts", "5", "--lerning_rate=1e-3"])
    assert str(err.value.code) == ("unknown flag --max_train_minuts (did you mean --max_train_minutes?); "
                                   "unknown flag --lerning_rate (did you mean --learning_rate?)")
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(out), "do_train": True, "max_stesp": 3}))
    monkeypatch.setattr(sys, "argv", ["train_lm.py", str(tmp_path / "args.json")])
    with pytest.raises(SystemExit, match=r"^unknown flag --max_stesp \(did you mean --max_steps\?\)$"):
        script.main(None)
    assert not out.exists()


def test_training_defaults_on_cuda_and_for_several_processes():
    """What a run takes where the command is silent: the preset's hyper-parameters, the GPU's Trainer settings on
    CUDA only, and beyond 4 processes the learning rate times sqrt(processes / 4); nothing the command gave."""
    assert lm_arguments.training_defaults("small", is_cuda=False) == {}  # the CPU run as it always was
    gpu = lm_arguments.training_defaults("gpu", is_cuda=True)
    assert gpu == {**lm_arguments.PRESETS["gpu"]["training"], **toolkit.machine.gpu_training_defaults(True)}
    assert gpu["learning_rate"] == 1e-3 and gpu["torch_compile"] and gpu["per_device_eval_batch_size"] == 64
    given = lm_arguments.training_defaults("gpu", True, explicit={"learning_rate", "torch_compile"}, processes=16)
    assert "learning_rate" not in given and "torch_compile" not in given and given["per_device_train_batch_size"] == 32
    assert lm_arguments.training_defaults("gpu", True, processes=4)["learning_rate"] == 1e-3  # kept up to 4
    assert lm_arguments.training_defaults("gpu", True, processes=16)["learning_rate"] == pytest.approx(2e-3)
    assert lm_arguments.training_defaults("small", False, processes=9, learning_rate=2e-3) == {"learning_rate": 3e-3}
    assert lm_arguments.scaled_learning_rate(1e-3, 1) == 1e-3
    assert lm_arguments.scaled_learning_rate(1e-3, 8) == pytest.approx(1e-3 * 2**0.5)
    # every field is one LMTrainingArguments has, with a value it accepts
    args = lm_arguments.LMTrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **gpu)
    assert args.optim == "adamw_torch_fused" and args.weight_decay == 0.1


@pytest.mark.parametrize("preset", ["gpu", "gpu-small"])
def test_gpu_presets_use_a_dense_output_layer_and_more_dropout(preset):
    """The GPU presets (untuned) keep the full softmax and dense embedding at WikiText-2's vocabulary, tied, with the
    dropout of the preset; --config_overrides still wins."""
    from types import SimpleNamespace

    model_args = SimpleNamespace(preset=preset, family="decoder", attention_type="softmax", feature_map="elu",
                                 linear_attention_decay="none", next_token_mode="many", config_overrides=None)
    data_args = SimpleNamespace(block_size=512, context_length=512, target_length=None)
    config = lm_arguments.new_config(model_args, data_args, vocab_size=33279, eos_id=0)
    assert config.adaptive_softmax_cutoffs is None and config.adaptive_input_cutoffs is None
    sizes = lm_arguments.PRESETS[preset]
    assert config.tie_word_embeddings and config.hidden_dropout_prob == sizes["hidden_dropout_prob"]
    assert config.hidden_size == sizes["hidden_size"] and preset in lm_arguments.UNTUNED_PRESETS
    model_args.config_overrides = "hidden_dropout_prob=0.1"
    assert lm_arguments.new_config(model_args, data_args, vocab_size=33279, eos_id=0).hidden_dropout_prob == 0.1


def test_config_overrides_take_list_values():
    """A list value keeps its commas (`adaptive_input_cutoffs=[2000,10000]`); the other items split as before."""
    import hf_settransformer as hfst

    parsed = lm_arguments.parse_overrides(
        "adaptive_input_cutoffs=[20, 100],hidden_dropout_prob=0.2,pooling=mean", hfst.TransformerEncoderConfig
    )
    assert parsed == {"adaptive_input_cutoffs": [20, 100], "hidden_dropout_prob": 0.2, "pooling": "mean"}


@pytest.mark.parametrize("family", ["decoder", "encoder", "set_transformer", "perceiver_io"])
def test_small_preset_uses_adaptive_input_and_softmax(family):
    """The tuned `small` preset (README, Tuning) gives a WikiText-2-sized vocabulary adaptive input and softmax, tied;
    a tiny vocabulary keeps the dense layers; `adaptive_input_cutoffs=null` turns the adaptive input off (and so the
    tie, which needs both); `tie_adaptive_weights=false` unties them."""
    from types import SimpleNamespace

    model_args = SimpleNamespace(preset="small", family=family, attention_type="softmax", feature_map="elu",
                                 linear_attention_decay="none", next_token_mode="many", config_overrides=None)
    data_args = SimpleNamespace(block_size=128, context_length=128, target_length=None)
    config = lm_arguments.new_config(model_args, data_args, vocab_size=33278, eos_id=0)
    assert config.adaptive_input_cutoffs == config.adaptive_softmax_cutoffs == [2000, 10000]
    assert not config.tie_word_embeddings and config.tie_adaptive_weights

    tiny_vocab = lm_arguments.new_config(model_args, data_args, vocab_size=5000, eos_id=0)
    assert tiny_vocab.adaptive_input_cutoffs is None and tiny_vocab.adaptive_softmax_cutoffs is None
    assert not tiny_vocab.tie_adaptive_weights

    model_args.config_overrides = "adaptive_input_cutoffs=null"
    dense_input = lm_arguments.new_config(model_args, data_args, vocab_size=33278, eos_id=0)
    assert dense_input.adaptive_input_cutoffs is None and dense_input.adaptive_softmax_cutoffs == [2000, 10000]
    assert not dense_input.tie_adaptive_weights
    model_args.config_overrides = "adaptive_softmax_cutoffs=[1000,5000]"  # cut otherwise: nothing to share
    assert not lm_arguments.new_config(model_args, data_args, vocab_size=33278, eos_id=0).tie_adaptive_weights
    model_args.config_overrides = "tie_adaptive_weights=false"
    assert not lm_arguments.new_config(model_args, data_args, vocab_size=33278, eos_id=0).tie_adaptive_weights
    model_args.config_overrides = "adaptive_input_cutoffs=null,tie_adaptive_weights=true"  # asked for: refused
    with pytest.raises(SystemExit, match="needs both an adaptive input and an adaptive softmax"):
        lm_arguments.new_config(model_args, data_args, vocab_size=33278, eos_id=0)


@pytest.mark.parametrize("architecture", ["OutputDirLock", "FAMILIES", "NoSuchClass", None])
def test_a_card_is_never_made_by_calling_a_class_named_in_a_file_unless_it_is_a_model_of_ours(tmp_path, architecture):
    config = hf_settransformer.TransformerDecoderConfig(vocab_size=50, hidden_size=32, num_attention_heads=4, num_hidden_layers=1)
    config.architectures = None if architecture is None else [architecture]
    config.save_pretrained(tmp_path)
    (tmp_path / "all_results.json").write_text(json.dumps(
        {"validation_perplexity": 9.0, "test_perplexity": 9.0, "train_tokens": 9, "command": "python x",
         "hyperparameters": {"sequence_length": 16}}))
    with pytest.raises(ValueError, match=f"architecture {architecture!r}, which is not an hf_settransformer model"):
        toolkit.refresh_model_card(tmp_path)

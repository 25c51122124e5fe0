"""Bad flags, races and kills of the scripts: every case gives a clear error naming the flag or file, or the correct
result (bad model inputs are in test_checks.py, bad config values in test_config.py). The scripts' `main` runs in this process (a flag error is a `SystemExit` whose
message is checked), except where a second process or a kill is the point. The output-folder lock and the kill
during the final save are tested with the training utilities (test_training.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from hf_settransformer import toolkit

from tests.helpers import ROOT, load_script, tiny_run_args

# a script run as a process imports this checkout's package, not an installed one (another checkout's, say)
SCRIPT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


# ------------------------------------------------------------------------------------------------------ flags


@pytest.fixture(scope="module")
def decoder_checkpoint(texts, train_lm, tmp_path_factory):
    """A tiny decoder run with a complete checkpoint at step 2."""
    out = tmp_path_factory.mktemp("decoder-run")
    train_lm.main(["--do_train", "--train_file", str(texts / "train.txt"), "--validation_file", str(texts / "train.txt"),
                   "--preset", "tiny", "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2",
                   "--disable_tqdm", "true", "--report_to", "none"])
    return out / "checkpoint-2"


FLAG_CASES = [
    # (extra flags, words of the error); {train} / {empty} ... are files of `texts`, {checkpoint} the decoder's
    (["--config_overrides", "nonexistent=1"], ["--config_overrides", "no field 'nonexistent'"]),
    (["--family", "set_transformer", "--config_overrides", "num_inducing_point=4"],
     ["did you mean 'num_inducing_points'"]),
    (["--config_overrides", "=3"], ["--config_overrides", 'expected "key=value"']),
    (["--train_token_budget", "0"], ["--train_token_budget must be a positive integer"]),
    (["--train_token_budget", "-5"], ["--train_token_budget must be a positive integer"]),
    (["--block_size", "0"], ["--block_size must be a positive integer"]),
    (["--block_size", "-4"], ["--block_size must be a positive integer"]),
    (["--eval_stride", "-3"], ["--eval_stride must be a positive integer"]),
    (["--block_size", "16", "--eval_stride", "1000"], ["--eval_stride (1000) must be smaller than --block_size (16)"]),
    (["--block_size", "16", "--eval_stride", "16"], ["--eval_stride (16) must be smaller than --block_size (16)"]),
    (["--max_train_minutes", "0"], ["--max_train_minutes must be a positive number"]),
    (["--train_file", "{empty}"], ["--train_file", "empty.txt is empty"]),
    (["--train_file", "{blank}"], ["--train_file", "blank.txt is empty"]),
    (["--family", "perceiver_io", "--train_file", "{blank}"], ["--train_file", "blank.txt is empty"]),
    (["--train_file", "{short}", "--validation_file", "{short}"], ["--train_file holds fewer tokens", "--block_size"]),
    (["--family", "perceiver_io", "--train_file", "{short}", "--validation_file", "{short}"],
     ["--train_file holds fewer tokens", "--context_length"]),
    (["--validation_file", "{missing}"], ["--validation_file: no such file"]),
    (["--do_eval", "--validation_file", None], ["--do_eval needs a validation split"]),
    (["--do_predict"], ["--do_predict needs a test split"]),
    (["--objective", "mlm"], ["--objective mlm needs a family with a masked-LM head", "not decoder"]),
    (["--family", "encoder", "--objective", "mlm", "--mlm_probability", "1.5"], ["--mlm_probability must be in"]),
    (["--resume_from_checkpoint", "{unnamed}"], ["cannot tell the checkpoint's step"]),
    (["--resume_from_checkpoint", "{badjson}"], ["is not a JSON object"]),
    (["--resume_from_checkpoint", "{nomarker}"], ["not a complete checkpoint"]),
    (["--family", "encoder", "--resume_from_checkpoint", "{checkpoint}"],
     ["weights do not fit", "hfst_decoder model", "hfst_encoder model"]),
    (["--resume_from_checkpoint", "{checkpoint}", "--config_overrides", "hidden_size=64"],
     ["weights do not fit", "hidden_size: checkpoint 32, this run 64"]),
    (["--max_eval_tokens", "0"], ["--max_eval_tokens must be a positive integer"]),
    (["--max_eval_tokens", "-3"], ["--max_eval_tokens must be a positive integer"]),
    (["--periodic_eval_targets", "-10"], ["--periodic_eval_targets must be a positive integer"]),
    (["--targets_per_epoch", "0"], ["--targets_per_epoch must be a positive integer"]),
    (["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps must be a positive integer"]),
    (["--max_train_tokens", "5"], ["--max_train_tokens 5 keeps fewer tokens", "--block_size"]),
    (["--output_dir", "{run}"], ["holds a finished run", "all_results.json", "--resume_from_checkpoint true",
                                 "--overwrite_output_dir"]),
    (["--output_dir", "{partial}"], ["holds a partial run", "checkpoint-2", "--overwrite_output_dir"]),
    (["--output_dir", "{train}"], ["--output_dir", "is a file, not a folder"]),
    (["--model_name_or_path", "{run}", "--tokenizer_name", "{small_tokenizer}"],
     ["--tokenizer_name", "has 6 tokens", "vocabulary of", "Use the model's own tokenizer"]),
    (["--tokenizer_name", "{missing}/tokenizer"], ["--tokenizer_name", "missing.txt/tokenizer: no such folder"]),
    (["--model_name_or_path", "{missing}/model"], ["--model_name_or_path", "missing.txt/model: no such folder"]),
    (["--model_name_or_path", "{train}"], ["--model_name_or_path", "train.txt: is a file"]),
    (["--model_name_or_path", "{texts}"], ["--model_name_or_path", "could not load from this folder"]),
    (["--train_file", "{binary}"], ["--train_file", "binary.bin is a binary file", "NUL byte at offset"]),
    (["--validation_file", "{latin1}"], ["--validation_file", "latin1.txt is not UTF-8", "0xe9", "line 2"]),
    (["--train_file", "{texts}"], ["--train_file", "is a folder; pass a text file"]),
    (["--resume_from_checkpoint", "{missing}"], ["--resume_from_checkpoint", "missing.txt: no such folder"]),
    (["--learning_rate", "nan"], ["--learning_rate must be a finite number, not negative", "got nan"]),
    (["--learning_rate", "-1"], ["--learning_rate must be a finite number, not negative", "got -1.0"]),
    (["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size must be a positive integer, got 0"]),
    (["--context_length", "32"], ["--context_length cannot apply to --family decoder"]),
    (["--family", "encoder", "--packing", "true"], ["--packing trains a causal LM (--family decoder) or a masked LM",
                                                   "TransformerEncoderForNextTokenPrediction trains on windows"]),
    (["--packing", "true", "--block_size", "4096"], ["Cannot make train examples", "packed row of 4096 tokens"]),
    (["--next_token_mode", "window"], ["--next_token_mode window cannot apply to --family decoder"]),
    # TrainingArguments values transformers 5.23 accepts and then ignores or misreads
    (["--save_steps", "0"], ["--save_steps must be a positive number", "got 0.0"]),
    (["--save_steps", "-5"], ["--save_steps must be a positive number", "got -5.0"]),
    (["--eval_steps", "0"], ["--eval_steps must be a positive number", "omit it to evaluate every --logging_steps"]),
    (["--logging_steps", "0"], ["--logging_steps must be a positive number", "got 0.0"]),
    (["--save_total_limit", "-1"], ["--save_total_limit must be a positive integer", "got -1"]),
    (["--save_total_limit", "0"], ["--save_total_limit must be a positive integer", "keep every checkpoint"]),
    (["--weight_decay", "nan"], ["--weight_decay must be a non-negative finite number, got nan"]),
    (["--weight_decay", "-0.1"], ["--weight_decay must be a non-negative finite number, got -0.1"]),
    (["--max_grad_norm", "-1"], ["--max_grad_norm must be a non-negative finite number", "got -1.0"]),
    (["--warmup_steps", "nan"], ["--warmup_steps must be a finite number", "got nan"]),
    (["--max_steps", "0"], ["--max_steps must be a positive integer, or -1", "got 0"]),
    (["--max_steps", "-1", "--num_train_epochs", "0"], ["--num_train_epochs must be a positive number", "got 0.0"]),
    (["--adam_beta2", "1.5"], ["--adam_beta2 must be in [0, 1), got 1.5"]),
    (["--label_smoothing_factor", "1.5"], ["--label_smoothing_factor must be in [0, 1), got 1.5"]),
    (["--eval_accumulation_steps", "0"], ["--eval_accumulation_steps must be a positive integer, got 0"]),
    # a misspelt flag: named, with the nearest one
    (["--max_train_minuts", "5"], ["unknown flag --max_train_minuts (did you mean --max_train_minutes?)"]),
]


@pytest.mark.parametrize("extra,words", FLAG_CASES, ids=[" ".join(str(e) for e in c[0]) for c in FLAG_CASES])
def test_bad_train_lm_flags_are_refused_naming_the_flag(tmp_path, texts, train_lm, decoder_checkpoint, extra, words):
    import shutil

    unnamed, badjson, nomarker = (tmp_path / name for name in ("unnamed", "badjson", "nomarker"))
    for folder in (unnamed, badjson, nomarker):
        shutil.copytree(decoder_checkpoint, folder)
    (unnamed / "hfst_checkpoint_complete.json").write_text('{"note": "no step"}')
    (unnamed / "trainer_state.json").unlink()
    (badjson / "hfst_checkpoint_complete.json").write_text("not json")
    (nomarker / "hfst_checkpoint_complete.json").unlink()
    partial = tmp_path / "partial"
    shutil.copytree(decoder_checkpoint, partial / "checkpoint-2")
    small_tokenizer = tmp_path / "small_tokenizer"
    toolkit.build_word_tokenizer(["a b c"]).save_pretrained(small_tokenizer)
    files = dict(train=texts / "train.txt", empty=texts / "empty.txt", blank=texts / "blank.txt",
                 short=texts / "short.txt", missing=texts / "missing.txt", checkpoint=decoder_checkpoint,
                 unnamed=unnamed, badjson=badjson, nomarker=nomarker, run=decoder_checkpoint.parent, partial=partial,
                 small_tokenizer=small_tokenizer, binary=texts / "binary.bin", latin1=texts / "latin1.txt", texts=texts)
    args = {"--train_file": str(texts / "train.txt"), "--validation_file": str(texts / "train.txt"),
            "--preset": "tiny", "--output_dir": str(tmp_path / "out"), "--max_steps": "2", "--report_to": "none",
            "--disable_tqdm": "true"}
    switches = ["--do_train"]
    i = 0
    while i < len(extra):
        if extra[i] in ("--do_eval", "--do_predict"):
            switches.append(extra[i])
            i += 1
            continue
        args[extra[i]] = None if extra[i + 1] is None else str(extra[i + 1]).format(**files)
        i += 2
    if "--max_train_minutes" in args:
        args.pop("--max_steps")
    argv = switches + [x for key, value in args.items() if value is not None for x in (key, value)]
    with pytest.raises(SystemExit) as err:
        train_lm.main(argv)
    message = str(err.value.code)
    for word in words:
        assert word in message, message


MISSING_INPUTS = [("--train_file", "--train_file: no such file"), ("--validation_file", "--validation_file: no such file"),
                  ("--test_file", "--test_file: no such file"), ("--model_name_or_path", "no such folder"),
                  ("--tokenizer_name", "no such folder"), ("--resume_from_checkpoint", "no such folder")]


@pytest.mark.parametrize("flag,words", MISSING_INPUTS, ids=[case[0] for case in MISSING_INPUTS])
def test_a_run_refused_for_a_missing_input_leaves_no_folder_and_no_lock(tmp_path, texts, train_lm, flag, words):
    """Every input is checked before the output folder is made: a new --output_dir (two levels deep) is not created,
    an existing one is left as it was, without a lock file."""
    paths = {"--train_file": texts / "train.txt", "--validation_file": texts / "train.txt",
             "--test_file": texts / "train.txt", flag: tmp_path / "does" / "not" / "exist"}
    flags = [str(x) for pair in paths.items() for x in pair]
    for out in (tmp_path / "outputs" / "run", tmp_path / "existing"):
        with pytest.raises(SystemExit) as err:
            train_lm.main(["--do_train", "--do_eval", "--do_predict", "--preset", "tiny", "--report_to", "none",
                           "--output_dir", str(out), *flags])
        assert words in str(err.value.code) and f"{flag}" in str(err.value.code), err.value.code
        (tmp_path / "existing").mkdir(exist_ok=True)  # the second round: a folder that was there before the run
    assert not (tmp_path / "outputs").exists() and list((tmp_path / "existing").iterdir()) == []


def test_a_run_that_fails_after_making_its_folder_removes_it_and_its_lock(tmp_path, texts, train_lm):
    """An error found once the folder is locked (too few tokens for one example) leaves neither the folder the run
    made nor the lock file (the release removes both)."""
    with pytest.raises(SystemExit, match="--max_train_tokens 5 keeps fewer tokens"):
        train_lm.main(["--do_train", "--train_file", str(texts / "train.txt"), "--preset", "tiny", "--report_to",
                       "none", "--max_train_tokens", "5", "--output_dir", str(tmp_path / "outputs" / "run")])
    assert not (tmp_path / "outputs").exists()


def test_train_sets_refused_for_a_missing_model_leaves_no_folder(tmp_path):
    train_sets = load_script("train_sets")
    with pytest.raises(SystemExit, match="--model_name_or_path .*: no such folder"):
        train_sets.main(["--output_dir", str(tmp_path / "outputs" / "run"), "--max_steps", "1", "--report_to", "none",
                         "--model_name_or_path", str(tmp_path / "no-model")])
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--value_scale", "0"], ["--value_scale must be between 0.01 and 10,000, got 0.0"]),
        (["--value_scale", "nan"], ["--value_scale must be between 0.01 and 10,000, got nan"]),
        (["--eval_sets", "0"], ["--eval_sets must be a positive integer"]),
        (["--min_size", "5", "--max_size", "2"], ["--min_size (5) must not exceed --max_size (2)"]),
        (["--model", "deepsets_max", "--attention_type", "linear"], ["deepsets_max", "--attention_type cannot apply"]),
        (["--model", "deepsets_sum", "--num_inducing_points", "4", "--feature_map", "exp"],
         ["--feature_map, --num_inducing_points cannot apply"]),
        (["--save_steps", "0"], ["--save_steps must be a positive number", "got 0.0"]),
        (["--logging_steps", "-1"], ["--logging_steps must be a positive number", "got -1.0"]),
        (["--max_grad_norm", "nan"], ["--max_grad_norm must be a non-negative finite number", "got nan"]),
        (["--tsk", "max_regression"], ["unknown flag --tsk (did you mean --task?)"]),
        (["--model", "deepsets_max", "--packing", "true"], ["--packing trains the Set Transformer", "deepsets_max"]),
    ],
)
def test_bad_train_sets_flags_are_refused_naming_the_flag(tmp_path, extra, words):
    train_sets = load_script("train_sets")
    with pytest.raises(SystemExit) as err:
        train_sets.main(["--output_dir", str(tmp_path), "--max_steps", "1", "--report_to", "none", *extra])
    for word in words:
        assert word in str(err.value.code)


# ------------------------------------------------------------------------------------------------------ races, kills

@pytest.mark.slow
def test_a_second_run_on_a_live_runs_folder_stops_and_moves_nothing(tmp_path, texts):
    """Run A trains; run B on the same folder with --resume_from_checkpoint true must stop with A named before it
    touches anything (it used to move A's newest checkpoint aside as "incomplete" while A was writing it)."""
    out = tmp_path / "run"
    common = [sys.executable, str(ROOT / "scripts" / "train_lm.py"), "--do_train", "--train_file",
              str(texts / "train.txt"), "--preset", "tiny", "--output_dir", str(out), "--save_steps", "5",
              "--report_to", "none", "--disable_tqdm", "true", "--resume_from_checkpoint", "true"]
    first = subprocess.Popen(common + ["--max_steps", "60"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=ROOT, env=SCRIPT_ENV)
    try:
        deadline = time.time() + 120
        while not list(out.glob("checkpoint-*")) and time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert list(out.glob("checkpoint-*")), "run A wrote no checkpoint"
        # A is paused while B starts, so that A cannot finish first on a busy machine (it did once in the full suite):
        # a paused process still holds its lock, and its folder is as live as a running one's
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(
                common + ["--max_steps", "60"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=SCRIPT_ENV
            )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode != 0
        assert f"is in use by process {first.pid}" in second.stderr, second.stderr[-2000:]
        assert first.poll() is None, "run A must still be running, so the race was real"
        assert not list(out.glob("incomplete-*"))
    finally:
        output = first.communicate(timeout=300)[0]
    assert first.returncode == 0, output[-3000:]
    assert json.loads((out / "all_results.json").read_text())["train_steps"] == 60


# ------------------------------------------------------------------------------------------------------ round two

def test_a_missing_model_offline_says_the_hub_is_not_reachable(tmp_path, texts, train_lm, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for value, words in ((str(tmp_path / "nothing"), ["no such folder"]),
                         ("hfst-no-such-model", ["no such folder, and no Hub repo of that name could be loaded"])):
        with pytest.raises(SystemExit) as err:
            train_lm.main(["--do_train", "--train_file", str(texts / "train.txt"), "--output_dir", str(tmp_path / "o"),
                           "--model_name_or_path", value, "--report_to", "none"])
        for word in [f"--model_name_or_path {value}", *words, "HF_HUB_OFFLINE is set"]:
            assert word in str(err.value.code), str(err.value.code)


CUT_SHORT = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # torch.save's
DISK_FULL = {"ENOSPC": (OSError(28, "No space left on device", "optimizer.pt"), "the disk is full", None),
             "torch writer": (RuntimeError("basic_ios::clear: iostream error"), "the disk is probably full", None),
             "torch writer cut short, no space left": (CUT_SHORT, "the disk is full", 0),
             "torch writer cut short, space left": (CUT_SHORT, "the disk is probably full", None)}


@pytest.mark.slow
@pytest.mark.parametrize("error", list(DISK_FULL))
def test_a_full_disk_while_saving_says_so_and_the_previous_checkpoint_resumes(tmp_path, texts, train_lm, monkeypatch,
                                                                            capsys, error):
    """A full disk while a checkpoint is saved ends the run in one line: what failed, where, that the checkpoint being
    written is incomplete (it has no marker, so it is never resumed from), and the one to resume from. torch.save's
    "unexpected pos" (a write cut short) was not taken for a full disk."""
    out = tmp_path / "run"
    real_save = torch.save
    raised, words, free = DISK_FULL[error]
    if free is not None:  # what the disk has left once the write failed
        real_usage = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=free))

    def save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt") and "checkpoint-4" in str(f):
            raise raised
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(SystemExit) as err:
        train_lm.main(tiny_run_args(texts, out, "--max_steps", "6", "--save_steps", "2"))
    message = str(err.value.code)
    for word in (words, str(raised).splitlines()[0], f"resume from {out / 'checkpoint-2'} (step 2, complete)",
                 "--resume_from_checkpoint true", f"{out / 'checkpoint-4'} is incomplete", f"writing in {out}"):
        assert word in message, message
    assert not (out / "checkpoint-4" / "hfst_checkpoint_complete.json").exists()
    monkeypatch.undo()
    results = train_lm.main(tiny_run_args(texts, out, "--max_steps", "6", "--save_steps", "2",
                                          "--resume_from_checkpoint", "true"))
    assert results["resumed_from_step"] == 2 and results["train_steps"] == 6
    assert "checkpoint-4 was never completely written" in capsys.readouterr().out


def test_train_sets_a_full_disk_while_saving_the_final_model_says_so(tmp_path, monkeypatch):
    """The final model's save was outside the full-disk handling of train_sets.py: a traceback."""
    train_sets = load_script("train_sets")
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if ".tmp-final-model" in str(f):
            raise OSError(28, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as err:
        train_sets.main(["--output_dir", str(out), "--max_steps", "2", "--save_steps", "1", "--report_to", "none",
                         "--eval_sets", "8", "--hidden_size", "16", "--disable_tqdm", "true"])
    message = str(err.value.code)
    for words in ("[train_sets] the disk is full: writing in", f"resume from {out / 'checkpoint-2'} (step 2, complete)"):
        assert words in message, message


def test_ctrl_c_before_any_checkpoint_says_none_exists_and_exits_130(tmp_path, texts, train_lm, monkeypatch, capsys):
    import transformers

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.Trainer, "training_step", interrupted)
    with pytest.raises(SystemExit) as err:
        train_lm.main(tiny_run_args(texts, tmp_path / "run", "--max_steps", "6", "--save_steps", "2"))
    assert err.value.code == 130
    assert "interrupted (Ctrl-C): no complete checkpoint in" in capsys.readouterr().err


# runs a script as `python script ...` would from a terminal, with faulthandler dumping every thread's stack on
# SIGUSR1 (a run that does not stop when it should says where it is). Ctrl-C gets Python's own handler: a process
# started in the background of a non-interactive shell (as CI may start pytest) inherits SIGINT ignored, and Python then
# leaves it ignored
WITH_STACKS = ("import faulthandler, runpy, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
               "signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def stacks_of_a_stuck_run(run, what):
    """Dumps the stuck process's thread stacks (SIGUSR1), kills it and fails naming `what` it did not do."""
    run.send_signal(signal.SIGUSR1)
    time.sleep(3)
    run.kill()
    _, stderr = run.communicate()
    pytest.fail(f"train_lm.py {what}; its stderr and thread stacks:\n{stderr[-8000:]}")


@pytest.mark.slow
def test_ctrl_c_during_training_names_the_newest_complete_checkpoint_and_exits_130(tmp_path, texts):
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-c", WITH_STACKS, str(ROOT / "scripts" / "train_lm.py"),
                            *tiny_run_args(texts, out, "--max_steps", "100000", "--save_steps", "3")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=SCRIPT_ENV)
    try:
        deadline = time.time() + 240
        while not list(out.glob("checkpoint-*/hfst_checkpoint_complete.json")):
            assert run.poll() is None, run.communicate()[1][-2000:]
            if time.time() > deadline:
                stacks_of_a_stuck_run(run, "wrote no complete checkpoint in 240 s")
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        try:
            _, stderr = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            stacks_of_a_stuck_run(run, "did not exit within 120 s of Ctrl-C")
    finally:
        run.kill()
    assert run.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    line = next(line for line in stderr.splitlines() if "interrupted (Ctrl-C)" in line)
    assert f"resume from {out}/checkpoint-" in line and "--resume_from_checkpoint true" in line


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--model_name_or_path", "{missing}"], ["--model_name_or_path", "no such folder"]),
        (["--num_inducing_points", "-1"], ["Invalid model configuration", "num_inducing_points", "-1"]),
    ],
)
def test_train_sets_model_flags_are_refused_naming_the_flag(tmp_path, extra, words):
    train_sets = load_script("train_sets")
    extra = [e.format(missing=tmp_path / "missing") for e in extra]
    with pytest.raises(SystemExit) as err:
        train_sets.main(["--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none", *extra])
    for word in words:
        assert word in str(err.value.code), str(err.value.code)


def run_script(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=SCRIPT_ENV)


@pytest.mark.parametrize("damaged", ["all_results.json", "config.json"])
def test_push_run_names_a_damaged_json_file(tmp_path, damaged):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("x")
    (folder / "all_results.json").write_text(json.dumps({"validation_perplexity": 9, "test_perplexity": 9,
                                                         "train_tokens": 9}))
    (folder / "config.json").write_text("{}")
    (folder / damaged).write_text('{"cut off')
    result = run_script("push_run", folder, "user/x")
    assert result.returncode == 1 and f"{folder / damaged} is not valid JSON" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", ["lm_results", "set_results"])
def test_results_scripts_name_a_missing_folder_and_skip_a_damaged_file_aloud(tmp_path, script):
    result = run_script(script, tmp_path / "nope")
    assert result.returncode == 1 and f"No such folder: {tmp_path / 'nope'}" in result.stderr, result.stderr[-2000:]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "all_results.json").write_bytes(b"\xff\xfe not json")
    result = run_script(script, tmp_path)
    assert f"skipped {tmp_path / 'run' / 'all_results.json'}: not readable as JSON" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr



"""What a run does with its --output_dir and with what it resumes from: it never deletes or writes over what
it reads or what it did not write, never retrains over a finished run when asked to resume it, resumes only the model
its checkpoint holds, and names the file of a damaged checkpoint or model. Both scripts' `main` run in this process
(tiny models, 1-2 steps); a refusal is a `SystemExit` whose message is checked, and the folder is checked untouched."""

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from tests.helpers import tiny_run_args

SETS = ["--max_steps", "2", "--save_steps", "1", "--report_to", "none", "--eval_sets", "8", "--disable_tqdm", "true"]


def digests(folder):
    """{relative path: sha256} of every file below `folder`: what a refused run must leave as it was."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(main, argv):
    """The message of the SystemExit that `main(argv)` ends with."""
    with pytest.raises(SystemExit) as err:
        main(argv)
    return str(err.value.code)


@pytest.fixture(scope="module")
def lm_run(texts, train_lm, tmp_path_factory):  # noqa: F811
    """A finished tiny decoder run (softmax) with complete checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("lm") / "run"
    train_lm.main(tiny_run_args(texts, out, "--max_steps", "2", "--save_steps", "1", "--save_total_limit", "2"))
    return out


@pytest.fixture(scope="module")
def sets_run(train_sets, tmp_path_factory):
    """A finished tiny max_regression Set Transformer run (softmax) with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("sets") / "run"
    train_sets.main(["--output_dir", str(out), "--hidden_size", "16", *SETS])
    return out


def copy_of(run, tmp_path, name="run"):
    target = tmp_path / name
    shutil.copytree(run, target)
    return target


# ------------------------------------------------------------------------------ 1. what the run reads is not removed


LM_INPUTS = {
    "model": ["--model_name_or_path", "{run}"],
    "model with a trailing slash": ["--model_name_or_path", "{run}/"],
    "checkpoint of the folder": ["--model_name_or_path", "{run}/checkpoint-2"],
    "model through a symlink": ["--model_name_or_path", "{link}"],
    "tokenizer": ["--tokenizer_name", "{run}"],
    "train file in the folder": ["--train_file", "{run}/train.txt"],
}


@pytest.mark.parametrize("case", list(LM_INPUTS))
def test_a_run_never_writes_into_the_folder_it_reads_from(tmp_path, texts, train_lm, lm_run, case):  # noqa: F811
    """`--model_name_or_path X --output_dir X --overwrite_output_dir` deleted X's model, results and checkpoints and
    then failed to load it: refused before anything is touched, naming the flag and how to continue."""
    run = copy_of(lm_run, tmp_path)
    shutil.copy(texts / "train.txt", run / "train.txt")
    (tmp_path / "link").symlink_to(run)
    before = digests(run)
    extra = [x.format(run=run, link=tmp_path / "link") for x in LM_INPUTS[case]]
    for out in (run, tmp_path / "link", f"{run}/../run/"):  # the folder named three ways
        message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1", "--overwrite_output_dir",
                                                       *extra))
        assert f"{extra[0]} {extra[1]}, which this run reads" in message, message
        assert "another --output_dir" in message and "--resume_from_checkpoint true" in message, message
    assert digests(run) == before


def test_a_dataset_folder_or_flags_file_in_the_output_folder_is_refused(tmp_path, texts, train_lm, lm_run,  # noqa: F811
                                                                         monkeypatch):
    run = copy_of(lm_run, tmp_path)
    (run / "wikitext").mkdir()
    before = digests(run)
    argv = tiny_run_args(texts, run, "--max_steps", "1", "--overwrite_output_dir")
    argv = argv[:1] + argv[3:] + ["--dataset_name", str(run / "wikitext")]  # no --train_file: the dataset is read
    message = refused(train_lm.main, argv)
    assert f"--dataset_name {run / 'wikitext'}, which this run reads" in message, message
    flags = run / "flags.json"  # `python train_lm.py flags.json`
    flags.write_text(json.dumps({"do_train": True, "train_file": str(texts / "train.txt"), "preset": "tiny",
                                 "output_dir": str(run), "overwrite_output_dir": True, "max_steps": 1,
                                 "report_to": "none"}))
    monkeypatch.setattr("sys.argv", ["train_lm.py", str(flags)])
    message = refused(train_lm.main, None)
    assert f"the flags file {flags}, which this run reads" in message, message
    flags.unlink()
    assert digests(run) == before


OUTPUT_INSIDE = {
    "another run's checkpoint through a link": ("{link}/sub", [], "is inside {run}/checkpoint-2, a checkpoint of a run"),
    "a checkpoint through a link": ("{link}", [], "is a checkpoint of a run"),
    "another run's folder": ("{run}/sub", [], "is inside {run}, the output folder of another run"),
    "this run's checkpoint": ("{run}/checkpoint-1/sub", ["--resume_from_checkpoint", "true"],
                              "a checkpoint of a run"),
    "the model's folder": ("{run}/sub", ["--model_name_or_path", "{run}"],
                           "is inside --model_name_or_path {run}, a folder this run reads"),
    "the tokenizer's folder": ("{tokenizer}/sub", ["--tokenizer_name", "{tokenizer}"],
                               "is inside --tokenizer_name {tokenizer}, a folder this run reads"),
}


@pytest.mark.parametrize("case", list(OUTPUT_INSIDE))
def test_an_output_dir_inside_a_checkpoint_a_run_or_an_input_folder_is_refused(tmp_path, texts, train_lm, lm_run,  # noqa: F811
                                                                              case):
    """`--output_dir link/sub`, where link is another run's checkpoint-2, wrote a whole run into that checkpoint;
    so did an --output_dir inside another run's folder or inside a folder the run reads. Refused, symbolic links
    resolved, before anything is made."""
    run = copy_of(lm_run, tmp_path)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(run / name, tokenizer / name)
    (tmp_path / "link").symlink_to(run / "checkpoint-2")
    before = digests(tmp_path)
    out, extra, words = OUTPUT_INSIDE[case]
    names = dict(run=run, link=tmp_path / "link", tokenizer=tokenizer)
    extra = [x.format(**names) for x in extra]
    message = refused(train_lm.main, tiny_run_args(texts, out.format(**names), "--max_steps", "1", *extra))
    assert words.format(**names) in message, message
    assert "an --output_dir outside it" in message or "Pass a new folder" in message, message
    assert digests(tmp_path) == before and not (run / "sub").exists()


def test_train_sets_refuses_an_output_dir_inside_a_checkpoint(tmp_path, train_sets, sets_run):
    run = copy_of(sets_run, tmp_path)
    (tmp_path / "link").symlink_to(run / "checkpoint-2")
    before = digests(run)
    message = refused(train_sets.main, ["--output_dir", str(tmp_path / "link" / "sub"), *SETS])
    assert f"is inside {run / 'checkpoint-2'}, a checkpoint of a run" in message and "symbolic link" in message
    assert digests(run) == before


def test_resuming_another_head_of_the_same_config_is_refused():
    """The same config and weight shapes under another head (an encoder's masked-LM checkpoint resumed as its causal
    LM) would resume silently: the checkpoint's architectures name its head."""
    import tempfile

    import hf_settransformer as hfst
    from tests.helpers import tiny_config

    from hf_settransformer.toolkit.checkpoint_files import check_checkpoint_matches

    with tempfile.TemporaryDirectory() as folder:
        hfst.TransformerEncoderForMaskedLM(tiny_config("encoder")).save_pretrained(folder)
        with pytest.raises(SystemExit, match="architectures: .*TransformerEncoderForMaskedLM.*TransformerEncoderFor"
                                             "NextTokenPrediction"):
            check_checkpoint_matches(folder, hfst.families.FAMILIES["encoder"].model_classes()["AutoModelForCausalLM"](tiny_config("encoder")))
        check_checkpoint_matches(folder, hfst.TransformerEncoderForMaskedLM(tiny_config("encoder")))


def test_train_sets_never_writes_into_the_model_folder_it_continues(tmp_path, train_sets, sets_run):
    run = copy_of(sets_run, tmp_path)
    before = digests(run)
    for model in (run, run / "checkpoint-2"):
        message = refused(train_sets.main, ["--output_dir", str(run), "--model_name_or_path", str(model),
                                            "--overwrite_output_dir", *SETS])
        assert f"--model_name_or_path {model}, which this run reads" in message, message
    assert digests(run) == before


# ------------------------------------------------------------------------------------- 2. nothing to resume


def test_resuming_a_finished_run_without_checkpoints_is_refused(tmp_path, texts, train_lm, lm_run):  # noqa: F811
    """Its checkpoints deleted (or --save_strategy no), `--resume_from_checkpoint true` trained from step 0 over the
    finished model and results."""
    run = copy_of(lm_run, tmp_path)
    for checkpoint in run.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    before = digests(run)
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "2", "--resume_from_checkpoint", "true"))
    assert "nothing to resume" in message and "all_results.json" in message and "model.safetensors" in message
    assert "--overwrite_output_dir" in message, message
    assert digests(run) == before


def test_train_sets_resuming_a_finished_run_without_checkpoints_is_refused(tmp_path, train_sets, sets_run):
    run = copy_of(sets_run, tmp_path)
    for checkpoint in run.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    before = digests(run)
    message = refused(train_sets.main, ["--output_dir", str(run), "--hidden_size", "16", "--resume_from_checkpoint",
                                        "true", *SETS])
    assert "nothing to resume" in message and "all_results.json" in message, message
    assert digests(run) == before


def test_resuming_from_a_run_folder_instead_of_a_checkpoint_names_its_checkpoint(tmp_path, texts, train_lm, lm_run):  # noqa: F811
    message = refused(train_lm.main, tiny_run_args(texts, tmp_path / "new", "--max_steps", "1",
                                                   "--resume_from_checkpoint", str(lm_run)))
    assert "not a complete checkpoint" in message and str(lm_run / "checkpoint-2") in message, message


def test_resuming_another_folders_checkpoint_into_a_finished_run_is_refused(tmp_path, texts, train_lm, lm_run):  # noqa: F811
    """An explicit checkpoint from elsewhere made check_output_dir wave the folder through: the finished run in
    --output_dir would have been trained over."""
    run = copy_of(lm_run, tmp_path)
    before = digests(run)
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "2", "--resume_from_checkpoint",
                                                   str(lm_run / "checkpoint-1")))
    assert "holds a finished run" in message and "is no checkpoint of it" in message, message
    assert digests(run) == before


# --------------------------------------------------------------------------------------- 3. the user's own files


def test_a_folder_of_the_users_files_is_neither_taken_over_nor_written_over(tmp_path, texts, train_lm):  # noqa: F811
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("README.md", "config.json", "notes.txt"):
        (out / name).write_text(f"the user's {name}")
    before = digests(out)
    message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1"))
    assert "is not empty and holds no run" in message and "notes.txt" in message, message
    message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1", "--overwrite_output_dir"))
    assert "would write over: README.md, config.json" in message, message
    assert digests(out) == before
    # with only files a run never writes: written beside them with --overwrite_output_dir, and they stay
    (out / "README.md").unlink()
    (out / "config.json").unlink()
    train_lm.main(tiny_run_args(texts, out, "--max_steps", "1", "--overwrite_output_dir"))
    assert (out / "notes.txt").read_text() == "the user's notes.txt" and (out / "all_results.json").is_file()
    # a run of ours with the user's note in it: replaced with --overwrite_output_dir, the note kept
    train_lm.main(tiny_run_args(texts, out, "--max_steps", "1", "--overwrite_output_dir"))
    assert (out / "notes.txt").read_text() == "the user's notes.txt"
    # a folder of the user's named like a checkpoint: transformers' rotation (save_total_limit) would delete it
    (out / "checkpoint-notes").mkdir()
    message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1", "--overwrite_output_dir"))
    assert "holds checkpoint-notes, a folder the Trainer would take for one of its checkpoints" in message, message
    assert (out / "checkpoint-notes").is_dir()


def test_hidden_files_and_the_runs_own_lock_do_not_make_a_folder_the_users(tmp_path, texts, train_lm):  # noqa: F811
    """A .gitignore (or .git) is no file of a run's and no reason to refuse; a killed run's lock file, a run's own
    leftover, neither; a second run that resumes still works."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".gitignore").write_text("*\n")
    (out / ".hfst_run.lock").write_text("{}")  # left by a killed run (the kernel dropped its lock)
    train_lm.main(tiny_run_args(texts, out, "--max_steps", "2", "--save_steps", "1"))
    train_lm.main(tiny_run_args(texts, out, "--max_steps", "3", "--save_steps", "1", "--resume_from_checkpoint", "true"))
    assert json.loads((out / "all_results.json").read_text())["resumed_from_step"] == 2
    assert (out / ".gitignore").read_text() == "*\n"


def test_train_sets_refuses_a_folder_of_the_users_files(tmp_path, train_sets):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text("{}")
    message = refused(train_sets.main, ["--output_dir", str(out), "--overwrite_output_dir", *SETS])
    assert "would write over: config.json" in message, message
    assert (out / "config.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == ["config.json"]


# ------------------------------------------------------------------------------- 4. resuming another model


LM_OTHER_MODEL = {
    "attention_type": (["--attention_type", "linear"], "attention_type: the checkpoint has 'softmax', the flags say "
                                                       "'linear'"),
    # with softmax --feature_map is refused as a flag that cannot apply: linear exp, against the run's softmax (elu)
    "feature_map": (["--attention_type", "linear", "--feature_map", "exp"],
                    "feature_map: the checkpoint has 'elu', the flags say 'exp'"),
    "config_overrides": (["--config_overrides", "hidden_dropout_prob=0.3"], "hidden_dropout_prob: the checkpoint has"),
}


@pytest.mark.parametrize("case", list(LM_OTHER_MODEL))
def test_resuming_with_other_model_flags_is_refused_by_field(tmp_path, texts, train_lm, lm_run, case):  # noqa: F811
    """`--attention_type linear --resume_from_checkpoint true` on a softmax run resumed (the weights have the same
    shapes) and all_results.json said linear."""
    run = copy_of(lm_run, tmp_path)
    before = digests(run)
    extra, words = LM_OTHER_MODEL[case]
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint",
                                                   "true", *extra))
    assert words in message and "checkpoint-2" in message, message
    assert digests(run) == before


def test_train_sets_resuming_with_other_model_flags_is_refused_by_field(tmp_path, train_sets, sets_run):
    run = copy_of(sets_run, tmp_path)
    message = refused(train_sets.main, ["--output_dir", str(run), "--hidden_size", "16", "--attention_type", "linear",
                                        "--resume_from_checkpoint", "true", *SETS])
    assert "attention_type: the checkpoint has 'softmax', the flags say 'linear'" in message, message


# --------------------------------------------------------------------------------------- 5. damaged files


def drop_a_tensor(path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    tensors.pop(sorted(tensors)[0])
    save_file(tensors, path)


class Malicious:
    """Pickled as a call of os.system: what a hostile checkpoint file holds (written here, never loaded)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def plant_pickle(path):
    """Replaces the torch.save file `path` with a whole archive whose pickle would call os.system to make a file
    `ran-<name>` beside it: it must never exist."""
    import torch

    torch.save(Malicious(f"touch {path.with_name('ran-' + path.name)}"), path)


DAMAGES = {
    "no trainer_state.json": (lambda c: (c / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    **{f"foreign pickle in {name}": (lambda c, name=name: plant_pickle(c / name),
                                     f"{name} is a pickle that would call posix.system")
       for name in ("rng_state.pth", "optimizer.pt", "scheduler.pt", "training_args.bin")},
    "no optimizer (--save_only_model)": (lambda c: [(c / n).unlink() for n in ("optimizer.pt", "scheduler.pt")],
                                         "optimizer.pt and scheduler.pt are missing"),
    "truncated weights": (lambda c: os.truncate(c / "model.safetensors", (c / "model.safetensors").stat().st_size // 2),
                          "model.safetensors is damaged"),
    "garbage optimizer.pt": (lambda c: (c / "optimizer.pt").write_bytes(b"garbage" * 100), "optimizer.pt is damaged"),
    "missing tensors": (lambda c: drop_a_tensor(c / "model.safetensors"), "model.safetensors lacks"),
    "no weights": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_checkpoint_is_named_with_the_earlier_one(tmp_path, texts, train_lm, lm_run, case):  # noqa: F811
    run = copy_of(lm_run, tmp_path)
    damage, words = DAMAGES[case]
    damage(run / "checkpoint-2")
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true"))
    assert words in message and str(run / "checkpoint-2") in message, message
    assert f"--resume_from_checkpoint {run / 'checkpoint-1'}" in message, message
    # the only checkpoint damaged: start again
    damage(run / "checkpoint-1")
    shutil.rmtree(run / "checkpoint-2")
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true"))
    assert words in message and "--overwrite_output_dir" in message, message
    assert not list(tmp_path.rglob("ran-*"))  # no planted pickle ran


def test_train_sets_names_a_damaged_checkpoint(tmp_path, train_sets, sets_run):
    run = copy_of(sets_run, tmp_path)
    (run / "checkpoint-2" / "optimizer.pt").write_bytes(b"not a torch file")
    message = refused(train_sets.main, ["--output_dir", str(run), "--hidden_size", "16", "--resume_from_checkpoint",
                                        "true", *SETS])
    assert "optimizer.pt is damaged" in message and str(run / "checkpoint-1") in message, message


def test_train_sets_continuing_a_model_with_damaged_results_still_saves_its_run(tmp_path, train_sets, sets_run,
                                                                                caplog):
    """The parent's all_results.json was read after training and before saving: a damaged one lost the trained model
    to a JSONDecodeError. It is read first, and only its step count is lost."""
    model = copy_of(sets_run, tmp_path, "parent")
    (model / "all_results.json").write_text("{not json")
    results = train_sets.main(["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(model), *SETS])
    assert results["steps_before"] is None and (tmp_path / "out" / "model.safetensors").is_file()
    assert "all_results.json is unreadable" in caplog.text


def pickled_weights(folder, plant=False):
    """The model of `folder` as a pytorch_model.bin instead of its model.safetensors; with `plant`, one whose pickle
    would call os.system."""
    (folder / "model.safetensors").unlink()
    if plant:
        plant_pickle(folder / "pytorch_model.bin")
    else:
        (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short")


MODEL_DAMAGES = {
    "foreign pickle as pytorch_model.bin": (lambda c: pickled_weights(c, plant=True),
                                            "pytorch_model.bin is a pickle that would call posix.system"),
    "damaged pytorch_model.bin": (pickled_weights, "pytorch_model.bin is damaged"),
    "truncated weights": (DAMAGES["truncated weights"][0], "model.safetensors is damaged"),
    "no weights": (DAMAGES["no weights"][0], "holds no weights (model.safetensors is missing)"),
    "missing tensors": (DAMAGES["missing tensors"][0], "model.safetensors lacks"),
}


@pytest.mark.parametrize("case", list(MODEL_DAMAGES))
def test_a_damaged_model_to_continue_is_named(tmp_path, texts, train_lm, train_sets, lm_run, sets_run, case):  # noqa: F811
    damage, words = MODEL_DAMAGES[case]
    model = copy_of(lm_run, tmp_path, "lm")
    damage(model)
    message = refused(train_lm.main, tiny_run_args(texts, tmp_path / "out", "--max_steps", "1",
                                                   "--model_name_or_path", str(model)))
    assert f"--model_name_or_path {model}" in message and words in message, message
    model = copy_of(sets_run, tmp_path, "sets")
    damage(model)
    message = refused(train_sets.main, ["--output_dir", str(tmp_path / "out2"), "--model_name_or_path", str(model),
                                        *SETS])
    assert f"--model_name_or_path {model}" in message and words in message, message
    assert not list(tmp_path.rglob("ran-*"))  # no planted pickle ran


# ------------------------------------------------------------------------------- 6. a folder that cannot be written


def test_an_output_dir_below_a_file_is_named(tmp_path, texts, train_lm, train_sets):  # noqa: F811
    (tmp_path / "file.txt").write_text("a file")
    out = tmp_path / "file.txt" / "run"
    message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1"))
    assert f"--output_dir {out}: cannot make it, {tmp_path / 'file.txt'} is a file" in message, message
    message = refused(train_sets.main, ["--output_dir", str(out), *SETS])
    assert f"--output_dir {out}: cannot make it, {tmp_path / 'file.txt'} is a file" in message, message


def test_an_output_dir_that_is_a_dangling_link_is_named(tmp_path, texts, train_lm):  # noqa: F811
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    message = refused(train_lm.main, tiny_run_args(texts, tmp_path / "link", "--max_steps", "1"))
    assert f"--output_dir {tmp_path / 'link'} is a symbolic link to {tmp_path / 'gone'}, which does not exist" in message


def test_a_read_only_output_dir_is_named(tmp_path, texts, train_lm, train_sets, monkeypatch):  # noqa: F811
    """A read-only file system refuses to make a folder or a file in it (EROFS). Simulated where the writes happen
    (os.mkdir, os.open below `readonly`): chmod would not stop root, whom the tests may run as."""
    readonly = tmp_path / "readonly"
    (readonly / "existing").mkdir(parents=True)
    mkdir, open_ = os.mkdir, os.open

    def refuse(real):
        def call(path, *args, **kwargs):
            if str(path).startswith(str(readonly)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "mkdir", refuse(mkdir))
    monkeypatch.setattr(os, "open", refuse(open_))
    for out in (readonly / "new" / "run", readonly / "existing"):
        message = refused(train_lm.main, tiny_run_args(texts, out, "--max_steps", "1"))
        assert f"--output_dir {out}: cannot make or write it (Read-only file system" in message, message
        message = refused(train_sets.main, ["--output_dir", str(out), *SETS])
        assert f"--output_dir {out}: cannot make or write it (Read-only file system" in message, message


# ------------------------------------------------------------------------- 6. a resume keeps the run's settings


LM_OTHER_SETTINGS = {
    "learning_rate": (["--learning_rate", "0.003"], "learning_rate: the checkpoint's run has"),
    "per_device_train_batch_size": (["--per_device_train_batch_size", "3"], "per_device_train_batch_size:"),
    "gradient_accumulation_steps": (["--gradient_accumulation_steps", "2"], "gradient_accumulation_steps:"),
    "lr_scheduler_type": (["--lr_scheduler_type", "linear"], "the flags say 'linear'"),
    "lr_scheduler_kwargs": (["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"num_cycles": 2}'],
                            "lr_scheduler_kwargs:"),
    "warmup_steps": (["--warmup_steps", "1"], "warmup_steps:"),
    "weight_decay": (["--weight_decay", "0.5"], "weight_decay:"),
    "optim": (["--optim", "sgd"], "optim: the checkpoint's run has 'adamw_torch"),
    "seed": (["--seed", "7"], "seed: the checkpoint's run has 42, the flags say 7"),
    "budget_clock": (["--budget_clock", "wall", "--max_train_minutes", "5"],
                     "budget_clock: the checkpoint's run has 'cpu', the flags say 'wall'"),
    "train_file": (["--train_file", "{other}"], "train_file_sha256:"),
    "neftune_noise_alpha": (["--neftune_noise_alpha", "5"], "neftune_noise_alpha: the checkpoint's run has None"),
    "dataloader_drop_last": (["--dataloader_drop_last", "true"], "dataloader_drop_last: the checkpoint's run has "
                                                                 "False, the flags say True"),
    "train_sampling_strategy": (["--train_sampling_strategy", "sequential"], "train_sampling_strategy:"),
    "accelerator_config": (["--accelerator_config", '{"split_batches": true}'], "accelerator_config:"),
    "precision": (["--precision", "fp32"], "precision: the checkpoint's run has 'bf16', the flags say 'fp32'"),
    "tokenizer": (["--tokenizer_name", "{tokenizer}"], "vocabulary_sha256:"),
}


@pytest.mark.parametrize("case", list(LM_OTHER_SETTINGS))
def test_resuming_with_other_training_settings_is_refused_by_name(tmp_path, texts, train_lm, lm_run, case):  # noqa: F811
    """A resume took its optimizer, scheduler and data position from the checkpoint and wrote the new flags into
    all_results.json: `--learning_rate 0.003` on a run started at another rate was recorded as a 0.003 run."""
    run = copy_of(lm_run, tmp_path)
    other = tmp_path / "other.txt"  # the same words, each line twice: another text with the same vocabulary
    other.write_text("".join(line + line for line in (texts / "train.txt").read_text().splitlines(keepends=True)))
    # a tokenizer of the same words (the same size: the checkpoint's config fits) with other ids
    from hf_settransformer.toolkit import build_word_tokenizer

    lines = (texts / "train.txt").read_text().splitlines()
    build_word_tokenizer(lines + [" ".join(["w39"] * 1000)]).save_pretrained(tmp_path / "tokenizer")
    before = digests(run)
    extra, words = LM_OTHER_SETTINGS[case]
    length = [] if "--max_train_minutes" in extra else ["--max_steps", "3"]  # a time budget sets the steps itself
    args = tiny_run_args(texts, run, *length, "--resume_from_checkpoint", "true")
    args += [word.replace("{other}", str(other)).replace("{tokenizer}", str(tmp_path / "tokenizer")) for word in extra]
    message = refused(train_lm.main, args)
    assert words in message and "checkpoint-2" in message and "flags that started the run" in message, message
    assert digests(run) == before


def test_resuming_longer_or_with_other_logging_keeps_the_run(tmp_path, texts, train_lm, lm_run):  # noqa: F811
    """What may change on resume: the run's length, how often it logs, evaluates and saves, the data file's path
    (its content decides); the new checkpoint records the run's settings again."""
    run = copy_of(lm_run, tmp_path)
    moved = tmp_path / "moved.txt"
    shutil.copy(texts / "train.txt", moved)
    args = tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true", "--logging_steps", "1",
                         "--save_steps", "3", "--train_file", str(moved), "--dataloader_num_workers", "0")
    started = json.loads((run / "checkpoint-2" / "hfst_checkpoint_complete.json").read_text())["run_settings"]
    train_lm.main(args)
    assert json.loads((run / "all_results.json").read_text())["resumed_from_step"] == 2
    settings = json.loads((run / "checkpoint-3" / "hfst_checkpoint_complete.json").read_text())["run_settings"]
    assert settings == started
    assert settings["learning_rate"] > 0 and len(settings["train_file_sha256"]) == 64


def test_a_checkpoint_without_run_settings_resumes_with_a_warning_that_says_what_was_compared(  # noqa: F811
        tmp_path, texts, train_lm, lm_run, monkeypatch):
    """A marker without its run settings (an older version's, or edited): the training arguments are still compared
    with the checkpoint's training_args.bin, so --learning_rate 0.003 on a 0.002 run is refused; the same flags resume
    with a warning that says what could and could not be compared (it said the checkpoint was "made before they were
    recorded", which it cannot know)."""
    from hf_settransformer.toolkit import resume_settings

    run = copy_of(lm_run, tmp_path)
    for marker in run.glob("checkpoint-*/hfst_checkpoint_complete.json"):
        marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "run_settings"}))
    before = digests(run)
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true",
                                                   "--learning_rate", "0.003"))
    assert "learning_rate: the checkpoint's run has 0.002 (its training_args.bin), the flags say 0.003" in message
    assert digests(run) == before
    warnings = []
    monkeypatch.setattr(resume_settings.logger, "warning", warnings.append)
    train_lm.main(tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true"))
    assert json.loads((run / "all_results.json").read_text())["resumed_from_step"] == 2
    (warning,) = warnings
    assert "checkpoint-2" in warning and "records no run settings" in warning, warning
    assert "compared with its training_args.bin" in warning and "made before" not in warning, warning


def test_a_marker_edited_to_match_other_flags_is_not_believed(tmp_path, texts, train_lm, lm_run):  # noqa: F811
    """Run settings changed by hand to the new flags' values: the checkpoint's training_args.bin (what the Trainer ran
    with) still tells, and the message names both."""
    run = copy_of(lm_run, tmp_path)
    marker = run / "checkpoint-2" / "hfst_checkpoint_complete.json"
    content = json.loads(marker.read_text())
    content["run_settings"].update(learning_rate=0.003, dataloader_drop_last=True)
    marker.write_text(json.dumps(content))
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true",
                                                   "--learning_rate", "0.003", "--dataloader_drop_last", "true"))
    for words in ("learning_rate: the checkpoint's run has 0.002 (its training_args.bin; its "
                  "hfst_checkpoint_complete.json says 0.003), the flags say 0.003",
                  "dataloader_drop_last: the checkpoint's run has False (its training_args.bin; its "
                  "hfst_checkpoint_complete.json says True), the flags say True"):
        assert words in message, message


def test_precision_auto_is_compared_as_what_it_resolved_to(tmp_path, texts, train_lm, monkeypatch):  # noqa: F811
    """A run recorded as --precision auto that ran in fp32 (a CPU without a fast bf16 path) resumes with --precision
    fp32 (it was refused: "auto" is not "fp32"); a resume that would compute in bf16 is refused."""
    from hf_settransformer.toolkit import lm_arguments

    run = tmp_path / "run"
    monkeypatch.setattr(lm_arguments, "fast_bf16_available", lambda use_cpu=False: False)
    train_lm.main(tiny_run_args(texts, run, "--max_steps", "2", "--save_steps", "1"))
    marker = run / "checkpoint-2" / "hfst_checkpoint_complete.json"
    content = json.loads(marker.read_text())
    assert content["run_settings"]["precision"] == "fp32"
    content["run_settings"]["precision"] = "auto"  # as earlier versions recorded it
    marker.write_text(json.dumps(content))
    monkeypatch.setattr(lm_arguments, "fast_bf16_available", lambda use_cpu=False: True)
    message = refused(train_lm.main, tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true"))
    assert "bf16: the checkpoint's run has False, the flags say True" in message, message
    results = train_lm.main(tiny_run_args(texts, run, "--max_steps", "3", "--resume_from_checkpoint", "true",
                                          "--precision", "fp32"))
    assert results["resumed_from_step"] == 2 and results["precision"] == "fp32"


@pytest.fixture(scope="module")
def deepsets_run(train_sets, tmp_path_factory):
    """A finished tiny max_regression rFF + max-pooling baseline with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("deepsets") / "run"
    train_sets.main(["--output_dir", str(out), "--model", "deepsets_max", "--hidden_size", "16", *SETS])
    return out


SETS_OTHER_SETTINGS = {
    "model": (["--model", "deepsets_sum"], "model: the checkpoint's run has 'deepsets_max', the flags say "
                                           "'deepsets_sum'"),
    "max_size": (["--model", "deepsets_max", "--max_size", "5"], "max_size: the checkpoint's run has 10, the flags "
                                                                  "say 5"),
    "max_values": (["--model", "deepsets_max", "--max_values", "integer"], "max_values:"),
    "learning_rate": (["--model", "deepsets_max", "--learning_rate", "0.5"], "learning_rate:"),
    "dataloader_drop_last": (["--model", "deepsets_max", "--dataloader_drop_last", "true"], "dataloader_drop_last:"),
}


@pytest.mark.parametrize("case", list(SETS_OTHER_SETTINGS))
def test_train_sets_resuming_another_baseline_or_settings_is_refused(tmp_path, train_sets, deepsets_run, case):
    """`--model deepsets_sum` resumed a deepsets_max checkpoint (same weight shapes, no config.json to tell them
    apart) and all_results.json said deepsets_sum; so did other data or training flags."""
    run = copy_of(deepsets_run, tmp_path)
    before = digests(run)
    extra, words = SETS_OTHER_SETTINGS[case]
    message = refused(train_sets.main, ["--output_dir", str(run), "--hidden_size", "16", *extra,
                                        "--resume_from_checkpoint", "true", *SETS])
    assert words in message and "checkpoint-2" in message, message
    assert digests(run) == before

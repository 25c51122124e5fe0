"""Training utilities for your own Trainer scripts: checkpoints that are marked complete, safe resumption, the
training time and validation curve of a run across resumes, a training-time budget (and the `max_steps` that fits
it), the measurements of a run, the machine it ran on and its model FLOPs utilisation (a table of GPU peaks), the
Trainer settings a GPU run expects, and an upload without pickles (the model card it carries: `cards`).

Typical use (docs/training.md, "Use the pieces in your own script"):

    resume = resolve_resume(training_args)
    timer, budget, callbacks = timed_callbacks(resume, clock="cpu", max_minutes=30)
    trainer = Trainer(..., callbacks=callbacks)
    results = train_and_measure(trainer, resume, timer, budget)

Needs torch and transformers only (no accelerate or datasets); the modeling files never import it.
"""

import contextlib
import copy
import dataclasses
import errno
import inspect
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import torch
import transformers
from transformers import TrainerCallback, TrainerState
from transformers.utils import logging as hf_logging

# the toolkit's messages: warnings reach stderr wherever logging is not configured (Python's last-resort handler);
# the scripts show them and their own INFO lines on stdout (`log_to_stdout`)
logger = hf_logging.get_logger(__name__)
LOGGER_ROOT = "hf_settransformer"

COMPLETE_MARKER = "hfst_checkpoint_complete.json"  # in a checkpoint folder the Trainer has finished writing
LOCK_FILE = ".hfst_run.lock"  # in the output folder of a live run (OutputDirLock)


class OutputDirLockedError(RuntimeError):
    """Another live process holds the output folder."""


class OutputDirLock:
    """A run owns its output folder: two runs writing one folder would interleave checkpoints and results, and a
    resuming run would move aside the checkpoint a live run is still writing.

    `acquire()` takes an exclusive `fcntl.flock` on `output_dir/.hfst_run.lock` (making the folder where there is
    none) and writes the holder's pid, host, start time and command into it. The kernel drops the lock when its
    process ends, however it ends (SIGKILL included), so a dead holder's folder is taken over without a word, and a
    live holder's gives `OutputDirLockedError` naming its pid and host. Hold it for the whole run: `release()` removes
    the lock file, and the folders `acquire()` made if nothing else was written into them (a run that failed before
    writing anything leaves no trace). On systems without `fcntl` (Windows) no lock is taken."""

    def __init__(self, output_dir, command=""):
        self.path = Path(output_dir) / LOCK_FILE
        self.command, self.handle, self.created = command, None, []

    def acquire(self):
        try:
            import fcntl
        except ImportError:  # not POSIX: run unlocked
            return self
        missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.created = [p for p in missing if p.is_dir()]  # deepest first, as release removes them
        while True:
            handle = self._open()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                try:
                    info = json.loads(holder)
                    who = f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
                except (ValueError, KeyError, TypeError):
                    who = "another process"
                raise OutputDirLockedError(
                    f"{self.path.parent} is in use by {who}. Two runs must not share an output folder: wait for it "
                    "to finish, stop it, or pass another --output_dir."
                ) from None
            # a holder's release removes the file: one opened before that removal is locked by no one else, so a
            # lock on it would be a second lock on the folder; open the path again
            if self._is_the_file_at_path(handle):
                break
            handle.close()
        handle.seek(0)
        handle.truncate()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": self.command}
        handle.write(json.dumps(holder))
        handle.flush()
        self.handle = handle
        return self

    def _open(self):
        """The lock file, opened for reading and writing without following a link: a symlink (or anything but a
        regular file) at its path is refused, so a run never writes through it into a file that is not its own."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            kind = "a symbolic link" if self.path.is_symlink() else "not a regular file"
            raise OutputDirLockedError(
                f"{self.path} is {kind}; a run writes its lock only into a regular file of its own. Remove it (or pass "
                "another --output_dir)."
            )
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # no link followed, even one made just now
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            raise OutputDirLockedError(f"{self.path} cannot be opened as a lock file: {err}") from None
        return os.fdopen(fd, "r+")

    def _is_the_file_at_path(self, handle):
        """Whether the open `handle` is the file now at the lock's path (not one a releasing holder removed)."""
        try:
            ours, now = os.fstat(handle.fileno()), os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (ours.st_dev, ours.st_ino) == (now.st_dev, now.st_ino)

    def release(self):
        if self.handle is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked: a process that opened it meanwhile opens the path again
        self.handle.close()  # closing the file drops the flock
        self.handle = None
        for folder in self.created:  # made by acquire and still empty: the run wrote nothing there
            try:
                folder.rmdir()
            except OSError:
                break
        self.created = []

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# TrainingArguments values that transformers 5.23 accepts and then ignores or misreads: flag -> (test, what it must be).
# `eval_steps` 0 would become `logging_steps` in `__post_init__`, `save_total_limit` 0 or less keeps every checkpoint,
# a negative `max_grad_norm` or `max_steps` 0 turns clipping or the step limit off, NaN fails every test
TRAINING_VALUE_RANGES = {
    "save_steps": (lambda v: _finite(v) and v > 0, "a positive number (steps, or a fraction of the run if < 1)"),
    "eval_steps": (lambda v: v is None or (_finite(v) and v > 0),
                   "a positive number (steps, or a fraction of the run if < 1); omit it to evaluate every "
                   "--logging_steps"),
    "logging_steps": (lambda v: _finite(v) and v > 0, "a positive number (steps, or a fraction of the run if < 1)"),
    "save_total_limit": (lambda v: v is None or v >= 1, "a positive integer; omit it to keep every checkpoint"),
    "max_steps": (lambda v: v == -1 or v >= 1, "a positive integer, or -1 to train for --num_train_epochs"),
    "warmup_steps": (_finite, "a finite number (steps, or a fraction of the run if < 1)"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "max_grad_norm": (lambda v: _finite(v) and v >= 0, "a non-negative finite number (0 turns clipping off)"),
    "adam_beta1": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_beta2": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_epsilon": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "label_smoothing_factor": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "eval_accumulation_steps": (lambda v: v is None or v >= 1, "a positive integer"),
}


def check_training_values(args):
    """Refuses the `TrainingArguments` values of `TRAINING_VALUE_RANGES` that would be ignored or misread, naming the
    flag; run before `TrainingArguments.__post_init__` (which rewrites `eval_steps` 0), as `CheckedTrainingArguments`
    does."""
    for name, (valid, allowed) in TRAINING_VALUE_RANGES.items():
        value = getattr(args, name)
        if not valid(value):
            raise ValueError(f"--{name} must be {allowed}, got {value}.")
    epochs = args.num_train_epochs
    if args.max_steps == -1 and not (_finite(epochs) and epochs > 0):  # with --max_steps it is not read
        raise ValueError(f"--num_train_epochs must be a positive number (or pass --max_steps), got {epochs}.")


@dataclass
class CheckedTrainingArguments(transformers.TrainingArguments):
    """`TrainingArguments` that refuse the values transformers would ignore or misread (`check_training_values`)."""

    def __post_init__(self):
        check_training_values(self)
        super().__post_init__()


def parse_flags(parse, *args, **kwargs):
    """`parse(*args, **kwargs)` (an `HfArgumentParser` parse); a value the argument classes refuse (a `ValueError`
    naming the flag, theirs or transformers') ends the process with its message, not a traceback."""
    try:
        return parse(*args, **kwargs)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def unknown_flags_message(parser, unknown):
    """What to say of `unknown`, the arguments an `argparse` parser (an `HfArgumentParser` too) left over
    (`parse_known_args`): each flag it does not take named with the nearest one it does ("did you mean", difflib, as a
    config key the config lacks is named), and any value that belongs to no flag. transformers' own message ("Some
    specified arguments are not used by the HfArgumentParser") suggests nothing."""
    import difflib

    flags = sorted(option for option in parser._option_string_actions if option.startswith("--"))
    problems, after_flag = [], False
    for arg in unknown:
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            near = difflib.get_close_matches(name, flags, n=1)
            problems.append(f"unknown flag {name}" + (f" (did you mean {near[0]}?)" if near else ""))
            after_flag = "=" not in arg
        elif after_flag:  # the unknown flag's value
            after_flag = False
        else:
            problems.append(f"unexpected argument {arg!r} (no flag takes it)")
    return "; ".join(problems)


def check_flags(parser, args):
    """Raises a `ValueError` naming every argument of `args` that `parser` does not take, with the nearest flag it does
    (`unknown_flags_message`). `args`: a command line (a list of strings), or for an `HfArgumentParser` a dict of
    field values (what `parse_dict` takes: a key is a flag without its dashes). Call it before
    `parse_args_into_dataclasses` / `parse_dict`, so that a misspelt flag is the error, not a value check of the
    dataclasses built without it."""
    if isinstance(args, dict):
        fields = {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype) if f.init}
        unknown = [f"--{key}" for key in args if key not in fields]
    else:
        _, unknown = parser.parse_known_args(args=args)
    if unknown:
        raise ValueError(unknown_flags_message(parser, unknown))


def load_pretrained(flag, value, load, **kwargs):
    """`load(value, **kwargs)` (a `from_pretrained`) for a saved folder or a Hub repo id; a value that is neither, or
    that fails to load, ends the process naming the script's `flag` (transformers reads a missing folder as a repo id
    and answers "Repo id must be in the form ..."), and saying so when the Hub is off (HF_HUB_OFFLINE)."""
    path = check_pretrained_name(flag, value)
    try:
        return load(str(path) if path.is_dir() else value, **kwargs)
    except (OSError, ValueError) as err:
        if path.is_dir():
            raise SystemExit(f"{flag} {value}: could not load from this folder: {err}") from None
        if isinstance(err, ValueError):
            raise
        raise SystemExit(
            f"{flag} {value}: no such folder, and no Hub repo of that name could be loaded: "
            f"{str(err).splitlines()[0]}{_offline_note()}"
        ) from None


def check_pretrained_name(flag, value):
    """What `load_pretrained` checks before loading, without loading: `value` is a folder, or has the form of a Hub repo
    id; a file or a missing folder ends the process naming `flag`. Returns the path (`~` expanded)."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise SystemExit(f"{flag} {value}: is a file; a saved model or tokenizer is a folder (save_pretrained).")
    if not path.is_dir() and not re.fullmatch(r"[\w-][\w.-]*(/[\w-][\w.-]*)?", value):
        raise SystemExit(f"{flag} {value}: no such folder (and not a Hub repo id).{_offline_note()}")
    return path


def _offline_note():
    # what a failed load adds where the Hub is off
    return (" The Hub is not reachable (HF_HUB_OFFLINE is set): only folders and models already in the cache load."
            if huggingface_hub.is_offline_mode() else "")


def from_main_process(value):
    """`value` as the main process has it, on every process (a picklable object; itself without several processes).
    What every rank must agree on (a lock's owner, a time budget's max_steps) is decided on rank 0 and sent from there:
    each rank deciding alone (its own timing probe) can disagree, and a rank that stops first leaves the others waiting
    in their next collective."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    if torch.distributed.get_world_size() == 1:
        return value
    shared = [value]
    torch.distributed.broadcast_object_list(shared, src=0)
    return shared[0]


def lock_output_dir(training_args, command="", script="train"):
    """Takes the `OutputDirLock` of `training_args.output_dir` on the main process and returns it; under several
    processes every rank learns whether it was taken, and all exit with the holder named if it was not."""
    out = Path(training_args.output_dir)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"[{script}] --output_dir {out} is a file, not a folder: pass a folder (new or one of a run).")
    lock = OutputDirLock(training_args.output_dir, command)
    error = None
    if training_args.process_index == 0:
        try:
            lock.acquire()
        except OutputDirLockedError as err:
            error = str(err)
    error = from_main_process(error)
    if error:
        raise SystemExit(f"[{script}] {error}")
    return lock


# what a run leaves in its output folder, besides its checkpoints: a folder holding any of them holds a run
RUN_FILES = ("all_results.json", "model.safetensors", "trainer_state.json", "time_budget.json", "training_args.json")


def check_output_dir(training_args, overwrite=False, script="train"):
    """Refuses (SystemExit naming what is there) an `--output_dir` that holds a finished or partial run, unless the
    run resumes it (`--resume_from_checkpoint`) or replaces it (`overwrite`: the old run's checkpoints and files are
    removed first, by the main process). transformers 5 has no
    `overwrite_output_dir`: without this a second command on the same folder silently replaced the first run's
    checkpoints, weights, results and card. Call it while holding the folder's lock (`lock_output_dir`)."""
    out = Path(training_args.output_dir)
    if not out.is_dir():
        return
    found = sorted(p.name for p in out.iterdir()
                   if p.name in RUN_FILES or p.name.startswith(("checkpoint-", "incomplete-checkpoint-")))
    if not found or _resume_requested(training_args.resume_from_checkpoint):
        return
    if overwrite:
        if training_args.process_index == 0:
            logger.warning(f"[{script}] --overwrite_output_dir: removing the earlier run in {out} ({', '.join(found)})")
            for name in found:
                path = out / name
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        return
    state = "a finished run" if "all_results.json" in found else "a partial run"
    listed = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    raise SystemExit(
        f"[{script}] --output_dir {out} holds {state} ({listed}). Pass --resume_from_checkpoint true to continue it, "
        "--overwrite_output_dir to replace it, or another --output_dir."
    )


def replace_atomically(source_dir, target_dir, last=("model.safetensors",)):
    """Moves every file of `source_dir` into `target_dir` with `os.replace` (atomic per file), the weights (`last`)
    after the rest, then removes `source_dir`: a kill at any moment leaves each file whole, old or new, never
    truncated."""
    source_dir, target_dir = Path(source_dir), Path(target_dir)
    files = sorted((p for p in source_dir.rglob("*") if p.is_file()), key=lambda p: (p.name in last, str(p)))
    for path in files:
        target = target_dir / path.relative_to(source_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    shutil.rmtree(source_dir, ignore_errors=True)


@contextlib.contextmanager
def _whole_model_saves(trainer):
    """Within it, `trainer.save_model` of an FSDP model writes what one process would (`model.safetensors`,
    `config.json`, the code): with `SHARDED_STATE_DICT` the Trainer saves no model at all, only its checkpoints'
    distributed state. Every process takes part in gathering the weights."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if not trainer.is_fsdp_enabled or plugin is None or "FULL_STATE_DICT" in str(plugin.state_dict_type):
        yield
        return
    from torch.distributed.fsdp import StateDictType

    sharded = plugin.state_dict_type
    plugin.state_dict_type = StateDictType.FULL_STATE_DICT
    try:
        yield
    finally:
        plugin.state_dict_type = sharded


def save_model_atomically(trainer, output_dir=None):
    """`trainer.save_model(output_dir)` written through a temporary folder beside it and moved into place file by file
    (`replace_atomically`): a run killed while saving its final model leaves the previous files whole, never a
    truncated `model.safetensors`. Every process calls it, as `save_model`. A model with a config gets its class's
    `use_cache` default back first (`restore_use_cache`): the saved model is for inference. A sharded model (FSDP with
    either state-dict type, ZeRO-3) is saved whole, as one process saves it (`_whole_model_saves`)."""
    output_dir = Path(output_dir or trainer.args.output_dir)
    config = getattr(trainer.accelerator.unwrap_model(trainer.model), "config", None)  # None: a plain nn.Module
    if config is not None:
        restore_use_cache(config)
    tmp = output_dir / ".tmp-final-model"  # one run per folder (OutputDirLock): a leftover is a killed save's
    if trainer.args.should_save:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    with _whole_model_saves(trainer):
        trainer.save_model(str(tmp))
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        replace_atomically(tmp, output_dir)
    trainer.accelerator.wait_for_everyone()


def restore_use_cache(config):
    """The Trainer sets `config.use_cache = args.use_cache` (False) for training (transformers 5.23), and a model
    saved after training would keep it: a decoder loaded from it would return no key/value cache or recurrent state
    unless asked. Sets it back to the config class's default, or removes it where the class has none."""
    default = inspect.signature(type(config).__init__).parameters.get("use_cache")
    if default is not None and default.default is not inspect.Parameter.empty:
        config.use_cache = default.default
    elif "use_cache" in vars(config):
        del config.use_cache


def write_text_atomically(path, text):
    """Writes `text` to `path` through a temporary file and `os.replace`: never a half-written file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CompleteCheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete once the Trainer has written all of it (atomic rename), so that a run killed while
    saving never resumes from a half-written folder. The marker also carries the training time and validation curve
    so far (`timer`, a TimedEvalCallback), which a resumed run continues from."""

    def __init__(self, timer):
        self.timer = timer

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        best = Path(args.output_dir) / f"checkpoint-{state.best_global_step}" if state.best_global_step else None
        if args.load_best_model_at_end and best is not None and best.is_dir() and state.best_model_checkpoint != str(best):
            # transformers 5.23 records the best checkpoint only if its folder exists when it looks, which under FSDP's
            # SHARDED_STATE_DICT is before anything is written to it: the ranks then disagree (None on one, an older
            # checkpoint on another), and the best-model load at the end runs mismatched collectives. Every rank sees
            # the folder now; the checkpoint's own state says so too.
            state.best_model_checkpoint = str(best)
            if state.is_world_process_zero and folder.is_dir():
                state.save_to_json(str(folder / "trainer_state.json"))
        if state.is_world_process_zero:
            if folder.is_dir():
                tmp = folder / (COMPLETE_MARKER + ".tmp")
                marker = {
                    "global_step": state.global_step,
                    "time": time.time(),
                    "train_seconds": self.timer.elapsed(),
                    "clock": self.timer.clock,
                    "validation_curve": self.timer.points,
                }
                with open(tmp, "w") as f:
                    json.dump(marker, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / COMPLETE_MARKER)


def read_marker(folder):
    """The completion marker of a checkpoint folder as a dict, or None when it is missing or not a JSON object."""
    try:
        marker = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_step(folder):
    """`.../checkpoint-1464` -> 1464; a folder named otherwise gives the step its marker or trainer state records."""
    suffix = Path(folder).name.split("-")[-1]
    if suffix.isdigit():
        return int(suffix)
    for source in (read_marker(folder) or {}, Path(folder) / "trainer_state.json"):
        if isinstance(source, Path):
            try:
                source = json.loads(source.read_text())
            except (OSError, ValueError):
                continue
        step = source.get("global_step") if isinstance(source, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    raise ValueError(
        f"{folder}: cannot tell the checkpoint's step (its name does not end in -<step>, and neither "
        f"{COMPLETE_MARKER} nor trainer_state.json records a `global_step`)."
    )


def _resume_requested(value):
    """Whether `--resume_from_checkpoint` asks to resume: a path or "true"; None, "false", "0" and "none" do not."""
    return value is not None and str(value).lower() not in ("false", "0", "none")


def resolve_resume(training_args, script="train"):
    """`--resume_from_checkpoint true` -> the newest *complete* checkpoint; incomplete ones are set aside. `script`
    names the caller in what it prints. Call it while holding the folder's `OutputDirLock`: no other live run can be
    writing a checkpoint there, so one without a marker was left by a killed run."""
    value = training_args.resume_from_checkpoint
    if not _resume_requested(value):
        return None
    if _resume_newest(value):
        folders = sorted(
            (p for p in Path(training_args.output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
            key=checkpoint_step,
        )
        complete = [p for p in folders if read_marker(p) is not None]  # oldest first
        for p in folders:
            if p not in complete and training_args.process_index == 0:
                aside = p.with_name(f"incomplete-{p.name}")
                logger.warning(f"[{script}] {p} was never completely written (killed while saving?): moved to {aside}")
                shutil.rmtree(aside, ignore_errors=True)
                p.rename(aside)
        if not complete:
            logger.info(f"[{script}] no complete checkpoint in {training_args.output_dir}: training starts at step 0")
            return None
        return str(complete[-1])
    return check_resume_checkpoint(training_args)


def _resume_newest(value):
    """Whether `--resume_from_checkpoint` names no folder but asks for the newest complete checkpoint."""
    return str(value).lower() in ("true", "1", "last", "latest")


def check_resume_checkpoint(training_args):
    """The checkpoint folder `--resume_from_checkpoint` names, checked (a folder, complete, with a readable marker and
    step; SystemExit naming the flag otherwise), or None where it names none (not given, or "true": the newest in
    --output_dir, which `resolve_resume` finds under the lock). Reads only: a script can call it before it makes its
    output folder."""
    value = training_args.resume_from_checkpoint
    if not _resume_requested(value) or _resume_newest(value):
        return None
    if not Path(value).is_dir():
        raise SystemExit(f"--resume_from_checkpoint {value}: no such folder (a checkpoint-<step> folder of a run, or "
                         "true for the newest complete one in --output_dir).")
    if not (Path(value) / COMPLETE_MARKER).is_file():
        raise SystemExit(f"--resume_from_checkpoint {value}: not a complete checkpoint (no {COMPLETE_MARKER}).")
    if read_marker(value) is None:
        raise SystemExit(
            f"--resume_from_checkpoint {value}: its {COMPLETE_MARKER} is not a JSON object (corrupted?); resume from "
            "another checkpoint."
        )
    try:
        checkpoint_step(value)
    except ValueError as err:
        raise SystemExit(f"--resume_from_checkpoint {err}") from None
    return value


def check_checkpoint_matches(folder, model):
    """Raises SystemExit when the checkpoint's weights do not fit `model` (another family, size or output layer),
    naming the checkpoint's model type and the config fields that differ, instead of the optimizer's "parameter group
    doesn't match" later."""
    weights = Path(folder) / "model.safetensors"
    if not weights.is_file():
        return
    try:  # the safetensors header: 8 bytes of length, then JSON {name: {"dtype", "shape", "data_offsets"}}
        with open(weights, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        saved = {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(f"--resume_from_checkpoint {folder}: {weights.name} is not a readable safetensors file.")
    state = model.state_dict()
    wanted = {name: tuple(t.shape) for name, t in state.items()}
    # tied weights are saved once: a name sharing its storage with a saved one is not missing
    saved_storage = {state[name].data_ptr() for name in saved if name in state}
    missing = sorted(name for name in set(wanted) - set(saved) if state[name].data_ptr() not in saved_storage)
    unexpected = sorted(set(saved) - set(wanted))
    reshaped = sorted(name for name in set(saved) & set(wanted) if saved[name] != wanted[name])
    if not (missing or unexpected or reshaped):
        return
    try:
        theirs = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        theirs = {}
    ours = model.config.to_dict()
    ignore = {"_name_or_path", "transformers_version", "architectures", "auto_map", "dtype", "torch_dtype"}
    differ = [
        f"{key}: checkpoint {theirs.get(key)!r}, this run {ours.get(key)!r}"
        for key in sorted(set(theirs) | set(ours))
        if key not in ignore and theirs.get(key) != ours.get(key)
    ]
    first = (missing + unexpected + reshaped)[0]
    raise SystemExit(
        f"--resume_from_checkpoint {folder}: its weights do not fit this run's model. The checkpoint is a "
        f"{theirs.get('model_type', '?')} model ({', '.join(theirs.get('architectures') or ['?'])}), this run builds "
        f"a {ours.get('model_type')} model ({type(model).__name__}). Config fields that differ: "
        f"{'; '.join(differ[:12]) or 'none'}. First mismatched weight: {first} "
        f"(checkpoint {saved.get(first)}, this run {wanted.get(first)}). Resume with the flags that made the "
        "checkpoint, or start a fresh --output_dir."
    )


def newest_complete_checkpoint(output_dir):
    """The `checkpoint-<step>` folder of `output_dir` with the highest step and a completion marker, or None."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    complete = [p for p in folders if read_marker(p) is not None]
    return max(complete, key=checkpoint_step, default=None)


# a full disk as a failed write reports it: OSError's errno, or torch.save's C++ writer (no errno, text only)
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
WRITE_FAILED_TEXTS = ("iostream error", "file write failed", "PytorchStreamWriter failed")


def disk_full_words(err):
    """"the disk is full" for a write refused for space, "the disk is probably full" for torch.save's writer failing
    without saying why, None for any other error."""
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return "the disk is full"
    if isinstance(err, (OSError, RuntimeError)) and any(text in str(err) for text in WRITE_FAILED_TEXTS):
        return "a write failed: the disk is probably full"
    return None


def where_to_resume(output_dir):
    """One sentence: the newest complete checkpoint to resume from, or that there is none yet."""
    newest = newest_complete_checkpoint(output_dir)
    if newest is None:
        return f"no complete checkpoint in {output_dir} yet: a new run starts at step 0."
    return (f"resume from {newest} (step {checkpoint_step(newest)}, complete) with the same command and "
            "--resume_from_checkpoint true.")


class _StdoutHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stdout` is when a record arrives (a notebook's or pytest's capture
    replaces it after the handler is made)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def log_to_stdout(main_process=True):
    """How the scripts show messages: the `hf_settransformer` loggers (the toolkit's and the scripts', made with
    transformers' `logging.get_logger`) write one plain line each to stdout, INFO and up on the main process and
    WARNING and up on the others (as transformers' example scripts log from the main process). Returns the scripts'
    logger (`hf_settransformer.scripts`). Calling it again only sets the level."""
    root = logging.getLogger(LOGGER_ROOT)
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if main_process else logging.WARNING)
    return hf_logging.get_logger(f"{LOGGER_ROOT}.scripts")


@contextlib.contextmanager
def stops_say_where_to_resume(output_dir, script="train"):
    """Ctrl-C (SIGINT) or a full disk inside the block ends the process in one line naming the newest complete
    checkpoint to resume from (or that there is none yet), instead of a traceback: exit code 130 for the interrupt,
    1 for the disk. A checkpoint being written when it happened has no completion marker, so it is never the one
    named, and a resumed run sets it aside."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"[{script}] interrupted (Ctrl-C): {where_to_resume(output_dir)}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    except (OSError, RuntimeError) as err:
        words = disk_full_words(err)
        if words is None:
            raise
        try:
            free = f"{shutil.disk_usage(output_dir).free / 2**20:,.0f} MiB free now"
        except OSError:
            free = "free space unknown"
        raise SystemExit(
            f"[{script}] {words}: writing in {output_dir} failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else err}; {free}). Free some space, then "
            f"{where_to_resume(output_dir)}"
        ) from None


def train_unless_finished(trainer, resume, script="train"):
    """`trainer.train(resume_from_checkpoint=resume)`, except that a checkpoint at or past `max_steps` (a run stopped
    in its final evaluation, say) is only loaded (and then, with `load_best_model_at_end`, the run's best checkpoint,
    as Trainer.train ends): Trainer.train would still take one more step (transformers 5.23 checks `max_steps` after a
    step). Returns the mean training loss of the steps this call ran (0.0 for none). Ctrl-C or a full disk ends the
    process naming the checkpoint to resume from (`stops_say_where_to_resume`; `script` names the caller)."""
    if resume and checkpoint_step(resume) >= trainer.args.max_steps > 0:
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        trainer._load_from_checkpoint(resume)
        best = trainer.state.best_model_checkpoint
        if trainer.args.load_best_model_at_end and best and Path(best).is_dir():
            trainer._load_best_model()  # as Trainer.train ends: the run's result is its best checkpoint
        return 0.0
    with stops_say_where_to_resume(trainer.args.output_dir, script=script):
        return trainer.train(resume_from_checkpoint=resume).training_loss


def whole_run_train_loss(log_history, resumed_from, process_loss, process_steps):
    """Mean training loss of a run, resumed or not. The Trainer's `training_loss` averages only the steps this process
    ran (`process_steps` after step `resumed_from`); a resumed run adds the losses logged before its checkpoint (each
    logged loss is the mean of the steps since the previous log), weighted by the steps each covers. The steps between
    the checkpoint's last log and the checkpoint were never recorded and are left out."""
    total, steps, last = process_loss * process_steps, process_steps, 0
    for entry in log_history:
        if "loss" in entry and entry["step"] <= resumed_from:
            total += entry["loss"] * (entry["step"] - last)
            steps += entry["step"] - last
            last = entry["step"]
    return total / max(steps, 1)


# what a TimedEvalCallback can count training time on: name -> a function giving seconds
CLOCKS = {"wall": time.time, "cpu": time.process_time}


class TimedEvalCallback(TrainerCallback):
    """Records (seconds of training, step, eval loss) for the validation-vs-time plot. A resumed run starts from the
    seconds and points its checkpoint's marker recorded (`resume_from`), so both count the whole run.

    `clock="wall"` counts elapsed time; `clock="cpu"` counts this process's CPU time (all its threads: a run on n
    busy threads counts n CPU-seconds per second). Time spent waiting for a core while other programs run is not
    counted, so a CPU-time budget is much less sensitive to load than a wall one, though not immune: programs on the
    other cores still compete for caches and memory bandwidth (a one-thread WikiText-2 run here took 0.36 CPU-s/step
    early and up to 0.59 later, with a run beside it all along)."""

    def __init__(self, resume_from=None, clock="wall"):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}.")
        marker = (read_marker(resume_from) or {}) if resume_from else {}
        if marker and marker.get("clock", "wall") != clock:
            raise ValueError(
                f"{resume_from} counted its training time on the {marker.get('clock', 'wall')!r} clock; resume it "
                f"with that clock, not {clock!r}."
            )
        self.clock, self.now = clock, CLOCKS[clock]
        self.before = marker.get("train_seconds")  # None: resumed from a marker that did not record it
        self.points = list(marker.get("validation_curve", []))
        self.start = None

    def elapsed(self):
        return (self.before or 0.0) + (self.now() - self.start if self.start is not None else 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = self.now()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.points.append(
                {"seconds": self.elapsed(), "step": state.global_step, "eval_loss": metrics["eval_loss"]}
            )


class TimeBudgetCallback(TrainerCallback):
    """Stops training once `minutes` of training time have passed (counted by `timer`, a `TimedEvalCallback`, on its
    clock; a resumed run counts the time before its checkpoint too). The step reached is in
    `trainer.state.global_step` and `stopped_at_step`, so the run can be repeated deterministically with
    `--max_steps`. A checkpoint is saved at the stop (`should_save`). Under several processes the ranks agree on the
    step (any rank out of time stops all of them), since one rank stopping alone would leave the others waiting in
    their next all-reduce."""

    def __init__(self, minutes, timer):
        if not minutes > 0:
            raise ValueError(f"A training-time budget must be a positive number of minutes, got {minutes!r}.")
        self.minutes, self.seconds, self.timer, self.stopped_at_step = minutes, minutes * 60.0, timer, None

    def on_step_end(self, args, state, control, **kwargs):
        out_of_time = self.timer.elapsed() >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([float(out_of_time)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            out_of_time = bool(flag.item())
        if out_of_time:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at_step = state.global_step


def timed_callbacks(resume_from=None, clock="wall", max_minutes=None, device=None):
    """The callbacks of a timed, resumable run: `(timer, budget, callbacks)`, where `timer` is a `TimedEvalCallback`
    continuing from the checkpoint `resume_from` (None: a fresh run), `budget` a `TimeBudgetCallback` of
    `max_minutes` on the timer (None without a budget), and `callbacks` the list for `Trainer(callbacks=...)`:
    `[CompleteCheckpointCallback(timer), timer]` and the budget. `clock="auto"` counts CPU time when `device` (a
    `torch.device` or its type, e.g. `training_args.device`) is the CPU and wall time elsewhere."""
    if clock == "auto":
        clock = "cpu" if getattr(device, "type", device) == "cpu" else "wall"
    timer = TimedEvalCallback(resume_from=resume_from, clock=clock)
    budget = TimeBudgetCallback(max_minutes, timer) if max_minutes else None
    callbacks = [CompleteCheckpointCallback(timer), timer] + ([budget] if budget else [])
    return timer, budget, callbacks


def probe_seconds_per_step(trainer, clock=time.perf_counter, steps=16):
    """Median seconds (on `clock`) of a training step (forward, backward, AdamW) of `trainer` on a copy of its model,
    over its own training batches, after 4 warm-up steps, under the mixed precision the Trainer trains with
    (accelerate's autocast, so that a bf16 run is timed in bf16); the model and optimizer of `trainer` are untouched.
    16 steps: fewer overestimate a step (the first ones are slow), and a run planned on them stops short."""
    model = copy.deepcopy(trainer.model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batches = iter(trainer.get_train_dataloader())
    device = trainer.args.device
    times = []
    for _ in range(steps):
        batch = {k: v.to(device) for k, v in next(batches).items()}
        start = clock()
        # the Trainer's own `autocast_smart_context_manager` is a no-op in transformers 5 (accelerate wraps the
        # prepared model's forward instead), and this copy is not prepared
        with trainer.accelerator.autocast():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(clock() - start)
    times = sorted(times[4:])
    return times[len(times) // 2]


def probe_seconds_per_evaluation(trainer, clock=time.perf_counter):
    """Seconds (on `clock`) of one of `trainer`'s periodic evaluations: a pass of its model over its eval dataloader
    (this process's share), without gradients, under the mixed precision the Trainer trains with. 0.0 when the
    Trainer does not evaluate while training (`eval_strategy="no"` or no eval dataset). The model is left as it was."""
    if trainer.eval_dataset is None or trainer.args.eval_strategy == "no":
        return 0.0
    model, device, was_training = trainer.model, trainer.args.device, trainer.model.training
    model.eval()
    try:
        start = clock()
        with torch.no_grad(), trainer.accelerator.autocast():
            for batch in trainer.get_eval_dataloader():
                model(**{k: v.to(device) for k, v in batch.items()})
        return clock() - start
    finally:
        model.train(was_training)


def _evaluations_every(args, trainer):
    """Training steps between two periodic evaluations (None: a fixed number of them, `eval_steps` < 1 being a
    fraction of the run; 0: none)."""
    if args.eval_strategy == "steps":
        return args.eval_steps if args.eval_steps >= 1 else None
    if args.eval_strategy == "epoch":
        return max(len(trainer.get_train_dataloader()) // args.gradient_accumulation_steps, 1)
    return 0


BUDGET_FILE = "time_budget.json"  # in the output folder: the max_steps of a time budget, for a resumed run


def max_steps_for_budget(trainer, minutes, timer, output_dir=None, script="train"):
    """`max_steps` that fit `minutes` of training on the clock of `timer` (a `TimedEvalCallback`), so that the
    learning-rate schedule ends on time: the budget counts the periodic evaluations too, so it is
    `probe_seconds_per_step` plus 2% for logging and checkpoints, plus `probe_seconds_per_evaluation` for every
    evaluation the run's `eval_strategy` will make (one window per target makes the literal one-target heads'
    validations a sixth of their time, where they are ~3% elsewhere). Recorded in `output_dir/time_budget.json`
    (default `trainer.args.output_dir`): a resumed run with the same budget and clock keeps the steps instead of
    probing again. `script` names the caller in what it prints. Under several processes every rank gets the main
    process's figure (`from_main_process`): ranks that planned different step counts would hang at the end."""
    output_dir = Path(output_dir or trainer.args.output_dir)
    path = output_dir / BUDGET_FILE
    record = json.loads(path.read_text()) if trainer.args.process_index == 0 and path.is_file() else None
    recorded = record and record.get("minutes") == minutes and record.get("clock", "wall") == timer.clock
    recorded = from_main_process(record["max_steps"] if recorded else None)
    if recorded is not None:
        return recorded
    # every rank probes (the probe's steps run this rank's batches), rank 0's figure is the run's
    return from_main_process(_budget_steps(trainer, minutes, timer, output_dir, script))


def _budget_steps(trainer, minutes, timer, output_dir, script):
    """This process's `max_steps` for `minutes` (see `max_steps_for_budget`); recorded by the main process."""
    path = output_dir / BUDGET_FILE
    seconds = probe_seconds_per_step(trainer, timer.now)
    every = _evaluations_every(trainer.args, trainer)
    evaluation = probe_seconds_per_evaluation(trainer, timer.now) if every != 0 else 0.0
    budget, per_step, evaluated = minutes * 60, seconds * 1.02, ""
    if every is None:  # a fixed number of evaluations, whatever the steps
        count = int(1 / trainer.args.eval_steps)
        budget -= evaluation * count
        evaluated = f" + {count} evaluations of {evaluation:.2f} s"
    elif every:
        per_step += evaluation / every
        evaluated = f" + {evaluation:.2f} s per evaluation, every {every} steps"
    max_steps = max(1, int(budget / per_step))
    if trainer.args.process_index == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"minutes": minutes, "clock": timer.clock, "seconds_per_step": seconds,
                                   "seconds_per_evaluation": evaluation, "evaluation_every": every,
                                   "max_steps": max_steps}))
        os.replace(tmp, path)
        logger.info(f"[{script}] time budget {minutes} {timer.clock} minutes: {seconds:.3f} s/step{evaluated} "
              f"-> max_steps={max_steps}")
    return max_steps


def tokens_per_step(training_args, example_length):
    """Input tokens of one optimizer step over all processes: batch x processes x accumulation x `example_length`."""
    return (training_args.per_device_train_batch_size * training_args.world_size
            * training_args.gradient_accumulation_steps * example_length)


def train_and_measure(trainer, resume=None, timer=None, budget=None, example_length=1, script="train"):
    """Trains (or resumes from `resume`, see `train_unless_finished`), saves the model (`save_model_atomically`) and
    the trainer state, and returns what the run measured, the steps before a resume included:

    train_loss (mean over the whole run, `whole_run_train_loss`), train_perplexity (its exp), train_steps, max_steps,
    train_tokens and train_examples (steps x `tokens_per_step`, and / `example_length`), train_tokens_per_wall_second
    (this process's steps over its elapsed seconds), train_wall_seconds (elapsed, this process), resumed_from_step,
    budget_clock, train_cpu_seconds_whole_run or train_wall_seconds_whole_run (on the clock of `timer`, a
    `TimedEvalCallback`, across resumes; None when resumed from a checkpoint that did not record it),
    train_cpu_minutes (CPU-minutes of all processes; on the wall clock, wall minutes x threads),
    train_tokens_per_cpu_second (the whole run's tokens over its CPU-minutes, on a CPU), max_train_minutes and
    stopped_by_time_budget (`budget`, a `TimeBudgetCallback`), and the `selected_checkpoint` the model now holds.
    Every duration and speed names its clock: wall (elapsed) or CPU (process time, all threads)."""
    timer = timer or next(c for c in trainer.callback_handler.callbacks if isinstance(c, TimedEvalCallback))
    per_step = tokens_per_step(trainer.args, example_length)
    train_start = time.time()
    resumed_from = checkpoint_step(resume) if resume else 0
    process_loss = train_unless_finished(trainer, resume, script)
    wall_seconds = time.time() - train_start
    with stops_say_where_to_resume(trainer.args.output_dir, script=script):
        save_model_atomically(trainer)  # model, config with auto_map, modeling code, tokenizer; never half-written
    steps_done = trainer.state.global_step - resumed_from
    train_loss = whole_run_train_loss(trainer.state.log_history, resumed_from, process_loss, steps_done)
    # on the "cpu" clock CPU-seconds of each process, on "wall" elapsed seconds
    whole_seconds = timer.elapsed() if timer.before is not None or not resume else None
    tokens = trainer.state.global_step * per_step
    trainer.save_state()
    world = trainer.args.world_size
    threads = torch.get_num_threads() * world
    cpu_minutes = None if whole_seconds is None else whole_seconds / 60 * (world if timer.clock == "cpu" else threads)
    on_cpu = trainer.args.device.type == "cpu"
    return {
        "train_loss": train_loss,
        "train_perplexity": math.exp(train_loss),
        "train_steps": trainer.state.global_step,
        "max_steps": trainer.args.max_steps,
        "train_tokens": tokens,
        "train_examples": tokens // example_length,
        "train_tokens_per_wall_second": steps_done * per_step / wall_seconds if steps_done else None,
        "train_tokens_per_cpu_second": tokens / (cpu_minutes * 60) if cpu_minutes and on_cpu else None,
        "train_wall_seconds": wall_seconds,
        "resumed_from_step": resumed_from or None,
        "budget_clock": timer.clock,
        f"train_{timer.clock}_seconds_whole_run": whole_seconds,
        "train_cpu_minutes": cpu_minutes,
        "max_train_minutes": budget.minutes if budget is not None else None,
        "stopped_by_time_budget": budget is not None and budget.stopped_at_step is not None,
        **selected_checkpoint(trainer),
    }


# all_results.json keys renamed to name their clock (old -> new). Files written before keep the old names (results/);
# `upgrade_results` reads them with the new ones. `train_seconds_whole_run` became
# `train_<budget_clock>_seconds_whole_run`.
RENAMED_RESULT_KEYS = {
    "train_seconds": "train_wall_seconds",
    "train_seconds_this_process": "train_wall_seconds_this_process",
    "train_seconds_before": "train_wall_seconds_before",
    "train_tokens_per_second": "train_tokens_per_wall_second",
    "train_model_flops_per_second": "train_model_flops_per_wall_second",
    "validation_seconds": "validation_wall_seconds",
    "test_seconds": "test_wall_seconds",
}


def upgrade_results(results):
    """A run's results (the all_results.json of train_lm.py or train_sets.py, of any date) with today's key names: the
    old ones of `RENAMED_RESULT_KEYS` renamed, `train_seconds_whole_run` named by its `budget_clock` (wall where a run
    did not record one: its timer counted wall time), and `train_tokens_per_cpu_second` computed where a CPU run
    recorded its CPU-minutes and not the speed. A new dict; results with today's names come back equal."""
    upgraded = {RENAMED_RESULT_KEYS.get(key, key): value for key, value in results.items()}
    if "train_seconds_whole_run" in upgraded:
        clock = upgraded.get("budget_clock") or "wall"
        upgraded[f"train_{clock}_seconds_whole_run"] = upgraded.pop("train_seconds_whole_run")
    cpu_minutes, tokens = upgraded.get("train_cpu_minutes"), upgraded.get("train_tokens")
    if "train_tokens_per_cpu_second" not in upgraded and "train_tokens" in upgraded:
        on_cpu = cpu_minutes and tokens is not None and not upgraded.get("gpu_name")
        upgraded["train_tokens_per_cpu_second"] = tokens / (cpu_minutes * 60) if on_cpu else None
    return upgraded


def selected_checkpoint(trainer):
    """Which weights a finished run ends with: `selected_step` (the best periodic validation's step with
    `load_best_model_at_end`, else the last step), `selected_by` ("best eval_loss" or "last step") and
    `best_periodic_eval_loss`."""
    state, args = trainer.state, trainer.args
    if args.load_best_model_at_end and state.best_model_checkpoint:
        metric = args.metric_for_best_model
        metric = metric if metric.startswith("eval_") else f"eval_{metric}"  # the Trainer reads "loss" as "eval_loss"
        return dict(selected_step=checkpoint_step(state.best_model_checkpoint), selected_by=f"best {metric}",
                    best_periodic_eval_loss=state.best_metric)
    return dict(selected_step=state.global_step, selected_by="last step", best_periodic_eval_loss=state.best_metric)


def cpu_model_name():
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fast_bf16_available(use_cpu=False):
    """Whether bf16 autocast is fast here: on the GPU (unless `use_cpu`), when it supports bf16; on the CPU, with
    AVX512-BF16 or AMX (~4x fp32 on this project's machine; without them bf16 matmuls are ~300x slower than fp32)."""
    if not use_cpu and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def run_environment(trainer):
    """What a run's results should say about where it ran: {"cpu_model", "threads_per_process", "precision" (what the
    Trainer's accelerator actually runs: "bf16", "fp16" or "fp32"), "torch_compile", "gpu_name" (the training
    device's `torch.cuda.get_device_name`, None off CUDA)}."""
    mixed, device = trainer.accelerator.mixed_precision, trainer.args.device
    return {
        "cpu_model": cpu_model_name(),
        "threads_per_process": torch.get_num_threads(),
        "precision": "fp32" if mixed in (None, "no") else mixed,
        "torch_compile": bool(trainer.args.torch_compile),
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


# What a GPU user expects of the Trainer, where the command does not say (`gpu_training_defaults`). The dataloader
# settings go together: an explicit --dataloader_num_workers leaves --dataloader_persistent_workers to the user (it
# needs workers). `dataloader_pin_memory` is already transformers' default (True).
GPU_TRAINING_DEFAULTS = {
    "optim": "adamw_torch_fused",  # one kernel per parameter group (transformers 5.23's default already)
    "dataloader_num_workers": 4,  # batches are made while the GPU runs the step
    "dataloader_persistent_workers": True,  # not started again for every epoch and periodic evaluation
    "torch_compile": True,  # the models' training forward has no host sync (fullgraph=True compiles)
    "per_device_eval_batch_size": 64,  # 64 windows of 512 tokens: the evaluations fill the device, not 32 of 128
}


def gpu_training_defaults(is_cuda, explicit=frozenset()):
    """The `TrainingArguments` fields a run on CUDA takes from `GPU_TRAINING_DEFAULTS`: {} off CUDA, and none of the
    fields in `explicit` (the ones the command sets). A pure function of its arguments, so the choice is testable on
    a machine without a GPU."""
    if not is_cuda:
        return {}
    defaults = {name: value for name, value in GPU_TRAINING_DEFAULTS.items() if name not in explicit}
    if "dataloader_num_workers" in explicit:
        defaults.pop("dataloader_persistent_workers", None)
    return defaults


# Dense (no sparsity) peak TFLOP/s of one GPU: (pattern of `torch.cuda.get_device_name()`, bf16/fp16 tensor cores,
# fp32 without tensor cores). Source: NVIDIA datasheets (H100/H200: SXM; A100: SXM and PCIe alike; Ada whitepaper for
# the RTX 4090: bf16 with fp32 accumulate). The first pattern that matches wins; NVL variants are not listed (their
# peaks differ) and so give no MFU rather than a wrong one.
GPU_PEAK_TFLOPS = [
    (r"\bH100\b.*PCIe", 756.0, 51.0),
    (r"\bH100\b(?!.*NVL)", 989.4, 67.0),
    (r"\bH200\b(?!.*NVL)", 989.4, 67.0),
    (r"\bA100\b", 312.0, 19.5),
    (r"\bL40S\b", 362.05, 91.6),
    (r"\bL4\b", 121.0, 30.3),
    (r"\bRTX 4090\b", 165.2, 82.6),
]


def peak_flops(device_name, precision="bf16"):
    """-> (dense peak FLOP/s of one device at `precision` ("bf16", "fp16", "fp32") or None, a note: the entry used, or
    why there is none). `device_name`: `torch.cuda.get_device_name()`, None for a CPU."""
    if device_name is None:
        return None, "no peak table for CPUs"
    if precision not in ("bf16", "fp16", "fp32"):
        return None, f"no {precision} peaks in the table (GPU_PEAK_TFLOPS: bf16/fp16 and fp32)"
    for pattern, half, single in GPU_PEAK_TFLOPS:
        if re.search(pattern, device_name):
            tflops = single if precision == "fp32" else half
            kind = "fp32 (no tensor cores)" if precision == "fp32" else f"{precision} dense tensor-core"
            return tflops * 1e12, f"{device_name}: {tflops:g} TFLOPS {kind} peak (NVIDIA datasheet)"
    return None, f"no peak for {device_name!r} in the table (hf_settransformer.toolkit.training.GPU_PEAK_TFLOPS)"


def model_flops_utilization(tokens_per_second, flops_per_token, device_name, precision="bf16", devices=1):
    """Model FLOPs utilisation (MFU, PaLM appendix B): achieved model FLOP/s over the peak of the `devices` used.
    `tokens_per_second`: training tokens of all processes per second; `flops_per_token`: model FLOPs of training on
    one token (forward and backward). -> {"train_model_flops_per_wall_second", "mfu" (a fraction, None without a peak),
    "mfu_peak_flops_per_device", "mfu_note" (the peak used, or why there is no MFU)}."""
    achieved = None if tokens_per_second is None or flops_per_token is None else tokens_per_second * flops_per_token
    peak, note = peak_flops(device_name, precision)
    if achieved is None:
        note = "no training steps timed in this process" if tokens_per_second is None else "no model FLOPs count"
    mfu = None if achieved is None or peak is None else achieved / (peak * devices)
    return {"train_model_flops_per_wall_second": achieved, "mfu": mfu, "mfu_peak_flops_per_device": peak,
            "mfu_note": note + (f", x {devices} devices" if mfu is not None and devices > 1 else "")}


class PerplexityLoggingTrainer(transformers.Trainer):
    """A `Trainer` whose logs give the perplexity beside every loss: `perplexity` (exp of the training loss) and
    `eval_perplexity` (exp of `eval_loss`), in the printed logs, `trainer_state.json` and every reporter."""

    def log(self, logs, *args, **kwargs):
        for loss, name in (("loss", "perplexity"), ("eval_loss", "eval_perplexity")):
            value = logs.get(loss)
            if isinstance(value, (int, float)) and name not in logs:
                logs[name] = math.exp(min(value, 700.0))  # exp overflows a float past ~709
        return super().log(logs, *args, **kwargs)


def sharding_of(model):
    """How `model`'s parameters are split between processes: None when every process holds all of them (one process,
    DDP, DeepSpeed ZeRO-1/2), else the engine's name ("FSDP", "FSDP2", "DeepSpeed ZeRO-3")."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel) and module.sharding_strategy != ShardingStrategy.NO_SHARD:
            return "FSDP"
    for p in model.parameters():
        if isinstance(p, DTensor) and any(placement.is_shard() for placement in p.placements):
            return "FSDP2"
        if hasattr(p, "ds_id"):  # partitioned by ZeRO-3 (zero.Init or the engine); ZeRO-1/2 leave parameters whole
            return "DeepSpeed ZeRO-3"
    return None


def replica_checksums(trainer):
    """One weight checksum (the sum of every parameter, in float64) per data-parallel process, gathered on every
    process; RuntimeError when the replicas disagree. Every process must call it (it is a collective). None, with a
    log line, when the parameters are sharded (FSDP, ZeRO-3): each process holds a different part, there is no
    replica to compare (and a shard's sum says nothing about the model)."""
    sharding = sharding_of(trainer.model_wrapped)
    if sharding is not None:
        logger.info(f"replica check skipped: the parameters are sharded ({sharding}), no process holds a replica")
        return None
    checksum = torch.stack([p.detach().double().sum() for p in trainer.model.parameters()]).sum().reshape(1)
    sums = [float(c) for c in trainer.accelerator.gather(checksum.to(trainer.accelerator.device))]
    if len(set(sums)) != 1:
        raise RuntimeError(f"Data-parallel replicas disagree: weight checksums {sums}")
    return sums


# nothing that is a pickle (training_args.bin, optimizer states), nor checkpoints, logs, the run's lock or temporary
# files
PUSH_IGNORE_PATTERNS = ["checkpoint-*", "incomplete-*", "runs/*", "*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle",
                        LOCK_FILE, ".tmp-*", ".*.tmp-*"]


def push_folder_to_hub(folder, repo_id, token=None, private=False,
                       commit_message="hf_settransformer: trained model, tokenizer and model card"):
    """Uploads a finished run's folder (weights, config with auto_map, modeling code, tokenizer, model card, results
    as JSON) to the Hub repository `repo_id`, created if needed, leaving out `PUSH_IGNORE_PATTERNS`: unlike the
    Trainer's own push, no pickle is uploaded. Returns the commit information of `huggingface_hub`."""
    from huggingface_hub import HfApi

    links = linked_paths(folder)
    if links:
        logger.warning(f"[push] left out (links: only the folder's own regular files are uploaded): {', '.join(links)}")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=bool(private), exist_ok=True)
    ignore = PUSH_IGNORE_PATTERNS + [_fnmatch_literal(p) for p in links] + [_fnmatch_literal(p) + "/*" for p in links]
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                             ignore_patterns=ignore)


def linked_paths(folder):
    """The symbolic links inside `folder` (files or folders, not followed), relative, in "/" form: an upload follows
    them and would publish whatever they point to, outside the run's folder."""
    found = []
    for root, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def _fnmatch_literal(path):
    """`path` as an fnmatch pattern that matches it alone ([, ], *, ? taken literally)."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in path)

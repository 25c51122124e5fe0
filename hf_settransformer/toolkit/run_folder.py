"""A run's output folder: which folder a run may write, atomic writes and saves, checkpoints marked complete,
resumption and what it refuses, and the messages of a full disk or Ctrl-C that say where to resume. The lock that keeps
one run in a folder: `run_lock.py`."""


import contextlib
import errno
import inspect
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from transformers import TrainerCallback, TrainerState
from transformers.utils import logging as hf_logging

from .checkpoint_files import COMPLETE_MARKER, check_checkpoint_files, checkpoint_step, read_marker
from .run_lock import LOCK_FILE

logger = hf_logging.get_logger(__name__)


# what a run leaves in its output folder, besides its checkpoints: a folder holding any of them but the weights (which
# a folder of the user's own model has too) holds a run of ours
RUN_FILES = ("all_results.json", "model.safetensors", "trainer_state.json", "time_budget.json", "training_args.json")

# what else a run writes at the top of its output folder: the model with its code, its tokenizer, its card
SAVED_FILES = ("README.md", "config.json", "generation_config.json", "training_args.bin", "model.safetensors.index.json",
               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model")


def _is_checkpoint_name(name):
    """checkpoint-<step> (the Trainer's) or incomplete-checkpoint-<step> (`resolve_resume`'s): a user's
    "checkpoint-notes" is not a run's, and is never removed."""
    return name.removeprefix("incomplete-").removeprefix("checkpoint-").isdigit() and "checkpoint-" in name


def files_a_run_writes():
    """The names a run may write at the top of its output folder: RUN_FILES, SAVED_FILES and the model's code files
    (`save_pretrained` copies the package's flat modules beside the weights for remote code)."""
    code = {path.name for path in Path(__file__).resolve().parents[1].glob("*.py")}  # the model side's modules
    return set(RUN_FILES) | set(SAVED_FILES) | code


def check_inputs_outside(output_dir, inputs, script="train"):
    """Refuses (SystemExit) an `--output_dir` that is, or holds, a path the run reads (`inputs`, {flag: path}: the
    model, tokenizer, data files, a flags file): the run writes its model, tokenizer and results there, and
    --overwrite_output_dir removes the earlier run's, so continuing a model in its own folder would destroy the model
    it is about to load; nor one inside a folder the run reads, nor one that is or lies inside a checkpoint or another
    run's output folder (`check_not_inside_a_run`). Paths are compared resolved (symbolic links, relative paths,
    trailing slashes); paths that do not exist (Hub ids) read nothing from the folder. Call it before anything in the
    folder is changed."""
    out = Path(output_dir).expanduser().resolve()
    if out.is_file():  # refused as such by lock_output_dir
        return
    shown = f"{output_dir}" + (f" (through a symbolic link: it is {out})"
                               if out != Path(os.path.abspath(Path(output_dir).expanduser())) else "")
    for flag, value in inputs.items():
        if not value or not Path(value).expanduser().exists():
            continue
        path = Path(value).expanduser().resolve()
        if path.is_dir() and path in out.parents:  # a folder the run reads (a dataset's reads all its files)
            raise SystemExit(
                f"[{script}] --output_dir {shown} is inside {flag} {value}, a folder this run reads: the run would "
                "write its model, checkpoints and results among the files it reads. Pass an --output_dir outside it."
            )
        if path != out and out not in path.parents:
            continue
        where = "is" if path == out else "holds"
        raise SystemExit(
            f"[{script}] --output_dir {output_dir} {where} {flag} {value}, which this run reads: writing the run "
            "there would replace it (--overwrite_output_dir would first delete it). To train further from a saved "
            "model, pass another --output_dir (e.g. a new folder beside it); to continue an interrupted run in its "
            "own folder, pass --resume_from_checkpoint true with the flags that started it (no --model_name_or_path)."
        )
    check_not_inside_a_run(output_dir, script)


def _is_checkpoint(folder):
    """Whether `folder` is a checkpoint of a run: named as one and written by the Trainer, or marked complete."""
    named = _is_checkpoint_name(folder.name) and (folder / "trainer_state.json").is_file()
    return named or (folder / COMPLETE_MARKER).is_file()


def _holds_a_run(folder):
    """Whether `folder` is the output folder of a run (live, partial or finished)."""
    names = (LOCK_FILE, *(name for name in RUN_FILES if name != "model.safetensors"))
    if any((folder / name).exists() for name in names):
        return True
    return any(_is_checkpoint_name(p.name) and p.is_dir() for p in folder.glob("*checkpoint-*"))


def check_not_inside_a_run(output_dir, script="train"):
    """Refuses (SystemExit) an `--output_dir` that is a checkpoint of a run, or lies inside one or inside another
    run's output folder, symbolic links resolved: the run would write a whole run among that run's files, which its
    resume, rotation of checkpoints, --overwrite_output_dir or push would then take for its own (or delete). Reads
    only: call it before the folder is made."""
    given = Path(output_dir).expanduser()
    out = given.resolve()
    through = f" (through a symbolic link: it is {out})" if out != Path(os.path.abspath(given)) else ""
    if out.is_dir() and _is_checkpoint(out):
        raise SystemExit(
            f"[{script}] --output_dir {output_dir}{through} is a checkpoint of a run, not a run's output folder: "
            "training there would write over the checkpoint. Pass a new folder (to continue from the checkpoint, "
            "--model_name_or_path it, or --resume_from_checkpoint it with its run's --output_dir)."
        )
    for parent in out.parents:
        if _is_checkpoint(parent):
            what = "a checkpoint of a run"
        elif _holds_a_run(parent):
            what = "the output folder of another run"
        else:
            continue
        raise SystemExit(
            f"[{script}] --output_dir {output_dir}{through} is inside {parent}, {what}: a run written there would "
            "be mixed with that run's files (its resume, checkpoint rotation, --overwrite_output_dir and push take "
            "what is in its folder for its own). Pass an --output_dir outside it."
        )


def check_output_dir(training_args, overwrite=False, script="train"):
    """Refuses (SystemExit naming what is there) an `--output_dir` it would lose files in:

    - a folder holding a run of ours (a checkpoint, or one of RUN_FILES but the weights), unless the run resumes it
      (`--resume_from_checkpoint true` or one of its checkpoints) or replaces it (`overwrite`: the old run's
      checkpoints and RUN_FILES are removed first, by the main process; nothing else is);
    - a folder of the user's named checkpoint-<not a step>, which the Trainer's rotation would delete;
    - a folder holding no run but other files (not hidden ones: `.gitignore`, the lock file): the user's. Refused
      unless `overwrite`, and then too if the run would write over one of them (README.md, config.json, ... :
      `files_a_run_writes`), naming them. With `overwrite` the run is written beside the others; none is removed.

    transformers 5 has no `overwrite_output_dir`: without this a second command on the same folder silently replaced
    the first run's checkpoints, weights, results and card. Call it while holding the folder's lock
    (`lock_output_dir`)."""
    out = Path(training_args.output_dir)
    if not out.is_dir():
        return
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    # the Trainer's checkpoint rotation (save_total_limit, by modification time) deletes every checkpoint-* folder
    doomed = [name for name in entries if name.startswith("checkpoint-") and not _is_checkpoint_name(name)
              and (out / name).is_dir()]
    if doomed:
        raise SystemExit(
            f"[{script}] --output_dir {out} holds {', '.join(doomed)}, a folder the Trainer would take for one of its "
            "checkpoints and delete (save_total_limit). Rename or move it, or pass another --output_dir."
        )
    found = [name for name in entries if name in RUN_FILES or _is_checkpoint_name(name)]
    value = training_args.resume_from_checkpoint
    if any(name != "model.safetensors" for name in found):  # a run of ours
        if _resume_requested(value) and (_resume_newest(value) or out.resolve() in Path(value).resolve().parents):
            return  # continuing this run: resolve_resume refuses a run with nothing to resume
        if overwrite:
            if training_args.process_index == 0:
                logger.warning(f"[{script}] --overwrite_output_dir: removing the earlier run in {out} "
                               f"({', '.join(found)})")
                for name in found:
                    path = out / name
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            return
        state = "a finished run" if "all_results.json" in found else "a partial run"
        listed = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        newest = newest_complete_checkpoint(out)
        resume = (f"--resume_from_checkpoint true to continue it from {newest.name}, " if newest is not None
                  else "")
        other = (f" (--resume_from_checkpoint {value} is no checkpoint of it)" if _resume_requested(value) else "")
        raise SystemExit(
            f"[{script}] --output_dir {out} holds {state} ({listed}){other}. Pass {resume}--overwrite_output_dir to "
            "replace it, or another --output_dir."
        )
    if not entries:
        return
    listed = ", ".join(entries[:6]) + (f" and {len(entries) - 6} more" if len(entries) > 6 else "")
    clash = sorted(set(entries) & files_a_run_writes())
    if not overwrite:
        raise SystemExit(
            f"[{script}] --output_dir {out} is not empty and holds no run ({listed}). Pass a new or empty folder"
            + (f" (this run would write over {', '.join(clash)})." if clash else ", or --overwrite_output_dir to write "
               "the run beside these files (none of them is removed or written over).")
        )
    if clash:
        raise SystemExit(
            f"[{script}] --output_dir {out} holds files that no run of ours wrote and that this run would write over: "
            f"{', '.join(clash)}. Move them elsewhere, or pass another --output_dir (a run never replaces files it "
            "did not write, even with --overwrite_output_dir)."
        )
    logger.warning(f"[{script}] --overwrite_output_dir: writing the run beside the files already in {out} ({listed})")


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
    so far (`timer`, a TimedEvalCallback), which a resumed run continues from, and the settings that define the run
    (`run_settings`, set by `record_run_settings`), which a resume compares with its flags
    (`resume_settings.check_run_settings`)."""

    def __init__(self, timer, settings=None):
        self.timer, self.run_settings = timer, settings

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
                if self.run_settings is not None:
                    marker["run_settings"] = self.run_settings
                with open(tmp, "w") as f:
                    json.dump(marker, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / COMPLETE_MARKER)


def record_run_settings(callbacks, settings):
    """Has every `CompleteCheckpointCallback` of `callbacks` record `settings` (`run_settings`) in its markers."""
    for callback in callbacks:
        if isinstance(callback, CompleteCheckpointCallback):
            callback.run_settings = settings


def _resume_requested(value):
    """Whether `--resume_from_checkpoint` asks to resume: a path or "true"; None, "false", "0" and "none" do not."""
    return value is not None and str(value).lower() not in ("false", "0", "none")


def resolve_resume(training_args, script="train"):
    """`--resume_from_checkpoint true` -> the newest *complete* checkpoint; incomplete ones are set aside. Nothing to
    resume in a finished run is refused (`check_something_to_resume`). Check what it returns with
    `check_checkpoint_files` and `check_checkpoint_matches` before resuming. `script`
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
        if not complete:  # before anything is moved
            check_something_to_resume(training_args.output_dir, script)
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


def check_something_to_resume(output_dir, script="train"):
    """Refuses `--resume_from_checkpoint true` on a folder whose run wrote its results or model (every file of
    RUN_FILES but time_budget.json is written at the end) and left no complete checkpoint (deleted, or
    --save_strategy no): starting at step 0 would train over the finished model."""
    out = Path(output_dir)
    left = [name for name in RUN_FILES if name != "time_budget.json" and (out / name).exists()]
    if left:
        raise SystemExit(
            f"[{script}] --resume_from_checkpoint true: nothing to resume in {out}, it holds a finished run "
            f"({', '.join(left)}) and no complete checkpoint-<step> folder (deleted, or trained with --save_strategy "
            "no). To train its model further pass --model_name_or_path " f"{out} with another --output_dir; to train "
            "again from scratch over it, --overwrite_output_dir without --resume_from_checkpoint."
        )


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
        inside = newest_complete_checkpoint(value)
        hint = (f" It is a run's folder: pass its checkpoint ({inside}) or, with --output_dir {value}, true."
                if inside is not None else "")
        raise SystemExit(f"--resume_from_checkpoint {value}: not a complete checkpoint (no {COMPLETE_MARKER}).{hint}")
    if read_marker(value) is None:
        raise SystemExit(
            f"--resume_from_checkpoint {value}: its {COMPLETE_MARKER} is not a JSON object (corrupted?); resume from "
            "another checkpoint."
        )
    try:
        checkpoint_step(value)
    except ValueError as err:
        raise SystemExit(f"--resume_from_checkpoint {err}") from None
    check_checkpoint_files(value)
    return value


def newest_complete_checkpoint(output_dir):
    """The `checkpoint-<step>` folder of `output_dir` with the highest step and a completion marker, or None."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    complete = [p for p in folders if read_marker(p) is not None]
    return max(complete, key=checkpoint_step, default=None)


# a full disk as a failed write reports it: OSError's errno, or torch.save's C++ writer (no errno, text only)
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


# torch.save's writer: "unexpected pos 704 vs 598" is a write cut short (the bytes written are fewer than it gave)
WRITE_FAILED_TEXTS = ("iostream error", "file write failed", "PytorchStreamWriter failed", "unexpected pos")
# free space below which a write that failed without saying why failed for space
LOW_SPACE_BYTES = 64 * 2**20


def disk_full_words(err, folder=None):
    """"the disk is full" for a write refused for space, or for torch.save's writer failing without saying why while
    `folder`'s disk has (almost) no space left; "a write failed: the disk is probably full" for that failure with space
    left (a quota, say); None for any other error."""
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return "the disk is full"
    if isinstance(err, (OSError, RuntimeError)) and any(text in str(err) for text in WRITE_FAILED_TEXTS):
        try:
            free = shutil.disk_usage(folder).free if folder is not None else None
        except OSError:
            free = None
        if free is not None and free < LOW_SPACE_BYTES:
            return "the disk is full"
        return "a write failed: the disk is probably full"
    return None


def incomplete_checkpoints(output_dir):
    """The `checkpoint-<step>` folders of `output_dir` without a completion marker (being written, or cut short)."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return sorted((p for p in folders if read_marker(p) is None), key=checkpoint_step)


def where_to_resume(output_dir):
    """One sentence: the newest complete checkpoint to resume from, or that there is none yet."""
    newest = newest_complete_checkpoint(output_dir)
    if newest is None:
        return f"no complete checkpoint in {output_dir} yet: a new run starts at step 0."
    return (f"resume from {newest} (step {checkpoint_step(newest)}, complete) with the same command and "
            "--resume_from_checkpoint true.")


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
        words = disk_full_words(err, output_dir)
        if words is None:
            raise
        try:
            free = f"{shutil.disk_usage(output_dir).free / 2**20:,.0f} MiB free now"
        except OSError:
            free = "free space unknown"
        cut = incomplete_checkpoints(output_dir)
        cut = (f" {', '.join(str(p) for p in cut)} {'is' if len(cut) == 1 else 'are'} incomplete (no "
               f"{COMPLETE_MARKER}): never resumed from, and set aside when the run resumes." if cut else "")
        raise SystemExit(
            f"[{script}] {words}: writing in {output_dir} failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else err}; {free}).{cut} Free some space, then "
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

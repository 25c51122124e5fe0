"""Training utilities for your own Trainer scripts: checkpoints that are marked complete, safe resumption, the
training time and validation curve of a run across resumes, and a training-time budget.

Typical use (see the README's "Use the pieces in your own script"):

    timer = TimedEvalCallback(resume_from=resume)
    trainer = Trainer(..., callbacks=[CompleteCheckpointCallback(timer), timer, TimeBudgetCallback(30, timer)])
    train_unless_finished(trainer, resolve_resume(training_args))

Needs torch and transformers only (no accelerate or datasets); the modeling files never import it.
"""

import json
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainerState

COMPLETE_MARKER = "hfst_checkpoint_complete.json"


class CompleteCheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete once the Trainer has written all of it (atomic rename), so that a run killed while
    saving never resumes from a half-written folder. The marker also carries the training time and validation curve
    so far (`timer`, a TimedEvalCallback), which a resumed run continues from."""

    def __init__(self, timer):
        self.timer = timer

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
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


def checkpoint_step(folder):
    """`.../checkpoint-1464` -> 1464."""
    return int(Path(folder).name.split("-")[-1])


def resolve_resume(training_args, script="train_lm"):
    """`--resume_from_checkpoint true` -> the newest *complete* checkpoint; incomplete ones are set aside. `script`
    names the caller in what it prints."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "0", "none"):
        return None
    if str(value).lower() in ("true", "1", "last", "latest"):
        folders = sorted(
            (p for p in Path(training_args.output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
            key=checkpoint_step,
        )
        complete = [p for p in folders if (p / COMPLETE_MARKER).is_file()]
        for p in folders:
            if p not in complete and training_args.process_index == 0:
                aside = p.with_name(f"incomplete-{p.name}")
                print(f"[{script}] {p} was never completely written (killed while saving?): moved to {aside}")
                shutil.rmtree(aside, ignore_errors=True)
                p.rename(aside)
        if not complete:
            print(f"[{script}] no complete checkpoint in {training_args.output_dir}: training starts at step 0")
            return None
        return str(complete[-1])
    if not (Path(value) / COMPLETE_MARKER).is_file():
        raise SystemExit(f"--resume_from_checkpoint {value}: not a complete checkpoint (no {COMPLETE_MARKER}).")
    return value


def train_unless_finished(trainer, resume):
    """`trainer.train(resume_from_checkpoint=resume)`, except that a checkpoint at or past `max_steps` (a run stopped
    in its final evaluation, say) is only loaded: Trainer.train would still take one more step (transformers 5.23
    checks `max_steps` after a step). Returns the mean training loss of the steps this call ran (0.0 for none)."""
    if resume and checkpoint_step(resume) >= trainer.args.max_steps > 0:
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        trainer._load_from_checkpoint(resume)
        return 0.0
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


CLOCKS = {"wall": time.time, "cpu": time.process_time}


class TimedEvalCallback(TrainerCallback):
    """Records (seconds of training, step, eval loss) for the validation-vs-time plot. A resumed run starts from the
    seconds and points its checkpoint's marker recorded (`resume_from`), so both count the whole run.

    `clock="wall"` counts elapsed time; `clock="cpu"` counts this process's CPU time (all its threads: a run on n
    busy threads counts n CPU-seconds per second), which other programs sharing the cores do not inflate, so a
    CPU-time budget gives the same steps on a busy machine as on a quiet one."""

    def __init__(self, resume_from=None, clock="wall"):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}.")
        marker = {}
        if resume_from and (Path(resume_from) / COMPLETE_MARKER).is_file():
            marker = json.loads((Path(resume_from) / COMPLETE_MARKER).read_text())
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
        self.seconds, self.timer, self.stopped_at_step = minutes * 60.0, timer, None

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

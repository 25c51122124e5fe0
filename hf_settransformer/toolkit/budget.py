"""A training-time budget: the timer of a run across resumes (`TimedEvalCallback`), the callback that stops at the
budget, and the `max_steps` that fits it, planned from timed probes of a step and of an evaluation."""


import copy
import json
import os
import time
from pathlib import Path

import torch
from transformers import TrainerCallback, get_scheduler
from transformers.utils import logging as hf_logging

from .checkpoint_files import read_marker
from .processes import from_main_process
from .run_folder import CompleteCheckpointCallback

logger = hf_logging.get_logger(__name__)


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
    their next all-reduce.

    With `replan_with(trainer)` (a run whose `max_steps` the budget planned), a run slower than its probe re-plans:
    every `every` steps, once a tenth of the plan is done, the steps the rest of the budget holds are counted at the
    pace of recent steps (the median of the last three intervals' paces, each interval's evaluation included: one
    interval slowed by another program does not shorten the run), and where they end more than 1% before `max_steps`,
    `max_steps` becomes that step and the learning-rate schedule is rebuilt for it (`schedule_lambdas`), so its
    decay still ends at the run's last step instead of being cut off by the clock. Re-plans only shorten (the
    Trainer's loop cannot run past the epochs it planned) and are recorded in `replans` and `time_budget.json`."""

    def __init__(self, minutes, timer):
        if not minutes > 0:
            raise ValueError(f"A training-time budget must be a positive number of minutes, got {minutes!r}.")
        self.minutes, self.seconds, self.timer, self.stopped_at_step = minutes, minutes * 60.0, timer, None
        self.schedule_for, self.every, self.replans, self._window, self._paces = None, None, [], None, []

    def replan_with(self, trainer, every=None):
        """Re-plan `trainer`'s `max_steps` and schedule as the run goes (see the class), every `every` steps (default:
        its evaluation interval, else 250)."""
        self.schedule_for = lambda steps: schedule_lambdas(trainer, steps)
        self.every = every or _evaluations_every(trainer.args, trainer) or 250
        self.output_dir = Path(trainer.args.output_dir)

    def on_step_end(self, args, state, control, lr_scheduler=None, optimizer=None, **kwargs):
        now = self.timer.elapsed()
        out_of_time = now >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([float(out_of_time)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            out_of_time = bool(flag.item())
        if out_of_time:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at_step = state.global_step
            return
        if self.schedule_for is not None and state.global_step % self.every == 0:
            self._replan(args, state, lr_scheduler, optimizer, now)
        if state.global_step >= state.max_steps:  # a re-planned end (the Trainer's loop counts to its first plan)
            control.should_training_stop = True
            control.should_save = True

    def _replan(self, args, state, lr_scheduler, optimizer, now):
        window, self._window = self._window, (state.global_step, now)
        if window is None or state.global_step <= window[0]:
            return
        self._paces = (self._paces + [(now - window[1]) / (state.global_step - window[0])])[-3:]  # s/step, evals in
        if len(self._paces) < 2 or state.global_step < state.max_steps / 10:
            return
        pace = sorted(self._paces)[len(self._paces) // 2] if len(self._paces) == 3 else sum(self._paces) / 2
        fits = state.global_step + int(max(self.seconds - now, 0.0) / pace) if pace > 0 else state.max_steps
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ends = torch.tensor([float(fits)], device=args.device)  # every rank stops at the same step
            torch.distributed.all_reduce(ends, op=torch.distributed.ReduceOp.MIN)
            fits = int(ends.item())
        if fits >= state.max_steps * 0.99 or fits <= state.global_step:
            return
        live = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate wraps the Trainer's scheduler
        if not isinstance(live, torch.optim.lr_scheduler.LambdaLR):
            return  # a schedule this cannot rebuild: the clock stops the run as before
        live.lr_lambdas = list(self.schedule_for(fits))
        for group, base, factor in zip(live.optimizer.param_groups, live.base_lrs, live.lr_lambdas):
            group["lr"] = base * factor(live.last_epoch)
        live._last_lr = [group["lr"] for group in live.optimizer.param_groups]
        state.max_steps = args.max_steps = fits
        self.replans.append({"step": state.global_step, "max_steps": fits, "seconds_per_step": pace})
        if args.process_index == 0:
            path = self.output_dir / BUDGET_FILE
            record = json.loads(path.read_text()) if path.is_file() else {}
            record.update(max_steps=fits, replans=self.replans)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)  # a resumed run keeps the re-planned steps
            logger.info(f"[budget] step {state.global_step}: {pace:.3f} s/step -> max_steps={fits} (the schedule "
                        "rebuilt to end there)")


def schedule_lambdas(trainer, num_training_steps):
    """The per-group learning-rate factors of `trainer`'s schedule planned for `num_training_steps`, as the Trainer
    builds it (the trainer's `scheduler_for` where it gives one, e.g. `MethodsTrainer`'s fitted decay), made on
    a stand-in optimizer: the live optimizer's learning rates are untouched."""
    groups = trainer.optimizer.param_groups
    stand_in = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": group.get("initial_lr", group["lr"])}
                                for group in groups])
    args = trainer.args
    own = getattr(trainer, "scheduler_for", lambda optimizer, steps: None)(stand_in, num_training_steps)
    scheduler = own or get_scheduler(args.lr_scheduler_type, stand_in, num_training_steps=num_training_steps,
                                     num_warmup_steps=args.get_warmup_steps(num_training_steps),
                                     scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    return scheduler.lr_lambdas


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
    """Median seconds (on `clock`) of a training step (forward, backward, optimizer: the run's own where `trainer`
    can make one, `optimizer_like`, so that Muon's Newton-Schulz steps are timed; else AdamW) of `trainer` on a copy
    of its model, over its own training batches, after 4 warm-up steps, under the mixed precision the Trainer trains
    with (accelerate's autocast, so that a bf16 run is timed in bf16); the model and optimizer of `trainer` are
    untouched. 16 steps: fewer overestimate a step (the first ones are slow), and a run planned on them stops short."""
    model = copy.deepcopy(trainer.model).train()
    if hasattr(trainer, "optimizer_like"):
        optimizer = trainer.optimizer_like(model, lr=1e-6)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loader = trainer.get_train_dataloader()
    # its batches again from the start where one epoch has fewer than `steps` (small data: it ran out, StopIteration)
    batches = (batch for _ in range(steps) for batch in loader)
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

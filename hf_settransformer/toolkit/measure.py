"""What a run measured: training loss, tokens and speed across resumes (`train_and_measure`), its model FLOPs
utilisation (against the device's peak, `machine.peak_flops`), the perplexity beside every logged loss, and the check
that data-parallel replicas agree. The machine a run ran on is `machine`'s."""


import math
import time

import torch
import transformers
from transformers.utils import logging as hf_logging

from .budget import TimedEvalCallback
from .checkpoint_files import checkpoint_step
from .machine import peak_flops
from .run_folder import save_model_atomically, stops_say_where_to_resume, train_unless_finished

logger = hf_logging.get_logger(__name__)


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
        "budget_replans": budget.replans if budget is not None else None,
        **selected_checkpoint(trainer),
    }


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

    def _issue_warnings_after_load(self, load_result):
        """As the Trainer's, less the tied weights: a checkpoint stores a tied weight once (under its source), so the
        reload of the best checkpoint (`load_best_model_at_end`) finds its tied copies (`lm_head.weight`) missing and
        says so, though they are tied to the loaded weight again. Other missing or unexpected keys are reported."""
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or ())
        if tied & set(load_result.missing_keys):
            self.model.tie_weights()
        missing = [key for key in load_result.missing_keys if key not in tied]
        return super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))


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

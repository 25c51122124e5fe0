"""Weight averaging over the last phase of a run (train_lm.py --average_weights): an fp32 average of the parameters
after each step of the last `fraction` of the planned steps, uniform ("last") or exponential ("ema"), which replaces
the trained weights when training ends, so that it is what is evaluated, saved and published. The average is saved
in every checkpoint it has begun by (`AVERAGE_FILE`), so a resumed run continues it."""

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from .optimizers import check_whole_parameters

AVERAGES = ("none", "ema", "last")
AVERAGE_FILE = "weight_average.safetensors"  # in a checkpoint folder, beside the model


def averaging_start(max_steps, fraction):
    """The step after which the last `fraction` of `max_steps` begins: the average takes the weights after steps
    `start + 1 .. max_steps` (at least the last one)."""
    return max_steps - max(1, math.ceil(fraction * max_steps))


class WeightAveragingCallback(TrainerCallback):
    """Keeps the average of the model's trainable parameters after each step past `averaging_start(max_steps,
    fraction)` (the Trainer's planned `max_steps`, read at every step, so a budget planned anew on resume moves the
    phase): `method="last"` the mean of those weights, `method="ema"` an exponential moving average that starts from
    the phase's first weights, a(t) = decay a(t-1) + (1 - decay) w(t). In fp32 whatever the model's dtype.

    At `on_train_end` the average is copied into the model (a run that averaged no step keeps its weights). At every
    save it is written into the checkpoint (`AVERAGE_FILE`, a temporary file renamed: whole or absent) by the main
    process, before the checkpoint's completion marker (so this callback comes before `CompleteCheckpointCallback`);
    `resume_from`, a checkpoint folder, gives the average to continue. Every process keeps its own copy: data-parallel
    replicas hold the same weights, so the copies agree. Sharded parameters (FSDP2) are refused."""

    def __init__(self, method, fraction, decay=0.999, resume_from=None):
        if method not in AVERAGES[1:]:
            raise ValueError(f"method must be one of {list(AVERAGES[1:])}, got {method!r}.")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}.")
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay!r}.")
        self.method, self.fraction, self.decay = method, fraction, decay
        self.average, self.count, self.first_step, self.applied = None, 0, None, False
        if resume_from and (Path(resume_from) / AVERAGE_FILE).is_file():
            self.load(Path(resume_from) / AVERAGE_FILE)

    def load(self, path):
        """Takes the average, its count and its first step from a checkpoint's `AVERAGE_FILE`."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["weight_average"])
        if meta["method"] != self.method:
            raise ValueError(f"{path} holds a {meta['method']!r} average; resume with --average_weights {meta['method']}.")
        self.average, self.count, self.first_step = load_file(str(path)), meta["count"], meta["first_step"]

    def record(self):
        """What all_results.json says of the average."""
        return {"average_weights": self.method, "average_fraction": self.fraction,
                "ema_decay": self.decay if self.method == "ema" else None, "averaged_steps": self.count,
                "averaged_from_step": self.first_step, "averaged_weights_applied": self.applied}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        check_whole_parameters(list(model.named_parameters()), "--average_weights")
        if self.average is not None:  # resumed: beside the parameters it averages
            devices = {name: p.device for name, p in model.named_parameters()}
            self.average = {name: t.to(devices.get(name, t.device)) for name, t in self.average.items()}

    @torch.no_grad()
    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step <= averaging_start(state.max_steps, self.fraction):
            return
        params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
        if self.average is None:
            self.average = {name: p.float().clone() for name, p in params.items()}
            self.count, self.first_step = 1, state.global_step
            return
        self.count += 1
        weight = 1.0 / self.count if self.method == "last" else 1.0 - self.decay
        for name, p in params.items():
            self.average[name].lerp_(p.float(), weight)

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.average is None or not state.is_world_process_zero or not folder.is_dir():
            return
        meta = {"method": self.method, "count": self.count, "first_step": self.first_step}
        tmp = folder / (AVERAGE_FILE + ".tmp")
        save_file({name: t.contiguous() for name, t in self.average.items()}, str(tmp),
                  metadata={"weight_average": json.dumps(meta)})
        os.replace(tmp, folder / AVERAGE_FILE)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.apply(model)

    @torch.no_grad()
    def apply(self, model):
        """Copies the average into `model`'s parameters (in their dtype and device); nothing without one."""
        if self.average is None:
            return
        for name, p in model.named_parameters():
            if name in self.average:
                p.copy_(self.average[name])
        self.applied = True

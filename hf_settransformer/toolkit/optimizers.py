"""train_lm.py's optimizer and schedule: Muon (`torch.optim.Muon`) for the hidden weight matrices with AdamW for the
rest, as one optimizer whose param groups the Trainer's scheduler drives (`MuonWithAdamW`), and the warmup-stable-decay
schedule whose decay ends at the run's planned last step (`wsd_schedule`), both through `MethodsTrainer`."""

import copy
import math

import torch
from torch import nn
from transformers import Trainer
from transformers.optimization import get_wsd_schedule

from ..attention import MultiHeadAttention
from ..layers import FeedForward
from .measure import PerplexityLoggingTrainer

OPTIMIZERS = ("adamw", "muon")
# AdamW-matched update size (Liu et al. 2025, "Muon is Scalable for LLM Training"): Muon's orthogonalised update is
# scaled by 0.2 sqrt(max(rows, columns)), so that --learning_rate and --weight_decay serve both optimizers
MUON_ADJUST_LR = "match_rms_adamw"
MUON_MOMENTUM = 0.95  # Muon's default, Nesterov
ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused")  # the --optim values whose optimizer Muon is paired with


def hidden_matrix_names(model):
    """Names of the parameters Muon trains: the weight matrices of the `nn.Linear` layers inside attention
    (q/k/v/o projections) and feed-forward modules, wherever they sit (blocks, PMA's rFF). Embeddings, adaptive
    input/softmax layers, the output projection, norms, biases, seeds, inducing points and latents are not among them."""
    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (MultiHeadAttention, FeedForward)):
            for child_name, child in module.named_modules():
                if isinstance(child, nn.Linear) and child.weight.requires_grad:
                    names.add(".".join(part for part in (prefix, child_name, "weight") if part))
    return names


def check_whole_parameters(parameters, method="--optimizer muon"):
    """Refuses sharded parameters (DTensors: FSDP2, tensor parallelism): `method` needs every matrix whole on every
    process (Newton-Schulz orthogonalises the whole matrix; an average is of whole tensors)."""
    from torch.distributed.tensor import DTensor

    sharded = [name for name, p in parameters if isinstance(p, DTensor)]
    if sharded:
        raise ValueError(
            f"{method} needs every parameter whole on each process, but {sharded[0]} (and {len(sharded) - 1} more) "
            "is sharded: leave out --fsdp / --deepspeed (data parallelism, one full replica per process, works)."
        )


class MuonWithAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` over some parameters and an AdamW (`adamw`, built over the others) as one optimizer: its
    `param_groups` are the two optimizers' own group dicts (Muon's first), so a scheduler that sets their `lr` drives
    both, and its `state` is one dict both optimizers share, so `state_dict` / `load_state_dict` round-trip as any
    optimizer's do. `step` runs Muon, then AdamW."""

    def __init__(self, muon_params, adamw, lr, weight_decay, momentum=MUON_MOMENTUM, adjust_lr_fn=MUON_ADJUST_LR):
        self.muon = torch.optim.Muon(muon_params, lr=lr, weight_decay=weight_decay, momentum=momentum,
                                     nesterov=True, adjust_lr_fn=adjust_lr_fn)
        self.adamw = adamw
        for group in self.muon.param_groups:
            group["optimizer"] = "muon"
        for group in self.adamw.param_groups:
            group["optimizer"] = "adamw"
        # the same group dicts: Optimizer.__init__ keeps each dict it is given (and copies its params list)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, defaults={})
        self._link()

    def _link(self):
        """Points both optimizers at this one's groups and state (again after `load_state_dict` replaced them)."""
        count = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:count], self.param_groups[count:]
        self.muon.state = self.adamw.state = self.state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss


def muon_with_adamw(model, args, decay_names):
    """A `MuonWithAdamW` for `model` under the TrainingArguments `args`: Muon over `hidden_matrix_names` with
    `args.learning_rate` and `args.weight_decay` (`MUON_ADJUST_LR`), and `args.optim`'s AdamW (its betas, epsilon,
    fused or not) over the rest, with the Trainer's weight-decay split (`decay_names`: no decay for biases and norms)."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    check_whole_parameters(named)
    hidden = hidden_matrix_names(model)
    adamw_cls, adamw_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    if adamw_cls is not torch.optim.AdamW:
        raise ValueError(f"--optimizer muon pairs Muon with AdamW: --optim must be one of {list(ADAMW_OPTIMS)}, "
                         f"got {args.optim}.")
    rest = [(name, p) for name, p in named if name not in hidden]
    groups = [{"params": [p for name, p in rest if name in decay_names], "weight_decay": args.weight_decay},
              {"params": [p for name, p in rest if name not in decay_names], "weight_decay": 0.0}]
    adamw = adamw_cls([g for g in groups if g["params"]], **adamw_kwargs)
    return MuonWithAdamW([p for name, p in named if name in hidden], adamw, lr=args.learning_rate,
                         weight_decay=args.weight_decay)


def wsd_decay_steps(num_training_steps, num_warmup_steps, decay_fraction):
    """Steps of the decay phase: the last `decay_fraction` of `num_training_steps` (rounded up), no more than the
    steps after the warm-up, so that warm-up, stable phase and decay add up to the run."""
    return max(0, min(math.ceil(decay_fraction * num_training_steps), num_training_steps - num_warmup_steps))


def wsd_schedule(optimizer, num_training_steps, num_warmup_steps, decay_fraction, scheduler_kwargs=None):
    """transformers' `get_wsd_schedule` whose decay phase is the last `decay_fraction` of `num_training_steps` and
    ends at it: the learning rate there is the decay's end value (`min_lr_ratio` times the peak, 0 by default).
    `scheduler_kwargs` (--lr_scheduler_kwargs) may set `warmup_type`, `decay_type`, `min_lr_ratio`, `num_cycles`."""
    return get_wsd_schedule(
        optimizer, num_warmup_steps=num_warmup_steps,
        num_decay_steps=wsd_decay_steps(num_training_steps, num_warmup_steps, decay_fraction),
        num_training_steps=num_training_steps, **(scheduler_kwargs or {}))


class MethodsTrainer(PerplexityLoggingTrainer):
    """The Trainer of train_lm.py: `optimizer="muon"` trains with `muon_with_adamw`, and `decay_fraction` (with
    `--lr_scheduler_type warmup_stable_decay`) builds `wsd_schedule`. The Trainer makes both when training starts, from
    the `max_steps` then set (a time budget's plan included): the decay ends at the planned last step, and a resume
    rebuilds the schedule for its own `max_steps` before loading the scheduler's step count, so a budget planned
    anew on resume moves the decay to the new end (the stable phase is flat, so nothing jumps before it)."""

    def __init__(self, *args, optimizer="adamw", decay_fraction=None, **kwargs):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}.")
        super().__init__(*args, **kwargs)
        scheduler = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
        if decay_fraction is not None and scheduler != "warmup_stable_decay":
            raise ValueError(f"decay_fraction sizes the decay of lr_scheduler_type warmup_stable_decay, not {scheduler}.")
        self.optimizer_name, self.decay_fraction = optimizer, decay_fraction

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.optimizer_name == "muon":
            if self.is_fsdp_enabled or self.is_deepspeed_enabled:
                raise ValueError("--optimizer muon needs every weight matrix whole on each process: leave out --fsdp "
                                 "/ --deepspeed (and an accelerate config that enables them).")
            model = self.model if model is None else model
            self.optimizer = muon_with_adamw(model, self.args, set(self.get_decay_parameter_names(model)))
            return self.optimizer
        return super().create_optimizer(model)

    def optimizer_like(self, model, lr):
        """A new optimizer of this run's kind over `model` (a copy of the trainer's), at learning rate `lr`: what the
        time budget's probe steps with (`budget.probe_seconds_per_step`)."""
        if self.optimizer_name == "muon":
            args = copy.copy(self.args)
            args.learning_rate = lr
            return muon_with_adamw(model, args, set(self.get_decay_parameter_names(model)))
        return torch.optim.AdamW(model.parameters(), lr=lr)

    def scheduler_for(self, optimizer, num_training_steps):
        """The fitted warmup-stable-decay over `optimizer` for `num_training_steps` (a time budget's re-plan rebuilds
        it); None without `decay_fraction`: the Trainer's own schedule (`budget.schedule_lambdas`)."""
        if self.decay_fraction is None:
            return None
        args = self.args
        return wsd_schedule(optimizer, num_training_steps, args.get_warmup_steps(num_training_steps),
                            self.decay_fraction, args.lr_scheduler_kwargs)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None and self.decay_fraction is not None:
            self.lr_scheduler = self.scheduler_for(optimizer or self.optimizer, num_training_steps)
            self._created_lr_scheduler = True
        return super().create_scheduler(num_training_steps, optimizer)

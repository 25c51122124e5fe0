"""train_lm.py's optimizer and schedule (toolkit/optimizers.py): Muon trains exactly the attention and feed-forward
weight matrices and AdamW the rest, one step of the pair is the two optimizers' own steps, its state round-trips a
checkpoint; the warmup-stable-decay schedule ends its decay at the planned last step and follows a new plan on
resume; the time budget's probe steps with the run's optimizer."""

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import hf_settransformer as hfst
from hf_settransformer.toolkit import budget, optimizers
from hf_settransformer.toolkit.language_modeling import BlockDataset
from tests.helpers import adaptive_lm, family_classes, quiet_training_args, tiny_config


def lm(family):
    torch.manual_seed(0)
    config = tiny_config(family)
    return family_classes(config)[AutoModelForCausalLM](config)


def methods_trainer(output_dir, steps=8, optimizer="adamw", decay_fraction=None, model=None, **fields):
    """A tiny decoder's MethodsTrainer over 8-token blocks of a repeating stream."""
    torch.manual_seed(0)
    model = model or hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    args = quiet_training_args(output_dir, max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
                               **fields)
    return optimizers.MethodsTrainer(model=model, args=args, train_dataset=BlockDataset(torch.arange(400) % 11, 8),
                                     optimizer=optimizer, decay_fraction=decay_fraction)


@pytest.mark.parametrize("family", ["decoder", "encoder", "set_transformer", "perceiver_io"])
def test_muon_takes_the_attention_and_feed_forward_matrices_only(family):
    model = lm(family)
    hidden = optimizers.hidden_matrix_names(model)
    expected = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (hfst.attention.MultiHeadAttention, hfst.layers.FeedForward)):
            expected |= {f"{prefix}.{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.Linear)}
    assert hidden == expected and hidden
    params = dict(model.named_parameters())
    assert all(params[name].ndim == 2 for name in hidden)
    for name in set(params) - hidden:  # embeddings, norms, biases, seeds, inducing points, latents
        assert name.endswith(".bias") or not name.endswith(("proj.weight", "fc_in.weight", "fc_out.weight")), name
    assert not any("embed" in name or "seeds" in name or "inducing" in name or name.endswith("latents.weight")
                   for name in hidden)


def test_adaptive_input_and_softmax_layers_stay_with_adamw():
    model = adaptive_lm("decoder", adaptive_input=True)
    hidden = optimizers.hidden_matrix_names(model)
    adaptive = [name for name, p in model.named_parameters() if p.ndim == 2 and name not in hidden]
    assert any("adaptive" in name or "embed" in name for name in adaptive), adaptive
    assert not any("adaptive" in name or "embed" in name or "lm_head" in name for name in hidden)


def test_a_step_moves_each_parameter_by_its_own_optimizer(tmp_path):
    trainer = methods_trainer(tmp_path, optimizer="muon", weight_decay=0.1)
    model = trainer.model
    opt = trainer.create_optimizer()
    assert isinstance(opt, optimizers.MuonWithAdamW)
    hidden = optimizers.hidden_matrix_names(model)
    named = dict(model.named_parameters())
    by_group = [(g["optimizer"], g["weight_decay"], {id(p) for p in g["params"]}) for g in opt.param_groups]
    assert by_group[0][:2] == ("muon", 0.1) and by_group[0][2] == {id(named[n]) for n in hidden}
    decay = set(trainer.get_decay_parameter_names(model))
    assert ("adamw", 0.1, {id(p) for n, p in named.items() if n not in hidden and n in decay}) in by_group
    assert ("adamw", 0.0, {id(p) for n, p in named.items() if n not in hidden and n not in decay}) in by_group
    assert sum(len(g[2]) for g in by_group) == len(named)

    # references: torch's own Muon and AdamW over copies of the same parameters and gradients
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    clones = {n: p.detach().clone().requires_grad_() for n, p in named.items()}
    for n, c in clones.items():
        c.grad = named[n].grad.clone()
    muon = torch.optim.Muon([clones[n] for n in named if n in hidden], lr=3e-3, weight_decay=0.1, momentum=0.95,
                            nesterov=True, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([{"params": [clones[n] for n in named if n not in hidden and n in decay],
                                "weight_decay": 0.1},
                               {"params": [clones[n] for n in named if n not in hidden and n not in decay],
                                "weight_decay": 0.0}],
                              **trainer.get_optimizer_cls_and_kwargs(trainer.args)[1])  # --optim's (fused) AdamW
    before = {n: p.detach().clone() for n, p in named.items()}
    opt.step()
    muon.step()
    adamw.step()
    for n, p in named.items():
        assert not torch.equal(p, before[n]), n
        assert torch.equal(p, clones[n]), n


def test_the_pair_state_round_trips_a_checkpoint(tmp_path):
    trainer = methods_trainer(tmp_path, optimizer="muon")
    model, opt = trainer.model, trainer.create_optimizer()
    torch.manual_seed(2)

    def step(model, opt):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))
        opt.step()

    step(model, opt)
    step(model, opt)
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    twin_model = copy.deepcopy(model)
    twin = optimizers.muon_with_adamw(twin_model, trainer.args, set(trainer.get_decay_parameter_names(twin_model)))
    twin.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))  # as the Trainer loads it
    assert twin.muon.state is twin.state and twin.adamw.param_groups[0] is twin.param_groups[1]
    for group in twin.param_groups:
        group["lr"] = 1e-3  # a scheduler drives both optimizers through these groups
    for group in opt.param_groups:
        group["lr"] = 1e-3
    step(model, opt)
    step(twin_model, twin)
    for (name, p), q in zip(model.named_parameters(), twin_model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert twin.muon.param_groups[0]["lr"] == 1e-3


def test_the_trainer_trains_with_muon_and_its_scheduler_drives_every_group(tmp_path):
    trainer = methods_trainer(tmp_path, steps=6, optimizer="muon", logging_strategy="steps", logging_steps=1)
    trainer.train()
    groups = trainer.optimizer.param_groups
    assert [g["optimizer"] for g in groups] == ["muon", "adamw", "adamw"]
    lrs = trainer.lr_scheduler.get_last_lr()
    assert len({round(lr, 12) for lr in lrs}) == 1 and [g["lr"] for g in groups] == lrs
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses[-1] < losses[0]


def test_a_resumed_muon_run_with_gradient_accumulation_equals_an_uninterrupted_one(tmp_path):
    fields = dict(gradient_accumulation_steps=2, lr_scheduler_type="warmup_stable_decay", save_strategy="steps",
                  save_steps=4, save_total_limit=None)
    straight = methods_trainer(tmp_path / "straight", steps=8, optimizer="muon", decay_fraction=0.5, **fields)
    straight.train()
    assert straight.state.global_step == 8  # optimizer steps, two micro-batches each
    resumed = methods_trainer(tmp_path / "straight", steps=8, optimizer="muon", decay_fraction=0.5, **fields)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-4"))
    assert resumed.optimizer.optimizer.muon.state  # the Muon momentum came back from the checkpoint
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_the_budget_probe_steps_with_the_runs_optimizer(tmp_path, monkeypatch):
    trainer = methods_trainer(tmp_path, optimizer="muon")
    made = []
    real = optimizers.muon_with_adamw
    monkeypatch.setattr(optimizers, "muon_with_adamw", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert budget.probe_seconds_per_step(trainer, steps=5) > 0
    assert len(made) == 1 and made[0].param_groups[0]["lr"] == 1e-6
    assert made[0].muon.state  # Muon stepped in the probe
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in weights.items())  # on a copy


# ---------------------------------------------------------------------------------------- warmup-stable-decay


@pytest.mark.parametrize("steps,warmup,fraction,decay", [(100, 2, 0.2, 20), (10, 1, 0.25, 3), (10, 9, 0.5, 1),
                                                         (7, 0, 1.0, 7)])
def test_the_decay_is_the_last_fraction_and_ends_at_the_planned_last_step(steps, warmup, fraction, decay):
    assert optimizers.wsd_decay_steps(steps, warmup, fraction) == decay
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.5)
    sched = optimizers.wsd_schedule(opt, steps, warmup, fraction, {"min_lr_ratio": 0.1, "decay_type": "linear"})
    lrs = [sched.get_last_lr()[0]]
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs[steps] == pytest.approx(0.05)  # the decay's end value at the planned last step
    start = steps - decay
    assert all(lr == pytest.approx(0.5) for lr in lrs[warmup:start + 1])  # stable until the decay begins
    assert all(a > b for a, b in zip(lrs[start:steps], lrs[start + 1:steps + 1], strict=True))  # decaying to the end


def test_a_time_budget_planned_anew_on_resume_moves_the_decay_to_its_end(tmp_path, monkeypatch):
    """The budget sets max_steps before training; a resume with another budget plans again: the schedule is rebuilt
    for the new max_steps before the checkpoint's scheduler state (its step count) is loaded, so the decay ends at the
    new last step."""
    monkeypatch.setattr(budget, "probe_seconds_per_step", lambda trainer, clock: 0.5)  # 0.51 s a step with the 2%
    fields = dict(warmup_steps=2, lr_scheduler_type="warmup_stable_decay", save_strategy="steps", save_steps=5,
                  logging_strategy="steps", logging_steps=1)
    first = methods_trainer(tmp_path, steps=1, decay_fraction=0.25, **fields)
    timer = budget.TimedEvalCallback(clock="cpu")
    first.args.max_steps = budget.max_steps_for_budget(first, 0.17, timer)
    assert first.args.max_steps == 20
    first.train()
    assert first.lr_scheduler.get_last_lr()[0] == 0.0  # the end of its decay (min_lr_ratio 0)
    lrs = {e["step"]: e["learning_rate"] for e in first.state.log_history if "learning_rate" in e}
    # the logged lr of step s is the one its update used, the schedule's value after s - 1 steps: 15 to 20 decay
    assert all(lrs[s] == 3e-3 for s in range(3, 17)) and lrs[18] < lrs[17] < 3e-3

    resumed = methods_trainer(tmp_path, steps=1, decay_fraction=0.25, **fields)
    resumed.args.max_steps = budget.max_steps_for_budget(resumed, 0.35, timer)  # a larger budget: planned anew
    assert resumed.args.max_steps == 41
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))
    lrs = {e["step"]: e["learning_rate"] for e in resumed.state.log_history if "learning_rate" in e}
    assert all(lrs[s] == 3e-3 for s in range(11, 32))  # the stable phase now runs to step 30 (11 steps decay)
    assert lrs[33] < lrs[32] < 3e-3 and resumed.lr_scheduler.get_last_lr()[0] == 0.0  # and the decay ends at 41
    assert resumed.state.global_step == 41


def test_the_default_trains_as_the_plain_trainer_did(tmp_path):
    """--optimizer adamw without --decay_fraction: the same optimizer, schedule and losses as before."""
    from hf_settransformer.toolkit.measure import PerplexityLoggingTrainer

    ours = methods_trainer(tmp_path / "ours", steps=6, logging_strategy="steps", logging_steps=1)
    ours.train()
    torch.manual_seed(0)
    model = hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    args = quiet_training_args(tmp_path / "plain", max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3,
                               logging_strategy="steps", logging_steps=1)
    plain = PerplexityLoggingTrainer(model=model, args=args, train_dataset=BlockDataset(torch.arange(400) % 11, 8))
    plain.train()
    assert type(ours.optimizer.optimizer) is type(plain.optimizer.optimizer) is torch.optim.AdamW
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (ours, plain)]
    assert losses[0] == losses[1] and len(losses[0]) == 6


def test_a_decay_fraction_needs_the_warmup_stable_decay_schedule(tmp_path):
    with pytest.raises(ValueError, match="decay_fraction sizes the decay of lr_scheduler_type warmup_stable_decay"):
        methods_trainer(tmp_path, decay_fraction=0.2)  # the cosine schedule
    with pytest.raises(ValueError, match="optimizer must be one of"):
        methods_trainer(tmp_path, optimizer="sgd")

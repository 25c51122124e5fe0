"""Weight averaging over the last phase (toolkit/averaging.py): the average equals the one computed by hand from the
recorded weights of each step, it replaces the model's weights at the end, it is saved whole in each checkpoint, and
a resumed run continues it to the same result as an uninterrupted one."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import TrainerCallback

import hf_settransformer as hfst
from hf_settransformer.toolkit import averaging
from hf_settransformer.toolkit.language_modeling import BlockDataset
from hf_settransformer.toolkit.optimizers import MethodsTrainer
from tests.helpers import quiet_training_args, tiny_config


class Snapshots(TrainerCallback):
    """The trainable weights after every step, {step: {name: tensor}}."""

    def __init__(self):
        self.after = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}


def averaged_trainer(output_dir, method, fraction, steps=10, decay=0.9, resume_from=None, **fields):
    torch.manual_seed(0)
    model = hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    args = quiet_training_args(output_dir, max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
                               **fields)
    average = averaging.WeightAveragingCallback(method, fraction, decay, resume_from=resume_from)
    snapshots = Snapshots()
    trainer = MethodsTrainer(model=model, args=args, train_dataset=BlockDataset(torch.arange(400) % 11, 8),
                             callbacks=[average, snapshots])
    return trainer, average, snapshots


def test_the_phase_is_the_last_fraction_of_the_planned_steps():
    assert averaging.averaging_start(100, 0.2) == 80
    assert averaging.averaging_start(10, 0.25) == 7  # ceil(2.5) steps: 8, 9, 10
    assert averaging.averaging_start(10, 0.01) == 9  # at least the last step
    assert averaging.averaging_start(10, 1.0) == 0


@pytest.mark.parametrize("method", ["last", "ema"])
def test_the_average_is_the_hand_computed_one_and_replaces_the_weights(tmp_path, method):
    trainer, average, snapshots = averaged_trainer(tmp_path, method, 0.4)
    trainer.train()
    steps = [7, 8, 9, 10]  # the last 40% of 10 steps
    assert average.count == 4 and average.first_step == 7 and average.applied
    for name, p in trainer.model.named_parameters():
        if method == "last":
            expected = sum(snapshots.after[s][name] for s in steps) / len(steps)
        else:
            expected = snapshots.after[steps[0]][name]
            for s in steps[1:]:
                expected = 0.9 * expected + 0.1 * snapshots.after[s][name]
        assert average.average[name].dtype == torch.float32
        torch.testing.assert_close(average.average[name], expected, rtol=1e-6, atol=1e-7)
        assert torch.equal(p.detach(), average.average[name]), name  # the model now holds the average
        assert not torch.equal(p.detach(), snapshots.after[10][name]), name
    assert average.record() == {"average_weights": method, "average_fraction": 0.4,
                                "ema_decay": 0.9 if method == "ema" else None, "averaged_steps": 4,
                                "averaged_from_step": 7, "averaged_weights_applied": True}


def test_a_checkpoint_holds_the_average_so_far_and_a_resume_continues_it(tmp_path):
    fields = dict(save_strategy="steps", save_steps=4, save_total_limit=None)
    straight, average, _ = averaged_trainer(tmp_path / "straight", "last", 0.5, **fields)
    straight.train()
    # checkpoint-4 is before the phase (steps 6..10): no file; checkpoint-8 holds steps 6, 7, 8
    assert not (tmp_path / "straight" / "checkpoint-4" / averaging.AVERAGE_FILE).exists()
    saved = tmp_path / "straight" / "checkpoint-8" / averaging.AVERAGE_FILE
    with safe_open(str(saved), framework="pt") as f:
        assert json.loads(f.metadata()["weight_average"]) == {"method": "last", "count": 3, "first_step": 6}
    assert not list((tmp_path / "straight" / "checkpoint-8").glob("*.tmp"))

    again, continued, _ = averaged_trainer(tmp_path / "straight", "last", 0.5, resume_from=saved.parent, **fields)
    assert continued.count == 3 and set(load_file(str(saved))) == set(continued.average)
    again.train(resume_from_checkpoint=str(saved.parent))
    assert continued.count == 5 and continued.first_step == 6
    for name in average.average:
        torch.testing.assert_close(continued.average[name], average.average[name], rtol=1e-6, atol=1e-7)

    with pytest.raises(ValueError, match="resume with --average_weights last"):
        averaging.WeightAveragingCallback("ema", 0.5, resume_from=saved.parent)


def test_a_run_stopped_before_its_phase_keeps_its_weights(tmp_path):
    trainer, average, snapshots = averaged_trainer(tmp_path, "last", 0.2, steps=10)

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 5  # as a time budget stops a run

    trainer.add_callback(Stop())
    trainer.train()
    assert average.average is None and not average.applied and average.count == 0
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), snapshots.after[5][name])


@pytest.mark.parametrize("kwargs,message", [(dict(method="none"), "method must be one of"),
                                            (dict(fraction=0), "fraction must be in"),
                                            (dict(decay=1.0), "decay must be in")])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        averaging.WeightAveragingCallback(**{"method": "ema", "fraction": 0.2, **kwargs})

"""hf_settransformer.toolkit's training modules (`run_folder`, `checkpoint_files`, `budget`, `measure`, `logs`): the
output-folder lock, atomic saves, complete checkpoints and resumption, the timer and the time budget, the measurements
of a run, the model card writer and the scripts' log lines (the upload: tests/scripts/test_push_run.py)."""

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from tests.helpers import decoder_trainer, launch_two, quiet_training_args, tiny_config
from transformers import Trainer

import hf_settransformer as hfst
from hf_settransformer import toolkit
from hf_settransformer.toolkit.budget import BUDGET_FILE
from hf_settransformer.toolkit.language_modeling import BlockDataset
from hf_settransformer.toolkit.checkpoint_files import COMPLETE_MARKER
from hf_settransformer.toolkit.run_lock import LOCK_FILE, OutputDirLock, OutputDirLockedError

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ lock, atomic saves

HOLD = """
import sys, time
from hf_settransformer.toolkit.run_lock import OutputDirLock
lock = OutputDirLock(sys.argv[1], command="holder").acquire()
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_live_holder_keeps_the_output_folder_and_a_dead_one_loses_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputDirLockedError, match=f"in use by process {holder.pid} on "):
            OutputDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock = OutputDirLock(tmp_path, command="second").acquire()  # the kernel dropped the dead holder's lock
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_release_removes_the_lock_file_and_the_folders_the_lock_made_if_empty(tmp_path):
    made = OutputDirLock(tmp_path / "outputs" / "run").acquire()
    assert (tmp_path / "outputs" / "run" / LOCK_FILE).is_file()
    made.release()
    assert not (tmp_path / "outputs").exists()  # made by acquire, nothing written: both levels go
    written = OutputDirLock(tmp_path / "outputs" / "run").acquire()
    (tmp_path / "outputs" / "run" / "all_results.json").write_text("{}")
    written.release()
    assert sorted(p.name for p in (tmp_path / "outputs" / "run").iterdir()) == ["all_results.json"]
    kept = OutputDirLock(tmp_path).acquire()  # a folder that was there: kept, without the lock file
    kept.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


def test_a_lock_file_removed_by_its_releasing_holder_is_opened_again(tmp_path, monkeypatch):
    """A process that opened the lock file just before its holder released (and removed) it must not lock that
    removed file (a third process would lock a new one at the same time): it opens the path again."""
    first = OutputDirLock(tmp_path, command="first").acquire()
    stale = first._open()  # opened while the first run holds the file
    first.release()
    second = OutputDirLock(tmp_path, command="second")
    opens = iter([stale])
    real_open = second._open
    monkeypatch.setattr(second, "_open", lambda: next(opens, None) or real_open())
    second.acquire()
    assert second._is_the_file_at_path(second.handle) and stale.closed
    assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "second"
    with pytest.raises(OutputDirLockedError, match="in use by process"):
        OutputDirLock(tmp_path).acquire()
    second.release()


@pytest.mark.parametrize("kind", ["symlink", "dangling-symlink", "folder"])
def test_the_lock_never_writes_through_a_link_or_into_a_non_file(tmp_path, kind):
    """A link planted at the lock's path (to a file of someone else's) is refused, and the file is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    if kind == "symlink":
        (out / LOCK_FILE).symlink_to(victim)
    elif kind == "dangling-symlink":
        (out / LOCK_FILE).symlink_to(tmp_path / "created-through-the-link.txt")
    else:
        (out / LOCK_FILE).mkdir()
    with pytest.raises(OutputDirLockedError, match="symbolic link|not a regular file"):
        OutputDirLock(out).acquire()
    assert victim.read_text() == "precious" and not (tmp_path / "created-through-the-link.txt").exists()


def test_a_folder_holding_a_run_is_refused_unless_resumed_or_overwritten(tmp_path, caplog):
    from transformers import TrainingArguments

    def args(**fields):
        return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)

    toolkit.run_folder.check_output_dir(args())  # empty: a new run
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="is not empty and holds no run .notes.txt"):  # the user's files: refused
        toolkit.run_folder.check_output_dir(args())
    toolkit.run_folder.check_output_dir(args(), overwrite=True)  # unless told: the run is written beside them
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "all_results.json").write_text("{}")
    with pytest.raises(SystemExit, match="holds a finished run .all_results.json, checkpoint-4.*--overwrite_output_dir"):
        toolkit.run_folder.check_output_dir(args(), script="mine")
    toolkit.run_folder.check_output_dir(args(resume_from_checkpoint="true"))  # resuming it: fine, nothing removed
    assert (tmp_path / "checkpoint-4").is_dir()
    toolkit.run_folder.check_output_dir(args(), overwrite=True, script="mine")
    assert "[mine] --overwrite_output_dir: removing the earlier run" in caplog.text  # a warning of the toolkit's logger
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


KILLED_SAVE = """
import os, signal, sys, torch
import transformers.modeling_utils as modeling_utils
from transformers import Trainer, TrainingArguments
import hf_settransformer as hfst
from hf_settransformer import toolkit

out, mode = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
config = hfst.TransformerDecoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
model = hfst.TransformerDecoderForCausalLM(config)
trainer = Trainer(model=model, args=TrainingArguments(output_dir=out, report_to=[], use_cpu=True))
toolkit.run_folder.save_model_atomically(trainer)  # a complete first save
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)
real = modeling_utils.safe_save_file


def dying(tensors, filename, metadata=None):  # the kill lands in the middle of writing the weights
    real(tensors, filename, metadata=metadata)
    with open(filename, "r+b") as f:
        f.truncate(os.path.getsize(filename) // 2)
    os.kill(os.getpid(), signal.SIGKILL)


modeling_utils.safe_save_file = dying
toolkit.run_folder.save_model_atomically(trainer) if mode == "atomic" else trainer.save_model()
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["atomic", "in place"])
def test_sigkill_during_the_final_save_leaves_a_loadable_model(tmp_path, mode):
    """save_model_atomically: a kill while the weights are written leaves the previous complete model. The Trainer's
    own in-place save, killed the same way, leaves a truncated file (so the test can tell the two apart)."""
    result = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(tmp_path), mode], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    if mode == "atomic":
        model = hfst.TransformerDecoderForCausalLM.from_pretrained(tmp_path)
        torch.manual_seed(0)
        fresh = hfst.TransformerDecoderForCausalLM(model.config)
        for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
            assert torch.equal(a, b), name  # the first save's weights, whole
    else:
        with pytest.raises(Exception):
            hfst.TransformerDecoderForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_the_final_save_gives_use_cache_back(tmp_path, family):
    """The Trainer turns `config.use_cache` off for training; the saved model has its class's default back: a decoder
    loaded from it returns its cache (softmax) or recurrent state (linear) unasked, an encoder config has no field."""
    config = tiny_config(family, "linear" if family == "decoder" else "softmax")
    model = (hfst.TransformerDecoderForCausalLM if family == "decoder" else hfst.TransformerEncoderModel)(config)
    trainer = Trainer(model=model, args=quiet_training_args(tmp_path))
    assert model.config.use_cache is False  # what the Trainer did
    toolkit.run_folder.save_model_atomically(trainer)
    saved = json.loads((tmp_path / "config.json").read_text())
    if family == "decoder":
        assert saved["use_cache"] is True and model.config.use_cache is True
        loaded = hfst.TransformerDecoderForCausalLM.from_pretrained(tmp_path)
        assert loaded(input_ids=torch.tensor([[3, 4, 5]])).past_key_values is not None
    else:
        assert "use_cache" not in saved and not hasattr(model.config, "use_cache")


# ------------------------------------------------------------------------------------------------ checkpoints, resume


def checkpoint(folder, step, marker=True, **fields):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if marker:
        (path / COMPLETE_MARKER).write_text(json.dumps({"global_step": step, **fields}))
    return path


def test_resolve_resume_takes_the_newest_complete_checkpoint_and_sets_aside_the_rest(tmp_path, caplog):
    checkpoint(tmp_path, 5)
    newest = checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 15, marker=False)  # a killed save
    args = quiet_training_args(tmp_path, resume_from_checkpoint="true")
    assert toolkit.resolve_resume(args, script="mine") == str(newest)  # 10, not 5 (numeric, not "10" < "5")
    assert (tmp_path / "incomplete-checkpoint-15").is_dir() and not (tmp_path / "checkpoint-15").exists()
    assert "[mine] " in caplog.text and "checkpoint-15 was never completely written" in caplog.text  # a warning
    assert toolkit.resolve_resume(quiet_training_args(tmp_path, resume_from_checkpoint="false")) is None
    assert toolkit.resolve_resume(quiet_training_args(tmp_path / "empty", resume_from_checkpoint="true")) is None
    with pytest.raises(SystemExit, match="not a complete checkpoint"):
        aside = str(tmp_path / "incomplete-checkpoint-15")
        toolkit.resolve_resume(quiet_training_args(tmp_path, resume_from_checkpoint=aside))


def test_checkpoint_step_reads_the_name_then_the_marker(tmp_path):
    assert toolkit.checkpoint_files.checkpoint_step(tmp_path / "checkpoint-1464") == 1464
    renamed = tmp_path / "best"
    renamed.mkdir()
    (renamed / COMPLETE_MARKER).write_text(json.dumps({"global_step": 7}))
    assert toolkit.checkpoint_files.checkpoint_step(renamed) == 7
    (renamed / COMPLETE_MARKER).write_text(json.dumps({"global_step": True}))
    with pytest.raises(ValueError, match="cannot tell the checkpoint's step"):
        toolkit.checkpoint_files.checkpoint_step(renamed)


def test_whole_run_train_loss_weights_each_logged_loss_by_its_steps():
    history = [{"loss": 4.0, "step": 2}, {"loss": 2.0, "step": 6}, {"loss": 9.0, "step": 9}]
    # resumed at step 6: the logs up to it cover 2 and 4 steps, then this process ran 3 steps at mean loss 1.0
    assert toolkit.measure.whole_run_train_loss(history, 6, 1.0, 3) == pytest.approx((4 * 2 + 2 * 4 + 1 * 3) / 9)
    assert toolkit.measure.whole_run_train_loss([], 0, 1.5, 4) == 1.5


def test_a_checkpoint_of_another_model_is_refused_naming_the_field(tmp_path):
    hfst.TransformerDecoderForCausalLM(tiny_config("decoder")).save_pretrained(tmp_path)
    fits = hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    toolkit.checkpoint_files.check_checkpoint_matches(tmp_path, fits)
    wider = hfst.TransformerDecoderForCausalLM(tiny_config("decoder", hidden_size=64))
    with pytest.raises(SystemExit, match="hidden_size: checkpoint 32, this run 64"):
        toolkit.checkpoint_files.check_checkpoint_matches(tmp_path, wider)


# ------------------------------------------------------------------------------------------------ timer and budget


def test_time_budget_stops_training_and_records_the_steps():
    """Once the training time passes the budget the callback stops training, asks for a checkpoint and records the
    step reached."""
    timer = toolkit.budget.TimedEvalCallback()
    budget = toolkit.budget.TimeBudgetCallback(0.5 / 60, timer)  # half a second

    class State:
        global_step = 7

    class Control:
        should_training_stop = should_save = False

    timer.start = time.time() - 1.0
    control = Control()
    budget.on_step_end(None, State, control)
    assert control.should_training_stop and control.should_save and budget.stopped_at_step == 7
    assert budget.minutes == 0.5 / 60
    with pytest.raises(ValueError, match="positive number of minutes"):
        toolkit.budget.TimeBudgetCallback(0, timer)


@pytest.mark.parametrize("schedule", ["cosine", "warmup_stable_decay"])
def test_a_run_slower_than_its_plan_ends_its_schedule_on_its_last_step(tmp_path, schedule):
    """Planned for 100 steps in 131 s; the steps take 1 s each, then 2 s from step 21, and 3 s in steps 51-60: at
    step 30 the recent pace (1.5 s, the mean of two intervals) re-plans to 90 steps, at step 40 (2 s) to 75, at step 60
    to 70 (the 10 s the slow interval took are gone, but its pace, the median of the last three intervals leaves out:
    at 3 s the plan would be 67). The schedule is rebuilt each time, and the run stops at 70 with its learning rate
    at the schedule's end (0) instead of being cut off by the clock part-way down the decay."""
    trainer = decoder_trainer(tmp_path, steps=100, lr_scheduler_type=schedule, warmup_steps=0)
    if schedule == "warmup_stable_decay":  # the decay: the last 20% of the plan
        from hf_settransformer.toolkit.optimizers import MethodsTrainer

        trainer = MethodsTrainer(model=trainer.model, args=trainer.args, train_dataset=trainer.train_dataset,
                                 decay_fraction=0.2)
    clock = {"now": 0.0}
    timer = toolkit.budget.TimedEvalCallback()
    timer.now = lambda: clock["now"]
    budget = toolkit.budget.TimeBudgetCallback(131 / 60, timer)

    class SlowSteps(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock["now"] += 1.0 if state.global_step < 20 else 3.0 if 50 <= state.global_step < 60 else 2.0

    for callback in (SlowSteps(), timer, budget):
        trainer.add_callback(callback)
    budget.replan_with(trainer, every=10)
    trainer.train()
    assert budget.replans == [{"step": 30, "max_steps": 90, "seconds_per_step": 1.5},
                              {"step": 40, "max_steps": 75, "seconds_per_step": 2.0},
                              {"step": 60, "max_steps": 70, "seconds_per_step": 2.0}]
    assert trainer.state.global_step == 70 and budget.stopped_at_step is None  # the plan's end, not the clock's
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)
    assert json.loads((tmp_path / BUDGET_FILE).read_text())["max_steps"] == 70  # what a resumed run keeps


def test_cpu_clock_counts_this_process_cpu_time_not_waiting(tmp_path):
    """The "cpu" clock counts the process's CPU time: busy seconds count, seconds spent waiting (as when other
    programs hold the core) do not. A checkpoint records its clock and resuming on the other clock is refused."""
    timer = toolkit.budget.TimedEvalCallback(clock="cpu")
    timer.on_train_begin(None, None, None)
    time.sleep(0.4)
    assert timer.elapsed() < 0.2
    start = time.process_time()
    while time.process_time() - start < 0.3:  # 0.3 s of work, however long the shared core makes it take
        sum(range(1000))
    assert timer.elapsed() >= 0.3
    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    (folder / COMPLETE_MARKER).write_text(json.dumps({"global_step": 5, "train_seconds": 12.0, "clock": "cpu"}))
    assert toolkit.budget.TimedEvalCallback(resume_from=folder, clock="cpu").elapsed() == 12.0
    with pytest.raises(ValueError, match="'cpu' clock"):
        toolkit.budget.TimedEvalCallback(resume_from=folder, clock="wall")
    with pytest.raises(ValueError, match="clock must be one of"):
        toolkit.budget.TimedEvalCallback(clock="gpu")


def test_timed_callbacks_resolve_the_clock_and_add_the_budget_when_asked(tmp_path):
    timer, budget, callbacks = toolkit.timed_callbacks(clock="auto", device=torch.device("cpu"))
    assert timer.clock == "cpu" and budget is None and len(callbacks) == 2
    assert isinstance(callbacks[0], toolkit.run_folder.CompleteCheckpointCallback) and callbacks[1] is timer
    assert toolkit.timed_callbacks(clock="auto", device="cuda")[0].clock == "wall"
    folder = checkpoint(tmp_path, 3, train_seconds=20.0, clock="wall", validation_curve=[{"step": 2}])
    timer, budget, callbacks = toolkit.timed_callbacks(folder, max_minutes=5)
    assert timer.elapsed() == 20.0 and timer.points == [{"step": 2}]  # continues the checkpoint's
    assert callbacks[-1] is budget and budget.minutes == 5 and budget.timer is timer


def test_max_steps_for_budget_probes_once_and_a_resumed_run_keeps_the_steps(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hf_settransformer")  # the plan is an INFO line of the toolkit's logger
    trainer = decoder_trainer(tmp_path)
    timer = toolkit.budget.TimedEvalCallback(clock="cpu")
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    seconds = toolkit.budget.probe_seconds_per_step(trainer, timer.now, steps=6)
    assert 0 < seconds < 10
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in weights.items())  # probed on a copy
    monkeypatch.setattr("hf_settransformer.toolkit.budget.probe_seconds_per_step", lambda trainer, clock: 0.5)
    assert toolkit.budget.max_steps_for_budget(trainer, 2, timer, script="mine") == int(2 * 60 / (0.5 * 1.02)) == 235
    assert "[mine] time budget 2 cpu minutes: 0.500 s/step -> max_steps=235" in caplog.text
    record = json.loads((tmp_path / BUDGET_FILE).read_text())
    assert record == {"minutes": 2, "clock": "cpu", "seconds_per_step": 0.5, "seconds_per_evaluation": 0.0,
                      "evaluation_every": 0, "max_steps": 235}  # this Trainer does not evaluate while training
    monkeypatch.setattr("hf_settransformer.toolkit.budget.probe_seconds_per_step", lambda trainer, clock: 1 / 0)
    assert toolkit.budget.max_steps_for_budget(trainer, 2, timer) == 235  # from the record, no new probe
    monkeypatch.setattr("hf_settransformer.toolkit.budget.probe_seconds_per_step", lambda trainer, clock: 1.0)
    assert toolkit.budget.max_steps_for_budget(trainer, 3, timer) == int(3 * 60 / 1.02)  # another budget: probed again


RANKS_PLAN = """
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, ".")  # the working directory: the repository, whose tests/ is a package
from hf_settransformer import toolkit
from tests.helpers import decoder_trainer, leave_process_group

trainer = decoder_trainer(sys.argv[1], use_cpu=True)
rank = trainer.args.process_index
assert trainer.args.world_size == 2 and torch.distributed.is_initialized()
# ranks that time their steps differently (they always do, a little): 0.5 s on rank 0, 0.7 s on rank 1
toolkit.budget.probe_seconds_per_step = lambda trainer, clock: 0.5 + 0.2 * rank
timer = toolkit.budget.TimedEvalCallback(clock="cpu")
first = toolkit.budget.max_steps_for_budget(trainer, 2, timer)
toolkit.budget.probe_seconds_per_step = lambda trainer, clock: 1 / 0
again = toolkit.budget.max_steps_for_budget(trainer, 2, timer)  # the record, read by rank 0 only
# one file per rank: two processes printing to one pipe can interleave their lines
(Path(sys.argv[1]) / f"plan-{rank}.json").write_text(json.dumps({"rank": rank, "first": first, "again": again}))
leave_process_group()
"""


@pytest.mark.slow
def test_every_rank_takes_the_main_process_time_budget(tmp_path):
    """Two gloo processes whose probes disagree plan the same max_steps (rank 0's): ranks that planned different
    step counts would leave one waiting in a collective at the end of the run."""
    out = launch_two(RANKS_PLAN, tmp_path)
    plans = [json.loads(path.read_text()) for path in sorted(out.glob("plan-*.json"))]
    assert sorted(p["rank"] for p in plans) == [0, 1]
    assert all(p["first"] == p["again"] == int(2 * 60 / (0.5 * 1.02)) for p in plans), plans


RANKS_REPLAN = """
import json, sys
from pathlib import Path
import transformers
sys.path.insert(0, ".")  # the working directory: the repository, whose tests/ is a package
from hf_settransformer import toolkit
from tests.helpers import decoder_trainer, leave_process_group

trainer = decoder_trainer(sys.argv[1], steps=100, use_cpu=True, lr_scheduler_type="cosine", warmup_steps=0)
rank = trainer.args.process_index
clock = {"now": 0.0}
timer = toolkit.budget.TimedEvalCallback()
timer.now = lambda: clock["now"]
budget = toolkit.budget.TimeBudgetCallback(131 / 60, timer)


class SlowSteps(transformers.TrainerCallback):  # 1 s a step, then from step 21 2 s on rank 0 and 2.5 s on rank 1
    def on_step_begin(self, args, state, control, **kwargs):
        clock["now"] += 1.0 if state.global_step < 20 else 2.0 + 0.5 * rank


for callback in (SlowSteps(), timer, budget):
    trainer.add_callback(callback)
budget.replan_with(trainer, every=10)
trainer.train()
(Path(sys.argv[1]) / f"replan-{rank}.json").write_text(json.dumps(
    {"replans": budget.replans, "step": trainer.state.global_step, "stopped": budget.stopped_at_step,
     "lr": trainer.lr_scheduler.get_last_lr()[0]}))
leave_process_group()
"""


@pytest.mark.slow
def test_two_ranks_replan_to_the_same_step_the_slower_ones(tmp_path):
    """Two gloo processes whose steps slow differently re-plan together: each re-plan takes the step the slower rank
    reaches (at step 30, rank 1's pace of (1 + 2.5) / 2 s leaves (131 - 45) / 1.75 = 49 steps: 79, where rank 0 alone
    would plan 90), both rebuild their schedule for it and stop there by plan with the learning rate at 0; a rank
    stopping alone would leave the other waiting in its next all-reduce."""
    out = launch_two(RANKS_REPLAN, tmp_path)
    ranks = [json.loads((out / f"replan-{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["replans"][0]["step"] == 30 and ranks[0]["replans"][0]["max_steps"] == 79
    assert [r["max_steps"] for r in ranks[0]["replans"]] == [r["max_steps"] for r in ranks[1]["replans"]]
    last = ranks[0]["replans"][-1]["max_steps"]
    assert all(r["step"] == last and r["stopped"] is None and abs(r["lr"]) < 1e-12 for r in ranks), ranks
    assert json.loads((out / BUDGET_FILE).read_text())["max_steps"] == last  # written once, by rank 0


def _evaluating_trainer(output_dir, **fields):
    return decoder_trainer(output_dir, eval_dataset=BlockDataset(torch.arange(200) % 11, 8), **fields)  # 25 blocks


@pytest.mark.parametrize("bf16", [False, True])
def test_the_evaluation_probe_times_one_pass_over_the_eval_data_and_leaves_the_model(tmp_path, bf16):
    """What the budget sets aside for a periodic evaluation is one pass over the Trainer's eval dataloader, in the
    training precision, with no gradients and no change to the model; nothing when the Trainer does not evaluate."""
    trainer = _evaluating_trainer(tmp_path, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8,
                                  bf16=bf16)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    seen = []
    trainer.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[0], torch.is_grad_enabled(),
                                                  torch.is_autocast_enabled("cpu"), module.training)),
        with_kwargs=True)
    trainer.model.train()
    assert toolkit.budget.probe_seconds_per_evaluation(trainer, time.process_time) > 0
    assert seen == [(8, False, bf16, False)] * 3 + [(1, False, bf16, False)]
    assert trainer.model.training and all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in weights.items())
    trainer.args.eval_strategy = "no"
    assert toolkit.budget.probe_seconds_per_evaluation(trainer) == 0.0 and len(seen) == 4


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"eval_strategy": "steps", "eval_steps": 4}, int(120 / (0.5 * 1.02 + 3.0 / 4))),  # 3 s every 4 steps
        ({"eval_strategy": "steps", "eval_steps": 0.25}, int((120 - 4 * 3.0) / (0.5 * 1.02))),  # 4 evaluations
        ({"eval_strategy": "epoch"}, int(120 / (0.5 * 1.02 + 3.0 / 13))),  # 50 blocks of 8: 13 batches of 4
        ({"eval_strategy": "no"}, int(120 / (0.5 * 1.02))),
    ],
    ids=["every-4-steps", "fraction-of-the-run", "every-epoch", "none"],
)
def test_the_budget_sets_aside_the_periodic_evaluations(tmp_path, monkeypatch, fields, expected, caplog):
    """The budget counts the periodic evaluations (TimedEvalCallback's clock runs through them), so `max_steps` is
    planned with them: otherwise a run whose evaluations are slow (one window per target) stops on its budget with
    its learning rate far from the end of the schedule."""
    caplog.set_level(logging.INFO, logger="hf_settransformer")  # the plan is an INFO line of the toolkit's logger
    trainer = _evaluating_trainer(tmp_path, **fields)
    monkeypatch.setattr("hf_settransformer.toolkit.budget.probe_seconds_per_step", lambda trainer, clock: 0.5)
    monkeypatch.setattr("hf_settransformer.toolkit.budget.probe_seconds_per_evaluation", lambda trainer, clock: 3.0)
    assert toolkit.budget.max_steps_for_budget(trainer, 2, toolkit.budget.TimedEvalCallback(clock="cpu")) == expected
    record = json.loads((tmp_path / BUDGET_FILE).read_text())
    evaluations = fields["eval_strategy"] != "no"
    assert record["seconds_per_evaluation"] == (3.0 if evaluations else 0.0)
    out = caplog.text
    assert ("per evaluation" in out or "evaluations of" in out) == evaluations


@pytest.mark.parametrize("bf16", [False, True])
def test_the_probe_times_steps_in_the_training_precision(tmp_path, bf16):
    """A --bf16 run is probed under bf16 autocast, as it trains (a probe in fp32 set too few steps for the budget)."""
    trainer = decoder_trainer(tmp_path, bf16=bf16, use_cpu=True)
    seen = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))
    toolkit.budget.probe_seconds_per_step(trainer, steps=5)  # the hook travels with the probed copy
    assert seen == [bf16] * 5


# ------------------------------------------------------------------------------------------------ a run's measurements


def test_train_and_measure_trains_saves_and_counts_the_whole_run(tmp_path):
    trainer = decoder_trainer(tmp_path, steps=6, logging_strategy="steps", logging_steps=1, save_strategy="steps",
                              save_steps=3)
    timer, budget, callbacks = toolkit.timed_callbacks(clock="cpu")
    for callback in callbacks:
        trainer.add_callback(callback)
    first = toolkit.train_and_measure(trainer, None, timer, budget, example_length=8)
    assert first["train_steps"] == 6 and first["train_tokens"] == 6 * 4 * 8 and first["train_examples"] == 24
    assert first["train_perplexity"] == pytest.approx(math.exp(first["train_loss"]))
    assert first["resumed_from_step"] is None and first["max_train_minutes"] is None
    assert not first["stopped_by_time_budget"] and first["budget_clock"] == "cpu"
    assert first["train_cpu_minutes"] == pytest.approx(first["train_cpu_seconds_whole_run"] / 60)
    # every duration and speed names its clock; the CPU speed is the whole run's tokens over its CPU time
    assert first["train_tokens_per_cpu_second"] == pytest.approx(first["train_tokens"] / (first["train_cpu_minutes"] * 60))
    assert first["train_tokens_per_wall_second"] == pytest.approx(first["train_tokens"] / first["train_wall_seconds"])
    assert not {"train_seconds", "train_seconds_whole_run", "train_tokens_per_second"} & set(first)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "trainer_state.json").is_file()
    assert (tmp_path / "checkpoint-3" / COMPLETE_MARKER).is_file()
    # resumed from step 3: the same weights, the training loss of the whole run, the time before the checkpoint
    again = decoder_trainer(tmp_path / "again", steps=6, logging_strategy="steps", logging_steps=1)
    timer, budget, callbacks = toolkit.timed_callbacks(tmp_path / "checkpoint-3", clock="cpu")
    for callback in callbacks:
        again.add_callback(callback)
    resumed = toolkit.train_and_measure(again, str(tmp_path / "checkpoint-3"), timer, budget, example_length=8)
    assert resumed["resumed_from_step"] == 3 and resumed["train_steps"] == 6
    assert resumed["train_loss"] == pytest.approx(first["train_loss"], rel=1e-5)
    marker = json.loads((tmp_path / "checkpoint-3" / COMPLETE_MARKER).read_text())
    assert resumed["train_cpu_seconds_whole_run"] > marker["train_seconds"] > 0
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[name]), name


def test_run_environment_and_replica_checksums_of_a_single_process(tmp_path):
    trainer = decoder_trainer(tmp_path)
    environment = toolkit.machine.run_environment(trainer)
    assert environment["precision"] == "fp32" and environment["torch_compile"] is False
    assert environment["threads_per_process"] == torch.get_num_threads()
    assert environment["cpu_model"] == toolkit.machine.cpu_model_name() and environment["cpu_model"]
    assert environment["gpu_name"] is None  # trained on the CPU
    assert (environment["transformers_version"], environment["torch_version"]) == (
        transformers.__version__, torch.__version__)
    assert environment["cpu_fast_bf16"] is toolkit.machine.fast_bf16_available(use_cpu=True)
    total = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    assert toolkit.measure.replica_checksums(trainer) == [pytest.approx(total)]
    assert toolkit.measure.tokens_per_step(trainer.args, 8) == 4 * 8


def test_gpu_training_defaults_apply_on_cuda_only_and_never_over_a_given_flag(tmp_path):
    """Off CUDA nothing changes; on CUDA fused AdamW, persistent dataloader workers, torch.compile and larger evaluation
    batches, each unless the command set it; an explicit worker count leaves persistence alone (it needs workers).
    The fields are real TrainingArguments fields with values it accepts."""
    from transformers import TrainingArguments

    assert toolkit.machine.gpu_training_defaults(False) == {} == toolkit.machine.gpu_training_defaults(False, {"optim"})
    on_cuda = toolkit.machine.gpu_training_defaults(True)
    assert on_cuda == {"optim": "adamw_torch_fused", "dataloader_num_workers": 4,
                       "dataloader_persistent_workers": True, "torch_compile": True, "per_device_eval_batch_size": 64}
    given = toolkit.machine.gpu_training_defaults(True, {"torch_compile", "per_device_eval_batch_size"})
    assert "torch_compile" not in given and "per_device_eval_batch_size" not in given and given["optim"]
    workers = toolkit.machine.gpu_training_defaults(True, {"dataloader_num_workers"})
    assert "dataloader_num_workers" not in workers and "dataloader_persistent_workers" not in workers
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **on_cuda)
    assert args.torch_compile and args.dataloader_persistent_workers and args.per_device_eval_batch_size == 64


@pytest.mark.parametrize(
    "name,precision,tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "bf16", None),  # another peak, not in the table: no MFU rather than a wrong one
        ("NVIDIA H200", "fp16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L40", "bf16", None),  # neither the L4 nor the L40S
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("Tesla T4", "bf16", None),
        ("NVIDIA H100 80GB HBM3", "tf32", None),
    ],
)
def test_peak_flops_come_from_the_table_by_gpu_name_and_precision(name, precision, tflops):
    peak, note = toolkit.machine.peak_flops(name, precision)
    if tflops is None:
        assert peak is None and note.startswith("no ")
    else:
        assert peak == pytest.approx(tflops * 1e12) and note.startswith(f"{name}: {tflops:g} TFLOPS")


def test_model_flops_utilization_on_a_known_gpu_an_unknown_one_and_a_cpu():
    """MFU = tokens/s x FLOPs per token / (peak x devices); None with the reason on a CPU, an unknown GPU, or without a
    timed step."""
    h100 = toolkit.measure.model_flops_utilization(1e5, 1e9, "NVIDIA H100 80GB HBM3", "bf16", devices=2)
    assert h100["train_model_flops_per_wall_second"] == pytest.approx(1e14)
    assert h100["mfu"] == pytest.approx(1e14 / (2 * 989.4e12)) and h100["mfu_peak_flops_per_device"] == 989.4e12
    assert h100["mfu_note"].endswith("x 2 devices")
    cpu = toolkit.measure.model_flops_utilization(1e5, 1e9, None, "bf16")
    assert cpu["train_model_flops_per_wall_second"] == pytest.approx(1e14)
    assert cpu["mfu"] is None and cpu["mfu_note"] == "no peak table for CPUs"
    unknown = toolkit.measure.model_flops_utilization(1e5, 1e9, "Tesla T4", "fp32")
    assert unknown["mfu"] is None and "'Tesla T4'" in unknown["mfu_note"]
    untimed = toolkit.measure.model_flops_utilization(None, 1e9, "NVIDIA H100 80GB HBM3")
    assert untimed["mfu"] is None and untimed["train_model_flops_per_wall_second"] is None
    assert untimed["mfu_note"] == "no training steps timed in this process"


def test_write_model_card_fills_the_fields_it_is_given(tmp_path):
    template = tmp_path / "card.md"
    template.write_text("# ${repo_id}\nperplexity ${ppl}, kept: ${unknown}, $$5\n")
    (tmp_path / "out").mkdir()
    path = toolkit.cards.write_model_card(tmp_path / "out", template, repo_id="me/model", ppl="12.34")
    assert path == tmp_path / "out" / "README.md"
    assert path.read_text() == "# me/model\nperplexity 12.34, kept: ${unknown}, $5\n"


def test_log_to_stdout_shows_the_toolkit_lines_by_process(capsys, caplog):
    """The scripts' logging: toolkit and script lines, one plain line each on the stdout of the moment (a capture
    that replaced it after the handler was made included), INFO on the main process and only WARNING elsewhere; a
    second call adds no second handler."""
    import logging

    from hf_settransformer.toolkit.logs import LOGGER_ROOT
    from hf_settransformer.toolkit.run_folder import logger

    root = logging.getLogger(LOGGER_ROOT)
    level, handlers = root.level, list(root.handlers)
    try:
        scripts = toolkit.log_to_stdout(main_process=True)
        toolkit.log_to_stdout(main_process=True)
        assert sum(type(h).__name__ == "_StdoutHandler" for h in root.handlers) == 1  # however often it is called
        scripts.info("[mine] a script line")
        logger.info("[mine] a toolkit line")
        out = capsys.readouterr().out
        assert "[mine] a script line\n" in out and "[mine] a toolkit line\n" in out
        toolkit.log_to_stdout(main_process=False)  # another rank: its INFO lines are not shown, warnings are
        logger.info("[mine] rank 1 info")
        logger.warning("[mine] rank 1 warning")
        out = capsys.readouterr().out
        assert "rank 1 info" not in out and "[mine] rank 1 warning\n" in out
        assert sum(type(h).__name__ == "_StdoutHandler" for h in root.handlers) == 1
    finally:
        root.setLevel(level)
        for h in root.handlers[len(handlers):]:
            root.removeHandler(h)


def test_reloading_a_checkpoint_reports_missing_keys_but_not_tied_weights(tmp_path):
    """A checkpoint stores a tied weight once: `PerplexityLoggingTrainer` does not report its tied copy
    (`lm_head.weight`) as missing when it reloads the best checkpoint, and still reports a key that is missing."""
    from torch.nn.modules.module import _IncompatibleKeys

    from hf_settransformer.toolkit.measure import PerplexityLoggingTrainer

    model = hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    assert "lm_head.weight" in model.all_tied_weights_keys
    trainer = PerplexityLoggingTrainer(model=model, args=quiet_training_args(tmp_path, max_steps=1))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.trainer")
    logger.addHandler(handler)
    try:
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
        assert not records and model.lm_head.weight is model.model.embeddings.embed_tokens.weight
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.norm.weight"], []))
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "There were missing keys in the checkpoint model loaded: ['model.norm.weight']."]


def test_training_arguments_pin_no_memory_without_an_accelerator(tmp_path):
    """Pinned memory serves copies to an accelerator; without one torch pins nothing and warns at every DataLoader."""
    args = toolkit.CheckedTrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert args.dataloader_pin_memory == torch.accelerator.is_available()

"""What a resume keeps of its run: every TrainingArguments field decided, the kept ones read back from a checkpoint's
training_args.bin without running its pickle."""

import dataclasses
import os

import pytest
import torch
import transformers

from hf_settransformer.toolkit import resume_settings
from hf_settransformer.toolkit.lm_arguments import LMTrainingArguments


def test_every_training_argument_is_kept_or_free_with_a_reason():
    """A TrainingArguments field missing from the table would be free on resume without anyone having decided so."""
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    assert set(resume_settings.ON_RESUME) == fields
    for name, (decision, why) in resume_settings.ON_RESUME.items():
        assert decision in (resume_settings.KEPT, resume_settings.KEPT_WHERE_SET, resume_settings.FREE) and why, name
    for name in ("neftune_noise_alpha", "dataloader_drop_last", "learning_rate", "seed", "bf16"):
        assert name in resume_settings.KEPT_ARGUMENTS


def test_training_args_bin_is_read_as_the_arguments_it_holds(tmp_path):
    args = LMTrainingArguments(output_dir=str(tmp_path), learning_rate=0.003, neftune_noise_alpha=5.0,
                               dataloader_drop_last=True, report_to="none")
    torch.save(args, tmp_path / "training_args.bin")
    read = resume_settings.read_training_args_file(tmp_path)
    assert read == resume_settings.run_settings(args)
    assert (read["learning_rate"], read["neftune_noise_alpha"], read["dataloader_drop_last"]) == (0.003, 5.0, True)
    assert read["lr_scheduler_type"] == "warmup_stable_decay" and read["accelerator_config"]["split_batches"] is False


class Payload:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_training_args_bin_that_would_run_a_command_is_refused_unrun(tmp_path):
    torch.save(Payload(f"touch {tmp_path / 'ran'}"), tmp_path / "training_args.bin")
    with pytest.raises(SystemExit) as err:
        resume_settings.read_training_args_file(tmp_path)
    assert "training_args.bin is a pickle that would call posix.system" in str(err.value.code)
    assert not (tmp_path / "ran").exists()
    (tmp_path / "training_args.bin").write_bytes(b"not an archive")
    with pytest.raises(SystemExit, match="training_args.bin is damaged"):
        resume_settings.read_training_args_file(tmp_path)
    (tmp_path / "training_args.bin").unlink()
    assert resume_settings.read_training_args_file(tmp_path) is None

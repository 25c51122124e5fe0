"""What a resume must keep of the run it continues, and how it checks it: every `TrainingArguments` field is in
`ON_RESUME`, kept or free to change; the kept ones and the script's own settings (data, objective, precision) are
recorded in each checkpoint's completion marker (`run_settings`) and compared with the resuming command, and the kept
`TrainingArguments` also with the checkpoint's `training_args.bin` (`check_run_settings`), which is read without
running its pickle (`read_training_args_file`)."""

import dataclasses
import hashlib
import json
import pickle
import zipfile
from pathlib import Path

from transformers.utils import logging as hf_logging

from .checkpoint_files import COMPLETE_MARKER, damaged_checkpoint, read_marker

logger = hf_logging.get_logger(__name__)

KEPT = "kept"  # compared on resume: a resume with another value is refused
KEPT_WHERE_SET = "kept where set"  # compared where both the checkpoint's run and the command set it (not None)
FREE = "free"  # may change on resume

# Every TrainingArguments field of transformers 5.23, {name: (decision, why)}. Kept: what shapes each step (its
# examples, its gradient, its update) or the random streams, as the optimizer, schedule and data position come from
# the checkpoint and the results would record the new flags. Free: how long the run is, how it is watched, evaluated,
# saved, published or spread over devices, and the resume's own choices.
ON_RESUME = {
    "output_dir": (FREE, "where the run writes"),
    "per_device_train_batch_size": (KEPT, "the examples of a step"),
    "num_train_epochs": (FREE, "the run's length: a longer run is how transformers continues one"),
    "max_steps": (FREE, "the run's length (set by a time or token budget too)"),
    "learning_rate": (KEPT, "the optimizer's step size"),
    "lr_scheduler_type": (KEPT, "the schedule the scheduler state belongs to"),
    "lr_scheduler_kwargs": (KEPT, "the schedule's shape"),
    "warmup_steps": (KEPT, "the schedule's warm-up"),
    "optim": (KEPT, "the optimizer the state belongs to"),
    "optim_args": (KEPT, "the optimizer's options"),
    "weight_decay": (KEPT, "part of each update"),
    "adam_beta1": (KEPT, "part of each update"),
    "adam_beta2": (KEPT, "part of each update"),
    "adam_epsilon": (KEPT, "part of each update"),
    "optim_target_modules": (KEPT, "which modules the optimizer treats apart"),
    "gradient_accumulation_steps": (KEPT, "the examples of a step"),
    "average_tokens_across_devices": (KEPT, "how each step's loss is normalised"),
    "max_grad_norm": (KEPT, "gradient clipping of each step"),
    "label_smoothing_factor": (KEPT, "the loss"),
    "bf16": (KEPT, "the precision each step computes in"),
    "fp16": (KEPT, "the precision each step computes in"),
    "bf16_full_eval": (FREE, "evaluation only"),
    "fp16_full_eval": (FREE, "evaluation only"),
    "tf32": (KEPT, "the precision of each step's matrix products"),
    "activation_checkpointing": (FREE, "memory for time, the same gradients"),
    "activation_checkpointing_kwargs": (FREE, "memory for time, the same gradients"),
    "gradient_checkpointing": (FREE, "memory for time, the same gradients"),
    "gradient_checkpointing_kwargs": (FREE, "memory for time, the same gradients"),
    "torch_compile": (FREE, "the same function, compiled"),
    "torch_compile_backend": (FREE, "the same function, compiled"),
    "torch_compile_mode": (FREE, "the same function, compiled"),
    "use_liger_kernel": (FREE, "fused kernels of the same function"),
    "liger_kernel_config": (FREE, "fused kernels of the same function"),
    "use_cache": (FREE, "the Trainer trains without a cache"),
    "neftune_noise_alpha": (KEPT, "noise added to the embeddings at every step"),
    "torch_empty_cache_steps": (FREE, "memory housekeeping"),
    "auto_find_batch_size": (KEPT, "lets the Trainer change the batch of a step"),
    "logging_strategy": (FREE, "watching"),
    "logging_steps": (FREE, "watching"),
    "logging_first_step": (FREE, "watching"),
    "log_on_each_node": (FREE, "watching"),
    "logging_nan_inf_filter": (FREE, "filters the logged loss only"),
    "include_num_input_tokens_seen": (FREE, "watching"),
    "log_level": (FREE, "watching"),
    "log_level_replica": (FREE, "watching"),
    "disable_tqdm": (FREE, "watching"),
    "report_to": (FREE, "watching"),
    "run_name": (FREE, "watching"),
    "project": (FREE, "watching"),
    "trackio_space_id": (FREE, "watching"),
    "trackio_bucket_id": (FREE, "watching"),
    "trackio_static_space_id": (FREE, "watching"),
    "eval_strategy": (FREE, "evaluation only"),
    "eval_steps": (FREE, "evaluation only"),
    "eval_delay": (FREE, "evaluation only"),
    "per_device_eval_batch_size": (FREE, "evaluation only"),
    "prediction_loss_only": (FREE, "evaluation only"),
    "eval_on_start": (FREE, "evaluation only"),
    "eval_do_concat_batches": (FREE, "evaluation only"),
    "eval_use_gather_object": (FREE, "evaluation only"),
    "eval_accumulation_steps": (FREE, "evaluation only"),
    "include_for_metrics": (FREE, "evaluation only"),
    "batch_eval_metrics": (FREE, "evaluation only"),
    "save_only_model": (FREE, "what later checkpoints hold"),
    "save_strategy": (FREE, "when checkpoints are saved"),
    "save_steps": (FREE, "when checkpoints are saved"),
    "save_on_each_node": (FREE, "where checkpoints are saved"),
    "save_total_limit": (FREE, "how many checkpoints are kept"),
    "enable_jit_checkpoint": (FREE, "when checkpoints are saved"),
    "push_to_hub": (FREE, "publishing"),
    "hub_token": (FREE, "publishing"),
    "hub_private_repo": (FREE, "publishing"),
    "hub_model_id": (FREE, "publishing"),
    "hub_strategy": (FREE, "publishing"),
    "hub_always_push": (FREE, "publishing"),
    "hub_revision": (FREE, "publishing"),
    "load_best_model_at_end": (FREE, "which checkpoint ends the run, by the metric below"),
    "metric_for_best_model": (KEPT_WHERE_SET, "the best checkpoint so far was chosen by it: another metric would be "
                                              "compared with the old one's best value"),
    "greater_is_better": (KEPT_WHERE_SET, "the direction the best metric so far was chosen in"),
    "ignore_data_skip": (FREE, "the resume's own choice: the epoch's data from its start, not skipped to its position"),
    "restore_callback_states_from_checkpoint": (FREE, "the resume's own choice"),
    "full_determinism": (KEPT, "how the seed is applied and whether kernels are deterministic"),
    "seed": (KEPT, "the model's random streams (dropout, masking)"),
    "data_seed": (KEPT, "the order of the examples"),
    "use_cpu": (FREE, "the device (the precision it resolves to is kept)"),
    "accelerator_config": (KEPT, "split_batches, use_seedable_sampler, ... decide each step's examples "
                                 "(ACCELERATOR_KEPT)"),
    "parallelism_config": (FREE, "how processes share the work, as their number"),
    "dataloader_drop_last": (KEPT, "whether an epoch's last, smaller batch is a step"),
    "dataloader_num_workers": (FREE, "the same batches, made in other processes"),
    "dataloader_pin_memory": (FREE, "the same batches"),
    "dataloader_persistent_workers": (FREE, "the same batches"),
    "dataloader_prefetch_factor": (FREE, "the same batches"),
    "dataloader_multiprocessing_context": (FREE, "the same batches"),
    "dataloader_in_order": (KEPT, "with workers, False lets the batches come in another order"),
    "remove_unused_columns": (KEPT, "which inputs reach the model"),
    "label_names": (KEPT, "which inputs are the labels of the loss"),
    "train_sampling_strategy": (KEPT, "the order of the examples"),
    "length_column_name": (KEPT, "the order of the examples under group_by_length"),
    "ddp_find_unused_parameters": (FREE, "how processes share the work"),
    "ddp_bucket_cap_mb": (FREE, "how processes share the work"),
    "ddp_broadcast_buffers": (FREE, "how processes share the work"),
    "ddp_static_graph": (FREE, "how processes share the work"),
    "ddp_backend": (FREE, "how processes share the work"),
    "ddp_timeout": (FREE, "how processes share the work"),
    "fsdp": (FREE, "how processes hold the model, as their number (a layout the checkpoint was not saved in is the "
                   "Trainer's to load or refuse)"),
    "fsdp_config": (FREE, "how processes hold the model"),
    "deepspeed": (FREE, "how processes hold the model (a DeepSpeed file's own optimizer section is not compared)"),
    "debug": (FREE, "watching"),
    "skip_memory_metrics": (FREE, "watching"),
    "do_train": (FREE, "what the command does"),
    "do_eval": (FREE, "what the command does"),
    "do_predict": (FREE, "what the command does"),
    "resume_from_checkpoint": (FREE, "the resume itself"),
    "local_rank": (FREE, "which process this is"),
}

# the TrainingArguments a resume compares
KEPT_ARGUMENTS = tuple(name for name, (decision, _) in ON_RESUME.items() if decision != FREE)
# of `accelerator_config`, what decides a step's examples (the others: how batches reach the device)
ACCELERATOR_KEPT = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler")


def _kept_value(name, value):
    """The JSON value of the kept TrainingArguments field `name` that a resume compares."""
    value = _as_json(value)
    if name == "accelerator_config" and isinstance(value, dict):
        value = {key: value.get(key) for key in ACCELERATOR_KEPT}
    return value


def _as_json(value):
    """`value` as JSON gives it back: an enum as its value, a dataclass as its fields, a tuple as a list, anything
    else JSON lacks as its text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    value = getattr(value, "value", value)
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def run_settings(training_args, **settings):
    """The settings that define a run, as JSON values: the kept TrainingArguments (`ON_RESUME`) of `training_args`,
    and the script's own `settings` (data flags, objective, precision, a set model's name). The scripts record them in
    every checkpoint's completion marker (`CompleteCheckpointCallback.run_settings`) and compare them on resume
    (`check_run_settings`)."""
    recorded = {name: _kept_value(name, getattr(training_args, name)) for name in KEPT_ARGUMENTS
                if hasattr(training_args, name)}
    recorded.update({name: _as_json(value) for name, value in settings.items()})
    return recorded


def file_digest(path):
    """SHA-256 of a file's bytes (a data file's identity: the same text under another path is the same data)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# the modules whose classes a TrainingArguments file names (the arguments' class, their enums, accelerate's state)
ARGUMENT_MODULES = ("transformers.", "accelerate.", "hf_settransformer.", "torch.", "enum.", "collections.",
                    "builtins.", "datetime.", "pathlib.")


class _Loaded:
    """What `_InertUnpickler` makes of an object of a named class: its constructor arguments (an enum's value) and
    state (a dataclass's fields), nothing run."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state


class _InertUnpickler(pickle.Unpickler):
    """Reads a pickle without importing or calling anything it names: each class or function becomes a `_Loaded`
    subclass recording its name (`named`), so that the values can be read and a name no arguments file holds can be
    refused."""

    def __init__(self, file):
        super().__init__(file)
        self.named = []

    def find_class(self, module, name):
        self.named.append(f"{module}.{name}")
        return type(name, (_Loaded,), {})

    def persistent_load(self, pid):  # a tensor's storage: an arguments file holds none
        raise pickle.UnpicklingError("it holds tensors")


def _plain(value):
    """A value read by `_InertUnpickler` as JSON values: an enum as its value, an object as its fields."""
    if isinstance(value, _Loaded):
        state = getattr(value, "state", None)
        if isinstance(state, dict):
            return {key: _plain(item) for key, item in state.items()}
        return _plain(value.args[0]) if len(value.args) == 1 else [_plain(arg) for arg in value.args]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    return value


def read_training_args_file(folder):
    """{field: JSON value} of the kept TrainingArguments (`KEPT_ARGUMENTS`) in `folder`'s training_args.bin (what the
    Trainer saved with the checkpoint), or None where there is none. It is a pickle: read by `_InertUnpickler`, which
    runs nothing; one that names anything but the classes of an arguments file, or is no torch.save archive, ends the
    run naming the file (`damaged_checkpoint`)."""
    path = Path(folder) / "training_args.bin"
    if not path.is_file():
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            data = next(name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl")
            unpickler = _InertUnpickler(archive.open(data))
            loaded = unpickler.load()
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, ValueError, EOFError, TypeError,
            AttributeError, IndexError, KeyError) as err:
        raise damaged_checkpoint(folder, f"training_args.bin is damaged (not the Trainer's arguments file: "
                                         f"{type(err).__name__}: {err})") from None
    # a script's own TrainingArguments subclass is pickled under the script's module (`__main__`)
    foreign = sorted({name for name in unpickler.named
                      if not (name.startswith(ARGUMENT_MODULES) or name.endswith("TrainingArguments"))})
    if foreign:
        raise damaged_checkpoint(folder, f"training_args.bin is a pickle that would call {', '.join(foreign)}, "
                                         "which no arguments file does (refused, not run)")
    fields = _plain(loaded)
    if not isinstance(fields, dict):
        raise damaged_checkpoint(folder, "training_args.bin is damaged (it holds no TrainingArguments)")
    return {name: _kept_value(name, fields[name]) for name in KEPT_ARGUMENTS if name in fields}


def _differs(name, theirs, ours):
    """Whether a recorded setting `name` differs between the checkpoint's run and this command."""
    if ON_RESUME.get(name, (KEPT,))[0] == KEPT_WHERE_SET and (theirs is None or ours is None):
        return False
    return theirs != ours


def check_run_settings(folder, settings, script="train"):
    """Refuses (SystemExit naming each one) a resume whose `settings` (`run_settings` of this command) differ from
    those of the checkpoint's run: the optimizer, scheduler and data position come from the checkpoint, the results
    would record the new flags, and the run would be neither. The run's settings are the ones its completion marker
    records and, for the TrainingArguments, the ones its training_args.bin holds (what the Trainer ran with): a marker
    edited to match other flags does not hide them.

    What is kept: `ON_RESUME`'s kept TrainingArguments, and the script's own settings (the data, the example lengths,
    the objective, the precision, a set model's name). A longer `--max_steps` (or a larger time or token budget, which
    sets it) is how transformers continues a run: the schedule then follows the new length from the resumed step.

    A setting only one side records (a checkpoint of an older version) is not compared; a marker that records none
    resumes with a warning that says what could be compared."""
    marker = (read_marker(folder) or {}).get("run_settings")
    arguments = read_training_args_file(folder)
    recorded = dict(marker) if isinstance(marker, dict) else {}
    if recorded.get("precision") == "auto":  # what older versions recorded: bf16/fp16 of training_args.bin tell
        del recorded["precision"]
    differ = []
    for name in sorted((set(recorded) | set(arguments or {})) & set(settings)):
        ours = settings[name]
        if arguments is not None and name in arguments and _differs(name, arguments[name], ours):
            if name not in recorded:
                source = " (its training_args.bin)"
            elif recorded[name] != arguments[name]:  # the marker edited by hand
                source = f" (its training_args.bin; its {COMPLETE_MARKER} says {recorded[name]!r})"
            else:
                source = ""
            differ.append(f"{name}: the checkpoint's run has {arguments[name]!r}{source}, the flags say {ours!r}")
        elif name in recorded and _differs(name, recorded[name], ours):
            differ.append(f"{name}: the checkpoint's run has {recorded[name]!r}, the flags say {ours!r}")
    if differ:
        raise SystemExit(
            f"[{script}] --resume_from_checkpoint {folder}: this command is not the run the checkpoint belongs to: "
            f"{'; '.join(differ)}. Resume with the flags that started the run (its optimizer, schedule and data "
            "position are the checkpoint's), or start a new run with these settings in another --output_dir."
        )
    if not isinstance(marker, dict):
        compared = ("its training arguments were compared with its training_args.bin, but its data, example lengths, "
                    "objective and precision cannot be" if arguments is not None else
                    "it has no training_args.bin either, so nothing could be compared with this command's flags")
        logger.warning(f"[{script}] {folder}: its {COMPLETE_MARKER} records no run settings (a checkpoint of a "
                       f"version that did not record them, or a marker edited since): {compared}; resuming with the "
                       "flags as given")

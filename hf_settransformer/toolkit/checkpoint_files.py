"""What a run reads back from a folder it did not just write: a checkpoint to resume from, a saved model to continue.
A checkpoint is complete once its marker is written (`COMPLETE_MARKER`, `read_marker`), and has a step
(`checkpoint_step`). Each file is checked before transformers or torch reads it (a truncated safetensors file, a
garbage optimizer.pt, a missing trainer_state.json), so a damaged folder ends the run naming the file, what is wrong
with it and what to do, instead of a traceback from inside safetensors or torch.load, or, worse, a run that silently
starts over. Nothing here writes: the output folder and what is written into it are `run_folder`'s."""

import json
import zipfile
from pathlib import Path

from transformers.utils import logging as hf_logging

logger = hf_logging.get_logger(__name__)

WEIGHTS = "model.safetensors"

# in a checkpoint folder once the Trainer has written all of it (`run_folder.CompleteCheckpointCallback`): the
# step, training time, validation curve and run settings so far
COMPLETE_MARKER = "hfst_checkpoint_complete.json"

# files torch.save wrote into a checkpoint (zip archives since torch 1.6): the Trainer torch.loads each one it finds
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state.pth")

# config fields that do not describe the model a run trains: where and how it was saved, and `use_cache`, which the
# Trainer turns off while training (a checkpoint's config says False, the final model's True)
UNDESCRIPTIVE = {"_name_or_path", "transformers_version", "architectures", "auto_map", "dtype", "torch_dtype",
                 "use_cache"}


def read_safetensors_shapes(path):
    """{tensor name: shape} of a safetensors file, from its header; ValueError saying what is wrong when the file is
    no safetensors file or is shorter than its header says (truncated)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"it is {size} bytes long, too short for a safetensors header (truncated or empty)")
        length = int.from_bytes(prefix, "little")
        if length > size - 8:
            raise ValueError(f"its header claims {length:,} bytes but the file has {size:,} (truncated, or not a "
                             "safetensors file)")
        try:
            header = json.loads(f.read(length))
            shapes = {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
            end = max((int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            raise ValueError("its header is not a safetensors header (not a safetensors file, or damaged)") from None
    if size < 8 + length + end:
        raise ValueError(f"it is {size:,} bytes long but its tensors need {8 + length + end:,} (truncated: killed or "
                         "out of space while it was written?)")
    return shapes


def missing_weights(shapes, model):
    """The parameters and buffers of `model` that `shapes` (a weights file's) lacks; a tied weight saved under its
    twin's name is not missing."""
    state = model.state_dict()
    saved_storage = {state[name].data_ptr() for name in shapes if name in state}
    return sorted(name for name in set(state) - set(shapes) if state[name].data_ptr() not in saved_storage)


def config_differences(theirs, ours):
    """["attention_type: the checkpoint has 'softmax', the flags say 'linear'", ...] for every field that describes
    the model and differs between two config dicts (a saved config.json and the model this run builds)."""
    return [f"{key}: the checkpoint has {theirs.get(key)!r}, the flags say {ours.get(key)!r}"
            for key in sorted(set(theirs) | set(ours))
            if key not in UNDESCRIPTIVE and not key.startswith("_") and theirs.get(key) != ours.get(key)]


def saved_config(config_class, values):
    """A saved config.json's `values` as `config_class` would hold them, defaults filled in (a saved config leaves out
    the fields at their defaults), as a dict; the values as they are where the class refuses them."""
    try:
        return config_class.from_dict(dict(values)).to_dict()
    except Exception:  # another model's config: its differences are named field by field
        return values


def read_marker(folder):
    """The completion marker of a checkpoint folder as a dict, or None when it is missing or not a JSON object."""
    try:
        marker = json.loads((Path(folder) / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_step(folder):
    """`.../checkpoint-1464` -> 1464; a folder named otherwise gives the step its marker or trainer state records."""
    suffix = Path(folder).name.split("-")[-1]
    if suffix.isdigit():
        return int(suffix)
    for source in (read_marker(folder) or {}, Path(folder) / "trainer_state.json"):
        if isinstance(source, Path):
            try:
                source = json.loads(source.read_text())
            except (OSError, ValueError):
                continue
        step = source.get("global_step") if isinstance(source, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    raise ValueError(
        f"{folder}: cannot tell the checkpoint's step (its name does not end in -<step>, and neither "
        f"{COMPLETE_MARKER} nor trainer_state.json records a `global_step`)."
    )


def earlier_checkpoint(folder):
    """The newest complete `checkpoint-<step>` beside `folder` with a lower step, or None."""
    folder = Path(folder)
    try:
        step = checkpoint_step(folder)
    except ValueError:
        return None
    others = [p for p in folder.parent.glob("checkpoint-*")
              if p.name.split("-")[-1].isdigit() and int(p.name.split("-")[-1]) < step and read_marker(p) is not None]
    return max(others, key=lambda p: int(p.name.split("-")[-1]), default=None)


def damaged_checkpoint(folder, what):
    """SystemExit: the checkpoint `folder` cannot be resumed from because of `what`, with what to do instead."""
    earlier = earlier_checkpoint(folder)
    todo = (f"resume from the earlier checkpoint with --resume_from_checkpoint {earlier}, or move {Path(folder).name} "
            "aside" if earlier else "no earlier complete checkpoint is there: start again with --overwrite_output_dir "
            "(or another --output_dir)")
    return SystemExit(f"--resume_from_checkpoint {folder}: {what}. This checkpoint cannot be resumed from: {todo}.")


def check_checkpoint_files(folder):
    """Refuses (`damaged_checkpoint`) a checkpoint whose files the Trainer would fail on or silently skip: no
    trainer_state.json (the Trainer would restart the step count at 0) or one that is not JSON, no weights, a weights
    file that is truncated or no safetensors file, a torch.save file (optimizer, scheduler, RNG state) that is not a
    whole archive, an optimizer.pt missing beside its scheduler.pt. Checkpoints of sharded runs (ZeRO `global_step*`,
    FSDP `pytorch_model_fsdp*`) are checked for their trainer state only. Returns the weights' {name: shape}, or None
    for a sharded checkpoint."""
    folder = Path(folder)
    state = folder / "trainer_state.json"
    if not state.is_file():
        raise damaged_checkpoint(folder, "trainer_state.json is missing (it holds the step to resume at)")
    try:
        if not isinstance(json.loads(state.read_text()), dict):
            raise ValueError
    except (OSError, ValueError, UnicodeDecodeError):
        raise damaged_checkpoint(folder, "trainer_state.json is not a JSON object (damaged)") from None
    names = {p.name for p in folder.iterdir()}
    if any(name.startswith(("global_step", "pytorch_model_fsdp", "optimizer_")) for name in names):
        return None
    saved_by_torch = [name for name in sorted(names)
                      if name in TORCH_FILES or (name.startswith("rng_state_") and name.endswith(".pth"))]
    for name in saved_by_torch:  # rng_state_<rank>.pth: one per process of a multi-process run
        if not _is_whole_archive(folder / name):
            raise damaged_checkpoint(folder, f"{name} is damaged (not a whole torch.save archive: truncated or "
                                             "overwritten)")
        foreign = _unsafe_globals(folder / name)
        if foreign is None:
            raise damaged_checkpoint(folder, f"{name} is damaged (its pickle cannot be read)")
        if foreign:
            raise damaged_checkpoint(folder, f"{name} is a pickle that would call {', '.join(foreign)}, which "
                                             "no checkpoint file does (refused, not run)")
    if "scheduler.pt" in names and "optimizer.pt" not in names:
        raise damaged_checkpoint(folder, "optimizer.pt is missing (its scheduler.pt is there)")
    if "optimizer.pt" not in names:
        # the Trainer would resume with a new optimizer and restart the schedule's warm-up, without a word
        raise damaged_checkpoint(folder, "optimizer.pt and scheduler.pt are missing (saved with --save_only_model, "
                                         "or removed): the run's optimizer and schedule cannot be resumed. Its "
                                         "model can be trained further with --model_name_or_path")
    if WEIGHTS not in names:
        if names & {"model.safetensors.index.json", "pytorch_model.bin"}:
            return None
        raise damaged_checkpoint(folder, f"{WEIGHTS} is missing (the model's weights)")
    try:
        return read_safetensors_shapes(folder / WEIGHTS)
    except (OSError, ValueError) as err:
        raise damaged_checkpoint(folder, f"{WEIGHTS} is damaged: {err}") from None


def _unsafe_globals(path):
    """The functions and classes a torch.save file's pickle names that `torch.load(weights_only=True)` refuses
    (NumPy's arrays of an RNG state allowed, as the Trainer allows them), read without unpickling; None for a pickle
    that cannot be read so."""
    import torch
    from transformers.trainer import safe_globals

    try:
        with safe_globals():
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:  # not a pickle torch can read: the Trainer's torch.load would fail on it too
        return None


def _is_whole_archive(path):
    """Whether a torch.save file is a readable zip archive (a truncated one has lost its central directory)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def check_model_weights(flag, folder):
    """Before `from_pretrained(folder)`: a local model folder holds weights, a whole safetensors file or a
    pytorch_model.bin of plain tensors (SystemExit naming `flag`, the file and what is wrong). Returns {name: shape}, or None where there is nothing to check here (a
    Hub id, sharded or .bin weights)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return None
    weights = folder / WEIGHTS
    if not weights.is_file():
        pickled = folder / "pytorch_model.bin"
        if pickled.is_file() and not (folder / "model.safetensors.index.json").is_file():
            # transformers torch.loads it with weights_only=True: a foreign pickle fails there, naming no file
            foreign = _unsafe_globals(pickled) if _is_whole_archive(pickled) else None
            if foreign is None:
                raise SystemExit(f"{flag} {folder}: pytorch_model.bin is damaged (not a whole torch.save archive). "
                                 "Pass another saved model.")
            if foreign:
                raise SystemExit(f"{flag} {folder}: pytorch_model.bin is a pickle that would call "
                                 f"{', '.join(foreign)}, which no weights file does (refused, not run). Pass another "
                                 "saved model.")
        if any((folder / name).is_file() for name in ("model.safetensors.index.json", "pytorch_model.bin")):
            return None
        raise SystemExit(f"{flag} {folder}: holds no weights ({WEIGHTS} is missing): pass the folder of a saved "
                         "model (save_pretrained, or a finished run's --output_dir).")
    try:
        return read_safetensors_shapes(weights)
    except (OSError, ValueError) as err:
        raise SystemExit(f"{flag} {folder}: {WEIGHTS} is damaged: {err}. Pass another saved model (a run's "
                         "checkpoint-<step> folder holds one too).") from None


def check_loaded_weights(flag, folder, shapes, model):
    """After `from_pretrained`: no parameter of `model` was missing from the weights file (transformers would have
    initialized it at random with only a warning)."""
    if shapes is None:
        return
    missing = missing_weights(shapes, model)
    if missing:
        raise SystemExit(
            f"{flag} {folder}: {WEIGHTS} lacks {len(missing)} of the model's weights ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): the file is damaged or of another model, and these would start "
            "at random. Pass another saved model."
        )


def check_checkpoint_matches(folder, model):
    """Raises SystemExit when the checkpoint cannot be resumed into `model`: a damaged weights or config file, weights
    that do not fit it (another family, size or output layer: the checkpoint's
    model type and the config fields that differ are named, instead of the optimizer's "parameter group doesn't
    match" later), or weights that fit but a config that differs in any field describing the model (`--attention_type
    linear` on a softmax run's checkpoint has the same shapes and would resume as a model it is not). Missing weights
    with a matching config are a damaged file. The other files: `check_checkpoint_files`."""
    saved = None
    if (Path(folder) / WEIGHTS).is_file():
        try:
            saved = read_safetensors_shapes(Path(folder) / WEIGHTS)
        except (OSError, ValueError) as err:
            raise damaged_checkpoint(folder, f"{WEIGHTS} is damaged: {err}") from None
    try:
        theirs = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        theirs = None
    config = getattr(model, "config", None)  # None: a plain nn.Module (the rFF baselines)
    if config is not None and not isinstance(theirs, dict):
        raise damaged_checkpoint(folder, "config.json is missing or not JSON (the model's configuration)")
    ours = config.to_dict() if config is not None else {}
    differ = config_differences(saved_config(type(config), theirs), ours) if config is not None else []
    head = type(model).__name__
    if config is not None and theirs.get("architectures") and head not in theirs["architectures"]:
        # the same config and weight shapes under another head (a masked-LM head for a causal one, say)
        differ.insert(0, f"architectures: the checkpoint has {theirs['architectures']}, the flags build {head}")
    if saved is None:
        wanted = {}
        missing = unexpected = reshaped = []
    else:
        wanted = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        missing = missing_weights(saved, model)
        unexpected = sorted(set(saved) - set(wanted))
        reshaped = sorted(name for name in set(saved) & set(wanted) if saved[name] != wanted[name])
    if missing and not (unexpected or reshaped or differ):
        raise damaged_checkpoint(folder, f"{WEIGHTS} lacks {len(missing)} of the model's weights "
                                         f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")
    if missing or unexpected or reshaped:
        theirs = theirs or {}
        first = (missing + unexpected + reshaped)[0]
        fields = [d.replace(": the checkpoint has", ": checkpoint").replace(", the flags say", ", this run")
                  for d in differ[:12]]
        raise SystemExit(
            f"--resume_from_checkpoint {folder}: its weights do not fit this run's model. The checkpoint is a "
            f"{theirs.get('model_type', '?')} model ({', '.join(theirs.get('architectures') or ['?'])}), this run "
            f"builds a {ours.get('model_type')} model ({type(model).__name__}). Config fields that differ: "
            f"{'; '.join(fields) or 'none'}. First mismatched weight: {first} "
            f"(checkpoint {saved.get(first)}, this run {wanted.get(first)}). Resume with the flags that made the "
            "checkpoint, or start a fresh --output_dir."
        )
    if differ:
        raise SystemExit(
            f"--resume_from_checkpoint {folder}: the checkpoint is another model than the flags describe: "
            f"{'; '.join(differ)}. Resume with the flags that made it (its config.json), or train this model in a "
            "fresh --output_dir."
        )

"""The training scripts' command line and logging: checked `TrainingArguments` values, unknown flags named with the
nearest one, models and tokenizers loaded from a flag with a message that names it, a value every process takes from
the main one, and the scripts' log lines on stdout. The run folder, the time budget, measurements and the Hub upload
are in `run_folder`, `budget`, `measure` and `hub`.

Typical use of the pieces (docs/training.md, "Use the pieces in your own script"):

    resume = resolve_resume(training_args)
    timer, budget, callbacks = timed_callbacks(resume, clock="cpu", max_minutes=30)
    trainer = Trainer(..., callbacks=callbacks)
    results = train_and_measure(trainer, resume, timer, budget)

Needs torch and transformers only (no accelerate or datasets); the modeling files never import the toolkit.
"""

import dataclasses
import logging
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import torch
import transformers
from transformers.utils import logging as hf_logging

# the toolkit's messages: warnings reach stderr wherever logging is not configured (Python's last-resort handler);
# the scripts show them and their own INFO lines on stdout (`log_to_stdout`)
logger = hf_logging.get_logger(__name__)
LOGGER_ROOT = "hf_settransformer"


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# TrainingArguments values that transformers 5.23 accepts and then ignores or misreads: flag -> (test, what it must be).
# `eval_steps` 0 would become `logging_steps` in `__post_init__`, `save_total_limit` 0 or less keeps every checkpoint,
# a negative `max_grad_norm` or `max_steps` 0 turns clipping or the step limit off, NaN fails every test
TRAINING_VALUE_RANGES = {
    "save_steps": (lambda v: _finite(v) and v > 0, "a positive number (steps, or a fraction of the run if < 1)"),
    "eval_steps": (lambda v: v is None or (_finite(v) and v > 0),
                   "a positive number (steps, or a fraction of the run if < 1); omit it to evaluate every "
                   "--logging_steps"),
    "logging_steps": (lambda v: _finite(v) and v > 0, "a positive number (steps, or a fraction of the run if < 1)"),
    "save_total_limit": (lambda v: v is None or v >= 1, "a positive integer; omit it to keep every checkpoint"),
    "max_steps": (lambda v: v == -1 or v >= 1, "a positive integer, or -1 to train for --num_train_epochs"),
    "warmup_steps": (_finite, "a finite number (steps, or a fraction of the run if < 1)"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "max_grad_norm": (lambda v: _finite(v) and v >= 0, "a non-negative finite number (0 turns clipping off)"),
    "adam_beta1": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_beta2": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_epsilon": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "label_smoothing_factor": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "eval_accumulation_steps": (lambda v: v is None or v >= 1, "a positive integer"),
}


def check_training_values(args):
    """Refuses the `TrainingArguments` values of `TRAINING_VALUE_RANGES` that would be ignored or misread, naming the
    flag; run before `TrainingArguments.__post_init__` (which rewrites `eval_steps` 0), as `CheckedTrainingArguments`
    does."""
    for name, (valid, allowed) in TRAINING_VALUE_RANGES.items():
        value = getattr(args, name)
        if not valid(value):
            raise ValueError(f"--{name} must be {allowed}, got {value}.")
    epochs = args.num_train_epochs
    if args.max_steps == -1 and not (_finite(epochs) and epochs > 0):  # with --max_steps it is not read
        raise ValueError(f"--num_train_epochs must be a positive number (or pass --max_steps), got {epochs}.")


@dataclass
class CheckedTrainingArguments(transformers.TrainingArguments):
    """`TrainingArguments` that refuse the values transformers would ignore or misread (`check_training_values`)."""

    def __post_init__(self):
        check_training_values(self)
        super().__post_init__()


def parse_flags(parse, *args, **kwargs):
    """`parse(*args, **kwargs)` (an `HfArgumentParser` parse); a value the argument classes refuse (a `ValueError`
    naming the flag, theirs or transformers') ends the process with its message, not a traceback."""
    try:
        return parse(*args, **kwargs)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def unknown_flags_message(parser, unknown):
    """What to say of `unknown`, the arguments an `argparse` parser (an `HfArgumentParser` too) left over
    (`parse_known_args`): each flag it does not take named with the nearest one it does ("did you mean", difflib, as a
    config key the config lacks is named), and any value that belongs to no flag. transformers' own message ("Some
    specified arguments are not used by the HfArgumentParser") suggests nothing."""
    import difflib

    flags = sorted(option for option in parser._option_string_actions if option.startswith("--"))
    problems, after_flag = [], False
    for arg in unknown:
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            near = difflib.get_close_matches(name, flags, n=1)
            problems.append(f"unknown flag {name}" + (f" (did you mean {near[0]}?)" if near else ""))
            after_flag = "=" not in arg
        elif after_flag:  # the unknown flag's value
            after_flag = False
        else:
            problems.append(f"unexpected argument {arg!r} (no flag takes it)")
    return "; ".join(problems)


def check_flags(parser, args):
    """Raises a `ValueError` naming every argument of `args` that `parser` does not take, with the nearest flag it does
    (`unknown_flags_message`). `args`: a command line (a list of strings), or for an `HfArgumentParser` a dict of
    field values (what `parse_dict` takes: a key is a flag without its dashes). Call it before
    `parse_args_into_dataclasses` / `parse_dict`, so that a misspelt flag is the error, not a value check of the
    dataclasses built without it."""
    if isinstance(args, dict):
        fields = {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype) if f.init}
        unknown = [f"--{key}" for key in args if key not in fields]
    else:
        _, unknown = parser.parse_known_args(args=args)
    if unknown:
        raise ValueError(unknown_flags_message(parser, unknown))


def load_pretrained(flag, value, load, **kwargs):
    """`load(value, **kwargs)` (a `from_pretrained`) for a saved folder or a Hub repo id; a value that is neither, or
    that fails to load, ends the process naming the script's `flag` (transformers reads a missing folder as a repo id
    and answers "Repo id must be in the form ..."), and saying so when the Hub is off (HF_HUB_OFFLINE)."""
    path = check_pretrained_name(flag, value)
    try:
        return load(str(path) if path.is_dir() else value, **kwargs)
    except (OSError, ValueError) as err:
        if path.is_dir():
            raise SystemExit(f"{flag} {value}: could not load from this folder: {err}") from None
        if isinstance(err, ValueError):
            raise
        raise SystemExit(
            f"{flag} {value}: no such folder, and no Hub repo of that name could be loaded: "
            f"{str(err).splitlines()[0]}{_offline_note()}"
        ) from None


def check_pretrained_name(flag, value):
    """What `load_pretrained` checks before loading, without loading: `value` is a folder, or has the form of a Hub repo
    id; a file or a missing folder ends the process naming `flag`. Returns the path (`~` expanded)."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise SystemExit(f"{flag} {value}: is a file; a saved model or tokenizer is a folder (save_pretrained).")
    if not path.is_dir() and not re.fullmatch(r"[\w-][\w.-]*(/[\w-][\w.-]*)?", value):
        raise SystemExit(f"{flag} {value}: no such folder (and not a Hub repo id).{_offline_note()}")
    return path


def _offline_note():
    # what a failed load adds where the Hub is off
    return (" The Hub is not reachable (HF_HUB_OFFLINE is set): only folders and models already in the cache load."
            if huggingface_hub.is_offline_mode() else "")


def from_main_process(value):
    """`value` as the main process has it, on every process (a picklable object; itself without several processes).
    What every rank must agree on (a lock's owner, a time budget's max_steps) is decided on rank 0 and sent from there:
    each rank deciding alone (its own timing probe) can disagree, and a rank that stops first leaves the others waiting
    in their next collective."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    if torch.distributed.get_world_size() == 1:
        return value
    shared = [value]
    torch.distributed.broadcast_object_list(shared, src=0)
    return shared[0]


class _StdoutHandler(logging.StreamHandler):
    """A handler that writes to whatever `sys.stdout` is when a record arrives (a notebook's or pytest's capture
    replaces it after the handler is made)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def log_to_stdout(main_process=True):
    """How the scripts show messages: the `hf_settransformer` loggers (the toolkit's and the scripts', made with
    transformers' `logging.get_logger`) write one plain line each to stdout, INFO and up on the main process and
    WARNING and up on the others (as transformers' example scripts log from the main process). Returns the scripts'
    logger (`hf_settransformer.scripts`). Calling it again only sets the level."""
    root = logging.getLogger(LOGGER_ROOT)
    if not any(isinstance(h, _StdoutHandler) for h in root.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if main_process else logging.WARNING)
    return hf_logging.get_logger(f"{LOGGER_ROOT}.scripts")



"""The scripts' command line: `TrainingArguments` values checked (`CheckedTrainingArguments`), unknown flags named with
the nearest one, a JSON file of flags typed as the command line types its text, the flags a command gave, and what a
flag names (a data file, a tokenizer folder, a saved model or Hub id) checked or loaded. A bad value is refused with a
message that names the flag, not a traceback.
"""

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import torch
import transformers


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
    "warmup_steps": (lambda v: _finite(v) and v >= 0, "a finite number, not negative (steps, or a fraction of the "
                     "run if < 1)"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "max_grad_norm": (lambda v: _finite(v) and v >= 0, "a non-negative finite number (0 turns clipping off)"),
    "adam_beta1": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_beta2": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "adam_epsilon": (lambda v: _finite(v) and v >= 0, "a non-negative finite number"),
    "label_smoothing_factor": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "eval_accumulation_steps": (lambda v: v is None or v >= 1, "a positive integer"),
    # set_seed seeds numpy too, whose seeds are 32-bit: anything else fails there with numpy's own ValueError
    "seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)"),
    # refused by torch's optimizer, sampler or dataloader only once training starts, with their own tracebacks (a
    # zero accumulation divides by zero)
    "learning_rate": (lambda v: _finite(v) and v >= 0, "a finite number, not negative (0 keeps the weights as they "
                      "are)"),
    "per_device_train_batch_size": (lambda v: v >= 1, "a positive integer"),
    "per_device_eval_batch_size": (lambda v: v >= 1, "a positive integer"),
    "gradient_accumulation_steps": (lambda v: v >= 1, "a positive integer"),
    "dataloader_num_workers": (lambda v: v >= 0, "a non-negative integer (0: batches made in the main process)"),
    "neftune_noise_alpha": (lambda v: v is None or (_finite(v) and v > 0),
                            "a positive finite number; omit it for no noise"),
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
    if args.push_to_hub or args.hub_model_id is not None:  # a push needs the full name: the card loads it by it
        from .hub import check_repo_id

        check_repo_id(args.hub_model_id, "--hub_model_id", namespace=args.push_to_hub)
        strategy = getattr(args.hub_strategy, "value", args.hub_strategy)
        if args.push_to_hub and strategy in ("checkpoint", "all_checkpoints"):  # the scripts push the final model's files, once
            raise ValueError(f"--hub_strategy {strategy}: a push uploads the final model at the end of the run, never "
                             "a checkpoint (its optimizer and RNG states are pickles); leave the flag out.")


@dataclass
class CheckedTrainingArguments(transformers.TrainingArguments):
    """`TrainingArguments` that refuse the values transformers would ignore or misread (`check_training_values`)."""

    def __post_init__(self):
        check_training_values(self)
        super().__post_init__()
        if self.dataloader_pin_memory and not torch.accelerator.is_available():
            # pinned memory is for copies to an accelerator: without one, torch pins nothing and warns at every
            # DataLoader ("'pin_memory' argument is set as true but no accelerator is found")
            self.dataloader_pin_memory = False


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


def explicit_flags(parser, argv):
    """The fields `argv` sets: {dest} of every `--name`, `--name=value`, `--name-with-dashes`, `--no_name` and unique
    prefix (argparse's abbreviations), so that no preset or device default overrides a flag the command gave, and a
    flag the run cannot use is refused only when the command gave it."""
    options = parser._option_string_actions  # option string -> argparse action
    given = set()
    for arg in argv:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        dests = {options[flag].dest} if flag in options else {a.dest for o, a in options.items() if o.startswith(flag)}
        if len(dests) == 1:
            given |= dests
    return given


def typed_flag_values(parser, values, source):
    """`values` (flag name -> value, from a JSON file of flags) with each value converted as the command line would
    convert its text: "2" for an int flag is 2, "true" or 1 for a bool flag is True, 3 for a float flag is 3.0. A value
    the flag cannot take (2.5 or true for an int flag, a word outside its choices) ends the process naming `source`,
    the flag and what it takes; `null` is kept (the field's None). `HfArgumentParser.parse_dict` alone passes the JSON
    types through, so "2" would reach the checks as a string."""
    import argparse

    actions = {action.dest: action for action in parser._actions}
    typed = {}
    for name, value in values.items():
        action = actions.get(name)
        if action is None or value is None or action.type is None:
            typed[name] = value
            continue
        kind = getattr(action.type, "__name__", "a value")
        kind = {"string_to_bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}.get(
            kind, kind)

        def refuse(value=value, kind=kind, name=name):
            raise SystemExit(f"{source}: {name!r} must be {kind}, got {json.dumps(value)}.")

        def convert(item):
            if action.type is str and isinstance(item, (dict, list)):
                return item  # TrainingArguments takes its dict and list fields as JSON objects and lists too
            if isinstance(item, bool) and action.type in (int, float, str):
                refuse()
            if isinstance(item, float) and action.type is int and not item.is_integer():
                refuse()
            if isinstance(item, (dict, list)):
                refuse()
            text = str(int(item)) if isinstance(item, float) and action.type is int else str(item)
            try:
                converted = action.type(text)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                refuse()
            if action.choices is not None and converted not in action.choices:
                raise SystemExit(f"{source}: {name!r} must be one of {list(action.choices)}, got {json.dumps(item)}.")
            return converted

        many = action.nargs in ("+", "*") and isinstance(value, list)
        typed[name] = [convert(item) for item in value] if many else convert(value)
    return typed


def flags_file(argv):
    """The JSON file of flags `argv` is (one argument ending in .json, as transformers' example scripts take), or
    None; a YAML file is refused (`HfArgumentParser` reads one, these scripts do not)."""
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        raise SystemExit(f"{argv[0]}: the scripts read their flags from the command line or one JSON file "
                         "(flags.json), not YAML: convert it to JSON.")
    return argv[0] if len(argv) == 1 and argv[0].endswith(".json") else None


def read_flags_file(path):
    """{flag: value} of a JSON file of flags (`train_lm.py flags.json`, as transformers' example scripts take); a
    file that is missing, not JSON or not one object ends the process naming it."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SystemExit(f"{path}: cannot read this flags file: {err.strerror or err}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"{path}: not a JSON file of flags: {err}.") from None
    if not isinstance(values, dict):
        raise SystemExit(f"{path}: a JSON file of flags holds one object, {{\"flag\": value, ...}}, not a "
                         f"{type(values).__name__}.")
    return values


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


# a byte-order mark of a text encoding other than UTF-8 (UTF-32 first: its little-endian mark starts as UTF-16's)
OTHER_ENCODING_MARKS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
                        b"\xfe\xff": "UTF-16"}


def check_data_file(flag, path):
    """Refuses, naming `flag`, the path and the cause, a data file the scripts cannot read as text: an empty path, a
    missing path, a folder, something other than a regular file (a device such as /dev/null, a named pipe: the file is
    read twice, checked here and then loaded), UTF-16 or UTF-32 text, a binary file (NUL bytes), bytes that are not
    UTF-8 (the first one's offset and line) and a file with no text. UTF-8 with a byte-order mark is text (the mark
    is not: the loader reads "utf-8-sig"); CRLF line ends and a missing last newline are read as lines."""
    import stat

    if not path:
        raise SystemExit(f"{flag} is an empty string: pass the path of a text file (or leave the flag out).")
    file = Path(path).expanduser()
    if file.is_dir():
        raise SystemExit(f"{flag}: {path} is a folder; pass a text file.")
    if not file.exists():
        raise SystemExit(f"{flag}: no such file: {path}")
    mode = file.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device")
        raise SystemExit(f"{flag}: {path} is {kind}, not a regular file; the data is read more than once (checked, "
                         "then loaded), so save it to a text file and pass that.")
    data = file.read_bytes()
    for mark, encoding in OTHER_ENCODING_MARKS.items():
        if data.startswith(mark):
            raise SystemExit(f"{flag}: {path} is {encoding} text (it starts with the byte-order mark "
                             f"{mark.hex(' ')}); the scripts read UTF-8. Convert it first, e.g. "
                             f"`iconv -f {encoding} -t utf-8`.")
    nul = data.find(b"\0")
    if nul >= 0:
        raise SystemExit(f"{flag}: {path} is a binary file (a NUL byte at offset {nul:,}), not text (UTF-16 text "
                         "without a byte-order mark looks so too: convert it to UTF-8).")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        offset = err.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, offset) + 1
        raise SystemExit(
            f"{flag}: {path} is not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset:,} (line {line}) "
            "cannot be decoded. Convert it first, e.g. `iconv -f latin1 -t utf-8`."
        ) from None
    if not text.strip():
        raise SystemExit(f"{flag}: {path} is empty (no text on any line).")


# the files of a saved tokenizer, one of which `AutoTokenizer.from_pretrained` needs in a folder
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")


def check_tokenizer_folder(flag, value, model=False):
    """Refuses a folder `value` (of `flag`) that holds no tokenizer file, naming the folder and the files looked for
    and what to pass instead (`model`: the folder is --model_name_or_path's, read for want of --tokenizer_name).
    transformers' own message for such a folder asks to install sentencepiece or tiktoken, which would not help."""
    folder = Path(value).expanduser()
    if not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    what = ("pass --tokenizer_name with the folder or Hub id of the tokenizer it was trained with" if model else
            "pass the folder of a saved tokenizer (save_pretrained), or leave out --tokenizer_name to build the "
            "word-level tokenizer from --train_file")
    raise SystemExit(f"{flag} {value}: this folder holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                     f"{what}.")

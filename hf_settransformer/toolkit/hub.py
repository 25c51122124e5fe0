"""The upload of a finished run to the Hub: only what makes up the model, each part checked to load as what it claims.

`publishable_files` decides what a folder publishes, by name and then by content: config.json and
generation_config.json; the weights (model.safetensors, or model.safetensors.index.json and the shards it names), whose
every tensor must be one the config's model class has, with its shape and dtype, none missing but the tied ones
transformers ties on load; the modeling code config.json's auto_map names and what it imports relatively (the files
`save_pretrained` copies); the tokenizer's files (those its `save_pretrained` writes); the model card README.md; the
run's results as JSON (all_results.json, trainer_state.json, training_args.json and the Trainer's *_results.json).
Everything else (checkpoints, pickles such as training_args.bin, optimizer.pt or a pytorch_model.bin, logs, notes, a
link to a file anywhere) is left out and named: a run's folder holds these by design. A file the model needs that is
missing, cut short, a link or not what config.json describes refuses the whole push (`UnpublishableFolderError`): the
repository would not load, or would load as another model. So do weights holding NaN or infinite values (a diverged
run) and a file to be published that holds a Hub access token (`without_secrets` keeps it out of recorded commands).
"""


import contextlib
import importlib
import json
import os
import re
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from .run_lock import LOCK_FILE

logger = hf_logging.get_logger(__name__)

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
RESULTS = ("all_results.json", "train_results.json", "eval_results.json", "test_results.json", "predict_results.json",
           "trainer_state.json", "training_args.json")
CARD = "README.md"
# the files a tokenizer may be saved as; which of them make up a folder's tokenizer is what it saves again
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                   "chat_template.json")
# the modules a modeling file imports relatively: the regular expressions of transformers' `get_relative_imports`
_RELATIVE_IMPORTS = (re.compile(r"^\s*import\s+\.(\S+)\s*$", re.M), re.compile(r"^\s*from\s+\.(\S+)\s+import", re.M))
# a safetensors header's dtype names
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                       torch.bool: "BOOL"}
# a Hub access token ("hf_" and 34 letters and digits today): never in a published file
HUB_TOKEN = re.compile(rb"hf_[A-Za-z0-9]{30,}")
SECRET_FLAG = "--hub_token"
REPO_ID_RULE = ("namespace/name, e.g. you/wikitext2-decoder: a user or organisation, then the repository, each of "
                "letters, digits, '-', '_' and '.', neither starting nor ending with '-' or '.', without '--' or '..', "
                "at most 96 characters")


class HubUnreachableError(RuntimeError):
    """The Hub could not be reached, or refused the repository (offline, no network, a bad token, no rights)."""


class UnpublishableFolderError(ValueError):
    """A folder whose model would not load as its config.json claims (a file missing, cut short, a link, or weights
    of another shape or dtype): nothing of it is uploaded."""


def check_repo_id(repo_id, flag, namespace=True):
    """Raises a ValueError naming `flag` unless `repo_id` is a Hub repository id (`namespace/name`; a bare `name`, a
    repository of the token's own user, where `namespace` is False). huggingface_hub's own `HFValidationError` is a
    traceback from deep inside an upload, after the training."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo_id is None:
        raise ValueError(f"{flag} is needed: the Hub repository, {REPO_ID_RULE}.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"{flag} {repo_id!r} is not a valid Hub repository id: expected {REPO_ID_RULE} ({err})") from None
    if namespace and repo_id.count("/") != 1:
        raise ValueError(f"{flag} {repo_id!r} has no namespace: expected {REPO_ID_RULE}.")


def without_secrets(argv):
    """`argv` with the value of `--hub_token` (or an abbreviation argparse takes for it) as `<HUB_TOKEN>`, as
    transformers writes training_args.json: a command is recorded in all_results.json and the model card, which a
    push publishes."""
    kept, hide = [], False
    for word in argv:
        flag, equals, _ = word.partition("=")
        secret = flag.startswith("--hub_t") and SECRET_FLAG.startswith(flag)
        kept.append("<HUB_TOKEN>" if hide else f"{flag}=<HUB_TOKEN>" if secret and equals else word)
        hide = secret and not equals and not hide
    return kept


def network_errors():
    """The exceptions a Hub call raises when the Hub cannot be reached or refuses: OSError (huggingface_hub's HTTP
    errors and offline mode are OSErrors) and the HTTP client's own errors (connection refused, time-outs)."""
    found = [OSError]
    for name in ("httpx2", "httpx"):  # the client huggingface_hub uses (httpx2 from huggingface_hub 2)
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def reach_hub(repo_id, token=None, private=False):
    """Creates the Hub repository `repo_id` if needed and returns the `HfApi` to push with; raises
    HubUnreachableError naming the cause when the Hub cannot be reached or refuses (call it before changing
    anything that a push should leave as it was)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=bool(private), exist_ok=True)
    except network_errors() as err:
        raise HubUnreachableError(f"could not create or reach the Hub repository {repo_id}: {err}") from None
    return api


def push_folder_to_hub(folder, repo_id, token=None, private=False,
                       commit_message="hf_settransformer: trained model, tokenizer and model card", api=None):
    """Uploads what makes up the model of a finished run's folder (`publishable_files`: weights, config with
    auto_map, modeling code, tokenizer, model card, results as JSON) to the Hub repository `repo_id`, created if
    needed (`reach_hub`, unless `api` is its result); logs what it leaves out. Unlike the Trainer's own push, no
    pickle is uploaded. Returns the commit information of `huggingface_hub`. A folder whose model would not load
    raises UnpublishableFolderError before the Hub is reached; an upload the Hub refuses or that the network breaks
    raises HubUnreachableError."""
    check_repo_id(repo_id, "repo_id")
    upload, left_out = publishable_files(folder)
    if left_out:
        logger.warning(f"[push] left out (not part of the model): {', '.join(left_out)}")
    api = api or reach_hub(repo_id, token=token, private=private)
    try:  # each name as a pattern that matches it alone: the upload is exactly `upload`
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 allow_patterns=[_fnmatch_literal(name) for name in upload])
    except network_errors() as err:
        raise HubUnreachableError(f"the upload of {folder} to {repo_id} failed: {err}") from None


def publishable_files(folder):
    """(upload, left_out): the names of `folder`'s files that make up its model, checked (see the module's
    docstring), and the names of everything else in it (a folder with "/" after its name, a link with " (a link)"),
    both sorted; the run's lock file is in neither. Raises UnpublishableFolderError naming the file and what is wrong
    where the model would not load as its config.json claims."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UnpublishableFolderError(f"{folder} is not a folder.")
    model_class, config, auto_map_modules = _model_config(folder)
    upload = {"config.json", *_code_files(folder, auto_map_modules)}
    upload.update(_checked_weights(folder, model_class, config))
    upload.update(_tokenizer_files(folder))
    if _present(folder / "generation_config.json"):
        from transformers import GenerationConfig

        _regular(folder, "generation_config.json", "the generation config")
        _loads(folder / "generation_config.json", lambda: GenerationConfig.from_pretrained(folder))
        upload.add("generation_config.json")
    for name in (CARD, *RESULTS):
        if _present(folder / name):
            path = _regular(folder, name, "the model card" if name == CARD else "the run's results")
            if name == CARD:
                _loads(path, lambda: path.read_text(encoding="utf-8"))
            else:
                _json_object(path)
            upload.add(name)
    for name in sorted(upload):  # the text a push publishes: a token in it (a recorded command, say) would be public
        path = folder / name
        if not name.endswith(".safetensors") and HUB_TOKEN.search(path.read_bytes()):
            raise UnpublishableFolderError(f"{path} holds a Hub access token (hf_...): not publishing a secret; "
                                           "take it out of the file.")
    left_out = []
    for path in sorted(folder.iterdir()):
        if path.name in upload or path.name == LOCK_FILE:
            continue
        left_out.append(path.name + (" (a link)" if path.is_symlink() else "/" if path.is_dir() else ""))
    return sorted(upload), left_out


# ------------------------------------------------------------------------------------------------- the checks


def _present(path):
    return path.exists() or path.is_symlink()


def _regular(folder, name, what):
    """`folder/name`, a regular file of the folder itself; else UnpublishableFolderError naming it and `what` it is."""
    path = folder / name
    if path.is_symlink():
        raise UnpublishableFolderError(f"{path} ({what}) is a link to {os.readlink(path)}: only the folder's own files "
                                       "are published; put the file itself there.")
    if not path.is_file():
        raise UnpublishableFolderError(f"{path} ({what}) is missing: the model would not load from the repository.")
    return path


def _loads(what, load):
    """`load()`, whose failure is an UnpublishableFolderError naming `what` (a file)."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        return load()
    except (ValueError, TypeError, KeyError, OSError, RuntimeError, StrictDataclassError) as err:
        raise UnpublishableFolderError(f"{what} does not load ({type(err).__name__}: {err}): not publishing a "
                                       "folder whose files are damaged.") from None


def _json_object(path):
    value = _loads(path, lambda: json.loads(path.read_text(encoding="utf-8")))
    if not isinstance(value, dict):
        raise UnpublishableFolderError(f"{path} holds a JSON {type(value).__name__}, not an object: not publishing it.")
    return value


def _model_config(folder):
    """(model class, config, the modules auto_map names) of `folder`'s config.json: its architecture one of this
    package's model classes (never a class called by a name read from a file unchecked), its fields valid for that
    class's config, and an auto_map entry for the class (what `trust_remote_code` loads)."""
    from .cards import _model_classes

    path = _regular(folder, "config.json", "the model's config")
    fields = _json_object(path)
    name = (fields.get("architectures") or [None])[0]
    model_class = _model_classes().get(name) if isinstance(name, str) else None
    if model_class is None:
        raise UnpublishableFolderError(f"{path} names the architecture {name!r}, which is not an hf_settransformer "
                                       "model class: not publishing it as one.")
    expected_type = model_class.config_class.model_type
    if fields.get("model_type") != expected_type:
        raise UnpublishableFolderError(f"{path}: model_type {fields.get('model_type')!r}, but {name} is of "
                                       f"model_type {expected_type!r}.")
    config = _loads(path, lambda: model_class.config_class.from_pretrained(folder))
    auto_map = fields.get("auto_map")
    refs = [ref for value in (auto_map.values() if isinstance(auto_map, dict) else [])
            for ref in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(ref, str)]
    refs = [ref.split("--")[-1] for ref in refs]  # "repo--module.Class" or "module.Class"
    if not any(ref.rsplit(".", 1)[-1] == name for ref in refs):
        raise UnpublishableFolderError(f"{path}: auto_map names no module for {name} (auto_map: {auto_map!r}): "
                                       "it would not load with trust_remote_code=True.")
    return model_class, config, sorted({ref.rsplit(".", 1)[0] for ref in refs})


def _code_files(folder, modules):
    """The modeling files of `modules` and every file they import relatively, followed as `save_pretrained` and
    transformers' remote-code loader follow them: each present, a regular file, and Python that compiles (it is not
    run here)."""
    found, todo = set(), [(module, "config.json's auto_map") for module in modules]
    while todo:
        module, named_by = todo.pop()
        if f"{module}.py" in found:
            continue
        if not re.fullmatch(r"\w+", module):
            raise UnpublishableFolderError(f"{folder}: {named_by} names the module {module!r}, not a file of the "
                                           "folder: it would not load with trust_remote_code=True.")
        path = _regular(folder, f"{module}.py", f"modeling code {named_by} imports")
        source = _loads(path, lambda: path.read_text(encoding="utf-8"))
        try:
            compile(source, str(path), "exec")
        except (SyntaxError, ValueError) as err:
            raise UnpublishableFolderError(f"{path} is not valid Python ({err}): cut short or damaged.") from None
        found.add(path.name)
        todo += [(name, path.name) for pattern in _RELATIVE_IMPORTS for name in pattern.findall(source)]
    return found


def _checked_weights(folder, model_class, config):
    """The weight files of `folder` (model.safetensors, or the index and its shards), once every tensor in them is
    one `model_class(config)` has, with its shape and dtype, and none it has is missing but the tied ones (which
    transformers ties on load, and `save_pretrained` leaves out); then the folder is loaded as `model_class`, as a
    Hub user's `from_pretrained` would, and anything transformers reports (missing, unexpected, mismatched) refuses
    it."""
    from safetensors import SafetensorError, safe_open

    single, index = _present(folder / WEIGHTS), _present(folder / WEIGHTS_INDEX)
    if single and index:
        raise UnpublishableFolderError(f"{folder} holds both {WEIGHTS} and {WEIGHTS_INDEX}: which weights load is "
                                       "ambiguous; keep the ones of this model.")
    if not (single or index):
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
        raise UnpublishableFolderError(
            f"{folder} has no {WEIGHTS} (nor a {WEIGHTS_INDEX}): no weights to publish"
            + (f"; {', '.join(pickles)} are pickles, which are never published (save the model with "
               "save_pretrained: safetensors)" if pickles else "") + ".")
    if single:
        files, weight_map = [WEIGHTS], None
    else:
        path = _regular(folder, WEIGHTS_INDEX, "the index of the weights")
        weight_map = _json_object(path).get("weight_map")
        if not (isinstance(weight_map, dict) and weight_map
                and all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
            raise UnpublishableFolderError(f"{path} has no weight_map of tensor names to shard files.")
        files = sorted(set(weight_map.values()))
        unsafe = [name for name in files if not re.fullmatch(r"[\w.-]+\.safetensors", name) or name.startswith(".")]
        if unsafe:
            raise UnpublishableFolderError(f"{path} names shards that are not safetensors files of the folder: "
                                           f"{', '.join(map(repr, unsafe))}.")
    found = {}  # tensor name -> (file, shape, dtype)
    for name in files:
        path = _regular(folder, name, f"weights {WEIGHTS_INDEX} names" if weight_map else "the weights")
        try:
            with safe_open(path, framework="pt") as weights:
                for key in weights.keys():
                    part = weights.get_slice(key)
                    if key in found:
                        raise UnpublishableFolderError(f"{path}: the tensor {key} is also in {found[key][0]}.")
                    found[key] = (name, tuple(part.get_shape()), part.get_dtype())
        except (SafetensorError, OSError) as err:
            raise UnpublishableFolderError(f"{path} is not a whole safetensors file ({err}): cut short or "
                                           "damaged.") from None
    problems = []
    if weight_map is not None:
        misplaced = sorted(key for key in weight_map.keys() | found.keys()
                           if weight_map.get(key) != found.get(key, (None,))[0])
        problems += [f"{key} is in {found[key][0] if key in found else 'no shard'}, {WEIGHTS_INDEX} says "
                     f"{weight_map.get(key, 'nothing')}" for key in misplaced]
    with torch.device("meta"):  # the names, shapes and dtypes the config makes; no memory
        model = model_class(config)
    dtype = config.dtype if isinstance(config.dtype, torch.dtype) else torch.float32  # what save_pretrained writes
    expected = {key: (tuple(t.shape), dtype if t.is_floating_point() else t.dtype)
                for key, t in model.state_dict().items()}
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    ignored_missing = [re.compile(p) for p in model_class._keys_to_ignore_on_load_missing or []]
    ignored_unexpected = [re.compile(p) for p in model_class._keys_to_ignore_on_load_unexpected or []]
    for key in sorted(expected.keys() - found.keys()):
        if key not in tied and not any(p.search(key) for p in ignored_missing):
            problems.append(f"{key} is missing")
    for key in sorted(found.keys() - expected.keys()):
        if not any(p.search(key) for p in ignored_unexpected):
            problems.append(f"{key} ({found[key][0]}) is not a tensor of the model")
    for key in sorted(found.keys() & expected.keys()):
        (name, shape, stored), (want_shape, want_dtype) = found[key], expected[key]
        if shape != want_shape:
            problems.append(f"{key} has the shape {list(shape)} in {name}, the config's model {list(want_shape)}")
        elif stored != _SAFETENSORS_DTYPES.get(want_dtype):
            problems.append(f"{key} is {stored} in {name}, the config's model {_SAFETENSORS_DTYPES.get(want_dtype)}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise UnpublishableFolderError(f"{folder}: the weights are not those of the {model_class.__name__} that "
                                       f"config.json describes: {shown}.")
    with _quiet_loading():
        loaded = _loads(folder / files[0], lambda: model_class.from_pretrained(folder, output_loading_info=True))
    reported = {kind: sorted(keys) for kind, keys in loaded[1].items() if keys}
    if reported:
        raise UnpublishableFolderError(f"{folder} does not load strictly as {model_class.__name__}: {reported}.")
    broken = [key for key, t in loaded[0].state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
    if broken:  # a run that diverged: its card would leave the NaN perplexity out as unmeasured
        raise UnpublishableFolderError(f"{folder}: the weights {', '.join(broken[:5])}"
                                       f"{f' and {len(broken) - 5} more' if len(broken) > 5 else ''} hold NaN or "
                                       "infinite values: not publishing a model that cannot predict.")
    return [WEIGHTS] if single else [WEIGHTS_INDEX, *files]


def _tokenizer_files(folder):
    """The files of `folder`'s tokenizer, if it has one: it must load (`AutoTokenizer`, no remote code), and its files
    are those it writes when saved again (a vocab.txt beside a tokenizer.json-only tokenizer is not one of them)."""
    if not any(_present(folder / name) for name in ("tokenizer.json", "tokenizer_config.json")):
        return []
    from transformers import AutoTokenizer

    present = [name for name in TOKENIZER_FILES if _present(folder / name)]
    for name in present:  # read through a link, it would be what is checked, then left out
        _regular(folder, name, "a tokenizer file")
    with _quiet_loading(), tempfile.TemporaryDirectory() as scratch:
        tokenizer = _loads(f"The tokenizer of {folder} ({', '.join(present)})",
                           lambda: AutoTokenizer.from_pretrained(folder, trust_remote_code=False))
        written = {Path(path).name for path in tokenizer.save_pretrained(scratch)}
    return sorted(name for name in written if (folder / name).is_file())


@contextlib.contextmanager
def _quiet_loading():
    """transformers' load report and progress bars off: a check's loads are not the user's."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _fnmatch_literal(path):
    """`path` as an fnmatch pattern that matches it alone ([, ], *, ? taken literally)."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in path)

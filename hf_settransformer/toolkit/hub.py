"""The upload of a finished run to the Hub: safetensors, JSON, code and text, never a pickle, a checkpoint or a link
that leads out of the folder."""


import importlib
import os
from pathlib import Path

from transformers.utils import logging as hf_logging

from .run_folder import LOCK_FILE

logger = hf_logging.get_logger(__name__)


# nothing that is a pickle (training_args.bin, optimizer states), nor checkpoints, logs, the run's lock or temporary
# files
PUSH_IGNORE_PATTERNS = ["checkpoint-*", "incomplete-*", "runs/*", "*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle",
                        LOCK_FILE, ".tmp-*", ".*.tmp-*"]


class HubUnreachableError(RuntimeError):
    """The Hub could not be reached, or refused the repository (offline, no network, a bad token, no rights)."""


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
    """Uploads a finished run's folder (weights, config with auto_map, modeling code, tokenizer, model card, results
    as JSON) to the Hub repository `repo_id`, created if needed (`reach_hub`, unless `api` is its result), leaving out
    `PUSH_IGNORE_PATTERNS`: unlike the Trainer's own push, no pickle is uploaded. Returns the commit information of
    `huggingface_hub`; an upload the Hub refuses or that the network breaks raises HubUnreachableError."""
    links = linked_paths(folder)
    if links:
        logger.warning(f"[push] left out (links: only the folder's own regular files are uploaded): {', '.join(links)}")
    api = api or reach_hub(repo_id, token=token, private=private)
    ignore = PUSH_IGNORE_PATTERNS + [_fnmatch_literal(p) for p in links] + [_fnmatch_literal(p) + "/*" for p in links]
    try:
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 ignore_patterns=ignore)
    except network_errors() as err:
        raise HubUnreachableError(f"the upload of {folder} to {repo_id} failed: {err}") from None


def linked_paths(folder):
    """The symbolic links inside `folder` (files or folders, not followed), relative, in "/" form: an upload follows
    them and would publish whatever they point to, outside the run's folder."""
    found = []
    for root, dirs, files in os.walk(folder):  # os.walk does not descend into linked folders
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def _fnmatch_literal(path):
    """`path` as an fnmatch pattern that matches it alone ([, ], *, ? taken literally)."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in path)

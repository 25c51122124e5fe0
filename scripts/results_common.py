"""What the results scripts (lm_results.py, set_results.py) share: a helper module beside them, not a script."""

import json
import sys
from pathlib import Path


# hf_settransformer.toolkit.measure.RENAMED_RESULT_KEYS, kept here so that the tables need no torch import (a test holds the
# two equal): all_results.json keys renamed to name their clock; results/ keeps files with the old names
RENAMED_RESULT_KEYS = {
    "train_seconds": "train_wall_seconds",
    "train_seconds_this_process": "train_wall_seconds_this_process",
    "train_seconds_before": "train_wall_seconds_before",
    "train_tokens_per_second": "train_tokens_per_wall_second",
    "train_model_flops_per_second": "train_model_flops_per_wall_second",
    "validation_seconds": "validation_wall_seconds",
    "test_seconds": "test_wall_seconds",
}


def upgrade_results(results):
    """`results` with today's key names, as `hf_settransformer.toolkit.measure.upgrade_results` gives them (a test compares
    the two): the old names renamed, `train_seconds_whole_run` named by its `budget_clock` (wall where not recorded),
    `train_tokens_per_cpu_second` computed where a CPU run recorded its CPU-minutes."""
    upgraded = {RENAMED_RESULT_KEYS.get(key, key): value for key, value in results.items()}
    if "train_seconds_whole_run" in upgraded:
        clock = upgraded.get("budget_clock") or "wall"
        upgraded[f"train_{clock}_seconds_whole_run"] = upgraded.pop("train_seconds_whole_run")
    cpu_minutes, tokens = upgraded.get("train_cpu_minutes"), upgraded.get("train_tokens")
    if "train_tokens_per_cpu_second" not in upgraded and "train_tokens" in upgraded:
        on_cpu = cpu_minutes and tokens is not None and not upgraded.get("gpu_name")
        upgraded["train_tokens_per_cpu_second"] = tokens / (cpu_minutes * 60) if on_cpu else None
    return upgraded


def read_results(path):
    """The JSON object in `path` (an all_results.json) with today's key names (`upgrade_results`: a run of any date
    reads alike), or None with a line on stderr naming the file when it is not one (an edited or foreign file): one
    bad file leaves the others' table standing, and is not skipped silently."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"skipped {path}: not readable as JSON ({type(err).__name__}: {err})", file=sys.stderr)
        return None
    if not isinstance(result, dict):
        print(f"skipped {path}: holds a JSON {type(result).__name__}, not an object", file=sys.stderr)
        return None
    return upgrade_results(result)


def check_folders(folders):
    """Refuses folders that do not exist, naming them (a typo would otherwise read as "no results there")."""
    missing = [str(f) for f in folders if not Path(f).is_dir()]
    if missing:
        raise SystemExit(f"No such folder: {', '.join(missing)}.")


def keep(runs, folder):
    """Copy each run's all_results.json to folder/<run name>/: small files that can be committed, the weights stay
    behind. Where the run folder has the saved model's config.json and the results do not record them, the copy gains
    `config` (config.json's fields) and `transformers_version`, so that the copy alone writes the run's model card again
    (`refresh_model_card(folder/<run>, card_path=...)`, scripts/make_model_cards.py): the card itself is not copied."""
    target = Path(folder)
    for r in runs:
        if r["path"].parent.resolve() == (target / r["name"]).resolve():
            continue
        results = json.loads(r["path"].read_text())
        config = r["path"].parent / "config.json"
        if config.is_file() and "config" not in results:
            results["config"] = json.loads(config.read_text())
            results.setdefault("transformers_version", results["config"].get("transformers_version"))
        (target / r["name"]).mkdir(parents=True, exist_ok=True)
        tmp = target / r["name"] / "all_results.json.tmp"
        tmp.write_text(json.dumps(results, indent=2) + "\n")
        tmp.replace(target / r["name"] / "all_results.json")

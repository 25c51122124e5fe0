"""What the results scripts (lm_results.py, set_results.py) share: reading and keeping runs' all_results.json. A
helper module beside them, not a script; it imports neither torch nor the toolkit, so that lm_results.py prints its
table without loading them."""

import json
import sys
from pathlib import Path


def read_results(path):
    """The JSON object in `path` (an all_results.json), or None with a line on stderr naming the file when it is not
    one (an edited or foreign file): one bad file leaves the others' table standing, and is not skipped silently."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"skipped {path}: not readable as JSON ({type(err).__name__}: {err})", file=sys.stderr)
        return None
    if not isinstance(result, dict):
        print(f"skipped {path}: holds a JSON {type(result).__name__}, not an object", file=sys.stderr)
        return None
    return result


def numbers_where_recorded(result, keys, path):
    """Whether each of `keys` that `result` records is a number (or null); a line on stderr naming the file and the
    field where one is not (a figure edited into a string would otherwise stop the table or print as text)."""
    for key in keys:
        value = result.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            print(f"skipped {path}: {key} is {value!r}, not a number", file=sys.stderr)
            return False
    return True


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

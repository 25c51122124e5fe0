"""What the results scripts (lm_results.py, set_results.py) share: a helper module beside them, not a script."""

import json
import shutil
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


def check_folders(folders):
    """Refuses folders that do not exist, naming them (a typo would otherwise read as "no results there")."""
    missing = [str(f) for f in folders if not Path(f).is_dir()]
    if missing:
        raise SystemExit(f"No such folder: {', '.join(missing)}.")


def keep(runs, folder):
    """Copy each run's all_results.json, and its filled model card (README.md) where it has one, to
    folder/<run name>/ (skipping runs already there): small files that can be committed, the weights stay behind."""
    target = Path(folder)
    for r in runs:
        if r["path"].parent.resolve() != (target / r["name"]).resolve():
            (target / r["name"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(r["path"], target / r["name"] / "all_results.json")
            card = r["path"].parent / "README.md"
            if card.is_file():
                shutil.copy(card, target / r["name"] / "README.md")

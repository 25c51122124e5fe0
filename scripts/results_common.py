"""What the results scripts (lm_results.py, set_results.py) share: a helper module beside them, not a script."""

import shutil
from pathlib import Path


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

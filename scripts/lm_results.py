"""Collect the `all_results.json` of WikiText-2 runs (scripts/wikitext2_grid.sh) into the README's table and a plot of
validation perplexity against training time.

    python scripts/lm_results.py outputs/wikitext2                 # prints the markdown table
    python scripts/lm_results.py outputs/wikitext2 --copy_to scripts/results/wikitext2 --plot scripts/results/wikitext2.png

`--copy_to` keeps each run's all_results.json (small) where it can be committed; the folder can be read back later.
"""

import argparse
import json
import math
import shutil
from pathlib import Path

ORDER = ["decoder", "encoder", "set_transformer", "perceiver_io"]
ATTENTION = {
    ("softmax", "elu"): "softmax",
    ("softmax", "exp"): "softmax",
    ("linear", "elu"): "linear elu",
    ("linear", "exp"): "linear exp",
}


def load(folders):
    runs = []
    for folder in folders:
        for path in sorted(Path(folder).glob("**/all_results.json")):
            result = json.loads(path.read_text())
            if "validation_perplexity" in result:
                result["name"] = path.parent.name
                result["path"] = path
                runs.append(result)
    key = {name: i for i, name in enumerate(ORDER)}
    runs.sort(key=lambda r: (key.get(r["family"], 9), r["attention"] != "softmax", r["feature_map"]))
    return runs


def table(runs):
    lines = [
        "| family | attention | parameters | train tokens | threads | tokens/s | validation ppl | test ppl | test acc "
        "| training time | wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['family']} | {ATTENTION[(r['attention'], r['feature_map'])]} | {r['parameters'] / 1e6:.2f}M | "
            f"{r.get('train_tokens', 0) / 1e6:.2f}M | {r.get('threads_per_process', '?')} | "
            f"{r.get('train_tokens_per_second', float('nan')):,.0f} | {r['validation_perplexity']:.1f} | "
            f"{r['test_perplexity']:.1f} | {r['test_accuracy']:.3f} | {training_time(r)} | "
            f"{r['wall_time_seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def training_time(r):
    """The whole run's training time; for a run resumed from a checkpoint that did not record it, the part after."""
    whole = r.get("train_seconds_whole_run")
    if whole is not None:
        return f"{whole / 60:.1f} min"
    if r.get("resumed_from_step"):
        return f"{r['train_seconds'] / 60:.1f} min after resuming at step {r['resumed_from_step']}"
    return f"{r.get('train_seconds', float('nan')) / 60:.1f} min"


def keep(runs, folder):
    """Copy each run's all_results.json to folder/<run name>/ (skipping runs already there)."""
    target = Path(folder)
    for r in runs:
        if r["path"].parent.resolve() != (target / r["name"]).resolve():
            (target / r["name"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(r["path"], target / r["name"] / "all_results.json")


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"softmax": "-", "linear elu": "--", "linear exp": ":"}  # line style: attention; colour: family
    families = list(dict.fromkeys(r["family"] for r in runs))
    colors = {family: f"C{i % 10}" for i, family in enumerate(families)}
    for r in runs:
        curve = r.get("validation_curve") or []
        if not curve:
            continue
        label = f"{r['family']}, {ATTENTION[(r['attention'], r['feature_map'])]}"
        if r.get("resumed_from_step") and r.get("train_seconds_whole_run") is None:
            label += f" (from step {r['resumed_from_step']}: time after resuming)"
        ax.plot(
            [p["seconds"] / 60 for p in curve],
            [math.exp(p["eval_loss"]) for p in curve],
            styles[ATTENTION[(r["attention"], r["feature_map"])]],
            color=colors[r["family"]],
            label=label,
        )
    ax.set_yscale("log")
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("validation perplexity (first 4,096 targets, during training)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--copy_to", default=None)
    p.add_argument("--plot", default=None)
    args = p.parse_args()
    runs = load(args.folders)
    if not runs:
        raise SystemExit(f"No all_results.json with evaluation results under {args.folders}.")
    print(table(runs))
    if args.copy_to:
        keep(runs, args.copy_to)
    if args.plot:
        plot(runs, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

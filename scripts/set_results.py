"""Collect the `all_results.json` of scripts/train_sets.py runs into the results table (docs/set_transformer.md): task, model, attention,
our metric next to the paper's (Lee et al. 2019), training wall time.

    python scripts/set_results.py outputs/sets                                  # prints the markdown table
    python scripts/set_results.py outputs/sets --copy_to results/sets   # and keeps the JSON files

Training times are this machine's, as the runs recorded them (see each run's `threads`). Each task's metric, its
format and order are its row of `OBJECTIVES` (`hf_settransformer.toolkit.set_tasks`).
"""

import argparse
from pathlib import Path

from hf_settransformer.toolkit.objectives import set_objectives
from hf_settransformer.toolkit.cli import unknown_flags_message
from results_common import check_folders, keep, numbers_where_recorded, read_results

BASELINES = {"deepsets_max": "rFF+max", "deepsets_mean": "rFF+mean", "deepsets_sum": "rFF+sum"}


def load(folders):
    tasks = set_objectives()  # the table's order: the rows'
    runs = []
    for folder in folders:
        for path in sorted(Path(folder).glob("**/all_results.json")):
            result = read_results(path)
            if result is None or not isinstance(result.get("task"), str) or result["task"] not in tasks:
                continue
            task = tasks[result["task"]]
            figures = [task.metric[0], *(task.reference or ())[:1], "parameters", "steps", "batch_size", "steps_before"]
            if numbers_where_recorded(result, figures, path):
                result["name"], result["path"] = path.parent.name, path
                runs.append(result)
    order = list(tasks)
    runs.sort(key=lambda r: (order.index(r["task"]), str(r.get("model")).startswith("deepsets"), str(r.get("model")),
                             r["name"]))
    return runs


def paper_value(run):
    """The paper's figure for this model on this task, or '-' (it reports none for point_clouds here)."""
    model = run.get("model") or ""
    key = BASELINES.get(model, model.split(",")[0])  # "ISAB(16)+PMA, softmax" -> "ISAB(16)+PMA"
    value = run.get("paper", {}).get(key)
    return "-" if value is None else set_objectives()[run["task"]].metric[2].format(value)


def split_model(model):
    if model is None:
        return "?", "?"
    if model in BASELINES:
        return BASELINES[model], "-"
    blocks, _, attention = model.partition(", ")
    return blocks, attention


def depth(run):
    """Blocks before and after pooling, "2 + 1" (the rFF baselines have no attention blocks: "-")."""
    if "num_hidden_layers" not in run:
        return "-"
    return f"{run['num_hidden_layers']} + {run.get('num_decoder_layers', '?')}"


def metric(run, task):
    """The task's metric as the table shows it, or "not measured" where the run recorded none (or not its reference)."""
    keys = [task.metric[0]] + ([task.reference[0]] if task.reference else [])
    return task.metric_text(run) if all(run.get(key) is not None for key in keys) else "not measured"


def steps(run):
    """Steps x sets: "20,000 x 128", or "30,000 + 20,000 x 10" for a run continued with --model_name_or_path."""
    if run.get("steps") is None or run.get("batch_size") is None:
        return "?"
    before = f"{run['steps_before']:,} + " if run.get("steps_before") else ""
    return f"{before}{run['steps']:,} x {run['batch_size']}"


def training_time(run):
    """Wall minutes of training, the continued run's included; "?" where a run did not record them."""
    parts = [run.get("train_wall_seconds"), run.get("train_wall_seconds_before", 0.0)]
    return "?" if None in parts else f"{sum(parts) / 60:.1f} min"


def table(runs):
    lines = [
        "| task | model | depth | attention | parameters | steps x sets | lr schedule | metric | ours | paper "
        "| training wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        task = set_objectives()[r["task"]]
        blocks, attention = split_model(r.get("model"))
        parameters = "?" if r.get("parameters") is None else f"{r['parameters']:,}"
        lines.append(
            f"| {r['task']} | {blocks} | {depth(r)} | {attention} | {parameters} | {steps(r)} | "
            f"{r.get('lr_scheduler', '?')} | {task.metric[1]} | {metric(r, task)} | {paper_value(r)} | "
            f"{training_time(r)} |"
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--copy_to", default=None)
    args, unknown = p.parse_known_args()
    if unknown:  # named with the nearest flag
        p.error(unknown_flags_message(p, unknown))
    check_folders(args.folders)
    runs = load(args.folders)
    if not runs:
        raise SystemExit(f"No train_sets.py all_results.json under {args.folders}.")
    print(table(runs))
    if args.copy_to:
        keep(runs, args.copy_to)


if __name__ == "__main__":
    main()

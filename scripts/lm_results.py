"""Collect the `all_results.json` of WikiText-2 runs (scripts/wikitext2_grid.sh) into the results table (docs/results.md) and a plot of
validation perplexity against training CPU-minutes (wall minutes x threads).

    python scripts/lm_results.py outputs/wikitext2                 # prints the markdown table
    python scripts/lm_results.py outputs/wikitext2 --copy_to results/wikitext2 --plot results/wikitext2.png
    python scripts/lm_results.py outputs/wikitext2 --unigram ../shared/data/wikitext-2   # adds the unigram reference row
    python scripts/lm_results.py outputs/methods --methods --copy_to results/wikitext2-methods   # a search's methods, seeds

`--copy_to` keeps each run's all_results.json (small) where it can be committed, with the run's config (the card is
written again from it: scripts/make_model_cards.py); the folder can be read back later.
`--refresh_cards` first writes each run's model card again with the current templates
(`hf_settransformer.toolkit.refresh_model_card`), for runs made before a change to the card.
"""

import argparse
import math
import sys
from pathlib import Path

from results_common import check_folders, keep, numbers_where_recorded, read_results

ORDER = ["decoder", "encoder", "set_transformer", "perceiver_io"]
ATTENTION = {
    ("softmax", "elu"): "softmax",
    ("softmax", "exp"): "softmax",
    ("linear", "elu"): "linear elu",
    ("linear", "exp"): "linear exp",
}


SCORES = ("validation_perplexity", "test_perplexity", "test_accuracy", "parameters")


def load(folders):
    """The language-model runs under `folders` that scored a split (validation, test or both), in the table's order."""
    runs = []
    for folder in folders:
        for path in sorted(Path(folder).glob("**/all_results.json")):
            result = read_results(path)
            scored = result is not None and {"validation_perplexity", "test_perplexity"} & set(result)
            if scored and "family" in result and numbers_where_recorded(result, SCORES, path):
                # the run's folder under the one named: "decoder-softmax", or "muon/decoder-softmax" in a search
                name = path.parent.relative_to(folder).as_posix()
                result["name"], result["path"] = path.parent.name if name == "." else name, path
                config = path.parent / "config.json"  # a run folder: the saved model's config beside its results
                if "config" not in result and "tie_adaptive_weights" not in result and config.is_file():
                    result["tie_adaptive_weights"] = (read_results(config) or {}).get("tie_adaptive_weights", False)
                runs.append(result)
    names = [r["name"] for r in runs]
    if len(set(names)) < len(names):  # --copy_to would keep one of them
        raise SystemExit(f"Two runs of the same name under {folders}: {sorted({n for n in names if names.count(n) > 1})}"
                         "; name the folder above them instead.")
    key = {name: i for i, name in enumerate(ORDER)}
    runs.sort(key=lambda r: (key.get(r["family"], 9), design(r), r["attention"] != "softmax", r["feature_map"],
                         r.get("linear_attention_decay") or "none"))
    return runs


def attention_label(r):
    """"softmax", "linear elu", "linear exp, gated decay" (the decay of runs that had one)."""
    decay = r.get("linear_attention_decay") or "none"
    attention = ATTENTION.get((r["attention"], r["feature_map"]), r["attention"])  # a registered kernel: its name
    return attention + ("" if decay == "none" else f", {decay} decay")


def design(r):
    """The head's design as the run recorded it: "masked LM" (`objective` mlm), "causal LM" (`next_token_mode` None:
    the causal-LM head has no mode), "many targets" or "one target / window". Runs that predate `next_token_mode`
    had one head per family: causal for the decoder, one target per window for the others."""
    if r.get("objective") == "mlm":
        return "masked LM"
    mode = r["next_token_mode"] if "next_token_mode" in r else (None if r["family"] == "decoder" else "window")
    return {None: "causal LM", "many": "many targets"}.get(mode, "one target / window")


def whole_run_seconds(r):
    """The whole run's training seconds on its budget clock (resumes included), or None where not recorded (resumed
    from a checkpoint that did not record them) or where the run did not train (no clock)."""
    clock = r.get("budget_clock")
    return r.get(f"train_{clock}_seconds_whole_run") if clock else None


def cpu_minutes_per_clock_second(r):
    """CPU-minutes in one second of a run's recorded training time: its budget clock counts CPU time (all threads of
    the process) or wall time (which counts once per thread)."""
    return 1 / 60 if r["budget_clock"] == "cpu" else r["threads_per_process"] / 60


def table(runs, unigram=None):
    lines = [
        "| family | design | attention | parameters | output layer | precision | threads | CPU-min | steps | train tokens "
        "| tokens / CPU-s | selected step | validation ppl | test ppl | test acc | eval CPU-min (val + test) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        threads = r["threads_per_process"]
        cpu_minutes = r.get("train_cpu_minutes")
        if cpu_minutes is None and whole_run_seconds(r):  # recorded the whole run's time, not its CPU-minutes
            cpu_minutes = whole_run_seconds(r) * cpu_minutes_per_clock_second(r)
        lines.append(
            f"| {r['family']} | {design(r)} | {attention_label(r)} | "
            f"{r['parameters'] / 1e6:.2f}M | {output_layer(r)} | {r.get('precision', 'fp32')} | {threads} | "
            f"{'?' if cpu_minutes is None else f'{cpu_minutes:.1f}'} | {r.get('train_steps', 0):,} | "
            f"{r.get('train_tokens', 0) / 1e6:.2f}M | {training_speed(r, cpu_minutes)} | "
            f"{selected_step(r)} | {measured(r, 'validation_perplexity', '.1f')} | {measured(r, 'test_perplexity', '.1f')} | "
            f"{measured(r, 'test_accuracy', '.3f')} | {evaluation_minutes(r)} |"
        )
    if unigram:
        lines.append(
            f"| unigram (training-split frequencies) | | | | | | | | | | | | {unigram['validation']:.1f} | "
            f"{unigram['test']:.1f} | {unigram['test_accuracy']:.3f} | |"
        )
    return "\n".join(lines)


PLAIN_METHODS = "AdamW + cosine"  # no method of the search: train_lm.py's defaults before it


def methods_label(r):
    """The training methods a run used, as recorded ("Muon + tied adaptive + WSD 20% + last average 20%"), or
    PLAIN_METHODS for none of them."""
    hyper = r.get("hyperparameters", {})
    parts = []
    if hyper.get("optimizer") == "muon":
        parts.append("Muon")
    if r.get("tie_adaptive_weights") or (r.get("config") or {}).get("tie_adaptive_weights"):
        parts.append("tied adaptive")
    if hyper.get("lr_scheduler_type") == "warmup_stable_decay":
        parts.append(f"WSD {hyper['decay_fraction']:.0%}")
    if r.get("average_weights") not in (None, "none"):
        parts.append(f"{r['average_weights']} average {r['average_fraction']:.0%}")
    return " + ".join(parts) or PLAIN_METHODS


def run_seed(r):
    """The run's seed: recorded, else the command's --seed, else the Trainer's default (42)."""
    if r.get("hyperparameters", {}).get("seed") is not None:
        return r["hyperparameters"]["seed"]
    words = r.get("command", "").split()
    return int(words[words.index("--seed") + 1]) if "--seed" in words else 42


def cpu_kind(r):
    """The CPU model and, where the run recorded it, whether it has a fast bf16 path ("AMD EPYC, avx512_bf16")."""
    fast = r.get("cpu_fast_bf16")
    return r.get("cpu_model", "?") + ("" if fast is None else ", avx512_bf16 / amx" if fast else ", no bf16 kernel")


def methods_table(runs):
    """One row per run of a training-methods search: the model, the methods, the seed, the context, and the figures a
    method changes (steps in the budget, the selected weights, validation and test perplexity)."""
    lines = [
        "| model | methods | seed | context | parameters | CPU | precision | threads | CPU-min | steps "
        "| selected | validation ppl | test ppl |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (attention_label(r) == "softmax", methods_label(r) != PLAIN_METHODS,
                                         methods_label(r), r.get("hyperparameters", {}).get("sequence_length") or 0,
                                         run_seed(r))):
        cpu_minutes = r.get("train_cpu_minutes")
        selected = r.get("selected_by") if "average" in (r.get("selected_by") or "") else selected_step(r)
        lines.append(
            f"| {r['family']}, {attention_label(r)} | {methods_label(r)} | {run_seed(r)} | "
            f"{r.get('hyperparameters', {}).get('sequence_length', '?')} | {r['parameters'] / 1e6:.2f}M | "
            f"{cpu_kind(r)} | {r.get('precision', 'fp32')} | {r['threads_per_process']} | "
            f"{'?' if cpu_minutes is None else f'{cpu_minutes:.1f}'} | {r.get('train_steps', 0):,} | {selected} | "
            f"{measured(r, 'validation_perplexity', '.1f')} | {measured(r, 'test_perplexity', '.1f')} |"
        )
    return "\n".join(lines)


def measured(r, key, form):
    """A recorded figure, or "not measured" where the run did not evaluate that split (no `--do_predict`: no test)."""
    return "not measured" if r.get(key) is None else format(r[key], form)


def training_speed(r, cpu_minutes):
    """Training tokens per CPU-second over the whole run (resumes included): unlike tokens per wall second, the same
    whether or not other work shared the core or the run was paused. Runs without a CPU-minute record: 'N wall'
    (this process's tokens per wall second)."""
    if cpu_minutes:
        return f"{r.get('train_tokens', 0) / (cpu_minutes * 60):,.0f}"
    return f"{r.get('train_tokens_per_wall_second') or float('nan'):,.0f} wall"


def output_layer(r):
    """'full', 'adaptive' (adaptive softmax) or 'adaptive in+out' (and adaptive input)."""
    if not r.get("adaptive_softmax_cutoffs"):
        return "full" + (", adaptive input" if r.get("adaptive_input_cutoffs") else "")
    return "adaptive in+out" if r.get("adaptive_input_cutoffs") else "adaptive"


def selected_step(r):
    """The step whose weights the run ended with (its best periodic validation), or 'last' for runs before that."""
    return f"{r['selected_step']:,}" if r.get("selected_step") is not None else "last"


def evaluation_minutes(r):
    """CPU-minutes of the final evaluation of the splits the run scored (validation, and test where it ran); runs that
    recorded only wall time: 'N wall'."""
    splits = [split for split in ("validation", "test") if r.get(f"{split}_perplexity") is not None]
    if all(f"{split}_cpu_seconds" in r for split in splits):
        return f"{sum(r[f'{split}_cpu_seconds'] for split in splits) / 60:.1f}"
    return f"{sum(r.get(f'{split}_wall_seconds', 0.0) for split in splits) / 60:.1f} wall"


def unigram_reference(folder):
    """Perplexity of the training split's word frequencies on the validation and test streams (the protocol's tokens:
    an <eos> after every line)."""
    from collections import Counter

    def words(name):
        return [w for line in (Path(folder) / name).read_text(encoding="utf-8").split("\n")[:-1]
                for w in line.split() + ["<eos>"]]

    counts = Counter(words("wiki.train.tokens"))
    total = sum(counts.values())
    top = counts.most_common(1)[0][0]
    out = {}
    for split, name in (("validation", "wiki.valid.tokens"), ("test", "wiki.test.tokens")):
        tokens = words(name)
        nll = -sum(math.log(counts[w] / total) for w in tokens)
        out[split] = math.exp(nll / len(tokens))
        out[f"{split}_accuracy"] = sum(w == top for w in tokens) / len(tokens)
    return out


def curve_label_and_style(r):
    """Legend label and line style of a run's curve: colour is the family, the style the attention, and the literal
    one-target head, which shares family and attention with a many-target run, gets a style and a label of its own."""
    attention = attention_label(r)
    literal = design(r) == "one target / window"
    label = f"{r['family']}, {attention}" + (", one target / window" if literal else "")
    if r.get("resumed_from_step") and whole_run_seconds(r) is None:
        label += f" (from step {r['resumed_from_step']}: time after resuming)"
    styles = {"softmax": "-", "linear elu": "--", "linear exp": ":"}
    return label, "-." if literal else styles.get(ATTENTION.get((r["attention"], r["feature_map"])), "-")


def curve_colors(runs):
    """A colour per run, one per (family, decay): the line style tells the attention, so runs that differ only in
    their decay would otherwise draw alike (without decayed runs: a colour per family)."""
    groups = [(r["family"], r.get("linear_attention_decay", "none")) for r in runs]
    colors = {group: f"C{i % 10}" for i, group in enumerate(dict.fromkeys(groups))}
    return [colors[group] for group in groups]


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(r, color) for r, color in zip(runs, curve_colors(runs)) if r.get("validation_curve")]
    if not drawn:  # runs without a periodic evaluation: an empty picture would say nothing
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for r, color in drawn:
        curve = r["validation_curve"]
        label, style = curve_label_and_style(r)
        ax.plot(
            [p["seconds"] * cpu_minutes_per_clock_second(r) for p in curve],
            [math.exp(p["eval_loss"]) for p in curve],
            style,
            color=color,
            label=label,
            marker="o" if len(curve) == 1 else None,  # a line through one point draws nothing
        )
    ax.set_yscale("log")
    ax.set_xlabel("training CPU-minutes (process CPU time, or wall minutes x threads)")
    ax.set_ylabel("validation perplexity (first 4,096 targets, during training)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--copy_to", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--unigram", default=None, help="folder of wiki.{train,valid,test}.tokens: adds a reference row")
    p.add_argument("--methods", action="store_true",
                   help="the training-methods table (scripts/wikitext2_methods.sh): methods and seed of each run")
    p.add_argument("--refresh_cards", action="store_true",
                   help="write each run's model card again with the current templates (folders with config.json)")
    args, unknown = p.parse_known_args()
    if unknown:  # named with the nearest flag (the toolkit, and with it torch, loads on this path only)
        from hf_settransformer.toolkit.cli import unknown_flags_message

        p.error(unknown_flags_message(p, unknown))
    check_folders(args.folders)
    runs = load(args.folders)
    if not runs:
        raise SystemExit(f"No all_results.json with evaluation results under {args.folders}.")
    if args.refresh_cards:
        from hf_settransformer.toolkit import refresh_model_card  # torch and transformers: only for this

        for r in runs:
            if (r["path"].parent / "config.json").is_file():
                print(f"refreshed {refresh_model_card(r['path'].parent)}")
            else:
                print(f"not refreshed {r['path'].parent}: no saved model (config.json) there")
    print(methods_table(runs) if args.methods else table(runs, unigram_reference(args.unigram) if args.unigram else None))
    if args.copy_to:
        keep(runs, args.copy_to)
    if args.plot:
        if plot(runs, args.plot):
            print(f"wrote {args.plot}")
        else:
            print(f"no plot written to {args.plot}: no run recorded a validation curve (the periodic evaluation "
                  "during training, every --eval_steps)", file=sys.stderr)


if __name__ == "__main__":
    main()

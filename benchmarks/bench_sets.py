"""How the Set Transformer scales with the set size: SAB vs ISAB (m inducing points) vs ISAB with linear attention.

For each set size, one forward+backward pass of a `SetTransformerForSequenceClassification` (same width, depth and
heads for every contender) is timed; contenders alternate, the first `--warmup` repetitions are dropped and medians
reported, all in one run. Memory is what the pass keeps for the backward (the bytes of every distinct tensor storage
autograd saves, counted with `torch.autograd.graph.saved_tensors_hooks`), the part that grows with the set; on CUDA
also the peak allocated during the pass. SAB is skipped above `--sab_max` elements (its n x n attention).
`--contenders` runs some of them; the SAB / ISAB ratio without one of the two says so.

`--variable`: a batch of sets of very different sizes (`--variable_batch` sets, sizes drawn from a log-normal between
`--min_size` and `--max_size`, the largest set `--max_size`), one training step (forward+backward) of the Set
Transformer (ISAB) and Perceiver IO classifiers, softmax and linear attention, on the batch padded to its largest set
(`DataCollatorForSets()`) and packed into one row (`DataCollatorForSets(packed=True)`): medians after warm-up, memory
as above, and the packed / padded ratios, in one table.

    python benchmarks/bench_sets.py                      # sizes 256 ... 16384
    python benchmarks/bench_sets.py --tiny               # seconds
    python benchmarks/bench_sets.py --tiny --contenders SAB   # one of them (the tests run this)
    python benchmarks/bench_sets.py --variable           # 32 sets of 50 to 4,000 points: packed vs padded (minutes)
    python benchmarks/bench_sets.py --variable --threads 1   # the same, where other work shares the CPU cores
    python benchmarks/bench_sets.py --variable --tiny    # seconds

Writes `<output_dir>/bench_sets.json` and `.png` (`--variable`: `bench_sets_variable.json`).
"""

import argparse
import statistics
import time

import torch
from bench_common import (
    add_contenders_flag,
    chosen_contenders,
    describe_machine,
    log_axes,
    not_run,
    pyplot,
    save_figure,
    setup_device,
    sync,
    write_json,
)

from hf_settransformer import (
    PerceiverIOConfig,
    PerceiverIOForSequenceClassification,
    SetTransformerConfig,
    SetTransformerForSequenceClassification,
)
from hf_settransformer.toolkit import DataCollatorForSets

CONTENDERS = {  # name -> config fields
    "SAB": {"num_inducing_points": 0, "attention_type": "softmax"},
    "ISAB": {"attention_type": "softmax"},
    "ISAB linear": {"attention_type": "linear", "feature_map": "elu"},
}

VARIABLE_CONTENDERS = {  # name -> (model class, config class, config fields) of the --variable table
    "Set Transformer ISAB softmax": (SetTransformerForSequenceClassification, SetTransformerConfig,
                                     {"attention_type": "softmax"}),
    "Set Transformer ISAB linear": (SetTransformerForSequenceClassification, SetTransformerConfig,
                                    {"attention_type": "linear", "feature_map": "elu"}),
    "Perceiver IO softmax": (PerceiverIOForSequenceClassification, PerceiverIOConfig, {"attention_type": "softmax"}),
    "Perceiver IO linear": (PerceiverIOForSequenceClassification, PerceiverIOConfig,
                            {"attention_type": "linear", "feature_map": "elu"}),
}
PERCEIVER_FIELDS = {"num_latents": 64, "num_self_attends_per_block": 2, "position_embedding_type": "none"}  # a set


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--input_size", type=int, default=3)
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument(
        "--intermediate_size",
        type=int,
        default=None,
        help="feed-forward width; default the hidden size, as in the set models train_sets.py builds (the paper's rFF)",
    )
    p.add_argument("--num_hidden_layers", type=int, default=2)
    p.add_argument("--num_attention_heads", type=int, default=4)
    p.add_argument("--num_inducing_points", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--sab_max", type=int, default=8192, help="largest set SAB is run on")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice; 1 where other work shares the cores)")
    p.add_argument("--output_dir", default="results")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--variable", action="store_true",
                   help="packed vs padded training steps on a batch of sets of very different sizes")
    p.add_argument("--variable_batch", type=int, default=32, help="--variable: sets per batch")
    p.add_argument("--min_size", type=int, default=50, help="--variable: the smallest set size drawn")
    p.add_argument("--max_size", type=int, default=4000, help="--variable: the largest set (one set has this size)")
    p.add_argument("--median_size", type=int, default=150, help="--variable: the log-normal's median")
    p.add_argument("--sigma", type=float, default=1.0, help="--variable: the log-normal's sigma (of the log size)")
    add_contenders_flag(p, list(CONTENDERS) + list(VARIABLE_CONTENDERS))
    args = p.parse_args(argv)
    names = list(VARIABLE_CONTENDERS if args.variable else CONTENDERS)
    args.contenders = chosen_contenders(p, args, names)
    if args.tiny:
        args.sizes, args.hidden_size, args.batch_size, args.repeats, args.warmup = [32, 128], 32, 2, 2, 1
        args.sab_max = 128
        args.variable_batch, args.min_size, args.max_size, args.median_size = 6, 2, 96, 12
    args.intermediate_size = args.intermediate_size or args.hidden_size
    return args


def build(args, fields):
    config = SetTransformerConfig(
        **{
            "input_size": args.input_size,
            "hidden_size": args.hidden_size,
            "intermediate_size": args.intermediate_size,
            "num_hidden_layers": args.num_hidden_layers,
            "num_attention_heads": args.num_attention_heads,
            "num_inducing_points": args.num_inducing_points,
            "num_labels": 10,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            **fields,
        }
    )
    torch.manual_seed(0)
    return SetTransformerForSequenceClassification(config).to(args.device).train()


def one_pass(model, x, labels, device):
    """Forward + backward; returns (seconds, bytes saved for backward, CUDA peak bytes or None)."""
    return one_step(model, {"input_features": x, "labels": labels}, device)


def one_step(model, batch, device):
    """Forward + backward of `model(**batch)`; returns (seconds, bytes saved for backward, CUDA peak bytes or None)."""
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    model.zero_grad(set_to_none=True)
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    sync(device)
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    return seconds, sum(saved.values()), peak


def size_row(size, names, samples, memory):
    """The record of one set size: each contender's median ms (`samples`: seconds) and memory (MiB), None for one
    skipped at this size (no samples)."""
    row = {"size": size}
    for name in names:
        row[name] = {"ms": 1e3 * statistics.median(samples[name]), **memory[name]} if name in samples else None
    return row


def table_header(names):
    columns = ["set size", *(f"{name} ms" for name in names), "SAB / ISAB", *(f"{name} MiB" for name in names)]
    return "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)


def table_line(row, names):
    """The table's row of one set size: "skipped" for a contender past its size limit, the SAB / ISAB ratio ("-"
    where SAB was skipped, "<name> not run" where `--contenders` left one out)."""

    def cell(name, key):
        return "skipped" if row[name] is None else f"{row[name][key]:.1f}"

    missing = next((name for name in ("SAB", "ISAB") if name not in names), None)
    if missing is not None:
        ratio = not_run(missing)
    else:
        ratio = f"{row['SAB']['ms'] / row['ISAB']['ms']:.1f}x" if row["SAB"] else "-"
    cells = [row["size"], *(cell(name, "ms") for name in names), ratio, *(cell(name, "saved_mib") for name in names)]
    return "| " + " | ".join(map(str, cells)) + " |"


def variable_sizes(args):
    """`--variable_batch` set sizes: a log-normal (median `--median_size`, `--sigma`) clipped to [`--min_size`,
    `--max_size`], the first set `--max_size` (the padded batch's width), in a fixed order."""
    g = torch.Generator().manual_seed(0)
    drawn = torch.exp(torch.randn(args.variable_batch, generator=g) * args.sigma) * args.median_size
    sizes = drawn.round().long().clamp(args.min_size, args.max_size).tolist()
    sizes[0] = args.max_size
    return sizes


def build_variable(args, name):
    cls, config_class, fields = VARIABLE_CONTENDERS[name]
    extra = PERCEIVER_FIELDS if config_class is PerceiverIOConfig else {"num_inducing_points": args.num_inducing_points,
                                                                         "num_hidden_layers": args.num_hidden_layers}
    config = config_class(
        vocab_size=None, input_size=args.input_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_attention_heads=args.num_attention_heads, num_labels=10,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra, **fields,
    )
    torch.manual_seed(0)
    return cls(config).to(args.device).train()


def variable_batches(args, sizes):
    """(padded batch, packed batch) of the same sets and labels, on the device."""
    g = torch.Generator().manual_seed(1)
    examples = [{"input_features": torch.randn(n, args.input_size, generator=g),
                 "labels": int(torch.randint(0, 10, (), generator=g))} for n in sizes]
    batches = (DataCollatorForSets()(examples), DataCollatorForSets(packed=True)(examples))
    return [{k: v.to(args.device) if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]


def variable_header():
    columns = ["model", "padded ms", "packed ms", "speed-up", "padded MiB", "packed MiB", "packed / padded memory",
               "CUDA peak padded / packed MiB"]
    return "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)


def variable_line(name, row):
    """The table's row of one model: `row` {"padded", "packed"} -> {"ms", "saved_mib", "cuda_peak_mib"}."""
    padded, packed = row["padded"], row["packed"]
    peak = "-" if padded["cuda_peak_mib"] is None else f"{padded['cuda_peak_mib']:.0f} / {packed['cuda_peak_mib']:.0f}"
    cells = [name, f"{padded['ms']:.1f}", f"{packed['ms']:.1f}", f"{padded['ms'] / packed['ms']:.1f}x",
             f"{padded['saved_mib']:.1f}", f"{packed['saved_mib']:.1f}",
             f"{packed['saved_mib'] / padded['saved_mib']:.2f}x", peak]
    return "| " + " | ".join(cells) + " |"


def main_variable(args):
    sizes = variable_sizes(args)
    mean = sum(sizes) / len(sizes)
    setup = (
        f"{describe_machine(args.device)} | {len(sizes)} sets of {min(sizes)} to {max(sizes)} points (log-normal, "
        f"mean {mean:.0f}, max / mean {max(sizes) / mean:.1f}): {sum(sizes)} real elements packed, "
        f"{len(sizes) * max(sizes)} padded | hidden {args.hidden_size}, feed-forward {args.intermediate_size}, "
        f"{args.num_attention_heads} heads, Set Transformer {args.num_hidden_layers} ISAB layers m="
        f"{args.num_inducing_points}, Perceiver IO {PERCEIVER_FIELDS['num_latents']} latents, fp32, one training step "
        "(forward+backward)"
    )
    print(setup)
    print(variable_header())
    padded_batch, packed_batch = variable_batches(args, sizes)
    rows = {}
    for name in args.contenders:
        model = build_variable(args, name)
        forms = {"padded": padded_batch, "packed": packed_batch}
        samples, memory = {form: [] for form in forms}, {}
        for r in range(args.warmup + args.repeats):
            for form, batch in forms.items():  # alternate the two forms
                seconds, saved, peak = one_step(model, batch, args.device)
                if r >= args.warmup:
                    samples[form].append(seconds)
                memory[form] = {"saved_mib": saved / 2**20, "cuda_peak_mib": None if peak is None else peak / 2**20}
        rows[name] = {form: {"ms": 1e3 * statistics.median(samples[form]), **memory[form]} for form in forms}
        print(variable_line(name, rows[name]), flush=True)
    path = write_json(args, "bench_sets_variable", {"setup": setup, "sizes": sizes, "rows": rows})
    print(f"wrote {path}")


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    if args.variable:
        return main_variable(args)
    models = {name: build(args, CONTENDERS[name]) for name in args.contenders}
    machine = describe_machine(args.device)
    setup = (
        f"{machine} | batch {args.batch_size}, hidden {args.hidden_size}, feed-forward "
        f"{args.intermediate_size}, {args.num_hidden_layers} encoder "
        f"layers, {args.num_attention_heads} heads, m={args.num_inducing_points}, fp32, forward+backward"
    )
    print(setup)
    print(table_header(list(models)))
    rows = []
    for size in args.sizes:
        g = torch.Generator().manual_seed(size)
        x = torch.randn(args.batch_size, size, args.input_size, generator=g).to(args.device)
        labels = torch.randint(0, 10, (args.batch_size,), generator=g).to(args.device)
        active = [n for n in models if not (n == "SAB" and size > args.sab_max)]
        samples = {n: [] for n in active}
        memory = {}
        for r in range(args.warmup + args.repeats):
            for name in active:  # alternate the contenders
                seconds, saved, peak = one_pass(models[name], x, labels, args.device)
                if r >= args.warmup:
                    samples[name].append(seconds)
                memory[name] = {"saved_mib": saved / 2**20, "cuda_peak_mib": None if peak is None else peak / 2**20}
        rows.append(size_row(size, list(models), samples, memory))
        print(table_line(rows[-1], list(models)), flush=True)
    path = write_json(args, "bench_sets", {"setup": setup, "rows": rows})
    plt = pyplot()
    if plt is None:
        print(f"wrote {path}")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = dict(zip(CONTENDERS, ("o-", "s-", "^--")))
    for name in models:
        style = styles[name]
        pts = [(r["size"], r[name]) for r in rows if r[name]]
        ax1.plot([p[0] for p in pts], [p[1]["ms"] for p in pts], style, label=name)
        ax2.plot([p[0] for p in pts], [p[1]["saved_mib"] for p in pts], style, label=name)
    log_axes(ax1, "set size (elements)", "ms per forward+backward (median)")
    log_axes(ax2, "set size (elements)", "MiB saved for backward")
    print(f"wrote {path} and {save_figure(fig, args, 'bench_sets', setup)}")


if __name__ == "__main__":
    main()

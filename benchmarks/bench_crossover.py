"""From which sequence length linear attention beats softmax on this machine: forward, training step, generation.

Two `TransformerDecoderForCausalLM`s identical but for `attention_type` (softmax through SDPA with a causal mask;
linear elu, chunked causal kernel) are measured at growing lengths, alternated, medians after warm-up (`tasks`: a
no-grad forward, a training step, one cached decoding step after a context of n tokens). Everything but the attention
is the same, so the crossover is where linear attention's cost, linear in n, falls below softmax's, quadratic in n:
the first measured length from which linear stays faster, interpolated in log-log space (`crossover`). `--contenders`
runs one of the two (no crossover then).

    python benchmarks/bench_crossover.py                 # lengths 128 ... 8192
    python benchmarks/bench_crossover.py --tiny          # seconds
    python benchmarks/bench_crossover.py --tiny --contenders linear   # one of them (the tests run this)

Writes `<output_dir>/bench_crossover.json` and `.png`.
"""

import math

import torch
from bench_common import (
    add_contenders_flag,
    base_parser,
    chosen_contenders,
    describe_machine,
    log_axes,
    markdown_table,
    not_run,
    pyplot,
    save_figure,
    setup_device,
    time_alternating,
    write_json,
)

from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM

MODES = ("forward", "training step", "generation")
CONTENDERS = ("softmax", "linear")  # the two models' attention_type


def parse_args(argv=None):
    p = base_parser(__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--hidden_size", type=int, default=512)
    p.add_argument("--num_hidden_layers", type=int, default=2)
    p.add_argument("--num_attention_heads", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--feature_map", default="elu", choices=["elu", "exp"])
    p.add_argument("--prefill_chunk", type=int, default=2048)
    add_contenders_flag(p, CONTENDERS)
    p.set_defaults(repeats=5, warmup=2)
    args = p.parse_args(argv)
    args.contenders = chosen_contenders(p, args, CONTENDERS)
    if args.tiny:
        args.lengths, args.hidden_size, args.num_hidden_layers, args.num_attention_heads = [16, 32, 64], 32, 1, 4
        args.vocab_size, args.repeats, args.warmup, args.prefill_chunk = 50, 2, 1, 32
    return args


def build(args, attention_type):
    config = TransformerDecoderConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=4 * args.hidden_size,
        attention_type=attention_type,
        feature_map=args.feature_map,
        max_position_embeddings=max(args.lengths) + 2 * (args.warmup + args.repeats) + 8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return TransformerDecoderForCausalLM(config).to(args.device)


def tasks(model, ids, args):
    """The three timed callables of one model at one length."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    @torch.no_grad()
    def forward():
        model.eval()
        model(input_ids=ids)

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    with torch.no_grad():
        model.eval()
        cache = None
        for start in range(0, ids.shape[1], args.prefill_chunk):
            out = model(input_ids=ids[:, start : start + args.prefill_chunk], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    state = {"cache": cache, "token": out.logits[:, -1:].argmax(-1)}

    @torch.no_grad()
    def generate_step():
        model.eval()
        out = model(input_ids=state["token"], past_key_values=state["cache"], use_cache=True)
        state["cache"], state["token"] = out.past_key_values, out.logits[:, -1:].argmax(-1)

    return {"forward": forward, "training step": train_step, "generation": generate_step}


def crossover(lengths, softmax_ms, linear_ms):
    """(first measured length from which linear stays faster, interpolated length where the ratio crosses 1)."""
    faster = [lin < soft for soft, lin in zip(softmax_ms, linear_ms)]
    if not faster[-1]:
        return None, None
    i = len(faster) - 1
    while i > 0 and faster[i - 1]:
        i -= 1
    if i == 0:
        return lengths[0], None  # faster everywhere measured: the crossover is below the shortest length
    r0 = math.log(softmax_ms[i - 1] / linear_ms[i - 1])  # <= 0
    r1 = math.log(softmax_ms[i] / linear_ms[i])  # > 0
    x0, x1 = math.log(lengths[i - 1]), math.log(lengths[i])
    return lengths[i], math.exp(x0 + (x1 - x0) * (-r0) / (r1 - r0))


def table(rows, names):
    """The table's header and cells: per mode, a time column per contender and the softmax / linear ratio."""
    header = ["n"]
    for mode in MODES:
        header += [f"{mode} {name} ms" for name in names] + ["softmax / linear"]
    missing = next((name for name in CONTENDERS if name not in names), None)
    cells = [
        [r["length"]]
        + [
            cell
            for mode in MODES
            for cell in (
                *(f"{r[mode][name]:.2f}" for name in names),
                f"{r[mode]['softmax'] / r[mode]['linear']:.2f}x" if missing is None else not_run(missing),
            )
        ]
        for r in rows
    ]
    return header, cells


def summarize(lengths, rows, names):
    """mode -> the crossover (`crossover`), and the lines that print it; without one of the two contenders, none:
    "not_run" names it."""
    missing = next((name for name in CONTENDERS if name not in names), None)
    summary, lines = {}, []
    for mode in MODES:
        if missing is not None:
            summary[mode] = {"first_faster_length": None, "interpolated_crossover": None, "not_run": missing}
            lines.append(f"{mode}: no crossover ({not_run(missing)})")
            continue
        first, estimate = crossover(lengths, [r[mode]["softmax"] for r in rows], [r[mode]["linear"] for r in rows])
        summary[mode] = {"first_faster_length": first, "interpolated_crossover": estimate}
        if first is None:
            lines.append(f"{mode}: linear is not faster at the longest length measured ({lengths[-1]})")
        elif estimate is None:
            lines.append(f"{mode}: linear faster at every length measured (from {first})")
        else:
            lines.append(f"{mode}: linear faster from n = {first} on (ratio crosses 1 near n = {estimate:.0f})")
    return summary, lines


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    models = {name: build(args, name) for name in args.contenders}
    params = sum(p.numel() for p in next(iter(models.values())).parameters())  # the same for both
    setup = (
        f"{describe_machine(args.device)} | decoder: hidden {args.hidden_size}, {args.num_hidden_layers} layers, "
        f"{args.num_attention_heads} heads, vocab {args.vocab_size}, {params / 1e6:.1f}M params, batch "
        f"{args.batch_size}, fp32, linear = {args.feature_map}"
    )
    print(setup)
    rows = []
    for n in args.lengths:
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(0, args.vocab_size, (args.batch_size, n), generator=g).to(args.device)
        per_model = {name: tasks(model, ids, args) for name, model in models.items()}
        row = {"length": n}
        for mode in MODES:
            timing = time_alternating(
                {name: per_model[name][mode] for name in models}, args.device, args.repeats, args.warmup
            )
            row[mode] = {name: 1e3 * timing[name]["median_s"] for name in models}
        rows.append(row)
        print(f"measured n={n}", flush=True)

    print()
    markdown_table(*table(rows, list(models)))
    summary, lines = summarize(args.lengths, rows, list(models))
    for line in lines:
        print(line)
    path = write_json(args, "bench_crossover", {"setup": setup, "rows": rows, "crossover": summary})
    plt = pyplot()
    if plt is None:
        print(f"wrote {path}")
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, mode in zip(axes, MODES):
        for name, style in (("softmax", "o-"), ("linear", "s--")):
            if name not in models:
                continue
            ax.plot(args.lengths, [r[mode][name] for r in rows], style, label=name)
        ax.set_title(mode)
        log_axes(ax, "sequence length (tokens)" if mode != "generation" else "context length (tokens)", "ms (median)")
    print(f"wrote {path} and {save_figure(fig, args, 'bench_crossover', setup)}")


if __name__ == "__main__":
    main()

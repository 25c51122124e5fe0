"""Perceiver IO training throughput: hf_settransformer's `PerceiverIOModel` (softmax and linear attention) vs
transformers' `PerceiverModel` vs perceiver-pytorch's `PerceiverIO`, same sizes, measured in one run.

Every contender has the same latents (number and width), input width, latent self-attention depth and heads,
cross-attention heads, feed-forward width, input length and learned output queries; dropout is 0, weights fp32; how
each is matched and where they still differ: `build_hfst`, `build_transformers`, `build_perceiver_pytorch`. A step is
a forward and a backward of `mean(decoder_output ** 2)`; contenders alternate, the first `--warmup` steps are dropped
and medians reported: examples/s, the ratio to transformers', the peak memory of one step (untimed) and the parameters
(`records`). `--contenders` runs some of them; without transformers' model the ratios to it say so.

    python benchmarks/bench_perceiver.py                                 # default sizes: ~1.5 min on one free core
    python benchmarks/bench_perceiver.py --lengths 512 1024 4096 8192    # plus a sweep over input lengths
    python benchmarks/bench_perceiver.py --tiny                          # seconds
    python benchmarks/bench_perceiver.py --tiny --contenders "hfst PerceiverIOModel (softmax)"   # the tests run this

Writes `<output_dir>/bench_perceiver.json` and `.png`.
"""

import statistics
import textwrap

import torch
from bench_common import (
    add_contenders_flag,
    base_parser,
    chosen_contenders,
    describe_machine,
    markdown_table,
    not_run,
    optional_peer,
    peak_memory_bytes,
    pyplot,
    save_figure,
    setup_device,
    time_alternating,
    write_json,
)
from torch import nn

from hf_settransformer import PerceiverIOConfig, PerceiverIOModel

NAME = "bench_perceiver"
BASELINE = "transformers PerceiverModel"
OURS = "hfst PerceiverIOModel (softmax)"
CONTENDERS = (OURS, "hfst PerceiverIOModel (linear elu)", BASELINE, "perceiver-pytorch PerceiverIO")
TARGET = 1.5


def parse_args(argv=None):
    p = base_parser(__doc__)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--input_length", type=int, default=2048, help="input elements per example")
    p.add_argument("--input_size", type=int, default=512, help="input width (transformers' d_model)")
    p.add_argument("--num_latents", type=int, default=256)
    p.add_argument("--d_latents", type=int, default=512, help="latent width (our hidden_size)")
    p.add_argument("--num_blocks", type=int, default=1, help="times the self-attention block is applied (shared)")
    p.add_argument("--num_self_attends_per_block", type=int, default=6)
    p.add_argument("--num_self_attention_heads", type=int, default=8)
    p.add_argument("--num_cross_attention_heads", type=int, default=1)
    p.add_argument("--widening_factor", type=int, default=4, help="feed-forward width / latent width")
    p.add_argument("--num_output_queries", type=int, default=16, help="learned decoder queries")
    p.add_argument("--hidden_act", default="gelu")
    p.add_argument("--lengths", type=int, nargs="*", default=[], help="input lengths of an optional second table")
    add_contenders_flag(p, CONTENDERS)
    args = p.parse_args(argv)
    args.contenders = chosen_contenders(p, args, CONTENDERS)
    if args.tiny:
        args.batch_size, args.input_length, args.input_size, args.num_latents, args.d_latents = 2, 64, 32, 8, 32
        args.num_self_attends_per_block, args.num_self_attention_heads, args.num_output_queries = 2, 4, 4
        args.repeats, args.warmup, args.lengths = 2, 1, [32, 128]
    return args


def build_hfst(args, attention_type):
    """Ours. With the input width equal to the latent width the inputs go in as `inputs_embeds`, so the encoder
    cross-attention projects its keys and values straight from them, as transformers' model does (the same FLOPs);
    otherwise as `input_features`, first projected to the latent width (`feature_projection`), which transformers'
    model does not do. Every block is pre-norm ScaleNorm (one scalar per norm), self-attention has a fused q/k/v
    projection and cross-attention a fused k/v one, softmax attention runs through SDPA; the latents get a ScaleNorm
    after the stack and the decoded queries a final ScaleNorm."""
    embeds = args.input_size == args.d_latents  # inputs at the latent width: no input projection
    config = PerceiverIOConfig(
        vocab_size=None,
        input_size=None if embeds else args.input_size,
        hidden_size=args.d_latents,
        num_attention_heads=args.num_self_attention_heads,
        intermediate_size=args.widening_factor * args.d_latents,
        hidden_act=args.hidden_act,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        position_embedding_type="none",
        attention_type=attention_type,
        feature_map="elu",
        num_latents=args.num_latents,
        num_blocks=args.num_blocks,
        num_self_attends_per_block=args.num_self_attends_per_block,
        num_cross_attention_heads=args.num_cross_attention_heads,
        output_query_type="learned",
        num_output_queries=args.num_output_queries,
    )
    model = PerceiverIOModel(config)
    if embeds:
        return model, lambda x: model(inputs_embeds=x).last_hidden_state  # (b, queries, d_latents)
    return model, lambda x: model(input_features=x).last_hidden_state


def build_transformers(args):
    """transformers' `PerceiverModel`, no input preprocessor, a `PerceiverBasicDecoder` with trainable output queries:
    the encoder cross-attention projects keys and values straight from the raw inputs (width `d_model`, no input
    projection), `qk_channels = v_channels = d_latents` as ours; LayerNorm everywhere, separate q/k/v projections,
    eager attention. Its decoder's `final_project` is turned off (ours has none); it has no norm after the latent stack
    and none on the decoded queries. Widening factors are `intermediate_size / d_latents`: the same feed-forwards."""
    from transformers import PerceiverConfig, PerceiverModel
    from transformers.models.perceiver.modeling_perceiver import PerceiverBasicDecoder

    d = args.d_latents
    config = PerceiverConfig(
        num_latents=args.num_latents,
        d_latents=d,
        d_model=args.input_size,
        num_blocks=args.num_blocks,
        num_self_attends_per_block=args.num_self_attends_per_block,
        num_self_attention_heads=args.num_self_attention_heads,
        num_cross_attention_heads=args.num_cross_attention_heads,
        qk_channels=d,
        v_channels=d,
        self_attention_widening_factor=args.widening_factor,
        cross_attention_widening_factor=args.widening_factor,
        hidden_act=args.hidden_act,
        attention_probs_dropout_prob=0.0,
    )
    decoder = PerceiverBasicDecoder(
        config,
        output_num_channels=d,
        position_encoding_type="trainable",
        output_index_dims=args.num_output_queries,
        num_channels=d,
        qk_channels=d,
        v_channels=d,
        num_heads=args.num_cross_attention_heads,
        widening_factor=args.widening_factor,
        use_query_residual=True,
        final_project=False,
        trainable_position_encoding_kwargs={"num_channels": d, "index_dims": args.num_output_queries},
    )
    model = PerceiverModel(config, decoder=decoder)
    return model, lambda x: model(inputs=x).logits  # (b, queries, d_latents)


class PerceiverPytorchWithQueries(nn.Module):
    """perceiver-pytorch's `PerceiverIO` takes its decoder queries as an argument: hold them as a parameter."""

    def __init__(self, perceiver_io, args):
        super().__init__()
        self.perceiver_io = perceiver_io
        self.queries = nn.Parameter(0.02 * torch.randn(args.num_output_queries, args.d_latents))

    def forward(self, x):
        return self.perceiver_io(x, queries=self.queries)  # (b, queries, d_latents)


def build_perceiver_pytorch(args, module):
    """perceiver-pytorch's `PerceiverIO`: `depth = num_blocks * num_self_attends_per_block` untied layers (its weight
    tying shares one layer, not a block), no biases on q/k/v, a GEGLU feed-forward of fixed multiplier 4 (1.5x the
    feed-forward parameters and FLOPs of the others); its decoder cross-attention has no residual, `decoder_ff=True`
    adds the feed-forward; the learned queries are a parameter of `PerceiverPytorchWithQueries`."""
    d = args.d_latents
    perceiver_io = module.PerceiverIO(
        depth=args.num_blocks * args.num_self_attends_per_block,
        dim=args.input_size,
        queries_dim=d,
        logits_dim=None,
        num_latents=args.num_latents,
        latent_dim=d,
        cross_heads=args.num_cross_attention_heads,
        latent_heads=args.num_self_attention_heads,
        cross_dim_head=d // args.num_cross_attention_heads,
        latent_dim_head=d // args.num_self_attention_heads,
        weight_tie_layers=False,
        decoder_ff=True,
    )
    model = PerceiverPytorchWithQueries(perceiver_io, args)
    return model, model


def build_all(args):
    """name -> (model, forward(x) -> decoder output) or a reason string when the contender is skipped, for each
    contender `--contenders` chose."""
    built = {}
    for name in args.contenders:
        torch.manual_seed(0)
        if name == OURS:
            built[name] = build_hfst(args, "softmax")
        elif name.startswith("hfst"):
            built[name] = build_hfst(args, "linear")
        elif name == BASELINE:
            built[name] = build_transformers(args)
        else:
            module = optional_peer("perceiver_pytorch")
            built[name] = "skipped (not installed)" if module is None else build_perceiver_pytorch(args, module)
    for entry in built.values():
        if not isinstance(entry, str):
            entry[0].to(args.device).train()
    return built


def make_step(model, forward, x):
    """One training step without the optimiser: forward, loss = mean of squares of the decoder output, backward."""

    def step():
        model.zero_grad(set_to_none=True)
        forward(x).pow(2).mean().backward()

    return step


def inputs(args, length):
    g = torch.Generator().manual_seed(length)
    return torch.randn(args.batch_size, length, args.input_size, generator=g).to(args.device)


def measure(args, built, length, with_memory):
    x = inputs(args, length)
    steps = {name: make_step(*entry, x) for name, entry in built.items() if not isinstance(entry, str)}
    timings = time_alternating(steps, args.device, args.repeats, args.warmup)
    peaks = {name: peak_memory_bytes(step, args.device) for name, step in steps.items()} if with_memory else None
    return records(built, timings, peaks, args.batch_size)


def records(built, timings, peaks, batch_size):
    """name -> the record of each contender of `build_all`: its median step, examples/s, peak MiB (`peaks`: bytes, or
    None for none), its examples/s over transformers' ("vs_transformers", where that ran); or why it was skipped."""
    results = {}
    for name, entry in built.items():
        if isinstance(entry, str):
            results[name] = {"skipped": entry}
            continue
        t = timings[name]
        results[name] = {
            "median_s": t["median_s"],
            "samples_s": t["samples_s"],
            "examples_per_s": batch_size / t["median_s"],
        }
        if peaks is not None:
            results[name]["peak_mib"] = peaks[name] / 2**20
    base = results.get(BASELINE, {}).get("examples_per_s")
    for r in results.values():
        if "examples_per_s" in r and base:
            r["vs_transformers"] = r["examples_per_s"] / base
    return results


def ratio_cell(results, name):
    """`name`'s examples/s over transformers' in a table: "transformers not run" (or "<name> not run") where
    `--contenders` left either out."""
    if BASELINE not in results:
        return not_run("transformers")
    if name not in results:
        return not_run(name)
    return f"{results[name]['vs_transformers']:.2f}x" if "vs_transformers" in results[name] else "-"


def table_rows(results):
    """The cells of the first table: a row per contender, a skipped one saying why."""
    rows = []
    for name, r in results.items():
        if "skipped" in r:
            rows.append([name, r["skipped"], "-", "-", "-", "-"])
        else:
            rows.append(
                [
                    name,
                    f"{r['parameters'] / 1e6:.2f}M",
                    f"{1e3 * r['median_s']:.0f}",
                    f"{r['examples_per_s']:.2f}",
                    ratio_cell(results, name),
                    f"{r['peak_mib']:.1f}",
                ]
            )
    return rows


def summarize(results, sweep):
    """Our softmax model over transformers' (None where either did not run; the median over the sweep's lengths too)
    and the line that prints it."""
    ratio = results.get(OURS, {}).get("vs_transformers")
    over_lengths = [r[OURS]["vs_transformers"] for r in sweep if "vs_transformers" in r.get(OURS, {})]
    summary = {
        "ours_over_transformers": ratio,
        "target": TARGET,
        "median_ratio_over_lengths": statistics.median(over_lengths) if over_lengths else None,
    }
    if ratio is not None:
        return summary, f"{OURS} / {BASELINE} = {ratio:.2f}x (target >= {TARGET}x)"
    missing = [name for name in (OURS, BASELINE) if name not in results]
    return summary, f"{OURS} / {BASELINE}: not measured ({', '.join(map(not_run, missing)) or 'skipped'})"


def plot(args, built, results, sweep, title):
    plt = pyplot()
    if plt is None:
        return None
    names = [n for n in built if "examples_per_s" in results[n]]
    fig, axes = plt.subplots(1, 3 if sweep else 2, figsize=(15 if sweep else 10, 4))
    short = [
        n.replace(" PerceiverIOModel", "").replace(" PerceiverModel", "").replace(" PerceiverIO", "") for n in names
    ]
    colors = [f"C{i}" for i in range(len(names))]
    axes[0].bar(short, [results[n]["examples_per_s"] for n in names], color=colors)
    axes[0].set_ylabel("examples/s, forward+backward (median)")
    axes[1].bar(short, [results[n]["peak_mib"] for n in names], color=colors)
    axes[1].set_ylabel("peak MiB of one step")
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    if sweep:
        for n, color in zip(names, colors):
            axes[2].plot(
                [r["length"] for r in sweep], [r[n]["examples_per_s"] for r in sweep], "o-", color=color, label=n
            )
        axes[2].set_xscale("log", base=2)
        axes[2].set_yscale("log")
        axes[2].set_xlabel("input length")
        axes[2].set_ylabel("examples/s (median)")
        axes[2].grid(True, which="both", alpha=0.3)
        axes[2].legend(fontsize=7)
    return save_figure(fig, args, NAME, textwrap.fill(title, 150))


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    built = build_all(args)
    params = {n: None if isinstance(e, str) else sum(p.numel() for p in e[0].parameters()) for n, e in built.items()}
    attn = next((e[0].config._attn_implementation for n, e in built.items() if n.startswith("hfst")), "-")
    setup = (
        f"{describe_machine(args.device)} | batch {args.batch_size}, input {args.input_length} x {args.input_size}, "
        f"{args.num_latents} latents x {args.d_latents}, {args.num_blocks} x {args.num_self_attends_per_block} "
        f"self-attention layers, {args.num_self_attention_heads} heads, {args.num_cross_attention_heads} "
        f"cross-attention head(s), feed-forward {args.widening_factor}x, {args.num_output_queries} output queries, "
        f"{args.hidden_act}, fp32, forward+backward; hfst attn_implementation={attn}"
    )
    print(setup)
    for name, count in params.items():
        print(f"parameters of {name}: " + ("skipped (not installed)" if count is None else f"{count / 1e6:.2f}M"))
    if params.get(BASELINE) and params.get(OURS):
        print(f"parameters hfst / transformers = {params[OURS] / params[BASELINE]:.3f}")
    print(
        f"timing {sum(p is not None for p in params.values())} contenders, {args.warmup} + {args.repeats} steps "
        f"each, alternating ...",
        flush=True,
    )

    results = measure(args, built, args.input_length, with_memory=True)
    for name in results:
        results[name]["parameters"] = params[name]
    print()
    markdown_table(["contender", "parameters", "ms / step", "examples/s", "vs transformers", "peak MiB"],
                   table_rows(results))

    sweep = []
    if args.lengths:
        print(f"\ninput lengths {args.lengths} (batch {args.batch_size}), examples/s:", flush=True)
        active = [n for n in built if not isinstance(built[n], str)]
        lines = []
        for length in args.lengths:
            res = measure(args, built, length, with_memory=False)
            sweep.append({"length": length, **{n: res[n] for n in active}})
            lines.append([length] + [f"{res[n]['examples_per_s']:.2f}" for n in active] + [ratio_cell(res, OURS)])
        markdown_table(["input length"] + active + ["hfst softmax / transformers"], lines)

    summary, line = summarize(results, sweep)
    print()
    print(line)
    path = write_json(args, NAME, {"setup": setup, "results": results, "sweep": sweep, "summary": summary})
    png = plot(args, built, results, sweep, setup)
    print(f"wrote {path}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()

"""Attention kernels alone: forward+backward time and peak memory as the sequence grows, 8 heads of 64, batch 1, fp32.

Contenders, alternated within each length (medians after warm-up, one run):
- softmax (SDPA): `torch.nn.functional.scaled_dot_product_attention`, non-causal and causal;
- linear elu / linear exp: `hf_settransformer.attention.linear_attention` (Katharopoulos et al. 2020; Shen et al. 2021);
- causal linear (chunked): `hf_settransformer.attention.causal_linear_attention`, elu, chunk `--chunk_size`;
- causal linear (naive cumsum): the textbook form, a cumulative sum of the n outer products phi(k_j) v_j^T
  (an n x d x e tensor), elu; skipped above `--naive_max`;
- fast-transformers causal_dot_product: the CUDA/C++ kernel of fast-transformers (Katharopoulos et al.) with the same
  elu + 1 feature map and normalisation, when `pytorch_fast_transformers` can be imported (skipped otherwise).
Peak memory is the most the allocator held above what was allocated before one forward+backward (CPU: measured by
`torch.profiler` in a separate untimed pass). A second table sweeps the chunk size of the chunked kernel.

    python benchmarks/bench_attention.py                 # lengths 512 ... 16384
    python benchmarks/bench_attention.py --tiny          # seconds (the tests run this)

fast-transformers is not on PyPI as a wheel; to compare with it build it against the installed torch
(on a machine with no CUDA toolkit, or with CUDA_HOME set):
    pip install --no-build-isolation pytorch-fast-transformers

Writes `<output_dir>/bench_attention.json` and `.png`.
"""

import torch
import torch.nn.functional as F
from bench_common import (
    base_parser,
    describe_machine,
    log_axes,
    markdown_table,
    optional_peer,
    peak_memory_bytes,
    pyplot,
    save_figure,
    setup_device,
    time_alternating,
    write_json,
)

from hf_settransformer.linear_ops import causal_linear_attention, linear_attention


def parse_args():
    p = base_parser(__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--chunk_size", type=int, default=None, help="chunk of the chunked kernel (default: the config's)")
    p.add_argument("--chunk_sweep", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    p.add_argument("--sweep_lengths", type=int, nargs="*", default=[2048, 16384])
    p.add_argument("--naive_max", type=int, default=8192, help="longest sequence the naive cumsum form runs on")
    p.add_argument("--softmax_max", type=int, default=16384, help="longest sequence softmax runs on")
    p.set_defaults(repeats=3, warmup=1)
    args = p.parse_args()
    if args.tiny:
        args.lengths, args.heads, args.head_dim, args.repeats, args.warmup = [32, 64], 2, 8, 2, 1
        args.chunk_sweep, args.sweep_lengths = [8, 16], [64]
    if args.chunk_size is None:
        from hf_settransformer import TransformerDecoderConfig

        args.chunk_size = TransformerDecoderConfig().linear_attention_chunk_size
    return args


def elu_feature(x):
    return F.elu(x) + 1


def naive_causal_linear(q, k, v):
    """Causal linear attention written as in the paper's equation: prefix sums of phi(k_j) v_j^T and phi(k_j)."""
    phi_q, phi_k = elu_feature(q), elu_feature(k)
    kv = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=2)  # (b, h, n, d, e)
    z = torch.cumsum(phi_k, dim=2)  # (b, h, n, d)
    num = torch.einsum("bhnd,bhnde->bhne", phi_q, kv)
    den = torch.einsum("bhnd,bhnd->bhn", phi_q, z)
    return num / den.unsqueeze(-1)


def fast_transformers_causal(causal_dot_product):
    def attend(q, k, v):
        phi_q, phi_k = elu_feature(q), elu_feature(k)
        num = causal_dot_product(phi_q.contiguous(), phi_k.contiguous(), v.contiguous())  # (b, h, n, e)
        den = torch.einsum("bhnd,bhnd->bhn", phi_q, phi_k.cumsum(dim=2))
        return num / den.unsqueeze(-1)

    return attend


def contenders(args):
    found = optional_peer("fast_transformers.causal_product")
    chunk = args.chunk_size
    table = {
        "softmax (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "softmax causal (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "linear elu": lambda q, k, v: linear_attention(q, k, v, feature_map="elu"),
        "linear exp": lambda q, k, v: linear_attention(q, k, v, feature_map="exp"),
        f"causal linear elu (chunked, c={chunk})": lambda q, k, v: causal_linear_attention(
            q, k, v, feature_map="elu", chunk_size=chunk
        )[0],
        "causal linear elu (naive cumsum)": naive_causal_linear,
        "causal linear elu (fast-transformers)": None
        if found is None
        else fast_transformers_causal(found.causal_dot_product),
    }
    return table


def runnable(name, n, args):
    if name.startswith("softmax"):
        return n <= args.softmax_max
    if "naive" in name:
        return n <= args.naive_max
    return True


def inputs(args, n):
    g = torch.Generator().manual_seed(n)
    shape = (args.batch_size, args.heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=g).to(args.device) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad


def forward_backward(fn, qkv, grad):
    def run():
        for t in qkv:
            t.grad = None
        fn(*qkv).backward(grad)

    return run


def main():
    args = parse_args()
    setup_device(args)
    machine = describe_machine(args.device)
    setup = f"{machine} | batch {args.batch_size}, {args.heads} heads x {args.head_dim}, fp32, forward+backward"
    print(setup)
    table = contenders(args)
    skipped = {name: "not installed (pytorch-fast-transformers)" for name, fn in table.items() if fn is None}
    active = {name: fn for name, fn in table.items() if fn is not None}
    # correctness first: every causal contender agrees with the chunked kernel
    qkv, _ = inputs(args, 96 if not args.tiny else 40)
    ref = causal_linear_attention(*qkv, feature_map="elu", chunk_size=args.chunk_size)[0]
    for name, fn in active.items():
        if name.startswith("causal linear"):
            err = (fn(*qkv) - ref).abs().max().item()
            if err > 1e-4:
                raise SystemExit(f"{name} disagrees with the chunked kernel: max abs difference {err:.2e}")

    rows = []
    for n in args.lengths:
        qkv, grad = inputs(args, n)
        here = {name: forward_backward(fn, qkv, grad) for name, fn in active.items() if runnable(name, n, args)}
        timing = time_alternating(here, args.device, args.repeats, args.warmup)
        row = {"length": n}
        for name in table:
            if name in here:
                peak = peak_memory_bytes(here[name], args.device)
                row[name] = {"ms": 1e3 * timing[name]["median_s"], "peak_mib": peak / 2**20}
            else:
                row[name] = {"skipped": skipped.get(name, "longer than this contender's limit")}
        rows.append(row)
        print(f"measured n={n}", flush=True)

    print()
    markdown_table(
        ["n"] + list(table),
        [
            [r["length"]]
            + [f"{r[x]['ms']:.1f} ms, {r[x]['peak_mib']:.0f} MiB" if "ms" in r[x] else "skipped" for x in table]
            for r in rows
        ],
    )

    sweep = []
    if args.chunk_sweep:
        print("\nchunk size of the causal linear kernel (forward+backward ms, medians; alternated per length)")
        for n in args.sweep_lengths:
            qkv, grad = inputs(args, n)
            here = {
                c: forward_backward(
                    lambda q, k, v, c=c: causal_linear_attention(q, k, v, feature_map="elu", chunk_size=c)[0], qkv, grad
                )
                for c in args.chunk_sweep
            }
            timing = time_alternating(here, args.device, args.repeats, args.warmup)
            sweep.append({"length": n, **{str(c): 1e3 * timing[c]["median_s"] for c in args.chunk_sweep}})
        markdown_table(
            ["n"] + [f"c={c}" for c in args.chunk_sweep],
            [[s["length"]] + [f"{s[str(c)]:.1f}" for c in args.chunk_sweep] for s in sweep],
        )

    summary = summarize(rows, table, args)
    for line in summary["lines"]:
        print(line)
    path = write_json(args, "bench_attention", {"setup": setup, "rows": rows, "chunk_sweep": sweep, "summary": summary})
    plt = pyplot()
    if plt is not None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for name in table:
            pts = [(r["length"], r[name]) for r in rows if "ms" in r[name]]
            if pts:
                style = "--" if "causal" in name else "-"
                ax1.plot([p[0] for p in pts], [p[1]["ms"] for p in pts], style, marker="o", label=name)
                ax2.plot([p[0] for p in pts], [p[1]["peak_mib"] for p in pts], style, marker="o", label=name)
        log_axes(ax1, "sequence length", "ms per forward+backward (median)")
        log_axes(ax2, "sequence length", "peak MiB (one forward+backward)")
        print(f"wrote {path} and {save_figure(fig, args, 'bench_attention', setup)}")
    else:
        print(f"wrote {path}")


def summarize(rows, table, args):
    chunked = next(name for name in table if "chunked" in name)
    ft = "causal linear elu (fast-transformers)"
    lines, summary = [], {}
    by_length = {r["length"]: r for r in rows}
    if 8192 in by_length:
        row = by_length[8192]
        if "ms" in row[ft]:
            ratio = row[ft]["ms"] / row[chunked]["ms"]
            summary["fast_transformers_over_chunked_at_8192"] = ratio
            lines.append(f"fast-transformers / chunked time at 8192 = {ratio:.2f}x (target >= 1, i.e. ours no slower)")
        else:
            lines.append(f"fast-transformers at 8192: {row[ft]['skipped']}")
    if 8192 in by_length and 16384 in by_length:
        ratio = by_length[16384][chunked]["peak_mib"] / by_length[8192][chunked]["peak_mib"]
        summary["chunked_peak_memory_16384_over_8192"] = ratio
        lines.append(f"chunked causal linear peak memory 16384 / 8192 = {ratio:.2f}x (target <= 2.1x)")
    summary["lines"] = lines
    return summary


if __name__ == "__main__":
    main()

"""Attention kernels alone: forward+backward time and peak memory as the sequence grows, 8 heads of 64.

On a CPU (the default without CUDA; batch 1, fp32) softmax through SDPA against our linear kernels and, when installed,
fast-transformers' causal kernel (`cpu_contenders`); on CUDA (batch 4, bf16 inputs, lengths 1k ... 64k) SDPA against
ours in PyTorch and in Triton and flash-linear-attention's causal kernels (`gpu_contenders`). The causal kernels also
run with a decay (`linear_attention_decay`): "fixed" (RetNet's per-head gamma) and "gated" (a per-token log-decay,
logsigmoid(N(0, 1)) / 16, whose gradient is computed too, as in training). The contenders alternate
within each length, medians after warm-up; every linear one is first checked against the fp32 PyTorch op. A second
table sweeps the chunk size of the chunked PyTorch kernel; the summary gives the targets' ratios (`summarize_gpu`).
Peak memory is the most held above what was allocated before one forward+backward (`bench_common.peak_memory_bytes`).
`--contenders` runs some of them (`contender_names`: the device's).

    python benchmarks/bench_attention.py                 # CPU: lengths 512 ... 16384
    python benchmarks/bench_attention.py --device cuda   # GPU: lengths 1024 ... 65536, bf16
    python benchmarks/bench_attention.py --tiny          # seconds
    python benchmarks/bench_attention.py --tiny --contenders "linear elu"   # one of them (the tests run this)

Writes `<output_dir>/bench_attention.json` and `.png`, naming the machine (the GPU on CUDA).
"""

import contextlib
import inspect
import os
import time

import torch
import torch.nn.functional as F
from bench_common import (
    add_contenders_flag,
    base_parser,
    chosen_contenders,
    describe_error,
    describe_machine,
    log_axes,
    markdown_table,
    not_run,
    optional_peer,
    peak_memory_bytes,
    pyplot,
    save_figure,
    setup_device,
    sync,
    time_alternating,
    write_json,
)

from hf_settransformer.decay import GATE_LOGIT_NORMALISER, retnet_log_decay
from hf_settransformer.linear_ops import causal_linear_attention, linear_attention
from hf_settransformer.linear_triton import fused_linear_attention_available

FLA = "fla chunk_linear_attn causal elu"
FLA_GATED = "fla chunk_simple_gla causal elu, gated decay (unnormalised)"
DECAYS = ("fixed", "gated")


def parse_args(argv=None):
    p = base_parser(__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="default: 512-16384 (CPU), 1k-64k (CUDA)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=None, help="default: 1 (CPU), 4 (CUDA)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="the inputs' dtype (default: float32 on CPU, bfloat16 on CUDA)")  # fmt: skip
    p.add_argument("--chunk_size", type=int, default=None, help="chunk of the chunked kernel (default: the config's)")
    p.add_argument("--chunk_sweep", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    p.add_argument("--sweep_lengths", type=int, nargs="*", default=[2048, 16384])
    p.add_argument("--naive_max", type=int, default=8192, help="longest sequence the naive cumsum form runs on")
    p.add_argument("--causal_only", action="store_true", help="only the causal and decayed contenders")
    p.add_argument("--softmax_max", type=int, default=None, help="longest sequence softmax runs on (CPU: 16384)")
    add_contenders_flag(p)
    p.set_defaults(repeats=3, warmup=1)
    args = p.parse_args(argv)
    args.cuda = args.device.startswith("cuda")
    if args.lengths is None:
        args.lengths = [1024 * 2**i for i in range(7)] if args.cuda else [512, 1024, 2048, 4096, 8192, 16384]
    args.batch_size = args.batch_size or (4 if args.cuda else 1)
    args.dtype = args.dtype or ("bfloat16" if args.cuda else "float32")
    args.softmax_max = args.softmax_max or (2**31 if args.cuda else 16384)
    if args.tiny:
        args.lengths, args.heads, args.head_dim, args.repeats, args.warmup = [32, 64], 2, 8, 2, 1
        args.chunk_sweep, args.sweep_lengths = [8, 16], [64]
    if args.chunk_size is None:
        from hf_settransformer import TransformerDecoderConfig

        args.chunk_size = TransformerDecoderConfig().linear_attention_chunk_size
    args.contenders = chosen_contenders(p, args, contender_names(args))
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
    """name -> fn(q, k, v) -> out, or None for a contender that cannot run here; and name -> why not."""
    return gpu_contenders(args) if args.cuda else cpu_contenders(args)


def contender_names(args):
    """The names of `contenders(args)`, in order, built without a GPU (the choices of `--contenders`)."""
    if args.cuda:
        return ["SDPA", "SDPA causal", *(spec[0] for spec in gpu_ours()), FLA, FLA_GATED]
    return list(cpu_contenders(args)[0])


def cpu_contenders(args):
    """The CPU's contenders: softmax through SDPA, non-causal and causal; our `linear_attention`, elu and exp
    (Katharopoulos et al. 2020; Shen et al. 2021); our chunked `causal_linear_attention`, elu, chunk `--chunk_size`;
    the textbook causal form (`naive_causal_linear`, an n x d x e tensor, skipped above `--naive_max`); and
    fast-transformers' CUDA/C++ `causal_dot_product` with the same elu + 1 feature map and normalisation when
    `pytorch_fast_transformers` imports (it has no wheel: `pip install --no-build-isolation pytorch-fast-transformers`
    builds it against the installed torch, on a machine with no CUDA toolkit or with CUDA_HOME set)."""
    found = optional_peer("fast_transformers.causal_product")
    chunk = args.chunk_size
    table = {
        "softmax (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "softmax causal (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "linear elu": lambda q, k, v: linear_attention(q, k, v, feature_map="elu")[0],
        "linear exp": lambda q, k, v: linear_attention(q, k, v, feature_map="exp")[0],
        f"causal linear elu (chunked, c={chunk})": lambda q, k, v: causal_linear_attention(
            q, k, v, feature_map="elu", chunk_size=chunk
        )[0],
        **{
            f"causal linear {feature_map}{decay_words(decay)} (chunked)": ours(True, feature_map, False, chunk, decay)
            for feature_map in ("elu", "exp")
            for decay in (None, *DECAYS)
            if feature_map == "exp" or decay is not None
        },
        "causal linear elu (naive cumsum)": naive_causal_linear,
        "causal linear elu (fast-transformers)": None
        if found is None
        else fast_transformers_causal(found.causal_dot_product),
    }
    return table, {"causal linear elu (fast-transformers)": "not installed (pytorch-fast-transformers)"}


@contextlib.contextmanager
def triton_switch(enabled):
    """The fused kernels on or off (`HFST_DISABLE_TRITON`, read at each call) for the duration."""
    before = os.environ.get("HFST_DISABLE_TRITON")
    os.environ["HFST_DISABLE_TRITON"] = "0" if enabled else "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HFST_DISABLE_TRITON"]
        else:
            os.environ["HFST_DISABLE_TRITON"] = before


def ours(causal, feature_map, triton, chunk, decay=None):
    """Our op as a contender: non-causal or causal, `decay` None, "fixed" or "gated" (`decay_for`)."""

    def attend(q, k, v):
        with triton_switch(triton):
            if causal:
                options = {} if decay is None else {"decay": decay_for(decay, q)}
                return causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=chunk, **options)[0]
            return linear_attention(q, k, v, feature_map=feature_map)[0]

    return attend


def decay_words(decay):
    return "" if decay is None else f", {decay} decay"


_GATES = {}


def decay_for(decay, q):
    """The log-decay (b, h, n) of a contender: RetNet's per-head schedule ("fixed"), or a per-token gate ("gated",
    made once per shape, a leaf whose gradient the backward computes)."""
    b, h, n = q.shape[:3]
    if decay == "fixed":
        return retnet_log_decay(h, q.device)[None, :, None].expand(b, h, n)
    key = (b, h, n, q.device)
    if key not in _GATES:
        logits = torch.randn(b, h, n, generator=torch.Generator().manual_seed(n)).to(q.device)
        _GATES[key] = (F.logsigmoid(logits) / GATE_LOGIT_NORMALISER).requires_grad_()
    return _GATES[key]


def exact_elu1(x):
    """elu(x) + 1 computed in fp32 (where(x >= 0, x + 1, exp(x))), in x's dtype: in bf16 `elu(x) + 1` cancels to 0."""
    y = x.float()
    return torch.where(y >= 0, y + 1.0, torch.exp(torch.clamp(y, max=0.0))).to(x.dtype)


def fla_gated(chunk_simple_gla):
    """fla's simple GLA (a per-token, per-head scalar decay, no normaliser: RetNet-style outputs) with the exact elu+1
    map and our gated contenders' decay: the peer of "ours causal elu, gated decay"."""

    def attend(q, k, v):
        g = decay_for("gated", q).transpose(1, 2)  # (b, n, h)
        q, k, v = (t.transpose(1, 2) for t in (exact_elu1(q), exact_elu1(k), v))
        out, _ = chunk_simple_gla(q, k, v, g=g, scale=1.0)
        return out.transpose(1, 2)

    return attend


def fla_causal(chunk_linear_attn):
    # (b, n, h, d) inputs: fla's layout (older releases take head_first=True by default)
    layout = {"head_first": False} if "head_first" in inspect.signature(chunk_linear_attn).parameters else {}

    def attend(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (exact_elu1(q), exact_elu1(k), v))
        out, _ = chunk_linear_attn(q, k, v, scale=1.0, normalize=True, **layout)
        return out.transpose(1, 2)

    return attend


def gpu_contenders(args):
    """The GPU's contenders: SDPA and SDPA causal (flash attention for bf16/fp16); ours, non-causal and causal, elu and
    exp, each twice, "(PyTorch)" (the reference ops, `HFST_DISABLE_TRITON=1`) and "(Triton)" (the fused kernels of
    `hf_settransformer/linear_triton.py`, skipped where triton is unavailable); and flash-linear-attention's (0.6.0)
    causal Triton kernel `chunk_linear_attn`, `normalize=True`, scale 1, with the exact elu+1 feature map applied
    outside it (`exact_elu1`), when `fla` imports (`pip install flash-linear-attention==0.6.0`)."""
    probe = torch.empty(1, 1, 1, args.head_dim, device=args.device, dtype=getattr(torch, args.dtype))
    fused = fused_linear_attention_available(probe)
    table = {
        "SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "SDPA causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    skipped = {}
    for name, causal, feature_map, triton, decay in gpu_ours():
        table[name] = ours(causal, feature_map, triton, args.chunk_size, decay) if fused or not triton else None
        if table[name] is None:
            skipped[name] = f"triton unavailable or not taken for {args.dtype} (HFST_DISABLE_TRITON?)"
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError as error:
        table[FLA], skipped[FLA] = None, f"not installed (flash-linear-attention 0.6.0): {error}"
    else:
        table[FLA] = fla_causal(chunk_linear_attn)
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError as error:
        table[FLA_GATED], skipped[FLA_GATED] = None, f"not installed (flash-linear-attention 0.6.0): {error}"
    else:
        table[FLA_GATED] = fla_gated(chunk_simple_gla)
    for name, why in skipped.items():
        print(f"skipping {name}: {why}")
    return table, skipped


def gpu_ours():
    """(name, causal, feature_map, triton, decay) of each of our GPU contenders, in the table's order."""
    for causal, decay in ((False, None), (True, None), *((True, decay) for decay in DECAYS)):
        for feature_map in ("elu", "exp"):
            for triton in (False, True):
                name = (f"ours {'causal' if causal else 'linear'} {feature_map}{decay_words(decay)} "
                        f"({'Triton' if triton else 'PyTorch'})")
                yield name, causal, feature_map, triton, decay


def reference(name, chunk):
    """The fp32 PyTorch op a linear contender computes, or None (softmax)."""
    if "softmax" in name or name.startswith("SDPA") or name == FLA_GATED:  # fla's simple GLA has no normaliser
        return None
    decay = next((d for d in DECAYS if f"{d} decay" in name), None)
    return ours("causal" in name, "exp" if " exp" in name else "elu", False, chunk, decay)


def runnable(name, n, args):
    if name.startswith("softmax"):
        return n <= args.softmax_max
    if "naive" in name:
        return n <= args.naive_max
    return True


def inputs(args, n):
    g = torch.Generator().manual_seed(n)
    shape = (args.batch_size, args.heads, n, args.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=g).to(args.device, getattr(torch, args.dtype)) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad


def check(active, args):
    """Every linear contender agrees with the fp32 PyTorch op on the same inputs (max abs difference); a wrong one
    stops the run. Returns name -> the first line of the error of each contender that raised (left out of the timing:
    a peer that refuses this GPU or this triton must not cost the others their rows)."""
    qkv, _ = inputs(args, 96 if not args.tiny else 40)
    tolerance = 1e-4 if args.dtype == "float32" else 5e-2
    failed = {}
    for name, fn in active.items():
        ref = reference(name, args.chunk_size)
        if ref is not None:
            try:
                with torch.no_grad():
                    err = (fn(*qkv).float() - ref(*(t.float() for t in qkv))).abs().max().item()
            except Exception as error:
                failed[name] = describe_error(error)
                continue
            if not err <= tolerance:
                raise SystemExit(f"{name} disagrees with the fp32 PyTorch op: max abs difference {err:.2e}")
    return failed


def probe(here, device):
    """One forward+backward of each contender (its compilation and autotuning, outside the timing): name -> seconds,
    and name -> the error's first line for those that raised (out of memory included), which are dropped."""
    seconds, failed = {}, {}
    for name, run in list(here.items()):
        start = time.perf_counter()
        try:
            run()
            sync(device)
        except Exception as error:
            failed[name] = describe_error(error)
            del here[name]
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()
        else:
            seconds[name] = time.perf_counter() - start
    return seconds, failed


def forward_backward(fn, qkv, grad):
    def run():
        for t in qkv:
            t.grad = None
        out = fn(*qkv)
        out.backward(grad.to(out.dtype))  # ours give fp32 outputs, SDPA and fla the inputs' dtype

    return run


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    machine = describe_machine(args.device)
    setup = (
        f"{machine} | batch {args.batch_size}, {args.heads} heads x {args.head_dim}, {args.dtype} inputs, "
        "forward+backward"
    )
    print(setup)
    table, skipped = contenders(args)
    table = {name: fn for name, fn in table.items() if name in args.contenders}
    if args.causal_only:  # only the causal and decayed contenders (and fla's, which are causal)
        table = {name: fn for name, fn in table.items() if "causal" in name or "decay" in name or name in (FLA, FLA_GATED)}
    active = {name: fn for name, fn in table.items() if fn is not None}
    failed = check(active, args)  # correctness first
    for name, why in failed.items():
        print(f"failed: {name}: {why}", flush=True)
        del active[name]

    rows, payload = [], {"setup": setup, "machine": machine, "complete": False}
    if args.cuda:
        payload["gpu"] = torch.cuda.get_device_name()
    for n in args.lengths:
        qkv, grad = inputs(args, n)
        here = {name: forward_backward(fn, qkv, grad) for name, fn in active.items() if runnable(name, n, args)}
        first_s, failed_here = probe(here, args.device)
        timing = time_alternating(here, args.device, args.repeats, args.warmup)
        peaks = {name: peak_memory_bytes(run, args.device) for name, run in here.items()}
        rows.append(length_row(n, table, timing, peaks, first_s, {**failed, **failed_here}, skipped))
        write_json(args, "bench_attention", {**payload, "rows": rows})  # a run stopped later keeps these lengths
        print(f"measured n={n}" + "".join(f"; failed: {k}: {v}" for k, v in failed_here.items()), flush=True)

    print()
    markdown_table(["n"] + list(table), table_rows(rows, table))

    sweep = []
    if args.chunk_sweep:
        print("\nchunk size of the causal linear PyTorch kernel (forward+backward ms, medians; alternated per length)")
        for n in args.sweep_lengths:
            qkv, grad = inputs(args, n)
            here = {c: forward_backward(ours(True, "elu", False, c), qkv, grad) for c in args.chunk_sweep}
            timing = time_alternating(here, args.device, args.repeats, args.warmup)
            sweep.append({"length": n, **{str(c): 1e3 * timing[c]["median_s"] for c in args.chunk_sweep}})
        markdown_table(
            ["n"] + [f"c={c}" for c in args.chunk_sweep],
            [[s["length"]] + [f"{s[str(c)]:.1f}" for c in args.chunk_sweep] for s in sweep],
        )

    summary = summarize_gpu(rows) if args.cuda else summarize(rows, table, args)
    for line in summary["lines"]:
        print(line)
    path = write_json(args, "bench_attention",
                      {**payload, "complete": True, "rows": rows, "chunk_sweep": sweep, "summary": summary})
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


def length_row(n, table, timing, peaks, first_s, failed, skipped):
    """The record of length `n`: each contender's median ms, peak MiB (`peaks`: bytes) and first call's seconds, or
    why it has none (`failed`: name -> error, `skipped`: name -> reason; else it was past its length limit)."""
    row = {"length": n}
    for name in table:
        if name in timing:
            row[name] = {"ms": 1e3 * timing[name]["median_s"], "peak_mib": peaks[name] / 2**20,
                         "first_call_s": first_s[name]}
        elif name in failed:
            row[name] = {"failed": failed[name]}
        else:
            row[name] = {"skipped": skipped.get(name, "longer than this contender's limit")}
    return row


def table_rows(rows, table):
    """The cells of the first table: a row per length, a column per contender."""
    return [
        [r["length"]]
        + [f"{r[x]['ms']:.1f} ms, {r[x]['peak_mib']:.0f} MiB" if "ms" in r[x] else
           "failed" if "failed" in r[x] else "skipped" for x in table]
        for r in rows
    ]


def summarize(rows, table, args):
    """The CPU targets: fast-transformers' causal kernel against our chunked one at 8192 (time) and the chunked
    one's memory from 8192 to 16384, and each decay's cost; a ratio whose contender did not run says so."""
    chunked, ft = f"causal linear elu (chunked, c={args.chunk_size})", "causal linear elu (fast-transformers)"
    lines, summary = [], {}
    by_length = {r["length"]: r for r in rows}
    if 8192 in by_length:
        row = by_length[8192]
        if ft not in table or chunked not in table:
            lines.append(f"fast-transformers / chunked time at 8192: {not_run(ft if ft not in table else chunked)}")
        elif "ms" in row[ft] and "ms" in row[chunked]:
            ratio = row[ft]["ms"] / row[chunked]["ms"]
            summary["fast_transformers_over_chunked_at_8192"] = ratio
            lines.append(f"fast-transformers / chunked time at 8192 = {ratio:.2f}x (target >= 1, i.e. ours no slower)")
        else:
            name = ft if "ms" not in row[ft] else chunked
            why = row[name].get("skipped") or row[name]["failed"]
            lines.append(f"{'fast-transformers' if name == ft else name} at 8192: {why}")
    if chunked in table and all("peak_mib" in by_length.get(n, {}).get(chunked, {}) for n in (8192, 16384)):
        ratio = by_length[16384][chunked]["peak_mib"] / by_length[8192][chunked]["peak_mib"]
        summary["chunked_peak_memory_16384_over_8192"] = ratio
        lines.append(f"chunked causal linear peak memory 16384 / 8192 = {ratio:.2f}x (target <= 2.1x)")
    for n in (2048, 8192):
        if n not in by_length:
            continue
        for feature_map in ("elu", "exp"):
            plain = chunked if feature_map == "elu" else "causal linear exp (chunked)"
            for decay in DECAYS:
                name = f"causal linear {feature_map}{decay_words(decay)} (chunked)"
                if "ms" in by_length[n].get(name, {}) and "ms" in by_length[n].get(plain, {}):
                    ratio = by_length[n][name]["ms"] / by_length[n][plain]["ms"]
                    summary[f"{feature_map}_{decay}_over_undecayed_at_{n}"] = ratio
                    lines.append(f"causal {feature_map}, {decay} decay / undecayed time at {n} = {ratio:.2f}x")
    summary["lines"] = lines
    return summary


def summarize_gpu(rows):
    """The GPU targets per length: ours causal elu (Triton) at least as fast as fla, with no more peak
    memory; causal exp within 1.5x of causal elu; causal exp faster than SDPA causal from 8k tokens on; and the gated
    decay's cost: ours gated against ours undecayed and against fla's simple GLA."""
    elu, exp = "ours causal elu (Triton)", "ours causal exp (Triton)"
    gated = "ours causal elu, gated decay (Triton)"
    lines, summary = [], {}
    for r in rows:
        n, got = r["length"], {}
        for key, a, b, field in [
            ("elu_over_fla_time", elu, FLA, "ms"),
            ("elu_over_fla_peak", elu, FLA, "peak_mib"),
            ("exp_over_elu_time", exp, elu, "ms"),
            ("exp_over_sdpa_causal_time", exp, "SDPA causal", "ms"),
            ("gated_over_undecayed_time", gated, elu, "ms"),
            ("gated_over_fla_simple_gla_time", gated, FLA_GATED, "ms"),
        ]:
            if field in r.get(a, {}) and field in r.get(b, {}):
                got[key] = r[a][field] / r[b][field]
        summary[str(n)] = got
        words = {"elu_over_fla_time": "causal elu / fla time {:.2f}x (target <= 1)",
                 "elu_over_fla_peak": "peak {:.2f}x (<= 1)", "exp_over_elu_time": "exp / elu {:.2f}x (<= 1.5)",
                 "exp_over_sdpa_causal_time": "exp / SDPA causal {:.2f}x (< 1 from 8k)",
                 "gated_over_undecayed_time": "elu gated / elu {:.2f}x",
                 "gated_over_fla_simple_gla_time": "elu gated / fla simple GLA {:.2f}x"}  # fmt: skip
        lines.append(f"n={n}: " + (", ".join(words[k].format(v) for k, v in got.items()) or "no ratio measured"))
    summary["lines"] = lines
    return summary


if __name__ == "__main__":
    main()

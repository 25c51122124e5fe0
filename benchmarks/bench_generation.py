"""Per-token decoding latency and memory: softmax attention with a key/value cache vs linear attention with its
recurrent state, at growing context lengths, same model size, measured in one run; optionally also the fixed-shape
steps a GPU can replay as CUDA graphs (transformers' static cache for softmax, the in-place recurrent state for linear).

The decoders (identical but for `attention_type`) are prefilled in chunks of `--prefill_chunk` tokens, then the
contenders' single-token steps are timed alternately, medians after `--warmup` (at batch 1: the per-token latency).
Memory: the bytes the cache holds after the context, plus, on CUDA, the peak allocated during the timed steps.
`--contenders` runs some of them; a softmax / linear ratio without one of the two says so.

    python benchmarks/bench_generation.py                                  # full run: contexts 128 ... 8192
    python benchmarks/bench_generation.py --contexts 2048 --batch_sizes 1 --dtype bfloat16 --cache static --compile \\
        --profile                                                       # the GPU targets, with a profile
    python benchmarks/bench_generation.py --tiny                           # seconds: proves it works
    python benchmarks/bench_generation.py --tiny --contenders linear       # one of them (the tests run this)

Writes `<output_dir>/bench_generation.json` and `.png`; `--profile`: `bench_generation_profile.txt` (`profile_steps`).
"""

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
from bench_common import (
    add_contenders_flag,
    chosen_contenders,
    describe_machine,
    log_axes,
    not_run,
    pyplot,
    save_figure,
    sync,
    write_json,
)
from transformers import StaticCache

from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM
from hf_settransformer.cache import LinearAttentionCache

# the GPU targets (ms per token, batch 1, hidden 512, 8 layers, bf16, context 2048, on a GPU)
TARGETS_MS = {"softmax": 10.0, "linear": 5.0, "softmax_static_compiled": 3.0, "linear_compiled": 3.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--hidden_size", type=int, default=512)
    p.add_argument("--num_hidden_layers", type=int, default=8)
    p.add_argument("--num_attention_heads", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=33278)
    p.add_argument("--feature_map", default="elu", choices=["elu", "exp"])
    p.add_argument("--linear_attention_decay", default="none", choices=["none", "fixed", "gated"],
                   help="the linear decoder's decay (its state has the same size with or without)")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=30, help="timed single-token steps per model and context")
    p.add_argument("--warmup", type=int, default=5, help="steps dropped before the medians (compilation happens here)")
    p.add_argument("--prefill_chunk", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static"], help="static: add softmax_static")
    p.add_argument("--compile", action="store_true", help="add softmax_static_compiled and linear_compiled")
    p.add_argument(
        "--compile_mode", default="reduce-overhead", help="torch.compile mode (reduce-overhead: CUDA graphs)"
    )
    p.add_argument("--compile_backend", default="inductor", help="torch.compile backend (eager: tracing only, tests)")
    p.add_argument("--profile", action="store_true", help="write torch.profiler tables of a few steps per contender")
    p.add_argument("--profile_steps", type=int, default=5)
    p.add_argument("--output_dir", default="results")
    p.add_argument("--tiny", action="store_true", help="a seconds-long run with a tiny model (for tests)")
    add_contenders_flag(p, list(KINDS))
    if p.parse_args(argv).tiny:  # tiny defaults; options given explicitly still win
        p.set_defaults(
            contexts=[16, 64], hidden_size=32, num_hidden_layers=2, num_attention_heads=4, batch_sizes=[1, 2]
        )
        p.set_defaults(vocab_size=50, steps=6, warmup=2, prefill_chunk=32, profile_steps=2)
    args = p.parse_args(argv)
    args.contenders = chosen_contenders(p, args, contender_names(args))
    return args


@dataclass
class Contender:
    """One way to decode: a model, the cache it starts from, and the step function it calls."""

    model: torch.nn.Module
    cache: str  # "dynamic", "static" (StaticCache) or "state" / "static_state" (LinearAttentionCache)
    compiled: bool = False
    forward: object = None  # the (compiled) forward, made per measurement

    def new_cache(self, args, batch_size, context):
        if self.cache == "static":  # room for every step this measurement takes
            length = context + args.warmup + args.steps + (args.profile_steps if args.profile else 0)
            # a multiple of 64: SDPA's memory-efficient kernel pads a mask whose length is not a multiple of 16
            return StaticCache(config=self.model.config, max_cache_len=-(-length // 64) * 64)
        if self.cache == "static_state":
            return LinearAttentionCache(config=self.model.config, static=True)
        return None  # the model makes its own (DynamicCache or LinearAttentionCache)

    def start(self, args):
        """A fresh forward: compiled anew, so that every context and batch size compiles once, within the warm-up."""
        self.forward = self.model.forward
        if self.compiled:
            options = {"mode": args.compile_mode} if args.compile_backend == "inductor" else {}
            self.forward = torch.compile(self.model.forward, fullgraph=True, backend=args.compile_backend, **options)


KINDS = {  # contender -> (attention_type of its model, its cache, compiled)
    "softmax": ("softmax", "dynamic", False),
    "linear": ("linear", "state", False),
    "softmax_static": ("softmax", "static", False),
    "softmax_static_compiled": ("softmax", "static", True),
    "linear_compiled": ("linear", "static_state", True),
}


def contender_names(args):
    """The contenders the flags give, in order (the choices of `--contenders`): see `contenders`."""
    names = ["softmax", "linear"] + (["softmax_static"] if args.cache == "static" else [])
    return names + (["softmax_static_compiled", "linear_compiled"] if args.compile else [])


def contenders(args):
    """name -> Contender of each `--contenders` chose. Always, in eager mode: `softmax`, a DynamicCache whose keys and
    values grow by one per step, and `linear`, a LinearAttentionCache (one recurrent state per layer, the same size at
    every step). `--cache static` adds `softmax_static`, transformers' StaticCache (buffers of the final length);
    `--compile` adds `softmax_static_compiled`, that step under torch.compile (`--compile_mode`: CUDA graphs), and
    `linear_compiled`, `LinearAttentionCache(static=True)` updated in place, compiled afresh per batch size and
    context (untimed). Contenders of the same attention share one model."""
    models, chosen = {}, {}
    for name in args.contenders:
        attention_type, cache, compiled = KINDS[name]
        if attention_type not in models:
            models[attention_type] = build(args, attention_type)
        chosen[name] = Contender(models[attention_type], cache, compiled)
    return chosen


def cache_nbytes(cache):
    if isinstance(cache, LinearAttentionCache):
        return cache.state_nbytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def build(args, attention_type):
    config = TransformerDecoderConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        attention_type=attention_type,
        feature_map=args.feature_map,
        linear_attention_decay=args.linear_attention_decay if attention_type == "linear" else "none",
        max_position_embeddings=max(args.contexts) + args.warmup + args.steps + args.profile_steps + 64,
    )
    torch.manual_seed(0)
    return TransformerDecoderForCausalLM(config).to(args.device, getattr(torch, args.dtype)).eval()


@torch.no_grad()
def prefill(model, ids, chunk, cache):
    for start in range(0, ids.shape[1], chunk):
        out = model(input_ids=ids[:, start : start + chunk], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


@torch.no_grad()
def step(contender, token, cache, device):
    sync(device)
    start = time.perf_counter()
    if contender.compiled and str(device).startswith("cuda"):
        torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs (logits) may be overwritten
    out = contender.forward(input_ids=token, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - start, token, out.past_key_values


def measure(args, chosen, batch_size, context, profile=None):
    g = torch.Generator().manual_seed(context)
    ids = torch.randint(0, args.vocab_size, (batch_size, context), generator=g).to(args.device)
    state = {}
    for name, c in chosen.items():
        c.start(args)
        cache, token = prefill(c.model, ids, args.prefill_chunk, c.new_cache(args, batch_size, context))
        state[name] = {"cache": cache, "token": token, "times": [], "cache_bytes": cache_nbytes(cache), "peak": 0}
    cuda = args.device.startswith("cuda")
    for i in range(args.warmup + args.steps):
        for name, c in chosen.items():  # alternate the contenders step by step
            s = state[name]
            if cuda:
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            seconds, s["token"], s["cache"] = step(c, s["token"], s["cache"], args.device)
            if cuda:
                s["peak"] = max(s["peak"], torch.cuda.max_memory_allocated() - base)
            if i >= args.warmup:
                s["times"].append(seconds)
    if profile is not None:
        for name, c in chosen.items():
            profile.append(profile_steps(args, name, c, state[name], f"batch {batch_size}, context {context}"))
    torch._dynamo.reset()  # the next measurement compiles its own graphs (no cap on recompilations is reached)
    return {
        name: {
            "ms_per_token": 1e3 * statistics.median(s["times"]),
            "cache_mib": s["cache_bytes"] / 2**20,
            "step_peak_mib": s["peak"] / 2**20 if cuda else None,
        }
        for name, s in state.items()
    }


def profile_steps(args, name, contender, s, where):
    """torch.profiler tables of `--profile_steps` more steps: the ops a step spends its time in (on a GPU: whether
    attention runs cuDNN, flash or efficient kernels, and how much of a step is kernel launches on the host)."""
    cuda = args.device.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            with torch.profiler.record_function("decode_step"):
                _, s["token"], s["cache"] = step(contender, s["token"], s["cache"], args.device)
    averages = prof.key_averages()
    tables = [f"## {name}, {where}: {args.profile_steps} steps"]
    for key in (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]:
        tables.append(f"### sorted by {key}\n{averages.table(sort_by=key, row_limit=25)}")
    return "\n".join(tables)


def plot(rows, names, args, title):
    plt = pyplot()
    if plt is None:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"softmax": "o-", "linear": "s--", "softmax_static": "^-", "softmax_static_compiled": "v-"}
    for batch in sorted({r["batch"] for r in rows}):
        sub = [r for r in rows if r["batch"] == batch]
        contexts = [r["context"] for r in sub]
        for name in names:
            label = f"{name}, batch {batch}"
            ax1.plot(contexts, [r[name]["ms_per_token"] for r in sub], styles.get(name, "d--"), label=label)
            ax2.plot(contexts, [r[name]["cache_mib"] for r in sub], styles.get(name, "d--"), label=label)
    log_axes(ax1, "context length (tokens)", "ms per decoding step (median)")
    log_axes(ax2, "context length (tokens)", "cache / state memory (MiB)")
    return save_figure(fig, args, "bench_generation", title)


def table_header(names):
    """The table's header and rule: a time column per contender, the softmax / linear ratio, a memory column for
    softmax, linear and softmax_static where they run."""
    columns = ["batch", "context", *(f"{n} ms/step" for n in names), "softmax / linear"]
    columns += [label for name, label in (("softmax", "softmax cache MiB"), ("linear", "linear state MiB"),
                                          ("softmax_static", "softmax_static cache MiB")) if name in names]
    return "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)


def softmax_over_linear(result):
    """softmax's ms/step over linear's in `result` (name -> record), or the name of the one that did not run."""
    if "softmax" in result and "linear" in result:
        return result["softmax"]["ms_per_token"] / result["linear"]["ms_per_token"], None
    return None, "softmax" if "softmax" not in result else "linear"


def table_line(batch, context, result):
    """The table's row of one batch size and context (`result`: name -> record, in the table's order)."""
    ratio, missing = softmax_over_linear(result)
    cells = [batch, context, *(f"{r['ms_per_token']:.2f}" for r in result.values()),
             f"{ratio:.1f}x" if missing is None else not_run(missing)]
    cells += [format(result[name]["cache_mib"], spec) for name, spec in (("softmax", ".2f"), ("linear", ".3f"),
                                                                         ("softmax_static", ".2f")) if name in result]
    return "| " + " | ".join(map(str, cells)) + " |"


def summarize(rows, args):
    """Per batch size: linear's ms/step at the longest context over the shortest and softmax over linear at the
    longest (None where a contender they need did not run); the lines that print them, and the GPU targets' line."""
    summary, lines = {}, []
    for batch in args.batch_sizes:
        sub = [r for r in rows if r["batch"] == batch]
        first, last = sub[0], sub[-1]
        ratio, missing = softmax_over_linear(last)
        value = summary[f"batch {batch}"] = {
            "linear_latency_ratio_longest_vs_shortest": last["linear"]["ms_per_token"] / first["linear"]["ms_per_token"]
            if "linear" in last
            else None,
            "softmax_over_linear_at_longest": ratio,
        }
        latency = value["linear_latency_ratio_longest_vs_shortest"]
        lines.append(
            f"batch {batch}: linear ms/step at {args.contexts[-1]} / at {args.contexts[0]} = "
            + (f"{latency:.2f}x (target <= 1.2x)" if latency is not None else not_run("linear"))
            + f"; softmax / linear at {args.contexts[-1]} = "
            + (f"{ratio:.1f}x (target >= 5x)" if missing is None else not_run(missing))
        )
    at = [r for r in rows if r["batch"] == 1 and r["context"] == 2048]
    if at:  # the GPU targets are for batch 1 at context 2048 (hidden 512, 8 layers, bf16, a GPU)
        got = [f"{n} {at[0][n]['ms_per_token']:.2f} ms (target <= {t:g})" for n, t in TARGETS_MS.items() if n in at[0]]
        lines.append("batch 1, context 2048: " + "; ".join(got))
    return summary, lines


def main(argv=None):
    args = parse_args(argv)
    chosen = contenders(args)
    names = list(chosen)
    params = sum(p.numel() for p in next(iter(chosen.values())).model.parameters())  # softmax's, where it runs
    title = (
        f"{describe_machine(args.device)} | hidden {args.hidden_size}, {args.num_hidden_layers} layers, "
        f"{args.num_attention_heads} heads, vocab {args.vocab_size}, {params / 1e6:.1f}M params, {args.dtype}, "
        f"linear={args.feature_map}, decay {args.linear_attention_decay}"
        + (f", compile {args.compile_backend}/{args.compile_mode}" if args.compile else "")
    )
    print(title)
    rows, profiles = [], [title] if args.profile else None
    print(table_header(names))
    for batch in args.batch_sizes:
        for context in args.contexts:
            profile = profiles if profiles is not None and context == args.contexts[-1] else None
            result = measure(args, chosen, batch, context, profile)
            rows.append({"batch": batch, "context": context, **result})
            print(table_line(batch, context, result), flush=True)
    print()
    summary, lines = summarize(rows, args)
    for line in lines:
        print(line)
    path = write_json(args, "bench_generation", {"setup": title, "contenders": names, "rows": rows, "summary": summary})
    png = plot(rows, names, args, title)
    wrote = [str(path)] + ([str(png)] if png else [])
    if profiles is not None:
        profile_path = path.with_name("bench_generation_profile.txt")
        profile_path.write_text("\n\n".join(profiles) + "\n")
        wrote.append(str(profile_path))
    print("wrote " + ", ".join(wrote))


if __name__ == "__main__":
    main()

"""Per-token decoding latency and memory: softmax attention with a key/value cache vs linear attention with its
recurrent state, at growing context lengths, same model size, measured in one run.

For every batch size and context length the two decoders (identical but for `attention_type`) are prefilled
through the cache in chunks of `--prefill_chunk` tokens, then single-token steps are timed alternately (softmax
step, linear step, ...); the first `--warmup` steps are dropped and medians reported. A step produces one token for
each of the batch's sequences, so at batch 1 its time is the per-token latency. Memory is the bytes the cache holds
after the context (keys and values, or the recurrent states), plus, on CUDA, the peak memory allocated during the
timed steps above what was allocated before them.

    python scripts/bench_generation.py                                  # full run: contexts 128 ... 8192
    python scripts/bench_generation.py --contexts 128 1024 --steps 20   # quicker
    python scripts/bench_generation.py --tiny                           # seconds: proves it works (the tests run this)

Writes `<output_dir>/bench_generation.json` and `.png` (the plot needs matplotlib: `pip install -e ".[bench]"`).
"""

import argparse
import statistics
import time

import torch
from bench_common import describe_machine, log_axes, pyplot, save_figure, sync, write_json

from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM
from hf_settransformer.cache import LinearAttentionCache


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--hidden_size", type=int, default=512)
    p.add_argument("--num_hidden_layers", type=int, default=8)
    p.add_argument("--num_attention_heads", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=33278)
    p.add_argument("--feature_map", default="elu", choices=["elu", "exp"])
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=30, help="timed single-token steps per model and context")
    p.add_argument("--warmup", type=int, default=5, help="steps dropped before the medians")
    p.add_argument("--prefill_chunk", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--output_dir", default="scripts/results")
    p.add_argument("--tiny", action="store_true", help="a seconds-long run with a tiny model (for tests)")
    args = p.parse_args()
    if args.tiny:
        args.contexts, args.hidden_size, args.num_hidden_layers, args.num_attention_heads = [16, 64], 32, 2, 4
        args.batch_sizes = [1, 2]
        args.vocab_size, args.steps, args.warmup, args.prefill_chunk = 50, 6, 2, 32
    return args


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
        max_position_embeddings=max(args.contexts) + args.steps + 1,
    )
    torch.manual_seed(0)
    return TransformerDecoderForCausalLM(config).to(args.device, getattr(torch, args.dtype)).eval()


@torch.no_grad()
def prefill(model, ids, chunk):
    cache = None
    for start in range(0, ids.shape[1], chunk):
        out = model(input_ids=ids[:, start : start + chunk], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


@torch.no_grad()
def step(model, token, cache, device):
    sync(device)
    start = time.perf_counter()
    out = model(input_ids=token, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    sync(device)
    return time.perf_counter() - start, token, out.past_key_values


def measure(args, models, batch_size, context):
    g = torch.Generator().manual_seed(context)
    ids = torch.randint(0, args.vocab_size, (batch_size, context), generator=g).to(args.device)
    state = {}
    for name, model in models.items():
        cache, token = prefill(model, ids, args.prefill_chunk)
        state[name] = {"cache": cache, "token": token, "times": [], "cache_bytes": cache_nbytes(cache), "peak": 0}
    cuda = args.device.startswith("cuda")
    for i in range(args.warmup + args.steps):
        for name, model in models.items():  # alternate the contenders step by step
            s = state[name]
            if cuda:
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            seconds, s["token"], s["cache"] = step(model, s["token"], s["cache"], args.device)
            if cuda:
                s["peak"] = max(s["peak"], torch.cuda.max_memory_allocated() - base)
            if i >= args.warmup:
                s["times"].append(seconds)
    return {
        name: {
            "ms_per_token": 1e3 * statistics.median(s["times"]),
            "cache_mib": s["cache_bytes"] / 2**20,
            "step_peak_mib": s["peak"] / 2**20 if cuda else None,
        }
        for name, s in state.items()
    }


def plot(rows, args, title):
    plt = pyplot()
    if plt is None:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for batch in sorted({r["batch"] for r in rows}):
        sub = [r for r in rows if r["batch"] == batch]
        contexts = [r["context"] for r in sub]
        for name, style in (("softmax", "o-"), ("linear", "s--")):
            label = f"{'softmax + KV cache' if name == 'softmax' else 'linear + recurrent state'}, batch {batch}"
            ax1.plot(contexts, [r[name]["ms_per_token"] for r in sub], style, label=label)
            ax2.plot(contexts, [r[name]["cache_mib"] for r in sub], style, label=label)
    log_axes(ax1, "context length (tokens)", "ms per decoding step (median)")
    log_axes(ax2, "context length (tokens)", "cache / state memory (MiB)")
    return save_figure(fig, args, "bench_generation", title)


def main():
    args = parse_args()
    models = {"softmax": build(args, "softmax"), "linear": build(args, "linear")}
    params = sum(p.numel() for p in models["softmax"].parameters())
    title = (
        f"{describe_machine(args.device)} | hidden {args.hidden_size}, {args.num_hidden_layers} layers, "
        f"{args.num_attention_heads} heads, vocab {args.vocab_size}, {params / 1e6:.1f}M params, {args.dtype}, "
        f"linear={args.feature_map}"
    )
    print(title)
    rows, summary = [], {}
    print(
        "| batch | context | softmax ms/step | linear ms/step | softmax / linear | softmax cache MiB | "
        "linear state MiB |\n|---|---|---|---|---|---|---|"
    )
    for batch in args.batch_sizes:
        for context in args.contexts:
            result = measure(args, models, batch, context)
            rows.append({"batch": batch, "context": context, **result})
            s, lin = result["softmax"], result["linear"]
            print(
                f"| {batch} | {context} | {s['ms_per_token']:.2f} | {lin['ms_per_token']:.2f} | "
                f"{s['ms_per_token'] / lin['ms_per_token']:.1f}x | {s['cache_mib']:.2f} | {lin['cache_mib']:.3f} |",
                flush=True,
            )
        first, last = rows[-len(args.contexts)], rows[-1]
        summary[f"batch {batch}"] = {
            "linear_latency_ratio_longest_vs_shortest": last["linear"]["ms_per_token"]
            / first["linear"]["ms_per_token"],
            "softmax_over_linear_at_longest": last["softmax"]["ms_per_token"] / last["linear"]["ms_per_token"],
        }
    print()
    for key, value in summary.items():
        print(
            f"{key}: linear ms/step at {args.contexts[-1]} / at {args.contexts[0]} = "
            f"{value['linear_latency_ratio_longest_vs_shortest']:.2f}x (target <= 1.2x); softmax / linear at "
            f"{args.contexts[-1]} = {value['softmax_over_linear_at_longest']:.1f}x (target >= 5x)"
        )
    path = write_json(args, "bench_generation", {"setup": title, "rows": rows, "summary": summary})
    png = plot(rows, args, title)
    print(f"wrote {path}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()

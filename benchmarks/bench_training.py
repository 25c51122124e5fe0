"""Decoder training throughput: tokens/s of one full training step, our decoder against GPT-2 and x-transformers at the
same width, depth, heads, feed-forward size, vocabulary and sequence length, measured in one run.

A step is `zero_grad`, a forward that returns the next-token loss, the backward and an AdamW step (`make_step`), each
contender in its library's default training call and activation (`BUILDERS`), fp32 parameters, tied embeddings, no
dropout, the same fixed random token ids. The contenders alternate step by step; the first `--warmup` steps are
dropped and medians reported. MFU: the FLOPs of one forward+backward (`count_flops`) / the median step time / the
FLOP/s of a large matmul in the same precision, measured in the same run (`result_rows`). `--contenders` runs some of
them; without GPT-2 the ratios to it say so.

    python benchmarks/bench_training.py                                # hidden 512, 8 layers, sequence 512, batch 4
    python benchmarks/bench_training.py --tiny                         # seconds: proves it works
    python benchmarks/bench_training.py --tiny --contenders "hfst decoder (softmax)"   # one of them (the tests run this)
    python benchmarks/bench_training.py --device cuda --dtype bfloat16 --seq_len 4096   # GPU step against GPT-2

Writes `<output_dir>/bench_training.json` and `.png` (the plot needs matplotlib: `pip install -e ".[bench]"`).
"""

import torch
import torch.nn.functional as F
from bench_common import (
    add_contenders_flag,
    base_parser,
    chosen_contenders,
    describe_machine,
    markdown_table,
    matmul_flops_per_second,
    not_run,
    optional_peer,
    pyplot,
    save_figure,
    setup_device,
    time_alternating,
    write_json,
)
from torch.utils import flop_counter

from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM

HFST_SOFTMAX = "hfst decoder (softmax)"
HFST_LINEAR = "hfst decoder (linear elu)"
HFST_LINEAR_EXP = "hfst decoder (linear exp)"
HFST_GELU = "hfst decoder (softmax, gelu_new)"
HFST_CHUNKED = "hfst decoder (softmax, chunked loss)"
GPT2 = "transformers GPT2LMHeadModel"
XTRANSFORMERS = "x-transformers decoder"
SKIPPED = "skipped (not installed)"


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _addmm_inplace_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs):
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


# ops FlopCounterMode does not know: the CPU attention kernels, counted with its formulas for the CUDA kernels, and
# the in-place addmm_ the chunked loss accumulates the output layer's weight gradient with
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    torch.ops.aten.addmm_: _addmm_inplace_flops,
}


def parse_args(argv=None):
    p = base_parser(__doc__)
    p.add_argument("--hidden_size", type=int, default=512)
    p.add_argument("--num_hidden_layers", type=int, default=8)
    p.add_argument("--num_attention_heads", type=int, default=8)
    p.add_argument("--intermediate_size", type=int, default=2048)
    p.add_argument("--vocab_size", type=int, default=33278)
    p.add_argument("--seq_len", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--matmul_size", type=int, default=4096, help="side of the square matmul that MFU is relative to")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    p.add_argument("--lm_loss_chunk_size", type=int, default=128, help="positions per chunk of the chunked loss")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: each forward under torch.autocast(dtype=torch.bfloat16), parameters fp32")  # fmt: skip
    add_contenders_flag(p, list(BUILDERS))
    args = p.parse_args(argv)
    args.contenders = chosen_contenders(p, args, list(BUILDERS))
    if args.tiny:
        args.hidden_size, args.num_hidden_layers, args.num_attention_heads, args.intermediate_size = 32, 2, 4, 64
        args.vocab_size, args.seq_len, args.batch_size, args.repeats, args.warmup = 100, 32, 2, 2, 1
        args.matmul_size = 512
    return args


def hf_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def build_hfst(args, **fields):
    """Our `TransformerDecoderForCausalLM`: ScaleNorm, sinusoidal positions, ReLU, softmax attention through SDPA
    (`attn_implementation="sdpa"`) unless `fields` say otherwise (linear attention in chunks of 64 tokens, GPT-2's
    gelu_new, `lm_loss_chunk_size`: the output layer and cross-entropy a chunk of positions at a time, without the
    full logits); transformers' loss of `labels=input_ids`, which also fills the `DynamicCache` `use_cache` asks for."""
    config = TransformerDecoderConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.seq_len,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        **fields,
    )
    model = TransformerDecoderForCausalLM(config)
    attention = model.config._attn_implementation
    if config.attention_type == "linear":
        attention = f"causal linear ({config.feature_map}, chunks of {config.linear_attention_chunk_size})"
    return model, hf_loss, attention


def build_gpt2(args):
    """transformers' `GPT2LMHeadModel`: LayerNorm, learned positions, gelu_new, `attn_implementation="sdpa"`; the same
    loss as ours."""
    transformers = optional_peer("transformers")
    if transformers is None:
        return None
    config = transformers.GPT2Config(
        vocab_size=args.vocab_size,
        n_positions=args.seq_len,
        n_embd=args.hidden_size,
        n_layer=args.num_hidden_layers,
        n_head=args.num_attention_heads,
        n_inner=args.intermediate_size,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=args.vocab_size - 1,  # GPT-2's 50256 is outside a smaller vocabulary
        eos_token_id=args.vocab_size - 1,
        attn_implementation="sdpa",
    )
    model = transformers.GPT2LMHeadModel(config)
    return model, hf_loss, model.config._attn_implementation


def build_x_transformers(args):
    """x-transformers' `TransformerWrapper` + `Decoder`: LayerNorm, learned positions, GELU, no biases in the attention
    projections, `attn_flash=True` (scaled_dot_product_attention); cross entropy of the shifted logits. None where
    `x_transformers` is not installed (`pip install -e ".[bench]"`): reported as skipped."""
    x_transformers = optional_peer("x_transformers")
    if x_transformers is None:
        return None
    model = x_transformers.TransformerWrapper(
        num_tokens=args.vocab_size,
        max_seq_len=args.seq_len,
        emb_dropout=0.0,
        tie_embedding=True,
        attn_layers=x_transformers.Decoder(
            dim=args.hidden_size,
            depth=args.num_hidden_layers,
            heads=args.num_attention_heads,
            attn_dim_head=args.hidden_size // args.num_attention_heads,  # its default is 64 whatever the width
            ff_mult=args.intermediate_size / args.hidden_size,  # inner width int(dim * mult)
            attn_flash=True,
            attn_dropout=0.0,
            ff_dropout=0.0,
        ),
    )

    def loss(model, ids):
        logits = model(ids)  # (b, n, vocab)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return model, loss, "sdpa (attn_flash)"


BUILDERS = {
    HFST_SOFTMAX: lambda args: build_hfst(args, attention_type="softmax"),
    HFST_CHUNKED: lambda args: build_hfst(args, attention_type="softmax", lm_loss_chunk_size=args.lm_loss_chunk_size),
    # GPT-2's activation instead of our ReLU: how much of a difference is the activation's
    HFST_GELU: lambda args: build_hfst(args, attention_type="softmax", hidden_act="gelu_new"),
    HFST_LINEAR: lambda args: build_hfst(args, attention_type="linear", feature_map="elu"),
    HFST_LINEAR_EXP: lambda args: build_hfst(args, attention_type="linear", feature_map="exp"),
    GPT2: build_gpt2,
    XTRANSFORMERS: build_x_transformers,
}


def make_step(model, loss_fn, ids, lr, dtype="float32"):
    """A training step (zero_grad, the loss's forward, backward, `torch.optim.AdamW` step) and its forward+backward
    alone; with `dtype="bfloat16"` the forward runs under bf16 autocast, as a mixed-precision loop does (on a GPU our
    linear attention then takes the fused Triton kernels)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    autocast = torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def forward_backward():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(model, ids)
        loss.backward()

    def step():
        forward_backward()
        optimizer.step()

    return step, forward_backward


def count_flops(forward_backward):
    """FLOPs of one forward+backward (untimed), `torch.utils.flop_counter`: matmuls and attention; causal attention is
    counted as full, the CPU attention kernels with the same formula as the CUDA ones (`CPU_ATTENTION_FLOPS`)."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
        forward_backward()
    return counter.get_total_flops()


def plot(rows, args, title):
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
    names = [r["contender"] for r in rows][::-1]
    values = [r["tokens_per_second"] or 0.0 for r in rows][::-1]
    bars = ax.barh(names, values, color="tab:blue")
    for bar, row in zip(bars, rows[::-1]):
        label = f" {row['tokens_per_second']:,.0f}" if row["status"] == "ok" else f" {row['status']}"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8)
    ax.set_xlabel("training tokens/s (median step; higher is better)")
    ax.set_xlim(0, 1.25 * max(values + [1.0]))
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, args, "bench_training", title)


def build_all(args, ids):
    """name -> (step, {"parameters", "attention", "flops_per_step"}) of each contender `--contenders` chose, in
    `BUILDERS`' order; None for a peer that is not installed."""
    built = {}
    for name in args.contenders:
        torch.manual_seed(0)
        made = BUILDERS[name](args)
        if made is None:
            built[name] = None
            continue
        model, loss_fn, attention = made
        model = model.to(args.device, torch.float32).train()
        step, forward_backward = make_step(model, loss_fn, ids.clone().to(args.device), args.lr, args.dtype)
        counts = {
            "parameters": sum(p.numel() for p in model.parameters()),  # shared (tied) tensors counted once
            "attention": attention,
            "flops_per_step": count_flops(forward_backward),
        }
        built[name] = step, counts
        print(f"{name}: {counts['parameters']:,} parameters, attention {attention}", flush=True)
    return built


def result_rows(built, timings, tokens, matmul):
    """The report's row of each contender of `build_all`: tokens/s, achieved FLOP/s and MFU of its median step (MFU
    relative to `matmul` FLOP/s), its tokens/s over GPT-2's (None where GPT-2 did not run); a skipped peer's says
    so."""
    rows = []
    for name, entry in built.items():
        if entry is None:
            rows.append({"contender": name, "status": SKIPPED, "tokens_per_second": None})
            continue
        counts, seconds = entry[1], timings[name]["median_s"]
        achieved = counts["flops_per_step"] / seconds
        rows.append(
            {
                "contender": name,
                "status": "ok",
                **counts,
                "ms_per_step": 1e3 * seconds,
                "samples_s": timings[name]["samples_s"],
                "tokens_per_second": tokens / seconds,
                "achieved_flops_per_second": achieved,
                "mfu": achieved / matmul,
            }
        )
    gpt2 = next((r["tokens_per_second"] for r in rows if r["contender"] == GPT2), None)
    for row in rows:
        row["ratio_to_gpt2"] = row["tokens_per_second"] / gpt2 if gpt2 and row["tokens_per_second"] else None
    return rows


HEADER = ["contender", "parameters", "ms/step", "tokens/s", "vs GPT-2", "GFLOP/step", "achieved GFLOP/s", "MFU"]


def table_rows(rows):
    """The cells of the table (`HEADER`): "-" for a ratio to a GPT-2 that was skipped, "GPT-2 not run" where
    `--contenders` left it out."""
    gpt2_run = any(r["contender"] == GPT2 for r in rows)
    table = []
    for r in rows:
        if r["status"] != "ok":
            table.append([r["contender"], r["status"]] + ["-"] * (len(HEADER) - 2))
            continue
        ratio = f"{r['ratio_to_gpt2']:.2f}x" if r["ratio_to_gpt2"] else "-" if gpt2_run else not_run("GPT-2")
        table.append(
            [
                r["contender"],
                f"{r['parameters']:,}",
                f"{r['ms_per_step']:.1f}",
                f"{r['tokens_per_second']:,.0f}",
                ratio,
                f"{r['flops_per_step'] / 1e9:.2f}",
                f"{r['achieved_flops_per_second'] / 1e9:.1f}",
                f"{100 * r['mfu']:.1f}%",
            ]
        )
    return table


def summarize(rows):
    """The targets' ratios to GPT-2 (None where either side did not run) and the lines that print them."""
    ratios = {r["contender"]: r["ratio_to_gpt2"] for r in rows}
    summary = {
        "hfst_softmax_over_gpt2_tokens_per_second": ratios.get(HFST_SOFTMAX),
        "target": 1.2,
        "hfst_chunked_loss_over_gpt2_tokens_per_second": ratios.get(HFST_CHUNKED),
    }
    lines = [f"{name} / GPT-2 tokens/s = {ratios[name]:.2f}x (target >= 1.2x)" for name in (HFST_SOFTMAX, HFST_CHUNKED)
             if ratios.get(name) is not None]
    for name, key, target in [(HFST_LINEAR, "elu", 1.5), (HFST_LINEAR_EXP, "exp", 1.3)]:  # GPU targets, bf16 at 4096
        ratio = ratios.get(name)
        summary[f"hfst_linear_{key}_over_gpt2_tokens_per_second"] = ratio
        if ratio is not None:
            lines.append(f"{name} / GPT-2 tokens/s = {ratio:.2f}x (target >= {target}x on a GPU, bf16, 4096 tokens)")
    return summary, lines


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    machine = describe_machine(args.device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=g)
    tokens = args.batch_size * args.seq_len

    built = build_all(args, ids)
    steps = {name: entry[0] for name, entry in built.items() if entry is not None}
    timings = time_alternating(steps, args.device, args.repeats, args.warmup)
    matmul = matmul_flops_per_second(args.device, size=args.matmul_size, dtype=getattr(torch, args.dtype))
    rows = result_rows(built, timings, tokens, matmul)

    setup = {
        "machine": machine,
        "device": args.device,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.num_attention_heads,
        "intermediate_size": args.intermediate_size,
        "vocab_size": args.vocab_size,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "tokens_per_step": tokens,
        "dtype": args.dtype,
        "autocast": args.dtype != "float32",
        "step": "zero_grad + forward with loss + backward + AdamW step",
    }
    title = (
        f"{machine} | hidden {args.hidden_size}, {args.num_hidden_layers} layers, {args.num_attention_heads} heads, "
        f"ff {args.intermediate_size}, vocab {args.vocab_size}, seq {args.seq_len}, batch {args.batch_size}, "
        + ("fp32" if args.dtype == "float32" else "bf16 autocast")
    )
    print(title)
    print(f"matmul {args.matmul_size}x{args.matmul_size} {args.dtype}: {matmul / 1e9:.1f} GFLOP/s (MFU denominator)")
    markdown_table(HEADER, table_rows(rows))
    params = [r["parameters"] for r in rows if r["status"] == "ok"]
    if params and max(params) > 1.1 * min(params):
        print(f"warning: parameter counts differ by more than 10% ({min(params):,} ... {max(params):,})")
    summary, lines = summarize(rows)
    for line in lines:
        print(line)
    payload = {"setup": setup, "matmul_flops_per_second": matmul, "rows": rows, "summary": summary}
    json_path = write_json(args, "bench_training", payload)
    png = plot(rows, args, title)
    print(f"wrote {json_path}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()

"""Language-model training throughput of every family at the `small` preset of train_lm.py: tokens/s of one training
step (zero_grad, forward with labels, backward, AdamW) with the full softmax output layer, the adaptive softmax
("adaptive"), or the adaptive softmax and an adaptive input embedding ("adaptive-in-out", Baevski & Auli 2019, same
clusters), in fp32 or under bf16 autocast, eager or `torch.compile`d, measured in one run.

The contenders alternate step by step on the same random token ids, medians after `--warmup` (which compiles); "% of
peak" is the step's FLOPs / its time / a matmul's FLOP/s (`step_flops`, `matmul_peak`). `--baseline DIR` also times
another checkout's package, imported beside this one (`load_baseline`; "vs baseline" below 1.00x is a slowdown).

    python benchmarks/bench_lm_step.py                                      # decoder and encoder, all variants
    python benchmarks/bench_lm_step.py --baseline /tmp/baseline --no_compile
    python benchmarks/bench_lm_step.py --tiny                               # seconds: proves it works (the tests run this)

Writes `<output_dir>/bench_lm_step.json`.
"""

import importlib.util
import sys
from pathlib import Path

import torch
from bench_common import base_parser, describe_machine, markdown_table, setup_device, time_alternating, write_json
from torch.utils import flop_counter
from transformers import AutoModelForCausalLM

import hf_settransformer as hfst
from hf_settransformer.toolkit.lm_arguments import FAMILY_PRESETS, FamilyPreset


HEADS = {  # name -> the adaptive layers it has
    "full": (),
    "adaptive": ("adaptive_softmax_cutoffs",),
    "adaptive-in-out": ("adaptive_softmax_cutoffs", "adaptive_input_cutoffs"),
}


def parse_args(argv=None):
    p = base_parser(__doc__)
    p.add_argument("--families", nargs="+", default=["decoder", "encoder"], choices=list(hfst.FAMILIES))
    p.add_argument("--attention_type", default="softmax", choices=["softmax", "linear"])
    p.add_argument("--feature_map", default="elu", choices=["elu", "exp"])
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_hidden_layers", type=int, default=4)
    p.add_argument("--vocab_size", type=int, default=33278)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--cutoffs", type=int, nargs="+", default=[2000, 10000], help="adaptive softmax/input clusters")
    p.add_argument("--heads", nargs="+", default=list(HEADS), choices=list(HEADS), help="input/output layers")
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile contenders")
    p.add_argument("--no_bf16", action="store_true", help="skip the bf16 contenders")
    p.add_argument("--baseline", type=Path, default=None,
                   help="a checkout of another commit: its hf_settransformer runs every contender too, alternating")
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden_size, args.num_hidden_layers, args.vocab_size, args.seq_len, args.batch_size = 32, 1, 500, 16, 2
        args.cutoffs, args.repeats, args.warmup, args.no_compile = [50, 200], 2, 1, True
    return args


def load_baseline(checkout):
    """The `hf_settransformer` package of another checkout, imported as `hfst_baseline` beside this tree's (its
    classes are other objects, so the Auto classes map each config class to its own model class)."""
    init = Path(checkout) / "hf_settransformer" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--baseline {checkout}: no hf_settransformer/__init__.py there (give a checkout of this "
                         "project, e.g. `git worktree add /tmp/baseline <commit>`).")
    spec = importlib.util.spec_from_file_location("hfst_baseline", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["hfst_baseline"] = module
    spec.loader.exec_module(module)
    return module


def build(family, head, args, package=hfst):
    fields = dict(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden_size,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attention_type=args.attention_type,
        feature_map=args.feature_map,
        max_position_embeddings=max(1024, args.seq_len),
        **{name: args.cutoffs for name in HEADS[head]},
    )
    family_preset = FAMILY_PRESETS.get(family, FamilyPreset())  # what train_lm.py's new config of the family needs
    fields.update(family_preset.fields)
    fields[family_preset.layers_field] = args.num_hidden_layers
    if hfst.FAMILIES[family].config_class().windowed_heads:
        fields.update(context_length=args.seq_len, target_length=args.seq_len // 2)
    fields.update({name: args.seq_len // 2 for name in family_preset.target_length_fields})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(package.FAMILIES[family].config_class()(**fields)).train()


def variants(args):
    """(head, bf16, compiled) of every contender of a family, as the flags choose them."""
    chosen = [(head, bf16, compiled) for head in args.heads for bf16 in (False, True) for compiled in (False, True)]
    return [v for v in chosen if not (args.no_compile and v[2]) and not (args.no_bf16 and v[1])]


def contender_name(family, head, bf16, compiled, prefix=""):
    return f"{prefix}{family} / {head} / {'bf16' if bf16 else 'fp32'}" + (" / compile" if compiled else "")


def make_step(model, ids, device, bf16, compiled):
    """One training step: zero_grad, the forward with labels, backward, AdamW. Its tokens are those fed to the model
    (batch x sequence): the decoder predicts every one of them, a many-target head its last `target_length` per window."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compiled else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()

    return step


def step_flops(model, ids, bf16, device):
    """The FLOPs of one forward+backward, counted by `torch.utils.flop_counter` (untimed)."""
    with flop_counter.FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def matmul_peak(device, bf16, size=2048, repeats=5):
    """The FLOP/s of a `size` x `size` matmul in the step's precision, measured in this run: "% of peak"'s peak."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    timing = time_alternating({"mm": lambda: a @ b}, device, repeats, 2)
    return 2 * size**3 / timing["mm"]["median_s"]


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    device = torch.device(args.device)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), device=device)
    chosen = variants(args)
    packages = {"": hfst, "baseline: ": load_baseline(args.baseline)} if args.baseline else {"": hfst}
    contenders, flops, parameters = {}, {}, {}
    for family in args.families:
        for head, bf16, compiled in chosen:
            for prefix, package in packages.items():
                name = contender_name(family, head, bf16, compiled, prefix)
                model = build(family, head, args, package).to(device)
                parameters[name] = sum(p.numel() for p in model.parameters())
                flops[name] = step_flops(model, ids, bf16, device)
                contenders[name] = make_step(model, ids, device, bf16, compiled)
    peaks = {bf16: matmul_peak(device, bf16) for bf16 in {v[1] for v in chosen}}
    timings = time_alternating(contenders, device, args.repeats, args.warmup)
    tokens = args.batch_size * args.seq_len
    rows, records = [], []
    for name, timing in timings.items():
        bf16 = "bf16" in name
        seconds = timing["median_s"]
        achieved = flops[name] / seconds
        family = name.split(" / ")[0]
        base = timings[f"{family} / {args.heads[0]} / fp32"]["median_s"]
        rows.append([name, f"{parameters[name] / 1e6:.2f}M", f"{seconds * 1000:.0f}", f"{tokens / seconds:,.0f}",
                     f"{base / seconds:.2f}x",
                     f"{achieved / 1e9:.1f}", f"{100 * achieved / peaks[bf16]:.1f}%"])
        if args.baseline:  # this tree's rows: the baseline's median step time / this one's
            baseline = "" if name.startswith("baseline: ") else timings["baseline: " + name]["median_s"]
            rows[-1].append(f"{baseline / seconds:.3f}x" if baseline else "")
        records.append({"contender": name, "parameters": parameters[name], "median_s": seconds,
                        "tokens_per_second": tokens / seconds,
                        "flops_per_step": flops[name], "achieved_flops": achieved, "peak_flops": peaks[bf16],
                        "samples_s": timing["samples_s"]})
    print(f"{describe_machine(device)}; batch {args.batch_size} x {args.seq_len} tokens, hidden {args.hidden_size}, "
          f"{args.num_hidden_layers} layers, vocabulary {args.vocab_size:,}, {args.attention_type} attention"
          f"{f' ({args.feature_map})' if args.attention_type == 'linear' else ''}; "
          f"matmul peak fp32 {peaks.get(False, 0) / 1e9:.0f} GFLOP/s, bf16 {peaks.get(True, 0) / 1e9:.0f} GFLOP/s")
    columns = ["contender", "parameters", "ms/step", "tokens/s", f"vs {args.heads[0]} fp32", "GFLOP/s", "% of peak"]
    columns += ["vs baseline"] if args.baseline else []
    markdown_table(columns, rows)
    write_json(args, "bench_lm_step", {"machine": describe_machine(device), "args": {**vars(args), "baseline": str(
        args.baseline) if args.baseline else None}, "results": records})


if __name__ == "__main__":
    main()

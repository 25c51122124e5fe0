"""One command, one GPU, one report: whether every model trains compiled on CUDA, the attention kernels against fla
and SDPA, training throughput and MFU against transformers' GPT-2, and decoding latency, in about 9 minutes.

Four sections, each with a time budget (`--<section>_budget_s`; the train grid runs last and takes the time the others
leave unused). A section that runs out stops cleanly and its table says which rows it did not reach; a benchmark
script, which cannot stop itself, is killed at most half its budget later. Every section runs in its own process
(sections 1 and 3 in this script's workers, `--worker`), so that a crash, a hang or a CUDA error costs a row or a
section and never the report:

1. train (190 s): every family (`hfst.FAMILIES`) x attention (softmax, linear elu, linear exp) x decay (none; and
   fixed and gated wherever the family's causal LM head takes `linear_attention_decay`: linear attention, a head that
   attends causally, as `decay.decay_applies` decides) builds as train_lm.py does (`new_config`, the `tiny`
   preset's widths, 128-token examples, vocabulary 1,000) and trains `--train_steps` steps of
   `torch.compile(model, fullgraph=True)` (a graph break: compiled again without fullgraph, which the table says),
   forward with labels, backward and fused AdamW, on one batch of random token ids, under bf16 autocast where the GPU
   has it. Per row: compiled or the error's first line, whether fullgraph held, first and last loss, the first step's
   seconds (compilation) and the median step after it. Rows run in `--train_workers` processes at once, so a row's
   ms/step is indicative only (`--train_workers 1` for clean ones).
2. attention (110 s): `bench_attention.py --device cuda --lengths 1024 4096 16384 --chunk_sweep --causal_only`:
   its causal and decayed contenders (SDPA causal, ours in PyTorch and Triton, fla's `chunk_linear_attn` and
   `chunk_simple_gla` where `fla` imports), forward+backward ms and peak MiB, and its targets.
3. throughput (180 s): the `gpu` preset (hidden 512, 8 layers, 8 heads, intermediate 2,048, context 512, batch 32,
   dense embedding and full softmax output) of the decoder with softmax and with causal linear elu, compiled and
   eager, beside `GPT2LMHeadModel` (attn_implementation sdpa; flash_attention_2 too where flash-attn imports) of the
   same width, depth, context, batch and vocabulary (33,278), compiled; and the linear elu decoder against GPT-2 at
   context 4,096, batch 4 (the same tokens per step). Alternated, medians after warm-up; MFU is the model FLOPs of
   PaLM's count (6N + 12LdK, `toolkit.language_modeling.lm_flops_per_token`; GPT-2 counted alike) over the GPU's
   dense peak at the precision (`toolkit.machine.GPU_PEAK_TFLOPS`: H100 SXM and H200 989.4, A100 312 TFLOPS bf16;
   another GPU: a measured 8192^3 matmul, said so). A missed target adds a `torch.profiler` table of the contender's
   10 costliest CUDA kernels.
4. decoding (55 s): `bench_generation.py --contexts 128 2048 --batch_sizes 1 --dtype bfloat16 --cache static
   --compile`: ms per generated token, eager, static cache, compiled (CUDA graphs).

    python benchmarks/gpu_report.py                   # one NVIDIA GPU, from the repository root: ~9 minutes
    python benchmarks/gpu_report.py --sections throughput --throughput_budget_s 400
    python benchmarks/gpu_report.py --dry_run         # seconds, on a CPU: every contender built on the meta device

Writes `results/gpu-<YYYY-MM-DD>-<gpu, e.g. h100>/` (`--output_dir`): README.md (the machine, the precision and one
table per section), report.json (every number), bench_attention.json/.png, bench_generation.json/.png and logs/ (each
process's output). Without CUDA (and without `--dry_run`) it writes nothing and exits with code 2; `--dry_run` writes
nothing unless given `--output_dir` (then a README that says it was a dry run).
"""

import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import torch
from bench_common import (
    describe_error, describe_machine, markdown_table, matmul_flops_per_second, sync, time_alternating, write_json,
    write_whole,
)
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import hf_settransformer as hfst
from hf_settransformer.attention import attention_kernel
from hf_settransformer.decay import DECAYS, decay_applies
from hf_settransformer.toolkit.language_modeling import lm_flops_per_token
from hf_settransformer.toolkit.lm_arguments import PRESETS, DataArguments, ModelArguments, new_config
from hf_settransformer.toolkit.machine import peak_flops

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {  # name -> (title, default budget in seconds): ~8.9 minutes, and the start and the writing
    "train": ("1. Every family x attention x decay trains compiled steps on CUDA", 190),
    "attention": ("2. Attention kernels against fla and SDPA", 110),
    "throughput": ("3. Training throughput and MFU", 180),
    "decoding": ("4. Decoding per token", 55),
}
ORDER = ("attention", "decoding", "throughput", "train")  # the run's order: the train grid takes what is left
ATTENTIONS = (("softmax", "elu"), ("linear", "elu"), ("linear", "exp"))
TRAIN_SHAPE = {"context": 128, "targets": 64, "batch": 8, "vocab": 1000}  # two chunks of the linear kernels
GPU_CONTEXT = PRESETS["gpu"]["context"]
GPU_BATCH = PRESETS["gpu"]["training"]["per_device_train_batch_size"]
LONG_CONTEXT = 4096
WIKITEXT_VOCAB = 33278  # WikiText-2's word vocabulary, as train_lm.py builds it
ATTENTION_LENGTHS = (1024, 4096, 16384)
DECODING_CONTEXTS = (128, 2048)
# what bench_generation.py reports with --cache static --compile (its `contenders`), and the models they use
DECODING_CONTENDERS = ("softmax", "linear", "softmax_static", "softmax_static_compiled", "linear_compiled")


# ------------------------------------------------------------------------------------------------ the contenders


@dataclass(frozen=True)
class TrainRow:
    """One row of section 1: a family's causal LM head with an attention and a decay."""

    family: str
    attention_type: str
    feature_map: str
    decay: str

    @property
    def attention(self):
        return "softmax" if self.attention_type == "softmax" else f"linear {self.feature_map}"

    @property
    def name(self):
        return f"{self.family} / {self.attention} / {self.decay}"


@dataclass(frozen=True)
class Contender:
    """One contender of section 3: our decoder at the gpu preset (`model` "softmax" or "linear", elu) or
    GPT2LMHeadModel (`model`: its attn_implementation), at `context` tokens with the gpu preset's tokens per step."""

    name: str
    model: str
    context: int
    compiled: bool
    needs: str | None = None  # a module it needs: without it the row says "<package> not installed"

    @property
    def batch(self):
        return GPU_BATCH * GPU_CONTEXT // self.context

    @property
    def ours(self):
        return self.model in ("softmax", "linear")


THROUGHPUT = (
    Contender("decoder softmax (gpu preset), compiled", "softmax", GPU_CONTEXT, True),
    Contender("decoder linear elu (gpu preset), compiled", "linear", GPU_CONTEXT, True),
    Contender("decoder softmax (gpu preset), eager", "softmax", GPU_CONTEXT, False),
    Contender("decoder linear elu (gpu preset), eager", "linear", GPU_CONTEXT, False),
    Contender("GPT-2 sdpa, compiled", "sdpa", GPU_CONTEXT, True),
    Contender("GPT-2 flash_attention_2, compiled", "flash_attention_2", GPU_CONTEXT, True, needs="flash_attn"),
    Contender(f"decoder linear elu, compiled, context {LONG_CONTEXT:,}", "linear", LONG_CONTEXT, True),
    Contender(f"GPT-2 sdpa, compiled, context {LONG_CONTEXT:,}", "sdpa", LONG_CONTEXT, True),
)
TARGETS = (  # (words, contender, reference, least speed-up: the reference's step time over the contender's)
    (f"gpu preset's compiled step >= 1.0x GPT-2's at {GPU_CONTEXT}", THROUGHPUT[0].name, THROUGHPUT[4].name, 1.0),
    (f"compiled causal linear elu step >= 1.3x GPT-2's at context {LONG_CONTEXT:,}", THROUGHPUT[6].name,
     THROUGHPUT[7].name, 1.3),
)


def build_order():
    """Section 3's contenders in the order they are built while the budget lasts: the eager ones (no compilation),
    the targets' contenders, the rest."""
    wanted = [name for _, contender, reference, _ in TARGETS for name in (reference, contender)]
    return sorted(THROUGHPUT, key=lambda c: (c.compiled, wanted.index(c.name) if c.name in wanted else len(wanted)))



def lm_config(family, attention_type, feature_map, decay, preset, length, targets=None, vocab_size=WIKITEXT_VOCAB):
    """The config train_lm.py gives a new `--family` model at `--preset` with these flags (`new_config`), examples of
    `length` tokens (the decoder's block, the heads' window) and `targets` predictions per window."""
    model_args = ModelArguments(family=family, attention_type=attention_type, feature_map=feature_map,
                                linear_attention_decay=decay, preset=preset)
    data_args = DataArguments(block_size=length, context_length=length, target_length=targets)
    return new_config(model_args, data_args, vocab_size, 0)


def train_config(row):
    s = TRAIN_SHAPE
    return lm_config(row.family, row.attention_type, row.feature_map, row.decay, "tiny", s["context"], s["targets"],
                     s["vocab"])


def takes_decay(family, attention_type, feature_map):
    """Whether the family's causal LM head takes `linear_attention_decay` with this attention: the kernel reads the
    field (linear attention) and the head attends causally (`decay.decay_applies`)."""
    if "linear_attention_decay" not in attention_kernel(attention_type).config_fields:
        return False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(train_config(TrainRow(family, attention_type, feature_map, "fixed")))
    return decay_applies("fixed", model.attends_causally)


def train_rows():
    """Section 1's rows: family x attention x decay ("none", and every other decay where the head takes one)."""
    decays = [name for name in DECAYS if name != "none"]
    rows = []
    for family in hfst.FAMILIES:
        for attention_type, feature_map in ATTENTIONS:
            extra = decays if takes_decay(family, attention_type, feature_map) else []
            rows += [TrainRow(family, attention_type, feature_map, decay) for decay in ["none", *extra]]
    return rows


def build_contender(contender):
    """Section 3's model of `contender` (on the default device): our decoder at the gpu preset, or GPT-2 with the
    same sizes, dropout and vocabulary."""
    torch.manual_seed(0)
    if contender.ours:
        return AutoModelForCausalLM.from_config(
            lm_config("decoder", contender.model, "elu", "none", "gpu", contender.context))
    ours = lm_config("decoder", "softmax", "elu", "none", "gpu", contender.context)
    config = GPT2Config(vocab_size=ours.vocab_size, n_positions=ours.max_position_embeddings, n_embd=ours.hidden_size,
                        n_layer=ours.num_hidden_layers, n_head=ours.num_attention_heads,
                        n_inner=ours.intermediate_size, resid_pdrop=ours.hidden_dropout_prob,
                        embd_pdrop=ours.hidden_dropout_prob, attn_pdrop=ours.attention_probs_dropout_prob,
                        bos_token_id=0, eos_token_id=0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=contender.model)
    # GPT2LMHeadModel's name names no loss: its `loss_function` then logs a warning on every call, which breaks the
    # compiled graph; the loss it falls back on, named
    model.loss_type = "ForCausalLM"
    return model


def flops_per_token(model, context):
    """Model FLOPs of training on one token, PaLM's 6N + 12LdK (`lm_flops_per_token`), GPT-2's counted alike: N without
    the position embedding (a lookup), the tied input embedding counted once, as the output layer's matmul."""
    if isinstance(model, GPT2LMHeadModel):
        config = model.config
        n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
        return 6 * n + 12 * config.n_layer * config.n_embd * context
    return lm_flops_per_token(model, context)[0]


def installed(module):
    return importlib.util.find_spec(module) is not None


# ------------------------------------------------------------------------------------------------ training steps


def training_step(model, ids, bf16, compiled=True, fullgraph=True):
    """fn() -> loss: zero_grad, the forward with labels (compiled: `torch.compile` of the model), backward, AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=ids.is_cuda)
    forward = torch.compile(model, fullgraph=fullgraph) if compiled else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def first_step(model, ids, bf16, compiled=True):
    """The step of `model` and its first call (which compiles): with fullgraph=True, and after a graph break compiled
    again without it -> (step, first loss, seconds of the first call, the break's first line or None)."""
    step = training_step(model, ids, bf16, compiled)
    start, broke = time.perf_counter(), None
    try:
        loss = step()
    except torch._dynamo.exc.Unsupported as error:  # a graph break: nothing was cached for it
        broke = describe_error(error)
        step = training_step(model, ids, bf16, compiled, fullgraph=False)
        loss = step()
    sync(ids.device)
    return step, loss, time.perf_counter() - start, broke


def train_one(row, steps, device, bf16):
    """Section 1's measurement of one row: `steps` compiled training steps on one batch of random ids."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(train_config(row)).to(device).train()
    s = TRAIN_SHAPE
    ids = torch.randint(0, s["vocab"], (s["batch"], s["context"]), device=device)
    step, loss, first_s, broke = first_step(model, ids, bf16)
    losses, seconds = [loss], []
    for _ in range(steps - 1):
        sync(device)
        start = time.perf_counter()
        losses.append(step())
        sync(device)
        seconds.append(time.perf_counter() - start)
    launches = fused_launches(step)
    losses = torch.stack(losses).float().tolist()
    steady = seconds[4:] or seconds or [float("nan")]  # past the steps that may still specialise or warm up
    return {"parameters": sum(p.numel() for p in model.parameters()), "fullgraph": "no" if broke else "yes",
            "graph_break": broke, "first_loss": losses[0], "last_loss": losses[-1], "losses": losses,
            "compile_s": first_s, "steady_ms": 1e3 * statistics.median(steady), "fused_launches": launches}


def fused_launches(step):
    """The fused linear-attention Triton kernels one call of the compiled `step` launches (`linear_triton._run`,
    called from the `torch.ops.hfst` ops a compiled graph holds): 0 where the PyTorch ops ran instead."""
    from hf_settransformer import linear_triton

    run, count = linear_triton._run, []

    def counted(*args, **kwargs):
        count.append(1)
        return run(*args, **kwargs)

    linear_triton._run = counted
    try:
        step()
    finally:
        linear_triton._run = run
    return len(count)


def release_memory():
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def top_kernels(step, device, count=10, steps=3):
    """The `count` CUDA kernels that took most GPU time over `steps` calls of `step` (torch.profiler): name, calls,
    ms and share of the kernels' time, per step."""
    from torch.profiler import ProfilerActivity, profile

    def gpu_time(event):  # microseconds; the attribute's name changed in torch 2.4
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0) or 0

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    events = [e for e in prof.key_averages() if gpu_time(e) > 0]
    total = sum(gpu_time(e) for e in events) or 1
    return [{"kernel": e.key, "calls_per_step": e.count / steps, "ms_per_step": gpu_time(e) / 1e3 / steps,
             "share": gpu_time(e) / total} for e in sorted(events, key=gpu_time, reverse=True)[:count]]


def target_results(medians):
    """Each target with its measured speed-up (None where a contender has no time) and whether it is met."""
    results = []
    for words, name, reference, least in TARGETS:
        ratio = medians[reference] / medians[name] if name in medians and reference in medians else None
        results.append({"target": words, "contender": name, "reference": reference, "least": least,
                        "ratio": ratio, "met": None if ratio is None else ratio >= least})
    return results


# ------------------------------------------------------------------------------------------------ worker processes


def emit(events, record):
    """One JSON line in the worker's events file, flushed: what the parent reads, even from a killed worker."""
    events.write(json.dumps(record, default=str) + "\n")
    events.flush()


def read_events(path):
    """The events a worker wrote (`emit`); a line cut short by a kill is left out."""
    events = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return events


def train_worker(args, events):
    """Section 1 in a process: `--rows` (indices of `train_rows()`) in turn, until `--deadline` would be passed."""
    rows, device, longest = train_rows(), torch.device("cuda"), 0.0
    for index in args.rows:
        if time.time() + longest > args.deadline:  # the next row would likely be killed: stop cleanly
            emit(events, {"event": "out_of_time"})
            return
        emit(events, {"event": "start", "row": index})
        start = time.time()
        try:
            result = {"status": "ok", **train_one(rows[index], args.train_steps, device, args.precision == "bf16")}
        except Exception as error:
            result = {"status": "failed", "error": describe_error(error),
                      "fullgraph": "yes" if isinstance(error, torch._dynamo.exc.BackendCompilerFailed) else None}
        longest = max(longest, time.time() - start)
        emit(events, {"event": "done", "row": index, "seconds": time.time() - start, **result})
        if "CUDA" in result.get("error", ""):  # the CUDA context may be lost: the next rows get a fresh process
            return
        release_memory()


def throughput_worker(args, events):
    """Section 3 in a process: build and compile the contenders while the budget allows, time them alternately,
    profile the contenders of a missed target."""
    device, bf16 = torch.device("cuda"), args.precision == "bf16"
    gpu = torch.cuda.get_device_name()
    peak, note = peak_flops(gpu, args.precision)
    if peak is None:
        dtype = torch.bfloat16 if bf16 else torch.float32
        peak = matmul_flops_per_second(device, size=8192, dtype=dtype)
        note = (f"{gpu} is not in the table of known peaks: measured, an 8192 x 8192 {args.precision} matmul "
                f"({peak / 1e12:,.1f} TFLOP/s)")
    emit(events, {"peak_flops": peak, "peak_note": note})
    steps, round_s, longest = {}, 0.0, 0.0
    for contender in build_order():
        record = {"contender": contender.name}
        if contender.needs and not installed(contender.needs):
            emit(events, {**record, "status": "not run", "error": f"{contender.needs.replace('_', '-')} not installed"})
            continue
        if time.time() + (longest if contender.compiled else 0) + 30 > args.deadline:  # 30 s: timing, profiles
            emit(events, {**record, "status": "not run", "error": "the section's time budget was spent"})
            continue
        start = time.time()
        try:
            model = build_contender(contender).to(device).train()
            ids = torch.randint(0, model.config.vocab_size, (contender.batch, contender.context), device=device)
            emit(events, {**record, "parameters": sum(p.numel() for p in model.parameters()),
                          "flops_per_step": flops_per_token(model, contender.context) * ids.numel()})
            step, loss, first_s, broke = first_step(model, ids, bf16, contender.compiled)
            sync(device)
            again = time.perf_counter()
            step()  # a recompilation, if any, happens here rather than in the timing
            sync(device)
            round_s += time.perf_counter() - again
            steps[contender.name] = step
            emit(events, {**record, "status": "ok", "first_step_s": first_s, "second_step_s": time.perf_counter()
                          - again, "first_loss": loss.item(),
                          "fullgraph": ("no" if broke else "yes") if contender.compiled else None,
                          "graph_break": broke})
        except Exception as error:
            emit(events, {**record, "status": "failed", "error": describe_error(error)})
            steps.pop(contender.name, None)
            torch.cuda.empty_cache()  # not torch._dynamo.reset(): the others' compiled code is kept
        if contender.compiled:
            longest = max(longest, time.time() - start)
    if not steps:
        return
    repeats = int(max(3, min(args.repeats, (args.deadline - time.time() - 20) / max(round_s, 1e-3) - 2)))
    try:
        timing = time_alternating(steps, device, repeats, warmup=2)
    except Exception as error:
        emit(events, {"timing_error": describe_error(error)})
        return
    for name, t in timing.items():
        emit(events, {"contender": name, "median_s": t["median_s"], "samples_s": t["samples_s"]})
    for target in target_results({name: t["median_s"] for name, t in timing.items()}):
        if target["met"] is False and time.time() + 10 < args.deadline:
            emit(events, {"contender": target["contender"], "top_kernels": top_kernels(steps[target["contender"]],
                                                                                      device)})


def worker(args):
    """A section's worker process (`--worker`): its events, one JSON line each, go to `--events`."""
    with open(args.events, "a") as events:
        {"train": train_worker, "throughput": throughput_worker}[args.worker](args, events)
    return 0


# ------------------------------------------------------------------------------------------------ subprocesses


def child_env(**extra):
    """The environment of a section's process: this checkout's package first on the path, unbuffered output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def launch(command, log_path, env=None):
    """Starts `command` from the repository root in its own session (killed with its compile workers), stdout and
    stderr to `log_path`."""
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        return subprocess.Popen(command, cwd=ROOT, env=env or child_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(process, deadline):
    """The exit code of `process`, or None where it was still running at `deadline` (then it is killed)."""
    try:
        return process.wait(timeout=max(0.1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def last_lines(path, count=3):
    lines = [line for line in Path(path).read_text(errors="replace").splitlines()
             if line.strip() and not line.startswith("$ ")]  # not the command (`launch`)
    return " / ".join(line.strip()[:200] for line in lines[-count:])


def ended(code, log):
    return "stopped at the section's time budget" if code is None else f"exit code {code}: {last_lines(log)}"


# ------------------------------------------------------------------------------------------------ the sections


def train_section(args, logs, soft, hard):
    """Section 1: the rows in `--train_workers` processes at once, started again for the rows left where one dies."""
    rows = train_rows()
    results, budget = {}, "the section's time budget was spent"
    if not installed("triton"):
        return [{**asdict(row), "row": row.name, "status": "not run",
                 "error": "triton not installed (torch.compile's inductor needs it on CUDA)"} for row in rows]
    pending = sorted(range(len(rows)), key=lambda i: rows[i].decay != "none")  # the undecayed rows first
    attempt = 0
    while pending and hard - time.time() > 15:
        count = min(args.train_workers, len(pending))
        threads = max(1, (os.cpu_count() or 1) // count)
        started = []
        for w in range(count):
            name = f"train-{attempt}-{w}"
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", "train", "--events",
                       str(logs / f"{name}.jsonl"), "--deadline", str(min(soft, hard - 5)), "--precision",
                       args.precision, "--train_steps", str(args.train_steps), "--rows", *map(str, pending[w::count])]
            env = child_env(TORCHINDUCTOR_COMPILE_THREADS=str(threads))
            started.append((launch(command, logs / f"{name}.log", env), name))
        out_of_time, progressed, codes = False, False, []
        for process, name in started:
            code = finish(process, hard)
            codes.append((code, logs / f"{name}.log"))
            begun = None
            for event in read_events(logs / f"{name}.jsonl"):
                if event["event"] == "start":
                    begun, progressed = event["row"], True
                elif event["event"] == "done":
                    results[event["row"]], begun = event, None
                elif event["event"] == "out_of_time":
                    out_of_time = True
            if begun is not None:  # the process was killed or died inside this row
                results[begun] = ({"status": "stopped", "error": "the section's time budget ran out during this row"}
                                  if code is None else {"status": "failed", "error": "the worker process died during "
                                                        f"this row: {ended(code, logs / f'{name}.log')}"})
        pending = [i for i in pending if i not in results]
        if not progressed and codes[0][0] is not None:
            budget = f"no worker process got to a row: {ended(*codes[0])}"
        if out_of_time or not progressed:
            break
        attempt += 1
    for i in pending:
        results[i] = {"status": "not run", "error": budget}
    return [{"row": row.name, **asdict(row), **{k: v for k, v in results[i].items() if k not in ("event", "row")}}
            for i, row in enumerate(rows)]


def throughput_section(args, logs, soft, hard):
    """Section 3: one worker process; its events merged per contender, the targets computed from its medians."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "throughput", "--events",
               str(logs / "throughput.jsonl"), "--deadline", str(min(soft, hard - 5)), "--precision",
               args.precision, "--repeats", str(args.repeats)]
    code = finish(launch(command, logs / "throughput.log"), hard)
    result = {"contenders": {c.name: {**asdict(c), "batch": c.batch} for c in THROUGHPUT}}
    if not installed("triton"):
        result["note"] = "triton not installed: torch.compile's inductor needs it on CUDA"
    for event in read_events(logs / "throughput.jsonl"):
        if "contender" in event:
            result["contenders"][event.pop("contender")].update(event)
        else:
            result.update(event)
    if code != 0:
        result["process"] = ended(code, logs / "throughput.log")
    for record in result["contenders"].values():
        record.setdefault("status", "not run")
        if record["status"] == "not run":
            record.setdefault("error", "the section's process ended before it (the note above)")
        if "median_s" in record:
            record["tokens_per_second"] = record["batch"] * record["context"] / record["median_s"]
            if result.get("peak_flops") and record.get("flops_per_step"):
                record["model_flops_per_second"] = record["flops_per_step"] / record["median_s"]
                record["mfu"] = record["model_flops_per_second"] / result["peak_flops"]
    medians = {name: r["median_s"] for name, r in result["contenders"].items() if "median_s" in r}
    result["targets"] = target_results(medians)
    return result


def benchmark_section(script, flags, args, out, logs, hard):
    """Sections 2 and 4: `benchmarks/<script>` with `flags`, its JSON written into the report's folder."""
    stem = script.removesuffix(".py")
    command = [sys.executable, str(ROOT / "benchmarks" / script), *flags, "--output_dir", str(out)]
    (out / f"{stem}.json").unlink(missing_ok=True)  # a former run's
    start = time.time()
    code = finish(launch(command, logs / f"{stem}.log"), hard)
    log = Path(logs / f"{stem}.log").read_text(errors="replace")
    result = {"command": "python " + shlex.join([f"benchmarks/{script}", *flags]), "exit_code": code,
              "seconds": time.time() - start, "printed": [line for line in log.splitlines() if line.startswith(
                  ("|", "n=", "batch ", "skipping "))]}
    if (out / f"{stem}.json").exists():  # bench_attention.py writes after each length: a stopped run keeps those
        result.update(json.loads((out / f"{stem}.json").read_text()))
    if code != 0:
        result["error"] = ended(code, logs / f"{stem}.log")
    return result


def attention_flags(args):
    dtype = "bfloat16" if args.precision == "bf16" else "float32"
    return ["--device", "cuda", "--lengths", *map(str, args.attention_lengths), "--dtype", dtype, "--repeats", "5",
            "--warmup", "2", "--chunk_sweep", "--causal_only"]


def decoding_flags(args):
    dtype = "bfloat16" if args.precision == "bf16" else "float32"
    return ["--contexts", *map(str, args.decoding_contexts), "--batch_sizes", "1", "--dtype", dtype, "--cache",
            "static", "--compile", "--steps", "20", "--warmup", "5"]


# ------------------------------------------------------------------------------------------------ the README


def number(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def train_lines(rows, args):
    shape = TRAIN_SHAPE
    at_once = (f"Rows ran in {args.train_workers} processes at once: their ms/step is indicative."
               if args.train_workers > 1 else "Rows ran one at a time.")
    lines = [f"{args.train_steps} steps of `torch.compile(model, fullgraph=True)`, forward with labels, backward, "
             f"fused AdamW, {args.precision}; the `tiny` preset's widths, {shape['batch']} x {shape['context']} random "
             f"ids (one batch: the loss should fall), vocabulary {shape['vocab']:,}. {at_once} A decay is tried where "
             "the head takes one (linear attention, a head that attends causally). Triton launches/step: the fused "
             "linear-attention kernels one compiled step ran (through the `torch.ops.hfst` ops; 0 for softmax).", ""]
    table = []
    for r in rows:
        if r["status"] == "ok":
            result = "ok" if r["last_loss"] < r["first_loss"] else "ok, **the loss did not fall**"
        else:
            result = f"**{r['status']}**: {r['error']}"
        fullgraph = r.get("fullgraph") or "-"
        if r.get("graph_break"):
            fullgraph = f"no ({r['graph_break']})"
        table.append([r["family"], r["attention_type"] if r["attention_type"] == "softmax" else
                      f"linear {r['feature_map']}", r["decay"], result, fullgraph,
                      number(r.get("first_loss"), 3), number(r.get("last_loss"), 3), number(r.get("compile_s")),
                      number(r.get("steady_ms"), 2), r.get("fused_launches", "-")])
    lines += markdown_table(["family", "attention", "decay", "result", "fullgraph", "first loss", "last loss",
                             "compile s (first step)", "steady ms/step", "Triton launches/step"], table)
    ok = sum(r["status"] == "ok" for r in rows)
    return lines + ["", f"{ok} of {len(rows)} rows trained."]


def cell(record, name):
    if "ms" in record:
        return f"{record['ms']:,.2f} ms, {record['peak_mib']:,.0f} MiB"
    if "failed" in record:
        return f"**failed**: {record['failed']}"
    why = record.get("skipped", "")
    if name.startswith("fla") and "not installed" in why:
        return "fla not installed"
    return f"skipped ({why})"


def attention_lines(result, args):
    lines = [f"`{result['command']}`: forward+backward, medians; peak memory beside each time. Its causal and decayed "
             "contenders (the non-causal ones are in bench_attention.json)" + (f"; {result['setup']}." if "setup" in
                                                                               result else "."), ""]
    if not result.get("rows"):
        return lines + [f"**Not measured**: bench_attention.py {result['error']}"]
    if "error" in result:
        lines += [f"**Stopped after n = {result['rows'][-1]['length']:,}**: bench_attention.py {result['error']}", ""]
    names = [name for name in result["rows"][0] if name != "length" and ("causal" in name or "decay" in name
                                                                         or name.startswith("fla"))]
    header = ["contender"] + [f"n = {r['length']:,}" for r in result["rows"]]
    lines += markdown_table(header, [[name] + [cell(r[name], name) for r in result["rows"]] for name in names])
    targets = result.get("summary", {}).get("lines", [])
    return lines + (["", "Its targets, as it printed them:", ""] + [f"- {line}" for line in targets] if targets else [])


def throughput_lines(result, args):
    lines = [f"One training step (zero_grad, forward with labels, backward, fused AdamW), {args.precision}; "
             f"{GPU_BATCH} x {GPU_CONTEXT} tokens per step ({LONG_CONTEXT // GPU_CONTEXT} times fewer sequences at "
             f"context {LONG_CONTEXT:,}); contenders alternated, medians after 2 warm-up rounds. MFU: model FLOPs "
             "(PaLM's 6N + 12LdK) per second over the peak: "
             f"{result.get('peak_note', 'no peak (the section ended before it)')}.", ""]
    for key in ("note", "process", "timing_error"):
        if result.get(key):
            lines += [f"**{key.replace('_', ' ')}**: {result[key]}.", ""]
    medians = {name: r.get("median_s") for name, r in result["contenders"].items()}
    gpt2 = {c.context: c.name for c in THROUGHPUT if c.model == "sdpa"}
    table = []
    for c in THROUGHPUT:
        r = result["contenders"][c.name]
        if "median_s" not in r:
            if "second_step_s" in r:  # built and stepped twice, then the section ended
                table.append([c.name, f"{c.context:,} x {c.batch}", f"{r['parameters'] / 1e6:.1f}M",
                              number(r["first_step_s"]), f"{1e3 * r['second_step_s']:,.1f} (one step, not timed "
                              "alternately: the budget ran out)"] + ["-"] * 4)
            else:
                table.append([c.name, f"{c.context:,} x {c.batch}", f"**{r['status']}**: {r.get('error')}"]
                             + ["-"] * 6)
            continue
        reference = medians.get(gpt2[c.context])
        table.append([c.name, f"{c.context:,} x {c.batch}", f"{r['parameters'] / 1e6:.1f}M",
                      number(r["first_step_s"]), number(1e3 * r["median_s"]), f"{r['tokens_per_second']:,.0f}",
                      f"{reference / r['median_s']:.2f}x" if reference else "-",
                      number(r.get("model_flops_per_second", 0) / 1e12), f"{100 * r['mfu']:.1f}%" if "mfu" in r
                      else "-"])
    lines += markdown_table(["contender", "context x batch", "parameters", "first step s (compile)", "ms/step",
                             "tokens/s", "vs GPT-2 sdpa (same context)", "model TFLOP/s", "MFU"], table)
    lines += ["", "Targets:", ""]
    lines += markdown_table(["target", "measured", "met"], [
        [t["target"], "-" if t["ratio"] is None else f"{t['ratio']:.2f}x",
         "not measured" if t["met"] is None else ("yes" if t["met"] else "**no**")] for t in result["targets"]])
    for name, r in result["contenders"].items():
        if r.get("top_kernels"):
            lines += ["", f"The 10 costliest CUDA kernels of {name} (torch.profiler, 3 steps):", ""]
            lines += markdown_table(["kernel", "calls per step", "ms per step", "share of kernel time"], [
                [k["kernel"][:100].replace("|", "/"), f"{k['calls_per_step']:g}", f"{k['ms_per_step']:.2f}",
                 f"{100 * k['share']:.1f}%"] for k in r["top_kernels"]])
    return lines


def decoding_lines(result, args):
    lines = [f"`{result['command']}`: ms per generated token at batch 1, medians"
             + (f"; {result['setup']}." if "setup" in result else "."), ""]
    if "rows" not in result:
        partial = [line for line in result["printed"] if line.startswith("|")]
        return lines + [f"**Not measured whole**: bench_generation.py {result['error']}"] + (
            ["", "What it printed before:", "", *partial] if partial else [])
    names = result["contenders"]
    lines += markdown_table(["context"] + [f"{n} ms/token" for n in names] + ["softmax cache MiB", "linear state MiB"],
                            [[f"{r['context']:,}"] + [f"{r[n]['ms_per_token']:.2f}" for n in names]
                             + [f"{r['softmax']['cache_mib']:.1f}", f"{r['linear']['cache_mib']:.3f}"]
                             for r in result["rows"]])
    targets = [line for line in result["printed"] if line.startswith("batch ")]
    return lines + ([""] + [f"- {line}" for line in targets] if targets else [])


SECTION_LINES = {"train": train_lines, "attention": attention_lines, "throughput": throughput_lines,
                 "decoding": decoding_lines}


# ------------------------------------------------------------------------------------------------ the machine


def version(distribution):
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def nvidia_smi():
    """(driver version, the driver's CUDA version), None where nvidia-smi does not say."""
    try:
        text = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return driver and driver.group(1), cuda and cuda.group(1)


def gpu_slug(name):
    """A folder name's GPU: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA GeForce RTX 4090" -> "rtx-4090"."""
    words = re.findall(r"[A-Za-z0-9]+", re.sub(r"\b(NVIDIA|GeForce|Tesla)\b", "", name))
    for i, word in enumerate(words):
        if any(ch.isdigit() for ch in word):
            prefix = words[i - 1] if i and words[i - 1].isalpha() and words[i - 1].isupper() else None
            return "-".join(filter(None, [prefix, word])).lower()
    return "-".join(words).lower() or "gpu"


def git(*words):
    """The output of `git words...` in the checkout, None where git or the checkout is missing."""
    try:
        done = subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine():
    """What the README's header and report.json say about where the numbers come from."""
    props = torch.cuda.get_device_properties(0)
    driver, driver_cuda = nvidia_smi()
    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += " with local changes"
    return {"gpu": torch.cuda.get_device_name(0), "gpu_memory_mib": props.total_memory // 2**20,
            "driver": driver, "driver_cuda": driver_cuda, "torch_cuda": torch.version.cuda,
            "cpu_cores": os.cpu_count(), "torch": torch.__version__, "triton": version("triton"),
            "transformers": version("transformers"), "fla": version("flash-linear-attention") if installed("fla")
            else None, "flash_attn": version("flash-attn") if installed("flash_attn") else None,
            "commit": commit, "machine": describe_machine("cuda")}


def header_lines(info, args, wall_s):
    def v(key):
        return info[key] or "**not installed**"

    precision = ("bf16 (autocast for training; bf16 inputs for the kernels and decoding)" if args.precision == "bf16"
                 else "fp32 (this GPU has no bf16)")
    machine = [["GPU", f"one {info['gpu']} ({info['gpu_memory_mib']:,} MiB), {info['cpu_cores']} CPU cores"],
               ["driver, CUDA", f"{info['driver'] or '?'}, CUDA {info['driver_cuda'] or '?'} (driver) / "
                                f"{info['torch_cuda']} (torch)"],
               ["torch", info["torch"]], ["triton", v("triton")], ["transformers", v("transformers")],
               ["fla", v("fla")], ["flash-attn", v("flash_attn")], ["precision", precision],
               ["code", info["commit"] or "not a git checkout"]]
    table = ["| what | which |", "|---|---|", *(f"| {what} | {which} |" for what, which in machine)]  # not printed
    return [f"# GPU report, {args.date}: one {info['gpu']}", "", *table, "",
            f"`{shlex.join(['python', 'benchmarks/gpu_report.py', *args.argv])}`, {wall_s:.0f} s "
            "in all. Every number is in report.json, each process's output in logs/; sections stop at their time "
            "budget, and their tables say what they did not reach.", ""]


# ------------------------------------------------------------------------------------------------ the dry run


def dry_run(args):
    """Every contender of the chosen sections built on the meta device (section 1's also run forward on one CPU
    sequence); what each section would run, in seconds. Nothing is written without --output_dir."""
    lines = ["# GPU report: dry run", "", "Nothing ran on a GPU: every contender was built on the meta device, and "
             "section 1's also ran a forward on one CPU sequence (our models read their ids back once a forward, "
             "which meta tensors cannot).", ""]
    for name, (title, _) in SECTIONS.items():
        if name in args.sections:
            lines += [f"## {title} ({getattr(args, f'{name}_budget_s')} s)", "", *DRY_RUNS[name](args), ""]
    total = sum(getattr(args, f"{name}_budget_s") for name in args.sections)
    lines += [f"Sections {', '.join(args.sections)}: {total} s of budgets in all, about {total + 20} s with the "
              "start and the writing."]
    print("\n".join(lines), flush=True)
    if args.output_dir:
        out = report_folder(args.output_dir, None)
        if out is None:
            print(f"--output_dir {args.output_dir} holds files already: nothing written.", file=sys.stderr)
            return 1
        out.mkdir(parents=True, exist_ok=True)
        write_whole(out / "README.md", "\n".join(lines) + "\n")
        print(f"wrote {out / 'README.md'} (a dry run)")
    return 0


def dry_train(args):
    rows = train_rows()
    lines = [f"{len(rows)} rows x {args.train_steps} compiled steps, in {args.train_workers} processes at once:", ""]
    for row in rows:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(train_config(row))
        lines.append(f"- {row.name}: {sum(p.numel() for p in model.parameters()):,} parameters on meta; "
                     f"{cpu_forward(row)}")
    return lines


def dry_attention(args):
    return [f"- python benchmarks/bench_attention.py {shlex.join(attention_flags(args))}: SDPA causal, ours causal "
            "elu and exp in PyTorch and Triton, without and with the fixed and gated decays; fla "
            f"{'installed' if installed('fla') else 'not installed here'}"]


def dry_throughput(args):
    lines = [f"- {c.name} ({c.context:,} x {c.batch}): {meta_contender(c)}" for c in THROUGHPUT]
    return lines + [f"- target: {words}" for words, *_ in TARGETS]


def dry_decoding(args):
    lines = [f"- python benchmarks/bench_generation.py {shlex.join(decoding_flags(args))}: "
             + ", ".join(DECODING_CONTENDERS)]
    for attention_type in ("softmax", "linear"):  # its two models (bench_generation.build)
        config = hfst.TransformerDecoderConfig(vocab_size=WIKITEXT_VOCAB, hidden_size=512, num_hidden_layers=8,
                                               num_attention_heads=8, attention_type=attention_type)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        lines.append(f"- its {attention_type} decoder: {sum(p.numel() for p in model.parameters()):,} parameters "
                     "on meta")
    return lines


DRY_RUNS = {"train": dry_train, "attention": dry_attention, "throughput": dry_throughput, "decoding": dry_decoding}


@torch.no_grad()
def cpu_forward(row):
    """Section 1's check on a CPU: one forward with labels of the row's model on one sequence (seconds for all)."""
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(train_config(row))
        ids = torch.randint(0, TRAIN_SHAPE["vocab"], (1, TRAIN_SHAPE["context"]))
        loss = model(input_ids=ids, labels=ids).loss
    except Exception as error:
        return f"**CPU forward failed**: {describe_error(error)}"
    return f"CPU forward ok (loss {loss.item():.2f})"


def meta_contender(contender):
    """Section 3's contender built on the meta device: its parameters and model FLOPs per step; GPT-2's forward with
    labels runs on meta tensors too (ours reads its ids back once per forward, which meta tensors cannot)."""
    if contender.needs and not installed(contender.needs):
        return f"{contender.needs.replace('_', '-')} not installed: its row will say so"
    with torch.device("meta"):
        model = build_contender(contender)
        ids = torch.zeros(contender.batch, contender.context, dtype=torch.long)
        flops = flops_per_token(model, contender.context) * ids.numel()
        ran = ""
        if not contender.ours:
            model(input_ids=ids, labels=ids)
            ran = "; its forward with labels ran on meta"
    return (f"{sum(p.numel() for p in model.parameters()):,} parameters on meta, {flops / 1e12:.2f} TFLOPs per step"
            f"{ran}{', compiled' if contender.compiled else ', eager'}")


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--output_dir", default=None, help="default: results/gpu-<YYYY-MM-DD>-<gpu> (the dry run: none)")
    p.add_argument("--dry_run", action="store_true", help="build every contender on the meta device, run nothing")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    for name, (title, budget) in SECTIONS.items():
        p.add_argument(f"--{name}_budget_s", type=int, default=budget, help=f"time budget of '{title}'")
    p.add_argument("--train_steps", type=int, default=30, help="compiled training steps per row of section 1")
    p.add_argument("--train_workers", type=int, default=6, help="section 1's rows in this many processes at once")
    p.add_argument("--repeats", type=int, default=10, help="section 3: timed rounds (fewer where the budget is short)")
    p.add_argument("--attention_lengths", type=int, nargs="+", default=list(ATTENTION_LENGTHS))
    p.add_argument("--decoding_contexts", type=int, nargs="+", default=list(DECODING_CONTEXTS))
    # a section's worker process (started by the report itself)
    p.add_argument("--worker", choices=["train", "throughput"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--events", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    p.add_argument("--precision", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.date = datetime.date.today().isoformat()
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    if args.dry_run:
        args.precision = "bf16"
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny models: more threads only wait on each other (and on a busy machine, much)
        try:
            return dry_run(args)
        finally:
            torch.set_num_threads(threads)
    if not torch.cuda.is_available():
        print("gpu_report.py needs an NVIDIA GPU, and torch.cuda.is_available() is False here: run it on a machine "
              "with one (a CUDA build of torch), or check it on a CPU with --dry_run. Nothing was written.",
              file=sys.stderr)
        return 2
    started = time.time()
    args.precision = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    info = machine()
    out = report_folder(args.output_dir, ROOT / "results" / f"gpu-{args.date}-{gpu_slug(info['gpu'])}")
    if out is None:
        print(f"--output_dir {args.output_dir} holds files already: give an empty or new folder (nothing of a "
              "report is written over another run's).", file=sys.stderr)
        return 1
    logs = out / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        (out / "README.md").write_text(f"# GPU report, {args.date}: running\n")
    except OSError as error:
        print(f"Cannot write the report to {out}: {error}", file=sys.stderr)
        return 1
    args.output_dir = str(out)
    print(f"{info['machine']}; {args.precision}; writing {out}", flush=True)
    chosen = [name for name in ORDER if name in args.sections]
    budgets = [getattr(args, f"{name}_budget_s") for name in chosen]
    sections, end, last = {}, time.time(), time.time() + sum(budgets)
    for i, name in enumerate(chosen):
        # a section stops starting new work at its planned end (time it leaves unused goes to the last one, the
        # train grid); one that cannot stop itself (a benchmark script) is killed at most half its budget later,
        # leaving each later section at least half of its own
        end += budgets[i]
        hard = min(end + budgets[i] / 2, last - sum(budgets[i + 1:]) / 2)
        print(f"\n## {SECTIONS[name][0]} (until {end - started:.0f} s)", flush=True)
        begun, result = time.time(), None
        try:
            result = run_section(name, args, out, logs, end, hard)
            lines = SECTION_LINES[name](result, args)
        except Exception as error:  # the report's own failure: said in its section, the others still run
            lines = [f"**The section failed**: {describe_error(error)}"]
        sections[name] = {"result": result, "lines": lines, "seconds": time.time() - begun,
                          "planned_end_s": end - started, "killed_at_s": hard - started}
        print("\n".join([line for line in lines if line.startswith("**")] + [f"({time.time() - begun:.0f} s)"]))
        write_report(args, info, sections, out, time.time() - started)
    readme = write_report(args, info, sections, out, time.time() - started)
    print(f"\nwrote {readme} and {out / 'report.json'} in {time.time() - started:.0f} s")
    return 0


def report_folder(given, default):
    """The folder a report goes to, never one that holds files already: `given` if empty or new (else None), or
    `default`, `default-2`, ... the first free one (a second run on one day and GPU keeps the first's)."""
    if given is not None:
        given = Path(given)
        return given if not given.exists() or not any(given.iterdir()) else None
    out, number = default, 1
    while out.exists() and any(out.iterdir()):
        number += 1
        out = default.with_name(f"{default.name}-{number}")
    return out


def run_section(name, args, out, logs, soft, hard):
    """One section, which stops starting new work at `soft` and is killed at `hard` (time.time() values)."""
    if name == "train":
        return train_section(args, logs, soft, hard)
    if name == "throughput":
        return throughput_section(args, logs, soft, hard)
    if name == "attention":
        return benchmark_section("bench_attention.py", attention_flags(args), args, out, logs, hard)
    return benchmark_section("bench_generation.py", decoding_flags(args), args, out, logs, hard)


def write_report(args, info, sections, out, wall_s):
    """README.md (the header, then each section run so far, in the sections' order) and report.json (the results,
    without the README's lines)."""
    lines = header_lines(info, args, wall_s)
    for name, (title, _) in SECTIONS.items():
        if name in sections:
            s = sections[name]
            lines += [f"## {title}", "", *s["lines"], "", f"(the section took {s['seconds']:.0f} s)", ""]
    write_whole(out / "README.md", "\n".join(lines))
    json_sections = {name: {k: v for k, v in s.items() if k != "lines"} for name, s in sections.items()}
    write_json(args, "report", {"machine": info, "wall_s": wall_s, "sections": json_sections})
    return out / "README.md"


if __name__ == "__main__":
    sys.exit(main())

"""Train a hf_settransformer language model on WikiText-2 with the transformers Trainer (and accelerate).

Any family (`decoder`, `encoder`, `set_transformer`, `perceiver_io`), softmax or linear attention. The decoder is a
causal LM over blocks of `--block_size` tokens; the other families use their `*ForNextTokenPrediction` head: by default
(`--next_token_mode many`) one pass over a window of `context_length` tokens predicts its last `target_length` tokens
(a bidirectional prefix, then causal targets; Perceiver IO as Perceiver AR), `--next_token_mode window` is the design
document's literal one-prediction-per-window model. The defaults are the tuned ones (README, "Tuning"): the command
below, as written, reproduces the README's numbers.

Run from the repository root. On this project's machines (no Hub access) WikiText-2 comes from local files:

    python scripts/train_lm.py --family decoder --attention_type linear \\
        --do_train --do_eval --do_predict \\
        --train_file ../shared/data/wikitext-2/wiki.train.tokens \\
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens \\
        --test_file ../shared/data/wikitext-2/wiki.test.tokens \\
        --output_dir outputs/decoder-linear --max_train_minutes 90

    # where the Hub is reachable, the same data through `datasets` (the default):
    python scripts/train_lm.py --family encoder --do_train --do_eval --do_predict --output_dir outputs/encoder \\
        --dataset_name wikitext --dataset_config_name wikitext-2-v1

    # data parallel: one process per GPU (--bf16 on GPUs that have it), or several CPU processes (gloo). With
    # accelerate 1.15, `--cpu` starts a single process whatever --num_processes says; torchrun-style processes
    # come from --multi_gpu, and the script moves them to the CPU when there is no GPU (or with --use_cpu true):
    accelerate launch --multi_gpu --num_processes 4 scripts/train_lm.py --preset base --bf16 ... --output_dir out
    accelerate launch --multi_gpu --num_processes 2 scripts/train_lm.py --preset tiny --use_cpu true ... --output_dir out

    # continue after a crash: the newest complete checkpoint in --output_dir
    python scripts/train_lm.py ... --resume_from_checkpoint true

    # publish: weights (safetensors), config with auto_map, modeling code, tokenizer, model card
    python scripts/train_lm.py ... --push_to_hub --hub_model_id you/wikitext2-decoder-linear

Every `TrainingArguments` flag works (defaults below where they differ from transformers'); `--do_train` trains,
`--do_eval` and `--do_predict` evaluate validation and test perplexity with the protocol of
`hf_settransformer.language_modeling` (every token scored once). `--precision auto` (default) trains under bf16
autocast where the CPU has bf16 instructions (avx512_bf16 or amx_bf16) or the GPU supports it, fp32 elsewhere.
`--max_train_minutes N` sets `max_steps` from a timed probe (so the learning-rate schedule ends on time), stops at N
minutes of training whatever happens (CPU-minutes of this process on CPU, wall minutes on a GPU: `--budget_clock`), and records the steps reached: `--max_steps <train_steps>` repeats the run by
step count. At the end the script prints a summary and writes `all_results.json` (with the CPU model, threads and
precision), the model, the tokenizer and a model card (README.md) to `--output_dir`.
"""

import copy
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import IntervalStrategy, SchedulerType

import hf_settransformer as hfst  # also registers the models with the Auto classes
from hf_settransformer.language_modeling import (
    BlockDataset,
    TargetWindowDataset,
    WindowDataset,
    build_word_tokenizer,
    evaluate_masked_stream,
    evaluate_stream,
    token_stream,
)
from hf_settransformer.training import (
    CompleteCheckpointCallback,
    TimeBudgetCallback,
    TimedEvalCallback,
    check_checkpoint_matches,
    checkpoint_step,
    lock_output_dir,
    resolve_resume,
    save_model_atomically,
    train_unless_finished,
    whole_run_train_loss,
    write_text_atomically,
)

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {name: family.model_type for name, family in hfst.FAMILIES.items()}  # --family -> model_type
# Named sizes. `small` is the size tuned for a 2-core CPU (README, "Tuning"); `base` is for a GPU. `context` is the
# decoder's block and the heads' window; the heads predict the last `targets` tokens of each window.
ADAPTIVE_CUTOFFS = [2000, 10000]  # WikiText-2: the 2,000 most frequent words cover ~80% of the tokens
PRESETS = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        context=16,
        targets=8,
        initializer_range=0.1,
    ),  # 0.02 suits widths in the hundreds; at 32 it learns slowly
    "small": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        context=128,
        targets=64,
        adaptive_softmax_cutoffs=ADAPTIVE_CUTOFFS,
    ),
    "base": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        intermediate_size=2048,
        context=256,
        targets=128,
        adaptive_softmax_cutoffs=ADAPTIVE_CUTOFFS,
    ),
}
FAMILY_PRESETS = {  # what a family needs besides the shared sizes
    "set_transformer": {"num_inducing_points": 16, "num_seeds": 1, "num_decoder_layers": 1},
    "perceiver_io": {"num_blocks": 1, "num_cross_attention_heads": 1, "output_query_type": "inputs"},
}
LOCAL_WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2"


@dataclass
class ModelArguments:
    family: str = field(default="decoder", metadata={"help": "Model family.", "choices": list(FAMILIES)})
    attention_type: str = field(
        default="softmax", metadata={"help": "softmax or linear", "choices": ["softmax", "linear"]}
    )
    feature_map: str = field(
        default="elu", metadata={"help": "linear attention feature map", "choices": ["elu", "exp"]}
    )
    preset: str = field(default="small", metadata={"help": "Named model size.", "choices": list(PRESETS)})
    next_token_mode: str = field(
        default="many",
        metadata={"help": "Heads: 'many' targets per window, or the literal one-target 'window'.",
                  "choices": ["many", "window"]},
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": 'Config fields to override, "k=v,k=v" (e.g. "hidden_size=256,pooling=mean").'}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Continue from a checkpoint (local folder or Hub id) instead of a new model."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Any tokenizer instead of the word-level one built from the training split."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Passed to from_pretrained for Hub checkpoints."})
    precision: str = field(
        default="auto",
        metadata={"help": "auto: bf16 autocast where the hardware has a fast path, else fp32.",
                  "choices": ["auto", "fp32", "bf16"]},
    )
    objective: str = field(
        default="next_token",
        metadata={"help": "next_token: causal LM (decoder) or next-token head; mlm: masked LM (encoder, perceiver_io; "
                  "the fill-mask pipeline), 15%% of each block masked (--mlm_probability).",
                  "choices": ["next_token", "mlm"]},
    )


@dataclass
class DataArguments:
    dataset_name: str | None = field(default="wikitext", metadata={"help": "A `datasets` name (needs the Hub)."})
    dataset_config_name: str | None = field(default="wikitext-2-v1", metadata={"help": "Its configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Plain text, one line per row (local data)."})
    validation_file: str | None = field(default=None, metadata={"help": "Plain text validation split."})
    test_file: str | None = field(default=None, metadata={"help": "Plain text test split."})
    block_size: int | None = field(
        default=None, metadata={"help": "Decoder: tokens per training block and evaluation window (preset default)."}
    )
    context_length: int | None = field(
        default=None, metadata={"help": "Next-token heads: tokens in each window (preset default)."}
    )
    target_length: int | None = field(
        default=None, metadata={"help": "Many-target heads: predictions per window (preset default)."}
    )
    eval_stride: int | None = field(default=None, metadata={"help": "Decoder evaluation stride (block_size // 2)."})
    mlm_probability: float = field(
        default=0.15, metadata={"help": "--objective mlm: share of each block's tokens masked (BERT's 0.15)."}
    )
    train_token_budget: int | None = field(
        default=None,
        metadata={"help": "Stop after this many input tokens have gone through the model (sets max_steps)."},
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={"help": "Training-time budget in minutes on --budget_clock (sets max_steps from a timed probe; "
                  "stops at it)."},
    )
    budget_clock: str = field(
        default="auto",
        metadata={
            "help": "What --max_train_minutes counts: 'cpu' (this process's CPU time, all threads: CPU-minutes, "
            "not inflated by other programs on the cores), 'wall' (elapsed), or 'auto' (cpu when training on CPU, "
            "wall on a GPU).",
            "choices": ["auto", "cpu", "wall"],
        },
    )
    targets_per_epoch: int | None = field(
        default=None,
        metadata={"help": "One-target heads: windows sampled per epoch (default: every training position once)."},
    )
    max_eval_tokens: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N tokens of each split only (quick runs)."}
    )
    periodic_eval_targets: int = field(
        default=4096,
        metadata={"help": "Validation tokens predicted by each evaluation during training (a quick estimate)."},
    )
    max_train_tokens: int | None = field(default=None, metadata={"help": "Use only the first N training tokens."})


@dataclass
class LMTrainingArguments(TrainingArguments):
    """`TrainingArguments` with the tuned defaults of this script (README, "Tuning"); every flag still works. The
    types are transformers' own, so the flags parse as they do everywhere."""

    learning_rate: float = field(default=2e-3, metadata={"help": "Peak AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    warmup_steps: float = field(default=0.02, metadata={"help": "Warm-up: steps, or a fraction of max_steps if < 1."})
    lr_scheduler_type: SchedulerType | str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Sequences per step and process."})
    per_device_eval_batch_size: int = field(default=32, metadata={"help": "Sequences per evaluation batch."})
    eval_strategy: IntervalStrategy | str = field(default="steps", metadata={"help": "Periodic validation loss."})
    eval_steps: float | None = field(default=250, metadata={"help": "Steps between periodic validations."})
    logging_steps: float = field(default=50, metadata={"help": "Steps between logged training losses."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept."})


# ----------------------------------------------------------------------------------------------------------- data


def load_splits(data_args):
    """-> {split: list of lines}. Local files when given, else `datasets.load_dataset(name, config)`."""
    import datasets

    files = {
        split: path
        for split, path in (
            ("train", data_args.train_file),
            ("validation", data_args.validation_file),
            ("test", data_args.test_file),
        )
        if path
    }
    if files:
        for split, path in files.items():
            if not Path(path).is_file():
                raise SystemExit(f"--{split}_file: no such file: {path}")
            if not Path(path).read_text(encoding="utf-8", errors="replace").strip():
                raise SystemExit(f"--{split}_file: {path} is empty (no text on any line).")
        raw = datasets.load_dataset("text", data_files=files)
    else:
        try:
            raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name)
        except Exception as err:  # offline, firewalled, unknown name: say what to do instead
            local = LOCAL_WIKITEXT if LOCAL_WIKITEXT.is_dir() else Path("path/to/wikitext-2")
            raise SystemExit(
                f"Could not load the dataset {data_args.dataset_name!r} ({data_args.dataset_config_name}) through "
                f"`datasets`: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}\n"
                "Without access to the Hugging Face Hub, pass the splits as local text files, e.g.\n"
                f"  --train_file {local}/wiki.train.tokens --validation_file {local}/wiki.valid.tokens "
                f"--test_file {local}/wiki.test.tokens"
            ) from None
    if "train" not in raw:
        raise SystemExit("A training split is needed: pass --train_file or a dataset with a 'train' split.")
    return {split: list(raw[split]["text"]) for split in raw}


# ----------------------------------------------------------------------------------------------------------- model


def parse_overrides(text, config_class):
    """'k=v,k=v' -> dict (JSON values, else strings); a key the config does not have is an error naming the nearest."""
    import difflib

    known = set(config_class().to_dict())
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise SystemExit(f'--config_overrides: expected "key=value", got {item!r}')
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SystemExit(f"--config_overrides: {config_class.__name__} has no field {key!r}{hint}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string such as pooling=mean
    return overrides


def build_model(model_args, data_args, vocab_size, eos_id):
    if model_args.model_name_or_path:
        if model_args.config_overrides:
            raise SystemExit("--config_overrides applies to new models, not to --model_name_or_path.")
        auto = AutoModelForMaskedLM if model_args.objective == "mlm" else AutoModelForCausalLM
        return auto.from_pretrained(model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code)
    preset = dict(PRESETS[model_args.preset])
    preset.pop("context")  # data_args.block_size / context_length already hold it
    targets = preset.pop("targets")
    cutoffs = preset.pop("adaptive_softmax_cutoffs", None)
    fields = dict(
        preset,
        **FAMILY_PRESETS.get(model_args.family, {}),
        vocab_size=vocab_size,
        attention_type=model_args.attention_type,
        feature_map=model_args.feature_map,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=eos_id,
    )
    if cutoffs and cutoffs[-1] < vocab_size:  # a tiny vocabulary (tests) keeps the full softmax
        fields["adaptive_softmax_cutoffs"] = cutoffs
    length = data_args.block_size if model_args.family == "decoder" else data_args.context_length
    fields["max_position_embeddings"] = max(length, 1024)
    if model_args.family != "decoder":
        fields.update(context_length=length, target_length=data_args.target_length or min(targets, length),
                      next_token_mode=model_args.next_token_mode)
    if model_args.family == "perceiver_io":
        fields["num_self_attends_per_block"] = fields.pop("num_hidden_layers")
        fields["num_latents"] = fields.get("target_length", targets)
    config_class = AutoConfig.for_model(FAMILIES[model_args.family]).__class__
    fields.update(parse_overrides(model_args.config_overrides, config_class))
    try:
        config = config_class(**fields)
    except ValueError as err:
        raise SystemExit(f"Invalid model configuration: {err}") from None
    if model_args.objective == "mlm":
        return AutoModelForMaskedLM.from_config(config)
    return AutoModelForCausalLM.from_config(config)


def is_masked_lm(model):
    return type(model).__name__.endswith("ForMaskedLM")


def example_length(model, data_args):
    if model.config.model_type == "hfst_decoder":
        return data_args.block_size
    return model.config.context_length


def training_dataset(model, stream, data_args, seed):
    config, length = model.config, example_length(model, data_args)
    if is_masked_lm(model):
        return BlockDataset(stream, length, labels=False)  # the collator masks and labels
    if config.model_type == "hfst_decoder":
        return BlockDataset(stream, length)
    if config.next_token_mode == "many":
        return TargetWindowDataset(stream, length, config.target_length)
    return WindowDataset(stream, length, data_args.targets_per_epoch, seed=seed)


# ----------------------------------------------------------------------------------------------------------- machine


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_fast_bf16():
    """bf16 matmuls are fast on CPUs with AVX512-BF16 or AMX (~4x fp32 here); without them ~300x slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def wants_bf16(model_args, training_args):
    """--precision bf16, or auto where the hardware has a fast bf16 path, unless --bf16/--fp16 was given already."""
    if training_args.bf16 or training_args.fp16:
        return False
    if model_args.precision == "bf16":
        return True
    if model_args.precision == "auto" and not training_args.use_cpu and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return model_args.precision == "auto" and cpu_has_fast_bf16()


def precision_name(trainer):
    """What the Trainer's accelerator actually runs: 'bf16', 'fp16' or 'fp32'."""
    mixed = trainer.accelerator.mixed_precision
    return "fp32" if mixed in (None, "no") else mixed


def probe_seconds_per_step(trainer, clock=time.perf_counter, steps=16):
    """Median seconds (on `clock`) of a training step (forward, backward, AdamW) on a copy of the model, after 4
    warm-up steps. (6 steps, the median of the last 4, overestimated the WikiText-2 runs' steps by ~15%: they stopped
    at 75 of 90 CPU-minutes.)"""
    model = copy.deepcopy(trainer.model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loader = trainer.get_train_dataloader()
    batches = iter(loader)
    device = trainer.args.device
    times = []
    for _ in range(steps):
        batch = {k: v.to(device) for k, v in next(batches).items()}
        start = clock()
        with trainer.autocast_smart_context_manager():
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(clock() - start)
    times = sorted(times[4:])
    return times[len(times) // 2]


def steps_for_budget(trainer, data_args, output_dir, is_main, timer):
    """max_steps for --max_train_minutes: stored in output_dir/time_budget.json so that a resumed run keeps it."""
    path = Path(output_dir) / "time_budget.json"
    if path.is_file():
        record = json.loads(path.read_text())
        if record.get("minutes") == data_args.max_train_minutes and record.get("clock", "wall") == timer.clock:
            return record["max_steps"]
    seconds = probe_seconds_per_step(trainer, timer.now)
    # periodic evaluations, logging and checkpoints take a few percent more than the steps themselves
    max_steps = max(1, int(data_args.max_train_minutes * 60 / (seconds * 1.05)))
    if is_main:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"minutes": data_args.max_train_minutes, "clock": timer.clock,
                                   "seconds_per_step": seconds, "max_steps": max_steps}))
        os.replace(tmp, path)
        print(f"[train_lm] time budget {data_args.max_train_minutes} {timer.clock} minutes: {seconds:.3f} s/step "
              f"-> max_steps={max_steps}")
    return max_steps


# ----------------------------------------------------------------------------------------------------------- evaluation


def evaluate_split(model, stream, data_args, accelerator, batch_size, eos_id, progress, tokenizer=None):
    """`evaluate_stream` (masked LMs: `evaluate_masked_stream`) on this process's share of the windows, sums reduced
    over the processes."""
    if is_masked_lm(model):
        metrics = evaluate_masked_stream(
            model, stream, model.config.context_length, tokenizer.mask_token_id, data_args.mlm_probability,
            batch_size=batch_size, special_ids=tokenizer.all_special_ids, progress=progress,
            rank=accelerator.process_index, world_size=accelerator.num_processes,
        )
        metrics["nll"], metrics["tokens"] = metrics["loss_sum"], metrics["tokens_scored"]
        return reduce_metrics(metrics, accelerator)
    metrics = evaluate_stream(
        model,
        stream,
        batch_size=batch_size,
        stride=data_args.eval_stride,
        block_size=data_args.block_size,
        eos_id=eos_id,
        progress=progress,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
    )
    return reduce_metrics(metrics, accelerator)


def reduce_metrics(metrics, accelerator):
    sums = torch.tensor([metrics["nll"], metrics["tokens"], metrics["correct"]], dtype=torch.float64)
    nll, count, correct = (float(x) for x in accelerator.reduce(sums.to(accelerator.device), reduction="sum"))
    return {"perplexity": math.exp(nll / count), "accuracy": correct / count, "tokens_scored": int(count), "nll": nll}


# ----------------------------------------------------------------------------------------------------------- card


def write_model_card(output_dir, model, model_args, data_args, training_args, results, command):
    from string import Template

    masked = is_masked_lm(model)
    template = Template((ROOT / "model_cards" / ("mlm_model_card.md" if masked else "lm_model_card.md")).read_text())
    family = model_args.family
    config = model.config
    card = template.safe_substitute(
        repo_id=training_args.hub_model_id or Path(output_dir).name,
        family=family,
        model_class=type(model).__name__,
        attention=config.attention_type
        + (f" ({config.feature_map} feature map)" if config.attention_type == "linear" else ""),
        attention_tag=config.attention_type if config.attention_type == "softmax" else f"linear-{config.feature_map}",
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        context=data_args.block_size if family == "decoder" else config.context_length,
        mlm_percent=f"{data_args.mlm_probability:.0%}",
        parameters=f"{results['parameters']:,}",
        vocab_size=config.vocab_size,
        val_ppl=f"{results['validation_perplexity']:.2f}",
        test_ppl=f"{results['test_perplexity']:.2f}",
        val_acc=f"{results['validation_accuracy']:.4f}",
        test_acc=f"{results['test_accuracy']:.4f}",
        train_tokens=f"{results['train_tokens']:,}",
        tokens_per_second=f"{results['train_tokens_per_second'] or float('nan'):,.0f}",
        wall_time=f"{results['wall_time_seconds'] / 60:.1f} min",
        design=card_design(config, family, masked),
        output_layer=(
            f"adaptive softmax (Grave et al. 2017), clusters {config.adaptive_softmax_cutoffs}, div value "
            f"{config.adaptive_softmax_div_value}; the logits are log-probabilities"
            if config.adaptive_softmax_cutoffs
            else "a vocabulary projection" + (" tied to the input embedding" if config.tie_word_embeddings else "")
        ),
        protocol=results["eval_protocol"],
        cpu_model=results["cpu_model"],
        threads=results["threads_per_process"],
        precision=results["precision"],
        cpu_minutes="unknown" if results["train_cpu_minutes"] is None else f"{results['train_cpu_minutes']:.1f}",
        train_steps=f"{results['train_steps']:,}",
        command=command,
        config_json=json.dumps({k: v for k, v in config.to_diff_dict().items() if k not in ("auto_map",)}, indent=2),
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        device=results["device"],
    )
    write_text_atomically(Path(output_dir) / "README.md", card)


def card_design(config, family, masked=False):
    if masked:
        return ("Masked LM: every position of a block is read bidirectionally and predicts its own token; during "
                "training 15% of the tokens are chosen (BERT: 80% replaced by `<mask>`, 10% by a random word, 10% "
                "kept)" + (", Perceiver IO with one output query per input position" if family == "perceiver_io"
                           else "") + ".")
    if family == "decoder":
        return "Causal LM: the decoder predicts every next token of its block."
    if config.next_token_mode == "window":
        return (f"Next-token head, one prediction per window: the last {config.context_length} tokens go through the "
                "stack, attention pooling (PMA, Lee et al. 2019) reads them and predicts the next token.")
    return (f"Next-token head with many targets per window: a window of {config.context_length} tokens predicts the "
            f"next token at each of its last {config.target_length} positions in one pass; the positions before "
            "them are a prefix read bidirectionally (encoder, Set Transformer) or through a causal cross-attention "
            "(Perceiver IO as Perceiver AR), and one attention-pooling query per target (the PMA seed plus that "
            "position's state) reads the states up to it. No prediction sees its own target or a later token.")


# ----------------------------------------------------------------------------------------------------------- main


def parse_arguments(argv):
    parser = HfArgumentParser((ModelArguments, DataArguments, LMTrainingArguments))
    if argv is None and len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        return (*parser.parse_json_file(json_file=os.path.abspath(sys.argv[1])), " ".join(sys.argv[1:]))
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "python scripts/train_lm.py " + " ".join(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        command = f"accelerate launch --multi_gpu --num_processes {os.environ['WORLD_SIZE']} " + command[7:]
        if not torch.cuda.is_available() and "--use_cpu" not in argv:
            argv += ["--use_cpu", "true"]  # several processes and no GPU: data parallel on CPUs (gloo)
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if wants_bf16(model_args, training_args):
        # through the parser: TrainingArguments sets up mixed precision in __post_init__ (setting .bf16 later does not)
        extra = ["--bf16", "true"]
        if not torch.cuda.is_available() and not training_args.use_cpu:
            extra += ["--use_cpu", "true"]  # transformers accepts CPU bf16 (autocast) only with use_cpu
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv + extra)
    return model_args, data_args, training_args, command


def check_arguments(data_args, training_args):
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size != launched:
        raise SystemExit(
            f"{launched} processes were launched but they are not connected (world size {training_args.world_size}): "
            "on CPUs launch with `accelerate launch --multi_gpu --num_processes N scripts/train_lm.py ... --use_cpu true`."
        )
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise SystemExit("Nothing to do: pass --do_train, --do_eval (validation) and/or --do_predict (test).")
    for name in ("block_size", "context_length", "target_length", "train_token_budget", "eval_stride"):
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name} must be a positive integer, got {value}.")
    if data_args.max_train_minutes is not None and not 0 < data_args.max_train_minutes < float("inf"):
        raise SystemExit(f"--max_train_minutes must be a positive number, got {data_args.max_train_minutes}.")
    if data_args.max_train_minutes and (training_args.max_steps > 0 or data_args.train_token_budget):
        raise SystemExit(
            "--max_train_minutes sets max_steps from the budget: pass it or --max_steps / --train_token_budget, not both."
        )


def main(argv=None):
    model_args, data_args, training_args, command = parse_arguments(argv)
    check_arguments(data_args, training_args)
    if model_args.objective == "mlm" and model_args.family not in ("encoder", "perceiver_io"):
        raise SystemExit(
            f"--objective mlm needs a family with a masked-LM head: --family encoder or perceiver_io, not "
            f"{model_args.family} (the decoder is causal; the Set Transformer has no order to fill in)."
        )
    if not 0 < data_args.mlm_probability < 1:
        raise SystemExit(f"--mlm_probability must be in (0, 1), got {data_args.mlm_probability}.")
    # this run owns --output_dir until it exits: a second run on the folder stops here, naming this one
    lock = lock_output_dir(training_args, command, script="train_lm")  # noqa: F841 (held until the process ends)
    transformers.logging.set_verbosity_warning()
    set_seed(training_args.seed)
    wall_start = time.time()
    is_main = training_args.process_index == 0
    say = print if is_main else (lambda *a, **k: None)

    # data and tokenizer
    splits = load_splits(data_args)
    preset = PRESETS[model_args.preset]
    data_args.block_size = data_args.block_size or preset["context"]
    data_args.context_length = data_args.context_length or preset["context"]
    if data_args.eval_stride is not None and data_args.eval_stride >= data_args.block_size:
        raise SystemExit(
            f"--eval_stride ({data_args.eval_stride}) must be smaller than --block_size ({data_args.block_size}): a "
            "window predicts its tokens after the first from the ones before them, so it can add at most block_size - 1 "
            "scored tokens; a longer stride would skip tokens, and the protocol scores every token once."
        )
    if model_args.tokenizer_name or model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    else:
        tokenizer = build_word_tokenizer(splits["train"])
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos_id is None:
        raise SystemExit("The tokenizer has no eos token: it is needed to end every line.")
    streams = {split: token_stream(lines, tokenizer, eos_id) for split, lines in splits.items()}
    if "validation" not in streams and training_args.do_eval:
        if "--do_eval" in command.split():
            raise SystemExit("--do_eval needs a validation split: pass --validation_file (or a dataset with one).")
        # do_eval was only implied by the periodic evaluation (TrainingArguments sets it from eval_strategy)
        say("[train_lm] no validation split: no periodic or final evaluation (pass --validation_file for them)")
        training_args.do_eval = False
        training_args.eval_strategy = transformers.IntervalStrategy.NO
    if "test" not in streams and training_args.do_predict:
        raise SystemExit("--do_predict needs a test split: pass --test_file (or a dataset with one).")
    if data_args.max_train_tokens:
        streams["train"] = streams["train"][: data_args.max_train_tokens]
    say(f"[train_lm] vocabulary {len(tokenizer):,}; tokens: " + ", ".join(f"{k} {len(v):,}" for k, v in streams.items()))

    # model and examples
    model = build_model(model_args, data_args, len(tokenizer), eos_id)
    if model.config.vocab_size < len(tokenizer):
        raise SystemExit(
            f"The model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)})."
        )
    tokenizer.model_max_length = example_length(model, data_args)
    is_decoder = model.config.model_type == "hfst_decoder"
    masked = is_masked_lm(model)
    length = example_length(model, data_args)
    try:
        train_dataset = training_dataset(model, streams["train"], data_args, training_args.seed)
        eval_dataset = None
        if "validation" in streams:
            val = streams["validation"][: data_args.periodic_eval_targets + length]
            eval_dataset = training_dataset(model, val, data_args, training_args.seed)
    except ValueError as err:
        flag = "--block_size" if is_decoder else "--context_length / --target_length"
        raise SystemExit(
            f"Cannot make training examples: {err} (--train_file, or the validation file for the periodic evaluation, "
            f"is shorter than one example of {length} tokens: pass more text or a smaller {flag}.)"
        ) from None
    # The Trainer's own push uploads at every save, training_args.bin (a pickle) included: push() uploads the final
    # folder instead, safetensors, JSON, code and text only.
    push_requested, training_args.push_to_hub = training_args.push_to_hub, False
    per_step = training_args.per_device_train_batch_size * training_args.world_size
    per_step *= training_args.gradient_accumulation_steps * length
    if data_args.train_token_budget:
        training_args.max_steps = max(1, data_args.train_token_budget // per_step)
    parameters = sum(p.numel() for p in model.parameters())

    resume = resolve_resume(training_args) if training_args.do_train else None
    if resume:
        check_checkpoint_matches(resume, model)
    clock = data_args.budget_clock
    if clock == "auto":
        clock = "cpu" if training_args.device.type == "cpu" else "wall"
    timed = TimedEvalCallback(resume_from=resume, clock=clock)
    callbacks = [CompleteCheckpointCallback(timed), timed]
    budget = None
    if data_args.max_train_minutes:
        budget = TimeBudgetCallback(data_args.max_train_minutes, timed)
        callbacks.append(budget)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        # masked LM: BERT's masking (80% mask token, 10% random, 10% kept) of --mlm_probability of the tokens
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)
        if masked
        else None,
        callbacks=callbacks,
    )
    precision = precision_name(trainer)
    if budget is not None and training_args.do_train:
        trainer.args.max_steps = steps_for_budget(trainer, data_args, training_args.output_dir, is_main, timed)
    say(
        f"[train_lm] {type(model).__name__}: {parameters:,} parameters, {len(train_dataset):,} training examples"
        f" of {length} tokens, max_steps={trainer.args.max_steps}, {precision}, {torch.get_num_threads()} threads"
    )
    results = {
        "family": model_args.family,
        "objective": "mlm" if masked else "next_token",
        "attention": model.config.attention_type,
        "feature_map": model.config.feature_map,
        "preset": model_args.preset,
        "next_token_mode": getattr(model.config, "next_token_mode", None) if not (is_decoder or masked) else None,
        "adaptive_softmax_cutoffs": model.config.adaptive_softmax_cutoffs,
        "parameters": parameters,
        "cpu_model": cpu_model(),
        "threads_per_process": torch.get_num_threads(),
        "precision": precision,
        "torch_compile": bool(training_args.torch_compile),
    }
    if training_args.do_train:
        results.update(train(trainer, resume, timed, budget, per_step, data_args))
    results.update(final_evaluation(trainer, streams, data_args, training_args, eos_id, is_decoder, tokenizer))
    results.update(
        wall_time_seconds=time.time() - wall_start,
        device=f"{trainer.accelerator.device} x {training_args.world_size}",
        eval_protocol=(
            f"blocks of {length}, {data_args.mlm_probability:.0%} of each block's tokens masked (fixed positions) "
            "and predicted from the rest"
            if masked
            else f"sliding window {length}, stride {data_args.eval_stride or max(length // 2, 1)}"
            if is_decoder
            else (
                f"windows of {length}, the last {model.config.target_length} positions scored"
                if model.config.next_token_mode == "many"
                else f"every position, up to {length} preceding tokens"
            )
        ),
        validation_curve=timed.points,
    )
    check_replicas(trainer, results)
    if trainer.is_world_process_zero():
        write_text_atomically(Path(training_args.output_dir) / "all_results.json", json.dumps(results, indent=2))
        card = "test_perplexity" in results and "validation_perplexity" in results and "train_tokens" in results
        if card:
            write_model_card(
                training_args.output_dir, trainer.model, model_args, data_args, training_args, results, command
            )
        summary = {k: results[k] for k in results if k.endswith(("perplexity", "accuracy", "per_second", "seconds"))}
        print("[train_lm] " + json.dumps({**summary, "parameters": parameters}, indent=1))
        wrote = "the model, tokenizer, all_results.json" if training_args.do_train else "all_results.json"
        print(f"[train_lm] wrote {wrote}{' and the model card README.md' if card else ''} to {training_args.output_dir}"
              + ("" if card else " (the model card needs a trained model and validation and test results)"))
        write_text_atomically(Path(training_args.output_dir) / "training_args.json", training_args.to_json_string())
        if push_requested:
            push(training_args)
    trainer.accelerator.wait_for_everyone()
    return results


def train(trainer, resume, timed, budget, per_step, data_args):
    """Trains (or resumes), saves the model and returns the training half of the results."""
    train_start = time.time()
    resumed_from = checkpoint_step(resume) if resume else 0
    process_loss = train_unless_finished(trainer, resume)
    train_seconds = time.time() - train_start
    save_model_atomically(trainer)  # model, config with auto_map, modeling code, tokenizer; never half-written
    steps_done = trainer.state.global_step - resumed_from
    train_loss = whole_run_train_loss(trainer.state.log_history, resumed_from, process_loss, steps_done)
    # training time of the whole run on the timer's clock, across resumes (None: resumed from a checkpoint that did not
    # record it); on the "cpu" clock it is CPU-seconds of each process, on "wall" elapsed seconds
    whole_seconds = timed.elapsed() if timed.before is not None or not resume else None
    tokens = trainer.state.global_step * per_step
    trainer.save_state()
    world = trainer.args.world_size
    threads = torch.get_num_threads() * world
    if whole_seconds is None:
        cpu_minutes = None
    else:
        cpu_minutes = whole_seconds / 60 * (world if timed.clock == "cpu" else threads)
    return dict(
        train_loss=train_loss,
        train_perplexity=math.exp(train_loss),
        train_steps=trainer.state.global_step,
        max_steps=trainer.args.max_steps,
        train_tokens=tokens,
        train_examples=tokens // (per_step // (trainer.args.per_device_train_batch_size * trainer.args.world_size
                                               * trainer.args.gradient_accumulation_steps)),
        # this process's rate: tokens per elapsed second
        train_tokens_per_second=steps_done * per_step / train_seconds if steps_done else None,
        train_seconds=train_seconds,
        resumed_from_step=resumed_from or None,
        budget_clock=timed.clock,
        train_seconds_whole_run=whole_seconds,
        train_cpu_minutes=cpu_minutes,
        max_train_minutes=data_args.max_train_minutes,
        stopped_by_time_budget=budget is not None and budget.stopped_at_step is not None,
    )


def final_evaluation(trainer, streams, data_args, training_args, eos_id, is_decoder, tokenizer=None):
    """Validation (--do_eval) and test (--do_predict) with the protocol, on every process (windows are split)."""
    results = {}
    # in fp32 whatever the training precision: accelerate wraps a trained model's forward in autocast, which a run
    # that resumes after its last checkpoint (and so never trains) would not have: the perplexity must not depend on it
    model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    batch = training_args.per_device_eval_batch_size * (1 if is_decoder else 2)
    is_main = training_args.process_index == 0
    for split, wanted in (("validation", training_args.do_eval), ("test", training_args.do_predict)):
        if wanted and split not in streams:
            raise SystemExit(
                f"No {split} split: pass --{split}_file or drop --do_{'eval' if split == 'validation' else 'predict'}."
            )
        if not wanted:
            continue
        stream = streams[split][: data_args.max_eval_tokens] if data_args.max_eval_tokens else streams[split]
        if is_main and training_args.disable_tqdm:  # no bar: say what the evaluation is doing
            print(f"[train_lm] evaluating {split}: {len(stream):,} tokens, protocol of the README")
        began = time.time()
        bar = f"[train_lm] {split}" if is_main and not training_args.disable_tqdm else None
        metrics = evaluate_split(model, stream, data_args, trainer.accelerator, batch, eos_id, bar, tokenizer)
        metrics["seconds"] = time.time() - began
        if is_main:
            print(f"[train_lm] {split} perplexity {metrics['perplexity']:.2f} ({metrics['seconds']:.0f} s)")
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
    return results


def check_replicas(trainer, results):
    """Data-parallel replicas must hold the same weights: one checksum per process."""
    model = trainer.model
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    results["replica_checksums"] = [float(c) for c in trainer.accelerator.gather(checksum.to(trainer.accelerator.device))]
    if len(set(results["replica_checksums"])) != 1:
        raise RuntimeError(f"Data-parallel replicas disagree: weight checksums {results['replica_checksums']}")


def push(training_args):
    """Upload the final folder (weights, config with auto_map, modeling code, tokenizer, model card, results and the
    training arguments as JSON) to the Hub; nothing that is a pickle."""
    from huggingface_hub import HfApi

    repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
    api = HfApi(token=training_args.hub_token)
    api.create_repo(repo_id, private=bool(training_args.hub_private_repo), exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=training_args.output_dir,
        commit_message="hf_settransformer: trained model, tokenizer and model card",
        # no pickles (training_args.bin, optimizer states): training_args.json holds the arguments
        # nor the run's lock and temporary files
        ignore_patterns=["checkpoint-*", "incomplete-*", "runs/*", "*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle",
                         ".hfst_run.lock", ".tmp-*", ".*.tmp-*"],
    )
    print(f"[train_lm] pushed to {repo_id}: {getattr(info, 'commit_url', info)}")


if __name__ == "__main__":
    main()

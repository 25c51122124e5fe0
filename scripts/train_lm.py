"""Train a hf_settransformer language model on WikiText-2 with the transformers Trainer (and accelerate).

Any family (`--family decoder|encoder|set_transformer|perceiver_io`), softmax or linear attention: the decoder as a
causal LM over blocks of `--block_size` tokens, the others through their `*ForNextTokenPrediction` head
(`--next_token_mode many`: a window's last `target_length` tokens after a bidirectional prefix; `window`: one
prediction per window). Every `TrainingArguments` flag works; the script adds presets (`--preset auto`: `small` on a
CPU, `gpu`, untuned, on CUDA), a time budget that sets `max_steps` (`--max_train_minutes`), `--precision`, the
evaluation protocol of `toolkit.language_modeling` for `--do_eval`/`--do_predict`, and writes the model, the
tokenizer, `all_results.json` and a model card to `--output_dir`. From the repository root (the defaults are the
tuned ones, docs/results.md):

    python scripts/train_lm.py --family decoder --attention_type linear --do_train --do_eval --do_predict \\
        --train_file ../shared/data/wikitext-2/wiki.train.tokens \\
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens \\
        --test_file ../shared/data/wikitext-2/wiki.test.tokens \\
        --output_dir outputs/decoder-linear --max_train_minutes 90

Several processes or GPUs (`accelerate launch`), resuming, publishing and every default: docs/training.md.
"""

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    HfArgumentParser,
    set_seed,
)
from transformers.trainer_utils import IntervalStrategy, SchedulerType

import hf_settransformer as hfst
from hf_settransformer.toolkit import (  # importing hf_settransformer registers the models with the Auto classes
    CheckedTrainingArguments,
    build_word_tokenizer,
    check_flags,
    evaluate_perplexity,
    evaluation_protocol,
    lm_training_dataset,
    log_to_stdout,
    objective_of,
    push_folder_to_hub,
    resolve_resume,
    timed_callbacks,
    token_stream,
    train_and_measure,
    write_lm_model_card,
)
from hf_settransformer.toolkit.budget import max_steps_for_budget
from hf_settransformer.toolkit.cards import data_file_record
from hf_settransformer.toolkit.language_modeling import lm_flops_per_token
from hf_settransformer.toolkit.measure import (
    PerplexityLoggingTrainer,
    fast_bf16_available,
    gpu_training_defaults,
    model_flops_utilization,
    replica_checksums,
    run_environment,
    sharding_of,
    tokens_per_step,
)
from hf_settransformer.toolkit.objectives import MLM_PROBABILITY, auto_class_for_flag, example_length, lm_objectives
from hf_settransformer.toolkit.run_folder import (
    check_checkpoint_matches,
    check_output_dir,
    check_resume_checkpoint,
    lock_output_dir,
    write_text_atomically,
)
from hf_settransformer.toolkit.training import check_pretrained_name, load_pretrained, parse_flags

ROOT = Path(__file__).resolve().parents[1]
logger = transformers.utils.logging.get_logger("hf_settransformer.scripts")
FAMILIES = {name: family.model_type for name, family in hfst.FAMILIES.items()}  # --family -> model_type
# Named sizes. `small` is the size tuned for a 2-core CPU (docs/tuning.md); `base` was the first guess for a GPU and
# overfits WikiText-2 (the `gpu` presets replace it there; CHANGELOG.md). `context` is the
# decoder's block and the heads' window; the heads predict the last `targets` tokens of each window. Other keys are
# config fields (`--config_overrides` wins over them), and `training` holds `TrainingArguments` defaults that apply
# where the command does not set the flag.
# Adaptive softmax and adaptive input (docs/design.md); WikiText-2: the 2,000 most frequent words cover ~80% of
# the tokens. `--config_overrides adaptive_input_cutoffs=null` gives back the dense embedding.
ADAPTIVE_CUTOFFS = [2000, 10000]
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
        adaptive_input_cutoffs=ADAPTIVE_CUTOFFS,
    ),
    "base": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        intermediate_size=2048,
        context=256,
        targets=128,
        adaptive_softmax_cutoffs=ADAPTIVE_CUTOFFS,
        adaptive_input_cutoffs=ADAPTIVE_CUTOFFS,
    ),
    # The GPU presets: INITIAL VALUES, UNTUNED. No GPU was available to tune them (the 10-GPU-minute
    # sweep is still to run). Dense embedding and full softmax: the adaptive layers save CPU time on the 33k-word
    # output layer, and their data-dependent cluster selection syncs with the host. WikiText-2 has 2M training tokens,
    # so a GPU run is bound by overfitting: more dropout and weight decay than on the CPU.
    "gpu": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        intermediate_size=2048,
        context=512,
        targets=256,
        hidden_dropout_prob=0.3,
        training=dict(per_device_train_batch_size=32, learning_rate=1e-3, warmup_steps=0.05, weight_decay=0.1),
    ),
    "gpu-small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        context=512,
        targets=256,
        hidden_dropout_prob=0.2,
        training=dict(per_device_train_batch_size=32, learning_rate=1.5e-3, warmup_steps=0.05, weight_decay=0.1),
    ),
}
UNTUNED_PRESETS = ("gpu", "gpu-small")  # said at the start of a run and in --help
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
    preset: str = field(
        default="auto",
        metadata={
            "help": "Named model size (a GPU preset also sets batch size, learning rate, warm-up and weight decay "
            "where those flags are not given, and dropout unless --config_overrides does). auto: small on a CPU "
            "(tuned), gpu on CUDA. The gpu and gpu-small presets hold initial values, untuned (no GPU was available "
            "to tune them).",
            "choices": ["auto", *PRESETS],
        },
    )
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
                  "choices": sorted({objective.flag for objective in lm_objectives().values()})},
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
        default=MLM_PROBABILITY,
        metadata={"help": "--objective mlm: share of each block's tokens masked (BERT's 0.15)."},
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
            "not inflated by time-sharing the cores), 'wall' (elapsed), or 'auto' (cpu when training on CPU, "
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
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace the run already in --output_dir (its checkpoints, weights and results are removed "
                  "first). Without it such a folder is refused unless --resume_from_checkpoint continues it."},
    )


@dataclass
class LMTrainingArguments(CheckedTrainingArguments):
    """`TrainingArguments` with the tuned defaults of this script (docs/tuning.md); every flag still works. The
    types are transformers' own, so the flags parse as they do everywhere."""

    learning_rate: float = field(
        default=2e-3,
        metadata={"help": "Peak AdamW learning rate (the gpu presets' own where not given; with more than 4 processes "
                  "times sqrt(processes / 4), untuned)."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    warmup_steps: float = field(default=0.02, metadata={"help": "Warm-up: steps, or a fraction of max_steps if < 1."})
    lr_scheduler_type: SchedulerType | str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    per_device_train_batch_size: int = field(
        default=16,
        metadata={"help": "Sequences per step and process: the global batch is this times the processes (the gpu "
                  "presets' own where not given)."},
    )
    per_device_eval_batch_size: int = field(
        default=32,
        metadata={"help": "Sequences per evaluation batch, periodic and final (64 on CUDA where not given)."},
    )
    eval_strategy: IntervalStrategy | str = field(default="steps", metadata={"help": "Periodic validation loss."})
    eval_steps: float | None = field(default=250, metadata={"help": "Steps between periodic validations."})
    logging_steps: float = field(default=50, metadata={"help": "Steps between logged training losses."})
    save_steps: float = field(default=250, metadata={"help": "Steps between checkpoints (a periodic validation each)."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept (and the best one)."})
    load_best_model_at_end: bool | None = field(
        default=None,
        metadata={
            "help": "Finish with the checkpoint of the lowest periodic validation loss, not the last one (early "
            "stopping: at a fixed time budget the faster models overfit for longer). Default: on whenever every "
            "checkpoint has a validation (same strategy, save steps a multiple of eval steps), else off."
        },
    )

    def __post_init__(self):
        if self.load_best_model_at_end is None:
            self.load_best_model_at_end = best_checkpoint_possible(self)
        super().__post_init__()


def best_checkpoint_possible(args):
    """Whether every checkpoint of `args` comes with a periodic validation (what `load_best_model_at_end` needs)."""
    save = str(getattr(args.save_strategy, "value", args.save_strategy))
    evaluate = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    if save != evaluate or save == "no":
        return False
    if save != "steps":
        return True
    steps = args.eval_steps or args.logging_steps  # transformers' fallback for eval_steps
    return save == "steps" and args.save_steps >= 1 and steps >= 1 and args.save_steps % steps == 0


# ----------------------------------------------------------------------------------------------------------- data


def check_text_file(flag, path):
    """Refuses a file that is empty, binary (NUL bytes) or not UTF-8, naming `flag`, the file and the first bad byte
    (`datasets` fails on the last two with a `DatasetGenerationError` that names neither)."""
    data = Path(path).read_bytes()
    nul = data.find(b"\0")
    if nul >= 0:
        raise SystemExit(f"{flag}: {path} is a binary file (a NUL byte at offset {nul:,}), not text.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SystemExit(
            f"{flag}: {path} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start:,} (line {line}) "
            "cannot be decoded. Convert it first, e.g. `iconv -f latin1 -t utf-8`."
        ) from None
    if not text.strip():
        raise SystemExit(f"{flag}: {path} is empty (no text on any line).")


def data_files(data_args):
    """{split: path} of the local text files given (--train_file, --validation_file, --test_file)."""
    files = (("train", data_args.train_file), ("validation", data_args.validation_file), ("test", data_args.test_file))
    return {split: path for split, path in files if path}


def check_inputs(model_args, data_args, training_args):
    """Refuses, naming the flag, what the run would read and cannot: a data file that is missing, a folder or not
    text; a --model_name_or_path whose config does not load; a --tokenizer_name or --resume_from_checkpoint that is no
    folder (nor Hub id). Called before the output folder is made, so that such a run leaves nothing behind."""
    for split, path in data_files(data_args).items():
        if Path(path).is_dir():
            raise SystemExit(f"--{split}_file: {path} is a folder; pass a text file.")
        if not Path(path).is_file():
            raise SystemExit(f"--{split}_file: no such file: {path}")
        check_text_file(f"--{split}_file", path)
    if model_args.model_name_or_path:  # its config: a folder or Hub repo that holds a model (the weights load later)
        load_pretrained("--model_name_or_path", model_args.model_name_or_path, AutoConfig.from_pretrained,
                        trust_remote_code=model_args.trust_remote_code)
    if model_args.tokenizer_name:
        check_pretrained_name("--tokenizer_name", model_args.tokenizer_name)
    check_resume_checkpoint(training_args)


def load_splits(data_args):
    """-> {split: list of lines}. Local files when given (checked by `check_inputs`), else
    `datasets.load_dataset(name, config)`."""
    import datasets

    files = data_files(data_args)
    if files:
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
    """'k=v,k=v' -> dict (JSON values, else strings; commas inside [...] belong to a list value, e.g.
    adaptive_input_cutoffs=[2000,10000]); a key the config does not have is an error naming the nearest."""
    import difflib

    known = set(config_class().to_dict())
    overrides = {}
    for item in filter(None, re.split(r",(?![^\[]*\])", text or "")):
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
    """The model of --model_name_or_path, or a new one of --family at --preset with --config_overrides."""
    auto = auto_class_for_flag(model_args.objective)
    if model_args.model_name_or_path:
        if model_args.config_overrides:
            raise SystemExit("--config_overrides applies to new models, not to --model_name_or_path.")
        model = load_pretrained("--model_name_or_path", model_args.model_name_or_path, auto.from_pretrained,
                                trust_remote_code=model_args.trust_remote_code)
    else:
        model = auto.from_config(new_config(model_args, data_args, vocab_size, eos_id))
    if model.config.vocab_size < vocab_size:
        raise SystemExit(
            f"The model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's ({vocab_size})."
        )
    if model_args.model_name_or_path and model_args.tokenizer_name and model.config.vocab_size != vocab_size:
        # a tokenizer of another vocabulary: every embedding row would now stand for another word
        raise SystemExit(
            f"--tokenizer_name {model_args.tokenizer_name} has {vocab_size:,} tokens but the model "
            f"({model_args.model_name_or_path}) was trained with a vocabulary of {model.config.vocab_size:,}: its "
            "embedding rows stand for that tokenizer's words. Use the model's own tokenizer (leave out "
            "--tokenizer_name), or train a new model with this tokenizer (leave out --model_name_or_path)."
        )
    return model


def new_config(model_args, data_args, vocab_size, eos_id):
    """The config of a new --family model: the preset's sizes, the data's lengths, then --config_overrides."""
    preset = dict(PRESETS[model_args.preset])
    preset.pop("context")  # data_args.block_size / context_length already hold it
    preset.pop("training", None)  # TrainingArguments defaults, applied by parse_arguments
    targets = preset.pop("targets")
    adaptive = {name: preset.pop(name) for name in ("adaptive_softmax_cutoffs", "adaptive_input_cutoffs")
                if name in preset}
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
    # a tiny vocabulary (tests) keeps the full softmax and embedding
    fields.update({name: cutoffs for name, cutoffs in adaptive.items() if cutoffs[-1] < vocab_size})
    config_class = AutoConfig.for_model(FAMILIES[model_args.family]).__class__
    # a causal LM reads its whole input (blocks of --block_size); the families with window heads, windows
    length = data_args.context_length if config_class.windowed_heads else data_args.block_size
    fields["max_position_embeddings"] = max(length, 1024)
    if config_class.windowed_heads:
        fields.update(context_length=length, target_length=data_args.target_length or min(targets, length),
                      next_token_mode=model_args.next_token_mode)
    if model_args.family == "perceiver_io":
        fields["num_self_attends_per_block"] = fields.pop("num_hidden_layers")
        fields["num_latents"] = fields.get("target_length", targets)
    fields.update(parse_overrides(model_args.config_overrides, config_class))
    try:
        return config_class(**fields)
    except ValueError as err:
        raise SystemExit(f"Invalid model configuration: {err}") from None


def describe_model(model, model_args):
    """The head of all_results.json: family, objective, attention, preset, design and output layer."""
    config, objective = model.config, objective_of(model)
    return {"family": model_args.family, "objective": objective.flag,
            "attention": config.attention_type, "feature_map": config.feature_map, "preset": model_args.preset,
            "next_token_mode": objective.next_token_mode,
            "adaptive_softmax_cutoffs": config.adaptive_softmax_cutoffs,
            "adaptive_input_cutoffs": config.adaptive_input_cutoffs}


def describe_training(model, training_args, length):
    """The sizes and hyper-parameters a tuning table compares (all_results.json `hyperparameters`)."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_self_attends_per_block", None)
    return {
        "hidden_size": config.hidden_size,
        "layers": layers,
        "dropout": config.hidden_dropout_prob,
        "attention_dropout": config.attention_probs_dropout_prob,
        "sequence_length": length,
        "target_length": getattr(config, "target_length", None) if config.windowed_heads else None,
        "examples_per_step": tokens_per_step(training_args, length) // length,
        "learning_rate": training_args.learning_rate,
        "weight_decay": training_args.weight_decay,
        "warmup_steps": training_args.warmup_steps,
        "lr_scheduler_type": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
    }


def load_data(model_args, data_args, training_args, command, say):
    """-> (tokenizer, eos id, {split: token stream}); without a validation split the periodic evaluation is turned off
    (an explicit --do_eval is an error), without a test split --do_predict is."""
    splits = load_splits(data_args)
    if model_args.tokenizer_name or model_args.model_name_or_path:
        flag = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
        tokenizer = load_pretrained(flag, model_args.tokenizer_name or model_args.model_name_or_path,
                                    AutoTokenizer.from_pretrained)
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
        training_args.load_best_model_at_end = False  # no validation to choose a checkpoint by
    if "test" not in streams and training_args.do_predict:
        raise SystemExit("--do_predict needs a test split: pass --test_file (or a dataset with one).")
    if data_args.max_train_tokens:
        streams["train"] = streams["train"][: data_args.max_train_tokens]
    counts = ", ".join(f"{k} {len(v):,}" for k, v in streams.items())
    say(f"[train_lm] vocabulary {len(tokenizer):,}; tokens: {counts}")
    return tokenizer, eos_id, streams


def training_datasets(model, streams, data_args, seed):
    """The training examples and the periodic evaluation's (the first --periodic_eval_targets validation tokens)."""
    length = example_length(model, data_args.block_size)
    validation = streams.get("validation")
    periodic = None if validation is None else validation[: data_args.periodic_eval_targets + length]
    datasets = []
    for stream, source in ((streams["train"], "train"), (periodic, "validation")):
        try:
            datasets.append(None if stream is None else lm_training_dataset(
                model, stream, data_args.block_size, data_args.targets_per_epoch, seed=seed))
        except ValueError as err:
            flag = objective_of(model).length_flags
            if source == "train" and data_args.max_train_tokens:
                what = f"--max_train_tokens {data_args.max_train_tokens} keeps"
            elif source == "train":
                what = "--train_file holds"
            else:
                what = "the validation file (for the periodic evaluation) holds"
            raise SystemExit(
                f"Cannot make {source} examples: {err} ({what} fewer tokens than one example of {length}: pass more "
                f"text or a smaller {flag}.)"
            ) from None
    return datasets


def wants_bf16(model_args, training_args):
    """--precision bf16, or auto where the hardware has a fast bf16 path, unless --bf16/--fp16 was given already."""
    if training_args.bf16 or training_args.fp16:
        return False
    if model_args.precision == "bf16":
        return True
    return model_args.precision == "auto" and fast_bf16_available(training_args.use_cpu)


def model_flops(trainer, model, tokens_per_second, precision, length):
    """all_results.json's model FLOPs: per training token (`lm_flops_per_token`, examples of `length` tokens), per
    wall second (`tokens_per_second`: training tokens per wall second) and the MFU against the GPU's dense peak at the
    training `precision` (`model_flops_utilization`; None on a CPU or a GPU the table does not know, with the reason in
    `mfu_note`). Training time includes the periodic evaluations, checkpoint saves and, with torch_compile,
    compilation: the MFU of the steps alone is higher."""
    flops, formula = lm_flops_per_token(model, length)
    device = trainer.args.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    if precision == "fp32" and name and torch.get_float32_matmul_precision() != "highest":
        precision = "tf32"  # fp32 matmuls on tensor cores (--tf32): the fp32 peak would not be theirs
    return {"model_flops_per_token": flops, "model_flops_formula": formula,
            **model_flops_utilization(tokens_per_second, flops, name, precision, trainer.args.world_size)}


def final_evaluation(trainer, streams, data_args, tokenizer, eos_id):
    """Validation (--do_eval) and test (--do_predict) with the protocol, on every process (windows are split)."""
    args, results = trainer.args, {}
    # in fp32 whatever the training precision: accelerate wraps a trained model's forward in autocast, which a run
    # that resumes after its last checkpoint (and so never trains) would not have: the perplexity must not depend on it
    model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    if sharding_of(trainer.model_wrapped) == "FSDP":  # FSDP1: only the wrapper gathers the root's parameters
        model = trainer.model_wrapped
    batch = args.per_device_eval_batch_size * objective_of(model).eval_batch_factor
    is_main = args.process_index == 0
    for split in [s for s, wanted in (("validation", args.do_eval), ("test", args.do_predict)) if wanted]:
        stream = streams[split][: data_args.max_eval_tokens] if data_args.max_eval_tokens else streams[split]
        if is_main and args.disable_tqdm:  # no bar: say what the evaluation is doing
            logger.info(f"[train_lm] evaluating {split}: {len(stream):,} tokens, protocol of docs/training.md")
        began, cpu_began = time.time(), time.process_time()
        metrics = evaluate_perplexity(
            model, stream, tokenizer, batch_size=batch, block_size=data_args.block_size, stride=data_args.eval_stride,
            eos_id=eos_id, mlm_probability=data_args.mlm_probability, accelerator=trainer.accelerator,
            progress=f"[train_lm] {split}" if is_main and not args.disable_tqdm else None,
        )
        # wall seconds, and CPU seconds of this process (time-sharing the cores does not inflate them; a machine
        # loaded past its cores still does, through caches and memory bandwidth: docs/training.md, time budget)
        metrics["wall_seconds"], metrics["cpu_seconds"] = time.time() - began, time.process_time() - cpu_began
        if is_main:
            logger.info(f"[train_lm] {split} perplexity {metrics['perplexity']:.2f} ({metrics['wall_seconds']:.0f} "
                        f"wall seconds, {metrics['cpu_seconds']:.0f} CPU-seconds)")
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
    return results


def results_table(results):
    """The end-of-run summary, a Markdown table of what the run measured (all of it is in all_results.json)."""
    def number(value):
        if isinstance(value, float):
            return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)

    # all_results.json's keys, each naming its clock: wall (elapsed) or CPU (process time, all threads), as the card
    keys = ["parameters", "train_steps", "train_tokens", "train_loss", "train_tokens_per_wall_second",
            "train_tokens_per_cpu_second", "mfu", "validation_perplexity", "validation_accuracy", "test_perplexity",
            "test_accuracy", "train_wall_seconds", "train_cpu_minutes", "wall_time_seconds"]
    rows = [(k, number(results[k])) for k in keys if results.get(k) is not None]
    if results.get("mfu") is None and results.get("mfu_note"):
        rows.append(("mfu", f"n/a ({results['mfu_note']})"))
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'result'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "[train_lm] results\n" + "\n".join(lines)


def write_outputs(trainer, model_args, data_args, results, command, push_requested):
    """all_results.json, the model card (of a trained or pushed model, with what the run measured: no test perplexity
    without --do_predict), training_args.json, the summary; the push to the Hub. On the main process."""
    out = Path(trainer.args.output_dir)
    write_text_atomically(out / "all_results.json", json.dumps(results, indent=2))
    card = trainer.args.do_train or push_requested  # every model in the folder, and every pushed one, has its card
    if card:
        write_lm_model_card(out, trainer.model, results, data_args.block_size, trainer.args.hub_model_id or out.name,
                            command)
    logger.info(results_table(results))
    wrote = "the model, tokenizer, all_results.json" if trainer.args.do_train else "all_results.json"
    logger.info(f"[train_lm] wrote {wrote}{' and the model card README.md' if card else ''} to {trainer.args.output_dir}")
    write_text_atomically(out / "training_args.json", trainer.args.to_json_string())
    if push_requested:
        repo_id = trainer.args.hub_model_id or out.name
        info = push_folder_to_hub(out, repo_id, trainer.args.hub_token, trainer.args.hub_private_repo)
        logger.info(f"[train_lm] pushed to {repo_id}: {getattr(info, 'commit_url', info)}")


# ----------------------------------------------------------------------------------------------------------- main


def parse_arguments(argv):
    """-> (model_args, data_args, training_args, command) of `argv` (default: sys.argv, or one JSON file of flags), with
    --preset auto resolved. The command's flags win; where it is silent, `training_defaults` (the preset's training
    hyper-parameters, a GPU's Trainer settings, the learning rate for the process count) and `wants_bf16` fill in,
    through the parser: TrainingArguments derives fields in __post_init__ (mixed precision among them), so setting them
    afterwards would not do."""
    parser = HfArgumentParser((ModelArguments, DataArguments, LMTrainingArguments))
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if argv is None and len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        values = json.loads(Path(sys.argv[1]).read_text())
        command, explicit = " ".join(sys.argv[1:]), set(values)

        def parse(extra):
            check_flags(parser, values)  # a misspelt key: named, with the nearest flag
            return parser.parse_dict({**values, **extra})
    else:
        argv = list(sys.argv[1:] if argv is None else argv)
        command = "python scripts/train_lm.py " + " ".join(argv)
        if processes > 1:
            command = f"accelerate launch --multi_gpu --num_processes {processes} " + command[7:]
        explicit = explicit_flags(parser, argv)

        def parse(extra):
            flags = [(f"--{name}", str(value).lower() if isinstance(value, bool) else str(value))
                     for name, value in extra.items()]
            check_flags(parser, argv)  # a misspelt flag: named, with the nearest one
            return parser.parse_args_into_dataclasses(args=argv + [text for flag in flags for text in flag])
    extra = {}
    if processes > 1 and not torch.cuda.is_available() and "use_cpu" not in explicit:
        extra["use_cpu"] = True  # several processes and no GPU: data parallel on CPUs (gloo)
    model_args, data_args, training_args = parse_flags(parse, extra)
    is_cuda = torch.cuda.is_available() and not training_args.use_cpu
    preset = resolve_preset(model_args.preset, is_cuda)
    extra.update(training_defaults(preset, is_cuda, explicit, processes, training_args.learning_rate))
    if wants_bf16(model_args, training_args):
        extra["bf16"] = True
        if not torch.cuda.is_available() and not training_args.use_cpu:
            extra["use_cpu"] = True  # transformers accepts CPU bf16 (autocast) only with use_cpu
    if extra:
        model_args, data_args, training_args = parse_flags(parse, extra)
    model_args.preset = preset
    return model_args, data_args, training_args, command


def explicit_flags(parser, argv):
    """The fields `argv` sets: {dest} of every `--name`, `--name=value`, `--name-with-dashes`, `--no_name` and unique
    prefix (argparse's abbreviations), so that no preset or device default overrides a flag the command gave."""
    options = parser._option_string_actions  # option string -> argparse action
    given = set()
    for arg in argv:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        dests = {options[flag].dest} if flag in options else {a.dest for o, a in options.items() if o.startswith(flag)}
        if len(dests) == 1:
            given |= dests
    return given


def resolve_preset(name, is_cuda):
    """--preset auto -> `gpu` when training on CUDA, else `small` (the tuned CPU preset); a named preset stays."""
    if name != "auto":
        return name
    return "gpu" if is_cuda else "small"


def scaled_learning_rate(learning_rate, processes):
    """The learning rate for `processes` data-parallel processes, each with its own --per_device_train_batch_size (the
    global batch is `processes` times it): kept up to 4 processes, times sqrt(processes / 4) beyond (the square-root
    rule for Adam, Malladi et al. 2022; from 4, so that it is continuous). Untuned: no multi-GPU run has been made.
    Up to 4, the global batch (4 x 32 x 512 tokens at the gpu preset) is still small next to WikiText-2's 2M tokens."""
    return learning_rate if processes <= 4 else learning_rate * math.sqrt(processes / 4)


def training_defaults(preset, is_cuda, explicit=frozenset(), processes=1, learning_rate=None):
    """{TrainingArguments field: value} that a run takes where its command does not set the flag (`explicit`): the
    `training` hyper-parameters of its `preset` (a name of PRESETS), `gpu_training_defaults` when training on CUDA,
    and for more than 4 `processes` the learning rate (the preset's, else `learning_rate`, the parsed one) scaled by
    `scaled_learning_rate`."""
    defaults = {name: value for name, value in PRESETS[preset].get("training", {}).items() if name not in explicit}
    defaults.update(gpu_training_defaults(is_cuda, explicit))
    if processes > 4 and "learning_rate" not in explicit:
        defaults["learning_rate"] = scaled_learning_rate(defaults.get("learning_rate", learning_rate), processes)
    return defaults


def check_arguments(model_args, data_args, training_args):
    """Refuses flags that cannot work together, naming them; fills --block_size and --context_length from the preset."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size != launched:
        raise SystemExit(
            f"{launched} processes were launched but they are not connected (world size {training_args.world_size}): "
            "on CPUs launch with `accelerate launch --multi_gpu --num_processes N scripts/train_lm.py ... "
            "--use_cpu true`."
        )
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise SystemExit("Nothing to do: pass --do_train, --do_eval (validation) and/or --do_predict (test).")
    positive = ("block_size", "context_length", "target_length", "train_token_budget", "eval_stride", "max_eval_tokens",
                "periodic_eval_targets", "max_train_tokens", "targets_per_epoch")
    for name in positive:
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name} must be a positive integer, got {value}.")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(training_args, name) < 1:
            raise SystemExit(f"--{name} must be a positive integer, got {getattr(training_args, name)}.")
    if not 0 < training_args.learning_rate < float("inf"):
        raise SystemExit(f"--learning_rate must be a positive finite number, got {training_args.learning_rate}.")
    if model_args.family == "decoder":  # a causal LM over --block_size blocks: the window flags have no model to set
        given = [f"--{name}" for name in ("context_length", "target_length") if getattr(data_args, name) is not None]
        given += ["--next_token_mode window"] if model_args.next_token_mode != "many" else []
        if given:
            raise SystemExit(
                f"{', '.join(given)} cannot apply to --family decoder (a causal LM over --block_size tokens; the "
                "next-token windows are the other families' heads)."
            )
    if training_args.gradient_accumulation_steps < 1:
        raise SystemExit(
            f"--gradient_accumulation_steps must be a positive integer, got {training_args.gradient_accumulation_steps}."
        )
    if data_args.max_train_minutes is not None and not 0 < data_args.max_train_minutes < float("inf"):
        raise SystemExit(f"--max_train_minutes must be a positive number, got {data_args.max_train_minutes}.")
    if data_args.max_train_minutes and (training_args.max_steps > 0 or data_args.train_token_budget):
        raise SystemExit(
            "--max_train_minutes sets max_steps from the budget: pass it or --max_steps / --train_token_budget, "
            "not both."
        )
    auto_name = auto_class_for_flag(model_args.objective).__name__
    if auto_name not in hfst.FAMILIES[model_args.family].models:
        heads = sorted({o.head for o in lm_objectives().values() if o.flag == model_args.objective})
        able = [name for name, family in hfst.FAMILIES.items() if auto_name in family.models]
        raise SystemExit(
            f"--objective {model_args.objective} needs a family with a {' or '.join(heads)} head ({auto_name}): "
            f"--family {' or '.join(able)}, not {model_args.family}."
        )
    if not 0 < data_args.mlm_probability < 1:
        raise SystemExit(f"--mlm_probability must be in (0, 1), got {data_args.mlm_probability}.")
    preset = PRESETS[model_args.preset]
    data_args.block_size = data_args.block_size or preset["context"]
    data_args.context_length = data_args.context_length or preset["context"]
    if data_args.eval_stride is not None and data_args.eval_stride >= data_args.block_size:
        raise SystemExit(
            f"--eval_stride ({data_args.eval_stride}) must be smaller than --block_size ({data_args.block_size}): a "
            "window predicts its tokens after the first from the ones before them, so it can add at most "
            "block_size - 1 scored tokens; a longer stride would skip tokens, and the protocol scores every token once."
        )


def main(argv=None):
    model_args, data_args, training_args, command = parse_arguments(argv)
    log_to_stdout(main_process=training_args.process_index == 0)  # this script's and the toolkit's lines: stdout
    check_arguments(model_args, data_args, training_args)
    check_inputs(model_args, data_args, training_args)  # before anything is made: a bad input leaves nothing behind
    # this run owns --output_dir until it ends: a second run on the folder stops here, naming this one. Released when
    # main ends however it ends, so that main can run again in one process (a notebook, a test) after an error; the
    # release removes the lock file, and the folder if the run made it and wrote nothing into it
    lock = lock_output_dir(training_args, command, script="train_lm")
    try:
        return run(model_args, data_args, training_args, command)
    finally:
        lock.release()


def run(model_args, data_args, training_args, command):
    """main's work, under the output folder's lock."""
    check_output_dir(training_args, data_args.overwrite_output_dir, script="train_lm")
    transformers.logging.set_verbosity_warning()
    set_seed(training_args.seed)
    wall_start = time.time()
    say = logger.info  # the main process's lines (log_to_stdout)

    tokenizer, eos_id, streams = load_data(model_args, data_args, training_args, command, say)
    model = build_model(model_args, data_args, len(tokenizer), eos_id)
    length = example_length(model, data_args.block_size)
    # what the model can take (the training block is only what it was trained on): a longer prompt is no error
    tokenizer.model_max_length = model.config.max_position_embeddings
    train_dataset, eval_dataset = training_datasets(model, streams, data_args, training_args.seed)
    # The Trainer's own push uploads at every save, training_args.bin (a pickle) included: push_folder_to_hub uploads
    # the final folder instead, safetensors, JSON, code and text only.
    push_requested, training_args.push_to_hub = training_args.push_to_hub, False
    if data_args.train_token_budget:
        training_args.max_steps = max(1, data_args.train_token_budget // tokens_per_step(training_args, length))

    resume = resolve_resume(training_args, script="train_lm") if training_args.do_train else None
    if resume:
        check_checkpoint_matches(resume, model)
    timer, budget, callbacks = timed_callbacks(resume, data_args.budget_clock, data_args.max_train_minutes,
                                               training_args.device)
    objective = objective_of(model)
    collator = objective.collator(tokenizer, data_args.mlm_probability)
    trainer = PerplexityLoggingTrainer(model=model, args=training_args, train_dataset=train_dataset,
                                       eval_dataset=eval_dataset, processing_class=tokenizer, data_collator=collator,
                                       callbacks=callbacks)
    environment = run_environment(trainer)
    if budget is not None and training_args.do_train:
        trainer.args.max_steps = max_steps_for_budget(trainer, budget.minutes, timer, script="train_lm")
    parameters = sum(p.numel() for p in model.parameters())
    untuned = " (initial values, untuned: no GPU sweep yet)" if model_args.preset in UNTUNED_PRESETS else ""
    say(f"[train_lm] {type(model).__name__}: {parameters:,} parameters (preset {model_args.preset}{untuned}), "
        f"{len(train_dataset):,} training examples of {length} tokens, max_steps={trainer.args.max_steps}, "
        f"{environment['precision']}, {torch.get_num_threads()} threads")
    if environment["gpu_name"]:
        optim = getattr(training_args.optim, "value", training_args.optim)
        say(f"[train_lm] {environment['gpu_name']} x {training_args.world_size}: optim {optim}, "
            f"torch_compile {training_args.torch_compile}, {training_args.dataloader_num_workers} dataloader workers, "
            f"eval batch {training_args.per_device_eval_batch_size}")
    results = {**describe_model(model, model_args), "parameters": parameters, **environment,
               "hyperparameters": describe_training(model, training_args, length), "command": command}
    results.update({name: getattr(data_args, name) for name in objective.recorded_arguments})
    files = data_files(data_args)
    if files:  # local files: their digests tell the model card whether they are WikiText-2's own
        results["data_files"] = data_file_record(files)
    if training_args.do_train:
        results.update(train_and_measure(trainer, resume, timer, budget, length, script="train_lm"))
        results.update(model_flops(trainer, model, results["train_tokens_per_wall_second"], environment["precision"],
                                   length))
    results.update(final_evaluation(trainer, streams, data_args, tokenizer, eos_id))
    results.update(
        wall_time_seconds=time.time() - wall_start,
        device=f"{trainer.accelerator.device} x {training_args.world_size}",
        eval_protocol=evaluation_protocol(model, data_args.block_size, data_args.eval_stride,
                                          data_args.mlm_probability),
        validation_curve=timer.points,
        replica_checksums=replica_checksums(trainer),  # data-parallel replicas must hold the same weights
    )
    if trainer.is_world_process_zero():
        write_outputs(trainer, model_args, data_args, results, command, push_requested)
    trainer.accelerator.wait_for_everyone()
    # several processes: leave the process group before exiting (gloo's threads, still running at interpreter exit,
    # can abort a process that has finished its work: "terminate called without an active exception")
    trainer.accelerator.end_training()
    return results


if __name__ == "__main__":
    main()

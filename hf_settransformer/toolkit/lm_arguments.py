"""train_lm.py's command line: its argument dataclasses, the named presets, and the flags resolved and checked.

The command's flags win; where it is silent the preset (`--preset auto`: `small` on a CPU, `gpu` on CUDA), the GPU's
Trainer settings and the learning rate for the process count fill in. Flags that cannot work together are refused
here, naming them, before anything is made. `new_config` is the config a new model gets from its preset.
"""

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, HfArgumentParser
from transformers.trainer_utils import IntervalStrategy, SchedulerType

from ..configuration_base import check_adaptive_tie
from ..families import FAMILIES
from ..decay import DECAYS, decay_applies
from ..feature_maps import FEATURE_MAPS
from .hub import without_secrets
from .machine import fast_bf16_available, gpu_training_defaults
from .objectives import MLM_PROBABILITY, auto_class_for_flag, lm_objectives
from .cli import (  # explicit_flags: imported from here before it moved
    CheckedTrainingArguments,
    check_flags,
    explicit_flags,
    flags_file,
    parse_flags,
    read_flags_file,
    typed_flag_values,
)

# Named sizes. `small` is the size tuned for a 2-core CPU (docs/tuning.md); on a GPU `base` overfits WikiText-2 and
# the `gpu` presets take its place. `context` is the decoder's block and the heads' window; the heads predict the last
# `targets` tokens of each window. Other keys are config fields (`--config_overrides` wins over them), and `training`
# holds `TrainingArguments` defaults that apply where the command does not set the flag.
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
        tie_adaptive_weights=True,  # where both adaptive layers are kept and cut alike (new_config)
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
    # The GPU presets: initial values, untuned (no GPU sweep yet). Dense embedding and full softmax: the adaptive
    # layers save CPU time on the 33k-word output layer, and their data-dependent cluster selection syncs with the
    # host. WikiText-2 has 2M training tokens, so a GPU run is bound by overfitting: more dropout and weight decay
    # than on the CPU.
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


@dataclass(frozen=True)
class FamilyPreset:
    """What a family's new config needs besides the shared sizes: `fields` (config values), `layers_field` (the field
    the preset's layer count sets) and `target_length_fields` (fields that --target_length sets too, whatever the
    head: the flag then applies to every head of the family)."""

    fields: dict = field(default_factory=dict)
    layers_field: str = "num_hidden_layers"
    target_length_fields: tuple = ()


FAMILY_PRESETS = {
    "set_transformer": FamilyPreset({"num_inducing_points": 16, "num_seeds": 1, "num_decoder_layers": 1}),
    # Perceiver IO counts its layers per block; Perceiver AR has one latent per target
    "perceiver_io": FamilyPreset({"num_blocks": 1, "num_cross_attention_heads": 1, "output_query_type": "inputs"},
                                 layers_field="num_self_attends_per_block", target_length_fields=("num_latents",)),
}


@dataclass
class ModelArguments:
    """train_lm.py's model flags: family, attention, preset, objective and where a model or tokenizer comes from."""

    family: str = field(default="decoder", metadata={"help": "Model family.", "choices": list(FAMILIES)})
    attention_type: str = field(
        default="softmax", metadata={"help": "softmax or linear", "choices": ["softmax", "linear"]}
    )
    feature_map: str = field(
        default="elu", metadata={"help": "linear attention feature map", "choices": list(FEATURE_MAPS)}
    )
    linear_attention_decay: str = field(
        default="none",
        metadata={"help": "decay of causal linear attention's state: fixed (RetNet's per-head gamma) or gated "
                          "(a per-token gate, as simple GLA)", "choices": list(DECAYS)},
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
    """train_lm.py's data and run flags: the splits, the example lengths, the token and time budgets, the evaluation's
    size, the training methods (optimizer, schedule's decay, weight averaging)."""

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
    packing: bool = field(
        default=False,
        metadata={"help": "Causal or masked LM: each line a sequence of its own, packed into rows of --block_size "
                  "tokens (each attends to itself only) instead of blocks cut from the running text."},
    )
    optimizer: str = field(
        default="auto",
        metadata={"help": "'muon': Muon for the attention and feed-forward weight matrices (their update scaled to "
                  "AdamW's size, so --learning_rate and --weight_decay serve both), AdamW for the rest; not with "
                  "--fsdp / --deepspeed. 'adamw': --optim's for every weight. 'auto': muon, or adamw where Muon "
                  "cannot run (--fsdp, --deepspeed, an --optim other than PyTorch's AdamW).",
                  "choices": ["auto", "adamw", "muon"]},
    )
    decay_fraction: float | None = field(
        default=None,
        metadata={"help": "--lr_scheduler_type warmup_stable_decay: the last fraction of the planned steps that "
                  "decays, ending at the last one (0.2 where --lr_scheduler_kwargs sets no num_decay_steps)."},
    )
    average_weights: str = field(
        default="auto",
        metadata={"help": "Average the weights over the last --average_fraction of the planned steps: 'last' (the "
                  "mean), 'ema' (exponential, --ema_decay) or 'none'; the average is evaluated and saved. 'auto': "
                  "last, or none where it cannot run (--fsdp, --deepspeed, --load_best_model_at_end true).",
                  "choices": ["auto", "none", "ema", "last"]},
    )
    average_fraction: float | None = field(
        default=None,
        metadata={"help": "The last fraction of the planned steps averaged (default: --decay_fraction's under "
                  "warmup_stable_decay, else 0.2)."},
    )
    ema_decay: float = field(default=0.999, metadata={"help": "--average_weights ema: the average's decay per step."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Replace the run already in --output_dir (its checkpoints, weights and results are removed "
                  "first). Without it such a folder is refused unless --resume_from_checkpoint continues it."},
    )


@dataclass
class LMTrainingArguments(CheckedTrainingArguments):
    """`TrainingArguments` with train_lm.py's tuned defaults (docs/tuning.md); every flag still works. The
    types are transformers' own, so the flags parse as they do everywhere."""

    learning_rate: float = field(
        default=2e-3,
        metadata={"help": "Peak AdamW learning rate (the gpu presets' own where not given; with more than 4 processes "
                  "times sqrt(processes / 4), untuned)."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    warmup_steps: float = field(default=0.02, metadata={"help": "Warm-up: steps, or a fraction of max_steps if < 1."})
    lr_scheduler_type: SchedulerType | str = field(
        default="warmup_stable_decay",
        metadata={"help": "Learning-rate schedule (warmup_stable_decay: the last --decay_fraction of the planned steps "
                  "decays)."},
    )
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


def parse_arguments(argv=None):
    """-> (model_args, data_args, training_args, command) of `argv` (default: sys.argv, or one JSON file of flags), with
    --preset auto resolved. The command's flags win; where it is silent, `training_defaults` (the preset's training
    hyper-parameters, a GPU's Trainer settings, the learning rate for the process count) and `wants_bf16` fill in,
    through the parser: TrainingArguments derives fields in __post_init__ (mixed precision among them), so setting them
    afterwards would not do."""
    parser = HfArgumentParser((ModelArguments, DataArguments, LMTrainingArguments))
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    argv = list(sys.argv[1:] if argv is None else argv)
    if flags_file(argv):  # one JSON file of flags
        values = read_flags_file(argv[0])
        command, explicit = " ".join(argv), set(values)
        parse_flags(check_flags, parser, values)  # a misspelt key: named, with the nearest flag
        values = typed_flag_values(parser, values, argv[0])  # "2" for --max_steps is 2, as on the command line

        def parse(extra):
            return parser.parse_dict({**values, **extra})
    else:
        command = "python scripts/train_lm.py " + " ".join(without_secrets(argv))  # published in the card
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
    _, average, _ = auto_training_methods(data_args, training_args, "load_best_model_at_end" in explicit)
    if average != "none" and "load_best_model_at_end" not in explicit:
        extra["load_best_model_at_end"] = False  # the run ends with the average, not a checkpoint (check_arguments)
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
    model_args.flags_given = frozenset(explicit)  # check_arguments refuses a flag the run cannot use if it was given
    return model_args, data_args, training_args, command


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


def wants_bf16(model_args, training_args):
    """--precision bf16, or auto where the hardware has a fast bf16 path, unless --bf16/--fp16 was given already."""
    if training_args.bf16 or training_args.fp16:
        return False
    if model_args.precision == "bf16":
        return True
    return model_args.precision == "auto" and fast_bf16_available(training_args.use_cpu)


def check_arguments(model_args, data_args, training_args):
    """Refuses flags that cannot work together and --config_overrides keys the config lacks, naming them, before any
    data is read; fills --block_size and --context_length from the preset."""
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
    if not FAMILIES[model_args.family].config_class().windowed_heads:  # a causal LM over --block_size blocks
        given = [f"--{name}" for name in ("context_length", "target_length") if getattr(data_args, name) is not None]
        given += ["--next_token_mode window"] if model_args.next_token_mode != "many" else []
        if given:
            raise SystemExit(
                f"{', '.join(given)} cannot apply to --family {model_args.family} (a causal LM over --block_size "
                "tokens; the next-token windows are the other families' heads)."
            )
    flagged_head(model_args)  # a family with no head for --objective: refused here
    check_flags_apply(model_args, data_args, training_args)
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
    if not 0 < data_args.mlm_probability < 1:
        raise SystemExit(f"--mlm_probability must be in (0, 1), got {data_args.mlm_probability}.")
    if model_args.config_overrides and not model_args.model_name_or_path:  # its keys, before any data is read
        parse_overrides(model_args.config_overrides, new_config_class(model_args.family))
    check_training_methods(model_args, data_args, training_args)
    preset = PRESETS[model_args.preset]
    data_args.block_size = data_args.block_size or preset["context"]
    data_args.context_length = data_args.context_length or preset["context"]
    if data_args.eval_stride is not None and data_args.eval_stride >= data_args.block_size:
        raise SystemExit(
            f"--eval_stride ({data_args.eval_stride}) must be smaller than --block_size ({data_args.block_size}): a "
            "window predicts its tokens after the first from the ones before them, so it can add at most "
            "block_size - 1 scored tokens; a longer stride would skip tokens, and the protocol scores every token once."
        )


WSD_STEP_KWARGS = ("num_decay_steps", "num_stable_steps")  # --lr_scheduler_kwargs that size the phases in steps
MUON_OPTIMS = ("adamw_torch", "adamw_torch_fused")  # the --optim values Muon's AdamW half can be


def sharded_flags(training_args):
    """What shards the parameters over processes: --fsdp, --deepspeed (as given), or an accelerate config that enables
    FSDP or DeepSpeed (`accelerate launch` says so in the processes' environment)."""
    given = [flag for flag, on in (("--fsdp", training_args.fsdp), ("--deepspeed", training_args.deepspeed)) if on]
    for name, what in (("FSDP", "accelerate's FSDP"), ("DEEPSPEED", "accelerate's DeepSpeed")):
        if not given and os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() in ("1", "true", "yes"):
            given.append(what)
    return given


def auto_training_methods(data_args, training_args, load_best_given):
    """(optimizer, average_weights, fallback notes) of `data_args` with `auto` resolved: the methods docs/tuning.md
    chose (muon, last), or where one cannot run the plain choice (adamw, none) and a note saying why. Muon and the
    average keep whole weight matrices (--fsdp, --deepspeed shard them), Muon's AdamW half is PyTorch's (--optim), and
    an average ends the run where `load_best_given` (--load_best_model_at_end given true) asks for the best
    checkpoint."""
    sharded = sharded_flags(training_args)
    optim = str(getattr(training_args.optim, "value", training_args.optim))
    optimizer, average, notes = data_args.optimizer, data_args.average_weights, []
    if optimizer == "auto":
        reason = " / ".join(sharded) if sharded else (f"--optim {optim}" if optim not in MUON_OPTIMS else None)
        optimizer = "adamw" if reason else "muon"
        notes += [f"--optimizer auto is adamw ({reason}: Muon cannot run with it)"] if reason else []
    if average == "auto":
        reason = " / ".join(sharded) if sharded else (
            "--load_best_model_at_end" if load_best_given and training_args.load_best_model_at_end else None)
        average = "none" if reason else "last"
        notes += [f"--average_weights auto is none ({reason}: no average with it)"] if reason else []
    return optimizer, average, notes


def check_training_methods(model_args, data_args, training_args):
    """Refuses, naming the flags, what --optimizer, --decay_fraction and --average_weights cannot do with the other
    flags, and fills in --decay_fraction (0.2 under warmup_stable_decay where --lr_scheduler_kwargs gives no steps)
    and --average_fraction (--decay_fraction's, else 0.2)."""
    given = getattr(model_args, "flags_given", None)

    def gave(name):
        return name in given if given is not None else flag_given(data_args, name)

    data_args.optimizer, data_args.average_weights, notes = auto_training_methods(
        data_args, training_args, gave("load_best_model_at_end"))
    data_args.methods_fallback = getattr(data_args, "methods_fallback", []) + notes  # said at the run's start
    sharded = sharded_flags(training_args)
    if data_args.optimizer == "muon":
        if sharded:
            raise SystemExit(f"--optimizer muon cannot run with {' / '.join(sharded)}: Muon orthogonalises each weight "
                             "matrix whole, and these shard it over processes. Use data parallelism (accelerate "
                             "launch without them), or --optimizer adamw.")
        optim = str(getattr(training_args.optim, "value", training_args.optim))
        if optim not in MUON_OPTIMS:
            raise SystemExit(f"--optimizer muon pairs Muon with PyTorch's AdamW: --optim must be adamw_torch or "
                             f"adamw_torch_fused, not {optim}.")
    scheduler = str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type))
    kwargs = training_args.lr_scheduler_kwargs or {}
    if data_args.decay_fraction is not None:
        if scheduler != "warmup_stable_decay":
            raise SystemExit(f"--decay_fraction cannot apply here: it sizes the decay of --lr_scheduler_type "
                             f"warmup_stable_decay, and the schedule is {scheduler}.")
        if not 0 < data_args.decay_fraction <= 1:
            raise SystemExit(f"--decay_fraction must be in (0, 1], got {data_args.decay_fraction}.")
        if set(WSD_STEP_KWARGS) & set(kwargs):
            raise SystemExit(f"--decay_fraction sizes the decay from the planned steps: pass it or --lr_scheduler_kwargs "
                             f"{' / '.join(sorted(set(WSD_STEP_KWARGS) & set(kwargs)))}, not both.")
    elif scheduler == "warmup_stable_decay" and not set(WSD_STEP_KWARGS) & set(kwargs):
        data_args.decay_fraction = 0.2
    if data_args.average_weights == "none":
        given = [f"--{name}" for name in ("average_fraction", "ema_decay") if gave(name)]
        if given:
            raise SystemExit(f"{', '.join(given)} cannot apply here: they shape the weight average, and "
                             "--average_weights is none.")
        return
    if data_args.average_weights != "ema" and gave("ema_decay"):
        raise SystemExit("--ema_decay cannot apply here: it is the decay of --average_weights ema.")
    if sharded:
        raise SystemExit(f"--average_weights cannot run with {' / '.join(sharded)}: the average is kept of whole "
                         "parameters on every process, and these shard them. Use data parallelism.")
    if training_args.load_best_model_at_end:
        raise SystemExit("--average_weights ends the run with the averaged weights; --load_best_model_at_end would "
                         "end it with a checkpoint's instead: pass one of them.")
    if data_args.average_fraction is None:
        data_args.average_fraction = data_args.decay_fraction or 0.2
    if not 0 < data_args.average_fraction <= 1:
        raise SystemExit(f"--average_fraction must be in (0, 1], got {data_args.average_fraction}.")
    if not 0 < data_args.ema_decay < 1:
        raise SystemExit(f"--ema_decay must be in (0, 1), got {data_args.ema_decay}.")


def flagged_head(model_args):
    """The head a new model of these flags is: --family's class for --objective's Auto class, as it is in
    --next_token_mode (the class's `in_mode`) -> (it, its OBJECTIVES row). A family with no such head is refused,
    naming the families that have one."""
    auto_name = auto_class_for_flag(model_args.objective).__name__
    classes = FAMILIES[model_args.family].model_classes()
    if auto_name not in classes:
        heads = sorted({o.head for o in lm_objectives().values() if o.flag == model_args.objective})
        able = [name for name, family in FAMILIES.items() if auto_name in family.models]
        raise SystemExit(
            f"--objective {model_args.objective} needs a family with a {' or '.join(heads)} head ({auto_name}): "
            f"--family {' or '.join(able)}, not {model_args.family}."
        )
    head = classes[auto_name].in_mode(model_args.next_token_mode)
    return head, lm_objectives()[head.objective]


def flag_given(args, name):
    """Whether the command gave the flag `name` of the argument dataclass `args`: the flags `parse_arguments` recorded
    (`model_args.flags_given`), else (dataclasses made in code) a value other than the field's default."""
    given = getattr(args, "flags_given", None)
    if given is not None:
        return name in given
    default = args.__dataclass_fields__[name].default
    return getattr(args, name) != default


def check_flags_apply(model_args, data_args, training_args):
    """Refuses, naming them, the flags the command gave that the run would ignore: each of train_lm.py's own flags
    applies to some families, objectives, modes or kinds of run only (docs/training.md)."""
    given = getattr(model_args, "flags_given", None)

    def gave(name):
        if given is not None:
            return name in given
        args = model_args if name in model_args.__dataclass_fields__ else data_args
        return name in args.__dataclass_fields__ and flag_given(args, name)

    for name in ("model_name_or_path", "tokenizer_name"):
        if getattr(model_args, name) == "":
            raise SystemExit(f"--{name} is an empty string: pass a folder or Hub id (or leave the flag out).")
    refusals = []  # (flags, why)
    family, objective = model_args.family, model_args.objective
    if model_args.model_name_or_path:  # the checkpoint's config fixes the model and its windows
        fixed = [name for name in ("attention_type", "feature_map", "linear_attention_decay", "next_token_mode",
                                   "config_overrides", "context_length", "target_length") if gave(name)]
        refusals.append((fixed, "the model comes from --model_name_or_path, whose config sets these (new models only)"))
    else:
        head, row = flagged_head(model_args)
        head_flags = f"--objective {objective}" + (f" --next_token_mode {row.next_token_mode}" if row.next_token_mode
                                                  else "")
        # the data flags this run reads: its objective's, and --target_length where the family's config takes it
        reads = set(row.data_flags)
        if FAMILY_PRESETS.get(family, FamilyPreset()).target_length_fields:
            reads.add("target_length")
        refusals.append(([n for n in ("block_size", "eval_stride") if gave(n) and n not in reads],
                         f"--family {family} reads windows of --context_length tokens; --block_size and "
                         "--eval_stride are the decoder's (a causal LM)"))
        if model_args.attention_type == "softmax" and model_args.feature_map != ModelArguments.feature_map:  # default
            refusals.append((["feature_map"], "it selects linear attention's feature map; --attention_type softmax "
                                              "has none (pass --attention_type linear)"))
        if model_args.attention_type == "softmax" and model_args.linear_attention_decay != "none":
            refusals.append((["linear_attention_decay"], "it decays linear attention's state; --attention_type "
                                                         "softmax has none (pass --attention_type linear)"))
        elif not decay_applies(model_args.linear_attention_decay, head.attends_causally):
            refusals.append((["linear_attention_decay"], f"a decay needs causal attention, and the {row.head} head "
                                                         f"({head_flags}) attends bidirectionally"))
        # a head with no next-token windows; the decoder's --next_token_mode is refused by check_arguments
        if row.next_token_mode is None and FAMILIES[family].config_class().windowed_heads:
            refusals.append(([n for n in ("next_token_mode", "targets_per_epoch") if gave(n)],
                             f"{head_flags} trains {row.head} heads, not next-token windows"))
        if "target_length" not in reads and gave("target_length"):
            refusals.append((["target_length"], "only the many-target next-token head predicts several tokens a "
                                                "window (--objective next_token --next_token_mode many)"))
        if "targets_per_epoch" not in reads and gave("targets_per_epoch"):
            refusals.append((["targets_per_epoch"], "it samples the windows of the one-target head "
                                                    "(--next_token_mode window) only"))
    masking = sorted({o.flag for o in lm_objectives().values() if "mlm_probability" in o.data_flags})
    if objective not in masking and gave("mlm_probability"):
        refusals.append((["mlm_probability"], f"it is the masking rate of --objective {' / '.join(masking)}"))
    if data_args.max_train_minutes is None and gave("budget_clock"):
        refusals.append((["budget_clock"], "it says what --max_train_minutes counts"))
    if not training_args.do_train:
        refusals.append(([n for n in ("train_token_budget", "max_train_minutes", "max_train_tokens", "targets_per_epoch")
                          if gave(n) and getattr(data_args, n) is not None],
                         "they set the training, and the command has no --do_train"))
    if str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy)) == "no" and gave(
            "periodic_eval_targets"):
        refusals.append((["periodic_eval_targets"], "it sizes the periodic evaluation, and --eval_strategy is no"))
    if any((data_args.train_file, data_args.validation_file, data_args.test_file)):
        refusals.append(([n for n in ("dataset_name", "dataset_config_name") if gave(n)],
                         "the local files (--train_file ...) replace the dataset"))
    if not model_args.model_name_or_path and model_args.trust_remote_code:
        refusals.append((["trust_remote_code"], "it is passed to --model_name_or_path's from_pretrained"))
    if given is not None and "precision" in given and ({"bf16", "fp16"} & given):
        refusals.append((["precision"], "--bf16 / --fp16 set the precision already: pass one of them"))
    for flags, why in refusals:
        if flags:
            raise SystemExit(f"{', '.join('--' + f for f in flags)} cannot apply here: {why}.")


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


def new_config_class(family):
    """The config class of a new model of `family` (a name of FAMILIES)."""
    return AutoConfig.for_model(FAMILIES[family].model_type).__class__


def new_config(model_args, data_args, vocab_size, eos_id):
    """The config of a new --family model: the preset's sizes, the data's lengths, then --config_overrides."""
    preset = dict(PRESETS[model_args.preset])
    preset.pop("context")  # data_args.block_size / context_length already hold it
    preset.pop("training", None)  # TrainingArguments defaults, applied by parse_arguments
    targets = preset.pop("targets")
    adaptive = {name: preset.pop(name) for name in ("adaptive_softmax_cutoffs", "adaptive_input_cutoffs")
                if name in preset}
    tie = preset.pop("tie_adaptive_weights", False)
    family_preset = FAMILY_PRESETS.get(model_args.family, FamilyPreset())
    fields = dict(
        preset,
        **family_preset.fields,
        vocab_size=vocab_size,
        attention_type=model_args.attention_type,
        feature_map=model_args.feature_map,
        linear_attention_decay=model_args.linear_attention_decay,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=eos_id,
    )
    # a tiny vocabulary (tests) keeps the full softmax and embedding
    fields.update({name: cutoffs for name, cutoffs in adaptive.items() if cutoffs[-1] < vocab_size})
    config_class = new_config_class(model_args.family)
    # a causal LM reads its whole input (blocks of --block_size); the families with window heads, windows
    length = data_args.context_length if config_class.windowed_heads else data_args.block_size
    fields["max_position_embeddings"] = max(length, 1024)
    if config_class.windowed_heads:
        fields.update(context_length=length, target_length=data_args.target_length or min(targets, length),
                      next_token_mode=model_args.next_token_mode)
    fields[family_preset.layers_field] = fields.pop("num_hidden_layers")
    fields.update({name: fields.get("target_length", targets) for name in family_preset.target_length_fields})
    overrides = parse_overrides(model_args.config_overrides, config_class)
    fields.update(overrides)
    try:
        config = config_class(**fields)
    except (ValueError, StrictDataclassError) as err:  # @strict's, for a field's value
        raise SystemExit(f"Invalid model configuration: {err}") from None
    if tie and "tie_adaptive_weights" not in overrides and adaptive_tie_possible(config):
        config = config_class(**fields, tie_adaptive_weights=True)
    return config


def adaptive_tie_possible(config):
    """Whether `config`'s adaptive input and softmax can share their clusters (both kept and cut alike): the preset
    ties them only then, so a tiny vocabulary (no adaptive layers) or --config_overrides adaptive_input_cutoffs=null
    still builds."""
    try:
        check_adaptive_tie(config)
    except ValueError:
        return False
    return True

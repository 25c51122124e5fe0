"""Train the Set Transformer on the paper's synthetic set tasks with the transformers Trainer (no download needed).

The tasks of Lee et al. 2019, each a row of `OBJECTIVES` (`hf_settransformer/toolkit/set_tasks.py`), generated on the
fly, sets of different sizes in one batch padded by `DataCollatorForSets`: `max_regression` (the maximum of up to 10
numbers, L1 loss; `--model deepsets_max|deepsets_mean|deepsets_sum` trains the paper's rFF + pooling baselines
instead), `mixture_of_gaussians` (amortized clustering of 2-D points from 4 Gaussians) and `point_clouds` (8 synthetic
shapes, classification). Each runs with `--attention_type softmax|linear` and `--num_inducing_points m` (ISAB) or 0
(SAB); `--model_name_or_path DIR` continues a saved model. At the end the script evaluates on fresh sets
(`--eval_sets`), prints the metric next to the paper's and writes all_results.json. Recipes: docs/set_transformer.md.

    python scripts/train_sets.py --task max_regression --output_dir outputs/max --max_steps 20000 \\
        --per_device_train_batch_size 128 --learning_rate 1e-3
    python scripts/train_sets.py --task mixture_of_gaussians --num_inducing_points 16 --output_dir outputs/mog \\
        --max_steps 50000 --per_device_train_batch_size 10 --learning_rate 1e-3
"""

import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser, Trainer, set_seed
from transformers.utils import logging as transformers_logging

from hf_settransformer import SetTransformerConfig
from hf_settransformer.toolkit import (
    CheckedTrainingArguments,
    DataCollatorForSets,
    check_flags,
    log_to_stdout,
    make_set_task,
    resolve_resume,
    timed_callbacks,
)
from hf_settransformer.toolkit.checkpoint_files import (
    check_checkpoint_files,
    check_checkpoint_matches,
    check_loaded_weights,
    check_model_weights,
)
from hf_settransformer.toolkit.cli import (
    explicit_flags,
    flags_file,
    load_pretrained,
    parse_flags,
    read_flags_file,
    typed_flag_values,
)
from hf_settransformer.toolkit.hub import HubUnreachableError, UnpublishableFolderError, push_folder_to_hub
from hf_settransformer.toolkit.objectives import set_objective, set_objectives
from hf_settransformer.toolkit.resume_settings import check_run_settings, run_settings
from hf_settransformer.toolkit.run_folder import (
    check_inputs_outside,
    check_output_dir,
    check_resume_checkpoint,
    record_run_settings,
    save_model_atomically,
    stops_say_where_to_resume,
    train_unless_finished,
    write_text_atomically,
)
from hf_settransformer.toolkit.run_lock import lock_output_dir
from hf_settransformer.toolkit.set_tasks import DeepSetsBaseline

logger = transformers_logging.get_logger("hf_settransformer.scripts")


def task_defaults(key):
    """Each task's default for the flag `key` (its row's `defaults`), for the help: "64 / 128 / 128"."""
    return " / ".join(f"{row.defaults[key]:g}" for row in set_objectives().values())


@dataclass
class SetArguments:
    task: str = field(
        default="max_regression",
        metadata={"help": "a set-task row of OBJECTIVES (hf_settransformer.toolkit.set_tasks)",
                  "choices": list(set_objectives())},
    )
    model: str = field(
        default="set_transformer",
        metadata={
            "help": "set_transformer, or the paper's rFF+pooling baselines",
            "choices": ["set_transformer", "deepsets_max", "deepsets_mean", "deepsets_sum"],
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "continue from a saved Set Transformer of this task (local or Hub); its config is the model's"
        },
    )
    attention_type: str | None = field(default=None, metadata={"choices": ["softmax", "linear"]})
    feature_map: str | None = field(default=None, metadata={"choices": ["elu", "exp"]})
    norm_type: str | None = field(
        default=None,
        metadata={"help": "pre-norm of every block, default scalenorm", "choices": ["scalenorm", "layernorm"]},
    )
    num_inducing_points: int | None = field(
        default=None, metadata={"help": f"m of ISAB, 0 for SAB (task default {task_defaults('num_inducing_points')})"}
    )
    hidden_size: int | None = field(default=None, metadata={"help": f"task default: {task_defaults('hidden_size')}"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "default 4"})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "ISABs or SABs before pooling, default 2"})
    num_decoder_layers: int | None = field(
        default=None, metadata={"help": f"SABs after PMA (task default {task_defaults('num_decoder_layers')})"}
    )
    initializer_range: float | None = field(
        default=None,
        metadata={"help": "std of the normal init of the linear layers (task default "
                          f"{task_defaults('initializer_range')})"},
    )
    train_sets: int = field(default=10_000_000, metadata={"help": "size of the (generated) training index range"})
    eval_sets: int = field(default=1000, metadata={"help": "fresh sets for the final evaluation"})
    min_size: int | None = field(default=None, metadata={"help": f"task default {task_defaults('min_size')}"})
    max_size: int | None = field(default=None, metadata={"help": f"task default {task_defaults('max_size')}"})
    max_values: str = field(
        default="real",
        metadata={"help": "max_regression values: real (paper) or integer", "choices": ["real", "integer"]},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "replace the run already in --output_dir (without it such a folder is refused unless "
                  "--resume_from_checkpoint continues it)"},
    )
    value_scale: float = field(
        default=100.0,
        metadata={"help": "max_regression: inputs and targets are divided by this; the MAE is reported unscaled"},
    )
    packing: bool = field(
        default=False,
        metadata={"help": "train on packed batches: the sets of a batch in one row, no padding (DataCollatorForSets("
                  "packed=True)); the same losses as padded batches, computed on the real elements only"},
    )


# every task's defaults; each task's own are its row's `defaults` (hf_settransformer/toolkit/set_tasks.py)
MODEL_DEFAULTS = dict(
    attention_type="softmax", feature_map="elu", norm_type="scalenorm", num_attention_heads=4, num_hidden_layers=2
)
# the arguments that describe the model, which a checkpoint's config fixes
ARCHITECTURE = (*MODEL_DEFAULTS, "hidden_size", "num_inducing_points", "num_decoder_layers", "initializer_range")
# the arguments that make the training sets, which a resume keeps (--eval_sets, the final evaluation's, may change)
RUN_DATA = ("train_sets", "min_size", "max_size", "max_values", "value_scale", "packing")


def build_model(args):
    """A new model: the task's Set Transformer head from the arguments, or the rFF+pooling baseline of --model."""
    task = set_objective(args.task)
    if args.model != "set_transformer":
        return DeepSetsBaseline(input_size=task.config["input_size"], hidden=args.hidden_size,
                                out=task.config["num_labels"], pooling=args.model.split("_")[1])
    common = dict(
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_hidden_layers=args.num_hidden_layers,
        intermediate_size=args.hidden_size,
        num_inducing_points=args.num_inducing_points,
        num_decoder_layers=args.num_decoder_layers,
        attention_type=args.attention_type,
        feature_map=args.feature_map,
        norm_type=args.norm_type,
        initializer_range=args.initializer_range,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    if task.problem_type:
        common["problem_type"] = task.problem_type
    try:
        config = SetTransformerConfig(**task.config, **common)
    except (ValueError, StrictDataclassError) as err:  # a config field is the flag of the same name
        raise SystemExit(f"Invalid model configuration (flags of the same names): {err}") from None
    return task.head(config)


def load_model(args):
    """The saved model of `--model_name_or_path`, checked against the task; its config fills the architecture
    arguments (given ones are an error: the checkpoint decides them)."""
    if args.model != "set_transformer":
        raise SystemExit("--model_name_or_path continues a Set Transformer; the rFF+pooling baselines start fresh.")
    given = [f"--{key}" for key in ARCHITECTURE if getattr(args, key) is not None]
    if given:
        raise SystemExit(f"{', '.join(given)}: the model comes from --model_name_or_path, whose config sets these.")
    task = set_objective(args.task)
    model_class, needs = task.head, task.config
    config = load_pretrained("--model_name_or_path", args.model_name_or_path, SetTransformerConfig.from_pretrained)
    wrong = {key: getattr(config, key, None) for key, value in needs.items() if getattr(config, key, None) != value}
    if wrong or model_class.__name__ not in (config.architectures or []):
        raise SystemExit(
            f"{args.model_name_or_path} holds a {', '.join(config.architectures or ['model'])} with {wrong or needs}; "
            f"the {args.task} task needs a {model_class.__name__} with {needs}."
        )
    shapes = check_model_weights("--model_name_or_path", args.model_name_or_path)
    model = load_pretrained("--model_name_or_path", args.model_name_or_path, model_class.from_pretrained)
    check_loaded_weights("--model_name_or_path", args.model_name_or_path, shapes, model)
    for key in ARCHITECTURE:
        setattr(args, key, getattr(config, key))
    return model


def check_arguments(args):
    """Refuses values that would train or evaluate something meaningless, and flags the run would ignore, naming the
    flag (`check_set_flags` has the ranges)."""
    if args.model_name_or_path == "":
        raise SystemExit("--model_name_or_path is an empty string: pass a saved model's folder (or leave it out).")
    if args.model != "set_transformer" and not set_objective(args.task).baselines:
        able = [name for name, row in set_objectives().items() if row.baselines]
        raise SystemExit(f"The rFF+pooling baselines are implemented for {' and '.join(able)}.")
    if args.model != "set_transformer":  # an rFF + pooling: no attention, no blocks to set
        given = [name for name in ("attention_type", "feature_map", "norm_type", "num_inducing_points",
                                   "num_attention_heads", "num_hidden_layers", "num_decoder_layers",
                                   "initializer_range")
                 if getattr(args, name) is not None]
        if given:
            raise SystemExit(
                f"--model {args.model} is the paper's rFF + pooling baseline: it has no attention or Set Transformer "
                f"blocks, so {', '.join('--' + g for g in given)} cannot apply (use --model set_transformer)."
            )
    if args.feature_map not in (None, MODEL_DEFAULTS["feature_map"]) and (args.attention_type or "softmax") == "softmax":
        raise SystemExit("--feature_map cannot apply here: it selects linear attention's feature map; --attention_type "
                         "softmax has none (pass --attention_type linear).")
    task = set_objective(args.task)
    others = {flag for row in set_objectives().values() for flag in row.dataset_flags.values()}
    given = getattr(args, "flags_given", None)  # main's; else (arguments made in code) the non-default values
    if given is None:
        given = {f for f in others if getattr(args, f) != SetArguments.__dataclass_fields__[f].default}
    ignored = sorted(flag for flag in others - set(task.dataset_flags.values()) if flag in given)
    if ignored:
        raise SystemExit(f"{', '.join('--' + flag for flag in ignored)} cannot apply to --task {args.task}: its sets "
                         "do not read them (they are max_regression's).")
    check_set_flags(args)


# the largest set (points) and index range train_sets.py makes: a set is generated whole in memory, and item i of the
# index range is drawn from a generator seeded with seed * 1,000,003 + i, which must stay below 2**64
MAX_SET_SIZE = 10_000_000
MAX_SETS = 2**60
# --value_scale: the model sees max_regression's numbers (in [0, 100)) divided by it, up to 100 / value_scale
VALUE_SCALE_RANGE = (1e-2, 1e4)


def check_set_flags(args):
    """Refuses a numeric flag outside its range, naming the flag and the range."""
    low, high = VALUE_SCALE_RANGE
    if not low <= args.value_scale <= high:  # NaN too
        raise SystemExit(
            f"--value_scale must be between {low:g} and {high:,g}, got {args.value_scale}: max_regression's numbers "
            "(below 100) reach the model divided by it, so outside that range they are too large or too small for it "
            "to learn from (at 1e-300 they overflow and the MAE is NaN)."
        )
    for name in ("eval_sets", "train_sets"):
        if not 1 <= getattr(args, name) <= MAX_SETS:
            raise SystemExit(f"--{name} must be a positive integer up to 2**60, got {getattr(args, name)}.")
    for name in ("min_size", "max_size"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= MAX_SET_SIZE:
            raise SystemExit(f"--{name} must be a positive integer up to {MAX_SET_SIZE:,} points a set, got {value}.")
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name} must be a positive integer, got {value}.")
    if args.min_size is not None and args.max_size is not None and args.min_size > args.max_size:
        raise SystemExit(f"--min_size ({args.min_size}) must not exceed --max_size ({args.max_size}).")
    if args.packing and args.model != "set_transformer":
        raise SystemExit(f"--packing trains the Set Transformer on packed batches; --model {args.model} (an rFF+pooling "
                         "baseline) takes padded ones.")
    check_model_fits(args)


def check_model_fits(args):
    """Refuses sizes whose model would not fit in this machine's memory (weights, gradients and AdamW's two moments,
    4 bytes each), naming the size flags: torch would fail inside the model's construction, or take hours to build a
    hundred million layers first."""
    import os

    task = set_objective(args.task)
    value = {key: getattr(args, key) if getattr(args, key) is not None else default
             for key, default in {**MODEL_DEFAULTS, **task.defaults}.items()}
    width, inducing = value["hidden_size"], value["num_inducing_points"] or 0
    blocks = value["num_hidden_layers"] * (2 if inducing else 1) + 1 + max(value["num_decoder_layers"], 0)
    parameters = 6 * width * width * blocks + max(inducing, 0) * width * value["num_hidden_layers"]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if parameters * 16 > memory:
        given = [f"--{key} {getattr(args, key)}" for key in ("hidden_size", "num_hidden_layers", "num_inducing_points",
                                                             "num_decoder_layers") if getattr(args, key) is not None]
        raise SystemExit(f"{', '.join(given) or 'These sizes'}: a model of about {parameters:,} parameters needs "
                         f"{parameters * 16 / 2**30:,.0f} GiB to train (weights, gradients, AdamW), more than this "
                         f"machine's {memory / 2**30:,.0f} GiB: pass smaller sizes.")


def datasets(args, seed):
    """The training sets (a large index range) and the fresh evaluation sets (another seed)."""
    options = dict(min_size=args.min_size, max_size=args.max_size)
    options.update({option: getattr(args, flag) for option, flag in set_objective(args.task).dataset_flags.items()})
    return (make_set_task(args.task, args.train_sets, seed, **options),
            make_set_task(args.task, args.eval_sets, seed + 1_000_000, **options))


def describe_model(args):
    """The model's name in the results: "ISAB(16)+PMA, linear elu", "SAB+PMA, softmax, init 0.05", "deepsets_max"."""
    if args.model != "set_transformer":
        return args.model
    return (
        f"{'ISAB(%d)' % args.num_inducing_points if args.num_inducing_points else 'SAB'}+PMA, {args.attention_type}"
        + (f" {args.feature_map}" if args.attention_type == "linear" else "")
        + (f", {args.norm_type}" if args.norm_type != "scalenorm" else "")
        + (f", init {args.initializer_range:g}" if args.initializer_range != 0.02 else "")
    )


def continued_run(args):
    """The steps and training wall seconds of the run --model_name_or_path continues, when its results are at
    hand."""
    if not (args.model_name_or_path and (Path(args.model_name_or_path) / "all_results.json").is_file()):
        return {}
    path = Path(args.model_name_or_path) / "all_results.json"
    try:
        parent = json.loads(path.read_text())
        seconds, earlier = parent.get("train_wall_seconds"), parent.get("train_wall_seconds_before", 0.0)
        return {
            "steps_before": parent["steps"] + parent.get("steps_before", 0),
            "train_wall_seconds_before": None if seconds is None or earlier is None else seconds + earlier,
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # damaged: the model itself loaded
        logger.warning(f"[train_sets] {path} is unreadable or not a run's results ({type(err).__name__}: {err}): "
                       "this run's results do not count the steps before it")
        return {"steps_before": None, "train_wall_seconds_before": None}


def main(argv=None):
    parser = HfArgumentParser((SetArguments, CheckedTrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if flags_file(argv):  # one JSON file of flags, its values typed as the command line's text is
        values = read_flags_file(argv[0])
        parse_flags(check_flags, parser, values)
        args, training_args = parse_flags(parser.parse_dict, typed_flag_values(parser, values, argv[0]))
        given = set(values)
    else:
        parse_flags(check_flags, parser, argv)  # a misspelt flag: named, with the nearest one
        args, training_args = parse_flags(parser.parse_args_into_dataclasses, args=argv)
        given = explicit_flags(parser, argv)
    args.flags_given = frozenset(given)  # a flag the task cannot use is refused if given
    log_to_stdout(main_process=training_args.process_index == 0)  # this script's and the toolkit's lines: stdout
    check_arguments(args)
    if training_args.push_to_hub and args.model != "set_transformer":
        raise SystemExit(f"--push_to_hub publishes a Set Transformer: --model {args.model} is a plain torch module "
                         "without a config.json, which would not load from the Hub.")
    # read before anything is made: a model or checkpoint that does not load leaves no output folder behind
    check_resume_checkpoint(training_args)
    # the model continued must not lie in the folder the run writes (an --overwrite_output_dir would delete it)
    deepspeed = training_args.deepspeed if isinstance(training_args.deepspeed, str) else None
    check_inputs_outside(training_args.output_dir, {"--model_name_or_path": args.model_name_or_path,
                                                    "--deepspeed": deepspeed}, script="train_sets")
    model = load_model(args) if args.model_name_or_path else None
    # held while main runs, released however it ends (main can run again in one process after an error); the release
    # removes the lock file, and the folder if the run made it and wrote nothing into it
    lock = lock_output_dir(training_args, " ".join(argv), script="train_sets")
    try:  # a full disk or Ctrl-C at any point (the final model, results): one line naming what to resume
        with stops_say_where_to_resume(training_args.output_dir, script="train_sets"):
            return run(args, training_args, model)
    finally:
        lock.release()
        if training_args.world_size > 1:
            # the Trainer and its model went with `run`: free them now, while the interpreter is whole. A sharded
            # model's parameters hold the process groups (their device mesh); destroyed at interpreter exit instead,
            # gloo's threads can abort a process whose work is done ("terminate called without an active exception")
            gc.collect()


def run(args, training_args, model=None):
    """main's work, under the output folder's lock; `model`: the one of --model_name_or_path."""
    check_output_dir(training_args, args.overwrite_output_dir, script="train_sets")
    set_seed(training_args.seed)
    task = set_objective(args.task)
    for key, value in {**MODEL_DEFAULTS, **task.defaults}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    train_dataset, eval_dataset = datasets(args, training_args.seed)
    model = model or build_model(args)
    parameters, name = sum(p.numel() for p in model.parameters()), describe_model(args)
    logger.info(f"[train_sets] {args.task}: {name}, {parameters:,} parameters")
    training_args.remove_unused_columns = False
    if task.label_names is not None:
        training_args.label_names = list(task.label_names)
    # `--resume_from_checkpoint true`: the newest complete checkpoint in --output_dir, or a fresh start if none;
    # checkpoints carry a completion marker with the training time so far, so a resumed run reports the whole run's
    resume = resolve_resume(training_args, script="train_sets")
    if resume:  # its files whole (a damaged one is named, with the checkpoint before it), of this run's model
        check_checkpoint_files(resume)
        check_checkpoint_matches(resume, model)
    # the run's settings: the baselines have no config.json, so their name is what tells deepsets_max from _sum
    settings = run_settings(training_args, model=args.model, hidden_size=args.hidden_size, task=args.task,
                            **{name: getattr(args, name) for name in RUN_DATA})
    if resume:
        check_run_settings(resume, settings, script="train_sets")
    timed, _, callbacks = timed_callbacks(resume)
    record_run_settings(callbacks, settings)
    # The Trainer's own push uploads at every save, training_args.bin (a pickle), the run's lock and a model folder
    # being moved into place included: push_folder_to_hub uploads the final model's files alone, at the end.
    push_requested, training_args.push_to_hub = training_args.push_to_hub, False
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForSets(packed=args.packing),
        compute_loss_func=task.loss if args.model == "set_transformer" else None,  # the rFF baselines: their own
        callbacks=callbacks,
    )
    before = continued_run(args)  # the run this one continued (--model_name_or_path), read before training
    start = time.time()
    train_unless_finished(trainer, resume, script="train_sets")
    process_seconds = time.time() - start
    # None where a resumed checkpoint did not record the time before it
    wall_seconds = None if resume and timed.before is None else (timed.before or 0.0) + process_seconds
    save_model_atomically(trainer)
    trainer.save_state()
    results = {
        "task": args.task,
        "model": name,
        "parameters": parameters,
        "train_wall_seconds": wall_seconds,  # the whole run's, resumes included (the timer's wall clock)
        "train_wall_seconds_this_process": process_seconds,
        "steps": trainer.state.global_step,
        "batch_size": training_args.per_device_train_batch_size * training_args.world_size,
        "learning_rate": training_args.learning_rate,
        "lr_scheduler": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "threads": torch.get_num_threads(),
        "packing": args.packing,
        "continued_from": args.model_name_or_path,  # steps and train_wall_seconds are this run's; *_before the parent's
        **before,
    }
    if args.model == "set_transformer":  # the depth, for the results table
        results.update({key: getattr(args, key) for key in
                        ("hidden_size", "num_hidden_layers", "num_decoder_layers", "initializer_range")})
    eval_batch = training_args.per_device_eval_batch_size
    logger.info(f"[train_sets] evaluation: {task.protocol} ({len(eval_dataset):,} sets)")
    results.update(task.evaluate(trainer.model, eval_dataset, eval_batch, args.value_scale))
    results["paper"] = dict(task.paper)
    if trainer.is_world_process_zero():
        write_text_atomically(Path(training_args.output_dir) / "all_results.json", json.dumps(results, indent=2))
        logger.info("[train_sets] " + json.dumps(results, indent=1))
        if push_requested:
            out, repo_id = Path(training_args.output_dir), training_args.hub_model_id
            # README.md, as the Trainer's push wrote it; a packed run says so in its tags
            trainer.create_model_card(model_name=repo_id, tags=["packed-batches"] if args.packing else None)
            try:
                info = push_folder_to_hub(out, repo_id, training_args.hub_token, training_args.hub_private_repo)
            except (HubUnreachableError, UnpublishableFolderError) as err:
                raise SystemExit(f"[train_sets] the run is saved in {out}, but not pushed: {err}") from None
            logger.info(f"[train_sets] pushed to {repo_id}: {getattr(info, 'commit_url', info)}")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # several processes: leave the process group before exiting
    return results


if __name__ == "__main__":
    main()

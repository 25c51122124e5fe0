"""Train a hf_settransformer language model on WikiText-2 with the transformers Trainer (and accelerate).

Any family (`--family decoder|encoder|set_transformer|perceiver_io`), softmax or linear attention, as a causal LM, a
next-token head or a masked LM (`--objective mlm`). Every `TrainingArguments` flag works; the script's own flags, its
presets and their checks are `hf_settransformer.toolkit.lm_arguments`. It writes the model, the tokenizer,
`all_results.json` and a model card to `--output_dir`. From the repository root, tuned defaults (docs/results.md):

    python scripts/train_lm.py --family decoder --attention_type linear --do_train --do_eval --do_predict \\
        --train_file ../shared/data/wikitext-2/wiki.train.tokens \\
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens \\
        --test_file ../shared/data/wikitext-2/wiki.test.tokens \\
        --output_dir outputs/decoder-linear --max_train_minutes 90

Several processes or GPUs (`accelerate launch`), resuming, publishing and every default: docs/training.md.
"""

import gc
import hashlib
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # --help and a refused flag answer before the Trainer, datasets and the data code load
    from hf_settransformer.toolkit.lm_arguments import parse_arguments

    parse_arguments(sys.argv[1:])

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer, set_seed

from hf_settransformer.toolkit import (  # importing hf_settransformer registers the models with the Auto classes
    build_word_tokenizer,
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
from hf_settransformer.toolkit.averaging import WeightAveragingCallback
from hf_settransformer.toolkit.budget import max_steps_for_budget
from hf_settransformer.toolkit.cards import data_file_record
from hf_settransformer.toolkit.checkpoint_files import (
    check_checkpoint_files,
    check_checkpoint_matches,
    check_loaded_weights,
    check_model_weights,
)
from hf_settransformer.toolkit.cli import (
    check_data_file,
    check_pretrained_name,
    check_tokenizer_folder,
    load_pretrained,
)
from hf_settransformer.toolkit.hub import HubUnreachableError, UnpublishableFolderError
from hf_settransformer.toolkit.language_modeling import PackedLinesDataset, PackedRowsCollator, lm_flops_per_token
from hf_settransformer.toolkit.lm_arguments import UNTUNED_PRESETS, check_arguments, new_config, parse_arguments
from hf_settransformer.toolkit.machine import run_environment
from hf_settransformer.toolkit.measure import (
    model_flops_utilization,
    replica_checksums,
    sharding_of,
    tokens_per_step,
)
from hf_settransformer.toolkit.objectives import auto_class_for_flag, example_length
from hf_settransformer.toolkit.optimizers import MUON_ADJUST_LR, MUON_MOMENTUM, MethodsTrainer, hidden_matrix_names
from hf_settransformer.toolkit.resume_settings import check_run_settings, file_digest, run_settings
from hf_settransformer.toolkit.run_folder import (
    check_inputs_outside,
    check_output_dir,
    check_resume_checkpoint,
    record_run_settings,
    save_model_atomically,
    stops_say_where_to_resume,
    write_text_atomically,
)
from hf_settransformer.toolkit.run_lock import lock_output_dir

ROOT = Path(__file__).resolve().parents[1]
LOCAL_WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2"
logger = transformers.utils.logging.get_logger("hf_settransformer.scripts")


# ----------------------------------------------------------------------------------------------------------- data


def data_files(data_args):
    """{split: path} of the local text files given (--train_file, --validation_file, --test_file)."""
    files = (("train", data_args.train_file), ("validation", data_args.validation_file), ("test", data_args.test_file))
    return {split: path for split, path in files if path is not None}


def check_inputs(model_args, data_args, training_args):
    """Refuses, naming the flag, what the run would read and cannot: a data file that is missing, a folder or not
    text, or not given for --do_eval / --do_predict; a --model_name_or_path whose config does not load; a --tokenizer_name or --resume_from_checkpoint that is no
    folder (nor Hub id). Called before the output folder is made, so that such a run leaves nothing behind."""
    files = data_files(data_args)
    for split, path in files.items():
        check_data_file(f"--{split}_file", path)
    if files:  # the splits are the files given: an evaluation without its file is refused before any is read
        if "validation" not in files and "do_eval" in getattr(model_args, "flags_given", ()):
            raise SystemExit("--do_eval needs a validation split: pass --validation_file (or a dataset with one).")
        if "test" not in files and training_args.do_predict:
            raise SystemExit("--do_predict needs a test split: pass --test_file (or a dataset with one).")
    if model_args.model_name_or_path:  # its config: a folder or Hub repo that holds a model (the weights load later)
        load_pretrained("--model_name_or_path", model_args.model_name_or_path, AutoConfig.from_pretrained,
                        trust_remote_code=model_args.trust_remote_code)
        check_model_weights("--model_name_or_path", model_args.model_name_or_path)  # a local folder's: there, whole
    if model_args.tokenizer_name:
        check_pretrained_name("--tokenizer_name", model_args.tokenizer_name)
        check_tokenizer_folder("--tokenizer_name", model_args.tokenizer_name)
    elif model_args.model_name_or_path:
        check_tokenizer_folder("--model_name_or_path", model_args.model_name_or_path, model=True)
    check_resume_checkpoint(training_args)


def read_paths(model_args, data_args, training_args, argv):
    """{flag: path} of everything the run reads, which must not lie in its --output_dir (`check_inputs_outside`)."""
    import sys

    paths = {"--model_name_or_path": model_args.model_name_or_path, "--tokenizer_name": model_args.tokenizer_name,
             **{f"--{split}_file": path for split, path in data_files(data_args).items()},
             # a local dataset folder, which `datasets.load_dataset` reads where no files are given
             "--dataset_name": None if data_files(data_args) else data_args.dataset_name,
             "--deepspeed": training_args.deepspeed if isinstance(training_args.deepspeed, str) else None}
    if argv is None and len(sys.argv) == 2 and sys.argv[1].endswith(".json"):  # the flags file (parse_arguments)
        paths["the flags file"] = sys.argv[1]
    return paths


def settings_of_run(model_args, data_args, training_args, tokenizer):
    """What defines this run besides its model (the checkpoint's config.json) and its length: the training settings
    (`run_settings`), the data (the training text by content, or the dataset's name), the tokenizer's vocabulary, the
    example shape, the objective's flags and the precision it resolved to. Recorded in every checkpoint; a resume must
    keep them (`check_run_settings`)."""
    train = data_files(data_args).get("train")
    data = ({"train_file_sha256": file_digest(train)} if train else
            {"dataset_name": data_args.dataset_name, "dataset_config_name": data_args.dataset_config_name})
    # which word each id stands for (a tokenizer of the same size but other ids fits the checkpoint's config)
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]))
    data["vocabulary_sha256"] = hashlib.sha256(vocabulary.encode()).hexdigest()
    clock = data_args.budget_clock  # the clock the time is counted on: "auto" is the CPU's on a CPU, else the wall's
    if clock == "auto":
        clock = "cpu" if training_args.device.type == "cpu" else "wall"
    return run_settings(training_args, **data, **{name: getattr(data_args, name) for name in (
        "block_size", "context_length", "target_length", "mlm_probability", "targets_per_epoch", "max_train_tokens",
        "packing", "optimizer", "decay_fraction", "average_weights", "average_fraction", "ema_decay")},
        budget_clock=clock, objective=model_args.objective, next_token_mode=model_args.next_token_mode,
        precision=resolved_precision(training_args))


def resolved_precision(training_args):
    """What the run computes in: "bf16", "fp16" or "fp32" (--precision auto is one of them on each machine)."""
    return "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"


def load_splits(data_args):
    """-> {split: list of lines}. Local files when given (checked by `check_inputs`), else
    `datasets.load_dataset(name, config)`."""
    import datasets

    files = data_files(data_args)
    if files:
        # utf-8-sig: a byte-order mark is not the first word's (check_data_file refuses what is not UTF-8)
        raw = datasets.load_dataset("text", data_files=files, encoding="utf-8-sig")
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
        given = getattr(model_args, "flags_given", None) or {word.lstrip("-") for word in command.split()}
        if "do_eval" in given:  # --do_eval, --do-eval true, or in a JSON file of flags
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


def training_datasets(model, streams, data_args, seed, eos_id):
    """The training examples (--packing: the lines, packed into rows) and the periodic evaluation's (the first
    --periodic_eval_targets validation tokens)."""
    length = example_length(model, data_args.block_size)
    validation = streams.get("validation")
    periodic = None if validation is None else validation[: data_args.periodic_eval_targets + length]
    datasets = []
    for stream, source in ((streams["train"], "train"), (periodic, "validation")):
        try:
            if data_args.packing and source == "train":  # the periodic evaluation reads blocks of the running text
                datasets.append(PackedLinesDataset(stream, data_args.block_size, eos_id))
                continue
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


# ---------------------------------------------------------------------------------------------------------- model


def build_model(model_args, data_args, vocab_size, eos_id):
    """The model of --model_name_or_path, or a new one of --family at --preset with --config_overrides."""
    auto = auto_class_for_flag(model_args.objective)
    if model_args.model_name_or_path:
        if model_args.config_overrides:
            raise SystemExit("--config_overrides applies to new models, not to --model_name_or_path.")
        shapes = check_model_weights("--model_name_or_path", model_args.model_name_or_path)
        model = load_pretrained("--model_name_or_path", model_args.model_name_or_path, auto.from_pretrained,
                                trust_remote_code=model_args.trust_remote_code)
        check_loaded_weights("--model_name_or_path", model_args.model_name_or_path, shapes, model)
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


def describe_model(model, model_args):
    """The head of all_results.json: family, objective, attention, preset, design and output layer."""
    config, objective = model.config, objective_of(model)
    return {"family": model_args.family, "objective": objective.flag,
            "attention": config.attention_type, "feature_map": config.feature_map,
            "linear_attention_decay": config.linear_attention_decay, "preset": model_args.preset,
            "next_token_mode": objective.next_token_mode,
            "adaptive_softmax_cutoffs": config.adaptive_softmax_cutoffs,
            "adaptive_input_cutoffs": config.adaptive_input_cutoffs,
            "tie_adaptive_weights": getattr(config, "tie_adaptive_weights", False)}


def describe_training(model, training_args, length, data_args):
    """The sizes and hyper-parameters a tuning table compares (all_results.json `hyperparameters`), the training
    methods among them: the optimizer (with Muon: how many parameters it trains, its learning-rate adjustment and
    momentum) and the warmup-stable-decay schedule's decay fraction. A run that only evaluates records the sizes: no
    optimizer, schedule or learning rate acted on its weights (nor does its card name any)."""
    config, hidden = model.config, hidden_matrix_names(model)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_self_attends_per_block", None)
    sizes = {
        "hidden_size": config.hidden_size,
        "layers": layers,
        "dropout": config.hidden_dropout_prob,
        "attention_dropout": config.attention_probs_dropout_prob,
        "sequence_length": length,
        "target_length": getattr(config, "target_length", None) if config.windowed_heads else None,
        "seed": training_args.seed,
    }
    if not training_args.do_train:
        return sizes
    return {
        **sizes,
        "examples_per_step": tokens_per_step(training_args, length) // length,
        "learning_rate": training_args.learning_rate,
        "weight_decay": training_args.weight_decay,
        "warmup_steps": training_args.warmup_steps,
        "lr_scheduler_type": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "decay_fraction": data_args.decay_fraction,
        "optimizer": data_args.optimizer,
        **({"muon_parameters": sum(p.numel() for n, p in model.named_parameters() if n in hidden),
            "muon_adjust_lr_fn": MUON_ADJUST_LR, "muon_momentum": MUON_MOMENTUM}
           if data_args.optimizer == "muon" else {}),
    }


def training_methods(data_args, training_args):
    """The optimizer, schedule and weight average of the run in words, with why an `auto` one fell back."""
    scheduler = str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type))
    decay = f" (the last {data_args.decay_fraction:.0%} decaying)" if data_args.decay_fraction is not None else ""
    average = (f"the last {data_args.average_fraction:.0%} of the steps averaged ({data_args.average_weights})"
               if data_args.average_weights != "none" else "no weight average")
    optim = str(getattr(training_args.optim, "value", training_args.optim))
    optimizer = f"Muon for the hidden weight matrices, {optim} the rest" if data_args.optimizer == "muon" else optim
    fallback = "".join(f"; {note}" for note in getattr(data_args, "methods_fallback", []))
    return f"training methods: {optimizer}, {scheduler} schedule{decay}, {average}{fallback}"


# ----------------------------------------------------------------------------------------- evaluation and outputs


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
        metrics["tokens_evaluated"], metrics["split_tokens"] = len(stream), len(streams[split])  # --max_eval_tokens
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
        try:
            info = push_folder_to_hub(out, repo_id, trainer.args.hub_token, trainer.args.hub_private_repo)
        except HubUnreachableError as err:
            raise SystemExit(f"[train_lm] the run is saved in {out}, but not pushed: {err}. Push it later with "
                             f"`python scripts/push_run.py {out} {repo_id}`.") from None
        except UnpublishableFolderError as err:  # what it wrote would not load: nothing was uploaded
            raise SystemExit(f"[train_lm] the run is saved in {out}, but not pushed: {err}") from None
        logger.info(f"[train_lm] pushed to {repo_id}: {getattr(info, 'commit_url', info)}")


# ----------------------------------------------------------------------------------------------------------- main


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
    if data_args.packing and objective_of(model).name not in ("causal_lm", "masked_lm"):
        raise SystemExit(f"--packing trains a causal LM (--family decoder) or a masked LM (--objective mlm); "
                         f"{type(model).__name__} trains on windows of the running text, every one full (nothing to "
                         "pack).")
    train_dataset, eval_dataset = training_datasets(model, streams, data_args, training_args.seed, eos_id)
    # The Trainer's own push uploads at every save, training_args.bin (a pickle) included: push_folder_to_hub uploads
    # the final folder instead, safetensors, JSON, code and text only.
    push_requested, training_args.push_to_hub = training_args.push_to_hub, False
    if data_args.train_token_budget:
        training_args.max_steps = max(1, data_args.train_token_budget // tokens_per_step(training_args, length))

    resume = resolve_resume(training_args, script="train_lm") if training_args.do_train else None
    if resume:  # its files whole (a damaged one is named, with the checkpoint before it), of this run's model
        check_checkpoint_files(resume)
        check_checkpoint_matches(resume, model)
    settings = settings_of_run(model_args, data_args, training_args, tokenizer)
    if resume:  # and of this run's settings: the optimizer, schedule and data position come from the checkpoint
        check_run_settings(resume, settings, script="train_lm")
    timer, budget, callbacks = timed_callbacks(resume, data_args.budget_clock, data_args.max_train_minutes,
                                               training_args.device)
    record_run_settings(callbacks, settings)
    averaging = None
    if data_args.average_weights != "none":  # before the checkpoint's completion marker: its file is in the checkpoint
        averaging = WeightAveragingCallback(data_args.average_weights, data_args.average_fraction, data_args.ema_decay,
                                            resume_from=resume)
        callbacks.insert(0, averaging)
    objective = objective_of(model)
    collator = objective.collator(tokenizer, data_args.mlm_probability)
    if data_args.packing:
        collator = PackedRowsCollator(masking=collator)  # a masked LM's masking, else the lines' own labels
    trainer = MethodsTrainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             processing_class=tokenizer, data_collator=collator, callbacks=callbacks,
                             optimizer=data_args.optimizer, decay_fraction=data_args.decay_fraction)
    environment = run_environment(trainer)
    if budget is not None and training_args.do_train:
        trainer.args.max_steps = max_steps_for_budget(trainer, budget.minutes, timer, script="train_lm")
        budget.replan_with(trainer)  # slower than the probe: fewer steps, the schedule still ending on the last
    parameters = sum(p.numel() for p in model.parameters())
    untuned = " (initial values, untuned: no GPU sweep yet)" if model_args.preset in UNTUNED_PRESETS else ""
    say(f"[train_lm] {type(model).__name__}: {parameters:,} parameters (preset {model_args.preset}{untuned}), "
        f"{len(train_dataset):,} training examples of {length} tokens, max_steps={trainer.args.max_steps}, "
        f"{environment['precision']}, {torch.get_num_threads()} threads")
    if training_args.do_train:
        say(f"[train_lm] {training_methods(data_args, training_args)}")
    if environment["gpu_name"]:
        optim = getattr(training_args.optim, "value", training_args.optim)
        say(f"[train_lm] {environment['gpu_name']} x {training_args.world_size}: optim {optim}, "
            f"torch_compile {training_args.torch_compile}, {training_args.dataloader_num_workers} dataloader workers, "
            f"eval batch {training_args.per_device_eval_batch_size}")
    results = {**describe_model(model, model_args), "parameters": parameters, **environment,
               "hyperparameters": describe_training(model, training_args, length, data_args), "command": command}
    results.update({name: getattr(data_args, name) for name in objective.recorded_arguments})
    results["packing"] = data_args.packing
    files = data_files(data_args)
    if files:  # local files: their digests tell the model card whether they are WikiText-2's own
        results["data_files"] = data_file_record(files)
    if training_args.do_train:
        results.update(train_and_measure(trainer, resume, timer, budget, length, script="train_lm"))
        if averaging is not None:
            if averaging.average is not None and not averaging.applied:  # resumed after the last step: not trained
                averaging.apply(model)
                save_model_atomically(trainer)
            results.update(averaging.record())  # the weights evaluated and saved below are the average
            if averaging.applied:
                results["selected_by"] = f"{data_args.average_weights} weight average"
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


def main(argv=None):
    model_args, data_args, training_args, command = parse_arguments(argv)
    log_to_stdout(main_process=training_args.process_index == 0)  # this script's and the toolkit's lines: stdout
    check_arguments(model_args, data_args, training_args)
    check_inputs(model_args, data_args, training_args)  # before anything is made: a bad input leaves nothing behind
    check_inputs_outside(training_args.output_dir, read_paths(model_args, data_args, training_args, argv),
                         script="train_lm")
    # this run owns --output_dir until it ends: a second run on the folder stops here, naming this one. Released when
    # main ends however it ends, so that main can run again in one process (a notebook, a test) after an error; the
    # release removes the lock file, and the folder if the run made it and wrote nothing into it
    lock = lock_output_dir(training_args, command, script="train_lm")
    try:  # a full disk or Ctrl-C at any point (the final model, results, card): one line naming what to resume
        with stops_say_where_to_resume(training_args.output_dir, script="train_lm"):
            return run(model_args, data_args, training_args, command)
    finally:
        lock.release()
        if training_args.world_size > 1:
            # the Trainer and its model went with `run`: free them now, while the interpreter is whole. A sharded
            # model's parameters hold the process groups (their device mesh); destroyed at interpreter exit instead,
            # gloo's threads can abort a process whose work is done ("terminate called without an active exception")
            gc.collect()


if __name__ == "__main__":
    main()

"""Model cards: the `README.md` a run's folder and its Hub repository carry, filled from the run's results.

The templates are package data (`model_cards/` beside this module, `CARD_TEMPLATES`), so an installed package writes
cards as a checkout does. `lm_model_card_fields` turns a language-model run's `all_results.json` into the templates'
`${name}` fields (None for what the run did not measure, whose lines the card leaves out), `card_config` keeps the
config fields that bear on the model, `hub_training_command` gives the command a Hub reader can run (the `datasets`
name of WikiText-2 in place of local copies of its files), `write_lm_model_card` writes the card of a trained or
pushed model, and `refresh_model_card` writes it again from a finished run's folder (for another Hub name, or after a
change to the templates) without reading the weights, or from a results folder that kept only all_results.json (the
released cards of model_cards/, scripts/make_model_cards.py).

Needs torch and transformers only; the modeling files never import it.
"""

import hashlib
import json
import math
from pathlib import Path
from string import Template

import torch
import transformers

from ..attention import attention_kernel
from .objectives import MLM_PROBABILITY, is_masked_lm, lm_objectives, objective_of
from .run_folder import write_text_atomically

CARD_TEMPLATES = Path(__file__).resolve().parent / "model_cards"  # package data: lm_model_card.md, mlm_model_card.md
# WikiText-2's three files (`wikitext-2-v1`; PyTorch's word_language_model ships them byte-identical as train.txt,
# valid.txt, test.txt): a run that read these is described to a Hub reader by the `datasets` name of the same data
WIKITEXT2_SHA256 = {
    "train": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",  # wiki.train.tokens
    "validation": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",  # wiki.valid.tokens
    "test": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",  # wiki.test.tokens
}
WIKITEXT2_DATASET_FLAGS = "--dataset_name wikitext --dataset_config_name wikitext-2-v1"
# train_lm.py's data flags: split -> local file flag, and the `datasets` ones
_FILE_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}
_DATA_FLAGS = (*_FILE_FLAGS.values(), "--dataset_name", "--dataset_config_name")
# config fields that bear on a language model only in some cases: field -> (config, the head's `OBJECTIVES` row) ->
# whether it does
_FIELD_APPLIES = {
    "input_size": lambda config, objective: config.input_size is not None,  # the language models read token ids
    "pooling": lambda config, objective: objective.next_token_mode is not None,  # the next-token heads pool
    "context_length": lambda config, objective: "context_length" in objective.data_flags,  # not the decoder's block
    "next_token_mode": lambda config, objective: objective.next_token_mode is not None,
    "target_length": lambda config, objective: "target_length" in objective.data_flags,
    "adaptive_softmax_div_value": lambda config, objective: config.adaptive_softmax_cutoffs is not None,
    "adaptive_input_div_value": lambda config, objective: config.adaptive_input_cutoffs is not None,
    "tie_adaptive_projections": lambda config, objective: getattr(config, "tie_adaptive_weights", False),
    "num_output_queries": lambda config, objective: getattr(config, "output_query_type", None) == "learned",
}


# all_results.json's keys that a card reads -> (the JSON types their value must have, in words); None or absent: not
# measured, where the card allows it (`RESULTS_NEEDED` lists those it does not)
_NUMBER, _INTEGER, _TEXT = ((int, float), "a number"), ((int,), "an integer"), ((str,), "a string")
RESULT_TYPES = {
    **dict.fromkeys(("validation_perplexity", "test_perplexity", "validation_accuracy", "test_accuracy",
                     "train_tokens_per_wall_second", "train_tokens_per_cpu_second", "wall_time_seconds",
                     "train_cpu_minutes", "model_flops_per_token", "train_model_flops_per_wall_second", "mfu",
                     "mlm_probability"), _NUMBER),
    **dict.fromkeys(("parameters", "train_tokens", "train_steps", "selected_step", "resumed_from_step",
                     "threads_per_process"), _INTEGER),
    **dict.fromkeys(("family", "objective", "command", "eval_protocol", "cpu_model", "gpu_name", "precision", "device",
                     "selected_by", "mfu_note", "model_flops_formula", "transformers_version", "torch_version"), _TEXT),
    **dict.fromkeys(("hyperparameters", "config", "data_files"), ((dict,), "a JSON object")),
}
RESULTS_NEEDED = ("family", "parameters", "wall_time_seconds", "eval_protocol", "cpu_model", "threads_per_process",
                  "precision", "device")


def read_results(run_dir, needed=RESULTS_NEEDED):
    """`run_dir`/all_results.json, a dict whose keys a card reads hold what the card needs (`RESULT_TYPES`) and has
    the keys of `needed`; else a ValueError naming the file and each wrong key (a file cut short, a perplexity stored
    as a string), not a formatting error from inside the card."""
    path = Path(run_dir) / "all_results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): cut short or damaged; no model card from it.") from None
    if not isinstance(results, dict):
        raise ValueError(f"{path} holds a JSON {type(results).__name__}, not an object: no model card from it.")
    wrong = [f"{key} is {value!r}, not {what}" for key, ((kinds, what)) in RESULT_TYPES.items()
             if (value := results.get(key)) is not None and (isinstance(value, bool) or not isinstance(value, kinds))]
    wrong += [f"no {key}" for key in needed if results.get(key) is None]
    if wrong:
        raise ValueError(f"{path}: {'; '.join(wrong)}: not a run's results as train_lm.py writes them; no model card "
                         "from it.")
    return results


def write_model_card(output_dir, template, **fields):
    """Fills the `${name}` fields of the Markdown `template` (a path) with `fields` (`string.Template`; fields not
    given stay as written) and writes it to `output_dir/README.md` atomically, where `save_pretrained` and the Hub
    look for a model card. A field given as None was not measured: every line of the template that uses it is left
    out (a table row, say), rather than showing "None". Returns the card's path."""
    path = Path(output_dir) / "README.md"
    write_text_atomically(path, _fill(template, fields))
    return path


def _fill(template, fields):
    """`write_model_card`'s text, unwritten."""
    unmeasured = {name for name, value in fields.items() if value is None}
    lines = [line for line in Path(template).read_text().splitlines(keepends=True)
             if not unmeasured & _field_names(line)]
    return Template("".join(lines)).safe_substitute(**fields)


def _field_names(text):
    """The `${name}` and `$name` fields `text` uses."""
    return {m.group("braced") or m.group("named") for m in Template.pattern.finditer(text)} - {None}


def lm_model_card_fields(model, results, family=None, block_size=None, mlm_probability=MLM_PROBABILITY):
    """The `${name}` fields of the language-model card templates (`CARD_TEMPLATES`: lm_model_card.md, and
    mlm_model_card.md for a masked LM) for `model`, from a run's `results` (the keys scripts/train_lm.py writes to
    all_results.json: parameters, {validation,test}_{perplexity,accuracy}, train_tokens, train_tokens_per_wall_second,
    train_tokens_per_cpu_second, wall_time_seconds, eval_protocol, cpu_model, threads_per_process, precision,
    train_cpu_minutes, train_steps, device; where present resumed_from_step, selected_step, selected_by, gpu_name,
    the model FLOPs of `model_flops_utilization`, and the run's transformers_version and torch_version, else the
    installed ones). `family` defaults to the one `model_type` names. What the run did not measure (no --do_eval,
    --do_predict or --do_train: no perplexity, no training speed) is None, so that `write_model_card` leaves its lines
    out. `repo_id`, `command`, `data_note` and `model_index` are the caller's to add (as `write_lm_model_card` does);
    then `write_model_card(output_dir, template, **fields)`."""
    config, objective = model.config, objective_of(model)
    trained = _measured(results, "train_tokens") is not None
    family = family or config.model_type.removeprefix("hfst_")
    attention_tag, attention = attention_kernel(config).describe(config)
    return dict(
        family=family,
        model_class=type(model).__name__,
        attention=attention,
        attention_tag=attention_tag,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        context=_card_context(objective, model, block_size),
        mlm_percent=f"{mlm_probability:.0%}",
        parameters=f"{results['parameters']:,}",
        vocab_size=config.vocab_size,
        val_ppl=_measured(results, "validation_perplexity", "{:.2f}"),
        test_ppl=_measured(results, "test_perplexity", "{:.2f}"),
        val_acc=_measured(results, "validation_accuracy", "{:.4f}"),
        test_acc=_measured(results, "test_accuracy", "{:.4f}"),
        val_scored=_card_tokens_scored(results, "validation", is_masked_lm(model)),
        test_scored=_card_tokens_scored(results, "test", is_masked_lm(model)),
        train_tokens=_card_train_tokens(results, block_size),
        training_speed=_card_training_speed(results) if trained else None,
        model_flops=_card_model_flops(results) if trained else None,
        weights=_card_weights(results) if _measured(results, "train_steps") is not None else None,
        training_methods=_card_training_methods(results) if trained else None,
        wall_time=f"{results['wall_time_seconds'] / 60:.1f} min" + (
            f" (the last process: resumed at step {results['resumed_from_step']:,})"
            if results.get("resumed_from_step") else ""),
        design=objective.design(config, family, mlm_probability),
        output_layer=(
            f"adaptive softmax (Grave et al. 2017), clusters {config.adaptive_softmax_cutoffs}, div value "
            f"{config.adaptive_softmax_div_value}; the logits are log-probabilities"
            if config.adaptive_softmax_cutoffs
            else "a vocabulary projection" + (" tied to the input embedding" if config.tie_word_embeddings else "")
        ) + (
            f"; input embedding: adaptive input (Baevski & Auli 2019), clusters {config.adaptive_input_cutoffs}, div "
            f"value {config.adaptive_input_div_value}"
            if config.adaptive_input_cutoffs
            else ""
        ),
        protocol=results["eval_protocol"],
        cpu_model=results["cpu_model"],
        hardware=(f"{results['gpu_name']}, CPU {results['cpu_model']}" if results.get("gpu_name")
                  else results["cpu_model"] + {True: " with a bf16 kernel (AVX512-BF16 or AMX)",
                                               False: " without a bf16 kernel"}.get(results.get("cpu_fast_bf16"), "")),
        threads=results["threads_per_process"],
        precision=results["precision"],
        cpu_minutes=_measured(results, "train_cpu_minutes", "{:.1f}") or ("unknown" if trained else None),
        train_steps=_measured(results, "train_steps", "{:,}"),
        config_json=json.dumps(card_config(model), indent=2),
        transformers_version=results.get("transformers_version") or transformers.__version__,
        torch_version=results.get("torch_version") or torch.__version__,
        device=results["device"],
    )


def _measured(results, key, form="{}"):
    """`results[key]` formatted, or None where the run did not measure it (absent, None or NaN)."""
    value = results.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return form.format(value)


def _card_tokens_scored(results, split, masked):
    """How many of a split's tokens its perplexity scored: "217,646 tokens: the whole split", or "20,000 tokens: the
    first 20,000 of the split's 217,646 (`--max_eval_tokens`)"; a masked LM scores its masked tokens of them. Runs
    that did not record the split's length say only whether `--max_eval_tokens` cut it."""
    scored = results.get(f"{split}_tokens_scored")
    if scored is None:
        return "tokens scored: not recorded"
    evaluated, whole = results.get(f"{split}_tokens_evaluated"), results.get(f"{split}_split_tokens")
    text = f"{scored:,} {'masked ' if masked else ''}tokens"
    if evaluated is not None and whole is not None:
        if evaluated < whole:
            return f"{text} of the first {evaluated:,} of the split's {whole:,} (`--max_eval_tokens`)"
        return f"{text} of the split's {whole:,}" if masked else f"{text}: the whole split"
    if "--max_eval_tokens" in results.get("command", ""):
        return f"{text} from the first tokens of the split only (`--max_eval_tokens`)"
    return f"{text} of the whole split" if masked else f"{text}: the whole split"


def _card_training_speed(results):
    """all_results.json's training speeds, each named by its clock as there and in train_lm.py's table: tokens per
    CPU-second (the whole run, resumes included, all processes; the same whether or not other work shared the cores;
    on a CPU only) and tokens per wall second (this process). None where neither was measured."""
    speeds = [f"{speed} tokens per {unit}" for key, unit in (("train_tokens_per_cpu_second", "CPU-second"),
                                                            ("train_tokens_per_wall_second", "wall second"))
              if (speed := _measured(results, key, "{:,.0f}")) is not None]
    return "; ".join(speeds) or None


def _card_model_flops(results):
    """The model FLOPs of training and their utilisation of the device's peak (`model_flops_utilization`)."""
    per_token, achieved = results.get("model_flops_per_token"), results.get("train_model_flops_per_wall_second")
    if per_token is None:
        return "not recorded (a run made before train_lm.py counted them, or one that did not train)"
    text = f"{per_token / 1e6:,.1f} MFLOP per training token ({results['model_flops_formula']})"
    if achieved is None:
        return f"{text}; no training step timed in this process"
    text += f"; {achieved / 1e12:,.3g} TFLOP per wall second"
    if results.get("mfu") is None:
        return f"{text}; MFU not measured: {results['mfu_note']}"
    return f"{text}, **MFU {results['mfu']:.1%}** of {results['mfu_note']}"


def _card_training_methods(results):
    """The optimizer and schedule of a run that used train_lm.py's training methods (Muon, warmup-stable-decay with
    --decay_fraction, weight averaging); None for AdamW under another schedule without an average (the card then has
    no such line)."""
    hyper = results.get("hyperparameters", {})
    parts = []
    if hyper.get("optimizer") == "muon":
        parts.append(f"Muon for the attention and feed-forward weight matrices ({hyper['muon_parameters']:,} "
                     f"parameters; update scaled to AdamW's size, `{hyper['muon_adjust_lr_fn']}`, momentum "
                     f"{hyper['muon_momentum']}), AdamW for the rest; learning rate {hyper['learning_rate']:g}, weight "
                     f"decay {hyper['weight_decay']:g}")
    if hyper.get("decay_fraction") is not None:
        parts.append(f"warmup-stable-decay schedule: the last {hyper['decay_fraction']:.0%} of the "
                     f"{results['max_steps']:,} planned steps decay, ending at the last one")
    if results.get("average_weights"):
        parts.append(f"weights averaged (`--average_weights {results['average_weights']}`) over the last "
                     f"{results['average_fraction']:.0%} of the planned steps")
    return "; ".join(parts) or None


def _card_weights(results):
    """Which step's weights the card describes: the checkpoint selection of `train_and_measure`, or the weight
    average that replaced the last step's (--average_weights)."""
    if results.get("averaged_weights_applied"):
        kind = (f"exponential moving average (decay {results['ema_decay']})" if results["average_weights"] == "ema"
                else "mean")
        last = results["averaged_from_step"] + results["averaged_steps"] - 1
        return (f"the {kind} of the weights after steps {results['averaged_from_step']:,} to {last:,} of "
                f"{results['train_steps']:,} ({results['averaged_steps']:,} steps): these are evaluated and published")
    step = results.get("selected_step")
    if step is None:
        return f"the last step ({results['train_steps']:,})"
    if str(results.get("selected_by", "")).startswith("best"):
        return (f"step {step:,} of {results['train_steps']:,}: the checkpoint with the lowest validation loss of the "
                "periodic evaluations during training")
    return f"the last step ({step:,})"


def _card_train_tokens(results, block_size):
    tokens = _measured(results, "train_tokens", "{:,}")
    if tokens is None or not results.get("packing"):
        return tokens
    return f"{tokens}, packed (train_lm.py --packing): each line a sequence of its own in rows of {block_size} tokens"


def _card_context(objective, model, block_size):
    """The card's context: the objective's example length; None for a causal LM whose `block_size` was not given."""
    try:
        return objective.example_length(model, block_size)
    except ValueError:
        return None


def card_config(model):
    """`model`'s config as config.json holds it (less `auto_map`), with only the fields that bear on this model: none
    of another attention kernel (`feature_map` under softmax), none of the next-token windows on the decoder or a
    masked LM (`pooling`, `target_length`, ...), no width divisor of an adaptive layer that is off (`_FIELD_APPLIES`).
    The weights load from config.json itself; this is what a card's reader needs to know of the model."""
    from ..attention import ATTENTION_KERNELS  # a registry, not a toolkit name to re-export

    config, objective = model.config, objective_of(model)
    kernel_fields = attention_kernel(config).config_fields
    other_kernels = {f for kernel in ATTENTION_KERNELS.values() for f in kernel.config_fields} - set(kernel_fields)
    return {key: value for key, value in config.to_diff_dict().items()
            if key != "auto_map" and key not in other_kernels
            and (key not in _FIELD_APPLIES or _FIELD_APPLIES[key](config, objective))}


def data_file_record(files):
    """{split: path} of the local text files a run read -> {split: {"path", "sha256"}}, what train_lm.py records in
    all_results.json as `data_files`: the card can then tell WikiText-2's own files (`WIKITEXT2_SHA256`) from other
    text, whatever their names."""
    return {split: {"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
            for split, path in files.items()}


def hub_training_command(command, data_files=None):
    """The training command as a card gives it, and a sentence on the data -> (command, sentence). A Hub reader has
    no copy of the run's local files: a run that read WikiText-2's own files (train and validation at least, by
    SHA-256 in `data_files`, see `data_file_record`) gets the `datasets` form of the same data in place of its file
    flags (`WIKITEXT2_DATASET_FLAGS`); a run that read other local files keeps its command, and the sentence says the
    data were local files. A run that loaded a dataset through `datasets` keeps its command and gets no sentence.
    An absolute `--output_dir` names a folder of the machine that trained: the card gives its last part."""
    command = _relative_output_dir(command)
    words, dropped = [], []
    remaining = iter(command.split())
    for word in remaining:
        flag = _data_flag(word)
        if flag is None:
            words.append(word)
            continue
        dropped.append(flag)
        if "=" not in word:
            next(remaining, None)  # its value
    file_flags = [flag for flag in dropped if flag in _FILE_FLAGS.values()]
    if not data_files and not file_flags:
        return command, ""
    wikitext = (data_files and {"train", "validation"} <= set(data_files)
                and all(WIKITEXT2_SHA256.get(split) == record["sha256"] for split, record in data_files.items())
                and sorted(file_flags) == sorted(_FILE_FLAGS[split] for split in data_files))
    if wikitext:
        return (" ".join(words + WIKITEXT2_DATASET_FLAGS.split()),
                "The run read local copies of WikiText-2's files (byte-identical to `wikitext-2-v1`); the command "
                "above loads the same splits through `datasets`. ")
    names = ", ".join(f"`{Path(record['path']).name}`" for record in (data_files or {}).values()) or "the `--*_file` flags"
    return command, (f"The run read local text files ({names}), which are not published with this model: the command "
                     "needs files of the same form in their place. ")


def _relative_output_dir(command):
    """`command` with an absolute `--output_dir` (any spelling: `--output-dir`, `=value`) cut to the folder's name."""
    words = command.split()
    for i, word in enumerate(words):
        if _flag_name(word) != "--output_dir":
            continue
        flag, given, value = word.partition("=")
        at = i if given else i + 1  # the word holding the path
        path = Path(value if given else words[at] if at < len(words) else "")
        if path.is_absolute():
            words[at] = f"{flag}={path.name}" if given else path.name
    return " ".join(words)


def _flag_name(word):
    """The flag a command word gives, spelt with underscores (`--output-dir=x` is `--output_dir`), or None."""
    return "--" + word[2:].split("=", 1)[0].replace("-", "_") if word.startswith("--") else None


def _data_flag(word):
    """The train_lm.py data flag `word` gives (`--train_file`, `--train-file=x`, or a prefix argparse accepts), or
    None."""
    name = _flag_name(word)
    if name is None or len(name) < 3:
        return None
    matches = [flag for flag in _DATA_FLAGS if flag.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def write_lm_model_card(output_dir, model, results, block_size, repo_id, command):
    """The filled model card (README.md) of a language-model run from its `results` (all_results.json), the template
    by objective (`CARD_TEMPLATES`). What the run did not measure is left out: the card's `model-index` lists the
    splits it evaluated (none without --do_eval and --do_predict), its table the numbers it has. The command is given
    as `hub_training_command` writes it, with `results["data_files"]`."""
    path = Path(output_dir) / "README.md"
    write_text_atomically(path, _lm_model_card(model, results, block_size, repo_id, command))
    return path


def _lm_model_card(model, results, block_size, repo_id, command):
    """`write_lm_model_card`'s text, unwritten."""
    mlm_probability = results.get("mlm_probability", MLM_PROBABILITY)
    fields = lm_model_card_fields(model, results, results["family"], block_size, mlm_probability)
    template = CARD_TEMPLATES / objective_of(model).card_template
    command, data_note = hub_training_command(command, results.get("data_files"))
    return _fill(template, dict(fields, repo_id=repo_id, command=command, data_note=data_note,
                                model_index=_model_index(repo_id, fields, is_masked_lm(model))))


def _model_index(repo_id, fields, masked):
    """The card's `model-index` metadata (the Hub's evaluation results) for the WikiText-2 splits with a perplexity
    in `fields` (`lm_model_card_fields`); "" where there is none."""
    task, task_name = ("fill-mask", "Masked language modelling") if masked else ("text-generation", "Language modelling")
    measure = "masked-token " if masked else ""
    accuracy = "masked-token accuracy" if masked else "next-token accuracy"
    entries = []
    for split, key in (("validation", "val"), ("test", "test")):
        if fields[f"{key}_ppl"] is None:
            continue
        label = split.capitalize()
        metrics = [("perplexity", fields[f"{key}_ppl"], f"{label} {measure}perplexity")]
        if fields[f"{key}_acc"] is not None:
            metrics.append(("accuracy", fields[f"{key}_acc"], f"{label} {accuracy}"))
        entries.append(
            f"  - task:\n      type: {task}\n      name: {task_name}\n    dataset:\n      type: wikitext\n"
            f"      name: WikiText-2 (wikitext-2-v1)\n      config: wikitext-2-v1\n      split: {split}\n    metrics:\n"
            + "".join(f"    - type: {kind}\n      value: {value}\n      name: {name}\n" for kind, value, name in metrics))
    return f"model-index:\n- name: {repo_id}\n  results:\n" + "".join(entries) if entries else ""


def refresh_model_card(run_dir, repo_id=None, card_path=None):
    """Writes a finished run's model card again with the current templates, from the folder's all_results.json,
    config.json and training_args.json (after a change to the card, or for another Hub name; the weights are not
    read), for the Hub repository `repo_id` (default: the run's --hub_model_id, else the folder's name), to `card_path`
    (default: the folder's README.md). A folder without config.json (results kept without the model, as
    results/wikitext2-90min-v2/ keeps them) is read from all_results.json alone: its `config` key holds config.json's
    fields. What the run did not measure (no --do_predict, say) is left out of the card. The command and the sequence
    length are the ones all_results.json records; a run that did not record them (made before train_lm.py did) is
    refused with a ValueError, and so is an all_results.json that is damaged (`read_results`). Returns the card's
    path."""
    run_dir = Path(run_dir)
    results = read_results(run_dir, needed=())  # the keys the card needs: once the folder is known to be a run
    length = results.get("hyperparameters", {}).get("sequence_length")
    unrecorded = [name for name, value in (("command", results.get("command")),
                                           ("hyperparameters.sequence_length", length)) if value is None]
    recorded = {name for row in lm_objectives().values() if row.flag == results.get("objective")
                for name in row.recorded_arguments}  # the run's objective's own arguments (--mlm_probability)
    unrecorded += sorted(name for name in recorded if name not in results)
    saved = (run_dir / "config.json").is_file()
    if not saved and not isinstance(results.get("config"), dict):
        unrecorded.append("config (and the folder has no config.json)")
    if unrecorded:
        raise ValueError(f"{run_dir}: all_results.json does not record the run's {', '.join(unrecorded)} (a run made "
                         "before train_lm.py recorded them); its model card cannot be written again from the folder.")
    config = transformers.AutoConfig.from_pretrained(run_dir) if saved else _recorded_config(results["config"])
    name = (getattr(config, "architectures", None) or [None])[0]
    model_class = _model_classes().get(name) if isinstance(name, str) else None
    if model_class is None:
        # never call a class by a name read from a file without checking it is one of ours
        raise ValueError(f"{run_dir}/config.json names the architecture {name!r}, which is not an hf_settransformer "
                         "model class.")
    read_results(run_dir)
    with torch.device("meta"):  # the card reads the config and the class; no weights needed
        model = model_class(config)
    args_file = run_dir / "training_args.json"
    if repo_id is None:
        repo_id = (json.loads(args_file.read_text()).get("hub_model_id") if args_file.is_file() else None) or run_dir.name
    path = Path(card_path) if card_path is not None else run_dir / "README.md"
    write_text_atomically(path, _lm_model_card(model, results, length, repo_id, results["command"]))
    return path


def _recorded_config(fields):
    """The config of config.json's `fields` (all_results.json's `config`), by the class of its `model_type`: only an
    hf_settransformer family's config is built from a file's words."""
    from ..families import family_for_model_type

    fields = dict(fields)
    return family_for_model_type(fields.pop("model_type", None)).config_class().from_dict(fields)


def _model_classes():
    """Class name -> class, for every model class of every family (`families.FAMILIES`)."""
    from ..families import FAMILIES

    return {cls.__name__: cls for family in FAMILIES.values() for cls in family.model_classes().values()}

"""Train a hf_settransformer language model on WikiText-2 with the transformers Trainer (and accelerate).

Any family (`decoder`, `encoder`, `set_transformer`, `perceiver_io`), softmax or linear attention. The decoder is a
causal LM over blocks of `--block_size` tokens; the other families use their `*ForNextTokenPrediction` head (the
design document's model: the last `context_length` tokens -> the family's stack -> PMA pooling -> next token).

Run from the repository root. On this project's machines (no Hub access) WikiText-2 comes from local files:

    python scripts/train_lm.py --family decoder --attention_type linear --preset small \\
        --do_train --do_eval --do_predict \\
        --train_file ../shared/data/wikitext-2/wiki.train.tokens \\
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens \\
        --test_file ../shared/data/wikitext-2/wiki.test.tokens \\
        --output_dir outputs/decoder-linear-small --train_token_budget 3000000

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

Every `TrainingArguments` flag works; as in transformers' run_clm.py, `--do_train` trains, `--do_eval` and
`--do_predict` evaluate validation and test perplexity with the protocol below. At the end the script prints a
summary and writes `all_results.json`, the model, the tokenizer and a model card (README.md) to `--output_dir`.

Evaluation protocol: each split is one token stream (whitespace-split words, an `<eos>` after every line, a leading
`<eos>` as context for the first word); every token is predicted exactly once. Decoder: sliding windows of
`block_size` tokens moved by `--eval_stride` (default block_size / 2); the tokens a window adds are scored, so each
has at least block_size - stride tokens of context (fewer only at the start). Next-token heads: for every position the
up to `context_length` preceding tokens (left padded at the start). Perplexity = exp(mean negative log-likelihood per
token); accuracy = fraction of positions whose most likely token is the reference (an `evaluate` metric).
"""

import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainerState,
    TrainingArguments,
    set_seed,
)

import hf_settransformer  # noqa: F401  (registers the models with the Auto classes)


ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {
    "decoder": "hfst_decoder",
    "encoder": "hfst_encoder",
    "set_transformer": "hfst_set_transformer",
    "perceiver_io": "hfst_perceiver_io",
}
# Named sizes. `small` trains on a 2-core CPU in about 30 minutes with the budget in the README; `base` is for a GPU.
PRESETS = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        context=16,
        initializer_range=0.1,
    ),  # 0.02 suits widths in the hundreds; at 32 it learns slowly
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512, context=64),
    "base": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048, context=256),
}
FAMILY_PRESETS = {  # what a family needs besides the shared sizes
    "set_transformer": {"num_inducing_points": 16, "num_seeds": 1, "num_decoder_layers": 1},
    "perceiver_io": {
        "num_latents": 32,
        "num_blocks": 1,
        "num_cross_attention_heads": 1,
        "output_query_type": "learned",
    },
}
LOCAL_WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2"
COMPLETE_MARKER = "hfst_checkpoint_complete.json"


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
    eval_stride: int | None = field(default=None, metadata={"help": "Decoder evaluation stride (block_size // 2)."})
    train_token_budget: int | None = field(
        default=None,
        metadata={"help": "Stop after this many input tokens have gone through the model (sets max_steps)."},
    )
    targets_per_epoch: int | None = field(
        default=None,
        metadata={"help": "Next-token heads: windows sampled per epoch (default: every training position once)."},
    )
    max_eval_tokens: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N tokens of each split only (quick runs)."}
    )
    periodic_eval_targets: int = field(
        default=4096,
        metadata={"help": "Validation tokens predicted by each evaluation during training (a quick estimate)."},
    )
    max_train_tokens: int | None = field(default=None, metadata={"help": "Use only the first N training tokens."})


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
                raise SystemExit(f"--{split if split != 'validation' else 'validation'}_file: no such file: {path}")
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


def build_word_tokenizer(lines):
    """Word-level tokenizer from the training lines: whitespace split, `<unk>` kept, `<eos>` added (ends every line).

    Tokens decode with a leading space each, so decoded continuations keep their word boundaries (the
    text-generation pipeline appends decoded new tokens to the prompt)."""
    from collections import Counter

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    counts = Counter(word for line in lines for word in line.split())
    vocab = {"<unk>": 0, "<eos>": 1}
    for word, _ in counts.most_common():  # most frequent first, ties in order of first appearance
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.Replace(Regex("^"), " ")  # a space before every word
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<eos>",
        model_input_names=["input_ids", "attention_mask"],
    )


def token_stream(lines, tokenizer, eos_id):
    """Lines -> one 1-D LongTensor of ids with an <eos> after every line (the WikiText convention)."""
    ids = []
    encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
    for line in encoded:
        ids.extend(line)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


class BlockDataset(torch.utils.data.Dataset):
    """Decoder training: the stream cut into non-overlapping blocks; labels = input_ids (shifted in the model)."""

    def __init__(self, stream, block_size):
        self.blocks = stream[: len(stream) // block_size * block_size].view(-1, block_size)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class WindowDataset(torch.utils.data.Dataset):
    """Next-token heads: `context_length` tokens and the token that follows them (labels shape ())."""

    def __init__(self, stream, context_length, num_targets=None, seed=0):
        self.stream, self.context = stream, context_length
        positions = torch.arange(context_length, len(stream))
        if num_targets is not None and num_targets < len(positions):
            g = torch.Generator().manual_seed(seed)
            positions = positions[torch.randperm(len(positions), generator=g)[:num_targets]]
        self.positions = positions

    def __len__(self):
        return len(self.positions)

    def __getitem__(self, i):
        p = int(self.positions[i])
        return {"input_ids": self.stream[p - self.context : p], "labels": self.stream[p]}


# ----------------------------------------------------------------------------------------------------------- model


def parse_overrides(text):
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise SystemExit(f'--config_overrides: expected "key=value", got {item!r}')
        key, value = (s.strip() for s in item.split("=", 1))
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare string such as pooling=mean
    return overrides


def build_model(model_args, data_args, vocab_size, eos_id):
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(
            model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code
        )
        if model_args.config_overrides:
            raise SystemExit("--config_overrides applies to new models, not to --model_name_or_path.")
        return model
    preset = dict(PRESETS[model_args.preset])
    context = preset.pop("context")
    fields = dict(
        preset,
        **FAMILY_PRESETS.get(model_args.family, {}),
        vocab_size=vocab_size,
        attention_type=model_args.attention_type,
        feature_map=model_args.feature_map,
        max_position_embeddings=max(context, data_args.block_size or 0, data_args.context_length or 0),
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=eos_id,
    )
    if model_args.family == "decoder":
        fields["max_position_embeddings"] = max(fields["max_position_embeddings"], 1024)
    else:
        fields["context_length"] = data_args.context_length or context
    if model_args.family == "perceiver_io":
        fields.pop("num_hidden_layers")
        fields["num_self_attends_per_block"] = preset["num_hidden_layers"]
    fields.update(parse_overrides(model_args.config_overrides))
    try:
        config = AutoConfig.for_model(FAMILIES[model_args.family], **fields)
    except ValueError as err:
        raise SystemExit(f"Invalid model configuration: {err}") from None
    return AutoModelForCausalLM.from_config(config)


def example_length(model, data_args):
    if model.config.model_type == "hfst_decoder":
        return data_args.block_size
    return model.config.context_length


# ----------------------------------------------------------------------------------------------------------- evaluation


def decoder_windows(stream, block_size, stride):
    """Sliding windows over `[eos] + stream`: (start, end, number of scored tokens at the end of the window)."""
    total = len(stream) + 1
    windows, prev_end = [], 1
    for begin in range(0, total, stride):
        end = min(begin + block_size, total)
        windows.append((begin, end, end - prev_end))
        prev_end = end
        if end == total:
            break
    return windows


@torch.no_grad()
def evaluate_stream(model, stream, data_args, accelerator, batch_size, eos_id, metric_path, progress=None):
    """Perplexity and next-token accuracy of `stream` under the protocol in the module docstring.

    Windows are split across processes; sums are reduced over them. `progress` (a description, e.g. "test") shows a
    progress bar over this process's batches. Returns a dict."""
    import evaluate
    from tqdm.auto import tqdm

    model.eval()
    device = accelerator.device
    full = torch.cat([torch.tensor([eos_id]), stream])
    nll = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    metric = evaluate.load(metric_path, experiment_id=f"hfst-{os.getpid()}")
    rank, world = accelerator.process_index, accelerator.num_processes
    is_decoder = model.config.model_type == "hfst_decoder"

    if is_decoder:
        block = data_args.block_size
        stride = data_args.eval_stride or max(block // 2, 1)
        windows = decoder_windows(stream, block, stride)[rank::world]
        for i in tqdm(range(0, len(windows), batch_size), desc=progress, unit="batch", disable=progress is None):
            chunk = windows[i : i + batch_size]
            width = max(end - begin for begin, end, _ in chunk)
            ids = torch.full((len(chunk), width), eos_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            for row, (begin, end, scored) in enumerate(chunk):
                n = end - begin
                ids[row, :n], mask[row, :n] = full[begin:end], 1
                labels[row, n - scored : n] = full[end - scored : end]
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            target = labels[:, 1:].to(device)
            logits = logits[:, :-1]
            keep = target != -100
            nll += F.cross_entropy(logits[keep], target[keep], reduction="sum").double()
            predicted = logits[keep].argmax(-1)
            correct += (predicted == target[keep]).sum()
            count += keep.sum()
            metric.add_batch(predictions=predicted.tolist(), references=target[keep].tolist())
    else:
        context = model.config.context_length
        padded = torch.cat([torch.full((context - 1,), eos_id), full])  # row t: the context of full[t + 1]
        positions = torch.arange(1, len(full))[rank::world]
        for i in tqdm(range(0, len(positions), batch_size), desc=progress, unit="batch", disable=progress is None):
            pos = positions[i : i + batch_size]  # predicted positions in `full`
            starts = pos - 1  # window = padded[start : start + context] ends right before full[pos]
            ids = torch.stack([padded[s : s + context] for s in starts.tolist()])
            mask = (torch.arange(context)[None, :] >= (context - pos)[:, None]).long()  # real tokens only
            target = full[pos].to(device)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0].float()
            nll += F.cross_entropy(logits, target, reduction="sum").double()
            predicted = logits.argmax(-1)
            correct += (predicted == target).sum()
            count += len(pos)
            metric.add_batch(predictions=predicted.tolist(), references=target.tolist())

    totals = accelerator.reduce(torch.stack([nll, count, correct]), reduction="sum")
    accuracy = metric.compute()  # per process; the reduced count below is the global one
    nll, count, correct = (float(x) for x in totals)
    if world == 1:
        assert abs(accuracy["accuracy"] - correct / count) < 1e-9  # the evaluate metric and the sums agree
    return {"perplexity": math.exp(nll / count), "accuracy": correct / count, "tokens": int(count), "nll": nll}


# ----------------------------------------------------------------------------------------------------------- checkpoints


class CompleteCheckpointCallback(TrainerCallback):
    """Marks a checkpoint complete once the Trainer has written all of it (atomic rename), so that a run killed while
    saving never resumes from a half-written folder. The marker also carries the training time and validation curve
    so far (`timer`, a TimedEvalCallback), which a resumed run continues from."""

    def __init__(self, timer):
        self.timer = timer

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                tmp = folder / (COMPLETE_MARKER + ".tmp")
                marker = {
                    "global_step": state.global_step,
                    "time": time.time(),
                    "train_seconds": self.timer.elapsed(),
                    "validation_curve": self.timer.points,
                }
                with open(tmp, "w") as f:
                    json.dump(marker, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / COMPLETE_MARKER)


def checkpoint_step(folder):
    """`.../checkpoint-1464` -> 1464."""
    return int(Path(folder).name.split("-")[-1])


def resolve_resume(training_args, script="train_lm"):
    """`--resume_from_checkpoint true` -> the newest *complete* checkpoint; incomplete ones are set aside. `script`
    names the caller in what it prints."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "0", "none"):
        return None
    if str(value).lower() in ("true", "1", "last", "latest"):
        folders = sorted(
            (p for p in Path(training_args.output_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
            key=checkpoint_step,
        )
        complete = [p for p in folders if (p / COMPLETE_MARKER).is_file()]
        for p in folders:
            if p not in complete and training_args.process_index == 0:
                aside = p.with_name(f"incomplete-{p.name}")
                print(f"[{script}] {p} was never completely written (killed while saving?): moved to {aside}")
                shutil.rmtree(aside, ignore_errors=True)
                p.rename(aside)
        if not complete:
            print(f"[{script}] no complete checkpoint in {training_args.output_dir}: training starts at step 0")
            return None
        return str(complete[-1])
    if not (Path(value) / COMPLETE_MARKER).is_file():
        raise SystemExit(f"--resume_from_checkpoint {value}: not a complete checkpoint (no {COMPLETE_MARKER}).")
    return value


def train_unless_finished(trainer, resume):
    """`trainer.train(resume_from_checkpoint=resume)`, except that a checkpoint at or past `max_steps` (a run stopped
    in its final evaluation, say) is only loaded: Trainer.train would still take one more step (transformers 5.23
    checks `max_steps` after a step). Returns the mean training loss of the steps this call ran (0.0 for none)."""
    if resume and checkpoint_step(resume) >= trainer.args.max_steps > 0:
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        trainer._load_from_checkpoint(resume)
        return 0.0
    return trainer.train(resume_from_checkpoint=resume).training_loss


def whole_run_train_loss(log_history, resumed_from, process_loss, process_steps):
    """Mean training loss of a run, resumed or not. The Trainer's `training_loss` averages only the steps this process
    ran (`process_steps` after step `resumed_from`); a resumed run adds the losses logged before its checkpoint (each
    logged loss is the mean of the steps since the previous log), weighted by the steps each covers. The steps between
    the checkpoint's last log and the checkpoint were never recorded and are left out."""
    total, steps, last = process_loss * process_steps, process_steps, 0
    for entry in log_history:
        if "loss" in entry and entry["step"] <= resumed_from:
            total += entry["loss"] * (entry["step"] - last)
            steps += entry["step"] - last
            last = entry["step"]
    return total / max(steps, 1)


class TimedEvalCallback(TrainerCallback):
    """Records (seconds of training, step, eval loss) for the validation-vs-time plot. A resumed run starts from the
    seconds and points its checkpoint's marker recorded (`resume_from`), so both count the whole run."""

    def __init__(self, resume_from=None):
        marker = {}
        if resume_from and (Path(resume_from) / COMPLETE_MARKER).is_file():
            marker = json.loads((Path(resume_from) / COMPLETE_MARKER).read_text())
        self.before = marker.get("train_seconds")  # None: resumed from a marker that did not record it
        self.points = list(marker.get("validation_curve", []))
        self.start = None

    def elapsed(self):
        return (self.before or 0.0) + (time.time() - self.start if self.start else 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.points.append(
                {"seconds": self.elapsed(), "step": state.global_step, "eval_loss": metrics["eval_loss"]}
            )


# ----------------------------------------------------------------------------------------------------------- card


def write_model_card(output_dir, model, model_args, data_args, training_args, results, command):
    from string import Template

    template = Template((ROOT / "model_cards" / "lm_model_card.md").read_text())
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
        parameters=f"{results['parameters']:,}",
        vocab_size=config.vocab_size,
        val_ppl=f"{results['validation_perplexity']:.2f}",
        test_ppl=f"{results['test_perplexity']:.2f}",
        val_acc=f"{results['validation_accuracy']:.4f}",
        test_acc=f"{results['test_accuracy']:.4f}",
        train_tokens=f"{results['train_tokens']:,}",
        tokens_per_second=f"{results['train_tokens_per_second']:,.0f}",
        wall_time=f"{results['wall_time_seconds'] / 60:.1f} min",
        eval_stride=data_args.eval_stride or max((data_args.block_size or 2) // 2, 1),
        command=command,
        config_json=json.dumps({k: v for k, v in config.to_diff_dict().items() if k not in ("auto_map",)}, indent=2),
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        device=results["device"],
    )
    (Path(output_dir) / "README.md").write_text(card)


# ----------------------------------------------------------------------------------------------------------- main


def main(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if argv is None and len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        argv = list(sys.argv[1:] if argv is None else argv)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available() and "--use_cpu" not in argv:
            argv += ["--use_cpu", "true"]  # several processes and no GPU: data parallel on CPUs (gloo)
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    command = "python scripts/train_lm.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        command = (
            f"accelerate launch --multi_gpu --num_processes {os.environ['WORLD_SIZE']} " + command[len("python ") :]
        )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size != launched:
        raise SystemExit(
            f"{launched} processes were launched but they are not connected (world size {training_args.world_size}): "
            "on CPUs launch with `accelerate launch --multi_gpu --num_processes N scripts/train_lm.py ... --use_cpu true`."
        )
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise SystemExit("Nothing to do: pass --do_train, --do_eval (validation) and/or --do_predict (test).")
    transformers.logging.set_verbosity_warning()
    set_seed(training_args.seed)
    wall_start = time.time()

    # data and tokenizer
    splits = load_splits(data_args)
    if model_args.tokenizer_name:
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    elif model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    else:
        tokenizer = build_word_tokenizer(splits["train"])
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos_id is None:
        raise SystemExit("The tokenizer has no eos token: it is needed to end every line.")
    streams = {split: token_stream(lines, tokenizer, eos_id) for split, lines in splits.items()}
    if data_args.max_train_tokens:
        streams["train"] = streams["train"][: data_args.max_train_tokens]
    if training_args.process_index == 0:
        print(
            f"[train_lm] vocabulary {len(tokenizer):,}; tokens: "
            + ", ".join(f"{k} {len(v):,}" for k, v in streams.items())
        )

    # model and examples
    preset_context = PRESETS[model_args.preset]["context"]
    data_args.block_size = data_args.block_size or preset_context
    model = build_model(model_args, data_args, len(tokenizer), eos_id)
    if model.config.vocab_size < len(tokenizer):
        raise SystemExit(
            f"The model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's ({len(tokenizer)})."
        )
    is_decoder = model.config.model_type == "hfst_decoder"
    length = example_length(model, data_args)
    if is_decoder:
        train_dataset = BlockDataset(streams["train"], length)
    else:
        train_dataset = WindowDataset(streams["train"], length, data_args.targets_per_epoch, seed=training_args.seed)
    eval_dataset = None
    if "validation" in streams:
        val = streams["validation"][: data_args.periodic_eval_targets + length]
        eval_dataset = BlockDataset(val, length) if is_decoder else WindowDataset(val, length)
    if data_args.train_token_budget:
        per_step = training_args.per_device_train_batch_size * training_args.world_size
        per_step *= training_args.gradient_accumulation_steps * length
        training_args.max_steps = max(1, data_args.train_token_budget // per_step)
    parameters = sum(p.numel() for p in model.parameters())
    if training_args.process_index == 0:
        print(
            f"[train_lm] {type(model).__name__}: {parameters:,} parameters, {len(train_dataset):,} training examples"
            f" of {length} tokens, max_steps={training_args.max_steps}"
        )

    resume = resolve_resume(training_args) if training_args.do_train else None
    timed = TimedEvalCallback(resume_from=resume)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=[CompleteCheckpointCallback(timed), timed],
    )
    results = {
        "family": model_args.family,
        "attention": model.config.attention_type,
        "feature_map": model.config.feature_map,
        "preset": model_args.preset,
        "parameters": parameters,
    }
    if training_args.do_train:
        train_start = time.time()
        resumed_from = checkpoint_step(resume) if resume else 0
        process_loss = train_unless_finished(trainer, resume)
        train_seconds = time.time() - train_start
        trainer.save_model()  # model, config with auto_map, modeling code, tokenizer
        steps_done = trainer.state.global_step - resumed_from
        per_step = training_args.per_device_train_batch_size * training_args.world_size
        per_step *= training_args.gradient_accumulation_steps * length
        history = trainer.state.log_history
        train_loss = whole_run_train_loss(history, resumed_from, process_loss, steps_done)
        # training time of the whole run, across resumes (None: resumed from a checkpoint that did not record it)
        whole_seconds = (timed.before or 0.0) + train_seconds if timed.before is not None or not resume else None
        tokens = trainer.state.global_step * per_step
        results.update(
            train_loss=train_loss,
            train_perplexity=math.exp(train_loss),
            train_steps=trainer.state.global_step,
            train_tokens=tokens,
            # the whole run's rate where its time is known, else this process's
            train_tokens_per_second=tokens / whole_seconds if whole_seconds else steps_done * per_step / train_seconds,
            train_seconds=train_seconds,
            resumed_from_step=resumed_from or None,
            train_seconds_whole_run=whole_seconds,
        )
        trainer.save_state()
    # final evaluation with the protocol, on every process (windows are split between them)
    eval_model = trainer.model
    batch = training_args.per_device_eval_batch_size * (1 if is_decoder else 16)  # heads: one logit row per window
    metric_path = str(ROOT / "scripts" / "metrics" / "next_token_accuracy")
    for split, wanted in (("validation", training_args.do_eval), ("test", training_args.do_predict)):
        if wanted and split not in streams:
            raise SystemExit(
                f"No {split} split: pass --{split}_file or drop --do_{'eval' if split == 'validation' else 'predict'}."
            )
        if wanted:
            stream = streams[split][: data_args.max_eval_tokens] if data_args.max_eval_tokens else streams[split]
            is_main = training_args.process_index == 0
            if is_main and training_args.disable_tqdm:  # no bar: say what the (long, for the heads) evaluation is doing
                print(f"[train_lm] evaluating {split}: {len(stream):,} tokens, protocol of the README")
            began = time.time()
            bar = f"[train_lm] {split}" if is_main and not training_args.disable_tqdm else None
            metrics = evaluate_stream(
                eval_model, stream, data_args, trainer.accelerator, batch, eos_id, metric_path, progress=bar
            )
            if is_main:
                print(f"[train_lm] {split} perplexity {metrics['perplexity']:.2f} ({time.time() - began:.0f} s)")
            results.update({f"{split}_{k}": v for k, v in metrics.items()})
    results.update(
        wall_time_seconds=time.time() - wall_start,
        device=f"{trainer.accelerator.device} x {training_args.world_size}",
        threads_per_process=torch.get_num_threads(),
        eval_protocol=(
            f"sliding window {length}, stride {data_args.eval_stride or max(length // 2, 1)}"
            if is_decoder
            else f"every position, up to {length} preceding tokens"
        ),
        validation_curve=timed.points,
    )
    # data parallel replicas must hold the same weights: one checksum per process
    checksum = torch.stack([p.detach().double().sum() for p in eval_model.parameters()]).sum().reshape(1)
    results["replica_checksums"] = [
        float(c) for c in trainer.accelerator.gather(checksum.to(trainer.accelerator.device))
    ]
    if len(set(results["replica_checksums"])) != 1:
        raise RuntimeError(f"Data-parallel replicas disagree: weight checksums {results['replica_checksums']}")
    if trainer.is_world_process_zero():
        trainer.save_metrics("all", {k: v for k, v in results.items() if k != "validation_curve"}, combined=False)
        with open(Path(training_args.output_dir) / "all_results.json", "w") as f:
            json.dump(results, f, indent=2)
        if "test_perplexity" in results and "validation_perplexity" in results and "train_tokens" in results:
            write_model_card(
                training_args.output_dir, eval_model, model_args, data_args, training_args, results, command
            )
        summary = {k: results[k] for k in results if k.endswith(("perplexity", "accuracy", "per_second", "seconds"))}
        print("[train_lm] " + json.dumps({**summary, "parameters": parameters}, indent=1))
        print(f"[train_lm] wrote the model, tokenizer, all_results.json and README.md to {training_args.output_dir}")
        if training_args.push_to_hub:
            push(training_args)
    trainer.accelerator.wait_for_everyone()
    return results


def push(training_args):
    """Upload the final folder (weights, config with auto_map, modeling code, tokenizer, model card) to the Hub."""
    from huggingface_hub import HfApi

    repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
    api = HfApi(token=training_args.hub_token)
    api.create_repo(repo_id, private=bool(training_args.hub_private_repo), exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=training_args.output_dir,
        commit_message="hf_settransformer: trained model, tokenizer and model card",
        ignore_patterns=["checkpoint-*", "incomplete-*", "runs/*", "*.pt", "*.pth", "training_args.bin"],
    )
    print(f"[train_lm] pushed to {repo_id}: {getattr(info, 'commit_url', info)}")


if __name__ == "__main__":
    main()

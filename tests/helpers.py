"""What the tests share: tiny models (hidden 32, 2 layers, 4 heads, no dropout, fixed seeds) and their inputs, cached
decoding, the host-read counter, and the scripts with their data. Fixtures are in the conftest.py files."""

import collections
import contextlib
import importlib
import importlib.util
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

import hf_settransformer as hfst

ROOT = Path(__file__).resolve().parents[1]  # the repository


# ------------------------------------------------------------------------------------------------------ tiny models

VOCAB = 37
FAMILIES = list(hfst.FAMILIES)
ATTENTIONS = [("softmax", "elu"), ("linear", "elu"), ("linear", "exp")]
ATTENTION_IDS = ["softmax", "linear-elu", "linear-exp"]

CONFIG_CLASSES = {name: family.config_class() for name, family in hfst.FAMILIES.items()}
FAMILY_EXTRAS = {
    "encoder": {},
    "decoder": {},
    "set_transformer": {"num_inducing_points": 3, "num_seeds": 1, "num_decoder_layers": 1},
    "perceiver_io": {
        "num_latents": 5,
        "num_blocks": 2,
        "num_self_attends_per_block": 2,
        "num_cross_attention_heads": 2,
    },
}


def family_classes(config):
    """{transformers Auto class: model class} of a config's family (the heads registered with an Auto class)."""
    family = hfst.families.family_for_model_type(config.model_type)
    return {
        getattr(transformers, name): cls for name, cls in family.model_classes().items() if hasattr(transformers, name)
    }


# every (family, class) pair of the Auto classes (the mixture-of-Gaussians head has its own tests)
MODEL_CLASSES = [(family, cls) for family in FAMILIES for cls in family_classes(CONFIG_CLASSES[family]()).values()]


def tiny_config(family, attention_type="softmax", feature_map="elu", **overrides):
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attention_type=attention_type,
        feature_map=feature_map,
        linear_attention_chunk_size=4,
        max_position_embeddings=64,
        num_labels=3,
        initializer_range=0.1,  # 0.02 (the default) is made for widths in the hundreds; these are 32 wide
    )
    if CONFIG_CLASSES[family].windowed_heads:  # the decoder has no window heads: it would drop the field
        kwargs["context_length"] = 8
    kwargs.update(FAMILY_EXTRAS[family])
    if family == "perceiver_io":
        kwargs.pop("num_hidden_layers")
    kwargs.update(overrides)
    return CONFIG_CLASSES[family](**kwargs)


def make_model(cls, config, seed=0):
    torch.manual_seed(seed)
    return cls(config).eval()


def batch_of_tokens(b=2, n=6):
    return torch.randint(0, VOCAB, (b, n))


def decoder(attention_type, feature_map, **overrides):
    """A tiny `TransformerDecoderForCausalLM` in eval mode (seed 0)."""
    return make_model(
        hfst.TransformerDecoderForCausalLM, tiny_config("decoder", attention_type, feature_map, **overrides)
    )


def main_output(output):
    """The tensor a user reads first: logits for heads, last_hidden_state for base models."""
    return output.logits if "logits" in output else output.last_hidden_state


WORDS = ["<pad>", "<unk>", "<eos>"] + [f"\u2581w{i}" for i in range(VOCAB - 3)]


def word_tokenizer():
    """A word-level tokenizer over the test vocabulary (ids 0..VOCAB-1), built with the `tokenizers` library.

    Words carry a leading "\u2581" that decodes to a space, so decoded continuations keep their word boundary
    (the text-generation pipeline appends the decoded new tokens to the prompt)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
        model_input_names=["input_ids", "attention_mask"],
    )


def quiet_training_args(output_dir, cls=None, **fields):
    """`TrainingArguments` (or `cls`, e.g. Seq2SeqTrainingArguments) for a test: CPU, seed 0, no saving, logging,
    reporting or progress bars; `fields` set the rest."""
    from transformers import TrainingArguments

    defaults = dict(report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    return (cls or TrainingArguments)(output_dir=str(output_dir), **{**defaults, **fields})


# the families with window heads (a one-target or many-target next-token head)
HEAD_FAMILIES = ["encoder", "set_transformer", "perceiver_io"]


def many_target_head(family, attention_type="softmax", feature_map="elu", **overrides):
    """A window family's next-token head predicting its last 6 tokens of 12 (`target_length`)."""
    from transformers import AutoModelForCausalLM

    fields = dict(context_length=12, target_length=6, **overrides)
    if family == "perceiver_io":
        fields.setdefault("num_latents", fields["target_length"])
    config = tiny_config(family, attention_type, feature_map, **fields)
    return make_model(family_classes(config)[AutoModelForCausalLM], config)


def adaptive_lm(family, attention_type="softmax", feature_map="elu", adaptive_input=False):
    """A family's next-token head with the adaptive softmax output (clusters at 4 and 16); `adaptive_input`: and the
    adaptive input embedding."""
    from transformers import AutoModelForCausalLM

    extra = {} if family == "decoder" else dict(context_length=8, target_length=4)
    if family == "perceiver_io":
        extra["num_latents"] = 4
    if adaptive_input:
        extra["adaptive_input_cutoffs"] = [4, 16]
    config = tiny_config(family, attention_type, feature_map, adaptive_softmax_cutoffs=[4, 16], **extra)
    return make_model(family_classes(config)[AutoModelForCausalLM], config)


# ------------------------------------------------------------------------------------------------- cached decoding

def left_padded_batch():
    """Two prompts of lengths 7 and 4, left padded to 7."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


def check_cached_steps(model, atol=1e-4):
    """A left-padded prefill (7 tokens) and six one-token steps with the cache give the full forward's logits at every
    real position; returns the cache."""
    ids, mask = left_padded_batch()
    continuation = torch.randint(1, VOCAB, (2, 6))
    full_ids = torch.cat([ids, continuation], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(continuation)], dim=1)
    with torch.no_grad():
        full = model(input_ids=full_ids, attention_mask=full_mask, use_cache=False).logits
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        real = mask.bool()
        torch.testing.assert_close(out.logits[real], full[:, :7][real], atol=atol, rtol=0)
        cache = out.past_key_values
        for t in range(6):
            length = 7 + t + 1
            step = model(
                input_ids=continuation[:, t : t + 1],
                attention_mask=full_mask[:, :length],
                past_key_values=cache,
                use_cache=True,
            )
            cache = step.past_key_values
            torch.testing.assert_close(step.logits[:, 0], full[:, length - 1], atol=atol, rtol=0)
    return cache


def decode(model, step, cache, ids, mask, steps=5):
    """Prefill `ids` eagerly into `cache`, then `steps` greedy steps through `step` -> their logits (steps, b, vocab).
    `mask`: (b, n) for a cache that grows, (b, slots) for a static cache; None: no padding."""
    logits = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        for t in range(steps):
            if mask is not None and mask.shape[1] == ids.shape[1] + t:  # the usual cache's mask: one more column
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            elif mask is not None:  # a static cache's, one column per slot: the new token's slot is set
                mask = mask.clone()
                mask[:, ids.shape[1] + t] = 1
            token = out.logits[:, -1:].argmax(-1)
            out = step(input_ids=token, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits[:, -1].clone())
    return torch.stack(logits)


# ---------------------------------------------------------------------------------------------------- host reads

SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::nonzero_static"}


def _package_site():
    """The innermost hf_settransformer function on the stack, as "file:function"."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "hf_settransformer" in frame.filename.replace("\\", "/").split("/site-packages/")[-1]:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.name}"
    return "outside the package"


class HostReads(TorchDispatchMode):
    """Counts, per package function, the ops that read device values back to the host."""

    def __init__(self):
        super().__init__()
        self.sites = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        bool_index = name in ("aten::index", "aten::index_put", "aten::index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for a in args
            if isinstance(a, (list, tuple))
            for i in a
        )
        if name in SYNC_OPS or bool_index:
            self.sites[_package_site()] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_reads(monkeypatch):
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def counted_tolist(self):
        reads.sites[_package_site()] += 1
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    with reads:
        yield reads.sites
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)


# ---------------------------------------------------------------------------------------- scripts and their data

def import_from(folder, module):
    """`module` from the repository's `folder` (scripts/, benchmarks/: not packages), leaving sys.path as it was."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(ROOT / folder))


def load_script(name):
    """scripts/<name>.py imported as a module, to call its `main(argv)` in this process."""
    spec = importlib.util.spec_from_file_location(f"hfst_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the Trainer pickles the script's TrainingArguments subclass by module name
    spec.loader.exec_module(module)
    return module


def tiny_run_args(texts, out, *extra):
    """train_lm.py's flags for a tiny run on `texts`/train.txt into `out`."""
    return ["--do_train", "--train_file", str(texts / "train.txt"), "--preset", "tiny", "--output_dir", str(out),
            "--report_to", "none", "--disable_tqdm", "true", *extra]


def lm_refusal(train_lm, tmp_path, texts, *flags):
    """train_lm.main's SystemExit message for a tiny run with `flags` (it must refuse)."""
    argv = ["--do_train", "--train_file", str(texts / "train.txt"), "--preset", "tiny", "--output_dir",
            str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none", "--disable_tqdm", "true", *flags]
    with pytest.raises(SystemExit) as err:
        train_lm.main(argv)
    assert not (tmp_path / "out").exists()  # refused before anything was made
    return str(err.value.code)


CORPUS_WORDS = "the of and in to a was on for as with by is at from his that it an were".split()


def write_corpus(folder):
    """WikiText-like files: lines of words, blank lines, ' = Heading = ' lines, <unk>s. Within a line the words
    follow a fixed cycle, so the next word is predictable and a model that learns shows it."""
    g = torch.Generator().manual_seed(0)

    def lines(n):
        out = []
        for i in range(n):
            if i % 7 == 0:
                out.append(" = Heading {} = ".format(CORPUS_WORDS[i % len(CORPUS_WORDS)]))
            elif i % 5 == 0:
                out.append(" ")
            else:
                start, length = (int(x) for x in torch.randint(0, len(CORPUS_WORDS), (2,), generator=g))
                words = [CORPUS_WORDS[(start + k) % len(CORPUS_WORDS)] for k in range(4 + length)]
                out.append(" " + " ".join(words) + " <unk> . ")
        return out

    for name, n in (("train", 400), ("valid", 60), ("test", 60)):
        (folder / f"{name}.txt").write_text("\n".join(lines(n)) + "\n")
    return folder


def common_args(corpus, output_dir, family="decoder", steps=20, extra=()):
    return [
        "--family",
        family,
        "--preset",
        "tiny",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--train_file",
        corpus / "train.txt",
        "--validation_file",
        corpus / "valid.txt",
        "--test_file",
        corpus / "test.txt",
        "--output_dir",
        output_dir,
        "--max_steps",
        steps,
        "--per_device_train_batch_size",
        8,
        "--per_device_eval_batch_size",
        16,
        "--learning_rate",
        3e-3,
        "--logging_steps",
        5,
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--periodic_eval_targets",
        256,
        "--seed",
        0,
        *extra,
    ]


def decoder_trainer(output_dir, steps=4, eval_dataset=None, **fields):
    """A tiny decoder's Trainer over 8-token blocks of a repeating stream (it learns it)."""
    from transformers import Trainer

    from hf_settransformer.toolkit.language_modeling import BlockDataset

    torch.manual_seed(0)
    model = hfst.TransformerDecoderForCausalLM(tiny_config("decoder"))
    stream = torch.arange(400) % 11
    args = quiet_training_args(output_dir, max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
                               **fields)
    return Trainer(model=model, args=args, train_dataset=BlockDataset(stream, 8), eval_dataset=eval_dataset)


def free_port():
    """A TCP port free now, for a process group's rendezvous: a fixed port may be held by another run's processes (or
    by another test worker's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def leave_process_group():
    """The last line of a `launch_two` script, once its results are written: every rank waits for the others, leaves the
    process group and exits 0 at once. Interpreter teardown after a finished gloo run can still abort a process
    ("terminate called without an active exception", SIGABRT) in torch's and gloo's threads, after the process group is
    destroyed; the tests assert on the files the ranks wrote, so an exit code decided by that race would fail them at
    random. Everything before this line still fails the run."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch_two(script, tmp_path, timeout=300, env=None):
    """Runs the Python source `script` in 2 gloo processes (`torch.distributed.run`, from the repository), its argument
    an empty folder `tmp_path / "out"`, asserts both exited 0, and returns that folder. The script writes its results
    there and ends with `leave_process_group()`."""
    path = tmp_path / "script.py"
    path.write_text(script)
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(path), str(out)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-5000:]
    return out

"""Tiny models for the tests: hidden 32, 2 layers, 4 heads, no dropout, fixed seeds."""

import os

import torch

# tests/test_linear_triton.py runs the Triton kernels on CPU tensors in triton's interpreter, which must be chosen
# before triton is first imported (importing transformers imports it). It changes nothing else: no other test runs a
# Triton kernel on a CPU. With a GPU the kernels run compiled and this stays unset.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # deepspeed (installed by dev) is imported by accelerate whenever a model is saved; told its accelerator, it does
    # not warn "Setting accelerator to CPU" in every process (the ZeRO-3 tests run on it)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import transformers

import hf_settransformer as hfst

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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """transformers compiles flex attention once per process; on CPU, torch 2.13's inductor fails to build the kernel
    once shapes turn dynamic (`cur_qSplitSize1` undeclared), which the many shapes of these tests reach. The
    same `flex_attention_forward`, with its BlockMask, runs here without the compile (torch's reference path)."""

    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    def run(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", run)


def pytest_ignore_collect(collection_path, config):
    """`-m "not slow"` does not collect transformers' common tests at all: importing that module builds their tests
    tree (a download on first use), which a run that deselects them should not need."""
    if collection_path.name != "test_transformers_common.py" or not config.getoption("markexpr"):
        return None
    from _pytest.mark.expression import Expression

    if not Expression.compile(config.getoption("markexpr")).evaluate(lambda name, **_: name == "slow"):
        return True
    return None

"""The calls transformers' example scripts make, on checkpoints saved as scripts/train_lm.py saves them (weights,
config with auto_map, modeling code, word tokenizer), loaded as remote code: run_clm.py (AutoModelForCausalLM, blocks
with labels = input_ids, `preprocess_logits_for_metrics` + `compute_metrics` on shifted predictions), run_mlm.py
(AutoModelForMaskedLM, DataCollatorForLanguageModeling, accuracy where labels != -100) and run_glue.py
(AutoModelForSequenceClassification, padding and truncation to min(128, tokenizer.model_max_length)). The metric is
`evaluate.load` of scripts/metrics/accuracy, what those scripts get offline (README). The scripts themselves are not
in this repository."""

import math
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from tests.helpers import CONFIG_CLASSES, family_classes, quiet_training_args, tiny_config
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    Trainer,
    default_data_collator,
)

from hf_settransformer import toolkit

ROOT = Path(__file__).resolve().parents[2]
WORDS = "the of and in to a was on for as with by is at from his that it an were".split()
LINES = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(5 + i % 7)) for i in range(120)]


def saved_checkpoint(folder, family, auto, **fields):
    """A tiny model of `family` with the word tokenizer, saved like train_lm.py's output (model_max_length set)."""
    tokenizer = toolkit.build_word_tokenizer(LINES, model_max_length=16)
    window = {"context_length": 16} if CONFIG_CLASSES[family].windowed_heads else {}  # the decoder has no windows
    config = tiny_config(family, vocab_size=len(tokenizer), max_position_embeddings=64, **window, **fields)
    torch.manual_seed(0)
    model = family_classes(config)[auto](config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def accuracy_metric():
    return evaluate.load(str(ROOT / "scripts" / "metrics" / "accuracy"))


def test_tokenizer_has_what_the_scripts_expect(tmp_path):
    folder = saved_checkpoint(tmp_path, "encoder", AutoModelForMaskedLM)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.mask_token == "<mask>" and tokenizer.pad_token == "<eos>" and tokenizer.unk_token == "<unk>"
    assert tokenizer.model_max_length == 16  # run_glue: min(--max_seq_length 128, model_max_length)


@pytest.mark.parametrize("family", ["decoder", "encoder", "set_transformer", "perceiver_io"])
def test_run_clm_evaluation(tmp_path, family):
    extra = {"num_latents": 8} if family == "perceiver_io" else {}  # Perceiver AR: a latent per target (8 of 16)
    folder = saved_checkpoint(tmp_path / "model", family, AutoModelForCausalLM, **extra)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ids = [i for line in tokenizer(LINES)["input_ids"] for i in line]
    block = 16  # run_clm: group_texts into blocks of min(block_size, model_max_length), labels = input_ids
    blocks = [{"input_ids": ids[i : i + block], "labels": ids[i : i + block]} for i in range(0, len(ids) - block, block)]
    metric = accuracy_metric()

    def preprocess_logits_for_metrics(logits, labels):  # run_clm's
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):  # run_clm's: predictions shifted against the labels
        preds, labels = eval_preds
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return metric.compute(predictions=preds, references=labels)

    trainer = Trainer(
        model=model,
        args=quiet_training_args(tmp_path / "run", per_device_eval_batch_size=4),
        eval_dataset=blocks,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert metrics["eval_loss"] == pytest.approx(math.log(len(tokenizer)), rel=0.2)  # untrained: about uniform


@pytest.mark.parametrize("family", ["encoder", "perceiver_io"])
def test_run_mlm_evaluation(tmp_path, family):
    folder = saved_checkpoint(tmp_path / "model", family, AutoModelForMaskedLM)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
    ids = [i for line in tokenizer(LINES)["input_ids"] for i in line]
    blocks = [{"input_ids": ids[i : i + 16]} for i in range(0, len(ids) - 16, 16)]
    metric = accuracy_metric()

    def preprocess_logits_for_metrics(logits, labels):
        return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)

    def compute_metrics(eval_preds):  # run_mlm's: only the masked positions
        preds, labels = eval_preds
        labels, preds = labels.reshape(-1), preds.reshape(-1)
        keep = labels != -100
        return metric.compute(predictions=preds[keep], references=labels[keep])

    torch.manual_seed(0)
    trainer = Trainer(
        model=model,
        args=quiet_training_args(tmp_path / "run", per_device_eval_batch_size=4),
        eval_dataset=blocks,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and 0.0 <= metrics["eval_accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_run_glue_training_and_evaluation(tmp_path, family):
    folder = saved_checkpoint(tmp_path / "model", family, AutoModelForSequenceClassification, num_labels=2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2, trust_remote_code=True)
    max_length = min(128, tokenizer.model_max_length)  # run_glue's --max_seq_length 128, capped
    texts = [line + " " + line for line in LINES]  # some longer than max_length: truncated
    labels = [int("the" in t.split()) for t in texts]  # a word's presence: learnable by every family, sets too
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    assert max(len(x) for x in encoded["input_ids"]) == max_length
    data = [{"input_ids": i, "attention_mask": m, "label": y} for i, m, y in zip(encoded["input_ids"],
                                                                                   encoded["attention_mask"], labels)]
    metric = accuracy_metric()

    def compute_metrics(p):  # run_glue's for a classification task from files
        preds = np.argmax(p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions, axis=1)
        return metric.compute(predictions=preds, references=p.label_ids)

    trainer = Trainer(
        model=model,
        args=quiet_training_args(tmp_path / "run", max_steps=60, per_device_train_batch_size=16, learning_rate=5e-3),
        train_dataset=data,
        eval_dataset=data,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before and after["eval_accuracy"] > 0.6

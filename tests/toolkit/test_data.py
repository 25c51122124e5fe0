"""DataCollatorForSets: sets of different sizes in one batch, padded or packed into one row; outputs independent of
the padding and the same in both forms; the Trainer trains from packed batches."""

import pytest
import torch
from transformers import Trainer

import hf_settransformer as hfst
from hf_settransformer import toolkit
from tests.helpers import make_model, quiet_training_args, tiny_config


def test_pads_features_and_builds_the_mask():
    collate = toolkit.DataCollatorForSets()
    batch = collate(
        [
            {"input_features": torch.ones(3, 2), "labels": 1.5},
            {"input_features": [[2.0, 2.0]], "labels": 0.5},
        ]
    )
    assert batch["input_features"].shape == (2, 3, 2) and batch["input_features"].dtype == torch.float32
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["input_features"][1, 1:].abs().sum() == 0 and batch["input_features"][1, 0].tolist() == [2.0, 2.0]
    assert batch["labels"].tolist() == [1.5, 0.5]
    tokens = toolkit.DataCollatorForSets(pad_to_multiple_of=4, pad_token_id=9)([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    assert tokens["input_ids"].tolist() == [[1, 2, 9, 9], [3, 9, 9, 9]]
    assert tokens["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]


def test_bad_examples_are_refused():
    collate = toolkit.DataCollatorForSets()
    with pytest.raises(ValueError, match="exactly one"):
        collate([{"labels": 1}])
    with pytest.raises(ValueError, match=r"every set must be \(size, 2\)"):
        collate([{"input_features": torch.ones(3, 2)}, {"input_features": torch.ones(3, 5)}])


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("num_inducing_points", [0, 3])
def test_outputs_do_not_depend_on_the_rest_of_the_batch(attention_type, num_inducing_points):
    config = tiny_config(
        "set_transformer",
        attention_type,
        vocab_size=None,
        input_size=2,
        num_inducing_points=num_inducing_points,
        num_labels=1,
    )
    model = make_model(hfst.SetTransformerForSequenceClassification, config)
    g = torch.Generator().manual_seed(0)
    sets = [torch.randn(n, 2, generator=g) for n in (1, 4, 9, 30)]
    batch = toolkit.DataCollatorForSets()([{"input_features": s} for s in sets])
    together = model(**batch).logits
    for i, s in enumerate(sets):
        alone = model(input_features=s[None]).logits
        assert torch.allclose(together[i], alone[0], atol=1e-5), i


def test_packs_sets_into_one_row_with_their_boundaries():
    collate = toolkit.DataCollatorForSets(packed=True)
    batch = collate([{"input_features": torch.ones(3, 2), "labels": 1}, {"input_features": [[2.0, 2.0]], "labels": 0}])
    assert set(batch) == {"input_features", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "labels"}
    assert batch["input_features"].shape == (1, 4, 2) and batch["input_features"].dtype == torch.float32
    assert batch["input_features"][0, 3].tolist() == [2.0, 2.0]
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[name].dtype == torch.int32 and batch[name].tolist() == [0, 3, 4]
    assert batch["max_length_q"] == batch["max_length_k"] == 3
    assert batch["labels"].tolist() == [1, 0]
    tokens = collate([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    assert tokens["input_ids"].tolist() == [[1, 2, 3]] and tokens["cu_seq_lens_k"].tolist() == [0, 2, 3]


def test_an_empty_set_is_refused_when_packing_naming_the_example():
    collate = toolkit.DataCollatorForSets(packed=True)
    with pytest.raises(ValueError, match="Example 1 holds an empty set"):
        collate([{"input_ids": [1, 2]}, {"input_ids": []}, {"input_ids": [3]}])


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_packed_and_padded_batches_give_the_same_logits_and_loss(attention_type):
    config = tiny_config("set_transformer", attention_type, vocab_size=None, input_size=2)
    model = make_model(hfst.SetTransformerForSequenceClassification, config)
    g = torch.Generator().manual_seed(0)
    examples = [{"input_features": torch.randn(n, 2, generator=g), "labels": n % 3} for n in (1, 4, 9, 70)]
    padded = model(**toolkit.DataCollatorForSets()(examples))
    packed = model(**toolkit.DataCollatorForSets(packed=True)(examples))
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.loss, padded.loss, atol=1e-5, rtol=0)


def test_the_trainer_trains_from_packed_batches(tmp_path):
    config = tiny_config("perceiver_io", vocab_size=None, input_size=2)
    model = make_model(hfst.PerceiverIOForSequenceClassification, config).train()
    g = torch.Generator().manual_seed(0)
    dataset = [{"input_features": torch.randn(n, 2, generator=g), "labels": n % 3} for n in (3, 1, 40, 7, 12, 5)]
    trainer = Trainer(
        model=model,
        args=quiet_training_args(tmp_path, max_steps=2, per_device_train_batch_size=3, remove_unused_columns=False),
        train_dataset=dataset,
        data_collator=toolkit.DataCollatorForSets(packed=True),
    )
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

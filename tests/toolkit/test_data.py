"""DataCollatorForSets: sets of different sizes in one batch, outputs independent of the padding."""

import pytest
import torch

import hf_settransformer as hfst
from hf_settransformer import toolkit
from tests.helpers import make_model, tiny_config


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

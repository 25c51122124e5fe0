"""A row of padding only (an `attention_mask` row of all 0: an empty set, an empty sequence, an empty prompt) is legal
in every family, as in transformers' own models. Attention over no key gives 0, so an empty row's outputs are what the
model's positions, biases and learned queries (PMA seeds, ISAB inducing points, Perceiver latents) give alone: finite,
the same whatever sits in the padded positions, and without effect on the other rows of the batch. Losses follow the
heads' usual rules: a classification row uses its label, token losses count no target of an empty row, and are 0
when the batch has no target at all."""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, MODEL_CLASSES, VOCAB, make_model, tiny_config

import hf_settransformer as hfst

ATOL = 1e-5
CLASS_IDS = [cls.__name__ for _, cls in MODEL_CLASSES]


def tensors(outputs):
    """The tensor fields of a model output, by name (key_mask and the like excluded)."""
    return {k: v for k, v in outputs.items() if torch.is_tensor(v) and v.is_floating_point()}


def batch_with_an_empty_row(padding_values):
    """Three rows of 6 tokens: row 1 empty (padding only), row 2 left-padded by 2; `padding_values` fill the padding."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (3, 6), generator=g)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1] = 0
    mask[2, :2] = 0
    return ids.masked_fill(mask == 0, padding_values), mask


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=CLASS_IDS)
def test_an_empty_row_is_finite_padding_independent_and_leaves_the_others_alone(family, cls, attention_type,
                                                                                 feature_map):
    model = make_model(cls, tiny_config(family, attention_type, feature_map))
    with torch.no_grad():
        ids, mask = batch_with_an_empty_row(0)
        out = tensors(model(input_ids=ids, attention_mask=mask))
        other_ids, _ = batch_with_an_empty_row(VOCAB - 1)
        other = tensors(model(input_ids=other_ids, attention_mask=mask))
        without = tensors(model(input_ids=ids[[0, 2]], attention_mask=mask[[0, 2]]))
    assert out and out.keys() == other.keys() == without.keys()
    for name, value in out.items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(other[name][1], value[1], atol=ATOL, rtol=0, msg=f"{name}: padding leaks in")
        torch.testing.assert_close(value[[0, 2]], without[name], atol=ATOL, rtol=0, msg=f"{name}: rows interact")


CONTINUOUS = [hfst.SetTransformerModel, hfst.SetTransformerForSequenceClassification]


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("cls", CONTINUOUS, ids=lambda c: c.__name__)
def test_an_empty_set_of_points_ignores_nan_padding(cls, attention_type, feature_map):
    model = make_model(cls, tiny_config("set_transformer", attention_type, feature_map, vocab_size=None, input_size=2))
    points = torch.randn(2, 5, 2)
    mask = torch.ones(2, 5)
    mask[1] = 0
    with torch.no_grad():
        out = tensors(model(input_features=points, attention_mask=mask))
        nan = tensors(model(input_features=points.masked_fill(mask[..., None] == 0, float("nan")), attention_mask=mask))
        alone = tensors(model(input_features=points[:1]))
    for name, value in out.items():
        assert torch.isfinite(value).all() and torch.equal(nan[name], value), name
        torch.testing.assert_close(value[:1], alone[name], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["set_transformer", "perceiver_io"])
def test_an_empty_set_pools_to_the_same_vector_with_every_attention_kernel(family):
    """Attention over no key is 0 for softmax and linear alike, so with the same weights the empty set's pooled vector
    (the learned queries with nothing to read) does not depend on the kernel, nor on the set's padded length."""
    ids = torch.randint(1, VOCAB, (1, 4))
    pooled = []
    for attention_type, feature_map in ATTENTIONS:
        model = make_model(hfst.FAMILIES[family].model_classes()["AutoModelForSequenceClassification"],
                           tiny_config(family, attention_type, feature_map))
        with torch.no_grad():
            for n in (3, 7):
                logits = model(input_ids=torch.ones(1, n, dtype=torch.long), attention_mask=torch.zeros(1, n)).logits
                pooled.append(logits)
        assert not torch.equal(model(input_ids=ids).logits, pooled[-1])  # a real set is read: not the empty vector
    for logits in pooled[1:]:
        torch.testing.assert_close(logits, pooled[0], atol=ATOL, rtol=0)


TOKEN_LOSS_CLASSES = [(f, c) for f, c in MODEL_CLASSES if not c.__name__.endswith(("Model", "Classification"))]


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("family,cls", TOKEN_LOSS_CLASSES, ids=[c.__name__ for _, c in TOKEN_LOSS_CLASSES])
def test_token_losses_count_no_target_of_an_empty_row(family, cls, attention_type):
    model = make_model(cls, tiny_config(family, attention_type)).train()
    ids, mask = batch_with_an_empty_row(0)
    labels = ids.masked_fill(mask == 0, -100)
    with_empty = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    without = model(input_ids=ids[[0, 2]], attention_mask=mask[[0, 2]], labels=labels[[0, 2]]).loss
    torch.testing.assert_close(with_empty, without, atol=ATOL, rtol=0)
    empty = torch.zeros_like(mask)
    loss = model(input_ids=ids, attention_mask=empty, labels=torch.full_like(ids, -100)).loss
    loss.backward()
    assert loss.item() == 0.0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


CLASSIFIERS = [(f, c) for f, c in MODEL_CLASSES if c.__name__.endswith("Classification")]


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("family,cls", CLASSIFIERS, ids=[c.__name__ for _, c in CLASSIFIERS])
def test_classification_of_an_empty_row_uses_its_label(family, cls, attention_type):
    model = make_model(cls, tiny_config(family, attention_type)).train()
    ids, mask = batch_with_an_empty_row(0)
    labels = torch.tensor([0, 1, 2])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits, labels)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_mixture_head_counts_no_point_of_an_empty_set():
    config = tiny_config("set_transformer", vocab_size=None, input_size=2)
    model = make_model(hfst.SetTransformerForMixtureOfGaussians, config)
    points = torch.randn(2, 5, 2)
    mask = torch.ones(2, 5)
    mask[1] = 0
    out = model(input_features=points, attention_mask=mask, return_loss=True)
    alone = model(input_features=points[:1], return_loss=True)
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, alone.loss, atol=ATOL, rtol=0)


GENERATORS = [(f, c) for f, c in MODEL_CLASSES if c.can_generate()]


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family,cls", GENERATORS, ids=[c.__name__ for _, c in GENERATORS])
def test_generate_with_an_empty_prompt_row(family, cls, attention_type, feature_map):
    """A left-padded batch with an empty prompt: that row is generated from nothing (the same tokens whatever its
    padding holds), the others as they are alone."""
    model = make_model(cls, tiny_config(family, attention_type, feature_map))
    ids = torch.randint(1, VOCAB, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1] = 0
    options = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=mask, **options)
        other_padding = model.generate(ids.masked_fill(mask == 0, 5), attention_mask=mask, **options)
        alone = model.generate(ids[:1], **options)
    assert generated.shape == (2, 9)
    assert torch.equal(generated[0], alone[0])
    assert torch.equal(generated[1, 5:], other_padding[1, 5:])

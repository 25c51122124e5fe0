"""Tied adaptive input and output layers (`tie_adaptive_weights`, Baevski & Auli 2019): which tensors are shared, that
the sharing survives init, saving, loading, device and dtype moves and training, that the tied output layer computes
what `nn.AdaptiveLogSoftmaxWithLoss` computes with the same weights, and the configs that are refused."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import load_file
from tests.helpers import VOCAB, batch_of_tokens, family_classes, make_model, tiny_config
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from hf_settransformer.layers import TiedAdaptiveLogSoftmax, TransposedProjection

CUTOFFS = [4, 16]  # clusters of 4, 12 and 21 ids; widths 32, 8, 2 at hidden 32 and div value 4
HEADS = [("decoder", AutoModelForCausalLM), ("encoder", AutoModelForCausalLM), ("encoder", AutoModelForMaskedLM),
         ("set_transformer", AutoModelForCausalLM), ("perceiver_io", AutoModelForCausalLM),
         ("perceiver_io", AutoModelForMaskedLM)]
HEAD_IDS = [f"{family}-{auto.__name__.removeprefix('AutoModelFor')}" for family, auto in HEADS]


def adaptive_model(family="decoder", auto=AutoModelForCausalLM, tie=True, **changes):
    """A family's LM head with an adaptive input and an adaptive softmax at `CUTOFFS`, tied or not."""
    extra = {} if family == "decoder" else dict(context_length=8, target_length=4)
    if family == "perceiver_io":
        extra["num_latents"] = 4
    fields = dict(adaptive_input_cutoffs=CUTOFFS, adaptive_softmax_cutoffs=CUTOFFS, tie_adaptive_weights=tie)
    config = tiny_config(family, **{**extra, **fields, **changes})
    return make_model(family_classes(config)[auto], config)


def shared_pairs(model, projections=True):
    """(output-layer parameter, adaptive-input parameter) pairs that a tied model shares, found by module, not by name."""
    embedding, head = model.model.embeddings.embed_tokens, model.lm_head
    pairs = [(head.head.words.weight, embedding.embeddings[0].weight)]
    for i, (projection, words) in enumerate(head.tail):
        pairs.append((words.weight, embedding.embeddings[i + 1].weight))
        if projections:
            pairs.append((projection.weight, embedding.projections[i + 1].weight))
    return pairs


def count(model):
    return sum(p.numel() for p in model.parameters())  # a shared parameter counted once


def assert_tied(model, projections=True):
    for output, source in shared_pairs(model, projections):
        assert output is source


@pytest.mark.parametrize("family,auto", HEADS, ids=HEAD_IDS)
def test_tied_layers_share_tensors_and_save_one_copy(tmp_path, family, auto):
    model = adaptive_model(family, auto)
    assert isinstance(model.lm_head, TiedAdaptiveLogSoftmax)
    assert_tied(model)
    # 4 x 32 shortlist words, 12 x 8 and 21 x 2 cluster words, 32 x 8 and 32 x 2 projections
    assert count(adaptive_model(family, auto, tie=False)) - count(model) == 4 * 32 + 12 * 8 + 21 * 2 + 32 * 8 + 32 * 2

    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert not set(model.all_tied_weights_keys) & set(stored)  # each shared tensor once, under the input's name
    assert set(model.all_tied_weights_keys.values()) <= set(stored)
    assert sum(t.numel() for t in stored.values()) == count(model)

    loaded = type(model).from_pretrained(tmp_path).eval()
    assert_tied(loaded)
    ids = batch_of_tokens(2, 8)
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("div_value", [4.0, 2.0, 1.0])
@pytest.mark.parametrize("projections", [True, False], ids=["projections", "tables_only"])
def test_parameters_saved_match_the_shared_clusters(div_value, projections):
    """Each cluster's table is shared at its width; projections where the input has one (none at div value 1, where
    every cluster is full width) and `tie_adaptive_projections` asks for them."""
    changes = dict(adaptive_input_div_value=div_value, adaptive_softmax_div_value=div_value)
    model = adaptive_model(tie_adaptive_projections=projections, **changes)
    widths = [int(32 // div_value**i) for i in range(3)]
    sizes = [4, 12, 21]
    expected = sum(size * width for size, width in zip(sizes, widths))
    if projections:
        expected += sum(32 * width for width in widths[1:] if width != 32)
    assert count(adaptive_model(tie=False, **changes)) - count(model) == expected
    tied_projections = projections and div_value != 1.0
    assert_tied(model, projections=tied_projections)
    for projection, _ in model.lm_head.tail:
        assert isinstance(projection, TransposedProjection) == tied_projections
    if not tied_projections:  # the output keeps its own projections, untouched by the input's
        params = {id(p) for p in model.model.parameters()}
        assert all(id(projection.weight) not in params for projection, _ in model.lm_head.tail)


def untied_copy(model):
    """The untied model with the same values: `nn.AdaptiveLogSoftmaxWithLoss`'s head, tables and projections set from
    the tied model's shared tensors."""
    untied = adaptive_model(tie=False)
    embedding, head = model.model.embeddings.embed_tokens, model.lm_head
    with torch.no_grad():
        untied.model.load_state_dict(model.model.state_dict())
        untied.lm_head.head.weight.copy_(torch.cat([head.head.words.weight, head.head.clusters.weight]))
        for i, (projection, words) in enumerate(untied.lm_head.tail):
            words.weight.copy_(embedding.embeddings[i + 1].weight)
            projection.weight.copy_(embedding.projections[i + 1].weight.T)  # (width, hidden) from (hidden, width)
    return untied


def test_tied_output_computes_the_adaptive_softmax_and_gradients_add_up():
    """The tied layer's log-probabilities and loss are `nn.AdaptiveLogSoftmaxWithLoss`'s with the shared values, and
    a shared tensor's gradient is the sum of what the input and the output layers give it untied."""
    model = adaptive_model()
    untied = untied_copy(model)
    ids = batch_of_tokens(2, 8)
    torch.testing.assert_close(model(input_ids=ids).logits, untied(input_ids=ids).logits)
    model.train(), untied.train()
    loss, untied_loss = model(input_ids=ids, labels=ids).loss, untied(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, untied_loss)
    loss.backward()
    untied_loss.backward()
    embedding, untied_embedding = model.model.embeddings.embed_tokens, untied.model.embeddings.embed_tokens
    head = untied.lm_head
    torch.testing.assert_close(embedding.embeddings[0].weight.grad,
                               untied_embedding.embeddings[0].weight.grad + head.head.weight.grad[:CUTOFFS[0]])
    for i, (projection, words) in enumerate(head.tail):
        torch.testing.assert_close(embedding.embeddings[i + 1].weight.grad,
                                   untied_embedding.embeddings[i + 1].weight.grad + words.weight.grad)
        torch.testing.assert_close(embedding.projections[i + 1].weight.grad,
                                   untied_embedding.projections[i + 1].weight.grad + projection.weight.grad.T)
    assert embedding.projections[2].weight.grad.any()  # the rare cluster was reached: the check above is not vacuous


def test_a_training_step_keeps_the_layers_tied():
    model = adaptive_model().train()
    before = [source.detach().clone() for _, source in shared_pairs(model)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = batch_of_tokens(4, 8)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert_tied(model)
    assert all(not torch.equal(old, source) for old, (_, source) in zip(before, shared_pairs(model)))


def test_dtype_moves_meta_init_and_tie_weights_keep_the_layers_tied():
    model = adaptive_model().to(torch.float64).to("cpu")
    assert_tied(model)
    assert model.lm_head.tail[0][0].weight.dtype == torch.float64
    assert model(input_ids=batch_of_tokens(2, 8)).logits.dtype == torch.float64

    with torch.device("meta"):
        meta = adaptive_model()
    assert_tied(meta)
    meta.to_empty(device="cpu")
    meta.tie_weights()  # as for any tied model after `to_empty`
    assert_tied(meta)

    untied_by_hand = adaptive_model()
    untied_by_hand.lm_head.tail[1][1].weight = torch.nn.Parameter(untied_by_hand.lm_head.tail[1][1].weight.clone())
    untied_by_hand.tie_weights()
    assert_tied(untied_by_hand)


def test_resizing_keeps_the_tie_at_the_same_size_and_refuses_another():
    model = adaptive_model()
    model.resize_token_embeddings(VOCAB)
    assert_tied(model)
    with pytest.raises(ValueError, match="Cannot resize the vocabulary"):
        model.resize_token_embeddings(VOCAB + 5)


@pytest.mark.parametrize("name", ["tie_adaptive_weights", "tie_adaptive_projections"])
def test_untying_a_built_model_through_its_config_is_refused(tmp_path, name):
    """The tie shapes the output layer's modules: changed after the model is built, the forward and a save refuse."""
    model = adaptive_model()
    setattr(model.config, name, False)
    for use in (lambda: model(input_ids=batch_of_tokens(2, 8)), lambda: model.save_pretrained(tmp_path)):
        with pytest.raises(ValueError, match=f"`config.{name}` is False, but this TransformerDecoderForCausalLM was "
                                             f"built with {name}=True"):
            use()
    assert not any(tmp_path.iterdir())


def test_models_without_an_adaptive_softmax_build_with_the_field_set():
    """A base model or a classifier of the same config has no output layer to tie: nothing is tied, nothing fails."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    config = tiny_config("encoder", adaptive_input_cutoffs=CUTOFFS, adaptive_softmax_cutoffs=CUTOFFS,
                         tie_adaptive_weights=True)
    for auto in (AutoModel, AutoModelForSequenceClassification):
        model = make_model(family_classes(config)[auto], config)
        assert not model.all_tied_weights_keys


@pytest.mark.parametrize("changes,words", [
    ({"adaptive_input_cutoffs": None}, "needs both an adaptive input and an adaptive softmax (`adaptive_input_cutoffs` "
                                       "and `adaptive_softmax_cutoffs`); got adaptive_input_cutoffs=None"),
    ({"adaptive_softmax_cutoffs": None}, "got adaptive_input_cutoffs=[4, 16], adaptive_softmax_cutoffs=None"),
    ({"adaptive_softmax_cutoffs": [4, 20]}, "needs `adaptive_input_cutoffs` equal to `adaptive_softmax_cutoffs`"),
    ({"adaptive_input_div_value": 2.0}, "needs `adaptive_input_div_value` equal to `adaptive_softmax_div_value`"),
    ({"hidden_size": 8, "num_attention_heads": 2, "adaptive_input_div_value": 4.0, "adaptive_softmax_div_value": 4.0,
      "adaptive_input_cutoffs": [4, 8, 16], "adaptive_softmax_cutoffs": [4, 8, 16]}, "the cluster widths are [8, 2, 0, 0]"),
], ids=["no_input", "no_softmax", "cutoffs", "div_value", "zero_width"])
def test_configs_that_cannot_be_tied_are_refused(changes, words):
    fields = dict(adaptive_input_cutoffs=CUTOFFS, adaptive_softmax_cutoffs=CUTOFFS, tie_adaptive_weights=True)
    with pytest.raises(StrictDataclassError, match=escaped(words)):
        tiny_config("decoder", **{**fields, **changes})
    config = tiny_config("decoder", **{**fields, "tie_adaptive_weights": False, **changes})  # valid untied
    config.tie_adaptive_weights = True  # a rule across fields: refused at validate()
    with pytest.raises(StrictDataclassError, match=escaped(words)):
        config.validate()


def test_tie_word_embeddings_is_refused_beside_the_adaptive_tie():
    with pytest.raises(StrictDataclassError, match="`tie_word_embeddings=True` cannot hold"):
        tiny_config("decoder", adaptive_input_cutoffs=CUTOFFS, adaptive_softmax_cutoffs=CUTOFFS,
                    tie_adaptive_weights=True, tie_word_embeddings=True)


def escaped(words):
    return words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")

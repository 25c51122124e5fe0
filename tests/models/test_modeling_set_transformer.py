"""Mirrors `hf_settransformer/modeling_set_transformer.py`: continuous set inputs, the sequence-classification
problem types, the mixture-of-Gaussians head."""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, batch_of_tokens, make_model, tiny_config

import hf_settransformer as hfst

ATOL = 1e-5


def test_continuous_set_inputs_are_permutation_invariant():
    config = tiny_config("set_transformer", vocab_size=None, input_size=3)
    model = make_model(hfst.SetTransformerModel, config)
    x = torch.randn(4, 9, 3)
    perm = torch.randperm(9)
    assert torch.allclose(
        model(input_features=x).pooler_output, model(input_features=x[:, perm]).pooler_output, atol=ATOL
    )


@pytest.mark.parametrize(
    "num_labels,labels,problem_type",
    [
        (1, torch.randn(4), "regression"),
        (3, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0]]), "multi_label_classification"),
    ],
)
def test_problem_types(num_labels, labels, problem_type):
    config = tiny_config(
        "set_transformer", num_labels=num_labels, problem_type=problem_type if problem_type != "regression" else None
    )
    model = make_model(hfst.SetTransformerForSequenceClassification, config)
    out = model(input_ids=batch_of_tokens(4, 5), labels=labels)
    assert torch.isfinite(out.loss) and model.config.problem_type == problem_type
    if problem_type == "regression":
        expected = torch.nn.functional.mse_loss(out.logits.squeeze(-1), labels)
    else:
        expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels)
    assert torch.allclose(out.loss, expected, atol=1e-6)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_mixture_of_gaussians_follows_output_conventions(attention_type, feature_map):
    """Its main input is `input_features` on the class (generic code reads it there), and the hidden states and
    attention weights it is asked for come back (they used to be dropped)."""
    import inspect

    cls = hfst.SetTransformerForMixtureOfGaussians
    assert cls.main_input_name == list(inspect.signature(cls.forward).parameters)[1] == "input_features"
    config = tiny_config("set_transformer", attention_type, feature_map, vocab_size=None, input_size=2)
    model = make_model(cls, config)
    out = model(input_features=torch.randn(2, 6, 2), output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert out.hidden_states[0].shape == (2, 6, config.hidden_size)
    if attention_type == "softmax":  # two per ISAB, then PMA and the decoder SAB
        assert len(out.attentions) == 2 * config.num_hidden_layers + 1 + config.num_decoder_layers
    else:
        assert out.attentions is None

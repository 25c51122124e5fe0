"""Mirrors `hf_settransformer/blocks.py`: the Set Transformer's MAB/ISAB/PMA blocks, in a model and under padding."""

import torch
from tests.helpers import batch_of_tokens, make_model, tiny_config

import hf_settransformer as hfst

ATOL = 1e-5


def test_isab_and_pma_are_used_by_the_set_transformer():
    model = hfst.SetTransformerModel(tiny_config("set_transformer", num_inducing_points=3, num_seeds=2))
    assert all(isinstance(layer, hfst.ISAB) for layer in model.encoder_layers)
    assert model.pma.seeds.weight.shape == (2, 32)
    sab = hfst.SetTransformerModel(tiny_config("set_transformer", num_inducing_points=0))
    assert all(isinstance(layer, hfst.MAB) for layer in sab.encoder_layers)
    out = sab(input_ids=batch_of_tokens())
    assert out.pooler_output.shape == (2, 1, 32)


def test_set_padding_with_continuous_features_and_isab_pma():
    config = tiny_config("set_transformer", "softmax", vocab_size=None, input_size=2, num_seeds=3)
    model = make_model(hfst.SetTransformerForSequenceClassification, config)
    x = torch.randn(3, 4, 2)
    ref = model(input_features=x).logits
    padded = torch.cat([x, 100 * torch.randn(3, 6, 2)], dim=1)
    mask = torch.cat([torch.ones(3, 4), torch.zeros(3, 6)], dim=1)
    assert torch.allclose(model(input_features=padded, attention_mask=mask).logits, ref, atol=ATOL)

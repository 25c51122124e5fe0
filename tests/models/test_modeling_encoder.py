"""Mirrors `hf_settransformer/modeling_encoder.py`: the encoder's masked-LM head."""

import torch
from tests.helpers import batch_of_tokens, make_model, tiny_config

import hf_settransformer as hfst


def test_masked_lm_loss_ignores_minus_100():
    model = make_model(hfst.TransformerEncoderForMaskedLM, tiny_config("encoder"))
    ids = batch_of_tokens(2, 6)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 4] = 5, 7
    out = model(input_ids=ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[[0, 1], [2, 4]], torch.tensor([5, 7]))
    assert torch.allclose(out.loss, expected, atol=1e-6)

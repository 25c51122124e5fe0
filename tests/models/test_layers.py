"""Mirrors `hf_settransformer/layers.py`: ScaleNorm and the norm choice, the scaled token embedding, positions."""

import math

import pytest
import torch
from tests.helpers import VOCAB, batch_of_tokens, make_model, tiny_config

import hf_settransformer as hfst


def test_scalenorm_formula_and_init():
    norm = hfst.ScaleNorm(16, eps=1e-5)
    assert torch.allclose(norm.weight, torch.tensor([4.0]))
    x = torch.randn(3, 5, 16)
    expected = 4.0 * x / x.norm(dim=-1, keepdim=True)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert torch.equal(norm(torch.zeros(2, 16)), torch.zeros(2, 16))  # max(||x||, eps): no NaN at zero


def test_norm_type_layernorm_is_used():
    model = hfst.TransformerEncoderModel(tiny_config("encoder", norm_type="layernorm"))
    assert not any(isinstance(m, hfst.ScaleNorm) for m in model.modules())
    assert any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())


def test_scaled_embedding_keeps_tying_and_resizing():
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    model.resize_token_embeddings(VOCAB + 5)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, hfst.layers.ScaledEmbedding) and embedding.weight.shape[0] == VOCAB + 5
    assert embedding.scale == pytest.approx(math.sqrt(32)) and model.lm_head.weight is embedding.weight
    assert model(input_ids=torch.tensor([[VOCAB + 4]])).logits.shape == (1, 1, VOCAB + 5)


def test_sinusoidal_positions_extrapolate():
    model = make_model(hfst.TransformerDecoderModel, tiny_config("decoder", max_position_embeddings=8))
    assert torch.isfinite(model(input_ids=batch_of_tokens(1, 20)).last_hidden_state).all()

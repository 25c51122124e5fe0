"""Mirrors `hf_settransformer/cache.py`: which cache a decoder makes (transformers' DynamicCache for softmax, a
`LinearAttentionCache` of recurrent states for linear attention), a recurrent state that does not grow with the
context, and a linear decoder refusing a key-value cache."""

import pytest
import torch
from conftest import ATTENTION_IDS, ATTENTIONS, VOCAB, decoder
from transformers import DynamicCache

from hf_settransformer.cache import LinearAttentionCache


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_cache_type(attention_type, feature_map):
    model = decoder(attention_type, feature_map)
    out = model(input_ids=torch.randint(0, VOCAB, (2, 5)), use_cache=True)
    expected = DynamicCache if attention_type == "softmax" else LinearAttentionCache
    assert isinstance(out.past_key_values, expected)
    assert out.past_key_values.get_seq_length() == 5
    assert model(input_ids=torch.randint(0, VOCAB, (2, 5)), use_cache=False).past_key_values is None


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_linear_state_size_does_not_grow_with_the_context(feature_map):
    model = decoder("linear", feature_map)
    sizes, shapes = [], []
    for length in (3, 40, 300):
        out = model(input_ids=torch.randint(0, VOCAB, (2, length)), use_cache=True)
        cache = out.past_key_values
        step = model(input_ids=torch.randint(0, VOCAB, (2, 1)), past_key_values=cache, use_cache=True)
        cache = step.past_key_values
        assert cache.get_seq_length() == length + 1
        sizes.append(cache.state_nbytes())
        shapes.append(
            [
                (s.kv.shape, s.z.shape, None if s.k_max is None else s.k_max.shape)
                for s in (layer.state for layer in cache.layers)
            ]
        )
    assert sizes[0] == sizes[1] == sizes[2] > 0
    assert shapes[0] == shapes[1] == shapes[2]
    kv_shape = shapes[0][0][0]
    assert kv_shape == (2, 4, 8, 8)  # (batch, heads, head dim, head dim): no sequence axis


def test_linear_cache_rejects_a_key_value_cache():
    model = decoder("linear", "elu")
    cache = DynamicCache()
    cache.update(torch.zeros(1, 4, 3, 8), torch.zeros(1, 4, 3, 8), 0)
    with pytest.raises(ValueError, match="LinearAttentionCache"):
        model(input_ids=torch.randint(0, VOCAB, (1, 1)), past_key_values=cache)
    # an empty one (as EncoderDecoderModel.generate makes) is replaced by recurrent states
    out = model(input_ids=torch.randint(0, VOCAB, (1, 4)), past_key_values=DynamicCache(), use_cache=True)
    assert isinstance(out.past_key_values, LinearAttentionCache)

"""Mirrors `hf_settransformer/cache.py`: which cache a decoder makes (transformers' DynamicCache for softmax, a
`LinearAttentionCache` of recurrent states for linear attention), a recurrent state that does not grow with the
context, and a linear decoder refusing a key-value cache (a static one too); the in-place (static) recurrent state."""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, VOCAB, decoder, left_padded_batch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, StaticLayer, StaticSlidingWindowLayer

from hf_settransformer.cache import LinearAttentionCache, static_cache_length


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


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_linear_attention_refuses_a_static_cache_and_names_its_own_state(feature_map):
    model = decoder("linear", feature_map)
    ids, mask = left_padded_batch()
    match = "cannot use a static cache.*LinearAttentionCache.*static=True"
    with pytest.raises(ValueError, match=match):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, pad_token_id=0, cache_implementation="static")
    with pytest.raises(ValueError, match=match):
        model(input_ids=ids, past_key_values=StaticCache(config=model.config, max_cache_len=12))


def test_static_cache_length_refuses_sliding_window_layers():
    assert static_cache_length(DynamicCache()) is None
    assert static_cache_length(Cache(layers=[StaticLayer(max_cache_len=8), StaticLayer(max_cache_len=8)])) == 8
    sliding = Cache(layers=[StaticSlidingWindowLayer(max_cache_len=8, sliding_window=4)])
    with pytest.raises(ValueError, match="one `StaticLayer` per layer"):
        decoder("softmax", "elu")(input_ids=torch.ones(1, 2, dtype=torch.long), past_key_values=sliding)


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_static_linear_cache_updates_its_state_in_place(feature_map):
    """LinearAttentionCache(static=True): the prefill's state buffers are written in place by every step (fixed
    addresses, for CUDA graphs), tokens are counted in a tensor, and the outputs are those of the usual cache."""
    model = decoder("linear", feature_map)
    ids, mask = left_padded_batch()
    continuation = torch.randint(1, VOCAB, (2, 4))
    caches = [LinearAttentionCache(config=model.config), LinearAttentionCache(config=model.config, static=True)]
    logits = [[], []]
    with torch.no_grad():
        for cache, out in zip(caches, logits):
            out.append(model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits)
            addresses = [t.data_ptr() for layer in cache.layers for t in (layer.state.kv, layer.state.z)]
            step_mask = mask
            for t in range(4):
                step_mask = torch.cat([step_mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
                step = model(input_ids=continuation[:, t : t + 1], attention_mask=step_mask, past_key_values=cache)
                out.append(step.logits)
            now = [t.data_ptr() for layer in cache.layers for t in (layer.state.kv, layer.state.z)]
            assert (now == addresses) == cache.layers[0].static
    for a, b in zip(*logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    counted = caches[1].get_seq_length()
    assert torch.is_tensor(counted) and int(counted) == 11 == caches[0].get_seq_length()
    assert caches[1].state_nbytes() == caches[0].state_nbytes()
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    expected = model.generate(ids, **kwargs)
    assert torch.equal(
        model.generate(ids, past_key_values=LinearAttentionCache(config=model.config, static=True), **kwargs), expected
    )


def filled_cache(model, n=5):
    with torch.no_grad():
        return model(input_ids=torch.randint(1, VOCAB, (1, n)), use_cache=True).past_key_values


@pytest.mark.parametrize("made_by,continued_by", [("exp", "elu"), ("elu", "exp")])
def test_a_linear_cache_of_another_feature_map_is_refused(made_by, continued_by):
    """An exp-map cache continued by an elu model ran (logits 2.4-3.6 off the elu model's own); the reverse failed
    inside the ops. Both are refused, from the map the cache recorded and from the state (exp keeps key maxima)."""
    model = decoder("linear", continued_by)
    step = torch.randint(1, VOCAB, (1, 1))
    refused = f"'{made_by}' feature map, but this model's `feature_map` is '{continued_by}'"
    with pytest.raises(ValueError, match=refused):
        model(input_ids=step, past_key_values=filled_cache(decoder("linear", made_by)))
    # a cache built without a config records the map of the model that fills it first
    anonymous = LinearAttentionCache(num_layers=2)
    with torch.no_grad():
        decoder("linear", made_by)(input_ids=torch.randint(1, VOCAB, (1, 5)), past_key_values=anonymous)
    with pytest.raises(ValueError, match=refused):
        model(input_ids=step, past_key_values=anonymous)
    # one whose states were set by hand records no map: the state tells
    by_hand = LinearAttentionCache(num_layers=2)
    for layer, filled in zip(by_hand.layers, anonymous.layers):
        layer.set_state(filled.state, 5)
    with pytest.raises(ValueError, match=f"key maxima.*this model's `feature_map` is '{continued_by}'"):
        model(input_ids=step, past_key_values=by_hand)
    model(input_ids=step, past_key_values=filled_cache(model))  # its own still continues


WIDTHS = {  # another model's shape -> the words naming the mismatch (this one: hidden 32, 4 heads of 8, 2 layers)
    "fewer heads, same head size": ({"hidden_size": 16, "num_attention_heads": 2}, "2 heads of size 8"),
    "other head size": ({"hidden_size": 32, "num_attention_heads": 2}, "2 heads of size 16"),
    "wider": ({"hidden_size": 64, "intermediate_size": 64}, "4 heads of size 16"),
    "deeper": ({"num_hidden_layers": 3}, "hold 3 layers, but this model has 2"),
    "shallower": ({"num_hidden_layers": 1}, "hold 1 layers, but this model has 2"),
}


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("other", list(WIDTHS))
def test_a_cache_of_a_model_of_another_width_or_depth_is_refused_naming_the_mismatch(attention_type, feature_map,
                                                                                      other):
    """It failed with a torch shape error (or, deeper, ran on the first layers' past)."""
    overrides, words = WIDTHS[other]
    cache = filled_cache(decoder(attention_type, feature_map, **overrides))
    with pytest.raises(ValueError, match=f"{words}.*a cache continues only the model that made it"):
        decoder(attention_type, feature_map)(input_ids=torch.randint(1, VOCAB, (1, 1)), past_key_values=cache)


@pytest.mark.parametrize("made_by,continued_by", [("softmax", "linear"), ("linear", "softmax")])
def test_a_softmax_cache_and_a_linear_state_are_not_interchangeable(made_by, continued_by):
    cache = filled_cache(decoder(made_by, "elu"))
    own = "LinearAttentionCache" if continued_by == "linear" else "DynamicCache"
    with pytest.raises(ValueError, match=f"keeps its past in a {own}, not a {type(cache).__name__}"):
        decoder(continued_by, "elu")(input_ids=torch.randint(1, VOCAB, (1, 1)), past_key_values=cache)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_the_cache_is_read_once_per_forward_and_handed_down_whole(attention_type, feature_map, monkeypatch):
    """One `DecoderCache` per forward, made where the checks read the given cache (or, with none, by the forward), and
    the same object reaches every attention layer, which takes its own cache layer from it."""
    from hf_settransformer import cache as cache_module
    from hf_settransformer.attention import MultiHeadAttention

    model = decoder(attention_type, feature_map)
    reads, seen = [], []
    read, forward = cache_module.DecoderCache.read.__func__, MultiHeadAttention.forward

    def counted_read(cls, *args, **kwargs):
        reads.append(1)
        return read(cls, *args, **kwargs)

    def recorded_forward(self, *args, **kwargs):
        seen.append(kwargs["past_key_values"])
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cache_module.DecoderCache, "read", classmethod(counted_read))
    monkeypatch.setattr(MultiHeadAttention, "forward", recorded_forward)
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, VOCAB, (2, 5)), use_cache=True).past_key_values
        assert len(reads) == 1 and len(seen) == 2 and seen[0] is seen[1] and seen[0].returned is cache
        reads.clear()
        seen.clear()
        model(input_ids=torch.randint(1, VOCAB, (2, 1)), past_key_values=cache)
        assert len(reads) == 1 and len(seen) == 2 and seen[0] is seen[1] and seen[0].self_attention is cache
    assert cache.get_seq_length() == 6


def test_the_linear_kernel_writes_no_metadata_on_the_cache_layer():
    """The kernel reads and extends its layer's state; what made the cache is recorded where the cache is read."""
    from hf_settransformer.attention import AttentionMask, linear_kernel
    from hf_settransformer.cache import RecurrentStateLayer

    layer = RecurrentStateLayer()
    q, k, v = (torch.randn(1, 4, 3, 8) for _ in range(3))
    linear_kernel(q, k, v, AttentionMask(causal=True), layer, feature_map="elu", linear_attention_decay="fixed")
    assert layer.state is not None and layer.get_seq_length() == 3
    assert layer.feature_map is None and layer.decay is None

"""Cached decoding and `generate()`: a cached step equals the full forward pass; generate() with a cache gives the
tokens it gives without one, and with transformers' StaticCache (softmax) those of the dynamic cache. The caches
themselves (`hf_settransformer/cache.py`) are in test_cache.py; compiled decoding steps in test_compile_export.py."""

import pytest
import torch
import torch.nn.functional as F
from tests.helpers import (
    ATTENTION_IDS,
    ATTENTIONS,
    HEAD_FAMILIES,
    VOCAB,
    check_cached_steps,
    decoder,
    left_padded_batch,
    many_target_head,
    tiny_config,
)
from transformers import StaticCache

import hf_settransformer as hfst

ATOL = 1e-4


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_cached_steps_equal_full_forward_with_left_padding(attention_type, feature_map):
    assert check_cached_steps(decoder(attention_type, feature_map)).get_seq_length() == 13


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("chunks", [(5, 7, 9), (1, 1, 19), (12, 9)])
def test_chunked_prefill_equals_one_pass(attention_type, feature_map, chunks):
    model = decoder(attention_type, feature_map)
    ids = torch.randint(1, VOCAB, (2, sum(chunks)))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache, start = None, 0
        for size in chunks:
            out = model(input_ids=ids[:, start : start + size], past_key_values=cache, use_cache=True)
            assert torch.allclose(out.logits, full[:, start : start + size], atol=ATOL), (start, size)
            cache, start = out.past_key_values, start + size


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_greedy_with_cache_equals_without(attention_type, feature_map):
    model = decoder(attention_type, feature_map)
    ids, mask = left_padded_batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, use_cache=True, **kwargs)
    uncached = model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    # and it is the argmax of full forward passes, row by row without padding
    for row, start in ((0, 0), (1, 3)):
        expected = ids[row : row + 1, start:]
        with torch.no_grad():
            for _ in range(12):
                nxt = model(input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)
                expected = torch.cat([expected, nxt], dim=1)
        assert torch.equal(cached[row, start:], expected[0])


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_beam_search_and_sampling(attention_type, feature_map):
    model = decoder(attention_type, feature_map)
    ids, mask = left_padded_batch()
    beams = dict(attention_mask=mask, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, use_cache=True, **beams)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **beams))
    returned = model.generate(ids, num_return_sequences=2, **beams)
    assert returned.shape == (4, 13)
    torch.manual_seed(0)
    sampled = model.generate(
        ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=10, num_return_sequences=3, pad_token_id=0
    )
    assert sampled.shape == (6, 12)
    assert torch.equal(sampled[:, :7], ids.repeat_interleave(3, dim=0))


def test_attention_mask_must_cover_the_cache():
    model = decoder("softmax", "elu")
    cache = model(input_ids=torch.randint(0, VOCAB, (1, 4)), use_cache=True).past_key_values
    with pytest.raises(ValueError, match=r"\(1, 5\)"):
        model(input_ids=torch.randint(0, VOCAB, (1, 1)), attention_mask=torch.ones(1, 1), past_key_values=cache)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_generate_feeds_one_token_per_step(attention_type, feature_map):
    model = decoder(attention_type, feature_map)
    lengths = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    model.generate(torch.randint(1, VOCAB, (1, 9)), max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert lengths == [9, 1, 1, 1, 1]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_static_cache_greedy_equals_dynamic_cache(padded, implementation):
    """generate(cache_implementation="static"): keys and values in fixed buffers, whose unwritten slots and padding are
    masked, give the dynamic cache's tokens."""
    model = decoder("softmax", "elu")
    model.set_attn_implementation(implementation)
    ids, mask = left_padded_batch()
    if not padded:
        ids, mask = ids[:1], mask[:1]
    kwargs = {"attention_mask": mask, "max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    kwargs["return_dict_in_generate"] = True
    dynamic = model.generate(ids, **kwargs)
    static = model.generate(ids, cache_implementation="static", **kwargs)
    assert isinstance(static.past_key_values, StaticCache)
    assert torch.equal(static.sequences, dynamic.sequences)


def test_static_cache_steps_equal_full_forward_with_left_padding():
    """The mask covers every slot of the cache, ones even for tokens not yet given: the slots not yet written are
    masked by the queries' positions (from the cache's counter), not by the mask."""
    model = decoder("softmax", "elu")
    ids, mask = left_padded_batch()
    continuation = torch.randint(1, VOCAB, (2, 4))
    full_ids = torch.cat([ids, continuation], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(continuation)], dim=1)
    slots = 16
    static_mask = F.pad(full_mask, (0, slots - full_mask.shape[1]), value=1)
    cache = StaticCache(config=model.config, max_cache_len=slots)
    with torch.no_grad():
        full = model(input_ids=full_ids, attention_mask=full_mask, use_cache=False).logits
        out = model(input_ids=ids, attention_mask=static_mask, past_key_values=cache, use_cache=True)
        real = mask.bool()
        torch.testing.assert_close(out.logits[real], full[:, :7][real], atol=ATOL, rtol=0)
        for t in range(4):
            step = model(input_ids=continuation[:, t : t + 1], attention_mask=static_mask, past_key_values=cache)
            torch.testing.assert_close(step.logits[:, 0], full[:, 7 + t], atol=ATOL, rtol=0)
    assert int(cache.get_seq_length()) == 11
    with pytest.raises(ValueError, match="static cache of 16 slots"):
        model(input_ids=continuation[:, :1], attention_mask=full_mask, past_key_values=cache)


def test_a_four_dimensional_mask_is_refused_by_name():
    """EncoderDecoderModel.generate(cache_implementation="static") hands the decoder transformers' 4-D mask."""
    model = decoder("softmax", "elu")
    with pytest.raises(ValueError, match="2-D `attention_mask`.*4-D"):
        model(input_ids=torch.randint(1, VOCAB, (1, 3)), attention_mask=torch.ones(1, 1, 3, 3, dtype=torch.bool))


@pytest.mark.parametrize("options", [{"prompt_lookup_num_tokens": 2}, "assistant"], ids=["prompt_lookup", "assistant"])
def test_assisted_generation_runs_with_softmax_and_names_the_limit_of_a_recurrent_state(options):
    """Softmax decoders take assisted generation (the same tokens as greedy search); linear attention's state cannot
    drop rejected candidates, and a cache-less next-token head has no cache: each says so (transformers said
    "assisted decoding requires a cache" of both)."""
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    for attention_type in ("softmax", "linear"):
        model, assistant = decoder(attention_type, "elu").eval(), decoder(attention_type, "elu").eval()
        kwargs = options if isinstance(options, dict) else {"assistant_model": assistant}
        greedy = model.generate(ids, max_new_tokens=5, do_sample=False)
        if attention_type == "softmax":
            assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False, **kwargs), greedy)
            continue
        with pytest.raises(ValueError, match="attention_type='linear'.*a recurrent state .* cannot drop tokens"):
            model.generate(ids, max_new_tokens=5, do_sample=False, **kwargs)
    windowed = hfst.TransformerEncoderForNextTokenPrediction(tiny_config("encoder")).eval()
    kwargs = options if isinstance(options, dict) else {"assistant_model": windowed}
    with pytest.raises(ValueError, match="TransformerEncoderForNextTokenPrediction keeps none"):
        windowed.generate(ids, max_new_tokens=3, do_sample=False, **kwargs)


@pytest.mark.parametrize("mode", ["many", "window"])
@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_window_head_generates_from_inputs_embeds_as_from_the_ids(family, mode):
    """generate(inputs_embeds=embed(ids)) on a next-token head (no cache: it reads its whole window at each step, the
    prompt's vectors then the new tokens) gives the new tokens generate(ids) gives: greedy, with a mask, with beams
    past the window (context 12, prompt 5, 10 new tokens)."""
    model = many_target_head(family, next_token_mode=mode)
    ids = torch.randint(1, VOCAB, (2, 5))
    vectors = model.get_input_embeddings()(ids).detach()
    for options in ({}, {"attention_mask": torch.ones_like(ids)}, {"num_beams": 2}):
        expected = model.generate(ids, max_new_tokens=10, do_sample=False, **options)
        got = model.generate(inputs_embeds=vectors, max_new_tokens=10, do_sample=False, **options)
        assert torch.equal(got, expected[:, 5:]), options


def test_a_window_head_refuses_generate_arguments_it_would_drop():
    """A prompt given both as ids and as vectors (the vectors were dropped), and `position_ids` (dropped: the window's
    positions come from its mask)."""
    model = many_target_head("encoder")
    ids = torch.randint(1, VOCAB, (2, 5))
    with pytest.raises(ValueError, match="`input_ids` or as `inputs_embeds`, not both"):
        model.generate(ids, inputs_embeds=model.get_input_embeddings()(ids), max_new_tokens=2)
    with pytest.raises(ValueError, match="takes no `position_ids`"):
        model.generate(ids, position_ids=torch.arange(5)[None].expand(2, -1) + 3, max_new_tokens=2)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_the_decoder_generates_from_inputs_embeds_as_from_the_ids(attention_type, feature_map):
    """transformers' own route (the vectors at the first step, then the cache), with and without a cache."""
    model = decoder(attention_type, feature_map)
    ids = torch.randint(1, VOCAB, (2, 5))
    vectors = model.get_input_embeddings()(ids).detach()
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    for use_cache in (True, False):
        got = model.generate(inputs_embeds=vectors, max_new_tokens=6, do_sample=False, use_cache=use_cache)
        assert torch.equal(got, expected[:, 5:])

"""`hidden_states`, `attentions` and `cross_attentions` of the base models, recorded by transformers' hooks
(`_can_record_outputs` + `capture_outputs`, through `modeling_common.record_outputs`), against the same values
collected by running each model's blocks by hand."""

import inspect

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, FAMILIES, VOCAB, make_model, tiny_config

import hf_settransformer as hfst
from hf_settransformer.attention import AttentionMask
from hf_settransformer.blocks import ISAB

BASES = {
    "encoder": hfst.TransformerEncoderModel,
    "decoder": hfst.TransformerDecoderModel,
    "set_transformer": hfst.SetTransformerModel,
    "perceiver_io": hfst.PerceiverIOModel,
}
# config overrides and forward inputs beyond input_ids/attention_mask, one entry per variant a family's forward has
VARIANTS = {
    "encoder": [({}, {}), ({}, {"prefix_length": 3})],
    "decoder": [({}, {"use_cache": False}), ({"add_cross_attention": True}, {"use_cache": False, "cross": True})],
    "set_transformer": [({}, {}), ({"num_inducing_points": 0}, {}), ({}, {"prefix_length": 3})],
    "perceiver_io": [({}, {}), ({"output_query_type": "learned", "num_output_queries": 2}, {}), ({}, {"prefix_length": 3})],
}
CASES = [(f, a, i) for f in FAMILIES for a in range(len(ATTENTIONS)) for i in range(len(VARIANTS[f]))]
CASE_IDS = [f"{f}-{ATTENTION_IDS[a]}-v{i}" for f, a, i in CASES]


def by_hand_encoder(model, inputs):
    states, _, mask = model.embed_inputs(inputs["input_ids"], attention_mask=model_mask(inputs),
                                         causal="prefix_length" in inputs,
                                         prefix_length=inputs.get("prefix_length", 0))
    hidden, weights = [states], []
    for layer in model.layers:
        states, w, _ = layer(states, mask=mask, output_attentions=True)
        hidden.append(states)
        weights.append(w)
    return hidden[:-1] + [model.final_norm(states)], weights, None


def model_mask(inputs):
    """The mask the model's blocks get: the one given, or None where every element is real (the input check drops
    it, so that the kernels take their unmasked paths)."""
    mask = inputs["attention_mask"]
    return None if mask is None or bool(mask.all()) else mask


def by_hand_decoder(model, inputs):
    states, _, mask = model.embed_inputs(inputs["input_ids"], attention_mask=model_mask(inputs), causal=True)
    encoder_states = inputs.get("encoder_hidden_states")
    cross_mask = None if encoder_states is None else AttentionMask.build(None)
    hidden, weights, cross = [states], [], []
    for layer in model.layers:
        states, w, c = layer(states, mask=mask, cross_states=encoder_states, cross_mask=cross_mask,
                             output_attentions=True)
        hidden.append(states)
        weights.append(w)
        cross.append(c)
    return hidden[:-1] + [model.final_norm(states)], weights, cross if encoder_states is not None else None


def by_hand_set_transformer(model, inputs):
    prefix = inputs.get("prefix_length")
    states, _, mask = model.embed_inputs(inputs["input_ids"], attention_mask=model_mask(inputs),
                                         causal=prefix is not None, prefix_length=prefix or 0)
    masks = model.build_masks(mask, states.shape[:2], prefix, states.device)
    hidden, weights = [states], []
    for layer in model.encoder_layers:
        if isinstance(layer, ISAB):
            states, w = layer(states, masks["induce"], True, masks["broadcast"], keys_from=prefix)
            weights += list(w)
        else:
            states, w, _ = layer(states, mask=mask, output_attentions=True)
            weights.append(w)
        hidden.append(states)
    states = model.encoder_norm(states)
    pooled, w = model.pma(states, masks["pool"], True, queries=None if prefix is None else states[:, prefix:])
    weights.append(w)
    for layer in model.decoder_layers:
        pooled, w, _ = layer(pooled, mask=masks["decoder"], output_attentions=True)
        weights.append(w)
    return hidden[:-1] + [states], weights, None


def by_hand_perceiver_io(model, inputs):
    inputs_embedded, position_ids, mask = model.embed_inputs(inputs["input_ids"],
                                                             attention_mask=model_mask(inputs))
    prefix = inputs.get("prefix_length")
    latents, cross_mask, self_mask = model.initial_latents(inputs_embedded, mask, prefix)
    latents, enc, _ = model.encoder_cross_attention(latents, inputs_embedded, mask=cross_mask, output_attentions=True)
    hidden, weights = [inputs_embedded, latents], []
    for _ in range(model.config.num_blocks):
        for layer in model.latent_layers:
            latents, w, _ = layer(latents, mask=self_mask, output_attentions=True)
            hidden.append(latents)
            weights.append(w)
    latents = model.latent_norm(latents)
    b, n = inputs_embedded.shape[:2]
    queries = model.decoder_queries(inputs_embedded, position_ids, b, n) if prefix is None else latents
    _, dec, _ = model.decoder_cross_attention(queries, latents, mask=self_mask, output_attentions=True)
    return hidden, weights, [enc, dec]


BY_HAND = {"encoder": by_hand_encoder, "decoder": by_hand_decoder, "set_transformer": by_hand_set_transformer,
           "perceiver_io": by_hand_perceiver_io}


def inputs_for(family, forward_inputs, padded):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    if padded and family == "decoder":  # left padded, as for generation
        mask[1, :2] = 0
    elif padded:
        mask[1, -2:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, **forward_inputs}
    if inputs.pop("cross", False):
        inputs["encoder_hidden_states"] = torch.randn(2, 4, 32)
    return inputs


def assert_softmax_rows(weights, key_mask):
    """(b, h, q, k) weights: every real query's row sums to 1 over the keys and puts nothing on padded keys
    (`key_mask` (b, k) or None; for a self-attention, q = k, it tells the real queries too: a padded query's row is
    not a distribution)."""
    sums = weights.sum(-1)  # (b, h, q)
    if key_mask is not None:
        real = key_mask.bool()
        assert torch.all(weights.masked_select(~real[:, None, None, :]) == 0)
        if weights.shape[-2] == weights.shape[-1]:
            sums = sums.masked_select(real[:, None, :])
    torch.testing.assert_close(sums, torch.ones_like(sums))


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("family,attention,variant", CASES, ids=CASE_IDS)
def test_recorded_outputs_equal_the_blocks_run_by_hand(family, attention, variant, padded):
    attention_type, feature_map = ATTENTIONS[attention]
    overrides, forward_inputs = VARIANTS[family][variant]
    model = make_model(BASES[family], tiny_config(family, attention_type, feature_map, **overrides))
    inputs = inputs_for(family, forward_inputs, padded)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        hidden, weights, cross = BY_HAND[family](model, inputs)
        embedded = model.embed_inputs(inputs["input_ids"], attention_mask=model_mask(inputs))[0]

    assert len(out.hidden_states) == len(hidden)
    for got, expected in zip(out.hidden_states, hidden):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if family != "decoder":  # the decoder's embeddings need the cache's positions (same values: by hand above)
        torch.testing.assert_close(out.hidden_states[0], embedded, rtol=0, atol=0)
    if family == "perceiver_io":  # the last state is the latents before the latent norm, not the decoded queries
        assert len(hidden) == 2 + model.config.num_blocks * model.config.num_self_attends_per_block
        torch.testing.assert_close(model.latent_norm(out.hidden_states[-1]), out.latent_hidden_state, rtol=0, atol=0)
    else:
        assert len(hidden) == model.config.num_hidden_layers + 1
        assert out.hidden_states[-1] is out.last_hidden_state

    if attention_type == "linear":  # no weights are formed: None, not a tuple of Nones
        assert out.attentions is None and getattr(out, "cross_attentions", None) is None
        return
    assert len(out.attentions) == len(weights)
    for got, expected in zip(out.attentions, weights):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert_softmax_rows(got, inputs["attention_mask"] if family in ("encoder", "decoder") else None)
    if cross is None:
        assert getattr(out, "cross_attentions", None) is None
    else:
        assert len(out.cross_attentions) == len(cross)
        for got, expected in zip(out.cross_attentions, cross):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
            assert_softmax_rows(got, inputs["attention_mask"] if family == "perceiver_io" and got.shape[-1] == 7
                                else None)


@pytest.mark.parametrize("family", FAMILIES)
def test_recording_flags_follow_the_config_and_positional_arguments(family):
    """The config's `output_hidden_states` is the default; flags passed positionally are honoured; without flags nothing
    is recorded; `return_dict=False` gives the same values as a tuple."""
    model = make_model(BASES[family], tiny_config(family))
    ids = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad():
        plain = model(input_ids=ids)
        assert plain.hidden_states is None and plain.attentions is None
        model.config.output_hidden_states = True
        from_config = model(input_ids=ids)
        model.config.output_hidden_states = False
        explicit = model(input_ids=ids, output_hidden_states=True)
        assert len(from_config.hidden_states) == len(explicit.hidden_states)
        assert all(torch.equal(a, b) for a, b in zip(from_config.hidden_states, explicit.hidden_states))
        names = list(inspect.signature(type(model).forward).parameters)[1:]
        positional = [None] * (names.index("output_hidden_states") + 1)
        positional[0], positional[-1] = ids, True
        by_position = model(*positional)
        assert all(torch.equal(a, b) for a, b in zip(by_position.hidden_states, explicit.hidden_states))
        as_tuple = model(input_ids=ids, output_hidden_states=True, return_dict=False)
        assert isinstance(as_tuple, tuple) and len(as_tuple) == len(explicit.to_tuple())


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_recording_under_torch_compile_fullgraph(family):
    """The recording hooks and `record_outputs` trace into one graph (no break) and record what eager does; the
    decoder has a cross-attention that is not used, so its empty `cross_attentions` is dropped inside the graph."""
    torch._dynamo.reset()
    overrides = {"add_cross_attention": True} if family == "decoder" else {}
    model = make_model(BASES[family], tiny_config(family, attn_implementation="eager", **overrides))
    inputs = {"input_ids": torch.randint(0, VOCAB, (2, 6)), "output_hidden_states": True, "output_attentions": True}
    if family == "decoder":
        inputs["use_cache"] = False
    with torch.no_grad():
        eager = model(**inputs)
        compiled = torch.compile(model, fullgraph=True)(**inputs)
    assert list(compiled.keys()) == list(eager.keys())
    for key in ("hidden_states", "attentions", "cross_attentions"):
        if getattr(eager, key, None) is None:
            assert getattr(compiled, key, None) is None
            continue
        assert len(getattr(compiled, key)) == len(getattr(eager, key))
        for got, expected in zip(getattr(compiled, key), getattr(eager, key)):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_attentions_are_the_weights_the_output_is_computed_from(family, implementation):
    """Gradients of attention (attribution, rollout) reach the recorded weights, padded rows and queries that see no
    key included: each recorded tensor is part of the graph of the output."""
    config = tiny_config(family, attn_implementation=implementation)
    model = make_model(BASES[family], config)
    ids = torch.randint(1, VOCAB, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, :2] = 0
    mask[2] = 0
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    weights = [w for w in (out.attentions or ()) + (out.get("cross_attentions") or ())]
    assert weights
    for w in weights:
        w.retain_grad()
    sum(v.sum() for k, v in out.items() if k.endswith(("hidden_state", "pooler_output"))).backward()
    for w in weights:
        assert w.grad is not None
    assert all(torch.equal(w[2], torch.zeros_like(w[2])) for w in out.attentions[:1]) or family == "perceiver_io"


@pytest.mark.parametrize("family", FAMILIES)
def test_output_hidden_states_selects_states_by_index(family):
    """As in transformers: `output_hidden_states` may be an index or a list of indices (negative ones from the end);
    the states selected are those of the full tuple, the others None."""
    model = make_model(BASES[family], tiny_config(family))
    ids = torch.randint(1, VOCAB, (2, 6))
    every = model(input_ids=ids, output_hidden_states=True).hidden_states
    count = len(every)
    selected = model(input_ids=ids, output_hidden_states=[0, -1]).hidden_states
    assert len(selected) == count
    for i, state in enumerate(selected):
        if i in (0, count - 1):
            torch.testing.assert_close(state, every[i])
        else:
            assert state is None
    one = model(input_ids=ids, output_hidden_states=1).hidden_states
    assert [s is not None for s in one] == [i == 1 for i in range(count)]
    with pytest.raises(ValueError, match="`output_hidden_states` must be a bool, or an index"):
        model(input_ids=ids, output_hidden_states="all")

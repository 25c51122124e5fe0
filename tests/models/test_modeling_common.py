"""Mirrors `hf_settransformer/modeling_common.py`: what every family promises through the shared base class
(permutation symmetry, padding independence, output formats, initialisation, dtypes, inputs_embeds)."""

import dataclasses
import math
import pickle

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import (
    ATTENTION_IDS,
    ATTENTIONS,
    FAMILIES,
    MODEL_CLASSES,
    VOCAB,
    adaptive_lm,
    batch_of_tokens,
    family_classes,
    main_output,
    make_model,
    tiny_config,
)
from transformers import AutoModel


import hf_settransformer as hfst

ATOL = 1e-5




@pytest.mark.parametrize("family", FAMILIES)
def test_init_covers_raw_parameters(family):
    """ScaleNorm gains start at sqrt(hidden); inducing points, seeds and latents are drawn, not left as torch.empty."""
    config = tiny_config(family, initializer_range=0.02)
    for cls in family_classes(config).values():
        model = cls(config)
        gains = [m.weight.item() for m in model.modules() if isinstance(m, hfst.ScaleNorm)]
        assert gains and all(g == pytest.approx(math.sqrt(32)) for g in gains), cls.__name__
        for name, p in model.named_parameters():
            assert torch.isfinite(p).all(), name
            if name.endswith(("inducing_points.weight", "seeds.weight", "latents.weight")):
                assert 0.005 < p.std().item() < 0.05, name


def permutation_cases():
    return [
        ("set_transformer", {}),
        ("encoder", {"position_embedding_type": "none"}),
        ("perceiver_io", {"position_embedding_type": "none"}),
    ]


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family,overrides", permutation_cases(), ids=[c[0] for c in permutation_cases()])
def test_permutation_equivariance_and_invariance(family, overrides, attention_type, feature_map):
    config = tiny_config(family, attention_type, feature_map, **overrides)
    classes = family_classes(config)
    from transformers import AutoModel, AutoModelForSequenceClassification

    base = make_model(classes[AutoModel], config)
    head = make_model(classes[AutoModelForSequenceClassification], config)
    ids = batch_of_tokens(2, 7)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    perm = torch.randperm(7)
    out, out_p = base(input_ids=ids, attention_mask=mask), base(input_ids=ids[:, perm], attention_mask=mask[:, perm])
    real = mask.bool()
    # per-element outputs permute with the inputs (compared on real elements)
    assert torch.allclose(
        out.last_hidden_state[:, perm][real[:, perm]], out_p.last_hidden_state[real[:, perm]], atol=ATOL
    )
    # pooled outputs do not change
    logits, logits_p = (
        head(input_ids=ids, attention_mask=mask).logits,
        head(input_ids=ids[:, perm], attention_mask=mask[:, perm]).logits,
    )
    assert torch.allclose(logits, logits_p, atol=ATOL)
    if family == "set_transformer":
        assert torch.allclose(out.pooler_output, out_p.pooler_output, atol=ATOL)
    if family == "perceiver_io":
        assert torch.allclose(out.latent_hidden_state, out_p.latent_hidden_state, atol=ATOL)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_padding_does_not_change_real_outputs(family, attention_type, feature_map):
    from transformers import AutoModel

    config = tiny_config(family, attention_type, feature_map)
    model = make_model(family_classes(config)[AutoModel], config)
    ids = batch_of_tokens(2, 5)
    ref = model(input_ids=ids)
    for pad_values in (torch.zeros(2, 3, dtype=torch.long), torch.randint(0, VOCAB, (2, 3))):
        padded = torch.cat([ids, pad_values], dim=1)
        mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 3)], dim=1).long()
        out = model(input_ids=padded, attention_mask=mask)
        assert torch.allclose(out.last_hidden_state[:, :5], ref.last_hidden_state, atol=ATOL)
        if family == "set_transformer":
            assert torch.allclose(out.pooler_output, ref.pooler_output, atol=ATOL)
        if family == "perceiver_io":
            assert torch.allclose(out.latent_hidden_state, ref.latent_hidden_state, atol=ATOL)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_left_padding_does_not_change_real_outputs(family, attention_type, feature_map):
    """Positions are counted from the first real token, so left padding is invisible too."""
    from transformers import AutoModel

    config = tiny_config(family, attention_type, feature_map)
    model = make_model(family_classes(config)[AutoModel], config)
    ids = batch_of_tokens(2, 5)
    ref = model(input_ids=ids).last_hidden_state
    padded = torch.cat([torch.randint(0, VOCAB, (2, 3)), ids], dim=1)
    mask = torch.cat([torch.zeros(2, 3), torch.ones(2, 5)], dim=1).long()
    out = model(input_ids=padded, attention_mask=mask).last_hidden_state
    assert torch.allclose(out[:, 3:], ref, atol=ATOL)


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_attentions_and_tuples(family, attention_type):
    from transformers import AutoModel

    config = tiny_config(family, attention_type)
    model = make_model(family_classes(config)[AutoModel], config)
    ids = batch_of_tokens(2, 6)
    out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    assert out.hidden_states is not None and len(out.hidden_states) >= 2
    assert all(h.shape[0] == 2 and h.shape[-1] == 32 for h in out.hidden_states)
    if attention_type == "softmax":
        assert out.attentions and all(w.dim() == 4 for w in out.attentions)
        assert all(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5) for w in out.attentions)
    else:
        assert out.attentions is None  # linear attention has no weights: None, not zeros
    as_tuple = model(input_ids=ids, return_dict=False)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(input_ids=ids).last_hidden_state)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_models_stay_finite_and_in_dtype(family, attention_type, feature_map):
    config = tiny_config(family, attention_type, feature_map)
    ids = batch_of_tokens(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    for cls in family_classes(config).values():
        model = make_model(cls, config).to(torch.bfloat16)
        out = main_output(model(input_ids=ids, attention_mask=mask))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all(), cls.__name__




@pytest.mark.parametrize("family", FAMILIES)
def test_adaptive_input_embeds_each_cluster_at_its_width(family):
    """Adaptive input (Baevski & Auli 2019): cluster i's ids are looked up in a table of width hidden // 4**i and
    projected to hidden; `.weight` is the equivalent dense matrix; inputs_embeds from it reproduce input_ids; far
    fewer parameters than a full embedding; at initialisation every cluster's vectors have the same scale."""
    from hf_settransformer.layers import AdaptiveEmbedding

    config = tiny_config(family, adaptive_input_cutoffs=[4, 16])
    assert not config.tie_word_embeddings
    model = make_model(family_classes(config)[AutoModel], config)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, AdaptiveEmbedding) and embedding.widths == [32, 8, 2]
    assert sum(p.numel() for p in embedding.parameters()) == 4 * 32 + 12 * 8 + 8 * 32 + 21 * 2 + 2 * 32
    ids = torch.tensor([[0, 3, 4, 15, 16, VOCAB - 1]])
    with torch.no_grad():
        vectors = embedding(ids)[0]
        tables = [e.weight for e in embedding.embeddings]
        by_hand = [tables[0][0], tables[0][3], embedding.projections[1](tables[1][0]),
                   embedding.projections[1](tables[1][11]), embedding.projections[2](tables[2][0]),
                   embedding.projections[2](tables[2][VOCAB - 17])]
        assert torch.allclose(vectors, torch.stack(by_hand) * embedding.scale, atol=1e-6)
        assert torch.allclose(embedding.weight[ids] * embedding.scale, embedding(ids), atol=1e-6)
        assert embedding.weight.shape == (VOCAB, 32)
        scales = [embedding(torch.arange(lo, hi)[None]).std().item() for lo, hi in ((0, 4), (4, 16), (16, VOCAB))]
        assert max(scales) < 3 * min(scales), scales  # projections init at fan-in std: rare tokens are not ~0
        batch = batch_of_tokens(2, 8)
        assert torch.allclose(
            main_output(model(input_ids=batch)), main_output(model(inputs_embeds=embedding(batch))), atol=ATOL
        )


def test_adaptive_input_gradients_reach_only_the_clusters_used():
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", adaptive_input_cutoffs=[4, 16]))
    ids = torch.tensor([[5, 6, 7, 9, 6]])  # cluster 1 only (the last token is no input to any prediction)
    model(input_ids=ids, labels=ids).loss.backward()
    embedding = model.get_input_embeddings()
    grads = [e.weight.grad for e in embedding.embeddings]
    assert grads[0] is None or not grads[0].any()
    assert grads[2] is None or not grads[2].any()
    assert grads[1][[1, 2, 3, 5]].abs().sum(-1).gt(0).all() and not grads[1][[0, 4, 6]].any()
    assert embedding.projections[1].weight.grad.any()


def test_adaptive_layers_refuse_resizing_and_bad_cutoffs():
    model = adaptive_lm("decoder", adaptive_input=True)
    with pytest.raises(ValueError, match="Cannot resize the vocabulary .* `adaptive_input_cutoffs` and "
                       "`adaptive_softmax_cutoffs`"):
        model.resize_token_embeddings(VOCAB + 5)
    with pytest.raises(ValueError, match="from 37 to 40"):
        adaptive_lm("decoder").resize_token_embeddings(pad_to_multiple_of=8)  # adaptive softmax alone refuses too
    model.resize_token_embeddings(VOCAB)  # the same size: nothing to do, allowed
    with pytest.raises(StrictDataclassError, match="(?s)'adaptive_input_cutoffs'.* increasing positive integers"):
        tiny_config("decoder", adaptive_input_cutoffs=[4, 4])
    for bad in (4, "4,16", [4.0], (4, 16)):  # a list of ints, as config.json holds it
        with pytest.raises(StrictDataclassError, match="(?s)'adaptive_input_cutoffs'.*list"):
            tiny_config("decoder", adaptive_input_cutoffs=bad)
    with pytest.raises(StrictDataclassError, match="`adaptive_input_cutoffs` must end below `vocab_size`"):
        tiny_config("decoder", adaptive_input_cutoffs=[VOCAB])
    with pytest.raises(StrictDataclassError, match="(?s)'adaptive_input_div_value'.*greater or equal to 1.0"):
        tiny_config("decoder", adaptive_input_cutoffs=[4], adaptive_input_div_value=0.5)
    with pytest.raises(StrictDataclassError, match="cannot hold with `adaptive_input_cutoffs`"):
        tiny_config("decoder", adaptive_input_cutoffs=[4], tie_word_embeddings=True)


TOKEN_MODELS = [(f, c) for f, c in MODEL_CLASSES if c is not hfst.SetTransformerForMixtureOfGaussians]  # points only


@pytest.mark.parametrize("family,cls", TOKEN_MODELS, ids=[c.__name__ for _, c in TOKEN_MODELS])
@pytest.mark.parametrize(
    "attention_type,feature_map", [("softmax", "elu"), ("linear", "exp")], ids=["softmax", "linear"]
)
def test_inputs_embeds_reproduce_input_ids(family, cls, attention_type, feature_map):
    config = tiny_config(family, attention_type, feature_map)
    model = make_model(cls, config)
    ids = batch_of_tokens(2, 8)
    from_ids = main_output(model(input_ids=ids))
    from_embeds = main_output(model(inputs_embeds=model.get_input_embeddings()(ids)))
    assert torch.allclose(from_ids, from_embeds, atol=ATOL)


@pytest.mark.parametrize("family,cls", TOKEN_MODELS, ids=[c.__name__ for _, c in TOKEN_MODELS])
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_models_pickle_and_torch_save_whole(family, cls, attention_type, feature_map, tmp_path):
    """`pickle` and `torch.save(model)` store the whole model, as Llama's (multiprocessing and deep copies need it);
    the kernel registry's entries held lambdas, which pickle refused."""
    model = make_model(cls, tiny_config(family, attention_type, feature_map)).eval()
    ids = batch_of_tokens(2, 6)
    expected = main_output(model(input_ids=ids))
    torch.save(model, tmp_path / "model.pt")
    for copy in (pickle.loads(pickle.dumps(model)), torch.load(tmp_path / "model.pt", weights_only=False)):
        assert type(copy) is cls
        assert torch.equal(main_output(copy(input_ids=ids)), expected)


def test_a_registered_kernel_pickles_by_name():
    """A kernel registered with lambdas pickles (by its name); unpickled where it is not registered, the message says
    to register it first."""
    linear = hfst.ATTENTION_KERNELS["linear"]
    hfst.register_attention_kernel("linear_copy", dataclasses.replace(linear, layer_options=lambda c: {"feature_map": "exp"}))
    try:
        model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", "linear_copy")).eval()
        ids = batch_of_tokens(1, 5)
        data = pickle.dumps(model)
        assert torch.equal(pickle.loads(data)(input_ids=ids).logits, model(input_ids=ids).logits)
    finally:
        del hfst.ATTENTION_KERNELS["linear_copy"]
    with pytest.raises(ValueError, match=r"attention_type='linear_copy'.*register_attention_kernel\('linear_copy'"):
        pickle.loads(data)


def test_main_input_name_follows_the_inputs(tmp_path):
    from transformers import AutoModel

    features = make_model(hfst.SetTransformerModel, tiny_config("set_transformer", vocab_size=None, input_size=3))
    assert features.main_input_name == "input_features"
    features.save_pretrained(tmp_path)
    assert AutoModel.from_pretrained(tmp_path, trust_remote_code=True).main_input_name == "input_features"
    tokens = make_model(hfst.SetTransformerModel, tiny_config("set_transformer"))
    assert tokens.main_input_name == "input_ids"


@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=[c.__name__ for _, c in MODEL_CLASSES])
def test_return_dict_false_gives_the_output_as_a_tuple(family, cls):
    """`return_dict=False`, passed or set in the config, gives `to_tuple()` of the output (transformers'
    `can_return_tuple`); the heads still read their base model's output by name."""
    config = tiny_config(family)
    model = make_model(cls, config)
    ids = batch_of_tokens(2, 6)
    expected = model(input_ids=ids).to_tuple()
    for got in (model(input_ids=ids, return_dict=False), None):
        if got is None:
            model.config.return_dict = False
            got = model(input_ids=ids)
        assert isinstance(got, tuple) and len(got) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(got, expected) if torch.is_tensor(a))


def test_continuous_inputs_expose_the_feature_projection():
    """With `input_features` the feature projection is the input embedding (`get_input_embeddings()` used to return
    None): `enable_input_require_grads` hooks it, so a frozen model's outputs still carry gradients (adapters with
    gradient checkpointing), and `inputs_embeds` made with it reproduce `input_features`."""
    config = tiny_config("set_transformer", vocab_size=None, input_size=3)
    for cls in (hfst.SetTransformerModel, hfst.SetTransformerForSequenceClassification):
        model = make_model(cls, config)
        projection = model.get_input_embeddings()
        assert projection is model.base_model.embeddings.feature_projection
        features = torch.randn(2, 5, 3)
        expected = main_output(model(input_features=features))
        assert torch.allclose(main_output(model(inputs_embeds=projection(features))), expected, atol=ATOL)
        model.requires_grad_(False)
        model.enable_input_require_grads()
        assert main_output(model(input_features=features)).requires_grad
        replacement = torch.nn.Linear(3, config.hidden_size)
        model.set_input_embeddings(replacement)
        assert model.get_input_embeddings() is replacement

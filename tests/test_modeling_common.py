"""Mirrors `hf_settransformer/modeling_common.py`: what every family and head promises through the shared machinery
(permutation symmetry, padding independence, output formats, initialisation, LM/next-token/many-target heads, the
adaptive softmax, clear errors on bad input)."""

import math

import pytest
import torch
from conftest import (
    ATTENTION_IDS,
    ATTENTIONS,
    FAMILIES,
    MODEL_CLASSES,
    VOCAB,
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


@pytest.mark.parametrize("pooling", ["pma", "mean"])
@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_sequence_classification_pooling(family, pooling):
    from transformers import AutoModelForSequenceClassification

    config = tiny_config(family, pooling=pooling)
    model = make_model(family_classes(config)[AutoModelForSequenceClassification], config)
    out = model(input_ids=batch_of_tokens(4, 6), labels=torch.tensor([0, 1, 2, 1]))
    assert out.logits.shape == (4, 3) and out.loss.ndim == 0
    assert model.config.problem_type == "single_label_classification"


@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_next_token_head_contract_window_mode(family):
    """The design document's literal head (`next_token_mode="window"`): one prediction per window."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family, context_length=4, next_token_mode="window")
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    ids = batch_of_tokens(3, 9)
    labels = torch.tensor([1, 2, -100])
    out = model(input_ids=ids, labels=labels)
    assert out.logits.shape == (3, 1, VOCAB)
    expected = torch.nn.functional.cross_entropy(out.logits[:2, 0], labels[:2])
    assert torch.allclose(out.loss, expected, atol=1e-6)
    # only the last context_length tokens matter
    earlier = ids.clone()
    earlier[:, :5] = (earlier[:, :5] + 1) % VOCAB
    assert torch.allclose(model(input_ids=earlier).logits, out.logits, atol=ATOL)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied
    with pytest.raises(ValueError, match=r"shape \(batch,\)"):
        model(input_ids=ids, labels=ids[:, :4])
    # causal-LM labels (run_clm.py): the last token of each row is predicted from the ones before it
    causal = model(input_ids=ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(model(input_ids=ids[:, :-1]).logits[:, 0], ids[:, -1])
    assert torch.allclose(causal.loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"`prefix_length` applies to next_token_mode='many'"):
        model(input_ids=ids, prefix_length=2)  # the many-target head's argument: meaningless for one target


def test_bad_inputs_raise_clear_errors():
    encoder = make_model(hfst.TransformerEncoderModel, tiny_config("encoder"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        encoder(input_ids=torch.tensor([[1, 2, VOCAB]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        encoder(input_ids=torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="attention_mask"):
        encoder(input_ids=batch_of_tokens(2, 6), attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="exactly one"):
        encoder()
    with pytest.raises(ValueError, match="input_features"):
        encoder(input_ids=torch.randn(2, 6, 3))
    with pytest.raises(ValueError, match="no continuous features"):
        encoder(input_features=torch.randn(2, 6, 3))

    learned = make_model(
        hfst.TransformerDecoderModel,
        tiny_config("decoder", position_embedding_type="learned", max_position_embeddings=8),
    )
    learned(input_ids=batch_of_tokens(1, 8))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        learned(input_ids=batch_of_tokens(1, 9))

    sets = make_model(hfst.SetTransformerModel, tiny_config("set_transformer", vocab_size=None, input_size=3))
    with pytest.raises(ValueError, match="input_size=3"):
        sets(input_features=torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="no token embedding"):
        sets(input_ids=batch_of_tokens())
    with pytest.raises(ValueError, match="inputs_embeds"):
        sets(inputs_embeds=torch.randn(2, 5, 31))

    decoder = make_model(hfst.TransformerDecoderModel, tiny_config("decoder"))
    with pytest.raises(ValueError, match="add_cross_attention"):
        decoder(input_ids=batch_of_tokens(), encoder_hidden_states=torch.randn(2, 4, 32))


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


HEAD_FAMILIES = ["encoder", "set_transformer", "perceiver_io"]


def many_target_head(family, attention_type="softmax", feature_map="elu", **overrides):
    from transformers import AutoModelForCausalLM

    fields = dict(context_length=12, target_length=6, **overrides)
    if family == "perceiver_io":
        fields.setdefault("num_latents", fields["target_length"])
    config = tiny_config(family, attention_type, feature_map, **fields)
    return make_model(family_classes(config)[AutoModelForCausalLM], config)


@pytest.mark.parametrize("family", HEAD_FAMILIES)
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_many_target_head_sees_no_future(family, attention_type, feature_map):
    """Each target's prediction depends on the tokens up to it only: the loss at t is unchanged when later tokens
    change, and it equals what the head computes for a window that ends at t (same prefix)."""
    model = many_target_head(family, attention_type, feature_map)
    ids = batch_of_tokens(3, 12)
    mask = torch.ones_like(ids)
    mask[2, :3] = 0  # a left-padded row
    out = model(input_ids=ids, attention_mask=mask)
    assert out.logits.shape == (3, 12, VOCAB)
    assert torch.count_nonzero(out.logits[:, :6]) == 0  # the prefix predicts nothing
    for t in range(6, 12):
        alone = model(input_ids=ids[:, : t + 1], attention_mask=mask[:, : t + 1], prefix_length=6).logits[:, -1]
        assert torch.allclose(alone, out.logits[:, t], atol=ATOL), t
        later = ids.clone()
        later[:, t + 1 :] = (later[:, t + 1 :] + 5) % VOCAB
        changed = model(input_ids=later, attention_mask=mask).logits
        assert torch.allclose(changed[:, : t + 1], out.logits[:, : t + 1], atol=ATOL), t
    # per-position loss: labels = input_ids, shifted inside; targets are the tokens after each target position
    labels = ids.clone()
    labels[0, 9] = -100
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    logits, targets = out.logits[:, 6:11], labels[:, 7:12]
    keep = targets != -100
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits[keep], targets[keep]), atol=1e-6)


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_many_target_head_padding_values_do_not_matter(family):
    model = many_target_head(family, "linear", "exp")
    ids = batch_of_tokens(2, 12)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    other = ids.clone()
    other[1, :4] = (other[1, :4] + 7) % VOCAB
    a = model(input_ids=ids, attention_mask=mask).logits
    b = model(input_ids=other, attention_mask=mask).logits
    assert torch.allclose(a, b, atol=ATOL)


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_many_target_head_training_loss_equals_evaluation_loss(family):
    """Training computes the loss from the target states without full logits; it equals the evaluation loss."""
    model = many_target_head(family, "linear", "elu")
    ids = batch_of_tokens(2, 12)
    evaluation = model(input_ids=ids, labels=ids).loss
    model.train()
    training = model(input_ids=ids, labels=ids)
    assert training.logits is None and torch.allclose(training.loss, evaluation, atol=1e-6)


def test_many_target_head_rejects_bad_labels_and_prefixes():
    model = many_target_head("encoder")
    ids = batch_of_tokens(2, 12)
    with pytest.raises(ValueError, match=r"causal-LM labels shaped like the inputs"):
        model(input_ids=ids, labels=ids[:, 0])
    with pytest.raises(ValueError, match=r"`prefix_length` must be an integer in \[0, 12\)"):
        model(input_ids=ids, prefix_length=12)
    with pytest.raises(ValueError, match="num_latents"):
        many_target_head("perceiver_io", num_latents=3)(input_ids=ids)
    with pytest.raises(ValueError, match="target_length"):
        tiny_config("encoder", context_length=4, target_length=5)


def adaptive_lm(family, attention_type="softmax", feature_map="elu", adaptive_input=False):
    from transformers import AutoModelForCausalLM

    extra = {} if family == "decoder" else dict(context_length=8, target_length=4)
    if family == "perceiver_io":
        extra["num_latents"] = 4
    if adaptive_input:
        extra["adaptive_input_cutoffs"] = [4, 16]
    config = tiny_config(family, attention_type, feature_map, adaptive_softmax_cutoffs=[4, 16], **extra)
    return make_model(family_classes(config)[AutoModelForCausalLM], config)


@pytest.mark.parametrize("family", ["decoder", *HEAD_FAMILIES])
def test_adaptive_softmax_gives_log_probabilities(family):
    model = adaptive_lm(family, "linear", "exp")
    assert isinstance(model.lm_head, torch.nn.AdaptiveLogSoftmaxWithLoss) and not model.config.tie_word_embeddings
    ids = batch_of_tokens(2, 8)
    out = model(input_ids=ids, labels=ids)
    predicted = out.logits[:, -4:]
    assert torch.allclose(predicted.exp().sum(-1), torch.ones(2, 4), atol=1e-5)  # a distribution over the vocabulary
    targets = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:]
    scored = slice(None) if family == "decoder" else slice(-4, None)
    logits, targets = out.logits[:, scored].reshape(-1, VOCAB), targets[:, scored].reshape(-1)
    keep = targets != -100
    expected = -logits[keep].gather(1, targets[keep, None]).mean()
    assert torch.allclose(out.loss, expected, atol=1e-5)
    model.train()
    assert torch.allclose(model(input_ids=ids, labels=ids).loss, out.loss, atol=1e-5)  # training path: no logits


@pytest.mark.parametrize("family", ["encoder", "perceiver_io"])
def test_adaptive_softmax_masked_lm_head(family):
    """A masked-LM head with an adaptive output layer: evaluation logits are log-probabilities, the loss is the mean
    NLL of the labelled positions, and a training forward computes the same loss without logits."""
    from transformers import AutoModelForMaskedLM

    config = tiny_config(family, "linear", "elu", adaptive_softmax_cutoffs=[4, 16])
    model = make_model(family_classes(config)[AutoModelForMaskedLM], config)
    ids = batch_of_tokens(2, 8)
    labels = torch.full_like(ids, -100)
    labels[:, [1, 5]] = ids[:, [1, 5]]
    out = model(input_ids=ids, labels=labels)
    assert torch.allclose(out.logits.exp().sum(-1), torch.ones(2, 8), atol=1e-5)
    expected = -out.logits[:, [1, 5]].gather(-1, ids[:, [1, 5], None]).mean()
    assert torch.allclose(out.loss, expected, atol=1e-5)
    model.train()
    trained = model(input_ids=ids, labels=labels)
    assert trained.logits is None and torch.allclose(trained.loss, out.loss, atol=1e-5)


@pytest.mark.parametrize("adaptive_input", [False, True], ids=["embedding", "adaptive_input"])
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_adaptive_softmax_cached_generate_equals_argmax_over_full_passes(attention_type, feature_map, adaptive_input):
    model = adaptive_lm("decoder", attention_type, feature_map, adaptive_input)
    prompt = torch.randint(1, VOCAB, (2, 5))  # no pad id (0) in the prompt
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = prompt
    with torch.no_grad():
        for _ in range(8):
            expected = torch.cat([expected, model(input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, expected)


def test_adaptive_softmax_rejects_bad_cutoffs():
    with pytest.raises(ValueError, match="increasing positive integers"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[10, 5])
    with pytest.raises(ValueError, match="must end below `vocab_size`"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[4, VOCAB])
    with pytest.raises(ValueError, match="cannot hold with `adaptive_softmax_cutoffs`"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[4], tie_word_embeddings=True)


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
    for bad in ([4, 4], 4, "4,16", [4.0]):
        with pytest.raises(ValueError, match="`adaptive_input_cutoffs` must be a list of increasing positive integers"):
            tiny_config("decoder", adaptive_input_cutoffs=bad)
    assert tiny_config("decoder", adaptive_input_cutoffs=(4, 16)).adaptive_input_cutoffs == [4, 16]
    with pytest.raises(ValueError, match="`adaptive_input_cutoffs` must end below `vocab_size`"):
        tiny_config("decoder", adaptive_input_cutoffs=[VOCAB])
    with pytest.raises(ValueError, match="`adaptive_input_div_value` must be a finite number >= 1"):
        tiny_config("decoder", adaptive_input_cutoffs=[4], adaptive_input_div_value=0.5)
    with pytest.raises(ValueError, match="cannot hold with `adaptive_input_cutoffs`"):
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


@pytest.mark.parametrize("family", HEAD_FAMILIES)
@pytest.mark.parametrize("mode", ["many", "window"])
def test_next_token_heads_take_shift_labels(family, mode):
    """`shift_labels` (targets already aligned with the positions, as the Trainer passes them under sequence/context
    parallelism) replace `labels`; they used to reach the base model's `**kwargs` and be dropped silently."""
    model = many_target_head(family, next_token_mode=mode)
    ids = batch_of_tokens(2, 10)
    shift_labels = torch.randint(0, VOCAB, (2, 10))
    loss = model(input_ids=ids, shift_labels=shift_labels).loss
    assert loss is not None
    assert torch.equal(model(input_ids=ids, labels=torch.zeros_like(ids), shift_labels=shift_labels).loss, loss)
    if mode == "many":  # causal-LM labels, which the head shifts itself, give the same loss as their shifted version
        labels = torch.randint(0, VOCAB, (2, 10))
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        assert torch.allclose(model(input_ids=ids, shift_labels=shifted).loss, model(input_ids=ids, labels=labels).loss)
    else:  # one target per window: the token after it
        assert torch.allclose(model(input_ids=ids, labels=shift_labels[:, -1]).loss, loss)
    assert not torch.equal(model(input_ids=ids, shift_labels=torch.roll(shift_labels, 1, dims=1)).loss, loss)


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


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_the_outermost_call_checks_once_and_drops_a_mask_of_ones(family, monkeypatch):
    """A head's forward is checked once: its base model's call inside it is not checked again. The base model gets
    None for a mask of ones (the kernels' unmasked paths) and a mask with padding as given; its outputs are
    transformers' (no extra fields)."""
    from hf_settransformer import checks

    model = many_target_head(family)
    checked, seen = [], []
    check_forward = checks.check_forward
    monkeypatch.setattr(checks, "check_forward", lambda m, inputs: checked.append(m) or check_forward(m, inputs))
    model.model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["attention_mask"]),
                                          with_kwargs=True)
    ids = batch_of_tokens(2, 12)
    mask = torch.ones_like(ids)
    model(input_ids=ids, attention_mask=mask)
    assert checked == [model] and seen == [None]
    mask[1, :2] = 0
    model(input_ids=ids, attention_mask=mask)
    assert checked == [model, model] and torch.equal(seen[-1], mask[:, -model.config.context_length:])
    base_output = model.model(input_ids=ids, attention_mask=mask)
    assert checked[-1] is model.model and "key_mask" not in base_output.keys()


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_next_token_class_runs_the_head_its_mode_names(family):
    """`...ForNextTokenPrediction` runs the many-target or the one-target forward as `config.next_token_mode` said
    at construction, and declares that objective; both modes have the same parameters."""
    model = many_target_head(family)
    ids = batch_of_tokens(2, 12)
    assert model.objective == "many_target_windows" and model(input_ids=ids).logits.shape == (2, 12, VOCAB)
    names = [name for name, _ in model.named_parameters()]
    window = many_target_head(family, next_token_mode="window")
    assert window.objective == "one_target_window" and window(input_ids=ids).logits.shape == (2, 1, VOCAB)
    assert [name for name, _ in window.named_parameters()] == names
    model.config.next_token_mode = "window"  # after construction: the model keeps its mode
    assert model.objective == "many_target_windows" and model(input_ids=ids).logits.shape == (2, 12, VOCAB)

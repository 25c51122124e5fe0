"""Mirrors `hf_settransformer/heads.py`: the pooled classification head, the next-token head in both modes (the
many-target head sees no future; shift_labels; the mode chosen at construction) and the adaptive softmax output."""


import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import (
    ATTENTION_IDS,
    ATTENTIONS,
    HEAD_FAMILIES,
    VOCAB,
    adaptive_lm,
    batch_of_tokens,
    family_classes,
    make_model,
    many_target_head,
    tiny_config,
)


ATOL = 1e-5


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
def test_many_target_head_reads_a_left_padded_row_as_alone(family):
    """Rows shorter than the window, some shorter than `target_length` (Perceiver AR counts its latents from each
    row's first real target), get the logits they get alone."""
    model = many_target_head(family, "linear", "elu")
    lengths = (12, 9, 4, 1)
    rows = [batch_of_tokens(1, n) for n in lengths]
    ids = torch.stack([torch.cat([r.new_zeros(12 - r.shape[1]), r[0]]) for r in rows])
    mask = torch.stack([torch.arange(12) >= 12 - n for n in lengths]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        for i, (row, n) in enumerate(zip(rows, lengths)):
            torch.testing.assert_close(logits[i, 12 - n:], model(input_ids=row).logits[0], atol=ATOL, rtol=ATOL)


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
    with pytest.raises(StrictDataclassError, match="target_length"):
        tiny_config("encoder", context_length=4, target_length=5)


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
    with pytest.raises(StrictDataclassError, match="increasing positive integers"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[10, 5])
    with pytest.raises(StrictDataclassError, match="must end below `vocab_size`"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[4, VOCAB])
    with pytest.raises(StrictDataclassError, match="cannot hold with `adaptive_softmax_cutoffs`"):
        tiny_config("decoder", adaptive_softmax_cutoffs=[4], tie_word_embeddings=True)


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


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_next_token_class_runs_the_head_its_mode_names(family, tmp_path):
    """`...ForNextTokenPrediction` runs the many-target or the one-target forward as `config.next_token_mode` said
    at construction, and declares that objective; both modes have the same parameters. A mode set after construction
    is refused at the forward and at save."""
    model = many_target_head(family)
    ids = batch_of_tokens(2, 12)
    assert model.objective == "many_target_windows" and model(input_ids=ids).logits.shape == (2, 12, VOCAB)
    names = [name for name, _ in model.named_parameters()]
    window = many_target_head(family, next_token_mode="window")
    assert window.objective == "one_target_window" and window(input_ids=ids).logits.shape == (2, 1, VOCAB)
    assert [name for name, _ in window.named_parameters()] == names
    model.config.next_token_mode = "window"  # after construction: refused, not run in the mode it was built in
    assert model.objective == "many_target_windows"
    for use in (lambda: model(input_ids=ids), lambda: model.save_pretrained(tmp_path)):
        with pytest.raises(ValueError, match="built with next_token_mode='many'"):
            use()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_next_token_head_has_one_public_forward_and_it_is_checked(family):
    """The per-mode forwards are private: called directly, they would run without the checks of `forward`."""
    cls = type(many_target_head(family))
    assert [name for name in dir(cls) if name.startswith("forward")] == ["forward"]
    assert getattr(cls.forward, "__wrapped__", None) is not None  # checks.checked

"""Mirrors `hf_settransformer/checks.py`: bad inputs, labels, keywords, caches and generate() arguments are refused
with an error naming the input and the fix, once per forward by the outermost model call; legal input (NaN padding,
float64 features, unknown keywords far from every input) gives the result transformers' models would."""

import pytest
import torch
from tests.helpers import (
    ATTENTIONS,
    HEAD_FAMILIES,
    MODEL_CLASSES,
    VOCAB,
    batch_of_tokens,
    family_classes,
    main_output,
    make_model,
    many_target_head,
    tiny_config,
)

import hf_settransformer as hfst

CONFIGS = {
    "encoder": hfst.TransformerEncoderConfig,
    "decoder": hfst.TransformerDecoderConfig,
    "set_transformer": hfst.SetTransformerConfig,
    "perceiver_io": hfst.PerceiverIOConfig,
}


INPUT_CASES = [  # (model kwargs, words of the error); decoder and encoder, softmax and linear
    ({"input_ids": torch.ones(2, 5, dtype=torch.uint8)}, ["input_ids", "torch.long", "uint8"]),
    ({"input_ids": torch.ones(2, 5, dtype=torch.bool)}, ["input_ids", "torch.long", "bool"]),
    ({"input_ids": torch.ones(5, dtype=torch.long)}, ["input_ids", "(batch, length)", "(5,)"]),
    ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, ["input_ids", "length 0"]),
    ({"inputs_embeds": torch.ones(2, 5, 32, dtype=torch.long)}, ["inputs_embeds", "floating-point", "int64"]),
    ({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.full((2, 5), 0.5)},
     ["attention_mask", "only 0 (padding) and 1", "0.5"]),
    ({"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.full((2, 5), float("nan"))},
     ["attention_mask", "only 0 (padding) and 1"]),
]


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("family", ["decoder", "encoder"])
@pytest.mark.parametrize("kwargs,words", INPUT_CASES, ids=[str(i) for i in range(len(INPUT_CASES))])
def test_bad_inputs_are_refused_naming_the_input(family, attention_type, kwargs, words):
    from tests.helpers import make_model, tiny_config

    config = tiny_config(family, attention_type)
    model = make_model(family_classes(config)[next(iter(family_classes(config)))], config)
    with pytest.raises(ValueError) as err:
        model(**kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_negative_learned_positions_are_refused():
    from tests.helpers import make_model, tiny_config

    model = make_model(hfst.TransformerDecoderModel, tiny_config("decoder", position_embedding_type="learned"))
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="`position_ids` must be non-negative, got values down to -1"):
        model(input_ids=ids, position_ids=torch.tensor([[-1, 0, 1, 2]]))


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=["softmax", "linear-elu", "linear-exp"])
def test_a_cache_of_another_batch_size_is_refused_naming_both(attention_type, feature_map):
    from tests.helpers import decoder

    model = decoder(attention_type, feature_map)
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, 37, (2, 5)), use_cache=True).past_key_values
        with pytest.raises(ValueError, match="a batch of 2, but the inputs are a batch of 1"):
            model(input_ids=torch.randint(1, 37, (1, 1)), past_key_values=cache)


@pytest.mark.parametrize("cls,family", [("TransformerDecoderForCausalLM", "decoder"),
                                        ("TransformerEncoderForMaskedLM", "encoder")])
def test_labels_of_another_shape_are_refused_naming_both_shapes(cls, family):
    from tests.helpers import make_model, tiny_config

    model = make_model(getattr(hfst, cls), tiny_config(family))
    ids = torch.randint(1, 37, (2, 6))
    with pytest.raises(ValueError, match=r"`labels` must have the inputs' shape \(2, 6\).*got \(2, 3\)"):
        model(input_ids=ids, labels=ids[:, :3])


@pytest.mark.parametrize("family,cls", [("decoder", "TransformerDecoderForCausalLM"),
                                        ("encoder", "TransformerEncoderForMaskedLM"),
                                        ("perceiver_io", "PerceiverIOForMaskedLM"),
                                        ("encoder", "TransformerEncoderForNextTokenPrediction"),
                                        ("set_transformer", "SetTransformerForNextTokenPrediction")])
def test_a_loss_over_zero_targets_is_zero_with_a_zero_gradient(family, cls):
    from tests.helpers import make_model, tiny_config

    model = make_model(getattr(hfst, cls), tiny_config(family)).train()
    ids = torch.randint(1, 37, (2, 8))
    loss = model(input_ids=ids, labels=torch.full_like(ids, -100)).loss
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())



FAMILIES = list(CONFIGS)


def tiny(family, attention_type="softmax", feature_map="elu", **kwargs):
    extra = {"num_blocks": 1, "num_self_attends_per_block": 2, "num_latents": 4} if family == "perceiver_io" else {}
    return CONFIGS[family](
        vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32, attention_type=attention_type,
        feature_map=feature_map, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        **({"num_hidden_layers": 2} if family != "perceiver_io" else {}), **extra, **kwargs,
    )


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=["softmax", "linear-elu", "linear-exp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_nan_and_inf_padding_values_do_not_matter(family, attention_type, feature_map):
    """Padded vectors holding NaN or +-inf leave every real output (and the pooled ones) as zero padding does: the
    padding is zeroed by selection before any sum could carry it."""
    torch.manual_seed(0)
    config = tiny(family, attention_type, feature_map)
    model = family_classes(config)[__import__("transformers").AutoModel](config).eval()
    real = torch.randn(2, 5, config.hidden_size)
    mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 3)], dim=1).long()
    mask[1, 3:5] = 0  # padding between real elements too
    outputs = []
    for value in (0.0, float("nan"), float("inf"), -float("inf")):
        padded = torch.cat([real, torch.zeros(2, 3, config.hidden_size)], dim=1)
        padded[~mask.bool()] = value
        outputs.append(model(inputs_embeds=padded, attention_mask=mask))
    for out in outputs:
        for name in ("last_hidden_state", "pooler_output", "latent_hidden_state"):
            if out.get(name) is None:
                continue
            a, b = outputs[0][name], out[name]
            if name == "last_hidden_state" and a.shape[1] == 8:
                a, b = a[mask.bool()], b[mask.bool()]
            assert torch.isfinite(b).all(), name
            assert torch.allclose(a, b, atol=1e-5), name


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=["softmax", "linear-elu", "linear-exp"])
def test_nan_padding_in_continuous_set_features_does_not_matter(attention_type, feature_map):
    torch.manual_seed(0)
    config = tiny("set_transformer", attention_type, feature_map, input_size=2, num_seeds=3, num_labels=2)
    model = hfst.SetTransformerForSequenceClassification(config).eval()
    x = torch.randn(3, 4, 2)
    ref = model(input_features=x).logits
    mask = torch.cat([torch.ones(3, 4), torch.zeros(3, 2)], dim=1)
    for value in (float("nan"), float("inf")):
        padded = torch.cat([x, torch.full((3, 2, 2), value)], dim=1)
        assert torch.allclose(model(input_features=padded, attention_mask=mask).logits, ref, atol=1e-5)


@pytest.mark.parametrize("name", ["inputs_embeds", "input_features"])
def test_float64_inputs_are_cast_to_the_model_dtype(name):
    torch.manual_seed(0)
    config = tiny("encoder", input_size=16 if name == "input_features" else None)
    model = hfst.TransformerEncoderModel(config).eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    out = model(**{name: x}).last_hidden_state
    assert out.dtype == torch.float32
    assert torch.allclose(out, model(**{name: x.float()}).last_hidden_state, atol=1e-6)


GENERATE_CASES = [({"num_beams": 0}, "`num_beams` must be a positive integer, got 0"),
                  ({"num_beams": -2}, "`num_beams` must be a positive integer, got -2"),
                  ({"num_return_sequences": 0}, "`num_return_sequences` must be a positive integer, got 0"),
                  # out of range, transformers turns the logits processor off without a word
                  ({"do_sample": True, "top_p": 1.5}, r"`top_p` must be in \[0, 1\].*got 1.5"),
                  ({"do_sample": True, "top_p": float("nan")}, r"`top_p` must be in \[0, 1\].*got nan"),
                  ({"do_sample": True, "typical_p": 1.5}, r"`typical_p` must be in \(0, 1\].*got 1.5"),
                  ({"do_sample": True, "epsilon_cutoff": 2.0}, r"`epsilon_cutoff` must be in \[0, 1\).*got 2.0"),
                  ({"do_sample": True, "eta_cutoff": 1.0}, r"`eta_cutoff` must be in \[0, 1\).*got 1.0"),
                  ({"min_new_tokens": -1}, "`min_new_tokens` must be a non-negative integer, got -1"),
                  ({"no_repeat_ngram_size": -1}, "`no_repeat_ngram_size` must be a non-negative integer.*got -1"),
                  ({"eos_token_id": 10**9}, r"`eos_token_id` must lie in the vocabulary \[0, 36\], got 1000000000"),
                  ({"eos_token_id": [2, 40]}, r"`eos_token_id` must lie in the vocabulary \[0, 36\], got \[2, 40\]"),
                  ({"forced_eos_token_id": 999}, r"`forced_eos_token_id` must lie in the vocabulary.*IndexError"),
                  ({"forced_bos_token_id": -2}, r"`forced_bos_token_id` must lie in the vocabulary.*got -2"),
                  ({"suppress_tokens": [3, 999]}, r"`suppress_tokens` must lie in the vocabulary.*it is ignored"),
                  ({"begin_suppress_tokens": [999]}, r"`begin_suppress_tokens` must lie in the vocabulary")]


@pytest.mark.parametrize("kwargs,words", GENERATE_CASES, ids=[str(c[0]) for c in GENERATE_CASES])
@pytest.mark.parametrize("cls,family", [("TransformerDecoderForCausalLM", "decoder"),
                                        ("SetTransformerForNextTokenPrediction", "set_transformer")])
def test_generate_refuses_counts_transformers_does_not_check(cls, family, kwargs, words):
    """transformers 5.23 divides by zero on num_beams=0, fails on a tensor shape for a negative one and returns one
    sequence for num_return_sequences=0; its own checks (max_new_tokens < 1, temperature 0, num_return_sequences >
    num_beams) are clear already."""
    from tests.helpers import make_model, tiny_config

    model = make_model(getattr(hfst, cls), tiny_config(family))
    with pytest.raises(ValueError, match=words):
        model.generate(torch.randint(1, 37, (1, 4)), max_new_tokens=2, pad_token_id=0, **kwargs)


CLASSIFIERS = {"encoder": "TransformerEncoderForSequenceClassification",
               "set_transformer": "SetTransformerForSequenceClassification",
               "perceiver_io": "PerceiverIOForSequenceClassification"}
LABEL_CASES = [  # (config kwargs, labels, words of the error or None: the loss transformers would compute)
    ({}, torch.tensor([0.0, 2.0]), ["multi-label", "torch.float32 of shape (2,)", "labels.long()"]),
    ({"problem_type": "single_label_classification"}, torch.tensor([0.0, 2.0]),
     ["single-label", "torch.float32", "labels.long()"]),
    ({}, torch.tensor([[0, 2], [1, 1]]), ["single-label", "torch.int64 of shape (2, 2)"]),
    ({"problem_type": "multi_label_classification"}, torch.tensor([1, 0]), ["multi-label", "(2, 3)", "(2,)"]),
    ({"problem_type": "regression"}, torch.ones(2, 2), ["regression", "3 value(s) per example"]),
    ({}, torch.tensor([0, 2]), None),
    ({"num_labels": 1}, torch.tensor([0.5, 2.0]), None),
    ({"num_labels": 1}, torch.tensor([1, 2]), None),  # integer regression targets: as floats
    ({}, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), None),
    ({"problem_type": "multi_label_classification"}, torch.tensor([[0, 1, 1], [1, 0, 0]]), None),
    ({}, torch.tensor([2, -100]), None),  # -100 is ignored, as by transformers' cross-entropy
]


@pytest.mark.parametrize("config_kwargs,labels,words", LABEL_CASES, ids=[f"{c[0]}-{c[1].tolist()}" for c in LABEL_CASES])
@pytest.mark.parametrize("family", list(CLASSIFIERS))
def test_classification_labels_fit_the_problem_type_or_are_refused_naming_their_dtype(family, config_kwargs, labels,
                                                                                      words):
    from tests.helpers import make_model, tiny_config
    from torch.nn import functional as F

    config = tiny_config(family, **{"num_labels": 3, **config_kwargs})
    model = make_model(getattr(hfst, CLASSIFIERS[family]), config).eval()
    ids = torch.randint(1, 37, (2, 6))
    if words:
        with pytest.raises(ValueError) as err:
            model(input_ids=ids, labels=labels)
        for word in words:
            assert word in str(err.value), str(err.value)
        assert model.config.problem_type == config_kwargs.get("problem_type"), "a refused batch must not set it"
        return
    out = model(input_ids=ids, labels=labels)
    logits = out.logits
    if model.config.num_labels == 1:
        expected = F.mse_loss(logits.squeeze(), labels.float())
    elif labels.dim() == 1:
        expected = F.cross_entropy(logits, labels)
    else:
        expected = F.binary_cross_entropy_with_logits(logits, labels.float())
    assert torch.allclose(out.loss, expected)


SIBLING_INPUT_CASES = [  # (head, family, kwargs beyond input_ids, words of the error)
    ("TransformerDecoderForCausalLM", "decoder", {"labels": torch.full((2, 6), 40)},
     ["`labels` hold ids outside the vocabulary [0, 36]", "[40]"]),
    ("TransformerDecoderForCausalLM", "decoder", {"labels": torch.full((2, 6), -3)}, ["not -100", "[-3]"]),
    ("TransformerDecoderForCausalLM", "decoder", {"labels": torch.ones(2, 6)}, ["`labels` must be token ids", "float32"]),
    ("TransformerEncoderForMaskedLM", "encoder", {"labels": torch.ones(2, 6)}, ["`labels` must be token ids", "float32"]),
    ("TransformerEncoderForMaskedLM", "encoder", {"labels": torch.full((2, 6), 37)}, ["outside the vocabulary", "[37]"]),
    ("SetTransformerForNextTokenPrediction", "set_transformer", {"labels": torch.full((2, 6), 99)},
     ["outside the vocabulary", "[99]"]),
    ("TransformerDecoderForCausalLM", "decoder", {"position_ids": torch.arange(3)[None]},
     ["`position_ids` must be integers of shape", "(2, 6) or (1, 6)", "(1, 3)"]),
    ("TransformerDecoderForCausalLM", "decoder", {"position_ids": torch.arange(6.0)[None]},
     ["`position_ids` must be integers", "torch.float32"]),
    ("TransformerEncoderModel", "encoder", {"attention_masks": torch.ones(2, 6)},
     ["`attention_masks` is not an input", "did you mean `attention_mask`"]),
    ("TransformerDecoderForCausalLM", "decoder", {"label": torch.ones(2, 6, dtype=torch.long)},
     ["`label` is not an input", "did you mean `labels`"]),
    ("SetTransformerForSequenceClassification", "set_transformer", {"output_attention": True},
     ["`output_attention` is not an input", "did you mean `output_attentions`"]),
    # a base model's prefix_length out of [0, n): the encoder built masks for it silently, the others failed in torch
    ("TransformerEncoderModel", "encoder", {"prefix_length": 6}, ["`prefix_length` must be an integer in [0, 6)", "6."]),
    ("TransformerEncoderModel", "encoder", {"prefix_length": -1}, ["`prefix_length` must be an integer", "-1."]),
    ("SetTransformerModel", "set_transformer", {"prefix_length": True}, ["`prefix_length` must be an integer", "True"]),
    ("PerceiverIOModel", "perceiver_io", {"prefix_length": 100}, ["`prefix_length` must be an integer in [0, 6)"]),
    # class indices out of range: torch's "Target 5 is out of bounds" (a device-side assert on CUDA) before
    ("SetTransformerForSequenceClassification", "set_transformer", {"labels": torch.tensor([5, 1])},
     ["`labels` hold class indices outside [0, 2]", "`num_labels` is 3", "[5]"]),
    ("TransformerEncoderForSequenceClassification", "encoder", {"labels": torch.tensor([-1, 0])},
     ["class indices outside [0, 2]", "[-1]"]),
    ("PerceiverIOForSequenceClassification", "perceiver_io", {"labels": torch.tensor([0, 3])},
     ["class indices outside [0, 2]", "[3]"]),
    # integer token labels other than torch.long: cross-entropy's "expected target dtype to be Long" before
    ("TransformerDecoderForCausalLM", "decoder", {"labels": torch.ones(2, 6, dtype=torch.int32)},
     ["`labels` must be token ids (torch.long", "torch.int32", "labels.long()"]),
    ("TransformerEncoderForMaskedLM", "encoder", {"labels": torch.ones(2, 6, dtype=torch.uint8)},
     ["`labels` must be token ids", "torch.uint8", "labels.long()"]),
]


@pytest.mark.parametrize("cls,family,kwargs,words", SIBLING_INPUT_CASES,
                         ids=[f"{c[0]}-{list(c[2])[0]}-{i}" for i, c in enumerate(SIBLING_INPUT_CASES)])
def test_label_position_and_keyword_misuse_is_refused_naming_it(cls, family, kwargs, words):
    from tests.helpers import make_model, tiny_config

    model = make_model(getattr(hfst, cls), tiny_config(family, num_labels=3))
    with pytest.raises(ValueError) as err:
        model(input_ids=torch.randint(1, 37, (2, 6)), **kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_unknown_keywords_far_from_every_input_still_pass_as_in_transformers():
    from tests.helpers import make_model, tiny_config

    model = make_model(hfst.TransformerEncoderModel, tiny_config("encoder"))
    ids = torch.randint(1, 37, (2, 6))
    out = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), my_note="x")
    assert torch.equal(out.last_hidden_state, model(input_ids=ids).last_hidden_state)


FEATURE_CASES = [  # integer or bool `input_features` were cast to float without a word
    ("SetTransformerForSequenceClassification", "set_transformer", torch.long),
    ("SetTransformerForSequenceClassification", "set_transformer", torch.bool),
    ("SetTransformerForMixtureOfGaussians", "set_transformer", torch.int32),
    ("TransformerEncoderForSequenceClassification", "encoder", torch.long),
    ("PerceiverIOForSequenceClassification", "perceiver_io", torch.uint8),
]


@pytest.mark.parametrize("cls,family,dtype", FEATURE_CASES, ids=[f"{c[0]}-{c[2]}" for c in FEATURE_CASES])
def test_input_features_that_are_not_floats_are_refused_naming_their_dtype(cls, family, dtype):
    from tests.helpers import make_model, tiny_config

    model = make_model(getattr(hfst, cls), tiny_config(family, vocab_size=None, input_size=2))
    with pytest.raises(ValueError) as err:
        model(input_features=torch.ones(2, 4, 2).to(dtype))
    for word in ("`input_features` must be floating-point", str(dtype), ".float()"):
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("cls,family", [("TransformerEncoderModel", "encoder"),
                                        ("TransformerEncoderForMaskedLM", "encoder"),
                                        ("SetTransformerForSequenceClassification", "set_transformer"),
                                        ("PerceiverIOModel", "perceiver_io")])
def test_a_cache_handed_to_a_family_without_one_is_refused_naming_the_family(cls, family):
    from tests.helpers import make_model, tiny_config
    from transformers import DynamicCache

    model = make_model(getattr(hfst, cls), tiny_config(family))
    ids = torch.randint(1, 37, (2, 6))
    with pytest.raises(ValueError) as err:
        model(input_ids=ids, past_key_values=DynamicCache())
    for word in (cls, f"family '{family}'", "keeps no cache", "reads its whole input at every call"):
        assert word in str(err.value), str(err.value)
    # use_cache passes, as in transformers' encoder-only models: the same outputs, no cache
    out = model(input_ids=ids, use_cache=True)
    assert out.get("past_key_values") is None
    first = next(v for v in out.values() if torch.is_tensor(v))
    assert torch.equal(first, next(v for v in model(input_ids=ids).values() if torch.is_tensor(v)))


def test_generate_refuses_a_cache_for_a_family_without_one():
    from tests.helpers import make_model, tiny_config
    from transformers import DynamicCache

    model = make_model(hfst.TransformerEncoderForNextTokenPrediction, tiny_config("encoder"))
    with pytest.raises(ValueError, match="family 'encoder'.*keeps no cache"):
        model.generate(torch.randint(1, 37, (1, 4)), max_new_tokens=2, pad_token_id=0, past_key_values=DynamicCache())


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


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_the_outermost_call_checks_once_and_drops_a_mask_of_ones(family, monkeypatch):
    """A head's forward is checked once: its base model's call inside it is not checked again. The base model gets
    None for a mask of ones (the kernels' unmasked paths) and a mask with padding as given; its outputs are
    transformers' (no extra fields)."""
    from hf_settransformer import checks

    model = many_target_head(family)
    checked, seen = [], []
    check_forward = checks.check_forward
    monkeypatch.setattr(checks, "check_forward", lambda m, inputs, **options: checked.append(m) or check_forward(m, inputs, **options))
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


def test_every_model_forward_is_checked():
    """Every public model class runs its checks at the outermost call: its forward is `checks.checked`."""
    from transformers import PreTrainedModel

    classes = [c for c in vars(hfst).values() if isinstance(c, type) and issubclass(c, PreTrainedModel)
               and not c.__name__.endswith("PreTrainedModel") and not c.__name__.startswith("_")]
    assert len(classes) >= 14
    unchecked = [c.__name__ for c in classes if not c.forward.__code__.co_filename.endswith("checks.py")]
    assert not unchecked, unchecked


LOGITS_TO_KEEP_BAD = {  # what was accepted (or failed inside torch) -> the words of the refusal
    "negative int": (-1, "an int >= 0"),
    "float": (1.5, "an int >= 0"),
    "bool": (True, "an int >= 0"),
    "string": ("2", "an int >= 0"),
    "2-D tensor": (torch.tensor([[0, 1]]), "1-D integer tensor"),
    "0-D tensor": (torch.tensor(2), "1-D integer tensor"),
    "float tensor": (torch.tensor([0.0, 1.0]), "1-D integer tensor"),
    "bool tensor": (torch.tensor([True, False, True, False, True, False]), "1-D integer tensor"),
    "index past the end": (torch.tensor([0, 6]), r"indices must lie in \[-6, 5\]"),
    "index before the start": (torch.tensor([-7]), r"indices must lie in \[-6, 5\]"),
    "meta tensor": (torch.tensor([1], device="meta"), "on the CPU or the model's device"),
}


@pytest.mark.parametrize("case", list(LOGITS_TO_KEEP_BAD))
def test_bad_logits_to_keep_is_refused(case):
    from tests.helpers import decoder

    value, words = LOGITS_TO_KEEP_BAD[case]
    with pytest.raises(ValueError, match=words):
        decoder("softmax", "elu")(input_ids=batch_of_tokens(), logits_to_keep=value)


def test_legal_logits_to_keep_gives_llamas_positions():
    """As Llama: an int k keeps the last k positions (0 all, more than the input all), a 1-D tensor those listed."""
    from tests.helpers import decoder

    model, ids = decoder("softmax", "elu"), batch_of_tokens()
    with torch.no_grad():
        full = model(input_ids=ids).logits
        assert torch.allclose(model(input_ids=ids, logits_to_keep=2).logits, full[:, -2:], atol=1e-6)
        assert torch.allclose(model(input_ids=ids, logits_to_keep=9).logits, full, atol=1e-6)
        kept = model(input_ids=ids, logits_to_keep=torch.tensor([0, -1, 3], dtype=torch.int32)).logits
        assert torch.allclose(kept, full[:, [0, 5, 3]], atol=1e-6)


# ------------------------------------------------------------------------------------------------ config after build

BUILT_CHANGES = {  # a field a model is built from -> another value, valid alone and with the tiny configs' others
    "vocab_size": VOCAB + 1, "input_size": 3, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 40,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.2,
    "max_position_embeddings": 65, "position_embedding_type": "learned", "scale_embedding": False,
    "norm_type": "layernorm", "norm_eps": 1e-6, "attention_type": "softmax", "feature_map": "exp",
    "linear_attention_chunk_size": 8, "linear_attention_decay": "fixed", "adaptive_softmax_cutoffs": [4, 16],
    "adaptive_softmax_div_value": 2.0, "adaptive_input_cutoffs": [4, 16], "adaptive_input_div_value": 2.0,
    "tie_word_embeddings": False, "tie_adaptive_weights": True, "tie_adaptive_projections": False,
    "num_hidden_layers": 3, "add_cross_attention": True, "pooling": "mean",
    "next_token_mode": "window", "num_inducing_points": 4, "num_seeds": 2, "num_decoder_layers": 2, "num_latents": 6,
    "num_self_attends_per_block": 3, "num_cross_attention_heads": 1, "output_query_type": "learned",
    "num_output_queries": 2, "num_labels": 4,
}
CALL_TIME_CHANGES = {  # a field read at each call -> another value: honoured by the forward and written by a save
    "initializer_range": 0.05, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 3, "use_cache": False,
    "is_decoder": False, "lm_loss_chunk_size": 4, "context_length": 6, "target_length": 3, "num_blocks": 1,
    "problem_type": "single_label_classification", "id2label": {0: "a", 1: "b", 2: "c"},
}
BUILT_MODELS = [*((family, cls) for family, cls in MODEL_CLASSES),
                ("set_transformer", hfst.SetTransformerForMixtureOfGaussians)]


def built_model(family, cls, **fields):
    """A tiny linear-attention `cls` (its kernel's fields are read; tied weights off: the adaptive layers can then be
    switched on) and its inputs."""
    if cls is hfst.SetTransformerForMixtureOfGaussians:
        fields = {"vocab_size": None, "input_size": 2, "num_seeds": 3, **fields}
    config = tiny_config(family, "linear", tie_word_embeddings=False, **fields)
    model = make_model(cls, config)
    if model.main_input_name == "input_features":
        return model, {"input_features": torch.randn(2, 6, config.input_size)}
    return model, {"input_ids": batch_of_tokens(2, 6)}


@pytest.mark.parametrize("family,cls", BUILT_MODELS, ids=lambda x: getattr(x, "__name__", x))
def test_a_field_the_model_was_built_from_is_refused_when_changed_after(family, cls, tmp_path):
    """`config.linear_attention_decay = "fixed"` on a built undecayed model (and every field its modules are made
    from, for every model class) is refused at the forward and at save, naming the field and both values; nothing is
    written. The same value again runs."""
    from hf_settransformer.configuration_base import built_fields

    model, inputs = built_model(family, cls)
    fields = [*built_fields(model.config), *model.built_from]
    assert set(model.built_config) == set(fields) and set(fields) <= set(BUILT_CHANGES)
    for name in fields:
        built, value = getattr(model.config, name), BUILT_CHANGES[name]
        value = not built if value == built and isinstance(built, bool) else value
        if family == "set_transformer" and name == "position_embedding_type":
            continue  # a set has no order: "none" is its only value
        if name.endswith("_cutoffs") and model.config.vocab_size is None:
            continue  # no vocabulary to cut: refused by the config itself (test_config.py)
        if name == "tie_adaptive_weights":
            continue  # True needs both adaptive layers, off here: test_tied_adaptive.py changes it on a tied model
        setattr(model.config, name, value)
        for use in (lambda: model(**inputs), lambda: model.save_pretrained(tmp_path)):
            with pytest.raises(ValueError, match=f"`config.{name}` is {value!r}, but this {cls.__name__} was built with "
                                                 f"{name}={built!r}".replace("[", r"\[")):
                use()
        setattr(model.config, name, built)
        assert not any(tmp_path.iterdir()), name
    model(**inputs)


@pytest.mark.parametrize("family,cls", BUILT_MODELS, ids=lambda x: getattr(x, "__name__", x))
def test_a_field_read_at_each_call_may_change_after_build_and_a_save_keeps_what_ran(family, cls, tmp_path):
    """The fields left changeable (`configuration_base.CALL_TIME_FIELDS`, and transformers' `problem_type` and
    `id2label`) are honoured: the changed model's output is the output of its saved and reloaded copy."""
    from hf_settransformer.configuration_base import CALL_TIME_FIELDS

    assert CALL_TIME_FIELDS <= set(CALL_TIME_CHANGES)
    model, inputs = built_model(family, cls)
    for name, value in CALL_TIME_CHANGES.items():
        if name not in model.config.__dataclass_fields__:
            continue
        setattr(model.config, name, value)
        with torch.no_grad():
            expected = main_output(model(**inputs)) if cls is not hfst.SetTransformerForMixtureOfGaussians else (
                model(**inputs).log_likelihood)
        model.save_pretrained(tmp_path / name)
        reloaded = cls.from_pretrained(tmp_path / name).eval()
        assert getattr(reloaded.config, name) == value
        with torch.no_grad():
            got = main_output(reloaded(**inputs)) if cls is not hfst.SetTransformerForMixtureOfGaussians else (
                reloaded(**inputs).log_likelihood)
        torch.testing.assert_close(got, expected, msg=name)


@pytest.mark.parametrize("family", HEAD_FAMILIES + ["decoder"])
def test_a_resized_vocabulary_is_the_one_the_model_and_its_base_model_run_and_save(family, tmp_path):
    """`resize_token_embeddings` changes `vocab_size` legitimately: the head and its base model run on the new ids,
    and the saved copy gives the same logits."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    model.resize_token_embeddings(VOCAB + 5)
    ids = torch.tensor([[VOCAB + 4, 1, 2, 3]])
    model.model(input_ids=ids)
    expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(type(model).from_pretrained(tmp_path).eval()(input_ids=ids).logits, expected)

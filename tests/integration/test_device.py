"""Correct on any device, and no host syncs in a training step, checked on the CPU.

Meta device: the model and its inputs are built on the CPU and called under `with torch.device("meta")`. A tensor that a
forward makes without taking the inputs' device then lands on "meta" and the call fails, as it fails on CUDA ("Expected
all tensors to be on the same device"). This caught the encoder's and the Set Transformer's next-token heads building
their prefix mask on the CPU.

Host syncs: a dispatch mode records every op that reads a tensor's values back to the host (`.item()`, `bool(t)`,
`nonzero`, boolean indexing) and `Tensor.tolist`, with the package function it came from. A training forward and
backward reads once per batch: the input check (`check_input_values`: ids in the vocabulary, a 0/1 mask, whether it is
all ones), in one read. The exp kernel's rare exact-path check is the one other read, in eager mode only (compiled, it
is a select); `torch.compile` reads nothing (the fullgraph test below).
"""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, MODEL_CLASSES, VOCAB, host_reads, make_model, tiny_config

import hf_settransformer as hfst

ALL = [(f, c, a, m) for f, c in MODEL_CLASSES for a, m in ATTENTIONS]
ALL_IDS = [f"{c.__name__}-{i}" for f, c in MODEL_CLASSES for i in ATTENTION_IDS]
LM_HEADS = [(f, c, a, m) for f, c, a, m in ALL if not c.__name__.endswith(("Model", "Classification"))]
LM_IDS = [f"{c.__name__}-{'softmax' if a == 'softmax' else 'linear-' + m}" for f, c, a, m in LM_HEADS]


def batch(cls, padded, b=2, n=8):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (b, n), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones(b, n, dtype=torch.long)}
    if padded:
        inputs["attention_mask"][1, 6:] = 0
    if cls.__name__.endswith("Classification"):
        inputs["labels"] = torch.tensor([0, 1])
    elif not cls.__name__.endswith("Model"):
        labels = ids.clone()
        if padded:
            labels[1, 6:] = -100
        inputs["labels"] = labels
    return inputs


def scalar(output):
    if output.get("loss") is not None:
        return output.loss
    return (output.logits if "logits" in output else output.last_hidden_state).float().sum()


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("family,cls,attention_type,feature_map", ALL, ids=ALL_IDS)
def test_forward_and_backward_make_no_tensor_off_the_inputs_device(family, cls, attention_type, feature_map, padded):
    """Every family x head x attention type, training mode (dropout and key dropout on), with and without padding."""
    config = tiny_config(
        family, attention_type, feature_map, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
    )
    model = make_model(cls, config).train()
    inputs = batch(cls, padded)
    with torch.device("meta"):
        loss = scalar(model(**inputs))
        loss.backward()
    assert loss.device.type == "cpu" and torch.isfinite(loss)
    assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("family,cls,attention_type,feature_map", LM_HEADS, ids=LM_IDS)
def test_generate_and_evaluation_make_no_tensor_off_the_inputs_device(family, cls, attention_type, feature_map):
    """Cached generation (the decoder's cache; the window heads' sliding window) and an evaluation forward with labels
    (the many-target heads' logits path, the masked-LM head's scored path)."""
    config = tiny_config(family, attention_type, feature_map)
    model = make_model(cls, config)
    inputs = batch(cls, padded=True)
    with torch.device("meta"), torch.no_grad():
        evaluation = model(**inputs)
        if hasattr(model, "generate"):
            out = model.generate(
                input_ids=inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                max_new_tokens=3,
                do_sample=False,
                pad_token_id=0,
            )
    assert evaluation.loss.device.type == "cpu" and torch.isfinite(evaluation.loss)
    if hasattr(model, "generate"):
        assert out.device.type == "cpu" and out.shape == (2, 11)


DECAYED = [(f, c, m, d) for f, c in MODEL_CLASSES for m in ("elu", "exp") for d in ("fixed", "gated")
           if c.__name__.endswith(("ForCausalLM", "ForNextTokenPrediction"))]  # the causal heads a decay applies to


@pytest.mark.parametrize("family,cls,feature_map,decay", DECAYED,
                         ids=[f"{c.__name__}-{m}-{d}" for _, c, m, d in DECAYED])
def test_decayed_heads_make_no_tensor_off_the_inputs_device(family, cls, feature_map, decay):
    """`linear_attention_decay`: a padded training forward and backward, and cached generation, on the meta device."""
    config = tiny_config(family, "linear", feature_map, linear_attention_decay=decay, attention_probs_dropout_prob=0.1)
    model = make_model(cls, config).train()
    inputs = batch(cls, padded=True)
    with torch.device("meta"):
        loss = scalar(model(**inputs))
        loss.backward()
        with torch.no_grad():
            out = model.eval().generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                        max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert loss.device.type == "cpu" and torch.isfinite(loss) and out.device.type == "cpu"


def test_the_meta_device_technique_catches_a_tensor_made_on_the_default_device():
    """The technique itself: a mask made without the inputs' device is refused under the meta device, as on CUDA; the
    attention mask built for the same call takes the queries' device."""
    from hf_settransformer.masks import AttentionMask, causal_pattern

    scores = torch.zeros(1, 1, 3, 3)
    with torch.device("meta"), pytest.raises(RuntimeError, match="device"):
        scores.masked_fill(~causal_pattern(3, 3, prefix_length=1), 0.0)
    with torch.device("meta"):
        mask = AttentionMask.build(None, causal=True, num_queries=3, num_keys=3, prefix_length=1)
        dense, _ = mask.dense_form(scores.device)
        scores.masked_fill(~dense, 0.0)
    assert dense.device.type == "cpu" and dense[0, 0].tolist() == [[True, False, False], [True, True, False]] + [[True] * 3]


@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "all-ones-mask"])
@pytest.mark.parametrize("family,cls,attention_type,feature_map", ALL, ids=ALL_IDS)
def test_training_step_reads_nothing_back_but_the_one_input_check(
    family, cls, attention_type, feature_map, with_mask, monkeypatch
):
    config = tiny_config(family, attention_type, feature_map, attention_probs_dropout_prob=0.1)
    model = make_model(cls, config).train()
    inputs = batch(cls, padded=False)
    if not with_mask:
        inputs.pop("attention_mask")
    with host_reads(monkeypatch) as sites:
        scalar(model(**inputs)).backward()
    exact_path_checks = sites.pop("linear_torch.py:_causal_exp_linear_attention", 0)  # the PyTorch kernel's
    exact_path_checks += sites.pop("linear_triton.py:fused_causal_linear_attention", 0)  # the fused one's (forced)
    assert dict(sites) == {"checks.py:check_input_values": 1}  # ids (and mask) checked in one read
    if feature_map == "elu" or attention_type == "softmax":
        assert exact_path_checks == 0


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_a_fixed_shape_decoding_step_reads_back_only_the_input_check(attention_type, feature_map, monkeypatch):
    """A decoding step with a static cache (softmax: transformers' StaticCache; linear: the state kept in place) and
    left padding: the one input check is its only read (its positions and masks come from the cache's counter, a
    tensor; compiled, it reads nothing: test_compile_export.py), and it makes no tensor off the inputs' device."""
    from transformers import StaticCache

    from hf_settransformer.cache import LinearAttentionCache

    config = tiny_config("decoder", attention_type, feature_map)
    model = make_model(hfst.TransformerDecoderForCausalLM, config)
    ids = torch.randint(1, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    static = attention_type == "softmax"
    cache = StaticCache(config=config, max_cache_len=8) if static else LinearAttentionCache(config=config, static=True)
    full = torch.nn.functional.pad(mask, (0, 2), value=1)  # the prompt and two steps

    def mask_for(length):  # a StaticCache's mask covers its 8 slots; the recurrent state's, the tokens so far
        return full if static else full[:, :length]

    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask_for(6), past_key_values=cache)
        with host_reads(monkeypatch) as sites:
            model(input_ids=ids[:, :1], attention_mask=mask_for(7), past_key_values=cache)
        with torch.device("meta"):  # apart: under the meta context `tolist` would be counted twice
            out = model(input_ids=ids[:, 1:2], attention_mask=mask_for(8), past_key_values=cache)
    assert dict(sites) == {"checks.py:check_input_values": 1}
    assert out.logits.device.type == "cpu" and torch.isfinite(out.logits).all()


def test_the_host_read_counter_sees_item_bool_tolist_and_boolean_indexing(monkeypatch):
    x = torch.arange(4.0)
    with host_reads(monkeypatch) as sites:
        x.sum().item()
        bool(x.any())
        x.tolist()
        x[x > 1].sum()
    assert sites["outside the package"] == 4


@pytest.mark.parametrize("value", [0.5, -1.0, float("nan"), 2.0])
def test_a_mask_that_is_not_zero_or_one_is_refused_by_name(value):
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    mask = torch.ones(2, 8)
    mask[0, 3] = value
    with pytest.raises(ValueError, match="attention_mask.*only 0 .padding. and 1"):
        model(input_ids=torch.randint(1, VOCAB, (2, 8)), attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.float32])
def test_binary_masks_of_any_dtype_give_the_same_output(dtype):
    model = make_model(hfst.TransformerEncoderModel, tiny_config("encoder"))
    ids = torch.randint(1, VOCAB, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask.to(dtype)).last_hidden_state
    torch.testing.assert_close(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("family,cls,attention_type,feature_map", LM_HEADS, ids=LM_IDS)
def test_compiled_training_forward_and_loss_equal_eager(family, cls, attention_type, feature_map):
    """One graph (fullgraph) for the training forward and loss of every LM head, with padding, equal to eager."""
    config = tiny_config(family, attention_type, feature_map)
    model = make_model(cls, config).train()  # no dropout in tiny configs: train mode is deterministic
    inputs = batch(cls, padded=True)
    expected = model(**inputs).loss
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(**inputs).loss, expected, atol=1e-5, rtol=1e-5)


def test_cached_softmax_steps_do_not_use_the_cudnn_attention_backend(monkeypatch):
    """cuDNN attention builds an execution graph per key length: a cached step (a new length every call) must not
    reach it; a training forward (one length) may."""
    from hf_settransformer import softmax_ops

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(softmax_ops.F, "scaled_dot_product_attention", recording)
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    ids = torch.randint(1, VOCAB, (1, 5))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        assert seen == [True, True] and torch.backends.cuda.cudnn_sdp_enabled()
        seen.clear()
        model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert len(seen) == 2 * 3 and not any(seen)  # 2 layers x (prefill + 2 steps)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored


PACKED = [("decoder", hfst.TransformerDecoderForCausalLM, "softmax"), ("decoder", hfst.TransformerDecoderForCausalLM,
          "linear"), ("encoder", hfst.TransformerEncoderForMaskedLM, "linear"),
          ("encoder", hfst.TransformerEncoderForSequenceClassification, "softmax"),
          ("set_transformer", hfst.SetTransformerForSequenceClassification, "softmax"),
          ("set_transformer", hfst.SetTransformerForSequenceClassification, "linear"),
          ("perceiver_io", hfst.PerceiverIOForSequenceClassification, "linear"),
          ("encoder", hfst.TransformerEncoderForNextTokenPrediction, "linear"),
          ("set_transformer", hfst.SetTransformerForNextTokenPrediction, "softmax"),
          ("perceiver_io", hfst.PerceiverIOForNextTokenPrediction, "linear")]


@pytest.mark.parametrize("family,cls,attention_type", PACKED, ids=[f"{c.__name__}-{a}" for _, c, a in PACKED])
def test_a_packed_batch_makes_no_tensor_off_the_inputs_device(family, cls, attention_type):
    """A packed row (three sequences: the boundaries, the block layout of sets, the segmented routes), training forward
    and backward with dropout; the boundaries come as a collator gives them."""
    config = tiny_config(family, attention_type, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                         **({"num_inducing_points": 0} if attention_type == "linear" and family == "set_transformer"
                            else {}))
    model = make_model(cls, config).train()
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    inputs = {"input_ids": torch.randint(1, VOCAB, (1, 9)), "cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    if cls.__name__.endswith("Classification"):
        inputs["labels"] = torch.tensor([0, 1, 2])
    else:
        inputs["labels"] = inputs["input_ids"].clone()
    with torch.device("meta"):
        loss = scalar(model(**inputs))
        loss.backward()
    assert loss.device.type == "cpu" and torch.isfinite(loss)
    assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())
    if cls.__name__.endswith("NextTokenPrediction"):  # the windows' logits back to the row's positions, evaluated
        with torch.device("meta"), torch.no_grad():
            logits = model.eval()(**inputs).logits
        assert logits.device.type == "cpu" and logits.shape == (1, 9, VOCAB)

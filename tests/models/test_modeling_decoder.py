"""Mirrors `hf_settransformer/modeling_decoder.py`: causality, SDPA against eager, the causal-LM loss (shifted,
chunked), the cache a training forward fills, the tied LM head under resizing."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import ATTENTION_IDS, ATTENTIONS, VOCAB, batch_of_tokens, decoder, make_model, tiny_config

import hf_settransformer as hfst

ATOL = 1e-5


@pytest.mark.parametrize("span", [100.0, 300.0])
def test_linear_exp_decoder_logits_ignore_an_appended_token_with_a_huge_key(span):
    """Causality numerically too: a token appended with a key `span` nats above the rest (forced in the first layer's
    key projection) leaves every earlier position's logits as they were, in one forward and token by token (the
    kernel's stabilisers once took the maximum over the whole call and changed them by ~0.01)."""
    config = tiny_config("decoder", "linear", "exp", linear_attention_chunk_size=8)
    model = make_model(hfst.TransformerDecoderForCausalLM, config)
    ids = batch_of_tokens(2, 13)
    projection = next(m for n, m in model.model.layers[0].named_modules() if n.endswith("qkv_proj"))

    def spike(module, args, output):  # key feature 0 of head 0 of position 12 (the appended token)
        if output.shape[1] == 13:
            output = output.clone()
            output[:, 12, config.hidden_size] += span
        return output

    ref = model(input_ids=ids[:, :12]).logits
    handle = projection.register_forward_hook(spike)
    try:
        out = model(input_ids=ids).logits
    finally:
        handle.remove()
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:, :12], ref, atol=ATOL)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_decoder_is_causal(attention_type, feature_map, impl):
    config = tiny_config("decoder", attention_type, feature_map, attn_implementation=impl)
    model = make_model(hfst.TransformerDecoderForCausalLM, config)
    ids = batch_of_tokens(2, 11)
    ref = model(input_ids=ids).logits
    for t in (0, 4, 10):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % VOCAB
        out = model(input_ids=changed).logits
        assert torch.allclose(out[:, :t], ref[:, :t], atol=ATOL)
        assert not torch.allclose(out[:, t], ref[:, t], atol=ATOL)


def test_sdpa_and_eager_models_agree():
    config = tiny_config("decoder")
    model = make_model(hfst.TransformerDecoderForCausalLM, config)
    ids = batch_of_tokens(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    sdpa = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, sdpa, atol=ATOL)


def test_causal_lm_loss_shifts_labels():
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    ids = batch_of_tokens(2, 6)
    out = model(input_ids=ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert torch.allclose(out.loss, expected, atol=1e-6)


def test_a_training_forward_with_labels_fills_no_cache():
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder")).train()
    ids = batch_of_tokens(2, 6)
    assert model(input_ids=ids, labels=ids).past_key_values is None
    assert model(input_ids=ids, labels=ids, use_cache=True).past_key_values.get_seq_length() == 6  # asked for
    assert model.eval()(input_ids=ids, labels=ids).past_key_values.get_seq_length() == 6  # config.use_cache


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_chunked_lm_loss_equals_the_usual_loss_and_gradients(tie, attention_type):
    usual = make_model(
        hfst.TransformerDecoderForCausalLM, tiny_config("decoder", attention_type, tie_word_embeddings=tie)
    ).train()
    config = tiny_config("decoder", attention_type, tie_word_embeddings=tie, lm_loss_chunk_size=7)
    chunked = make_model(hfst.TransformerDecoderForCausalLM, config).train()
    chunked.load_state_dict(usual.state_dict())
    ids = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(0))  # 39 positions: chunks 7 + 4
    labels = ids.clone()
    labels[0, :4] = -100  # ignored positions, as a collator's padding gives
    labels[2, 5] = -100
    for num_items in (None, torch.tensor(29)):  # the Trainer's count under gradient accumulation
        expected = usual(input_ids=ids, labels=labels, num_items_in_batch=num_items)
        got = chunked(input_ids=ids, labels=labels, num_items_in_batch=num_items)
        assert got.logits is None  # the point: no (positions x vocabulary) logits
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-6, atol=1e-6)
        expected.loss.backward()
        got.loss.backward()
        for (name, a), b in zip(usual.named_parameters(), chunked.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
        usual.zero_grad()
        chunked.zero_grad()
    chunked.eval()  # evaluation and generation keep the logits
    out = chunked(input_ids=ids, labels=labels)
    assert out.logits.shape == (3, 13, VOCAB)
    torch.testing.assert_close(out.loss, usual.eval()(input_ids=ids, labels=labels).loss)
    with pytest.raises(StrictDataclassError, match="lm_loss_chunk_size"):
        tiny_config("decoder", lm_loss_chunk_size=-1)


def test_resize_token_embeddings_keeps_the_tie():
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    model.resize_token_embeddings(VOCAB + 5, mean_resizing=False)
    assert model.config.vocab_size == VOCAB + 5
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert model(input_ids=torch.tensor([[VOCAB + 4, 1]])).logits.shape == (1, 2, VOCAB + 5)


def test_logits_to_keep_as_an_index_tensor_selects_those_positions():
    """As Llama: an int keeps the last positions, a 1-D index tensor the positions it names."""
    model = decoder("softmax", "elu")
    ids = torch.randint(1, VOCAB, (2, 6))
    full = model(ids).logits
    torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor([5])).logits, full[:, [5]])
    torch.testing.assert_close(model(ids, logits_to_keep=torch.tensor([1, 3])).logits, full[:, [1, 3]])
    torch.testing.assert_close(model(ids, logits_to_keep=2).logits, full[:, -2:])

"""Our encoder and decoder paired by EncoderDecoderModel, trained with the Seq2SeqTrainer to reverse sequences, then
solving held-out examples with greedy generate() (cross-attention keys cached, self-attention cache or state)."""

import pytest
import torch
from tests.helpers import quiet_training_args
from transformers import EncoderDecoderModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

import hf_settransformer as hfst

# minutes of Seq2SeqTrainer training: left out of the fast tier (python -m pytest -m 'not slow')
pytestmark = pytest.mark.slow

PAD, BOS, EOS, FIRST, SYMBOLS, LENGTH = 0, 1, 2, 3, 10, 5
VOCAB = FIRST + SYMBOLS


def reversal_example(seq):
    return {
        "input_ids": seq,
        "attention_mask": torch.ones(LENGTH, dtype=torch.long),
        "labels": torch.cat([seq.flip(0), torch.tensor([EOS])]),
    }


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_encoder_decoder_learns_to_reverse(tmp_path, attention_type):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attention_type=attention_type,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    hfst.TransformerEncoderModel(hfst.TransformerEncoderConfig(**common)).save_pretrained(tmp_path / "enc")
    hfst.TransformerDecoderForCausalLM(hfst.TransformerDecoderConfig(**common)).save_pretrained(tmp_path / "dec")
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(str(tmp_path / "enc"), str(tmp_path / "dec"))
    model.config.decoder_start_token_id, model.config.pad_token_id, model.config.eos_token_id = BOS, PAD, EOS

    g = torch.Generator().manual_seed(0)
    seqs = torch.unique(torch.randint(FIRST, VOCAB, (3200, LENGTH), generator=g), dim=0)
    seqs = seqs[torch.randperm(len(seqs), generator=g)]
    train, held_out = seqs[:-200], seqs[-200:]
    args = quiet_training_args(
        tmp_path / "out",
        cls=Seq2SeqTrainingArguments,
        max_steps=300,
        per_device_train_batch_size=64,
        learning_rate=2e-3,
        warmup_steps=30,
    )
    Seq2SeqTrainer(model=model, args=args, train_dataset=[reversal_example(s) for s in train]).train()

    model.eval()
    cross_projections = []
    model.decoder.model.layers[0].cross_attention.kv_proj.register_forward_hook(lambda *_: cross_projections.append(1))
    mask = torch.ones_like(held_out)
    out = model.generate(input_ids=held_out, attention_mask=mask, max_new_tokens=LENGTH + 1, do_sample=False)
    assert len(cross_projections) == 1  # the encoder states are projected once, then read from the cache
    target = torch.cat([torch.full((200, 1), BOS), held_out.flip(1), torch.full((200, 1), EOS)], dim=1)
    accuracy = (out[:, : LENGTH + 2] == target).all(dim=1).float().mean().item()
    print(f"{attention_type}: exact-match accuracy on 200 held-out sequences = {accuracy:.3f}")
    assert accuracy >= 0.95
    uncached = model.generate(
        input_ids=held_out[:20], attention_mask=mask[:20], max_new_tokens=LENGTH + 1, do_sample=False, use_cache=False
    )
    assert torch.equal(uncached, out[:20])

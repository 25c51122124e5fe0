"""Packed rows of text (transformers' `DataCollatorWithFlattening` format: one row, `position_ids` restarting at 0,
optionally `cu_seq_lens_q`/`cu_seq_lens_k` and `seq_idx`): every sequence gets the logits, loss and gradients it gets
alone, in every attention type and implementation; a packed batch that is not one is refused naming the input.
Packed sets are in test_packed_sets.py."""

import pytest
import torch
from tests.helpers import (
    HEAD_FAMILIES,
    VOCAB,
    decoder,
    family_classes,
    make_model,
    many_target_head,
    quiet_training_args,
    tiny_config,
)
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, Trainer

import hf_settransformer as hfst

LENGTHS = (5, 1, 9, 4)  # a one-token sequence; one longer than two chunks (linear_attention_chunk_size=4)

ATTENTIONS = [  # (attention_type, feature_map, linear_attention_decay)
    ("softmax", "elu", "none"),
    ("linear", "elu", "none"),
    ("linear", "exp", "none"),
    ("linear", "elu", "fixed"),
    ("linear", "elu", "gated"),
    ("linear", "exp", "gated"),
]


def sequences(lengths=LENGTHS, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]


def packed(seqs):
    """What `DataCollatorWithFlattening` makes of the sequences, with the boundaries and `seq_idx`."""
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    return collator([{"input_ids": s.tolist()} for s in seqs])


def per_sequence(tensor, seqs):
    return list(tensor[0].split([len(s) for s in seqs]))


@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned"])
@pytest.mark.parametrize("attention_type,feature_map,decay", ATTENTIONS)
def test_a_packed_row_gives_each_sequence_its_logits_loss_and_gradients(
    attention_type, feature_map, decay, position_embedding_type
):
    model = decoder(attention_type, feature_map, linear_attention_decay=decay,
                    position_embedding_type=position_embedding_type).train()  # no dropout: train = eval
    seqs = sequences()
    batch = packed(seqs)
    out = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"])
    targets = sum(len(s) - 1 for s in seqs)
    (out.loss * targets).backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total = 0
    for seq, logits in zip(seqs, per_sequence(out.logits, seqs)):
        alone = model(input_ids=seq[None], labels=seq[None])
        torch.testing.assert_close(logits, alone.logits[0], atol=1e-5, rtol=1e-5)
        if len(seq) > 1:
            total = total + alone.loss * (len(seq) - 1)
    torch.testing.assert_close(out.loss * targets, total, atol=1e-5, rtol=1e-5)
    total.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed_grads[name], p.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("implementation", ["eager", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_every_softmax_implementation_keeps_the_sequences_apart(implementation):
    model = decoder("softmax", "elu")
    model.set_attn_implementation(implementation)
    seqs = sequences()
    batch = packed(seqs)
    with torch.no_grad():  # flex attention has no backward on the CPU
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        for seq, logits in zip(seqs, per_sequence(out, seqs)):
            torch.testing.assert_close(logits, model(input_ids=seq[None]).logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_the_boundaries_given_any_way_give_the_same_logits(attention_type):
    model = decoder(attention_type, "elu")
    seqs = sequences()
    batch = packed(seqs)
    ids, cu = batch["input_ids"], batch["cu_seq_lens_q"]
    with torch.no_grad():
        ways = {
            "position_ids": model(input_ids=ids, position_ids=batch["position_ids"]).logits,
            "cu_seq_lens": model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits,
            "seq_idx": model(input_ids=ids, seq_idx=batch["seq_idx"]).logits,
            "all": model(**{k: v for k, v in batch.items() if k != "labels"}).logits,
        }
    for way, logits in ways.items():
        torch.testing.assert_close(logits, ways["position_ids"], atol=1e-6, rtol=1e-6, msg=way)


def test_positions_that_never_restart_are_an_ordinary_row():
    model = decoder("softmax", "elu")
    ids = sequences((6,))[0][None]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, position_ids=torch.arange(6)[None]).logits,
                                   model(input_ids=ids).logits)


def test_a_packed_row_returns_no_cache():
    model = decoder("linear", "elu")
    batch = packed(sequences())
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    assert out.past_key_values is None


def _bad(batch, **changes):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs.update(changes)
    return {k: v for k, v in inputs.items() if v is not None}


CU = torch.tensor([0, 5, 6, 15, 19], dtype=torch.int32)

BAD_PACKED_INPUTS = {  # case -> (changes to a packed batch, the input the error names)
    "boundaries not from 0": (dict(cu_seq_lens_q=CU + 1, cu_seq_lens_k=CU + 1), "cu_seq_lens_k"),
    "boundaries not increasing": (dict(cu_seq_lens_q=None, cu_seq_lens_k=torch.tensor([0, 6, 5, 15, 19])),
                                  "cu_seq_lens_k"),
    "an empty sequence": (dict(cu_seq_lens_q=torch.tensor([0, 5, 5, 19]), cu_seq_lens_k=None), "cu_seq_lens_q"),
    "boundaries short of the end": (dict(cu_seq_lens_q=None, cu_seq_lens_k=CU.clone().index_fill_(0,
                                         torch.tensor([4]), 18)), "cu_seq_lens_k"),
    "float boundaries": (dict(cu_seq_lens_q=CU.float(), cu_seq_lens_k=None), "cu_seq_lens_q"),
    "q and k boundaries differ": (dict(cu_seq_lens_q=torch.tensor([0, 5, 19])), "cu_seq_lens_q"),
    "seq_idx disagrees": (dict(seq_idx=torch.zeros(1, 19, dtype=torch.int32)), "seq_idx"),
    "seq_idx with a gap": (dict(cu_seq_lens_q=None, cu_seq_lens_k=None, position_ids=None,
                                seq_idx=torch.tensor([[0] * 5 + [2] * 14])), "seq_idx"),
    "position_ids disagree": (dict(position_ids=torch.arange(19)[None]), "position_ids"),
    "two rows": (dict(input_ids=torch.zeros(2, 19, dtype=torch.long), position_ids=None), "one row"),
    "padding": (dict(attention_mask=torch.tensor([[1] * 18 + [0]])), "attention_mask"),
    "a cache": (dict(use_cache=True), "use_cache"),
    "encoder states": (dict(encoder_hidden_states=torch.zeros(1, 3, 32)), "encoder_hidden_states"),
}


@pytest.mark.parametrize("case", sorted(BAD_PACKED_INPUTS))
def test_a_bad_packed_batch_is_refused_naming_the_input(case):
    changes, named = BAD_PACKED_INPUTS[case]
    model = decoder("softmax", "elu", add_cross_attention=case == "encoder states")
    batch = packed(sequences())
    with pytest.raises(ValueError, match=named):
        model(**_bad(batch, **changes))


def test_position_ids_restarting_in_a_batch_of_rows_without_a_mask_are_refused():
    model = decoder("softmax", "elu")
    with pytest.raises(ValueError, match="one row"):
        model(input_ids=torch.zeros(2, 4, dtype=torch.long), position_ids=torch.tensor([[0, 1, 0, 1]] * 2))


def test_a_packed_batch_with_a_cache_is_refused():
    model = decoder("softmax", "elu")
    cache = model(input_ids=torch.zeros(1, 3, dtype=torch.long), use_cache=True).past_key_values
    batch = packed(sequences())
    with pytest.raises(ValueError, match="past_key_values"):
        model(input_ids=batch["input_ids"], cu_seq_lens_q=batch["cu_seq_lens_q"], past_key_values=cache)


BIDIRECTIONAL = [("softmax", "elu", "sdpa"), ("softmax", "elu", "eager"), ("linear", "elu", "sdpa"),
                 ("linear", "exp", "sdpa")]


@pytest.mark.parametrize("family,cls", [("encoder", hfst.TransformerEncoderForMaskedLM),
                                        ("perceiver_io", hfst.PerceiverIOForMaskedLM)])
@pytest.mark.parametrize("attention_type,feature_map,implementation", BIDIRECTIONAL)
def test_a_masked_lm_gives_each_packed_sequence_its_logits_loss_and_gradients(
    family, cls, attention_type, feature_map, implementation
):
    model = make_model(cls, tiny_config(family, attention_type, feature_map)).train()  # no dropout
    model.set_attn_implementation(implementation)
    seqs = sequences()
    batch = packed(seqs)
    labels = batch["input_ids"].clone()
    labels[:, ::3] = -100
    out = model(input_ids=batch["input_ids"], labels=labels, position_ids=batch["position_ids"])
    targets = int((labels != -100).sum())
    (out.loss * targets).backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total = 0
    for seq, seq_labels, logits in zip(seqs, per_sequence(labels, seqs), per_sequence(out.logits, seqs)):
        alone = model(input_ids=seq[None], labels=seq_labels[None])
        torch.testing.assert_close(logits, alone.logits[0], atol=1e-5, rtol=1e-5)
        if (seq_labels != -100).any():
            total = total + alone.loss * int((seq_labels != -100).sum())
    torch.testing.assert_close(out.loss * targets, total, atol=1e-5, rtol=1e-5)
    total.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed_grads[name], p.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("implementation", ["flex_attention", "eager"])
def test_an_encoder_keeps_packed_sequences_apart_under_every_implementation_and_with_weights(implementation):
    model = make_model(hfst.TransformerEncoderForMaskedLM, tiny_config("encoder"))
    model.set_attn_implementation(implementation)
    seqs = sequences()
    batch = packed(seqs)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], output_attentions=True)
        for seq, logits in zip(seqs, per_sequence(out.logits, seqs)):
            torch.testing.assert_close(logits, model(input_ids=seq[None]).logits[0], atol=1e-5, rtol=1e-5)
    if implementation == "eager":  # the block-diagonal weights: no weight across a boundary
        weights = out.attentions[0][0, 0]  # (total, total)
        ids = batch["seq_idx"][0]
        assert float(weights[ids[:, None] != ids[None, :]].abs().max()) == 0.0


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
@pytest.mark.parametrize("pooling", ["pma", "mean"])
def test_an_encoder_classifier_gives_one_row_per_packed_sequence(attention_type, pooling):
    model = make_model(hfst.TransformerEncoderForSequenceClassification,
                       tiny_config("encoder", attention_type, pooling=pooling))
    seqs = sequences()
    batch = packed(seqs)
    labels = torch.tensor([0, 2, 1, 2])
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=labels)
        alone = [model(input_ids=s[None], labels=labels[i:i + 1]) for i, s in enumerate(seqs)]
    assert out.logits.shape == (len(seqs), 3)
    torch.testing.assert_close(out.logits, torch.cat([a.logits for a in alone]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, torch.stack([a.loss for a in alone]).mean(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="labels"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=labels[:3])


WINDOW_LENGTHS = (5, 1, 20, 9, 13)  # with context_length 12 and target_length 6: shorter than the targets, a single
# token, longer than the window, between the two, one past the window


def window_targets(length, config):
    """The targets a sequence of `length` tokens has alone in the many-target head: its window's last positions,
    less the last one (no token follows it)."""
    return min(config.target_length, length, config.context_length) - 1


@pytest.mark.parametrize("family", HEAD_FAMILIES)
@pytest.mark.parametrize("attention_type,feature_map,decay", [
    ("softmax", "elu", "none"), ("linear", "elu", "none"), ("linear", "exp", "none"), ("linear", "elu", "gated"),
])
def test_a_window_head_gives_each_packed_sequence_its_logits_loss_and_gradients(family, attention_type, feature_map,
                                                                                  decay):
    """The many-target next-token heads read each packed sequence's last window as they read the sequence alone."""
    model = many_target_head(family, attention_type, feature_map, linear_attention_decay=decay)
    seqs = sequences(WINDOW_LENGTHS)
    batch = packed(seqs)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        for seq, part in zip(seqs, per_sequence(logits, seqs)):
            torch.testing.assert_close(part, model(input_ids=seq[None]).logits[0], atol=1e-5, rtol=1e-5)
    model.train()  # no dropout: the training forward, loss only
    out = model(input_ids=batch["input_ids"], labels=batch["labels"], cu_seq_lens_q=batch["cu_seq_lens_q"])
    assert out.logits is None
    counts = [window_targets(len(s), model.config) for s in seqs]
    (out.loss * sum(counts)).backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total = sum(model(input_ids=s[None], labels=s[None]).loss * c for s, c in zip(seqs, counts) if c)
    torch.testing.assert_close(out.loss * sum(counts), total, atol=1e-5, rtol=1e-5)
    total.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed_grads[name], p.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_the_one_target_window_head_gives_one_row_per_packed_sequence(family):
    config = tiny_config(family, context_length=4, next_token_mode="window")
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    seqs = sequences((5, 2, 9, 4))
    batch = packed(seqs)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], seq_idx=batch["seq_idx"], labels=batch["input_ids"])
        alone = [model(input_ids=s[None], labels=s[None]) for s in seqs]
        plain = model(input_ids=batch["input_ids"], seq_idx=batch["seq_idx"]).logits
    assert out.logits.shape == (len(seqs), 1, VOCAB)
    torch.testing.assert_close(out.logits, torch.cat([a.logits for a in alone]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, torch.stack([a.loss for a in alone]).mean(), atol=1e-5, rtol=1e-5)
    for seq, logits in zip(seqs, plain):  # without labels, each sequence's whole window predicts the next token
        torch.testing.assert_close(logits, model(input_ids=seq[None]).logits[0], atol=1e-5, rtol=1e-5)


def test_a_window_head_refuses_what_a_packed_row_cannot_give():
    batch = packed(sequences(WINDOW_LENGTHS))
    inputs = dict(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    model = many_target_head("encoder")
    with pytest.raises(ValueError, match="`prefix_length` takes an ordinary batch"):
        model(**inputs, prefix_length=2)
    for flag in ("output_attentions", "output_hidden_states"):
        with pytest.raises(ValueError, match="Pass a padded batch to read them"):
            model(**inputs, **{flag: True})
    config = tiny_config("encoder", context_length=4, next_token_mode="window")
    window = make_model(family_classes(config)[AutoModelForCausalLM], config)
    with pytest.raises(ValueError, match="causal-LM labels shaped like `input_ids`"):
        window(**inputs, labels=torch.tensor([3]))
    with pytest.raises(ValueError, match=r"2 or more tokens; got lengths \[5, 1, 20"):
        window(**inputs, labels=batch["input_ids"])


def test_a_model_that_takes_no_packed_batch_refuses_one():
    class Unpacked(hfst.TransformerEncoderForSequenceClassification):
        takes_packed_batches = False

    model = make_model(Unpacked, tiny_config("encoder"))
    batch = packed(sequences())
    for given in ("position_ids", "cu_seq_lens_q", "seq_idx"):
        with pytest.raises(ValueError, match="Unpacked does not take packed batches"):
            model(input_ids=batch["input_ids"], **{given: batch[given]})


def test_learned_positions_count_each_packed_sequence_alone():
    model = decoder("softmax", "elu", position_embedding_type="learned", max_position_embeddings=16)
    ids = torch.randint(0, VOCAB, (1, 30))
    cu = torch.tensor([0, 10, 20, 30], dtype=torch.int32)
    with torch.no_grad():
        logits = model(input_ids=ids, cu_seq_lens_q=cu).logits  # 30 positions in all, 10 in each sequence
        torch.testing.assert_close(logits[:, 10:20], model(input_ids=ids[:, 10:20]).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="needs 17 positions but `max_position_embeddings` is 16"):
        model(input_ids=ids, cu_seq_lens_q=torch.tensor([0, 17, 30], dtype=torch.int32))


def test_the_trainer_trains_from_data_collator_with_flattening(tmp_path):
    model = decoder("linear", "elu").train()
    data = [{"input_ids": s.tolist()} for s in sequences((5, 3, 9, 2, 7, 4, 6, 8), seed=1)]
    trainer = Trainer(
        model=model,
        args=quiet_training_args(tmp_path, max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3),
        train_dataset=data,
        data_collator=DataCollatorWithFlattening(),
    )
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_a_compiled_forward_keeps_the_sequences_apart(attention_type):
    """Compiled (one graph, no host read), `position_ids` of one row always count as packed: the same logits."""
    model = decoder(attention_type, "elu", linear_attention_decay="gated" if attention_type == "linear" else "none")
    batch = packed(sequences())
    with torch.no_grad():
        eager = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        compiled = torch.compile(model, fullgraph=True)
        by_positions = compiled(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        cu = batch["cu_seq_lens_q"]
        by_boundaries = compiled(input_ids=batch["input_ids"], cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits
    torch.testing.assert_close(by_positions, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(by_boundaries, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_compiled_window_head_reads_a_packed_row_in_one_graph():
    """No host read: the windows are `context_length` + 1 long when the lengths are not read."""
    model = many_target_head("encoder", "linear", "elu")
    seqs = sequences(WINDOW_LENGTHS)
    batch = packed(seqs)
    cu = batch["cu_seq_lens_q"]
    with torch.no_grad():
        eager = model(input_ids=batch["input_ids"], cu_seq_lens_q=cu).logits
        compiled = torch.compile(model, fullgraph=True)(input_ids=batch["input_ids"], cu_seq_lens_q=cu).logits
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)

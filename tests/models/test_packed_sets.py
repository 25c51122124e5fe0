"""A packed batch of sets (one row, `cu_seq_lens_q`/`cu_seq_lens_k`) gives every set exactly what it gets alone, in
the Set Transformer (ISAB and SAB) and Perceiver IO, for softmax and both linear feature maps: outputs and gradients
(parameters and inputs) within 1e-5 of the same sets one at a time (times the largest entry where that is above 1:
float32 rounding; a set's log-likelihood reaches -27 here), sets of one element, shorter and longer than a
block and an exact multiple of it included; no tensor of the size of a total x total mask is made on the way."""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, host_reads, make_model, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode

import hf_settransformer as hfst
from hf_settransformer.packing import Packing, seq_idx_from_boundaries
from hf_settransformer.set_packing import BLOCK_SIZE, SetBlocks

ATOL = 1e-5
INPUT_SIZE = 3
SIZES = [1, 5, BLOCK_SIZE, 2 * BLOCK_SIZE + 2, 17]  # one element, shorter, a multiple of a block, longer, shorter

# (family, class, config overrides); learned output queries give per-set rows, the others per-element ones
MODELS = {
    "set-isab": ("set_transformer", hfst.SetTransformerModel, {"num_seeds": 2}),
    "set-sab": ("set_transformer", hfst.SetTransformerModel, {"num_inducing_points": 0}),
    "set-classify-pma": ("set_transformer", hfst.SetTransformerForSequenceClassification, {}),
    "set-classify-mean": ("set_transformer", hfst.SetTransformerForSequenceClassification, {"pooling": "mean"}),
    "set-classify-sab": ("set_transformer", hfst.SetTransformerForSequenceClassification,
                         {"num_inducing_points": 0}),
    "set-mixture": ("set_transformer", hfst.SetTransformerForMixtureOfGaussians, {"num_seeds": 2}),
    "perceiver-inputs": ("perceiver_io", hfst.PerceiverIOModel, {}),
    "perceiver-positions": ("perceiver_io", hfst.PerceiverIOModel, {"output_query_type": "positions"}),
    "perceiver-learned": ("perceiver_io", hfst.PerceiverIOModel,
                          {"output_query_type": "learned", "num_output_queries": 2}),
    "perceiver-classify-pma": ("perceiver_io", hfst.PerceiverIOForSequenceClassification, {"pooling": "pma"}),
    "perceiver-classify-mean": ("perceiver_io", hfst.PerceiverIOForSequenceClassification, {"pooling": "mean"}),
    "perceiver-classify-learned": ("perceiver_io", hfst.PerceiverIOForSequenceClassification,
                                   {"output_query_type": "learned", "num_output_queries": 2}),
}


def build(name, attention_type="softmax", feature_map="elu", **overrides):
    family, cls, extra = MODELS[name]
    config = tiny_config(family, attention_type, feature_map, vocab_size=None, input_size=INPUT_SIZE,
                         **{**extra, **overrides})
    return make_model(cls, config)


def sets_of_points(sizes=SIZES, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, INPUT_SIZE, generator=g) for n in sizes]


def boundaries(sizes):
    return torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32)


def packed_inputs(sets):
    cu = boundaries([len(s) for s in sets])
    return {"input_features": torch.cat(sets)[None], "cu_seq_lens_q": cu, "cu_seq_lens_k": cu}


def float_outputs(output):
    return {k: v for k, v in output.items() if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0}


def per_set_rows(value, total):
    """True for an output with one row per element ((1, total, ...) packed), False for one row per set."""
    return value.shape[0] == 1 and value.dim() > 1 and value.shape[1] == total


def packed_and_alone(model, sets, **kwargs):
    """The packed forward and each set's own (batch 1), their outputs, and a loss over them that weighs every output
    value by the same fixed random weight in both: -> ((packed outputs, packed loss), (alone outputs, alone loss))."""
    total = sum(len(s) for s in sets)
    inputs = packed_inputs(sets)
    x = inputs["input_features"].requires_grad_()
    packed = float_outputs(model(**inputs, **kwargs))
    alone_x = [s[None].clone().requires_grad_() for s in sets]
    alone = [float_outputs(model(input_features=xi, **kwargs)) for xi in alone_x]
    g = torch.Generator().manual_seed(1)
    packed_loss = alone_loss = 0.0
    merged = {}
    for name, value in packed.items():
        if per_set_rows(value, total):
            merged[name] = torch.cat([a[name][0] for a in alone])[None]
        else:
            merged[name] = torch.cat([a[name] for a in alone])
        weights = torch.randn(value.shape, generator=g) / value.numel() ** 0.5  # gradients of order 1
        packed_loss = packed_loss + (value * weights).sum()
        alone_loss = alone_loss + (merged[name] * weights).sum()
    return (packed, packed_loss, x), (merged, alone_loss, alone_x)


def gradients(model, loss, inputs):
    model.zero_grad(set_to_none=True)
    for x in inputs:
        x.grad = None
    loss.backward()
    params = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return params, torch.cat([x.grad[0] for x in inputs])


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_packed_sets_equal_each_set_alone_outputs_and_gradients(name, attention_type, feature_map):
    model = build(name, attention_type, feature_map)
    sets = sets_of_points()
    (packed, packed_loss, x), (alone, alone_loss, alone_x) = packed_and_alone(model, sets, return_loss=False) if (
        name == "set-mixture") else packed_and_alone(model, sets)
    assert packed and packed.keys() == alone.keys()
    for key, value in packed.items():
        assert_close_to_scale(value, alone[key], key)
    params, x_grad = gradients(model, packed_loss, [x])
    alone_params, alone_x_grad = gradients(model, alone_loss, alone_x)
    assert params.keys() == alone_params.keys() and len(params) > 10
    for key, grad in params.items():
        assert_close_to_scale(grad, alone_params[key], key)
    assert_close_to_scale(x_grad, alone_x_grad, "input_features")


def assert_close_to_scale(value, expected, name):
    atol = ATOL * max(1.0, expected.abs().max().item())
    torch.testing.assert_close(value, expected, atol=atol, rtol=0, msg=name)


def test_the_per_set_outputs_have_one_row_per_set():
    sets = sets_of_points()
    total, s = sum(SIZES), len(SIZES)
    out = build("set-isab")(**packed_inputs(sets))
    assert out.last_hidden_state.shape == (1, total, 32) and out.pooler_output.shape == (s, 2, 32)
    out = build("perceiver-inputs")(**packed_inputs(sets))
    assert out.last_hidden_state.shape == (1, total, 32) and out.latent_hidden_state.shape == (s, 5, 32)
    assert build("perceiver-learned")(**packed_inputs(sets)).last_hidden_state.shape == (s, 2, 32)
    assert build("set-classify-pma")(**packed_inputs(sets)).logits.shape == (s, 3)


@pytest.mark.parametrize("name", ["set-classify-pma", "perceiver-classify-mean"])
def test_a_packed_loss_is_the_mean_of_the_sets_losses(name):
    model = build(name)
    sets = sets_of_points()
    labels = torch.tensor([0, 2, 1, 1, 0])
    loss = model(**packed_inputs(sets), labels=labels).loss
    alone = torch.stack([model(input_features=s[None], labels=y[None]).loss for s, y in zip(sets, labels)])
    torch.testing.assert_close(loss, alone.mean(), atol=ATOL, rtol=0)


def test_the_mixture_loss_counts_every_point_once():
    model = build("set-mixture")
    sets = sets_of_points()
    out = model(**packed_inputs(sets))
    per_set = torch.stack([model(input_features=s[None]).log_likelihood[0] for s in sets])
    sizes = torch.tensor(SIZES, dtype=torch.float32)
    torch.testing.assert_close(out.loss, -(per_set * sizes).sum() / sizes.sum(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("labels", [torch.tensor([0, 1, 2]), torch.tensor(1), torch.zeros(6, dtype=torch.long)],
                         ids=["too-few", "scalar", "too-many"])
def test_labels_of_the_wrong_count_are_refused_naming_labels_and_the_sets(labels):
    model = build("set-classify-pma")
    with pytest.raises(ValueError, match=r"`labels` of a packed batch .* S = 5 sets"):
        model(**packed_inputs(sets_of_points()), labels=labels)


def test_one_label_row_per_set_is_taken_for_multi_label_classification():
    model = build("set-classify-pma", problem_type="multi_label_classification")
    labels = (torch.rand(len(SIZES), 3) > 0.5).float()
    assert torch.isfinite(model(**packed_inputs(sets_of_points()), labels=labels).loss)


def test_a_base_model_refuses_prefix_length_and_attention_weights_with_a_packed_batch():
    model = build("set-isab")
    inputs = packed_inputs(sets_of_points([3, 4]))
    with pytest.raises(ValueError, match="`prefix_length`"):
        model(**inputs, prefix_length=2)
    with pytest.raises(ValueError, match="`output_attentions=True`"):
        model(**inputs, output_attentions=True)


@pytest.mark.parametrize("name", ["set-isab", "perceiver-inputs"])
def test_softmax_under_another_attn_implementation_is_refused_by_name(name):
    model = build(name)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"attn_implementation \['sdpa', 'eager'\].*'flex_attention'"):
        model(**packed_inputs(sets_of_points([3, 4])))


@pytest.mark.parametrize("name", ["set-isab", "set-sab", "perceiver-inputs"])
def test_eager_equals_sdpa_on_a_packed_batch(name):
    model = build(name)
    inputs = packed_inputs(sets_of_points())
    sdpa = model(**inputs).last_hidden_state
    model.config._attn_implementation = "eager"
    torch.testing.assert_close(model(**inputs).last_hidden_state, sdpa, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("name", ["set-isab", "set-sab", "perceiver-inputs"])
def test_attention_dropout_applies_to_a_packed_batch(name, attention_type, feature_map):
    model = build(name, attention_type, feature_map, attention_probs_dropout_prob=0.5).train()
    inputs = packed_inputs(sets_of_points())
    torch.manual_seed(0)
    first = model(**inputs).last_hidden_state
    torch.manual_seed(0)
    again = model(**inputs).last_hidden_state
    evaluated = model.eval()(**inputs).last_hidden_state
    assert torch.isfinite(first).all()
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert (first - evaluated).abs().max() > 1e-3  # dropped: not the evaluation output


def test_gradient_checkpointing_and_hidden_states_run_on_a_packed_batch():
    model = build("set-classify-pma").train()
    model.activation_checkpointing_enable()  # transformers v5's name of gradient_checkpointing_enable
    inputs = packed_inputs(sets_of_points())
    out = model(**inputs, labels=torch.tensor([0, 1, 2, 0, 1]), output_hidden_states=True)
    out.loss.backward()
    assert all(h.shape == (1, sum(SIZES), 32) for h in out.hidden_states)


class LargestTensor(TorchDispatchMode):
    """The largest number of elements of any tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if torch.is_tensor(t):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("name", ["set-isab", "perceiver-inputs"])
def test_no_tensor_grows_with_the_square_of_the_packed_row(name, attention_type, feature_map):
    model = build(name, attention_type, feature_map, intermediate_size=32)
    sizes = [300, 7, 450, 120, 1, 64]  # 942 elements: a total x total mask would hold 887,364
    with LargestTensor() as largest:
        model(**packed_inputs(sets_of_points(sizes))).last_hidden_state.sum().backward()
    assert largest.largest <= 942 * 32 * 4  # the widest per-element tensor, (1, total, 4 x hidden), or less


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_sab_attention_grows_with_each_sets_square_not_the_largest(attention_type, feature_map):
    model = build("set-sab", attention_type, feature_map, intermediate_size=32)
    sizes = [300, 7, 450, 120, 1, 64]
    blocked = sum((-(-n // BLOCK_SIZE) * BLOCK_SIZE) ** 2 for n in sizes)  # 393,216 (padded: 6 x 450^2 = 1,215,000)
    with LargestTensor() as largest:
        model(**packed_inputs(sets_of_points(sizes))).last_hidden_state.sum().backward()
    assert largest.largest <= max(4 * blocked, 942 * 32 * 4)  # 4 heads


def test_blocks_cover_every_element_once_with_or_without_read_lengths():
    sizes = [1, 5, BLOCK_SIZE, 2 * BLOCK_SIZE + 2, 17]
    cu = boundaries(sizes)
    total = sum(sizes)
    read = SetBlocks.from_packing(Packing(seq_idx_from_boundaries(cu, total), cu, tuple(sizes)), "cpu")
    bound = SetBlocks.from_packing(Packing(seq_idx_from_boundaries(cu, total), cu), "cpu")
    assert read.index.shape[0] == sum(-(-n // BLOCK_SIZE) for n in sizes) == 7
    assert read.index.shape[0] <= bound.index.shape[0] <= -(-total // BLOCK_SIZE) + len(sizes)
    for blocks in (read, bound):
        assert sorted(blocks.index[blocks.valid].tolist()) == list(range(total))
        assert torch.equal(blocks.index.flatten()[blocks.slot], torch.arange(total))  # the way back
        sets = blocks.block_set[:, None].expand_as(blocks.index)[blocks.valid]
        assert torch.equal(sets, blocks.seq_idx[blocks.index[blocks.valid]])  # a block holds one set's elements
        queries, keys = blocks.pairs()  # every block with every block of its set, once
        assert sorted(zip(queries.tolist(), keys.tolist())) == [
            (q, k) for q in range(7) for k in range(7) if blocks.block_set[q] == blocks.block_set[k]]


@pytest.mark.parametrize("name", ["set-isab", "set-sab", "set-classify-mean", "perceiver-classify-pma", "set-mixture"])
def test_a_packed_training_step_reads_back_nothing_but_the_input_checks(name, monkeypatch):
    model = build(name, attention_probs_dropout_prob=0.1).train()
    inputs = packed_inputs(sets_of_points())
    if "classify" in name:
        inputs["labels"] = torch.tensor([0, 1, 2, 0, 1])
    with host_reads(monkeypatch) as sites:
        output = model(**inputs)
        (output.loss if output.get("loss") is not None else output.last_hidden_state.sum()).backward()
    assert sites and all(site.split(":")[0] in ("checks.py", "packing.py") for site in sites), dict(sites)


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("name", ["set-isab", "perceiver-inputs"])
def test_a_packed_batch_runs_under_bfloat16_autocast(name, attention_type, feature_map):
    model = build(name, attention_type, feature_map)
    inputs = packed_inputs(sets_of_points())
    exact = model(**inputs).last_hidden_state
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(**inputs).last_hidden_state
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), exact, atol=0.1, rtol=0.05)  # bfloat16's 8 bits of mantissa

"""Causal linear attention over packed rows (`seq_idx`, hf_settransformer/linear_ops.py): every sequence of a row gets
what it gets alone, outputs and gradients of q, k, v and the decay (elu and exp, no decay, a fixed and a gated one,
key padding and key dropout), with boundaries inside a chunk and on a chunk's edge, sequences of one token and longer
than a chunk; against the float64 reference; the returned state; one sequence as no `seq_idx`; a trace under
torch.compile(fullgraph=True); the refusals. The Triton kernels' packed rows: tests/ops/test_linear_triton.py."""

import pytest
import torch

from hf_settransformer import linear_ops
from hf_settransformer.cache import LinearAttentionState
from hf_settransformer.linear_naive import naive_packed_causal_linear_attention, sequence_ids
from hf_settransformer.linear_ops import (
    causal_linear_attention,
    linear_attention_step,
    prefix_causal_linear_attention,
)

H, D, E = 2, 5, 3
CHUNK = 8
# sequence lengths per row, chunks of 8: row 0 has a boundary inside the first chunk (3 | 5), one on the first
# chunk's edge (8), two sequences of one token, one longer than a chunk (13) that crosses two edges; row 1 one
# sequence of a chunk and one of 19, and a length that is no multiple of the chunk
LAYOUTS = [[3, 5, 1, 1, 13, 4], [8, 19]]
DECAYS = [None, "fixed", "gated"]


@pytest.fixture(autouse=True)
def _fp32_dots():
    """fp32 matmuls (no tf32): the 1e-5 comparisons are of fp32 arithmetic."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(precision)


def _seq_idx(layouts, dtype=torch.int64):
    """(b, n) sequence ids from the rows' sequence lengths, as position ids restarting at 0 would give them."""
    return torch.stack(
        [torch.cat([torch.full((n,), i, dtype=dtype) for i, n in enumerate(lengths)]) for lengths in layouts]
    )


def _inputs(layouts, decay=None, padding=False, drop=False, seed=0, big_first=False):
    """Leaves q, k, v, a log-decay (fixed: one per head; gated: one per position) and the key mask and dropout's kept
    keys, for rows of the given sequence lengths. `big_first`: the first sequence's keys 60 nats above the rest (a
    maximum that must not reach the next sequences)."""
    g = torch.Generator().manual_seed(seed)
    b, n = len(layouts), sum(layouts[0])
    q, k, v = torch.randn(b, H, n, D, generator=g), torch.randn(b, H, n, D, generator=g), torch.randn(b, H, n, E, generator=g)
    if big_first:
        k[:, :, : layouts[0][0]] += 60.0
    logd = None
    if decay == "fixed":
        logd = torch.tensor([-0.05, -0.7])[None, :, None].expand(b, H, n).clone()
    elif decay == "gated":
        logd = -torch.rand(b, H, n, generator=g) * 2
    mask = torch.rand(b, n, generator=g) > 0.25 if padding else None
    kept = torch.rand(b, H, n, generator=g) > 0.2 if drop else None
    leaves = [x.requires_grad_() for x in (q, k, v)] + ([] if logd is None else [logd.requires_grad_()])
    return leaves, mask, kept


def _alone(leaves, mask, kept, layouts, feature_map, with_decay):
    """Each sequence run alone through the op (rows of b = 1), the outputs put back in place -> (b, h, n, e)."""
    q, k, v = leaves[:3]
    logd = leaves[3] if with_decay else None
    rows = []
    for row, lengths in enumerate(layouts):
        pieces, start = [], 0
        for length in lengths:
            cut = (slice(row, row + 1), slice(None), slice(start, start + length))
            out, _ = causal_linear_attention(
                q[cut], k[cut], v[cut], None if mask is None else mask[row : row + 1, start : start + length],
                feature_map=feature_map, chunk_size=CHUNK, drop=None if kept is None else kept[cut],
                decay=None if logd is None else logd[cut],
            )  # fmt: skip
            pieces.append(out)
            start += length
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0)


def _grads(out, leaves):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    return torch.autograd.grad((out * weight).sum(), leaves)


@pytest.mark.parametrize("extra", ["plain", "padding", "dropout"])
@pytest.mark.parametrize("decay", DECAYS, ids=["no_decay", "fixed", "gated"])
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_packed_rows_give_each_sequence_what_it_gets_alone(feature_map, decay, extra):
    """Outputs and gradients of q, k, v and the decay within 1e-5 of each sequence run alone, and the outputs of the
    float64 reference; exp with a first sequence whose keys lie 60 nats above the others' (its maxima must restart)."""
    leaves, mask, kept = _inputs(
        LAYOUTS, decay, padding=extra == "padding", drop=extra == "dropout", big_first=feature_map == "exp"
    )
    seq_idx = _seq_idx(LAYOUTS)
    logd = leaves[3] if decay else None
    packed, _ = causal_linear_attention(
        *leaves[:3], mask, feature_map=feature_map, chunk_size=CHUNK, drop=kept, decay=logd, seq_idx=seq_idx
    )
    alone = _alone(leaves, mask, kept, LAYOUTS, feature_map, decay is not None)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    want = naive_packed_causal_linear_attention(*leaves[:3], seq_idx, mask, feature_map, logd, kept)
    torch.testing.assert_close(packed.double(), want, atol=1e-5, rtol=1e-5)
    for got, expected in zip(_grads(packed, leaves), _grads(alone, leaves)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_a_later_sequence_with_large_keys_leaves_the_earlier_ones_alone(feature_map):
    """exp's maxima over each sequence alone: a sequence 200 nats above the one before it in the same chunk (the chunk
    is steep: its exact path also restarts at the boundary), and the one after it again small."""
    layouts = [[5, 2, 9]]
    leaves, _, _ = _inputs(layouts, "gated")
    with torch.no_grad():
        leaves[1][:, :, 5:7] += 200.0
    seq_idx = _seq_idx(layouts)
    packed, _ = causal_linear_attention(
        *leaves[:3], feature_map=feature_map, chunk_size=CHUNK, decay=leaves[3], seq_idx=seq_idx
    )
    alone = _alone(leaves, None, None, layouts, feature_map, True)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    for got, expected in zip(_grads(packed, leaves), _grads(alone, leaves)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decay", DECAYS, ids=["no_decay", "fixed", "gated"])
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_the_state_returned_is_the_last_sequences(feature_map, decay):
    """The state after a packed row is the state after its last sequence alone (kv, z and exp's key maxima), and its
    gradients reach only that sequence."""
    layouts = [[6, 9, 7]]
    leaves, mask, _ = _inputs(layouts, decay, padding=True)
    logd = leaves[3] if decay else None
    _, state = causal_linear_attention(
        *leaves[:3], mask, feature_map=feature_map, chunk_size=CHUNK, decay=logd, seq_idx=_seq_idx(layouts)
    )
    last = (slice(None), slice(None), slice(15, 22))
    _, alone = causal_linear_attention(
        *(x[last] for x in leaves[:3]), mask[:, 15:], feature_map=feature_map, chunk_size=CHUNK,
        decay=None if logd is None else logd[last],
    )  # fmt: skip
    torch.testing.assert_close(state.kv, alone.kv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.z, alone.z, atol=1e-5, rtol=1e-5)
    if feature_map == "exp":
        torch.testing.assert_close(state.k_max, alone.k_max, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(state.kv.sum() + state.z.sum(), leaves[1:3])
    for grad in grads:
        assert grad[:, :, :15].abs().max() == 0 and grad[:, :, 15:].abs().max() > 0


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_one_sequence_is_no_seq_idx(feature_map):
    """A row that is one sequence (int32 ids) gives what seq_idx=None gives: outputs, state and gradients."""
    leaves, mask, kept = _inputs([[27], [27]], "gated", padding=True, drop=True)
    seq_idx = torch.zeros(2, 27, dtype=torch.int32)
    runs = []
    for ids in (seq_idx, None):
        out, state = causal_linear_attention(
            *leaves[:3], mask, feature_map=feature_map, chunk_size=CHUNK, drop=kept, decay=leaves[3], seq_idx=ids
        )
        runs.append((out, state.kv, state.z, *_grads(out, leaves)))
    for got, expected in zip(*runs):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_sequences_are_where_the_ids_change():
    """A new sequence wherever seq_idx changes: ids need not count from 0 or by one."""
    seq_idx = torch.tensor([[7, 7, 9, 9, 9, 2, 2], [0, 0, 0, 0, 0, 0, 0]])
    assert sequence_ids(seq_idx).tolist() == [[0, 0, 1, 1, 1, 2, 2], [0] * 7]
    leaves, _, _ = _inputs([[2, 3, 2], [7]])
    got, _ = causal_linear_attention(*leaves[:3], chunk_size=4, seq_idx=seq_idx)
    want, _ = causal_linear_attention(*leaves[:3], chunk_size=4, seq_idx=_seq_idx([[2, 3, 2], [7]]))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 19])
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_a_token_alone_reads_only_itself(feature_map, n):
    """Every token its own sequence (rows of one token too): each query sees its own key only, so its output is its
    value, whatever the decay; a masked token's query sees nothing (0)."""
    leaves, _, _ = _inputs([[1] * n], "gated")
    q, k, v, logd = leaves
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, n // 2] = False
    seq_idx = torch.arange(n, dtype=torch.int32)[None]
    out, _ = causal_linear_attention(q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK, decay=logd, seq_idx=seq_idx)
    torch.testing.assert_close(out, v.detach() * mask[:, None, :, None], atol=1e-6, rtol=1e-6)
    assert sequence_ids(seq_idx).tolist() == [list(range(n))]


@pytest.mark.parametrize("feature_map", ["elu", pytest.param("exp", marks=pytest.mark.slow)])
def test_packed_rows_compile_into_one_graph_on_the_cpu(feature_map):
    """No host read and no data-dependent branch: torch.compile(fullgraph=True) traces the packed PyTorch op (forward
    and backward, AOT autograd) and gives eager mode's outputs and gradients."""
    leaves, mask, kept = _inputs(LAYOUTS, "gated", padding=True, drop=True, big_first=True)
    seq_idx = _seq_idx(LAYOUTS)

    def run(q, k, v, logd):
        out, state = causal_linear_attention(
            q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK, drop=kept, decay=logd, seq_idx=seq_idx
        )
        return out, state.kv

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    eager, got = run(*leaves), compiled(*leaves)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    for a, b in zip(_grads(got[0], leaves), _grads(eager[0], leaves)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_packed_rows_compile_with_inductor_on_the_cpu(feature_map):
    """The same through Inductor (the CPU's compiled path runs the PyTorch op itself)."""
    leaves, mask, _ = _inputs(LAYOUTS, "gated", padding=True, big_first=True)
    seq_idx = _seq_idx(LAYOUTS)

    def run(q, k, v, logd):
        return causal_linear_attention(
            q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK, decay=logd, seq_idx=seq_idx
        )[0]

    torch._dynamo.reset()
    got, eager = torch.compile(run, fullgraph=True)(*leaves), run(*leaves)
    torch.testing.assert_close(got, eager, atol=1e-5, rtol=1e-5)
    for a, b in zip(_grads(got, leaves), _grads(eager, leaves)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bad_seq_idx_is_refused_by_name():
    q = torch.randn(2, H, 6, D)
    for bad, shown in [
        (torch.zeros(2, 6), "torch.float32 of shape (2, 6)"),
        (torch.zeros(2, 5, dtype=torch.int64), "torch.int64 of shape (2, 5)"),
        (torch.zeros(1, 6, dtype=torch.int32), "torch.int32 of shape (1, 6)"),
        ([0, 0, 1], "a list"),
    ]:
        with pytest.raises(ValueError, match=r"`seq_idx` of causal_linear_attention must be an int32 or int64 tensor "
                           r"of shape \(2, 6\) \(batch, tokens\)") as info:  # fmt: skip
            causal_linear_attention(q, q, q, seq_idx=bad)
        assert shown in str(info.value)


def test_packed_rows_carry_no_cache():
    q = torch.randn(1, H, 6, D)
    state = LinearAttentionState(kv=torch.zeros(1, H, D, D), z=torch.zeros(1, H, D))
    with pytest.raises(ValueError, match="`seq_idx` \\(a packed batch\\) carries no cache: pass state=None"):
        causal_linear_attention(q, q, q, None, state, seq_idx=torch.zeros(1, 6, dtype=torch.int64))


def test_the_prefix_op_and_the_step_refuse_seq_idx():
    q = torch.randn(1, H, 1, D)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="`prefix_causal_linear_attention` does not take `seq_idx`"):
        prefix_causal_linear_attention(q, q, q, seq_idx=ids)
    with pytest.raises(ValueError, match="`linear_attention_step` does not take `seq_idx`"):
        linear_attention_step(q, q, q, seq_idx=ids)


def test_packed_rows_without_seq_idx_support_in_the_kernels_stay_in_pytorch(monkeypatch):
    """Where the fused kernels do not take `seq_idx`, `use_triton` says no for a packed row (never a kernel that would
    attend across its boundaries), and yes for the same inputs without one."""
    from hf_settransformer.feature_maps import get_feature_map

    monkeypatch.setattr(linear_ops, "fused_linear_attention_available", lambda *a, **k: True)
    monkeypatch.setattr(linear_ops, "fused_sequences_available", lambda: False)
    q = torch.randn(1, H, 4, D)
    fmap = get_feature_map("elu")
    assert linear_ops.use_triton(q, q, q, None, fmap)
    assert not linear_ops.use_triton(q, q, q, None, fmap, seq_idx=torch.zeros(1, 4, dtype=torch.int64))

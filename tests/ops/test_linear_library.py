"""The linear ops as `torch.library` custom ops (hf_settransformer/linear_library.py): `torch.library.opcheck` on every
op, with both implementations (PyTorch; Triton in triton's interpreter on CPU tensors), on inputs with padding, key
dropout, a carried state, a decay, leading keys, packed sequences (`seq_idx`), one token, odd head dims and lengths
that are not a multiple of the chunk; and compiled graphs that hold the ops whole.

A compiled model on any device but the CPU goes through the ops (`linear_ops.through_op`): on the meta device the
graphs AOT autograd hands Inductor are read as a GPU's would be (the op, forward and backward, and no scan of the
PyTorch ops), for every family x feature map x decay; on the CPU, forcing the route, compiled training steps and
decoding steps give eager mode's numbers through either implementation.
"""

import pytest
import torch
from tests.helpers import FAMILIES, VOCAB, family_classes, make_model, tiny_config
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified
from transformers import AutoModelForCausalLM

from hf_settransformer import linear_library, linear_ops, linear_torch

B, H, D, E = 2, 2, 5, 3  # odd head dims
CHUNK = 8
OPS = {name: getattr(torch.ops.hfst, name) for name in ["causal_linear_attention", "linear_attention"]}


def _triton_interpreted():
    try:
        import triton
    except ImportError:
        return False
    return bool(triton.knobs.runtime.interpret)


FUSED = [  # the Triton implementation in triton's interpreter: seconds a case, so out of the fast tier
    False,
    pytest.param(
        True,
        marks=[
            pytest.mark.skipif(not _triton_interpreted(), reason="triton's interpreter runs CPU tensors"),
            pytest.mark.slow,
        ],
    ),
]
FUSED_IDS = ["pytorch", "triton"]


def _randn(*shape, seed, grad=True):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def _mask(b, m, seed):
    """Random key padding, the first key of row 0 masked (its first query sees none)."""
    mask = torch.rand(b, m, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[0, 0] = False
    return mask


def _drop(b, h, m, seed):
    return torch.rand(b, h, m, generator=torch.Generator().manual_seed(seed)) > 0.2


def _state(feature_map, seed, grad=True):
    kv0, z0 = _randn(B, H, D, E, seed=seed).abs(), (_randn(B, H, D, seed=seed + 1, grad=False).abs() + 1)
    m0 = _randn(B, H, D, seed=seed + 2, grad=False) if feature_map == "exp" else None
    return kv0.detach().requires_grad_(grad), z0.requires_grad_(grad), m0


def _logd(b, h, m, seed):
    return (-torch.rand(b, h, m, generator=torch.Generator().manual_seed(seed)) * 2).requires_grad_()


def _seq_idx(b, n):
    """Packed rows: sequences of 3, 9 (across a chunk edge), 1 and the rest in row 0, one sequence in row 1."""
    seq_idx = torch.zeros(b, n, dtype=torch.int32)
    seq_idx[0, 3:], seq_idx[0, 12:], seq_idx[0, 13:] = 1, 2, 3
    return seq_idx


# (q length, k length, prefix_length, mask, drop, state, decay, packed)
CAUSAL_CASES = {
    "padded_dropout": (19, 19, 0, True, True, False, False, False),
    "state_decay": (19, 19, 0, True, False, True, True, False),
    "leading_keys_prefix": (11, 15, 4, True, True, True, True, False),
    "one_token": (1, 1, 0, False, False, True, True, False),
    "packed": (19, 19, 0, True, False, False, False, True),
    "packed_dropout_decay": (19, 19, 0, True, True, False, True, True),
}


def _causal_args(case, feature_map, fused):
    n, m, prefix, has_mask, has_drop, has_state, has_decay, packed = CAUSAL_CASES[case]
    q, k, v = _randn(B, H, n, D, seed=1), _randn(B, H, m, D, seed=2), _randn(B, H, m, E, seed=3)
    kv0, z0, m0 = _state(feature_map, 4) if has_state else (None, None, None)
    mask = _mask(B, m, 7) if has_mask else None
    drop = _drop(B, H, m, 8) if has_drop else None
    logd = _logd(B, H, m, 9) if has_decay else None
    seq_idx = _seq_idx(B, n) if packed else None
    return (q, k, v, mask, drop, kv0, z0, m0, logd, seq_idx, feature_map, CHUNK, prefix, fused)


@pytest.mark.parametrize("fused", FUSED, ids=FUSED_IDS)
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
@pytest.mark.parametrize("case", list(CAUSAL_CASES))
def test_causal_op_passes_opcheck(case, feature_map, fused):
    """Schema, fake tensors, the autograd registration and AOT dispatch (static and dynamic shapes) of the causal op;
    then its backward op's on the gradients a backward hands it."""
    args = _causal_args(case, feature_map, fused)
    torch.library.opcheck(OPS["causal_linear_attention"], args)
    out, kv1, z1, _ = OPS["causal_linear_attention"](*args)
    inputs = [x.detach() if torch.is_tensor(x) else x for x in args]
    grads = [torch.randn_like(x) for x in (out, kv1, z1)]
    backward_args = (*grads, *inputs[:10], kv1.detach(), z1.detach(), *inputs[10:])
    torch.library.opcheck(torch.ops.hfst.causal_linear_attention_backward, backward_args)


@pytest.mark.parametrize("fused", FUSED, ids=FUSED_IDS)
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
@pytest.mark.parametrize(("n", "m", "keep"), [(7, 19, "keys"), (7, 19, "per_head"), (1, 1, "none")])
def test_noncausal_op_passes_opcheck(n, m, keep, feature_map, fused):
    q, k, v = _randn(B, H, n, D, seed=11), _randn(B, H, m, D, seed=12), _randn(B, H, m, E, seed=13)
    keep = {"keys": _mask(B, m, 14), "per_head": _drop(B, H, m, 15), "none": None}[keep]
    args = (q, k, v, keep, feature_map, fused)
    torch.library.opcheck(OPS["linear_attention"], args)
    out, *sums = OPS["linear_attention"](*args)
    inputs = [x.detach() for x in (q, k, v)]
    torch.library.opcheck(
        torch.ops.hfst.linear_attention_backward, (torch.randn_like(out), *inputs, keep, *sums, feature_map, fused)
    )


@pytest.mark.parametrize("fused", FUSED, ids=FUSED_IDS)
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
@pytest.mark.parametrize("with_state", [False, True], ids=["first_token", "with_state"])
def test_step_op_passes_opcheck(with_state, feature_map, fused):
    """The one-token op (no autograd: generation), with padding, key dropout and a decay."""
    q, k, v = (_randn(B, H, 1, dim, seed=s, grad=False) for s, dim in ((21, D), (22, D), (23, E)))
    kv0, z0, m0 = _state(feature_map, 24, grad=False) if with_state else (None, None, None)
    logd = _logd(B, H, 1, 25).detach()
    args = (q, k, v, _mask(B, 1, 26) | True, _drop(B, H, 1, 27), kv0, z0, m0, logd, feature_map, fused)
    torch.library.opcheck(torch.ops.hfst.linear_attention_step, args)


def test_ops_give_the_linear_ops_results():
    """Through the op and inline, the same numbers: `linear_ops` routed through `linear_library` (as compiled on a GPU)
    equals its inline PyTorch path, outputs, states and gradients."""
    args = _causal_args("leading_keys_prefix", "exp", False)
    q, k, v, mask, drop, kv0, z0, m0, logd, _, _, _, prefix, _ = args
    from hf_settransformer.cache import LinearAttentionState

    def run(through):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(linear_ops, "through_op", lambda q, fused: through)
            out, state = linear_ops.prefix_causal_linear_attention(
                q, k, v, mask, LinearAttentionState(kv0, z0, m0), feature_map="exp", chunk_size=CHUNK,
                prefix_length=prefix, drop=drop, decay=logd,
            )  # fmt: skip
        grads = torch.autograd.grad((out.sum(), state.kv.sum()), (q, k, v, kv0, z0, logd))
        return out, state.kv, state.z, state.k_max, *grads

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_packed_rows_through_the_op_give_the_inline_results(feature_map):
    """`seq_idx` through the op and inline: the same outputs, last sequence's state and gradients."""
    q, k, v, mask, drop, _, _, _, logd, seq_idx = _causal_args("packed_dropout_decay", feature_map, False)[:10]

    def run(through):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(linear_ops, "through_op", lambda q, fused: through)
            out, state = linear_ops.causal_linear_attention(
                q, k, v, mask, feature_map=feature_map, chunk_size=CHUNK, drop=drop, decay=logd, seq_idx=seq_idx
            )
        grads = torch.autograd.grad((out.sum(), state.kv.sum()), (q, k, v, logd))
        return out, state.kv, state.z, *grads

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_causal_op_refuses_packed_rows_with_leading_keys():
    args = list(_causal_args("leading_keys_prefix", "elu", False))
    args[5:8] = [None, None, None]
    args[9] = torch.zeros(B, args[0].shape[2], dtype=torch.int64)
    with pytest.raises(ValueError, match="`seq_idx`.*only with one key per query and no prefix"):
        OPS["causal_linear_attention"](*args)


def test_a_copy_of_the_files_registers_its_own_namespace():
    """The installed package's ops are `torch.ops.hfst`; a checkpoint's copy of the files, imported as remote code
    under another module name, gets a namespace of its own (registering `hfst::` twice would raise)."""
    import importlib.util
    import sys
    from pathlib import Path

    assert linear_library.NAMESPACE == "hfst"
    folder = Path(linear_library.__file__).parent
    name = "copied_checkpoint_code"
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        copy = importlib.import_module(f"{name}.linear_library")
        assert copy.NAMESPACE not in ("hfst", linear_library.NAMESPACE)
        assert hasattr(getattr(torch.ops, copy.NAMESPACE), "causal_linear_attention")
    finally:
        for key in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
            del sys.modules[key]


# ---------------------------------------------------------------------------------------------------------------
# compiled graphs


def _recording_backend(graphs):
    """AOT autograd's forward and backward graphs, as Inductor receives them, recorded and run as they are."""

    def compiler(graph, example_inputs):
        graphs.append(str(graph.code))
        return make_boxed_func(graph.forward)

    def backend(graph, example_inputs):
        return aot_module_simplified(graph, example_inputs, fw_compiler=compiler, bw_compiler=compiler)

    return backend


LM_CASES = [(f, m, d) for f in FAMILIES for m in ("elu", "exp") for d in ("none", "fixed", "gated")]
LM_IDS = [f"{f}-{m}-{d}" for f, m, d in LM_CASES]


def _lm(family, feature_map, decay):
    config = tiny_config(family, "linear", feature_map, linear_attention_decay=decay)
    return make_model(family_classes(config)[AutoModelForCausalLM], config).train()


def _training_step(model, fn, ids):
    model.zero_grad()
    loss = fn(ids)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_compiled_step_holds_the_ops_and_equals_eager(model):
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    expected, grads = _training_step(model, lambda ids: model(input_ids=ids, labels=ids).loss, ids)
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(lambda ids: model(input_ids=ids, labels=ids).loss, fullgraph=True,
                             backend=_recording_backend(graphs))  # fmt: skip
    got, compiled_grads = _training_step(model, compiled, ids)
    forward, backward = graphs
    assert "torch.ops.hfst.causal_linear_attention.default" in forward
    for op in ["causal_linear_attention", "linear_attention"]:
        assert (f"torch.ops.hfst.{op}.default" in forward) == (f"torch.ops.hfst.{op}_backward.default" in backward)
    for graph in graphs:
        assert "cummax" not in graph and "amax" not in graph  # no scan or stabiliser of the PyTorch ops is left
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert compiled_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_compiled_ops_off_the_cpu_only():
    """Under torch.compile the ops are taken on any device but the CPU (there Inductor compiles the PyTorch ops), and
    in eager mode only where the Triton kernels run."""

    @torch.compile(fullgraph=True, backend="eager")
    def compiled(q):
        return torch.tensor(linear_ops.through_op(q, False))

    assert not linear_ops.through_op(torch.zeros(1, device="meta"), False)
    assert linear_ops.through_op(torch.zeros(1), True)
    assert compiled(torch.zeros(1, device="meta")) and not compiled(torch.zeros(1))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "feature_map", "decay"), LM_CASES, ids=LM_IDS)
def test_compiled_training_step_holds_the_ops_and_equals_eager(family, feature_map, decay, monkeypatch):
    """A training step (loss, backward) of every family's LM head x feature map x decay, compiled with fullgraph
    through the ops (as on a GPU; forced here on the CPU, their PyTorch implementation): AOT autograd's forward graph
    (what Inductor compiles) calls the linear op and its backward graph the backward op, as themselves, with no scan
    of the PyTorch ops left in either (Inductor's code for those failed on triton 3.6); loss and gradients are eager
    mode's (inline PyTorch)."""
    model = _lm(family, feature_map, decay)
    monkeypatch.setattr(linear_ops, "through_op", lambda q, fused: True if torch.compiler.is_compiling() else fused)
    _assert_compiled_step_holds_the_ops_and_equals_eager(model)


@pytest.mark.slow
@pytest.mark.skipif(not _triton_interpreted(), reason="triton's interpreter runs CPU tensors")
@pytest.mark.parametrize(("family", "feature_map", "decay"), [
    ("decoder", "elu", "gated"), ("encoder", "exp", "none"), ("set_transformer", "exp", "fixed"),
    ("perceiver_io", "elu", "none"),
])  # fmt: skip
def test_compiled_training_step_with_the_triton_kernels_equals_eager(family, feature_map, decay, monkeypatch):
    """The same with the Triton kernels (`HFST_FORCE_TRITON=1`, triton's interpreter on the CPU) on both sides: the
    compiled graph's ops run the kernels, forward and backward, and give eager mode's loss and gradients."""
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    monkeypatch.delenv("HFST_DISABLE_TRITON", raising=False)
    _assert_compiled_step_holds_the_ops_and_equals_eager(_lm(family, feature_map, decay))


@pytest.mark.slow
@pytest.mark.skipif(not _triton_interpreted(), reason="triton's interpreter runs CPU tensors")
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_compiled_decoding_step_holds_the_step_op(feature_map, monkeypatch):
    """A decoding step with the in-place recurrent state, compiled with fullgraph where the Triton kernels run
    (forced): one graph for every step, calling the step op, and eager mode's logits."""
    from torch._dynamo.testing import CompileCounter
    from tests.helpers import decode, decoder

    from hf_settransformer.cache import LinearAttentionCache

    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    monkeypatch.delenv("HFST_DISABLE_TRITON", raising=False)
    model = decoder("linear", feature_map, linear_attention_decay="gated")
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = decode(model, model.forward, LinearAttentionCache(config=model.config), ids, None)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(str(graph.code))
        return graph.forward

    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(model.forward, fullgraph=True, backend=lambda g, x: (counter(g, x), backend(g, x))[1])
    got = decode(model, step, LinearAttentionCache(config=model.config, static=True), ids, None)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1 and "hfst.linear_attention_step" in graphs[0]


def test_the_pytorch_implementation_inside_the_op_reads_nothing_back(monkeypatch):
    """Inside the op (what a compiled graph on a GPU runs in fp32, and a CUDA graph may replay) the exp map's exact
    path for a steep chunk is selected on the device: no host read, and the inline op's outputs and gradients (which
    decides with one read)."""
    from tests.helpers import host_reads

    args = list(_causal_args("state_decay", "exp", False))
    args[1] = (args[1].detach() + 200.0 * (torch.arange(19) == 13)[:, None]).requires_grad_()  # a steep chunk
    q, k, v, mask, drop, kv0, z0, m0, logd = args[:9]
    with host_reads(monkeypatch) as sites:
        through = OPS["causal_linear_attention"](*args)
    assert not sites
    from hf_settransformer.cache import LinearAttentionState
    from hf_settransformer.feature_maps import FEATURE_MAPS

    inline, state = linear_torch.causal_linear_attention(
        q, k, v, mask, LinearAttentionState(kv0, z0, m0), FEATURE_MAPS["exp"], CHUNK, drop, logd
    )
    for a, b in zip(through[:3], (inline, state.kv, state.z)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    got = torch.autograd.grad(through[0].sum(), (q, k, v, kv0, z0, logd))
    want = torch.autograd.grad(inline.sum(), (q, k, v, kv0, z0, logd))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "feature_map"), [("decoder", "exp"), ("encoder", "elu")])
def test_export_through_the_ops_equals_eager(family, feature_map, monkeypatch):
    """`torch.export` of a base model whose linear attention goes through the ops (as compiled on a GPU): the
    exported program calls them as themselves and gives eager mode's output."""
    from transformers import AutoModel

    config = tiny_config(family, "linear", feature_map)
    model = make_model(family_classes(config)[AutoModel], config)
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    kwargs["attention_mask"][1, 6:] = 0
    if family == "decoder":
        kwargs["use_cache"] = False
    with torch.no_grad():
        expected = model(**kwargs).last_hidden_state
    monkeypatch.setattr(linear_ops, "through_op", lambda q, fused: True)
    exported = torch.export.export(model, args=(), kwargs=kwargs)
    assert "torch.ops.hfst." in str(exported.graph_module.code)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(**kwargs).last_hidden_state, expected, atol=1e-5, rtol=1e-5)


def _body_calls(feature_map, fused):
    """(name, body, args) for every op body (the functions the ops run), on CPU tensors: causal with a state and a
    decay and on packed rows (exp: a key 200 nats above the rest, a steep chunk), with leading keys and a prefix, their
    backward,
    non-causal and its backward, the step."""
    calls = []
    for case in ["state_decay", "leading_keys_prefix", "packed_dropout_decay"]:
        args = [x.detach() if torch.is_tensor(x) else x for x in _causal_args(case, feature_map, fused)]
        if case != "leading_keys_prefix":
            args[1] = args[1] + 200.0 * (torch.arange(args[1].shape[2]) == 13)[:, None]
        out, kv1, z1, _ = OPS["causal_linear_attention"](*args)
        grads = [torch.randn_like(x) for x in (out, kv1, z1)]
        calls.append((f"causal-{case}", linear_library._causal_body, args))
        backward = (*grads, *args[:10], kv1, z1, *args[10:])
        calls.append((f"causal_backward-{case}", linear_library._causal_backward_body, backward))
    q, k, v = (
        _randn(B, H, 7, D, seed=11, grad=False),
        _randn(B, H, 19, D, seed=12, grad=False),
        _randn(B, H, 19, E, seed=13, grad=False),
    )
    keep = _drop(B, H, 19, 15)
    out, *sums = OPS["linear_attention"](q, k, v, keep, feature_map, fused)
    calls.append(("noncausal", linear_library._noncausal_body, (q, k, v, keep, feature_map, fused)))
    noncausal_backward = (torch.randn_like(out), q, k, v, keep, *sums, feature_map, fused)
    calls.append(("noncausal_backward", linear_library._noncausal_backward_body, noncausal_backward))
    q1, k1, v1 = (_randn(B, H, 1, dim, seed=s, grad=False) for s, dim in ((21, D), (22, D), (23, E)))
    kv0, z0, m0 = _state(feature_map, 24, grad=False)
    step = (q1, k1, v1, _mask(B, 1, 26) | True, _drop(B, H, 1, 27), kv0, z0, m0, _logd(B, H, 1, 25).detach())
    calls.append(("step", linear_library._step_body, (*step, feature_map, fused)))
    return calls


@pytest.mark.parametrize("fused", FUSED, ids=FUSED_IDS)
@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_op_bodies_make_no_tensor_off_the_inputs_device_and_read_nothing_back(feature_map, fused, monkeypatch):
    """What an op runs where a compiled graph calls it (dispatch leaves the default-device probe and the host-read
    counter outside an op, so its body is probed directly): called under `torch.device("meta")` on CPU tensors, each
    body makes every tensor on the inputs' device (one made on the default device would land on "meta" and fail),
    and none reads a value back to the host (a CUDA graph may replay it)."""
    from tests.helpers import host_reads

    for name, body, args in _body_calls(feature_map, fused):
        with host_reads(monkeypatch) as sites, torch.device("meta"):
            outputs = body(*args)
        assert not sites, (name, dict(sites))
        assert all(x.device.type == "cpu" for x in outputs), name


@pytest.mark.slow
def test_compiled_training_step_with_the_optimizer_step_equals_eager(monkeypatch):
    """forward and loss through the ops compiled with fullgraph (AOT autograd's backward graph runs `backward()`),
    then the optimizer's step compiled (torch's own optimizer wrapper breaks its graph once, on purpose): two steps give
    eager mode's updated weights. SGD with momentum, whose update is linear in the gradient: AdamW's normalised update
    turns a gradient of 3.5e-9 that the compiled step rounds to 3.8e-9 into weights 1.4e-4 apart."""
    monkeypatch.setattr(linear_ops, "through_op", lambda q, fused: True if torch.compiler.is_compiling() else fused)
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    weights = []
    for compiled in [False, True]:
        model = _lm("decoder", "exp", "gated")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        forward = lambda ids: model(input_ids=ids, labels=ids).loss  # noqa: E731
        step = optimizer.step
        if compiled:
            torch._dynamo.reset()
            forward, step = torch.compile(forward, fullgraph=True), torch.compile(step)
        for _ in range(2):
            optimizer.zero_grad()
            forward(ids).backward()
            step()
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    for name, want in weights[0].items():
        torch.testing.assert_close(weights[1][name], want, atol=1e-5, rtol=1e-4, msg=name)


FRESH_PROCESS = """
import sys, torch
from tests.helpers import VOCAB, decoder
from hf_settransformer import linear_triton
assert linear_triton.triton is None  # not yet imported by the package: the kernels never ran here
model = decoder("linear", "elu", linear_attention_decay="gated").train()
ids = torch.randint(1, VOCAB, (2, 8))
torch.compile(lambda ids: model(input_ids=ids, labels=ids).loss, fullgraph=True, backend="eager")(ids).backward()
print("one graph")
"""


@pytest.mark.slow
@pytest.mark.skipif(not _triton_interpreted(), reason="triton's interpreter runs CPU tensors")
def test_the_first_compiled_call_imports_nothing_while_tracing():
    """In a process whose kernels never ran, a model's first call is compiled: deciding on the kernels imports nothing
    while dynamo traces (`linear_triton`'s first import there broke the graph), and the one graph runs them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "HFST_FORCE_TRITON": "1", "TRITON_INTERPRET": "1"}
    env.pop("HFST_DISABLE_TRITON", None)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "one graph" in done.stdout, done.stderr[-2000:]


def test_an_op_called_directly_names_an_unknown_feature_map():
    q = torch.randn(1, 1, 3, 2)
    with pytest.raises(ValueError, match="`feature_map` must be one of"):
        torch.ops.hfst.causal_linear_attention(q, q, q, None, None, None, None, None, None, None, "relu", 4, 0, False)

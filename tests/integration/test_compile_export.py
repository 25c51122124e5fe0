"""torch.compile and torch.export for every family x attention type: one graph (fullgraph, no graph breaks) and the
outputs of eager mode. Dynamo is checked with the "eager" backend (tracing without inductor's code generation, which
tests/integration/test_hf_integration.py's compiled training covers and which takes tens of seconds per model); training steps
of the linear kernels also with "aot_eager" (AOT autograd's forward and backward graphs, as inductor gets them).

Decoding steps with fixed shapes (a StaticCache for softmax, the in-place recurrent state for linear attention) compile
to one graph that serves every step: no recompilation as the context grows, which CUDA graphs need."""

import pytest
import torch
import torch.nn.functional as F
from tests.helpers import (
    ATTENTIONS,
    FAMILIES,
    VOCAB,
    decode,
    decoder,
    family_classes,
    left_padded_batch,
    make_model,
    tiny_config,
)
from torch._dynamo.testing import CompileCounter
from transformers import AutoModel, AutoModelForCausalLM, StaticCache

import hf_settransformer as hfst
from hf_settransformer.attention import AttentionMask, linear_kernel
from hf_settransformer.cache import LinearAttentionCache, RecurrentStateLayer
from hf_settransformer.linear_ops import causal_linear_attention, linear_attention_step

# dynamo traces every family and attention type: left out of the fast tier (python -m pytest -m 'not slow')
pytestmark = pytest.mark.slow

# every base model (the decoder's is causal: its linear-exp case runs the exp kernel's compiled path), and every family's
# causal-LM head with softmax attention (the heads' own code; linear heads add only tracing time, ~10-30 s each)
CASES = [(f, a, m, AutoModel) for f in FAMILIES for a, m in ATTENTIONS] + [
    (f, "softmax", "elu", AutoModelForCausalLM) for f in FAMILIES
]


def inputs(config):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def main_tensor(output):
    return output["logits"] if "logits" in output else output["last_hidden_state"]


def assert_compiles_and_exports(model, kwargs):
    """One dynamo graph (fullgraph) and a torch.export program, both giving eager mode's output."""
    with torch.no_grad():
        expected = main_tensor(model(**kwargs))
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(main_tensor(compiled(**kwargs)), expected, atol=1e-5, rtol=1e-5)
    exported = torch.export.export(model, args=(), kwargs=kwargs)
    with torch.no_grad():
        torch.testing.assert_close(main_tensor(exported.module()(**kwargs)), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "family,attention_type,feature_map,auto",
    CASES,
    ids=[f"{c[0]}-{c[1]}{'' if c[1] == 'softmax' else '-' + c[2]}-{c[3].__name__}" for c in CASES],
)
def test_compile_fullgraph_and_export_equal_eager(family, attention_type, feature_map, auto):
    config = tiny_config(family, attention_type, feature_map)
    model = make_model(family_classes(config)[auto], config).eval()
    kwargs = inputs(config)
    if family == "decoder":
        kwargs["use_cache"] = False  # export: a cache object is no tensor output (generation exports use a static one)
    assert_compiles_and_exports(model, kwargs)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_adaptive_layers_compile_fullgraph_and_export_equal_eager(family):
    """Adaptive input and adaptive softmax: one graph (no data-dependent shapes in the cluster lookups)."""
    config = tiny_config(family, adaptive_input_cutoffs=[4, 16], adaptive_softmax_cutoffs=[4, 16])
    model = make_model(family_classes(config)[AutoModelForCausalLM], config).eval()
    kwargs = inputs(config)
    if family == "decoder":
        kwargs["use_cache"] = False
    assert_compiles_and_exports(model, kwargs)


# every family's causal-LM head with each linear feature map, and the decoder's with a gated decay
TRAINING_CASES = [(f, m, "none") for f in FAMILIES for m in ("elu", "exp")] + [("decoder", "elu", "gated")]


@pytest.mark.parametrize(
    "family,feature_map,decay", TRAINING_CASES, ids=[f"{f}-linear-{m}-{d}" for f, m, d in TRAINING_CASES]
)
def test_compiled_training_step_with_aot_autograd_equals_eager(family, feature_map, decay):
    """A training step (loss and backward) compiled through AOT autograd, as inductor runs it, with the "aot_eager"
    backend (its graphs without code generation): eager mode's loss and gradients. The elu map once failed here in the
    compiled backward (heads split off a projection are non-contiguous; see feature_maps._elu1)."""
    config = tiny_config(family, "linear", feature_map, linear_attention_decay=decay)
    model = make_model(family_classes(config)[AutoModelForCausalLM], config).train()
    ids = inputs(config)["input_ids"]

    def step(fn):
        model.zero_grad()
        loss = fn(ids)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    expected, grads = step(lambda ids: model(input_ids=ids, labels=ids).loss)
    torch._dynamo.reset()
    got, compiled_grads = step(
        torch.compile(lambda ids: model(input_ids=ids, labels=ids).loss, fullgraph=True, backend="aot_eager")
    )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert compiled_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_compiled_exp_kernel_takes_the_exact_path_in_steep_chunks():
    """Under torch.compile the causal exp kernel's exact path for steep chunks is selected inside the one graph: a key
    200 nats above the rest gives eager's outputs and gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 24, 4, generator=g) for _ in range(3))
    k[:, :, 13, 0] += 200.0

    def run(fn):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        out, _ = fn(qq, kk, vv, None, feature_map="exp", chunk_size=8)
        out.square().sum().backward()
        return out.detach(), [x.grad for x in (qq, kk, vv)]

    expected, grads = run(causal_linear_attention)
    torch._dynamo.reset()
    got, compiled_grads = run(torch.compile(causal_linear_attention, fullgraph=True, backend="eager"))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    for a, b in zip(compiled_grads, grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_compiled_static_cache_decoding_step_equals_eager():
    """Softmax with transformers' StaticCache and left padding: one graph for every step (positions and masks come from
    the cache's counter, a tensor: nothing read back, the same shapes each step), eager mode's logits."""
    model = decoder("softmax", "elu")
    ids, mask = left_padded_batch()
    slots = mask.shape[1] + 5
    static_mask = F.pad(mask, (0, 5))
    expected = decode(model, model.forward, StaticCache(config=model.config, max_cache_len=slots), ids, static_mask)
    dynamic = decode(model, model.forward, None, ids, mask)  # the usual cache: masks grow with the context
    torch.testing.assert_close(expected, dynamic, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    counter = CompileCounter()  # the "eager" backend, counting the graphs it is handed
    step = torch.compile(model.forward, fullgraph=True, backend=counter)
    got = decode(model, step, StaticCache(config=model.config, max_cache_len=slots), ids, static_mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1


def test_generate_with_a_static_cache_compiles_its_decoding_step_once():
    """generate()'s own route (a GPU's, forced here on the CPU): with a StaticCache it compiles the forward and calls it
    for every decoding step with the mask this model's `create_masks_for_generate` pads to the cache's slots; one graph
    serves them all (fullgraph) and the tokens are the dynamic cache's."""
    from transformers import CompileConfig

    model = decoder("softmax", "elu")
    ids, mask = left_padded_batch()
    kwargs = {"attention_mask": mask, "max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    expected = model.generate(ids, **kwargs)
    graphs = []

    def counting_backend(graph, example_inputs):  # a function: CompileConfig deep-copies its backend
        graphs.append(graph)
        return graph.forward

    config = CompileConfig(fullgraph=True, backend=counting_backend, mode=None)
    config._compile_all_devices = True  # transformers' switch for compiling on a CPU
    torch._dynamo.reset()
    got = model.generate(ids, cache_implementation="static", compile_config=config, **kwargs)
    assert torch.equal(got, expected)
    assert len(graphs) == 1


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_compiled_linear_decoding_step_equals_eager(feature_map):
    """Linear attention with LinearAttentionCache(static=True): one graph for every step, eager mode's logits."""
    model = decoder("linear", feature_map)
    ids = torch.randint(1, VOCAB, (2, 9))
    expected = decode(model, model.forward, LinearAttentionCache(config=model.config), ids, None)
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(model.forward, fullgraph=True, backend=counter)
    got = decode(model, step, LinearAttentionCache(config=model.config, static=True), ids, None)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1


@pytest.mark.parametrize("feature_map", ["elu", "exp"])
def test_compiled_linear_attention_step_equals_eager_and_writes_the_state_in_place(feature_map):
    """The single-token kernel step (`linear_kernel` with n = 1 and a state): one graph for every step, no host read
    (fullgraph), and with a static layer the state written into the same buffers each step (CUDA graphs replay on
    fixed addresses). `linear_attention_step` itself also compiles with inductor."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g) for _ in range(3))
    steps = [[torch.randn(2, 4, 1, 8, generator=g) for _ in range(3)] for _ in range(4)]
    mask, options = AttentionMask(causal=True), {"feature_map": feature_map}
    eager, static = RecurrentStateLayer(), RecurrentStateLayer(static=True)
    for layer in (eager, static):
        linear_kernel(q, k, v, mask, layer, **options)
    addresses = [t.data_ptr() for t in (static.state.kv, static.state.z)]
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(linear_kernel, fullgraph=True, backend=counter)
    for sq, sk, sv in steps:
        expected, _ = linear_kernel(sq, sk, sv, mask, eager, **options)
        got, _ = compiled(sq, sk, sv, mask, static, **options)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert counter.frame_count == 1
    assert [t.data_ptr() for t in (static.state.kv, static.state.z)] == addresses
    assert int(static.get_seq_length()) == eager.get_seq_length() == 11
    torch.testing.assert_close(static.state.kv, eager.state.kv)
    if feature_map == "elu":  # inductor's code generation: a few seconds
        torch._dynamo.reset()
        fused = torch.compile(linear_attention_step, fullgraph=True)
        sq, sk, sv = steps[0]
        for got, want in zip(
            fused(sq, sk, sv, None, eager.state), linear_attention_step(sq, sk, sv, None, eager.state)
        ):
            if isinstance(got, torch.Tensor):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
            else:
                torch.testing.assert_close(got.kv, want.kv, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ checks when compiled

def classifier(**fields):
    return make_model(hfst.TransformerEncoderForSequenceClassification, tiny_config("encoder", **fields))


def compiled_refusal(model, kwargs, error, words, fullgraph=False):
    """Compiled (dynamo's eager backend) and exported, `model(**kwargs)` raises `error` with `words`; fullgraph=True
    raises dynamo's "Observed exception", which quotes the refusal."""
    torch._dynamo.reset()
    with pytest.raises(error, match=words):
        torch.compile(model, backend="eager")(**kwargs)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=words):
        torch.compile(model, backend="eager", fullgraph=True)(**kwargs)


def test_a_compiled_classifier_with_a_decay_is_refused_as_in_eager():
    """A gated decay needs causal attention, and a classifier has none: eager refuses it, and so does a compiled
    forward (it ran undecayed before)."""
    model = classifier(attention_type="linear", linear_attention_decay="gated")
    ids = torch.randint(0, VOCAB, (2, 6))
    compiled_refusal(model, {"input_ids": ids}, ValueError, "linear_attention_decay='gated'")


def test_a_config_changed_after_build_is_refused_when_compiled():
    model = classifier(attention_type="linear")
    ids = torch.randint(0, VOCAB, (2, 6))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    compiled(input_ids=ids)
    model.config.linear_attention_decay = "fixed"
    compiled_refusal(model, {"input_ids": ids}, ValueError, "was built with linear_attention_decay='none'")
    model.config.linear_attention_decay = "none"
    compiled(input_ids=ids)  # the guard on the config field recompiles, and the checks pass again


def test_a_compiled_forward_passes_an_unknown_keyword_and_refuses_a_typo_as_eager_does():
    """The keyword check (`checks.check_keyword_names`) in one graph: a name far from every input passes, one a typo
    away (`attention_masks=`) is refused."""
    model = classifier()
    ids = torch.randint(0, VOCAB, (2, 6))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(input_ids=ids, my_own_flag=1).logits, model(input_ids=ids).logits)
    compiled_refusal(model, {"input_ids": ids, "attention_masks": torch.ones(2, 6)}, ValueError,
                     "did you mean `attention_mask`")


@pytest.mark.parametrize("case", ["mask shape", "ids dtype", "labels shape"])
def test_shape_and_dtype_checks_run_when_compiled(case):
    model = classifier()
    ids = torch.randint(0, VOCAB, (2, 6))
    kwargs, words = {
        "mask shape": ({"input_ids": ids, "attention_mask": torch.ones(2, 5)}, "attention_mask` must have shape"),
        "ids dtype": ({"input_ids": ids.to(torch.int16)}, "torch.long"),
        "labels shape": ({"input_ids": ids, "labels": torch.zeros(2, 2, dtype=torch.long)}, "class indices"),
    }[case]
    compiled_refusal(model, kwargs, ValueError, words)


@pytest.mark.parametrize("case", ["mask of 0.5", "id out of range", "label out of range", "token label out of range"])
def test_value_checks_are_assertions_in_a_compiled_or_exported_graph_on_the_cpu(case):
    """Values a compiled forward cannot read back (no host sync) are asserted inside the graph on the CPU: a mask of
    0.5 is refused (it was read as 1), an id or a label out of range names the input and its range (it was torch's
    "IndexError: index out of range in self"). The same in a fullgraph training step and in an exported program."""
    ids = torch.randint(0, VOCAB, (2, 6))
    good = {"input_ids": ids, "attention_mask": torch.ones(2, 6), "labels": torch.tensor([0, 1])}
    model, bad, words = {
        "mask of 0.5": (classifier(), {"attention_mask": torch.full((2, 6), 0.5)}, "`attention_mask` must hold only 0"),
        "id out of range": (classifier(), {"input_ids": ids + VOCAB},
                            rf"`input_ids` hold ids outside the vocabulary \[0, {VOCAB - 1}\]"),
        "label out of range": (classifier(), {"labels": torch.tensor([0, 3])}, r"`labels` hold class ids outside \[0, 2\]"),
        "token label out of range": (decoder("softmax", "elu"), {"labels": ids + VOCAB},
                                     rf"`labels` hold token ids outside \[0, {VOCAB - 1}\]"),
    }[case]
    if isinstance(model, hfst.TransformerDecoderForCausalLM):
        good.update(labels=ids, use_cache=False)
    bad = {**good, **bad}
    with pytest.raises(ValueError):
        model(**bad)  # eager: read back and refused with the values
    compiled_refusal(model, bad, RuntimeError, words)
    torch._dynamo.reset()
    model.train()
    loss = torch.compile(lambda inputs: model(**inputs).loss, backend="aot_eager", fullgraph=True)
    loss(good).backward()
    with pytest.raises(RuntimeError, match=words):
        loss(bad).backward()
    exported = torch.export.export(model.eval(), args=(), kwargs=good).module()
    exported(**good)
    with pytest.raises(RuntimeError, match=words):
        exported(**bad)

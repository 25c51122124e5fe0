"""torch.compile and torch.export for every family x attention type: one graph (fullgraph, no graph breaks) and the
outputs of eager mode. Dynamo is checked with the "eager" backend (tracing without inductor's code generation, which
tests/test_hf_integration.py's compiled training covers and which takes tens of seconds per model)."""

import pytest
import torch
from conftest import ATTENTIONS, FAMILIES, family_classes, make_model, tiny_config
from transformers import AutoModel, AutoModelForCausalLM

from hf_settransformer.linear_ops import causal_linear_attention

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


def test_compiled_exp_kernel_takes_the_exact_path_in_steep_chunks():
    """Under torch.compile the causal exp kernel's exact path for steep chunks is selected inside the one graph: a key
    200 nats above the rest gives eager's outputs and gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 24, 4, generator=g) for _ in range(3))
    k[:, :, 13, 0] += 200.0

    def run(fn):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        out, _ = fn(qq, kk, vv, None, "exp", 8)
        out.square().sum().backward()
        return out.detach(), [x.grad for x in (qq, kk, vv)]

    expected, grads = run(causal_linear_attention)
    torch._dynamo.reset()
    got, compiled_grads = run(torch.compile(causal_linear_attention, fullgraph=True, backend="eager"))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    for a, b in zip(compiled_grads, grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)

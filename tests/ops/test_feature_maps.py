"""The feature-map table (hf_settransformer/feature_maps.py): each entry's PyTorch phi against its exact float64 form;
the config, train_lm.py's `--feature_map` and the linear ops accepting exactly the table's names; and a throwaway
elementwise map registered at test time running through every linear op against the naive references, with the
Triton host side sending it to PyTorch (the kernels have no code for it)."""

from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from tests.helpers import decoder, tiny_config

from hf_settransformer import linear_triton
from hf_settransformer.feature_maps import FEATURE_MAPS, FeatureMap, get_feature_map
from hf_settransformer.linear_naive import naive_causal_linear_attention, naive_linear_attention, naive_linear_visible
from hf_settransformer.linear_ops import (
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
    prefix_causal_linear_attention,
)

ROOT = Path(__file__).resolve().parents[2]
LINEAR_OPS = [linear_attention, causal_linear_attention, prefix_causal_linear_attention, linear_attention_step]
B, H, D, E = 2, 2, 4, 3


def _qkv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, dim, generator=g) for dim in (D, D, E))


def _relu_map():
    """A map the kernels have no code for: relu(x) + 1e-6 (the floor keeps every denominator positive)."""
    return FeatureMap(name="relu", phi=lambda x: torch.relu(x) + 1e-6, paper="test only")


@pytest.fixture
def relu(monkeypatch):
    monkeypatch.setitem(FEATURE_MAPS, "relu", _relu_map())
    return "relu"


# ---------------------------------------------------------------------------------------------------------------
# the table


@pytest.mark.parametrize("name", list(FEATURE_MAPS))
def test_phi_matches_its_exact_float64_form(name):
    """The ops' fp32 phi is the references' float64 one, to fp32's precision (elu + 1's cancellation for negative
    inputs costs at most ~1e-7 absolute), from far negative to large inputs."""
    fmap = FEATURE_MAPS[name]
    assert fmap.name == name and get_feature_map(name) is fmap
    x = torch.linspace(-30.0, 30.0, 2001, dtype=torch.float64)
    got = fmap.phi(x.float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), fmap.exact(x), rtol=1e-6, atol=2e-7)


def test_triton_ids_are_distinct_and_have_kernel_code():
    ids = [fmap.triton_id for fmap in FEATURE_MAPS.values() if fmap.triton_id is not None]
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(linear_triton.KERNEL_IDS)


def test_an_unknown_name_is_refused_naming_the_table():
    for name in ("relu", "ELU", None, ["elu"]):
        with pytest.raises(ValueError, match=r"`feature_map` must be one of \['elu', 'exp'\], got"):
            get_feature_map(name)


# ---------------------------------------------------------------------------------------------------------------
# everything that takes a name takes exactly the table's


def test_config_accepts_exactly_the_table_names(relu):
    for name in FEATURE_MAPS:
        assert tiny_config("decoder", "linear", name).feature_map == name
    with pytest.raises(StrictDataclassError, match=r"`feature_map` must be one of \['elu', 'exp', 'relu'\], got 'nope'"):
        tiny_config("decoder", "linear", "nope")


def test_train_lm_choices_are_the_table_names():
    from hf_settransformer.toolkit.lm_arguments import ModelArguments

    choices = ModelArguments.__dataclass_fields__["feature_map"].metadata["choices"]
    assert choices == list(FEATURE_MAPS) == ["elu", "exp"]


@pytest.mark.parametrize("op", LINEAR_OPS, ids=lambda op: op.__name__)
def test_ops_accept_exactly_the_table_names(op, relu):
    q, k, v = _qkv(1)
    for name in FEATURE_MAPS:
        out, _ = op(q, k, v, feature_map=name)
        assert out.shape == (B, H, 1, E) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"`feature_map` must be one of \['elu', 'exp', 'relu'\], got 'nope'"):
        op(q, k, v, feature_map="nope")


# ---------------------------------------------------------------------------------------------------------------
# a new elementwise map: an entry, and every op computes it


@pytest.fixture(params=["pytorch", "forced_triton"])
def route(request, monkeypatch):
    """With HFST_FORCE_TRITON=1 the ops would take the kernels for any map they have code for; not for this one."""
    monkeypatch.delenv("HFST_DISABLE_TRITON", raising=False)
    monkeypatch.setenv("HFST_FORCE_TRITON", "1" if request.param == "forced_triton" else "0")
    return request.param


def test_new_map_non_causal_matches_the_reference(relu, route):
    q, k, v = _qkv(7)
    mask = torch.rand(B, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    out, state = linear_attention(q, k, v, mask, feature_map=relu)
    assert state is None
    torch.testing.assert_close(out.double(), naive_linear_attention(q, k, v, mask, relu), atol=1e-5, rtol=1e-4)


def test_new_map_causal_matches_the_reference_with_gradients(relu, route):
    q, k, v = (t.requires_grad_() for t in _qkv(11))
    mask = torch.ones(B, 11, dtype=torch.bool)
    mask[0, :3] = False
    out, _ = causal_linear_attention(q, k, v, mask, feature_map=relu, chunk_size=4)
    want = naive_causal_linear_attention(q, k, v, mask, relu)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-4)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = torch.autograd.grad((out.double() * g).sum(), (q, k, v))
    expected = torch.autograd.grad((want * g).sum(), (q, k, v))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=1e-4)


def test_new_map_steps_and_prefix_continue_the_causal_op(relu, route):
    """Token-by-token steps equal the one-pass causal op; the prefix op's first queries read the whole prefix."""
    n, prefix = 9, 3
    q, k, v = _qkv(n)
    whole, final = causal_linear_attention(q, k, v, feature_map=relu, chunk_size=4)
    state, steps = None, []
    for t in range(n):
        out, state = linear_attention_step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, state,
                                           feature_map=relu)  # fmt: skip
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=2), whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state.kv, final.kv, atol=1e-5, rtol=1e-4)
    assert state.k_max is None and final.k_max is None
    out, _ = prefix_causal_linear_attention(q, k, v, feature_map=relu, chunk_size=4, prefix_length=prefix)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= torch.clamp(i, min=prefix - 1))[None, None]  # the prefix's queries see every prefix key
    torch.testing.assert_close(out.double(), naive_linear_visible(q, k, v, allowed, relu), atol=1e-5, rtol=1e-4)


def test_triton_host_side_sends_a_map_without_kernel_code_to_pytorch(relu, monkeypatch):
    monkeypatch.setenv("HFST_FORCE_TRITON", "1")
    monkeypatch.delenv("HFST_DISABLE_TRITON", raising=False)
    q, k, v = _qkv(4)
    assert not linear_triton.fused_linear_attention_available(q, relu, v)
    for fused in (linear_triton.fused_linear_attention, linear_triton.fused_causal_linear_attention):
        with pytest.raises(ValueError, match="no Triton code for feature_map='relu'"):
            fused(q, k, v, feature_map=relu)
    with pytest.raises(ValueError, match="no Triton code for feature_map='relu'"):
        linear_triton.fused_linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], feature_map=relu)


def test_a_decoder_with_the_new_map_generates_as_its_forward(relu):
    """Through the config, the attention kernel and the recurrent cache: greedy generation's logits at each step equal
    the one-pass forward's over the generated sequence."""
    model = decoder("linear", relu)
    prompt = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    full = model(out.sequences).logits[:, prompt.shape[1] - 1 : -1]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full, atol=1e-4, rtol=1e-4)

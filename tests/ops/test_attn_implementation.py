"""`attn_implementation` (how softmax is computed) through transformers' `ALL_ATTENTION_FUNCTIONS`: eager, sdpa and
flex_attention agree for every family and head, padded or not, cached generation included; flash_attention_2 reaches
transformers' own availability check, and runs (on a reference stand-in for flash-attn) with the masks it can express.
"""

import pytest
import torch
import torch.nn.functional as F
import transformers.modeling_flash_attention_utils as hf_flash
from tests.helpers import MODEL_CLASSES, VOCAB, main_output, make_model, tiny_config
from transformers import AutoModel
from transformers.utils import is_flash_attn_2_available

import hf_settransformer as hfst
from hf_settransformer.masks import AttentionMask

IDS = [f"{family}-{cls.__name__}" for family, cls in MODEL_CLASSES]
ATOL = 1e-5


def inputs_for(cls, padded):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    if padded:
        mask[1, 5:] = 0
    if padded == "empty":  # and a row of padding only
        mask[0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _reference(q, k, v, causal, scale):
    """One sequence as flash-attn computes it: q (n,h,d), k (m,h,d), causal aligned bottom-right, no key -> 0."""
    n, m = q.shape[0], k.shape[0]
    if m == 0:
        return torch.zeros_like(q[..., : v.shape[-1]])
    allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n) if causal else None
    out = F.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), attn_mask=allowed, scale=scale)
    return out.transpose(0, 1).nan_to_num(0.0)


def _flash(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
    return torch.stack([_reference(*x, causal, softmax_scale) for x in zip(q, k, v)])


def _flash_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False
):
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs = [
        _reference(q[a:b], k[c:d], v[c:d], causal, softmax_scale)
        for a, b, c, d in zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:])
    ]
    return torch.cat(outs)


@pytest.fixture
def reference_flash(monkeypatch):
    """flash-attn's two functions, as a per-sequence SDPA reference, where transformers looks them up once loaded:
    everything else (transformers' `flash_attention_forward`, its unpadding and cu_seqlens path) is the real code."""
    stand_ins = {
        "_loaded_implementation": "flash_attention_2",
        "_flash_fn": _flash,
        "_flash_varlen_fn": _flash_varlen,
        "_flash_with_kvcache_fn": None,
        "_pad_fn": hf_flash._pad_input,
        "_unpad_fn": hf_flash._unpad_input,
        "_process_flash_kwargs_fn": hf_flash._lazy_define_process_function(_flash_varlen),
        "_process_with_kvcache_kwargs_fn": dict,
    }
    for name, value in stand_ins.items():
        monkeypatch.setattr(hf_flash, name, value)


# ---------------------------------------------------------------------------------------------------------------
# flash_attention_2 is transformers' to refuse


@pytest.mark.skipif(is_flash_attn_2_available(), reason="flash-attn is installed")
@pytest.mark.parametrize("route", ["from_config", "from_pretrained", "set_attn_implementation"])
def test_flash_attention_2_reaches_transformers_own_check(route, tmp_path):
    config = tiny_config("decoder")
    with pytest.raises((ImportError, ValueError), match="[Ff]lash[ _-]?[Aa]ttn|[Ff]lash[ _]?[Aa]ttention ?2"):
        if route == "from_config":
            AutoModel.from_config(config, attn_implementation="flash_attention_2")
        elif route == "from_pretrained":
            hfst.TransformerDecoderModel(config).save_pretrained(tmp_path)
            AutoModel.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
        else:
            hfst.TransformerDecoderModel(config).set_attn_implementation("flash_attention_2")
    assert all(flag for flag in (hfst.TransformerDecoderModel._supports_flash_attn, hfst.TransformerDecoderModel._supports_flex_attn))


def test_linear_attention_refuses_a_softmax_implementation():
    """Linear attention computes no softmax: it runs under the default (sdpa) or eager, and names the field else."""
    model = make_model(hfst.TransformerEncoderModel, tiny_config("encoder", "linear", "elu"))
    model(**inputs_for(hfst.TransformerEncoderModel, True))
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="attn_implementation='flex_attention'.*attention_type='linear'"):
        model(**inputs_for(hfst.TransformerEncoderModel, True))


# ---------------------------------------------------------------------------------------------------------------
# eager, sdpa and flex_attention compute the same function


@pytest.mark.parametrize("padded", [False, True, "empty"], ids=["unpadded", "padded", "empty-row"])
@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=IDS)
def test_eager_sdpa_and_flex_agree(uncompiled_flex, family, cls, padded):
    """Every family x head (bidirectional prefixes of the next-token heads, PMA/ISAB and Perceiver cross-attention
    included), fp32: the same outputs, padded positions and rows of padding only too."""
    model = make_model(cls, tiny_config(family))
    inputs = inputs_for(cls, padded)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        expected = main_output(model(**inputs))
        for implementation in ("eager", "flex_attention"):
            model.set_attn_implementation(implementation)
            torch.testing.assert_close(main_output(model(**inputs)), expected, atol=ATOL, rtol=ATOL, msg=implementation)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_generation_agrees(uncompiled_flex, cache):
    """Left-padded greedy generation with a cache: the same tokens and scores under each implementation."""
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    results = {}
    for implementation in ("sdpa", "eager", "flex_attention"):
        model.set_attn_implementation(implementation)
        results[implementation] = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    for implementation in ("eager", "flex_attention"):
        assert torch.equal(results[implementation].sequences, results["sdpa"].sequences), implementation
        for got, want in zip(results[implementation].scores, results["sdpa"].scores):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


@pytest.mark.xfail(
    torch.backends.cpu.get_cpu_capability() == "AVX2",
    reason="torch 2.13's compiled flex attention on an AVX2-only CPU returns wrong values for a query or two of a "
    "padded row, a different one from run to run, with one thread too (seen here; SDPA and uncompiled flex agree)",
    strict=False,
)
@pytest.mark.slow
def test_compiled_flex_attention_runs_a_padded_decoder():
    """The real path (transformers compiles flex attention; one static shape here) gives SDPA's result on CPU."""
    torch._dynamo.reset()
    model = make_model(hfst.TransformerDecoderModel, tiny_config("decoder"))
    inputs = inputs_for(hfst.TransformerDecoderModel, True)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        model.set_attn_implementation("flex_attention")
        got = model(**inputs).last_hidden_state
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=ATOL)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------------------
# flash_attention_2 on a reference stand-in for flash-attn

FLASH_REFUSED = {  # head: refused when padded only
    "TransformerEncoderForNextTokenPrediction": False,  # a bidirectional prefix
    "SetTransformerForNextTokenPrediction": False,  # a bidirectional prefix
    "PerceiverIOForNextTokenPrediction": True,  # padded keys in a causal cross-attention (queries: the last t)
}


@pytest.mark.parametrize("padded", [False, True, "empty"], ids=["unpadded", "padded", "empty-row"])
@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=IDS)
def test_flash_attention_2_matches_sdpa_where_it_can(reference_flash, family, cls, padded):
    """Padding goes to flash attention as sequence lengths: outputs equal SDPA's at real positions (a padded query's
    self-attention output is 0 there); a mask it cannot express is refused when the model is called."""
    model = make_model(cls, tiny_config(family))
    inputs = inputs_for(cls, padded)
    with torch.no_grad():
        expected = main_output(model(**inputs))
        model.config._attn_implementation = "flash_attention_2"  # what set_attn_implementation does with flash-attn
        if cls.__name__ in FLASH_REFUSED and (padded or not FLASH_REFUSED[cls.__name__]):
            with pytest.raises(ValueError, match="flash attention .*cannot express"):
                model(**inputs)
            return
        got = main_output(model(**inputs))
    if got.dim() == 3 and got.shape[1] == inputs["attention_mask"].shape[1]:  # per token: compare real positions
        real = inputs["attention_mask"].bool()
        got, expected = got[real], expected[real]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=ATOL)


def test_flash_attention_2_cached_generation_and_refusals(reference_flash):
    """A left-padded decoder generates SDPA's tokens (padded prefill, then one query over the padded cache); a static
    cache's slots are refused clearly."""
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder"))
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    model.config._attn_implementation = "flash_attention_2"
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, **kwargs), expected)
    with pytest.raises(ValueError, match="cannot express a static cache"):
        model.generate(input_ids=ids, attention_mask=mask, cache_implementation="static", **kwargs)


def test_flash_form_of_a_cross_attention_packs_the_keys(reference_flash):
    """PMA/ISAB/Perceiver cross-attention (n != m) with padded keys: every query kept, keys packed by cu_seqlens."""
    from hf_settransformer.softmax_ops import softmax_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 8, generator=g) for n in (4, 9, 9))
    key_mask = torch.ones(3, 9, dtype=torch.bool)
    key_mask[1, 5:] = False
    key_mask[2, :] = False  # a set with no element: its queries see nothing and give 0
    mask = AttentionMask.build(key_mask)
    expected, _ = softmax_attention(q, k, v, mask, "sdpa")
    got, _ = softmax_attention(q, k, v, mask, "flash_attention_2")
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=ATOL)
    assert torch.equal(got[2], torch.zeros_like(got[2]))

"""The environment every test runs in (set before anything imports triton), the fixtures every folder uses and the
fast tier's collection. Tiny models and the other shared helpers: helpers.py."""

import os

import torch

# tests/ops/test_linear_triton.py runs the Triton kernels on CPU tensors in triton's interpreter, which must be chosen
# before triton is first imported (importing transformers imports it). It changes nothing else: no other test runs a
# Triton kernel on a CPU. With a GPU the kernels run compiled and this stays unset.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # deepspeed (installed by dev) is imported by accelerate whenever a model is saved; told its accelerator, it does
    # not warn "Setting accelerator to CPU" in every process (the ZeRO-3 tests run on it)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest

# One intra-op thread: the tests' models are tiny (hidden 32), too small for a second thread to share their ops; with
# two, each op waits for the other thread, which on a busy machine costs milliseconds per op (10-100x the op). The
# README's command runs one pytest-xdist worker per CPU instead. Processes the tests start keep torch's default.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """transformers compiles flex attention once per process; on CPU, torch 2.13's inductor fails to build the kernel
    once shapes turn dynamic (`cur_qSplitSize1` undeclared), which the many shapes of these tests reach. The
    same `flex_attention_forward`, with its BlockMask, runs here without the compile (torch's reference path)."""

    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    def run(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", run)


def pytest_ignore_collect(collection_path, config):
    """`-m "not slow"` does not collect transformers' common tests at all: importing that module builds their tests
    tree (a download on first use), which a run that deselects them should not need."""
    if collection_path.name != "test_transformers_common.py" or not config.getoption("markexpr"):
        return None
    from _pytest.mark.expression import Expression

    if not Expression.compile(config.getoption("markexpr")).evaluate(lambda name, **_: name == "slow"):
        return True
    return None

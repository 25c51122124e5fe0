"""Model-level sharding: every family's language-model head, sharded by FSDP2 (`fully_shard` on the blocks that
`_no_split_modules` names, then the root) or by DeepSpeed ZeRO-3, computes in two gloo processes on CPU what one
process computes unsharded on the whole batch: the loss, the gradients, the weights after an SGD step. ZeRO-3's
`zero.Init` builds the models partitioned with this package's initialisation. `_no_split_modules` names only blocks a
model holds, so accelerate's transformer-based wrapping finds them.

The multi-process tests launch one script each (`torch.distributed.run`, 2 processes) that runs all its cases in a
loop, so process start-up is paid once; each rank writes its results to a JSON file that the test reads."""

import copy
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tests.helpers import ATTENTIONS, VOCAB, launch_two, tiny_config
from torch import nn

import hf_settransformer as hfst
from hf_settransformer.layers import AdaptiveProjection, FeatureProjection, LearnedVectors, ScaleNorm
from hf_settransformer.toolkit.measure import sharding_of

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = list(hfst.FAMILIES)
# the token-predicting head each family trains with (the Set Transformer's next-token head reads token ids)
LM_HEADS = {
    "encoder": "AutoModelForMaskedLM",
    "decoder": "AutoModelForCausalLM",
    "set_transformer": "AutoModelForCausalLM",
    "perceiver_io": "AutoModelForMaskedLM",
}
SMALL = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32)
ROWS, LENGTH, LR = 4, 8, 0.1  # the full batch; each of the 2 ranks takes ROWS // 2 rows
ATOL, RTOL = 1e-5, 1e-4


def lm_model(family, attention_type="softmax", feature_map="elu", **overrides):
    """A tiny LM head of `family` (seed 0, the same on every rank), in train mode (dropout is 0; the heads' training
    paths compute the loss without full logits)."""
    config = tiny_config(family, attention_type, feature_map, **{**SMALL, **overrides})
    torch.manual_seed(0)
    return hfst.FAMILIES[family].model_classes()[LM_HEADS[family]](config).train()


def lm_batch(family):
    """(input_ids, labels) of the full batch, with the same number of counted labels in every row: a rank's mean
    loss over its rows, averaged over the ranks, is then the full batch's mean loss."""
    input_ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    if LM_HEADS[family] == "AutoModelForCausalLM":
        return input_ids, input_ids.clone()  # causal-LM labels, shifted inside
    return input_ids, torch.where(torch.arange(LENGTH) % 3 == 1, input_ids, -100)  # the same masked positions


def rank_rows(tensor):
    rank = dist.get_rank()
    return tensor[rank * ROWS // 2 : (rank + 1) * ROWS // 2]


def mean_over_ranks(value):
    value = value.detach().clone()
    dist.all_reduce(value)
    return float(value / dist.get_world_size())


def differences(tensors, expected):
    """Names whose tensors differ from `expected`'s (or are missing from either side), with the largest difference."""
    out = {name: "missing" for name in expected.keys() - tensors.keys()}
    out.update({name: "unexpected" for name in tensors.keys() - expected.keys()})
    for name in tensors.keys() & expected.keys():
        a, b = tensors[name].detach().cpu(), expected[name].detach().cpu()
        if a.shape != b.shape or not torch.allclose(a, b, atol=ATOL, rtol=RTOL):
            out[name] = f"{tuple(a.shape)} vs {tuple(b.shape)}" if a.shape != b.shape else float((a - b).abs().max())
    return out


def reference_step(reference, family):
    """The one-process run: the mean loss of the full batch, its gradients, one SGD step."""
    input_ids, labels = lm_batch(family)
    loss = reference(input_ids=input_ids, labels=labels).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
    torch.optim.SGD(reference.parameters(), lr=LR).step()
    return float(loss.detach()), grads


def case_name(family, attention_type, feature_map, overrides, checkpointed=False):
    name = f"{family}-{attention_type}" + ("" if attention_type == "softmax" else f"-{feature_map}")
    name += "".join(f"-{k}={v}" for k, v in overrides.items())
    return name + ("-checkpointed" if checkpointed else "")


def run_launched(script, tmp_path, timeout=600):
    """Runs `script` in 2 gloo processes; the per-rank JSON results, rank 0 first."""
    out = launch_two(script, tmp_path, timeout, env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


# --------------------------------------------------------------------------------- _no_split_modules, auto wrapping

EXPECTED_BLOCKS = {  # the LM heads' outermost blocks
    "encoder": {"MAB"},
    "decoder": {"MAB"},
    "set_transformer": {"ISAB", "PMA", "SAB"},
    "perceiver_io": {"MAB"},
}


def every_head():
    """(family, head name, model) for every head of every family, and the Set Transformer without inducing points."""
    for family in FAMILIES:
        for name, cls in hfst.FAMILIES[family].model_classes().items():
            config = tiny_config(family, **SMALL, **({"input_size": 2} if "Gaussians" in name else {}))
            yield family, name, cls(config)
    yield "set_transformer", "AutoModelForCausalLM", lm_model("set_transformer", num_inducing_points=0)


def test_no_split_modules_name_the_blocks_each_model_holds_and_accelerate_wraps_them():
    """`_no_split_modules` is the set of outermost block classes the model holds (nothing it lacks), and accelerate's
    transformer-based wrapping (FSDP2's policy and FSDP1's plugin, class names from the model) finds every one of them
    instead of raising "Could not find the transformer layer class"."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    for family in FAMILIES:
        assert set(lm_model(family)._no_split_modules) == EXPECTED_BLOCKS[family], family
    assert set(lm_model("set_transformer", num_inducing_points=0)._no_split_modules) == {"PMA", "SAB"}
    for family, head, model in every_head():
        held = {type(m).__name__ for m in model.modules()}
        names = set(model._no_split_modules)
        assert names and names <= held, (family, head, names, held)
        policy = fsdp2_prepare_auto_wrap_policy(
            FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap"), model
        )
        wrapped = {type(m).__name__ for m in model.modules() if policy(m)}
        assert wrapped == names, (family, head, wrapped)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1, auto_wrap_policy="transformer_based_wrap")
        plugin.set_auto_wrap_policy(model)
        assert {c.__name__ for c in plugin.auto_wrap_policy.keywords["transformer_layer_cls"]} == names


# ------------------------------------------------------------------------------------------------------------ FSDP2

# every family x attention; decays; the decoder's chunked loss reads `lm_head.weight` from the root module's forward; under
# activation checkpointing (applied to the blocks before sharding) the Set Transformer with inducing points (ISAB) and
# without (SAB), whose forward must not tell its blocks apart by class, and every other family once
FSDP2_CASES = (
    [(family, a, m, {}, False) for family in FAMILIES for a, m in ATTENTIONS]
    + [("decoder", "softmax", "elu", {"lm_loss_chunk_size": 4}, False)]
    + [("set_transformer", a, m, {}, True) for a, m in ATTENTIONS]
    + [("set_transformer", "softmax", "elu", {"num_inducing_points": 0}, True)]
    + [(family, "linear", "elu", {}, True) for family in ("encoder", "decoder", "perceiver_io")]
    # a decay (the causal LM heads): the gates are parameters of the sharded blocks (ISAB's inducing points have none)
    + [("decoder", "linear", "exp", {"linear_attention_decay": "gated"}, False)]
    + [("set_transformer", "linear", "elu", {"linear_attention_decay": "gated"}, True)]
)


def fsdp2_case(family, attention_type, feature_map, overrides, checkpointed):
    """One model sharded with FSDP2 over the ranks, each running its half of the batch, against a deep copy run whole
    in this process."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
    )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    model = lm_model(family, attention_type, feature_map, **overrides)
    reference = copy.deepcopy(model)
    blocks = set(model._no_split_modules)
    if checkpointed:
        apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ in blocks)
        units = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    else:
        units = [m for m in model.modules() if type(m).__name__ in blocks]
    for unit in units:
        fully_shard(unit)
    fully_shard(model)

    input_ids, labels = lm_batch(family)
    loss = model(input_ids=rank_rows(input_ids), labels=rank_rows(labels)).loss
    loss.backward()
    # named as in the reference: without the checkpoint wrapper's inner module
    grads = {
        name.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor() for name, p in model.named_parameters()
    }
    torch.optim.SGD(model.parameters(), lr=LR).step()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    reference_loss, reference_grads = reference_step(reference, family)
    return {
        "case": case_name(family, attention_type, feature_map, overrides, checkpointed),
        "units": len(units),
        "sharding": [sharding_of(model), sharding_of(reference)],
        "loss": [mean_over_ranks(loss), reference_loss],
        "grad_differences": differences(grads, reference_grads),
        # with cpu_offload, rank 0 alone receives the full state dict (the others an empty one)
        "state_dict_differences": differences(state, reference.state_dict()) if dist.get_rank() == 0 else None,
        "state_dict_keys": len(state),
    }


FSDP2_SCRIPT = """
import json, sys
from pathlib import Path
import torch
import torch.distributed as dist
sys.path.insert(0, ".")  # the working directory: the repository, whose tests/ is a package
from tests.helpers import leave_process_group
from tests.integration.test_model_level_sharding import FSDP2_CASES, fsdp2_case

torch.set_num_threads(1)
dist.init_process_group("gloo")
results = [fsdp2_case(*case) for case in FSDP2_CASES]
(Path(sys.argv[1]) / f"rank-{dist.get_rank()}.json").write_text(json.dumps(results))
leave_process_group()
"""


@pytest.mark.slow
def test_fsdp2_sharded_lm_heads_match_one_process(tmp_path):
    """Every family x {softmax, linear elu, linear exp}, `fully_shard` on each `_no_split_modules` block then the root
    (2 ranks, 2 rows each): the loss averaged over the ranks is the full batch's loss in one process, every gathered
    gradient is the one-process gradient (FSDP2 averages over ranks), the full state dict after an SGD step has the
    reference's keys and values, and `sharding_of` says "FSDP2" (None for the unsharded copy). The same holds with
    the blocks under `checkpoint_wrapper` before sharding."""
    ranks = run_launched(FSDP2_SCRIPT, tmp_path)
    assert [r["case"] for r in ranks[0]] == [case_name(*case) for case in FSDP2_CASES]
    for rank, results in enumerate(ranks):
        for r in results:
            assert r["units"] >= 2, r
            assert r["sharding"] == ["FSDP2", None], r
            assert math.isclose(*r["loss"], rel_tol=RTOL, abs_tol=ATOL), r
            assert r["grad_differences"] == {}, r
            if rank == 0:
                assert r["state_dict_differences"] == {}, r
                assert r["state_dict_keys"] > 0, r


def fsdp1_case(family, attention_type, feature_map):
    """FSDP1's wrapper (`FullyShardedDataParallel` around each `_no_split_modules` block and the root, as accelerate's
    transformer-based wrapping does): the blocks are wrapper objects, not the model's classes."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from hf_settransformer import blocks

    model = lm_model(family, attention_type, feature_map)
    reference = copy.deepcopy(model)
    policy = ModuleWrapPolicy({getattr(blocks, name) for name in model._no_split_modules})
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=torch.device("cpu"),
                                       use_orig_params=True)
    input_ids, labels = lm_batch(family)
    loss = wrapped(input_ids=rank_rows(input_ids), labels=rank_rows(labels)).loss
    loss.backward()
    with FullyShardedDataParallel.summon_full_params(wrapped, with_grads=True):
        grads = {name.replace("_fsdp_wrapped_module.", ""): p.grad.clone() for name, p in wrapped.named_parameters()}
    reference_loss, reference_grads = reference_step(reference, family)
    return {
        "case": case_name(family, attention_type, feature_map, {}),
        "units": sum(isinstance(m, FullyShardedDataParallel) for m in wrapped.modules()),
        "sharding": [sharding_of(wrapped), sharding_of(reference)],
        "loss": [mean_over_ranks(loss), reference_loss],
        "grad_differences": differences(grads, reference_grads),
    }


FSDP1_CASES = [(family, a, m) for family in FAMILIES for a, m in ATTENTIONS]
FSDP1_SCRIPT = FSDP2_SCRIPT.replace("FSDP2_CASES, fsdp2_case", "FSDP1_CASES, fsdp1_case").replace(
    "[fsdp2_case(*case) for case in FSDP2_CASES]", "[fsdp1_case(*case) for case in FSDP1_CASES]"
)


@pytest.mark.slow
def test_fsdp1_wrapped_lm_heads_match_one_process(tmp_path):
    """Every family x attention under FSDP1's wrappers (2 ranks, 2 rows each): the forward runs (the Set Transformer
    used to tell ISAB from SAB by `isinstance`, which the wrapper defeats), the loss averaged over the ranks and every
    gathered gradient are one process's, and `sharding_of` says "FSDP"."""
    ranks = run_launched(FSDP1_SCRIPT, tmp_path)
    assert [r["case"] for r in ranks[0]] == [case_name(*case, {}) for case in FSDP1_CASES]
    for results in ranks:
        for r in results:
            assert r["units"] >= 2 and r["sharding"] == ["FSDP", None], r
            assert math.isclose(*r["loss"], rel_tol=RTOL, abs_tol=ATOL), r
            assert r["grad_differences"] == {}, r


# ------------------------------------------------------------------------------------------------- DeepSpeed ZeRO-3

ZERO3_CONFIG = {
    "train_micro_batch_size_per_gpu": ROWS // 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,  # plain SGD: the step is exact, so the weights can be compared
    "fp16": {"enabled": False},
    "bf16": {"enabled": False},
    "gradient_clipping": 0.0,
    "steps_per_print": 1_000_000,
}

ZERO3_CASES = [(family, a, m, {}) for family in FAMILIES for a, m in ATTENTIONS] + [
    ("decoder", "softmax", "elu", {"lm_loss_chunk_size": 4})
]


def zero3_step(model, family):
    """`deepspeed.initialize` over `model` with SGD, one step on this rank's rows: (engine, loss)."""
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=ZERO3_CONFIG
    )
    input_ids, labels = lm_batch(family)
    loss = engine(input_ids=rank_rows(input_ids), labels=rank_rows(labels)).loss
    engine.backward(loss)
    engine.step()
    return engine, loss


def zero3_case(family, attention_type, feature_map, overrides):
    """One model under a ZeRO-3 engine, each rank running its half of the batch, against a deep copy taking the same
    SGD step on the whole batch in this process."""
    import deepspeed

    model = lm_model(family, attention_type, feature_map, **overrides)
    reference = copy.deepcopy(model)
    engine, loss = zero3_step(model, family)
    sharding = sharding_of(engine.module)
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        weights = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    partitioned = all(p.numel() == 0 for p in params)  # again, once gathered
    engine.destroy()
    reference_loss, _ = reference_step(reference, family)
    return {
        "case": case_name(family, attention_type, feature_map, overrides),
        "sharding": [sharding, sharding_of(reference)],
        "partitioned": partitioned,
        "loss": [mean_over_ranks(loss), reference_loss],
        "weight_differences": differences(weights, dict(reference.named_parameters())),
    }


def zero3_save_case(family, folder):
    """The save a Trainer makes under ZeRO-3 (`stage3_gather_16bit_weights_on_model_save`): the engine's consolidated
    state dict through `save_pretrained`, against one process saving the reference after the same SGD step. On rank
    0 (the one that saves): the differences of the weights files and of the code files."""
    from safetensors.torch import load_file

    model = lm_model(family)
    reference = copy.deepcopy(model)
    engine, _ = zero3_step(model, family)
    state = engine._zero3_consolidated_16bit_state_dict()  # collective; the whole state on rank 0 only
    result = {"case": family}
    if dist.get_rank() == 0:
        engine.module.save_pretrained(Path(folder) / f"{family}-zero3", state_dict=state)
        reference_step(reference, family)
        reference.save_pretrained(Path(folder) / f"{family}-one")
        saved, alone = (load_file(Path(folder) / f"{family}-{kind}" / "model.safetensors") for kind in ("zero3", "one"))
        code = [sorted(p.name for p in (Path(folder) / f"{family}-{kind}").glob("*.py")) for kind in ("zero3", "one")]
        result.update(weight_differences=differences(saved, alone), code=code)
    engine.destroy()
    return result


def init_deviations(model):
    """What `HfstPreTrainedModel._init_weights` promises, checked on gathered weights: a list of the modules whose
    weights break it (ScaleNorm weights sqrt(hidden_size), zero biases, Linear/Embedding/learned-vector weights with
    std `initializer_range` within 30%, all finite)."""
    std, found = model.config.initializer_range, []
    for name, module in model.named_modules():
        if any(not torch.isfinite(p).all() for p in module.parameters(recurse=False)):
            found.append(f"{name}: not finite")
        if isinstance(module, ScaleNorm):
            if not torch.allclose(module.weight, torch.full((1,), math.sqrt(module.hidden_size))):
                found.append(f"{name}: ScaleNorm weight {module.weight.tolist()}")
        elif isinstance(module, (FeatureProjection, AdaptiveProjection)):
            continue  # fan-in std (none in these token models)
        elif isinstance(module, (nn.Linear, nn.Embedding, LearnedVectors)):
            if module.weight.numel() >= 64 and not 0.7 * std < float(module.weight.std()) < 1.3 * std:
                found.append(f"{name}: weight std {float(module.weight.std()):.4f}, not {std}")
            if getattr(module, "bias", None) is not None and module.bias.abs().max() > 0:
                found.append(f"{name}: bias not zero")
    return found


def zero_init_case(family):
    """The model built by `from_config` while an `HfDeepSpeedConfig` is alive (transformers then builds it under
    `deepspeed.zero.Init`): partitioned at construction, initialised as the package does, trainable under the
    engine."""
    import deepspeed
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    keep = HfDeepSpeedConfig({**ZERO3_CONFIG, "train_batch_size": ROWS})  # noqa: F841 (zero.Init while it lives)
    # initializer_range 0.02: torch's default Linear init (std 1 / sqrt(3 * 16) ~ 0.14) is then far outside it
    config = tiny_config(family, **SMALL, initializer_range=0.02)
    model = getattr(transformers, LM_HEADS[family]).from_config(config).train()
    params = list(model.parameters())
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in params)
    sharding = sharding_of(model)
    with deepspeed.zero.GatheredParameters(params):
        deviations = init_deviations(model)
    engine, loss = zero3_step(model, family)
    result = {
        "case": family,
        "partitioned": partitioned,
        "sharding": [sharding, sharding_of(engine.module)],
        "init_deviations": deviations,
        "loss": mean_over_ranks(loss),
    }
    engine.destroy()
    return result


ZERO3_SCRIPT = """
import json, sys
from pathlib import Path
import torch
import torch.distributed as dist
import deepspeed
sys.path.insert(0, ".")  # the working directory: the repository, whose tests/ is a package
from tests.helpers import leave_process_group
from tests.integration.test_model_level_sharding import FAMILIES, ZERO3_CASES, zero3_case, zero3_save_case, zero_init_case

torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")  # DeepSpeed's CPU accelerator: gloo when oneCCL is absent
results = {
    "backend": dist.get_backend(),
    "steps": [zero3_case(*case) for case in ZERO3_CASES],
    "zero_init": [zero_init_case(family) for family in FAMILIES],
    "saves": [zero3_save_case(family, sys.argv[1]) for family in ("decoder", "set_transformer")],
}
(Path(sys.argv[1]) / f"rank-{dist.get_rank()}.json").write_text(json.dumps(results))
leave_process_group()
"""


@pytest.mark.slow
def test_deepspeed_zero3_lm_heads_match_one_process(tmp_path):
    """Every family x {softmax, linear elu, linear exp} under a ZeRO-3 engine (fp32, SGD, 2 ranks of 2 rows): the
    loss averaged over the ranks is the full batch's, and after `engine.step()` the gathered weights are those of the
    one-process model that took the same SGD step on the mean loss of the whole batch; the engine's parameters are
    partitioned and `sharding_of` says "DeepSpeed ZeRO-3" (None unsharded). `from_config` under `HfDeepSpeedConfig`
    builds each family partitioned (`zero.Init`), initialised by `_init_weights`, and a training step runs. The
    engine's consolidated state dict saved by `save_pretrained` is the one-process folder."""
    ranks = run_launched(ZERO3_SCRIPT, tmp_path)
    assert [r["backend"] for r in ranks] == ["gloo", "gloo"]
    assert [r["case"] for r in ranks[0]["steps"]] == [case_name(*case) for case in ZERO3_CASES]
    for results in ranks:
        for r in results["steps"]:
            assert r["sharding"] == ["DeepSpeed ZeRO-3", None], r
            assert r["partitioned"], r
            assert math.isclose(*r["loss"], rel_tol=RTOL, abs_tol=ATOL), r
            assert r["weight_differences"] == {}, r
        assert [r["case"] for r in results["zero_init"]] == FAMILIES
        for r in results["zero_init"]:
            assert r["partitioned"], r
            assert r["sharding"] == ["DeepSpeed ZeRO-3"] * 2, r
            assert r["init_deviations"] == [], r
            assert math.isfinite(r["loss"]), r
    for r in ranks[0]["saves"]:  # a Trainer's final save: the folder one process writes (tied weights once)
        assert r["weight_differences"] == {} and r["code"][0] == r["code"][1] and r["code"][0], r


@pytest.mark.parametrize("family", FAMILIES)
def test_device_map_auto_keeps_blocks_whole_and_gives_the_same_logits(tmp_path, family):
    """`from_pretrained(device_map="auto")` with a memory limit of 80% of the weights: part of the model stays in
    memory, the rest is offloaded to disk, split only between the blocks `_no_split_modules` names, and the logits are
    the model's own."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = hfst.FAMILIES[family].model_classes()["AutoModelForCausalLM"](tiny_config(family)).eval()
    model.save_pretrained(tmp_path / "model")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map="auto", max_memory={"cpu": int(size * 0.8)},
                                                  offload_folder=tmp_path / "offload").eval()
    placed = loaded.hf_device_map
    assert set(placed.values()) == {"cpu", "disk"}, placed
    blocks = {name for name, module in loaded.named_modules() if type(module).__name__ in loaded._no_split_modules}
    assert not any(name.startswith(f"{block}.") for name in placed for block in blocks), placed  # never inside one
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)

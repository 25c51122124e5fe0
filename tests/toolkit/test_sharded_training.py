"""Training past one device through the Trainer: FSDP2 with the shipped accelerate config (configs/accelerate/
fsdp2.yaml) on two gloo processes, for every family, and the replica check under data parallelism.

accelerate 1.15 runs FSDP only on GPU-type devices; `tests/fixtures/fsdp_on_cpu.py` lets CPU processes take its code
path (wrapping, sharded forward and backward, gathering the state dict, saving). Model-level FSDP2 and DeepSpeed
ZeRO-3 equivalence are in test_model_level_sharding.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.helpers import common_args, free_port, launch_two, write_corpus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_lm.py"
FSDP_ON_CPU = ROOT / "tests" / "fixtures" / "fsdp_on_cpu.py"
FSDP2_CONFIG = ROOT / "configs" / "accelerate" / "fsdp2.yaml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))

FAMILIES = ["decoder", "encoder", "set_transformer", "perceiver_io"]


def launch(config, args, timeout=600):
    """Two processes from an accelerate `config` through the FSDP test device (None: plain data parallelism) running
    train_lm.py `args`."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    if config:
        command += ["--config_file", str(config), str(FSDP_ON_CPU)]
    else:
        command += ["--multi_gpu", "--num_machines", "1"]
    command += [str(SCRIPT)] + [str(a) for a in args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def training_args(corpus, out, family, extra=()):
    """4 steps, a checkpoint and a validation every 2: the run ends with its best checkpoint."""
    args = common_args(corpus, out, family, steps=4, extra=["--save_strategy", "steps", "--save_steps", 2,
                                                             "--eval_strategy", "steps", "--eval_steps", 2, *extra])
    drop = args.index("--save_strategy")  # common_args' "no", replaced by the extra's
    return args[:drop] + args[drop + 2:]


LOAD_WITHOUT_THE_PACKAGE = """
import json, sys
sys.modules["hf_settransformer"] = None  # the code must come with the checkpoint
import torch, transformers
model = getattr(transformers, sys.argv[2]).from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
ids = torch.tensor([json.loads(sys.argv[3])])
with torch.no_grad():
    print(json.dumps(model(input_ids=ids).logits.flatten().tolist()))
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp2_trains_evaluates_and_saves_with_the_shipped_config(tmp_path, corpus, family):
    """Default wrapping (the model's `_no_split_modules`), an evaluation every rank takes part in, sharded checkpoints
    and a final folder like one process's: the weights whole with tied weights once, the package's code and no file of
    torch's, loadable without the package with the same logits; its perplexity is the one-process evaluation's."""
    import transformers

    import hf_settransformer  # noqa: F401  (registers the Auto classes)

    out = tmp_path / "fsdp2"
    result = launch(FSDP2_CONFIG, training_args(corpus, out, family))
    results = json.loads((out / "all_results.json").read_text())
    assert results["device"].endswith("x 2") and results["replica_checksums"] is None
    assert "replica check skipped: the parameters are sharded (FSDP2)" in result.stdout + result.stderr
    # the default methods cannot shard: AdamW and no average, said at the start
    assert "--optimizer auto is adamw (accelerate's FSDP" in result.stdout + result.stderr
    assert "--average_weights auto is none (accelerate's FSDP" in result.stdout + result.stderr
    # SHARDED_STATE_DICT checkpoints (each rank's part); the run ends with its best one, the same on every rank
    state = json.loads((out / "trainer_state.json").read_text())
    losses = {e["step"]: e["eval_loss"] for e in state["log_history"] if "eval_loss" in e}
    assert results["selected_step"] == min(losses, key=losses.get) and results["selected_by"] == "best eval_loss"
    assert (out / f"checkpoint-{results['selected_step']}" / "pytorch_model_fsdp_0").is_dir()

    # the folder one process would write
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # every family's language-model head
    model.save_pretrained(tmp_path / "one_process")
    py_files = {p.name for p in out.glob("*.py")}
    assert py_files == {p.name for p in (tmp_path / "one_process").glob("*.py")}
    assert not any(name.startswith("_fsdp") for name in py_files)
    saved, alone = load_file(out / "model.safetensors"), load_file(tmp_path / "one_process" / "model.safetensors")
    assert saved.keys() == alone.keys()  # tied weights stored once
    assert "lm_head.weight" not in saved or not model.config.tie_word_embeddings
    assert all(torch.equal(saved[k], alone[k]) for k in saved)
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]

    # the same perplexities from one process reading the saved folder
    again = tmp_path / "one_process_eval"
    args = common_args(corpus, again, family, steps=4)
    args = [a for a in args if a != "--do_train"] + ["--model_name_or_path", out]
    subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], check=True, capture_output=True, cwd=ROOT,
                   timeout=300)
    alone_results = json.loads((again / "all_results.json").read_text())
    assert alone_results["eval_protocol"] == results["eval_protocol"]
    for key in ("validation_perplexity", "test_perplexity", "validation_tokens_scored", "test_tokens_scored"):
        assert alone_results[key] == pytest.approx(results[key], rel=1e-6), key

    # loaded where the package is absent, the same logits
    ids = [3, 5, 7, 2, 4, 6, 8, 9]
    loaded = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_THE_PACKAGE, str(out), "AutoModelForCausalLM",
                             json.dumps(ids)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    with torch.no_grad():
        local = model(input_ids=torch.tensor([ids])).logits.flatten()
    torch.testing.assert_close(torch.tensor(json.loads(loaded.stdout.strip().splitlines()[-1])), local)


@pytest.mark.parametrize("packing", [False, True], ids=["blocks", "packed"])
def test_fsdp2_trains_the_weights_data_parallelism_trains(tmp_path, corpus, packing):
    """The same run under FSDP2 (full state dict this time) and DDP ends with the same weights, on blocks of the
    running text or on packed rows of lines (each process its own rows). In fp32: on a CPU with a bf16 path
    `--precision auto` trains in bf16, where the two runs end further apart than this tolerance."""
    fsdp = tmp_path / "fsdp2_full"
    config = tmp_path / "fsdp2_full.yaml"
    config.write_text(FSDP2_CONFIG.read_text().replace("SHARDED_STATE_DICT", "FULL_STATE_DICT"))
    extra = ["--attention_type", "linear", "--precision", "fp32", *(["--packing", "true"] if packing else []),
             "--optimizer", "adamw", "--average_weights", "none"]  # FSDP's fallbacks from auto, for both runs
    launch(config, training_args(corpus, fsdp, "decoder", extra=extra))
    ddp = tmp_path / "ddp"
    launch(None, training_args(corpus, ddp, "decoder", extra=extra))
    results = json.loads((ddp / "all_results.json").read_text())
    assert results["replica_checksums"] is not None and results["packing"] is packing  # DDP: checked
    sharded, replicated = load_file(fsdp / "model.safetensors"), load_file(ddp / "model.safetensors")
    assert sharded.keys() == replicated.keys()
    for name in sharded:
        torch.testing.assert_close(sharded[name], replicated[name], atol=1e-6, rtol=1e-5, msg=name)


REPLICAS = """
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, ".")  # the working directory: the repository, whose tests/ is a package
from hf_settransformer import toolkit
from tests.helpers import decoder_trainer, leave_process_group

trainer = decoder_trainer(sys.argv[1], use_cpu=True)
rank = trainer.args.process_index
assert trainer.args.world_size == 2 and torch.distributed.is_initialized()
same = toolkit.measure.replica_checksums(trainer)
with torch.no_grad():
    if rank == 1:
        next(trainer.model.parameters()).add_(1e-3)  # one replica drifts
try:
    toolkit.measure.replica_checksums(trainer)
    caught = None
except RuntimeError as err:
    caught = str(err)
(Path(sys.argv[1]) / f"replicas-{rank}.json").write_text(json.dumps({"same": same, "caught": caught}))
leave_process_group()
"""


def test_the_replica_check_catches_a_replica_that_drifted_under_data_parallelism(tmp_path):
    out = launch_two(REPLICAS, tmp_path)
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("replicas-*.json"))]
    assert len(reports) == 2
    for report in reports:
        assert len(report["same"]) == 2 and report["same"][0] == report["same"][1]
        assert report["caught"] and "Data-parallel replicas disagree" in report["caught"]

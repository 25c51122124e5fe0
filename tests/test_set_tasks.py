"""hf_settransformer.set_tasks generators, the mixture-of-Gaussians head, a few Trainer steps per task lowering the loss."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hf_settransformer as hfst
from hf_settransformer import set_tasks
from hf_settransformer.modeling_set_transformer import mixture_log_likelihood
from hf_settransformer.training import COMPLETE_MARKER

ROOT = Path(__file__).resolve().parents[1]


def test_max_regression_generator():
    data = set_tasks.MaxRegression(200, seed=3)
    sizes = set()
    for i in range(200):
        item = data[i]
        x = item["input_features"]
        assert x.shape[1] == 1 and 1 <= len(x) <= 10 and 0 <= x.min() and x.max() < 100
        assert item["labels"] == x.max()
        sizes.add(len(x))
    assert sizes == set(range(1, 11))
    assert torch.equal(data[7]["input_features"], set_tasks.MaxRegression(200, seed=3)[7]["input_features"])
    integers = set_tasks.MaxRegression(10, values="integer")[0]["input_features"]
    assert torch.equal(integers, integers.round())


def test_mixture_generator_and_oracle():
    data = set_tasks.MixtureOfGaussians(20, seed=1)
    for i in range(20):
        weights, means, stds, _ = data.parameters(i)
        x = data[i]["input_features"]
        assert 300 <= len(x) < 600 and x.shape[1] == 2
        assert torch.isclose(weights.sum(), torch.tensor(1.0)) and (means.abs() <= 4).all()
        truth = mixture_log_likelihood(x[None], weights.log()[None], means[None], stds[None]).mean()
        shifted = mixture_log_likelihood(x[None], weights.log()[None], means[None] + 0.5, stds[None]).mean()
        assert truth > shifted  # the generating mixture explains its points best
    # the paper's oracle is about -1.47 per point (Table 3)
    oracle = torch.stack(
        [
            mixture_log_likelihood(
                data[i]["input_features"][None],
                data.parameters(i)[0].log()[None],
                data.parameters(i)[1][None],
                data.parameters(i)[2][None],
            ).mean()
            for i in range(20)
        ]
    ).mean()
    assert -1.6 < oracle < -1.35


def test_point_cloud_generator():
    data = set_tasks.PointClouds(64, seed=0, min_size=200, max_size=300, noise=0.0)
    labels = set()
    for i in range(64):
        item = data[i]
        x, label = item["input_features"], item["labels"]
        assert 200 <= len(x) <= 300 and x.shape[1] == 3 and 0 <= label < len(set_tasks.SHAPES)
        labels.add(label)
        radius = x.norm(dim=1)
        if set_tasks.SHAPES[label] == "sphere":
            assert radius.std() / radius.mean() < 1e-4  # rotation and isotropic scale keep a sphere a sphere
    assert len(labels) >= 6


def test_mixture_head_loss_and_padding():
    config = hfst.SetTransformerConfig(
        input_size=2,
        hidden_size=32,
        num_seeds=4,
        num_inducing_points=4,
        num_hidden_layers=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = hfst.SetTransformerForMixtureOfGaussians(config).eval()
    x = torch.randn(2, 30, 2)
    out = model(input_features=x)
    ll = mixture_log_likelihood(x, out.mixture_logits, out.means, out.stds)
    assert torch.allclose(out.loss, -ll.mean(), atol=1e-6)
    assert out.means.shape == (2, 4, 2) and (out.stds > 0).all()
    padded = torch.cat([x, 50 * torch.randn(2, 10, 2)], dim=1)
    mask = torch.cat([torch.ones(2, 30), torch.zeros(2, 10)], dim=1)
    again = model(input_features=padded, attention_mask=mask)
    assert torch.allclose(again.loss, out.loss, atol=1e-5)
    assert torch.allclose(again.log_likelihood, out.log_likelihood, atol=1e-5)
    with pytest.raises(ValueError, match="input_size"):
        hfst.SetTransformerForMixtureOfGaussians(hfst.SetTransformerConfig(vocab_size=10))


@pytest.mark.parametrize(
    "task,extra",
    [
        ("max_regression", ["--learning_rate", "3e-3"]),
        ("max_regression", ["--model", "deepsets_max", "--learning_rate", "3e-3"]),
        ("mixture_of_gaussians", ["--min_size", "40", "--max_size", "80", "--attention_type", "linear"]),
        (
            "point_clouds",
            ["--min_size", "64", "--max_size", "128", "--norm_type", "layernorm", "--initializer_range", "0.03"],
        ),
    ],
)
def test_a_few_trainer_steps_lower_the_loss(tmp_path, task, extra):
    args = [
        sys.executable,
        str(ROOT / "scripts" / "train_sets.py"),
        "--task",
        task,
        "--output_dir",
        str(tmp_path),
        "--max_steps",
        "40",
        "--per_device_train_batch_size",
        "16",
        "--per_device_eval_batch_size",
        "32",
        "--eval_sets",
        "64",
        "--hidden_size",
        "32",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--learning_rate",
        "2e-3",
        *extra,
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert sum(losses[-5:]) / 5 < losses[0], losses
    results = json.loads((tmp_path / "all_results.json").read_text())
    metric = {"max_regression": "mae", "mixture_of_gaussians": "log_likelihood_per_point", "point_clouds": "accuracy"}[
        task
    ]
    assert math.isfinite(results[metric])
    assert results["lr_scheduler"] == "linear" and results["batch_size"] == 16 and results["steps"] == 40
    if "--model" not in extra:  # a Set Transformer (the rFF baselines have no config)
        config = json.loads((tmp_path / "config.json").read_text())
        norm = extra[extra.index("--norm_type") + 1] if "--norm_type" in extra else "scalenorm"
        assert config["norm_type"] == norm and (norm in results["model"]) == (norm != "scalenorm")
        # the init std: given, or the task's default (0.05 for the mixture of Gaussians), named when not 0.02
        std = float(extra[extra.index("--initializer_range") + 1]) if "--initializer_range" in extra else None
        std = std or {"max_regression": 0.02, "mixture_of_gaussians": 0.05, "point_clouds": 0.02}[task]
        assert config["initializer_range"] == results["initializer_range"] == std
        assert (f"init {std:g}" in results["model"]) == (std != 0.02)


def test_resume_from_checkpoint_true_starts_fresh_then_continues(tmp_path):
    def run(max_steps, seed):
        args = [
            sys.executable,
            str(ROOT / "scripts" / "train_sets.py"),
            "--task",
            "max_regression",
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            str(max_steps),
            "--per_device_train_batch_size",
            "8",
            "--eval_sets",
            "16",
            "--hidden_size",
            "16",
            "--logging_steps",
            "1",
            "--save_steps",
            "3",
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--resume_from_checkpoint",
            "true",
            "--seed",
            str(seed),
        ]
        result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
        run.stdout = result.stdout
        return json.loads((tmp_path / "trainer_state.json").read_text())

    first = run(3, seed=0)  # no checkpoint yet: "true" means start from scratch, not an error
    assert first["global_step"] == 3 and (tmp_path / "checkpoint-3").is_dir()
    assert f"[train_sets] no complete checkpoint in {tmp_path}: training starts at step 0" in run.stdout
    # picks up checkpoint-3: steps 1-3 are the first run's (a fresh start with another seed would log other losses)
    second = run(6, seed=1)
    losses = {e["step"]: e["loss"] for e in second["log_history"] if "loss" in e}
    assert second["global_step"] == 6 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert [losses[i] for i in (1, 2, 3)] == [e["loss"] for e in first["log_history"] if "loss" in e]
    # the checkpoints carry the package's completion marker; the resumed run reports the whole run's training time
    assert (tmp_path / "checkpoint-6" / COMPLETE_MARKER).is_file()
    results = json.loads((tmp_path / "all_results.json").read_text())
    assert results["train_seconds"] > results["train_seconds_this_process"] > 0
    # restarted after its last checkpoint: evaluates again without a 7th step
    third = run(6, seed=1)
    assert third["global_step"] == 6
    assert {e["step"]: e["loss"] for e in third["log_history"] if "loss" in e} == losses


def run_train_sets(output_dir, *extra, check=True):
    args = [sys.executable, str(ROOT / "scripts" / "train_sets.py"), "--output_dir", str(output_dir)]
    args += ["--per_device_train_batch_size", "4", "--eval_sets", "8", "--min_size", "20", "--max_size", "40"]
    args += ["--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", *map(str, extra)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_model_name_or_path_continues_a_saved_model(tmp_path):
    mog = ["--task", "mixture_of_gaussians"]
    run_train_sets(tmp_path / "first", *mog, "--max_steps", 5, "--hidden_size", 16, "--num_decoder_layers", 2)
    first = json.loads((tmp_path / "first" / "all_results.json").read_text())
    # at learning rate 0 the continued model is the saved one: the same log-likelihood on the same fresh sets
    run_train_sets(
        tmp_path / "second", *mog, "--max_steps", 3, "--learning_rate", 0, "--model_name_or_path", tmp_path / "first"
    )
    second = json.loads((tmp_path / "second" / "all_results.json").read_text())
    assert second["log_likelihood_per_point"] == pytest.approx(first["log_likelihood_per_point"], rel=1e-6)
    assert second["parameters"] == first["parameters"] and second["hidden_size"] == 16
    assert second["num_decoder_layers"] == 2  # from the checkpoint's config, not the task default (1)
    assert second["steps"] == 3 and second["steps_before"] == 5
    assert second["train_seconds_before"] == pytest.approx(first["train_seconds"])
    # the architecture comes from the checkpoint: giving it too is an error, as is another task's checkpoint
    clash = run_train_sets(
        tmp_path / "x",
        *mog,
        "--max_steps",
        1,
        "--hidden_size",
        32,
        "--model_name_or_path",
        tmp_path / "first",
        check=False,
    )
    assert clash.returncode != 0 and "--hidden_size: the model comes from --model_name_or_path" in clash.stderr
    other = run_train_sets(
        tmp_path / "y",
        "--task",
        "point_clouds",
        "--max_steps",
        1,
        "--model_name_or_path",
        tmp_path / "first",
        check=False,
    )
    assert other.returncode != 0
    assert "the point_clouds task needs a SetTransformerForSequenceClassification" in other.stderr


def test_pma_classifier_learns_point_clouds_from_fresh_sets():
    """Set elements embedded at std 0.02 all look alike after a few blocks and a PMA head stays at chance (ln 8):
    the fan-in initialisation of the feature projection is what lets it learn (`layers.FeatureProjection`)."""
    torch.manual_seed(0)
    data = set_tasks.PointClouds(3200, seed=0, min_size=32, max_size=64)
    collate = hfst.DataCollatorForSets()
    config = hfst.SetTransformerConfig(
        input_size=3,
        num_labels=len(set_tasks.SHAPES),
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=64,
        num_inducing_points=8,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = hfst.SetTransformerForSequenceClassification(config)
    projection = model.model.embeddings.feature_projection.weight
    assert abs(float(projection.detach().std()) * math.sqrt(3) - 1) < 0.2
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(100):
        batch = collate([data[i] for i in range(32 * step, 32 * step + 32)])
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < 0.85 * math.log(len(set_tasks.SHAPES)), losses[-20:]

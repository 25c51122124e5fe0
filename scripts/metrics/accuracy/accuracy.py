"""Accuracy as an `evaluate` metric that loads from a folder, for machines without Hugging Face Hub access.

transformers' example scripts (run_clm.py, run_mlm.py, run_glue.py) call `evaluate.load("accuracy")`; `evaluate`
resolves that name to a folder `./accuracy` holding `accuracy.py` before it tries the Hub, so running those scripts
from `scripts/metrics/` (or with this folder copied beside them) makes their `--do_eval` work offline. Same inputs and
output as the Hub's metric: `compute(predictions=[int...], references=[int...])` -> {"accuracy": float}."""

import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Fraction of predictions equal to their reference.",
            citation="",
            inputs_description="predictions: list of int labels; references: list of int labels.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        weights = [1.0] * len(references) if sample_weight is None else [float(w) for w in sample_weight]
        correct = sum(w for p, r, w in zip(predictions, references, weights) if p == r)
        return {"accuracy": correct / max(sum(weights), 1e-12) if normalize else correct}

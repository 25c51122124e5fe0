"""Mean squared error as an `evaluate` metric that loads from a folder (run_glue.py's regression metric, offline):
see `scripts/metrics/accuracy/accuracy.py`. `compute(predictions=[float...], references=[float...])` -> {"mse"}."""

import datasets
import evaluate


class MSE(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Mean of the squared differences between predictions and references.",
            citation="",
            inputs_description="predictions: list of floats; references: list of floats.",
            features=datasets.Features({"predictions": datasets.Value("float"), "references": datasets.Value("float")}),
        )

    def _compute(self, predictions, references):
        return {"mse": sum((p - r) ** 2 for p, r in zip(predictions, references)) / max(len(references), 1)}

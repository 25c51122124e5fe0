"""Next-token accuracy as an `evaluate` metric that loads from this folder, so evaluation needs no Hub access:
`evaluate.load("scripts/metrics/next_token_accuracy")`. The fraction of predicted token ids equal to the reference."""

import datasets
import evaluate


class NextTokenAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Fraction of positions where the most likely next token is the reference token.",
            citation="",
            inputs_description="predictions: list of int token ids; references: list of int token ids.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        correct = sum(int(p == r) for p, r in zip(predictions, references))
        return {"accuracy": correct / max(len(references), 1)}

"""The labels each head takes, checked: a head's `check_labels` is one of the functions here (heads.py), (model,
inputs, b, n) -> (the `ClassLabels` whose ids `checks.check_input_values` reads, the length its base model sees)."""

from typing import NamedTuple

import torch

from .checks import check_prefix_length, check_targets_fit_latents
from .losses import problem_type_of


class ClassLabels(NamedTuple):
    """Labels read with the inputs: ids in [0, bound), or -100 (ignored); "token" ones against the vocabulary."""

    labels: torch.Tensor
    bound: int
    kind: str = "class"


_INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)


def check_token_labels(config, *labels):
    """Token `labels`: torch.long (cross-entropy's "expected target dtype to be Long" otherwise) -> the `ClassLabels`
    to read, in [0, vocab_size) or -100."""
    given = tuple(x for x in labels if x is not None)
    for x in given:
        if not torch.is_tensor(x) or x.dtype != torch.long:
            kind = x.dtype if torch.is_tensor(x) else type(x).__name__
            hint = " (use labels.long())" if torch.is_tensor(x) and x.dtype in _INTEGER_DTYPES else ""
            raise ValueError(
                f"`labels` must be token ids (torch.long, -100 where nothing is predicted), got {kind}{hint}."
            )
    return tuple(ClassLabels(x, config.vocab_size, "token") for x in given)


def masked_lm_labels(model, inputs, b, n):
    labels = inputs.get("labels")
    read = check_token_labels(model.config, labels)
    if labels is not None and tuple(labels.shape) != (b, n):
        raise ValueError(f"`labels` must have the inputs' shape {(b, n)} (-100 where nothing is predicted), got "
                         f"{tuple(labels.shape)}.")
    return read, n


def causal_lm_labels(model, inputs, b, n):
    return check_token_labels(model.config, inputs.get("labels"), inputs.get("shift_labels")), n


def many_target_labels(model, inputs, b, n):
    """Causal-LM labels shaped like the inputs; the targets of the window follow `prefix_length`."""
    name = type(model).__name__
    if inputs.get("input_ids") is None and inputs.get("inputs_embeds") is None:
        raise ValueError(f"{name} needs `input_ids` or `inputs_embeds`.")
    labels = inputs.get("shift_labels")
    labels = inputs.get("labels") if labels is None else labels
    read = check_token_labels(model.config, labels)
    if labels is not None and tuple(labels.shape) != (b, n):
        raise ValueError(
            f"`labels` of {name} (next_token_mode='many') are causal-LM labels shaped like the inputs, ({b}, {n}); "
            f"got {tuple(labels.shape)}. For one target per window use next_token_mode='window'."
        )
    length = min(n, model.config.context_length)
    prefix = inputs.get("prefix_length")
    if prefix is not None:
        check_prefix_length(prefix, length, what="the window has {length} tokens")
    num_targets = min(model.config.target_length, length) if prefix is None else length - prefix
    check_targets_fit_latents(model.config, num_targets)
    return read, length


def one_target_labels(model, inputs, b, n):
    """The window head: the one token after each window, (b,), or causal-LM labels shaped like `input_ids`."""
    if inputs.get("prefix_length") is not None:
        raise ValueError(
            "`prefix_length` applies to next_token_mode='many' (where the targets of a window begin); "
            "next_token_mode='window' predicts the one token after the window from all of it."
        )
    labels, shift_labels, input_ids = inputs.get("labels"), inputs.get("shift_labels"), inputs.get("input_ids")
    read = check_token_labels(model.config, labels if shift_labels is None else shift_labels)
    if shift_labels is not None:
        target = shift_labels[..., -1]
    elif labels is not None and labels.dim() == 2 and input_ids is not None and labels.shape == input_ids.shape:
        target, n = labels[:, -1], n - 1
        if n == 0:
            raise ValueError(f"`input_ids` holds sequences of length 0, shape {(b, 0)}: pass at least one element.")
    else:
        target = labels
    if target is not None and (target.dim() != 1 or target.shape[0] != b):
        raise ValueError(
            "`labels` of a next-token prediction head hold the one token that follows each window: shape (batch,) "
            f"= ({b},), or causal-LM labels shaped like `input_ids`; got {tuple(target.shape)}."
        )
    return read, min(n, model.config.context_length)


def classification_labels(model, inputs, b, n):
    """`labels` as transformers' `ForSequenceClassificationLoss` needs them for `config.problem_type` (inferred as it
    does): class indices (b,) for single-label (read against `num_labels`), (b, num_labels) 0/1 values for multi-label,
    numbers for regression. transformers would read float class ids as multi-label targets, fail on the shapes.
    A packed batch of S sets (`inputs["packing"]`, one row) takes one label per set: b is S."""
    labels, config = inputs.get("labels"), model.config
    if labels is None:
        return (), n
    if not torch.is_tensor(labels):
        raise ValueError(f"`labels` must be a tensor, got {type(labels).__name__}.")
    packing = inputs.get("packing")
    if packing is not None:
        b = packing.num_sequences
        if labels.dim() == 0 or labels.shape[0] != b:
            raise ValueError(
                f"`labels` of a packed batch hold one label (or one row of labels) per set: this batch packs S = {b} "
                f"sets (its `cu_seq_lens_q`/`cu_seq_lens_k` boundaries), so labels of shape ({b},) or ({b}, "
                f"{config.num_labels}); got {labels.dtype} of shape {tuple(labels.shape)}."
            )
    num_labels = config.num_labels
    problem, integer = problem_type_of(labels, num_labels, config)
    got = f"got {labels.dtype} of shape {tuple(labels.shape)}"
    if problem == "single_label_classification":
        if not integer or labels.shape not in ((b,), (b, 1)):
            raise ValueError(
                f"`labels` for single-label classification must be class indices, integers of shape ({b},), "
                f"{got}. Use labels.long() for float class ids; for multi-label classification pass ({b}, "
                f"{num_labels}) 0/1 labels with problem_type='multi_label_classification'; for regression set "
                "num_labels=1 or problem_type='regression'."
            )
        return (ClassLabels(labels, num_labels),), n
    if labels.dtype == torch.bool or labels.is_complex():
        if labels.dtype != torch.bool or problem != "multi_label_classification":
            raise ValueError(f"`labels` for {problem} must be real numbers, {got}.")
    if problem == "multi_label_classification":
        if labels.shape != (b, num_labels):
            hint = " (class indices? use labels.long())" if labels.shape == (b,) else ""
            raise ValueError(
                f"`labels` for multi-label classification must be 0/1 values of shape ({b}, {num_labels}), "
                f"{got}{hint}. For single-label classification pass integer class indices of shape ({b},)."
            )
    elif labels.numel() != b * num_labels:
        raise ValueError(f"`labels` for regression must hold {num_labels} value(s) per example ({b} examples), {got}.")
    return (), n

"""The heads' losses: transformers' causal-LM and token cross-entropy (0, not NaN, over no label), and the output
layer with its cross-entropy computed a chunk of positions at a time (`lm_loss_chunk_size`), never holding the whole
(positions x vocabulary) logits."""

import torch
import torch.nn.functional as F


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum over rows of -log softmax(hidden @ weight^T)[label] / divisor, `chunk` rows at a time.

    The gradient is computed in the forward, chunk by chunk (softmax - one-hot, times the weight and the hidden
    states), so the (rows x vocabulary) logits, their log-softmax and its gradient never exist whole; the backward
    only scales the stored gradients. Rows labelled -100 count for nothing. Not differentiable twice."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, divisor):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start : start + chunk], labels[start : start + chunk]
            logits = (h @ weight.t()).float()  # (c, vocab)
            keep = (y != -100).unsqueeze(1)
            target = y.clamp_min(0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            total += ((lse - logits.gather(1, target)) * keep).sum()
            if grad_hidden is None and grad_weight is None:
                continue
            grad = logits.sub_(lse).exp_()  # softmax, in place of the logits
            grad.scatter_add_(1, target, -torch.ones_like(lse))  # minus the one-hot label
            grad = (grad * keep).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.t().float(), h.float())
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.divisor, ctx.weight_dtype = divisor, weight.dtype
        return total / divisor

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output / ctx.divisor
        return (
            None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def chunked_causal_lm_loss(hidden_states, weight, labels, chunk_size, num_items_in_batch=None, shift_labels=None):
    """The causal-LM loss of `transformers`' `ForCausalLMLoss` (labels shifted left, -100 ignored, mean over the
    counted tokens or sum / `num_items_in_batch`) computed by `_ChunkedLinearCrossEntropy` from the hidden states
    and the output layer's weight, without the full logits."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    shift_labels = shift_labels.reshape(-1).to(hidden.device)
    if num_items_in_batch is not None:
        divisor = num_items_in_batch.to(hidden.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
    else:
        divisor = (shift_labels != -100).sum().clamp_min(1)
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, shift_labels, chunk_size, divisor)


def causal_lm_loss(logits, labels, num_items_in_batch=None, shift_labels=None):
    """transformers' causal-LM loss (`ForCausalLMLoss`): position i predicts `labels[:, i + 1]` (or `shift_labels[:, i]`,
    already aligned), -100 ignored, summed over / `num_items_in_batch` or the counted labels; over no label at all
    it is 0 with a zero gradient, where transformers' mean gives NaN."""
    if shift_labels is None:
        if labels.shape != logits.shape[:-1]:
            raise ValueError(
                f"`labels` must have the inputs' shape {tuple(logits.shape[:-1])} (usually `input_ids`; shifted "
                f"inside), got {tuple(labels.shape)}."
            )
        shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return token_loss(logits, shift_labels, num_items_in_batch)


def token_loss(logits, labels, num_items_in_batch=None):
    """Cross-entropy of (..., vocab) `logits` against (...) `labels` at the same positions (no shift), -100 ignored:
    summed, / `num_items_in_batch` (the Trainer's count over a gradient-accumulation step) or / the counted labels.
    No labels to count gives 0 with a zero gradient (transformers' mean reduction gives NaN), and no row is selected
    (no host sync)."""
    labels = labels.to(logits.device)
    total = F.cross_entropy(logits.flatten(0, -2).float(), labels.reshape(-1), ignore_index=-100, reduction="sum")
    if num_items_in_batch is None:
        return total / (labels != -100).sum().clamp_min(1)
    divisor = num_items_in_batch.to(total.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
    return total / (divisor.clamp_min(1) if torch.is_tensor(divisor) else max(divisor, 1))


def problem_type_of(labels, num_labels, config):
    """(`config.problem_type`, or what transformers infers from the labels as `ForSequenceClassificationLoss` does;
    whether the labels are integers)."""
    integer = not labels.is_floating_point() and labels.dtype != torch.bool and not labels.is_complex()
    problem = config.problem_type or (
        "regression" if num_labels == 1 else "single_label_classification" if integer else "multi_label_classification"
    )
    return problem, integer

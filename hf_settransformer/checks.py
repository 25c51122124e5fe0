"""The input checks every model runs, each raising a ValueError that names the input and the fix: shapes, ids,
positions and masks (read from the device once per forward, `check_input_values`), keyword typos, labels (token and
class), prefix lengths and generate()'s arguments."""

import difflib
import inspect
from typing import NamedTuple

import torch


def check_attention_mask(attention_mask, batch_size, length, name="attention_mask"):
    """(b, n) mask, 1 / True for real elements and 0 / False for padding -> bool (b, n), or None. Checks the shape and
    reads no values: the base model's `embed_inputs` checks them, once per batch (`check_input_values`). A `length`
    that is a tensor (a cache counting on the device) is not read: only the batch size is checked then."""
    if attention_mask is None:
        return None
    if (
        attention_mask.dim() != 2
        or attention_mask.shape[0] != batch_size
        or (not torch.is_tensor(length) and attention_mask.shape[1] != length)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length) = ({batch_size}, {length}) matching the inputs, "
            f"got {tuple(attention_mask.shape)}."
        )
    return attention_mask.bool()


def check_input_values(input_ids=None, attention_mask=None, vocab_size=None, position_ids=None, max_positions=None,
                       labels=()):
    """The one place a forward reads values back from the device: once per batch, in one read. `input_ids` must lie in
    the vocabulary and `position_ids` (learned positions, given by the caller) below `max_positions` (a CUDA embedding
    would fail with a device-side assert); `attention_mask` must hold only 0 and 1 (bool, integer or float; 0.5, -1 or
    NaN are refused, not cast). Returns whether every element is real (an all-ones mask is then dropped, so that the
    kernels take their unmasked paths).

    A row of padding only is legal (an empty set or sequence): attention over no key gives 0, so its outputs are
    what the model's positions, biases and learned queries (seeds, inducing points, latents) give alone.

    `labels`: the labels a head handed its base model (`_labels_to_check`, dtypes checked by `check_token_labels`),
    read in the same read: token labels (tensors) outside [0, vocab_size), and a classification head's
    `ClassLabels` outside [0, num_labels), other than -100, are refused.

    Under `torch.compile` nothing is read (no graph break, no check) and a mask is kept as given."""
    if torch.compiler.is_compiling():
        return attention_mask is None
    labels = [x if isinstance(x, ClassLabels) else ClassLabels(x, vocab_size, "token") for x in labels]
    labels = [x for x in labels if x.labels.numel()]
    checks = [torch.stack([labels_outside(*x[:2]).any() for x in labels]).any()] if labels else []
    if position_ids is not None and position_ids.numel():
        checks += list(torch.aminmax(position_ids))
    if input_ids is not None and (
        not vocab_size or not input_ids.numel() or input_ids.is_floating_point() or input_ids.dim() != 2
    ):
        input_ids = None  # nothing to read, or refused by its shape or type when it is embedded
    if input_ids is not None:
        checks += list(torch.aminmax(input_ids))
    if attention_mask is not None:
        if attention_mask.is_complex():
            raise ValueError(f"`attention_mask` must hold 0 (padding) and 1 (real), got a {attention_mask.dtype} tensor.")
        real = attention_mask == 1
        checks += [(real | (attention_mask == 0)).all(), real.all()]
    if not checks:
        return attention_mask is None
    values = torch.stack([c.to(torch.float64) for c in checks]).tolist()  # the one host sync
    if labels:
        labels_bad, values = values[0], values[1:]
        if labels_bad:
            _refuse_labels(labels)
    if position_ids is not None and position_ids.numel():
        (first, last), values = values[:2], values[2:]
        if first < 0:
            raise ValueError(f"`position_ids` must be non-negative, got values down to {int(first)}.")
        check_position_count(int(last) + 1, max_positions)
    if input_ids is not None:
        (low, high), values = values[:2], values[2:]
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"`input_ids` hold ids in [{int(low)}, {int(high)}], outside the vocabulary [0, {vocab_size - 1}]."
            )
    if attention_mask is None:
        return True
    binary, all_real = values[:2]
    if not binary:
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].unique()[:5].tolist()
        raise ValueError(
            f"`attention_mask` must hold only 0 (padding) and 1 (real element), as bool, integer or float; got other "
            f"values such as {bad}."
        )
    return bool(all_real)


# keyword inputs that transformers' Trainer, generate() and tokenizers pass to a model besides its named arguments
PASSED_THROUGH = frozenset({"num_items_in_batch", "shift_labels", "cache_position", "prefix_length", "return_dict",
                            "token_type_ids", "return_loss", "logits_to_keep", "use_cache", "past_key_values",
                            "position_ids", "output_attentions", "output_hidden_states", "labels"})


def _forward_names(cls):
    names = cls.__dict__.get("_hfst_forward_names")
    if names is None:
        names = frozenset(n for n, p in inspect.signature(cls.forward).parameters.items()
                          if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self")
        setattr(cls, "_hfst_forward_names", names)
    return names


def check_keyword_names(cls, kwargs):
    """Refuses a keyword input one typo away from one of `cls.forward`'s (`attention_masks=`, `label=`): transformers
    models take `**kwargs` and would drop it without a word (no padding mask, no loss). Other unknown names pass."""
    names = _forward_names(cls)
    for key in kwargs:
        if key in names or key in PASSED_THROUGH:
            continue
        near = difflib.get_close_matches(key, sorted(names | PASSED_THROUGH), n=1, cutoff=0.85)
        if near:
            raise ValueError(f"`{key}` is not an input of {cls.__name__}.forward (did you mean `{near[0]}`?).")


def check_position_count(count, max_positions):
    # a tensor count (a cache counting on the device) is not read back: no host sync in a compiled step
    if max_positions is not None and not torch.is_tensor(count) and count > max_positions:
        raise ValueError(
            f"Sequence needs {count} positions but `max_position_embeddings` is {max_positions} (learned position "
            "embeddings cannot extrapolate)."
        )


def input_shape(input_ids=None, input_features=None, inputs_embeds=None):
    """(b, n) of the inputs, refusing shapes that have no batch and sequence axes, and empty sequences (a sequence or
    set of no element has nothing to attend to or pool)."""
    for name, x, dims in (("input_ids", input_ids, "(batch, length)"),
                          ("input_features", input_features, "(batch, set size, input_size)"),
                          ("inputs_embeds", inputs_embeds, "(batch, length, hidden_size)")):
        if x is None:
            continue
        if x.dim() != dims.count(",") + 1:
            hint = "; pass continuous inputs as `input_features`" if name == "input_ids" and x.is_floating_point() else ""
            raise ValueError(f"`{name}` must have shape {dims}, got {tuple(x.shape)} {x.dtype}{hint}.")
        if x.shape[1] == 0:
            raise ValueError(f"`{name}` holds sequences of length 0, shape {tuple(x.shape)}: pass at least one element.")
        return x.shape[0], x.shape[1]
    raise ValueError("Pass exactly one of `input_ids`, `input_features` or `inputs_embeds`; got none.")


def check_prefix_length(prefix_length, length):
    """`prefix_length` of a base model: an int in [0, length), so that at least one position follows the prefix (a
    bool, a negative or a too large value would build masks for another sequence: silently, or deep inside torch)."""
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or not 0 <= prefix_length < length:
        raise ValueError(
            f"`prefix_length` must be an integer in [0, {length}) (the inputs hold {length} positions, and at least "
            f"one must follow the prefix), got {prefix_length!r}."
        )


# generate()'s token-id arguments, and what an id outside the vocabulary did in transformers 5.23
GENERATION_TOKEN_IDS = {
    "pad_token_id": "generate() emits it as padding",
    "bos_token_id": "generate() starts an empty prompt with it",
    "eos_token_id": "generation never meets it and runs to max_new_tokens",
    "forced_bos_token_id": "the logits processor fails with an IndexError",
    "forced_eos_token_id": "the logits processor fails with an IndexError",
    "suppress_tokens": "it is ignored",
    "begin_suppress_tokens": "it is ignored",
}


def check_generation_token_ids(generation_config, vocab_size):
    """Every token id `generate()` is given lies in the vocabulary (the config refuses its own; generate()'s
    arguments and a generation config's are checked here)."""
    for name, effect in GENERATION_TOKEN_IDS.items():
        value = getattr(generation_config, name, None)
        ids = value if isinstance(value, (list, tuple)) else [value]
        if vocab_size and any(isinstance(i, int) and not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"`{name}` must lie in the vocabulary [0, {vocab_size - 1}], got {value!r}: {effect}.")


# generation parameters whose out-of-range values transformers 5.23 ignores (it adds the logits processor only inside
# the range): name -> (test, the range in words). NaN fails every test.
GENERATION_RANGES = {
    "top_p": (lambda v: 0 <= v <= 1, "in [0, 1] (1 keeps every token)"),
    "typical_p": (lambda v: 0 < v <= 1, "in (0, 1] (1 keeps every token)"),
    "epsilon_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "eta_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "min_new_tokens": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer"),
    "no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
    "encoder_no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
}


def check_token_labels(*labels):
    """Token `labels` of the LM heads: integers in [0, vocab_size) or -100 (ignored). A float or bool dtype is refused
    here, naming it, and so is an integer dtype other than torch.long (cross-entropy would say "expected target dtype
    to be Long"; `labels.long()` is the fix). Returns the labels given (None left
    out), which the head hands its base model as `_labels_to_check`: ids outside the vocabulary (cross-entropy's
    "Target 109 is out of bounds", a device-side assert on CUDA) are flagged on the device and read with the inputs,
    in the one read of `check_input_values`. Nothing is read under `torch.compile`."""
    given = tuple(x for x in labels if x is not None)
    for x in given:
        if not torch.is_tensor(x) or x.dtype != torch.long:
            kind = x.dtype if torch.is_tensor(x) else type(x).__name__
            hint = " (use labels.long())" if torch.is_tensor(x) and x.dtype in _INTEGER_DTYPES else ""
            raise ValueError(
                f"`labels` must be token ids (torch.long, -100 where nothing is predicted), got {kind}{hint}."
            )
    return given


_INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)


class ClassLabels(NamedTuple):
    """Labels a head hands its base model's one read (`_labels_to_check`), with the ids they may hold: [0, bound), or
    -100 (ignored). Token labels (plain tensors) are read against the vocabulary; a classification head hands its
    class indices against `num_labels`."""

    labels: torch.Tensor
    bound: int
    kind: str = "class"


def labels_outside(labels, bound):
    """Bool tensor shaped like `labels`: True for ids outside [0, bound) that are not -100 (ignored)."""
    return ((labels < 0) & (labels != -100)) | (labels >= bound)


def _refuse_labels(labels):
    """The error path only (a second read is fine): name the first labels with ids out of their range."""
    for x, bound, kind in labels:
        bad = x[labels_outside(x, bound)]
        if bad.numel():
            values = bad.unique()[:5].tolist()
            if kind == "token":
                raise ValueError(
                    f"`labels` hold ids outside the vocabulary [0, {bound - 1}] (and not -100, the ignored label): "
                    f"{values}."
                )
            raise ValueError(
                f"`labels` hold class indices outside [0, {bound - 1}] (`num_labels` is {bound}; -100 is ignored): "
                f"{values}."
            )


def class_labels_to_check(labels, config):
    """A classification head's labels for its base model's one read: the class indices of a single-label problem (as
    `problem_type_of` infers it) as `ClassLabels`, else nothing (their dtype and shape are checked after the
    forward)."""
    if not torch.is_tensor(labels):
        return ()
    problem, integer = problem_type_of(labels, config.num_labels, config)
    return (ClassLabels(labels, config.num_labels),) if problem == "single_label_classification" and integer else ()


def problem_type_of(labels, num_labels, config):
    """(`config.problem_type`, or what transformers infers from the labels as `ForSequenceClassificationLoss` does;
    whether the labels are integers)."""
    integer = not labels.is_floating_point() and labels.dtype != torch.bool and not labels.is_complex()
    problem = config.problem_type or (
        "regression" if num_labels == 1 else "single_label_classification" if integer else "multi_label_classification"
    )
    return problem, integer


def check_classification_labels(labels, logits, config):
    """`labels` as transformers' `ForSequenceClassificationLoss` needs them for `config.problem_type` (inferred as it
    does, without setting it on a bad batch): class indices (integers, (b,)) for single-label classification, (b,
    num_labels) 0/1 values for multi-label (integers are cast to float), numbers for regression (likewise). Anything
    else is refused naming the labels' dtype and shape; transformers would read float class indices as multi-label
    targets and fail on the shapes, or pass integer regression targets to MSELoss."""
    if not torch.is_tensor(labels):
        raise ValueError(f"`labels` must be a tensor, got {type(labels).__name__}.")
    batch, num_labels = logits.shape
    problem, integer = problem_type_of(labels, num_labels, config)
    got = f"got {labels.dtype} of shape {tuple(labels.shape)}"
    if problem == "single_label_classification":
        if not integer or labels.shape not in ((batch,), (batch, 1)):
            raise ValueError(
                f"`labels` for single-label classification must be class indices, integers of shape ({batch},), "
                f"{got}. Use labels.long() for float class ids; for multi-label classification pass ({batch}, "
                f"{num_labels}) 0/1 labels with problem_type='multi_label_classification'; for regression set "
                "num_labels=1 or problem_type='regression'."
            )
        return labels
    if labels.dtype == torch.bool or labels.is_complex():
        if labels.dtype != torch.bool or problem != "multi_label_classification":
            raise ValueError(f"`labels` for {problem} must be real numbers, {got}.")
    if problem == "multi_label_classification":
        if labels.shape != (batch, num_labels):
            hint = " (class indices? use labels.long())" if labels.shape == (batch,) else ""
            raise ValueError(
                f"`labels` for multi-label classification must be 0/1 values of shape ({batch}, {num_labels}), "
                f"{got}{hint}. For single-label classification pass integer class indices of shape ({batch},)."
            )
    elif labels.numel() != batch * num_labels:
        raise ValueError(f"`labels` for regression must hold {num_labels} value(s) per example ({batch} examples), {got}.")
    return labels.to(logits.dtype)

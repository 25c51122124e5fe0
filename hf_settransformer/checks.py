"""Every check of a model's inputs and config, in one place; the models compute and trust what they are given.

The outermost model call of a forward (not a head's call of its base model) runs `check_forward` once (`checked`):
the config against the values the model was built from (`check_built_config`), shapes and types, then one read back
from the device for the values (ids, positions, a 0/1 mask and the labels, `check_input_values`); a mask of ones only
is dropped there, so the kernels take their unmasked paths. Under `torch.compile` and `torch.export` everything but
that read runs, traced as plain Python (no graph break, no host sync): a refusal there is raised while tracing
(`fullgraph=True` wraps it in dynamo's "Observed exception" error, which quotes it). Each refusal names the input and
the fix.

Also here: a model's config at construction (`check_model_config`), generate()'s arguments
(`check_generation_config`), and a vocabulary resize (`check_resize`). The labels each head takes: `label_checks.py`."""

import difflib
import functools
import inspect
import threading

import torch

from .attention import attention_kernel
from .cache_checks import check_cache, check_no_cache
from .decay import decay_applies
from .packing import PACKING_INPUTS, read_packing

_call = threading.local()  # whether a checked forward is running in this thread


def checked(forward):
    """A model's `forward` decorator: the outermost call binds its inputs by name, runs `check_forward` and passes on
    the checked inputs; a call inside it (a head's base model) runs the forward alone. Compiled or exported, the
    checks that read no tensor value run (`check_forward(read_values=False)`), traced."""
    parameters = list(inspect.signature(forward).parameters.values())[1:]  # after self
    positional = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if getattr(_call, "inside", False):
            return forward(self, *args, **kwargs)
        # bound by hand, not by `inspect.Signature.bind`, which a compiled forward could not trace
        if len(args) > len(positional):
            raise TypeError(f"{forward.__qualname__}() takes {len(positional)} positional inputs, got {len(args)}.")
        inputs = dict(zip(positional, args))
        for name in kwargs:
            if name in inputs:
                raise TypeError(f"{forward.__qualname__}() got multiple values for `{name}`.")
        inputs.update(kwargs)
        inputs = check_forward(self, inputs, read_values=not torch.compiler.is_compiling())
        _call.inside = True
        try:
            return forward(self, **inputs)
        finally:
            _call.inside = False

    return wrapper


def check_forward(model, inputs, read_values=True):
    """Every check of one forward of `model` on `inputs` (a dict by name) -> the inputs, `attention_mask` dropped
    where every element is real. `read_values=False` (compiled, exported): none of the checks that read tensor values
    (`check_input_values`, `logits_to_keep` indices) nor the config's cross-field rules (`config.validate()`, which a
    trace cannot follow; the fields a model was built from are compared still)."""
    config = model.config
    if read_values:
        config.validate()  # the rules across fields: an assignment is checked alone (configuration_base)
    check_built_config(model)
    check_keyword_names(type(model), inputs)
    check_no_cache(model, inputs.get("past_key_values"))
    check_implementation(attention_kernel(config), config)
    check_output_hidden_states(inputs.get("output_hidden_states"))
    b, n = check_embeddable(config, inputs)
    check_packing(model, inputs, b, n, read_values)
    labels, n_base = model.check_labels(inputs, b, n)
    past_length, slots = check_cache(model, inputs, b, n) if model.keeps_a_cache else (0, None)
    key_length = past_length + n if slots is None else slots
    mask = inputs.get("attention_mask")
    check_attention_mask(mask, b, key_length)
    prefix = inputs.get("prefix_length")  # a base model's (None: bidirectional); a next-token head checks its own
    if prefix is not None and not model.own_prefix_length:
        check_prefix_length(prefix or 0, n)
        check_targets_fit_latents(config, n - prefix)
    check_decay_applies(model, prefix)
    check_cross_attention(config, inputs, b)
    check_logits_to_keep(inputs.get("logits_to_keep"), n, model.device, read_values)
    position_ids = inputs.get("position_ids")
    packing = inputs.get("packing")
    if position_ids is not None and "position_ids" in forward_names(type(model.base_model)):
        check_position_ids(position_ids, b, n_base if packing is None else n)  # a packed row's: the row's
    learned = config.position_embedding_type == "learned"
    max_positions = config.max_position_embeddings if learned else None
    positions = past_length + n_base if slots is None else slots
    if packing is not None:  # each sequence counts its own positions: the longest one's (none to read compiled)
        positions = min(positions, packing.max_length) if read_values else 0
    if not read_values:
        if position_ids is None and config.position_embedding_type != "none":
            check_position_count(positions, max_positions)
        assert_input_values(
            inputs.get("input_ids"), mask, config.vocab_size, position_ids if learned else None, max_positions, labels
        )
        return inputs
    all_real = check_input_values(
        inputs.get("input_ids"), mask, config.vocab_size, position_ids if learned else None, max_positions, labels
    )
    if position_ids is None and config.position_embedding_type != "none":
        check_position_count(positions, max_positions)
    if all_real and mask is not None:
        inputs["attention_mask"] = None
    return inputs


def check_built_config(model):
    """The config fields `model`'s modules were built from (`HfstPreTrainedModel.built_config`) unchanged: a module made
    for one value runs on as built whatever the config says later, and a save would write the new value beside weights
    made for the old one (the reloaded model would differ). Plain comparisons, which a compiled forward traces."""
    config = model.config
    for name, built in model.built_config.items():
        value = getattr(config, name)
        if value != built:
            model_name = type(model).__name__
            resize = " (a new vocabulary: `model.resize_token_embeddings(n)`)" if name == "vocab_size" else ""
            raise ValueError(
                f"`config.{name}` is {value!r}, but this {model_name} was built with {name}={built!r} and runs as "
                f"built (a model is made from its config once); a save would write {name}={value!r} beside weights "
                f"made for {built!r}. Set it back, or build a new model from the changed config "
                f"(`{model_name}(config)`, or `from_pretrained(path, {name}={value!r})` where the weights fit it)"
                f"{resize}."
            )


# ------------------------------------------------------------------------------------------------ inputs by kind

# each input a model embeds: its shape in words, the config field it needs, and its dtype rule (name, test, fix)
EMBEDDABLE = {
    "input_ids": ("(batch, length)", "vocab_size", "This model has no token embedding (`vocab_size` is None): pass "
                  "`input_features`.", "token ids of dtype torch.long (or torch.int32)",
                  lambda x: x.dtype in (torch.int64, torch.int32), "convert them with `.long()`"),
    "input_features": ("(batch, set size, input_size)", "input_size", "This model takes no continuous features "
                       "(`input_size` is None): pass `input_ids`.", "floating-point values",
                       torch.Tensor.is_floating_point, "pass floats, e.g. `input_features.float()`"),
    "inputs_embeds": ("(batch, length, hidden_size)", "hidden_size", None, "floating-point vectors",
                      torch.Tensor.is_floating_point, "pass floats, e.g. `inputs_embeds.float()` (token ids go in "
                      "`input_ids`)"),
}


def check_packing(model, inputs, b, n, read_values=True):
    """A packed row (`packing.read_packing`: the boundaries, `seq_idx`, or `position_ids` that restart with no mask
    and no cache) -> `inputs["packing"]`, checked; refused by a model that does not take one. Compiled, `position_ids`
    mark a packed row only for a model that takes one (whether they restart cannot be read)."""
    if inputs.get("packing") is not None:
        raise ValueError("`packing` is made from a packed batch's inputs (`cu_seq_lens_q`/`cu_seq_lens_k`, `seq_idx` or "
                         "`position_ids`): pass those instead.")
    takes = model.takes_packed_batches
    # restarting `position_ids` mark a packed row also where the model has no positions (a set model would otherwise
    # read the whole row as one set); compiled, only where it takes one (a restart cannot be read)
    positions = takes or read_values
    device = next(inputs[name] for name in EMBEDDABLE if inputs.get(name) is not None).device
    packing = read_packing(inputs, b, n, takes_position_ids=positions, keeps_a_cache=model.keeps_a_cache,
                           read_values=read_values, device=device)
    if packing is None:
        return
    if not takes:
        raise ValueError(
            f"{type(model).__name__} does not take packed batches (given as `cu_seq_lens_q`/`cu_seq_lens_k`, `seq_idx`, "
            "or `position_ids` that restart at 0 with no `attention_mask`): pass padded batches with an "
            "`attention_mask`."
        )
    if inputs.get("encoder_hidden_states") is not None:
        raise ValueError("A packed batch takes no `encoder_hidden_states`: its cross-attention would read one "
                         "encoder output for every sequence.")
    inputs["packing"] = packing


def check_embeddable(config, inputs):
    """Exactly one of `input_ids`, `input_features` and `inputs_embeds`, of a type and shape this model embeds ->
    (b, n). Integer or bool features would be cast without a word; float ids are continuous inputs."""
    given = [name for name in EMBEDDABLE if inputs.get(name) is not None]
    if len(given) != 1:
        raise ValueError(f"Pass exactly one of `input_ids`, `input_features` or `inputs_embeds`; got {given or 'none'}.")
    name, x = given[0], inputs[given[0]]
    dims, field, missing, kind, dtype_ok, fix = EMBEDDABLE[name]
    floats = torch.is_tensor(x) and x.is_floating_point()
    hint = "; pass continuous inputs as `input_features`" if name == "input_ids" and floats else ""
    if not torch.is_tensor(x) or x.dim() != dims.count(",") + 1:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise ValueError(f"`{name}` must have shape {dims}, got {shape} {getattr(x, 'dtype', '')}{hint}.")
    if x.shape[1] == 0:
        raise ValueError(f"`{name}` holds sequences of length 0, shape {tuple(x.shape)}: pass at least one element.")
    if missing and not getattr(config, field):
        raise ValueError(missing)
    if name == "input_ids" and floats:
        raise ValueError(f"`input_ids` must be integer token ids of shape {dims}, got {tuple(x.shape)} {x.dtype}{hint}.")
    if name != "input_ids" and x.shape[-1] != getattr(config, field):
        raise ValueError(f"`{name}` must have shape {dims[:-len(field) - 1]}{field}={getattr(config, field)}), got "
                         f"{tuple(x.shape)}.")
    if not dtype_ok(x):
        raise ValueError(f"`{name}` must be {kind}, got {x.dtype}: {fix}.")
    return x.shape[0], x.shape[1]


def check_attention_mask(attention_mask, batch_size, length, name="attention_mask"):
    """(b, n) mask shape; its values are read by `check_input_values`. A `length` that is a tensor (a cache counting
    on the device) is not read: only the batch size is checked then."""
    if attention_mask is not None and (
        attention_mask.dim() != 2
        or attention_mask.shape[0] != batch_size
        or (not torch.is_tensor(length) and attention_mask.shape[1] != length)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, length) = ({batch_size}, {length}) matching the inputs, "
            f"got {tuple(attention_mask.shape)}."
        )


def check_position_ids(position_ids, b, n):
    if (
        position_ids.is_floating_point() or position_ids.dtype == torch.bool or position_ids.dim() != 2
        or position_ids.shape[0] not in (1, b) or position_ids.shape[1] != n
    ):
        raise ValueError(
            f"`position_ids` must be integers of shape (batch, length) = ({b}, {n}) or (1, {n}), got "
            f"{position_ids.dtype} of shape {tuple(position_ids.shape)}."
        )


def check_position_count(count, max_positions):
    # a tensor count (a cache counting on the device) is not read back: no host sync in a compiled step
    if max_positions is not None and not torch.is_tensor(count) and count > max_positions:
        raise ValueError(
            f"Sequence needs {count} positions but `max_position_embeddings` is {max_positions} (learned position "
            "embeddings cannot extrapolate)."
        )


def check_prefix_length(prefix_length, length, what="the inputs hold {length} positions, and at least one must "
                                                   "follow the prefix"):
    """`prefix_length`: an int in [0, length), so that at least one position follows the prefix (a bool, a negative
    or a too large value would build masks for another sequence: silently, or deep inside torch)."""
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or not 0 <= prefix_length < length:
        raise ValueError(
            f"`prefix_length` must be an integer in [0, {length}) ({what.format(length=length)}), got "
            f"{prefix_length!r}."
        )


def check_decay_applies(model, prefix_length):
    """A decayed linear attention needs an order to decay along (`decay.decay_applies`): refused for a forward with no
    causal attention (a bidirectional base model, masked LM, classification, the one-window head)."""
    decay = model.config.linear_attention_decay
    causal = model.attends_causally or prefix_length is not None
    if "linear_attention_decay" not in attention_kernel(model.config).config_fields or decay_applies(decay, causal):
        return
    objective = model.objective
    what = f"{type(model).__name__}" + ("" if objective is None else f" ({objective.replace('_', ' ')})")
    raise ValueError(
        f"`linear_attention_decay={decay!r}` decays causal attention along the sequence, and {what} attends "
        "bidirectionally, with no order to decay along. Use linear_attention_decay='none' for this model, or a causal "
        "use of it (a base model with `prefix_length`, the many-target next-token head)."
    )


def check_targets_fit_latents(config, num_targets):
    latents = getattr(config, "num_latents", None)  # Perceiver AR: one latent per target
    if latents is not None and num_targets > latents:
        raise ValueError(f"Perceiver AR needs one latent per target: `num_latents` ({latents}) must be at least the "
                         f"number of targets ({num_targets}, `target_length`).")


def check_cross_attention(config, inputs, b):
    states = inputs.get("encoder_hidden_states")
    if states is None:
        return
    if not config.add_cross_attention:
        raise ValueError("`encoder_hidden_states` given but the config has `add_cross_attention=False`.")
    if states.dim() != 3 or states.shape[0] != b or states.shape[-1] != config.hidden_size:
        raise ValueError(
            f"`encoder_hidden_states` must have shape ({b}, source length, {config.hidden_size}), "
            f"got {tuple(states.shape)}."
        )
    check_attention_mask(inputs.get("encoder_attention_mask"), b, states.shape[1], name="encoder_attention_mask")


def check_logits_to_keep(value, n, device, read_values=True):
    """As Llama: an int k >= 0 keeps the last k positions (0: all), a 1-D integer tensor the positions it lists."""
    if value is None or type(value) is int and value >= 0:
        return
    if not torch.is_tensor(value) or value.dim() != 1 or value.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            "`logits_to_keep` must be an int >= 0 (the last positions to keep; 0 keeps all) or a 1-D integer tensor "
            f"of positions, got {value!r}."
        )
    if value.device.type != "cpu" and value.device != device:
        raise ValueError(f"`logits_to_keep` must be on the CPU or the model's device ({device}), got {value.device}.")
    if read_values and value.numel() and not (-n <= int(value.min()) and int(value.max()) < n):
        raise ValueError(f"`logits_to_keep` indices must lie in [-{n}, {n - 1}] (the input's positions), got {value}.")


def check_output_hidden_states(value):
    """A flag, or as in transformers an index or a list of indices of the hidden states to return."""
    if value is None or isinstance(value, bool):
        return
    selected = [value] if isinstance(value, int) else value
    if not isinstance(selected, (list, tuple)) or not all(type(i) is int for i in selected):
        raise ValueError("`output_hidden_states` must be a bool, or an index or a list of indices of the hidden states "
                         f"to return, got {value!r}.")


# ------------------------------------------------------------------------------------------------ the cache

def check_implementation(kernel, config):
    """An `attn_implementation` the config's kernel does not run under (flash attention computes softmax)."""
    implementation = config._attn_implementation
    if None not in (kernel.implementations, implementation) and implementation not in kernel.implementations:
        raise ValueError(
            f"attn_implementation={implementation!r} chooses how softmax attention is computed, but "
            f"attention_type={config.attention_type!r} computes no softmax: use attn_implementation in "
            f"{list(kernel.implementations)} (or leave it unset) with this attention type."
        )


# ------------------------------------------------------------------------------------------------ the one read

def check_input_values(input_ids=None, attention_mask=None, vocab_size=None, position_ids=None, max_positions=None,
                       labels=()):
    """The one read back from the device per forward: `input_ids` in the vocabulary, `position_ids` (learned, given)
    below `max_positions` (on CUDA a device-side assert otherwise), `attention_mask` of 0 and 1 only (0.5, -1 or NaN
    are refused, not cast), `labels` (`ClassLabels`) in their bounds or -100. Returns whether every element is real.
    A row of padding only is legal (an empty set): attention over no key gives 0."""
    labels = [x for x in labels if x.labels.numel()]
    checks = [torch.stack([labels_outside(*x[:2]).any() for x in labels]).any()] if labels else []
    if position_ids is not None and position_ids.numel():
        checks += list(torch.aminmax(position_ids))
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
            refuse_labels(labels)
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


def assert_input_values(input_ids=None, attention_mask=None, vocab_size=None, position_ids=None, max_positions=None,
                        labels=()):
    """`check_input_values`' refusals in a compiled or exported forward, where nothing is read back: on the CPU, as
    assertions inside the graph (`torch._assert_async`, which raises a RuntimeError with the message and no value),
    so that an id out of range says which input and range instead of torch's "index out of range in self", and a mask
    of 0.5 is refused rather than read as 1. On an accelerator they are left out: there an assertion is a device-side
    assert (the process's device context is lost), and compiled graphs may not keep it."""
    ranges = [(x.labels, 0, x.bound, f"`labels` hold {x.kind} ids outside [0, {x.bound - 1}] (and not -100, the "
                                     "ignored label)") for x in labels]
    if input_ids is not None:
        ranges.append((input_ids, 0, vocab_size, f"`input_ids` hold ids outside the vocabulary [0, {vocab_size - 1}]"))
    if position_ids is not None:
        ranges.append((position_ids, 0, max_positions, f"`position_ids` must lie in [0, {max_positions - 1}] "
                                                       "(`max_position_embeddings`)"))
    for x, low, high, message in ranges:
        if x.device.type == "cpu" and x.numel():
            inside = (x >= low) & (x < high)
            if message.startswith("`labels`"):
                inside |= x == -100
            torch._assert_async(inside.all(), message + ".")
    if attention_mask is not None and attention_mask.device.type == "cpu" and attention_mask.numel():
        binary = ((attention_mask == 0) | (attention_mask == 1)).all()
        torch._assert_async(binary, "`attention_mask` must hold only 0 (padding) and 1 (real element).")


def labels_outside(labels, bound):
    """Bool tensor shaped like `labels`: True for ids outside [0, bound) that are not -100 (ignored)."""
    return ((labels < 0) & (labels != -100)) | (labels >= bound)


def refuse_labels(labels):
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


# ------------------------------------------------------------------------------------------------ keyword names

# keyword inputs that transformers' Trainer, generate() and tokenizers pass to a model besides its named arguments
PASSED_THROUGH = frozenset({"num_items_in_batch", "shift_labels", "cache_position", "prefix_length", "return_dict",
                            "token_type_ids", "return_loss", "logits_to_keep", "use_cache", "past_key_values",
                            "position_ids", "output_attentions", "output_hidden_states", "labels", "packing",
                            *PACKING_INPUTS})


def forward_names(cls):
    """The named inputs of `cls.forward`."""
    names = cls.__dict__.get("_hfst_forward_names")
    if names is None:
        names = frozenset(n for n, p in inspect.signature(cls.forward).parameters.items()
                          if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self")
        setattr(cls, "_hfst_forward_names", names)
    return names


def check_keyword_names(cls, kwargs):
    """Refuses a keyword input one typo away from one of `cls.forward`'s (`attention_masks=`, `label=`): transformers
    models take `**kwargs` and would drop it without a word (no padding mask, no loss). Other unknown names pass."""
    names = forward_names(cls)
    for key in kwargs:
        if key in names or key in PASSED_THROUGH:
            continue
        near = near_input_name(key, names)
        if near:
            raise ValueError(f"`{key}` is not an input of {cls.__name__}.forward (did you mean `{near}`?).")


@torch.compiler.assume_constant_result  # a compiled forward calls it while tracing (difflib cannot be traced)
def near_input_name(key, names):
    """The input name (of `names` or `PASSED_THROUGH`) one typo away from `key`, or None."""
    near = difflib.get_close_matches(key, sorted(names | PASSED_THROUGH), n=1, cutoff=0.85)
    return near[0] if near else None


# ------------------------------------------------------------------------------------------------ config, generate()

def check_model_config(model):
    """A config this model class cannot run, refused before any module is built."""
    config, name = model.config, type(model).__name__
    config.validate()  # the rules across fields: an assignment is checked alone (configuration_base)
    if model.predicts_tokens and not config.vocab_size:
        raise ValueError(f"`vocab_size` must be set for {name} (it predicts tokens).")
    if model.pools_each_target and config.pooling != "pma":
        raise ValueError(
            "`next_token_mode='many'` pools every target with its own PMA query: set `pooling='pma'`, or use "
            "`next_token_mode='window'` for mean pooling."
        )
    if model.predicts_every_position and getattr(config, "output_query_type", None) == "learned":
        raise ValueError(
            f"{name} needs one output query per input position: set `output_query_type` to 'inputs' or "
            "'positions', not 'learned'."
        )
    if type(model).main_input_name == "input_features" and not config.input_size:
        raise ValueError(f"{name} needs continuous points: set `input_size`.")


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

# generation parameters transformers 5.23 does not check: name -> (test, the range in words). NaN fails every test.
GENERATION_RANGES = {
    **{name: (lambda v: isinstance(v, int) and v >= 1, "a positive integer")
       for name in ("num_beams", "num_return_sequences", "num_beam_groups")},  # 0 divides by zero deep inside
    "top_p": (lambda v: 0 <= v <= 1, "in [0, 1] (1 keeps every token)"),
    "typical_p": (lambda v: 0 < v <= 1, "in (0, 1] (1 keeps every token)"),
    "epsilon_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "eta_cutoff": (lambda v: 0 <= v < 1, "in [0, 1) (0 turns it off)"),
    "min_new_tokens": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer"),
    "no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
    "encoder_no_repeat_ngram_size": (lambda v: v >= 0 and float(v).is_integer(), "a non-negative integer (0 turns it off)"),
}


def check_generation_config(model, generation_config, model_kwargs):
    """What transformers 5.23 does not check: counts and ranges (`GENERATION_RANGES`: out of range, a logits
    processor is turned off without a word), token ids (`GENERATION_TOKEN_IDS`), a cache for a family without one."""
    for name, (inside, allowed) in GENERATION_RANGES.items():
        value = getattr(generation_config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not inside(value)):
            raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")
    check_generation_token_ids(generation_config, model.config.vocab_size)
    check_no_cache(model, model_kwargs.get("past_key_values"))


def check_generation_token_ids(generation_config, vocab_size):
    """Every token id `generate()` is given lies in the vocabulary."""
    for name, effect in GENERATION_TOKEN_IDS.items():
        value = getattr(generation_config, name, None)
        ids = value if isinstance(value, (list, tuple)) else [value]
        if vocab_size and any(isinstance(i, int) and not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"`{name}` must lie in the vocabulary [0, {vocab_size - 1}], got {value!r}: {effect}.")


def check_resize(model, size):
    """A resize an adaptive layer cannot take: its ids are ordered by frequency, so new tokens have no place
    (transformers would resize the input embedding only)."""
    adaptive = [f"`{name}`" for name in ("adaptive_input_cutoffs", "adaptive_softmax_cutoffs")
                if getattr(model.config, name, None)]
    if adaptive and size != model.config.vocab_size:
        raise ValueError(
            f"Cannot resize the vocabulary of {type(model).__name__} from {model.config.vocab_size} to {size}: it "
            f"has {' and '.join(adaptive)} (adaptive layers cluster ids by frequency; new tokens have no place). "
            "Train a new model with the new vocabulary instead."
        )


"""The training objectives: what a head is trained to predict, how its data is cut and how it is scored. One row per
objective in `OBJECTIVES`, beside `ATTENTION_KERNELS` (what attention computes) and `FAMILIES` (which models exist).

A head names its objective on the model side, as a plain attribute (`objective = "causal_lm"`; the next-token heads
read `config.next_token_mode`); `objective_of(model)` finds its row. Everything that depends on the objective (the
example length, the training dataset and collator, the evaluation protocol and the sentence that names it, the model
card's template and design line, the train_lm.py flags that apply) is read from the row, here, in `lm_arguments`,
`cards` and `scripts/train_lm.py`; what the head itself is (its labels, whether it attends causally) the head class
says (`heads.py`). A new objective is one `register_objective(Objective(...))` plus its functions (README, "Extending:
an objective").

The Set Transformer paper's synthetic tasks are rows too, of their own type (`SetObjective`: dataset, head and config,
loss, metric, the paper's figures, `scripts/train_sets.py`'s defaults), registered in `set_tasks` beside their
datasets and metrics; `scripts/train_sets.py` and `scripts/set_results.py` read them. `lm_objectives()` and
`set_objectives()` are the two kinds of row.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import transformers

from .language_modeling import (
    BlockDataset,
    TargetWindowDataset,
    WindowDataset,
    causal_window_logits,
    decoder_windows,
    evaluate_masked_stream,
    evaluate_positions,
    evaluate_windows,
    target_window_logits,
    target_windows,
)


MLM_PROBABILITY = 0.15  # the masked-LM share of tokens to mask by default (BERT's; train_lm.py's --mlm_probability)


@dataclass(frozen=True)
class Evaluation:
    """What an objective's `evaluate` reads besides the model and the stream. `block_size`, `stride`: a causal LM's
    windows; `tokenizer`, `mlm_probability`: a masked LM's mask token and share; `rank`, `world_size`: this process's
    share of the windows; `progress`: a tqdm bar's description (None: no bar)."""

    batch_size: int = 16
    block_size: int | None = None
    stride: int | None = None
    eos_id: int | None = 0
    tokenizer: Any = None
    mlm_probability: float = MLM_PROBABILITY
    progress: str | None = None
    rank: int = 0
    world_size: int = 1


@dataclass(frozen=True)
class Objective:
    """One row of `OBJECTIVES`.

    name: what a head's `objective` says. flag: `train_lm.py --objective`, and all_results.json's "objective".
    auto_class: the transformers Auto class that builds its heads. head: its heads in messages ("masked-LM").
    example_length(model, block_size) -> tokens per training example and evaluation window.
    training_dataset(model, stream, length, num_targets, seed) -> the training `Dataset` over a 1-D token stream.
    collator(tokenizer, mlm_probability) -> the Trainer's data collator (None: the default).
    evaluate(model, stream, Evaluation) -> this process's sums {"nll", "tokens", "correct"} over the scored tokens.
    protocol(model, length, stride, mlm_probability) -> the protocol in words (results, model cards).
    design(config, family, mlm_probability) -> the model card's design line.
    card_template: the template in `model_cards/`. length_flags: the train_lm.py flags that set the example length.
    next_token_mode: the config's mode its heads run in (all_results.json), None where it does not apply.
    data_flags: the train_lm.py data flags that apply to it, of those that apply to some objectives only (--block_size,
    --eval_stride, --context_length, --target_length, --targets_per_epoch, --mlm_probability): train_lm.py refuses the
    others, and a model card shows the config fields of the same names that it reads.
    recorded_arguments: train_lm.py data arguments the run records in all_results.json.
    eval_batch_factor: final-evaluation batch = per-device eval batch x this."""

    name: str
    flag: str
    auto_class: str
    head: str
    example_length: Callable
    training_dataset: Callable
    collator: Callable
    evaluate: Callable
    protocol: Callable
    design: Callable
    card_template: str = "lm_model_card.md"
    length_flags: str = "--context_length / --target_length"
    next_token_mode: str | None = None
    data_flags: tuple = ()
    recorded_arguments: tuple = ()
    eval_batch_factor: int = 2


@dataclass(frozen=True)
class SetObjective:
    """One set-task row of `OBJECTIVES` (Lee et al. 2019's synthetic tasks, `set_tasks`), which
    `scripts/train_sets.py` trains and `scripts/set_results.py` tabulates.

    name: `train_sets.py --task`, and all_results.json's "task". dataset: its class, built as
    dataset(size, seed, **options); dataset_flags: dataset option -> the train_sets.py flag that sets it (besides
    min_size and max_size, which every task takes). head: the Set Transformer head that learns it; config: the config
    values the task needs (a checkpoint it continues must have them); problem_type: the config's, where one is set.
    loss: the Trainer's `compute_loss_func` for that head (None: the head's own loss). label_names: the Trainer's
    (None: its default; () where the inputs are the targets and the head returns the loss itself).
    evaluate(model, dataset, batch_size, value_scale) -> the task's metrics on every set of `dataset`.
    metric: (key, label, format) of the figure the results table shows; reference: (key, label) of one shown beside it
    in brackets. paper: the paper's figures by model ("SAB+PMA", "rFF+max"). defaults: train_sets.py's values for
    flags left unset. baselines: whether the rFF+pooling baselines (`DeepSetsBaseline`, config's input_size ->
    num_labels) learn it. protocol: the evaluation in words (train_sets.py's log)."""

    name: str
    dataset: type
    head: type
    config: dict
    evaluate: Callable
    metric: tuple
    protocol: str
    defaults: dict
    dataset_flags: dict = field(default_factory=dict)
    problem_type: str | None = None
    loss: Callable | None = None
    label_names: tuple | None = None
    reference: tuple | None = None
    paper: dict = field(default_factory=dict)
    baselines: bool = False

    def metric_text(self, results):
        """The metric of a run's `results` as the results table shows it: "0.0179", "-1.5123 (oracle -1.4700)"."""
        key, _, form = self.metric
        text = form.format(results[key])
        if self.reference:
            text += f" ({self.reference[1]} {form.format(results[self.reference[0]])})"
        return text


OBJECTIVES: dict[str, Objective | SetObjective] = {}


def register_objective(objective):
    """Adds (or replaces) a row of `OBJECTIVES`; heads whose `objective` is `objective.name` then train and evaluate
    with it. Returns the row."""
    OBJECTIVES[objective.name] = objective
    return objective


def objective_of(model):
    """The row of `model`'s head (its `objective` attribute)."""
    name = getattr(model, "objective", None)
    if name not in OBJECTIVES:
        raise ValueError(f"{type(model).__name__} declares the objective {name!r}; known: {sorted(OBJECTIVES)} "
                         "(a head names its objective as `objective = ...`; `register_objective` adds one).")
    return OBJECTIVES[name]


def lm_objectives():
    """The language-modelling rows of `OBJECTIVES` (`Objective`: train_lm.py's), by name, in registration order."""
    return {name: row for name, row in OBJECTIVES.items() if isinstance(row, Objective)}


def set_objectives():
    """The set-task rows of `OBJECTIVES` (`SetObjective`: train_sets.py's), by name, in registration order."""
    return {name: row for name, row in OBJECTIVES.items() if isinstance(row, SetObjective)}


def set_objective(task):
    """The set-task row named `task` (`train_sets.py --task`)."""
    rows = set_objectives()
    if task not in rows:
        raise ValueError(f"Unknown set task {task!r}: choose one of {sorted(rows)}.")
    return rows[task]


def auto_class_for_flag(flag):
    """The transformers Auto class that builds heads for `train_lm.py --objective flag`."""
    rows = lm_objectives().values()
    names = {o.auto_class for o in rows if o.flag == flag}
    if len(names) != 1:
        raise ValueError(f"--objective {flag!r} names {len(names)} Auto classes; expected one of "
                         f"{sorted({o.flag for o in rows})}.")
    return getattr(transformers, names.pop())


# ------------------------------------------------------------------------------------------------ the rows


def _block_size(model, block_size):
    if block_size is None:
        raise ValueError("A causal LM's examples are blocks of `block_size` tokens: pass block_size.")
    return block_size


def _context_length(model, block_size=None):
    return model.config.context_length


def _causal_windows(model, stream, e):
    windows = decoder_windows(len(stream), e.block_size, e.stride or max(e.block_size // 2, 1))
    return evaluate_windows(model, stream, windows, causal_window_logits, e.batch_size, e.eos_id, e.progress, e.rank,
                            e.world_size)


def _target_windows(model, stream, e):
    config = model.config
    windows = target_windows(len(stream), config.context_length, config.target_length)
    return evaluate_windows(model, stream, windows, target_window_logits, e.batch_size, e.eos_id, e.progress, e.rank,
                            e.world_size)


def _positions(model, stream, e):
    return evaluate_positions(model, stream, e.batch_size, e.eos_id, e.progress, e.rank, e.world_size)


def _masked_blocks(model, stream, e):
    tokenizer = e.tokenizer
    metrics = evaluate_masked_stream(
        model, stream, model.config.context_length, tokenizer.mask_token_id, e.mlm_probability,
        batch_size=e.batch_size, special_ids=tokenizer.all_special_ids, progress=e.progress, rank=e.rank,
        world_size=e.world_size,
    )
    return {"nll": metrics["loss_sum"], "tokens": metrics["tokens_scored"], "correct": metrics["correct"]}


def _bert_collator(tokenizer, mlm_probability):
    # BERT's masking (80% mask token, 10% random, 10% kept) of mlm_probability of the tokens
    return transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability)


def _no_collator(tokenizer, mlm_probability):
    return None


def _masked_design(config, family, mlm_probability=MLM_PROBABILITY):
    return ("Masked LM: every position of a block is read bidirectionally and predicts its own token; during "
            f"training {mlm_probability:.0%} of the tokens are chosen (BERT: 80% replaced by `<mask>`, 10% by a random word, 10% "
            "kept)" + (", Perceiver IO with one output query per input position"  # its decoder's queries
                       if getattr(config, "output_query_type", None) else "") + ".")


def _one_target_design(config, family, mlm_probability=None):
    return (f"Next-token head, one prediction per window: the last {config.context_length} tokens go through the "
            "stack, attention pooling (PMA, Lee et al. 2019) reads them and predicts the next token. This is the "
            "design document's literal head, kept as a baseline: a pass learns from one target, where the "
            "many-target head (`next_token_mode=\"many\"`) learns from many at about the same cost, so at equal "
            "training time it sees far fewer targets and its evaluation takes one pass per scored token. Prefer a "
            "many-target checkpoint for use.")


def _many_targets_design(config, family, mlm_probability=None):
    return (f"Next-token head with many targets per window: a window of {config.context_length} tokens predicts the "
            f"next token at each of its last {config.target_length} positions in one pass; the positions before "
            "them are a prefix read bidirectionally (encoder, Set Transformer) or through a causal cross-attention "
            "(Perceiver IO as Perceiver AR), and one attention-pooling query per target (the PMA seed plus that "
            "position's state) reads the states up to it. No prediction sees its own target or a later token.")


for _objective in (
    Objective(
        "causal_lm", "next_token", "AutoModelForCausalLM", "causal-LM",
        example_length=_block_size,
        training_dataset=lambda model, stream, length, num_targets, seed: BlockDataset(stream, length),
        collator=_no_collator,
        evaluate=_causal_windows,
        protocol=lambda model, length, stride, p: f"sliding window {length}, stride {stride or max(length // 2, 1)}",
        design=lambda config, family, mlm_probability=None: "Causal LM: the decoder predicts every next token of its block.",
        length_flags="--block_size",
        data_flags=("block_size", "eval_stride"),
        eval_batch_factor=1,
    ),
    Objective(
        "many_target_windows", "next_token", "AutoModelForCausalLM", "next-token",
        example_length=_context_length,
        training_dataset=lambda model, stream, length, num_targets, seed: TargetWindowDataset(
            stream, length, model.config.target_length),
        collator=_no_collator,
        evaluate=_target_windows,
        protocol=lambda model, length, stride, p: (
            f"windows of {length}, the last {model.config.target_length} positions scored"),
        design=_many_targets_design,
        next_token_mode="many",
        data_flags=("context_length", "target_length"),
    ),
    Objective(
        "one_target_window", "next_token", "AutoModelForCausalLM", "next-token",
        example_length=_context_length,
        training_dataset=lambda model, stream, length, num_targets, seed: WindowDataset(
            stream, length, num_targets, seed=seed),
        collator=_no_collator,
        evaluate=_positions,
        protocol=lambda model, length, stride, p: f"every position, up to {length} preceding tokens",
        design=_one_target_design,
        next_token_mode="window",
        data_flags=("context_length", "targets_per_epoch"),
    ),
    Objective(
        "masked_lm", "mlm", "AutoModelForMaskedLM", "masked-LM",
        example_length=_context_length,
        # unlabelled blocks: the collator masks and labels them
        training_dataset=lambda model, stream, length, num_targets, seed: BlockDataset(stream, length, labels=False),
        collator=_bert_collator,
        evaluate=_masked_blocks,
        protocol=lambda model, length, stride, p: (
            f"blocks of {length}, {p:.0%} of each block's tokens masked (fixed positions) and predicted from the rest"),
        design=_masked_design,
        card_template="mlm_model_card.md",
        data_flags=("context_length", "mlm_probability"),
        recorded_arguments=("mlm_probability",),
    ),
):
    register_objective(_objective)


# ------------------------------------------------------------------------------------------------ any head


def is_masked_lm(model):
    """Whether `model`'s head is trained on masked blocks and evaluated on masked tokens."""
    return objective_of(model) is OBJECTIVES["masked_lm"]


def example_length(model, block_size=None):
    """Tokens in one training example and evaluation window of `model`: the causal LM's `block_size` (a choice of the
    data, not of its config), every other head's `config.context_length`."""
    return objective_of(model).example_length(model, block_size)


def lm_training_dataset(model, stream, block_size=None, num_targets=None, seed=0):
    """The training dataset of `model`'s objective over a 1-D token `stream`: `BlockDataset` of `block_size` for a
    causal LM, unlabelled blocks of `context_length` for a masked LM (`DataCollatorForLanguageModeling` masks and
    labels them), `TargetWindowDataset` for a many-target head, `WindowDataset` (`num_targets` windows drawn with
    `seed`, default every position) for the one-target head. Items hold (example_length,) "input_ids" (and labels)."""
    objective = objective_of(model)
    return objective.training_dataset(model, stream, objective.example_length(model, block_size), num_targets, seed)


def _rates(sums):
    count = sums["tokens"]
    return {
        "perplexity": math.exp(sums["nll"] / count) if count else float("nan"),
        "accuracy": sums["correct"] / count if count else float("nan"),
        **sums,
    }


def evaluate_stream(model, stream, batch_size=16, stride=None, block_size=None, eos_id=0, progress=None,
                    rank=0, world_size=1, tokenizer=None, mlm_probability=MLM_PROBABILITY):
    """Perplexity and next-token accuracy of a 1-D token `stream` (n,) under the protocol of `model`'s objective
    (`language_modeling`'s docstring): a causal LM's windows are `block_size` tokens moved by `stride` (default
    block_size // 2); a next-token head reads its `context_length`, `target_length` and `next_token_mode`; a masked
    LM needs `tokenizer`. `rank`/`world_size` split the windows between data-parallel processes: the returned sums
    ("nll", "tokens", "correct") are this process's, to be reduced. `progress`: a description for a tqdm bar over the
    batches. -> {"perplexity", "accuracy", "tokens", "nll", "correct"}."""
    settings = Evaluation(batch_size, block_size, stride, eos_id, tokenizer, mlm_probability, progress, rank,
                          world_size)
    return _rates(objective_of(model).evaluate(model, stream, settings))


def evaluate_perplexity(model, stream, tokenizer=None, batch_size=16, block_size=None, stride=None, eos_id=None,
                        mlm_probability=MLM_PROBABILITY, progress=None, accelerator=None):
    """Perplexity and accuracy of a 1-D token `stream` under `model`'s protocol (`evaluate_stream`; a masked LM needs
    `tokenizer` for its mask and special tokens). With an `accelerate.Accelerator` each process scores its share of
    the windows and the sums are reduced over the processes (every process must call it). `eos_id` defaults to the
    tokenizer's; `block_size` and `stride` are the causal LM's windows. `stream`: (n,) token ids.
    -> {"perplexity", "accuracy", "tokens_scored", "nll" (summed)}."""
    rank, world_size = (0, 1) if accelerator is None else (accelerator.process_index, accelerator.num_processes)
    eos_id = tokenizer.eos_token_id if eos_id is None and tokenizer is not None else eos_id
    settings = Evaluation(batch_size, block_size, stride, eos_id, tokenizer, mlm_probability, progress, rank,
                          world_size)
    metrics = objective_of(model).evaluate(model, stream, settings)
    sums = torch.tensor([metrics["nll"], metrics["tokens"], metrics["correct"]], dtype=torch.float64)
    if accelerator is not None:
        sums = accelerator.reduce(sums.to(accelerator.device), reduction="sum")
    nll, count, correct = (float(x) for x in sums)
    return {"perplexity": math.exp(nll / count), "accuracy": correct / count, "tokens_scored": int(count), "nll": nll}


def evaluation_protocol(model, block_size=None, stride=None, mlm_probability=MLM_PROBABILITY):
    """The protocol `evaluate_perplexity` applies to `model`, in words (for results files and model cards)."""
    objective = objective_of(model)
    return objective.protocol(model, objective.example_length(model, block_size), stride, mlm_probability)

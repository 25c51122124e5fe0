"""Language-modelling data and evaluation for your own Trainer scripts: a word-level tokenizer, the training datasets
of every head, and the perplexity protocol over a token stream.

The protocol: a split is one token stream, `[eos] + stream` (the leading `<eos>` is the context of the first word),
and every token after it is predicted exactly once and scored: in sliding windows for causal LMs (`decoder_windows`),
by the last positions of each window for the many-target heads (`target_windows`), from one window of the preceding
tokens each for the one-target head (`evaluate_positions`), and for masked LMs as a fixed share of each block's
positions, masked and predicted from the rest (`evaluate_masked_stream`: not comparable with a causal perplexity).
Perplexity = exp(mean negative log-likelihood per scored token); accuracy = the share of scored tokens whose most
likely token is the reference.

Which of these a head trains on and is scored by is its objective's row (`objectives.OBJECTIVES`). The tokenizer needs
`tokenizers` (installed with transformers), the rest torch only; the modeling files never import this module.
"""

import math
from collections import Counter

import torch
import torch.nn.functional as F

from ..attention import MultiHeadAttention


def build_word_tokenizer(lines, model_max_length=None):
    """Word-level `PreTrainedTokenizerFast` from training lines: whitespace split, ids by decreasing frequency (what an
    adaptive softmax needs; ties in order of first appearance) after `<unk>` (0) and `<eos>` (1, also the padding
    token), and `<mask>` last (for masked-LM training and the `fill-mask` pipeline; last, so that it leaves the words'
    ids and the adaptive clusters as they are). Tokens decode with a leading space each, so decoded continuations keep
    their word boundaries. `model_max_length`: the model's context (run_glue / run_mlm read it to cut sequences)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts = Counter(word for line in lines for word in line.split())
    vocab = {"<unk>": 0, "<eos>": 1}
    for word, _ in counts.most_common():
        vocab.setdefault(word, len(vocab))
    vocab.setdefault("<mask>", len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.Replace(Regex("^"), " ")  # a space before every word
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<eos>",
        mask_token="<mask>",
        model_input_names=["input_ids", "attention_mask"],
        **extra,
    )


def token_stream(lines, tokenizer, eos_id):
    """Lines -> one LongTensor of ids (n,), with `eos_id` after every line (the WikiText convention)."""
    ids = []
    for line in tokenizer(lines, add_special_tokens=False)["input_ids"]:
        ids.extend(line)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


class BlockDataset(torch.utils.data.Dataset):
    """Causal-LM training: the stream (1-D) cut into non-overlapping blocks; labels = input_ids (shifted in the
    model). Items: {"input_ids": (block_size,), "labels": (block_size,)}; with `labels=False` only "input_ids" (for
    masked-LM training, where `DataCollatorForLanguageModeling` masks and labels)."""

    def __init__(self, stream, block_size, labels=True):
        if block_size < 2 or len(stream) < block_size:
            raise ValueError(f"A block of {block_size} tokens needs block_size >= 2 and a stream of at least that many "
                             f"tokens; the stream has {len(stream)}.")
        self.blocks = stream[: len(stream) // block_size * block_size].view(-1, block_size)
        self.labels = labels

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        if not self.labels:
            return {"input_ids": self.blocks[i]}
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class PackedLinesDataset(torch.utils.data.Dataset):
    """Causal- or masked-LM training on packed rows (train_lm.py --packing): each line of the stream (its tokens and the eos after
    it; empty lines, an eos alone, are left out) is a sequence of its own, and the sequences, in order, fill rows of
    `block_size` tokens; a line that does not fit is cut there, its rest beginning the next row. Items: "input_ids",
    "labels" and "position_ids", each (block_size,): positions restart at every sequence, whose first label is -100
    (nothing in its own sequence comes before it). `PackedRowsCollator` makes a batch of them one packed row."""

    def __init__(self, stream, block_size, eos_id):
        is_eos = stream == eos_id
        line = torch.cumsum(is_eos.long(), 0) - is_eos.long()  # each token's line, its eos included
        keep = torch.bincount(line)[line] > 1
        tokens, line = stream[keep], line[keep]
        rows = len(tokens) // block_size
        if block_size < 2 or rows < 1:
            raise ValueError(f"A packed row of {block_size} tokens needs block_size >= 2 and at least that many tokens "
                             f"in non-empty lines; they hold {len(tokens)}.")
        tokens, line = tokens[: rows * block_size], line[: rows * block_size]
        index = torch.arange(len(tokens))
        starts = (index % block_size == 0) | torch.cat([torch.ones(1, dtype=torch.bool), line[1:] != line[:-1]])
        last_start = torch.cummax(torch.where(starts, index, 0), 0).values
        self.input_ids = tokens.view(rows, block_size)
        self.labels = tokens.masked_fill(starts, -100).view(rows, block_size)
        self.position_ids = (index - last_start).view(rows, block_size)

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.labels[i], "position_ids": self.position_ids[i]}


class PackedRowsCollator:
    """Items of (length,) "input_ids" and "labels" (and "position_ids", else each item is one sequence) -> one packed
    row, transformers' format: (1, total) "input_ids", "labels" (-100 at every sequence's first position) and
    "position_ids" restarting at each sequence. The model keeps each sequence to itself. `masking`: a masked LM's
    collator (`transformers.DataCollatorForLanguageModeling`), whose masking then makes the row's inputs and labels."""

    def __init__(self, masking=None):
        self.masking = masking

    def __call__(self, items):
        ids = [torch.as_tensor(item["input_ids"]) for item in items]
        positions = [torch.as_tensor(item["position_ids"]) if "position_ids" in item else torch.arange(len(x))
                     for item, x in zip(items, ids)]
        row = {"input_ids": torch.cat(ids)[None], "position_ids": torch.cat(positions)[None]}
        if self.masking is not None:
            row["input_ids"], row["labels"] = self.masking.torch_mask_tokens(row["input_ids"].clone())
        else:
            row["labels"] = torch.cat([torch.as_tensor(item.get("labels", x)).masked_fill(p == 0, -100)
                                       for item, x, p in zip(items, ids, positions)])[None]
        return row


class TargetWindowDataset(torch.utils.data.Dataset):
    """Many-target heads: windows of `context_length` tokens whose last `target_length - 1` labels are trained (the
    last position's target lies outside the window), so consecutive windows start `target_length - 1` tokens apart
    and every token of the stream after the first prefix is a target once per epoch.
    Items: {"input_ids": (context_length,), "labels": (context_length,)} (causal-LM labels = input_ids)."""

    def __init__(self, stream, context_length, target_length):
        if not 2 <= target_length <= context_length or len(stream) < context_length:
            raise ValueError(
                f"Windows of {context_length} tokens with {target_length} targets need 2 <= target_length <= "
                f"context_length and a stream of at least context_length tokens; the stream has {len(stream)}."
            )
        self.stream, self.context = stream, context_length
        self.starts = torch.arange(0, len(stream) - context_length + 1, target_length - 1)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        start = int(self.starts[i])
        window = self.stream[start : start + self.context]
        return {"input_ids": window, "labels": window}


class WindowDataset(torch.utils.data.Dataset):
    """The literal one-target head: `context_length` tokens and the token after them.
    Items: {"input_ids": (context_length,), "labels": ()}. `num_targets` samples that many windows (seeded)."""

    def __init__(self, stream, context_length, num_targets=None, seed=0):
        if len(stream) <= context_length:
            raise ValueError(f"Windows of {context_length} tokens need a longer stream than {len(stream)} tokens.")
        self.stream, self.context = stream, context_length
        positions = torch.arange(context_length, len(stream))
        if num_targets is not None and num_targets < len(positions):
            g = torch.Generator().manual_seed(seed)
            positions = positions[torch.randperm(len(positions), generator=g)[:num_targets]]
        self.positions = positions

    def __len__(self):
        return len(self.positions)

    def __getitem__(self, i):
        p = int(self.positions[i])
        return {"input_ids": self.stream[p - self.context : p], "labels": self.stream[p]}


def decoder_windows(stream_length, block_size, stride):
    """Sliding windows of a causal LM over `[eos] + stream`: [(start, end, tokens scored at the end of the window)],
    windows of `block_size` tokens moved by `stride`, so that each token of the stream is scored once, with at least
    `block_size - stride` tokens of context (fewer at the start)."""
    # a window predicts its positions 1..n-1 from the ones before: it can add at most block_size - 1 scored tokens
    _check_stride(block_size - 1, stride, "block_size - 1")
    total = stream_length + 1
    windows, prev_end = [], 1
    for begin in range(0, total, stride):
        end = min(begin + block_size, total)
        windows.append((begin, end, end - prev_end))
        prev_end = end
        if end == total:
            break
    return windows


def target_windows(stream_length, context_length, target_length):
    """Windows of a many-target head over `[eos] + stream`: [(start, end, tokens scored)]; windows of `context_length`
    tokens moved by `target_length`, window [start, end) predicting the tokens end - scored + 1 .. end with its last
    `scored` positions, so that each has at least `context_length - target_length` tokens of context (fewer at the
    start, where the windows are shorter)."""
    _check_stride(context_length, target_length, "context_length")
    last = stream_length  # index of the last token of [eos] + stream
    windows, prev = [], 0
    while prev < last:
        end = min(prev + target_length, last)
        windows.append((max(0, end - context_length), end, end - prev))
        prev = end
    return windows


def _check_stride(window, stride, name):
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= window:
        raise ValueError(
            f"The stride must be an integer in [1, {name}={window}] so that every token is scored once with context; "
            f"got {stride!r}."
        )


def _scores():
    """(sums, score): `score(logits (k, vocab), target (k,))` adds the NLL, the count and the correct argmaxes to
    `sums`, a float64 (3,) tensor on the CPU."""
    sums = torch.zeros(3, dtype=torch.float64)  # nll, tokens, correct

    def score(logits, target):
        logits, target = logits.float(), target.to(logits.device)
        sums[0] += F.cross_entropy(logits, target, reduction="sum").double().cpu()
        sums[1] += target.numel()
        sums[2] += (logits.argmax(-1) == target).sum().cpu()

    return sums, score


def _totals(sums):
    nll, count, correct = sums.tolist()
    return {"nll": nll, "tokens": int(count), "correct": int(correct)}


def causal_window_logits(model, full, chunk, ids):
    """A causal LM's windows `chunk` [(start, end, scored)], `ids` (b, n) -> (logits (b, scored, vocab), targets
    (b, scored)): position i predicts token i + 1 of the window, and only the scored positions' logits are computed
    (the output layer is most of the cost)."""
    n, scored = ids.shape[1], chunk[0][2]
    logits = model(input_ids=ids, logits_to_keep=scored + 1, use_cache=False).logits  # (b, scored + 1, vocab)
    return logits[:, :-1], ids[:, n - scored :]


def target_window_logits(model, full, chunk, ids):
    """A many-target head's windows: the last `scored` positions are targets after a bidirectional prefix; position t
    predicts token t + 1, the last one the token after the window -> (logits (b, scored, vocab), targets)."""
    n, scored = ids.shape[1], chunk[0][2]
    logits = model(input_ids=ids, prefix_length=n - scored).logits[:, n - scored :]
    target = torch.stack([full[end - scored + 1 : end + 1] for _, end, _ in chunk]).to(ids.device)
    return logits, target


def _passes(batches, rank=0, world_size=1):
    """This process's forward passes over `batches` (the same list on every process): [(batch, scored)], one batch in
    `world_size` from `rank`, then unscored repeats of the first so that every process makes the same number of
    passes. A sharded model (FSDP, DeepSpeed ZeRO-3) gathers its parameters in every forward, with every process."""
    mine = batches[rank::world_size]
    return [(b, True) for b in mine] + [(b, False) for b in batches[:1]] * (-(-len(batches) // world_size) - len(mine))


@torch.no_grad()
def evaluate_windows(model, stream, windows, window_logits, batch_size=16, eos_id=0, progress=None, rank=0,
                     world_size=1):
    """Scores the `windows` [(start, end, scored)] over `[eos] + stream` (module docstring) with `window_logits`
    (`causal_window_logits`, `target_window_logits`), this process's share of the batches (`rank` of `world_size`,
    `_passes`); windows of one length batch together without padding. -> this process's sums {"nll",
    "tokens", "correct"}."""
    from tqdm.auto import tqdm

    model.eval()
    device = next(model.parameters()).device
    full = torch.cat([torch.tensor([eos_id]), stream])
    sums, score = _scores()
    groups = {}
    for w in windows:
        groups.setdefault(w[1] - w[0], []).append(w)
    batches = [g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
    # the last window of a split scores fewer tokens: its batch is split into single windows
    parts = [p for chunk in batches
             for p in ([chunk] if all(w[2] == chunk[0][2] for w in chunk) else [[w] for w in chunk])]
    for part, scored in tqdm(_passes(parts, rank, world_size), desc=progress, unit="batch", disable=progress is None):
        ids = torch.stack([full[begin:end] for begin, end, _ in part]).to(device)
        logits, target = window_logits(model, full, part, ids)
        if scored:
            score(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return _totals(sums)


@torch.no_grad()
def evaluate_positions(model, stream, batch_size=16, eos_id=0, progress=None, rank=0, world_size=1):
    """The one-target head: every token of `stream` after `[eos]` predicted from the up to `context_length` tokens
    before it (left-padded, masked), this process's share of the batches (`_passes`). -> this process's sums
    {"nll", "tokens", "correct"}."""
    from tqdm.auto import tqdm

    model.eval()
    device = next(model.parameters()).device
    full = torch.cat([torch.tensor([eos_id]), stream])
    sums, score = _scores()
    context = model.config.context_length
    padded = torch.cat([torch.full((context - 1,), eos_id), full])  # row t: the context of full[t + 1]
    positions = torch.arange(1, len(full))
    passes = _passes(list(range(0, len(positions), batch_size)), rank, world_size)
    for start, scored in tqdm(passes, desc=progress, unit="batch", disable=progress is None):
        pos = positions[start : start + batch_size]
        ids = torch.stack([padded[s : s + context] for s in (pos - 1).tolist()])
        mask = (torch.arange(context)[None, :] >= (context - pos)[:, None]).long()  # real tokens only
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0]
        if scored:
            score(logits, full[pos])
    return _totals(sums)


def masked_positions(length, probability, generator, exclude=None):
    """A (length,) bool mask choosing `round(probability * length)` positions (at least one) uniformly, never where
    `exclude` (bool, (length,)) is true."""
    allowed = torch.ones(length, dtype=torch.bool) if exclude is None else ~exclude
    candidates = allowed.nonzero().squeeze(1)
    count = max(1, round(probability * len(candidates))) if len(candidates) else 0
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
    mask = torch.zeros(length, dtype=torch.bool)
    mask[chosen] = True
    return mask


@torch.no_grad()
def evaluate_masked_stream(model, stream, block_size, mask_token_id, probability=0.15, batch_size=8, seed=0,
                           special_ids=(), progress=None, rank=0, world_size=1):
    """Masked-LM perplexity of a token `stream` (n,) under `model` (a `*ForMaskedLM`): non-overlapping blocks of
    `block_size`, in each a fixed `probability` share of its positions (drawn with `seed`, never a token of
    `special_ids`) replaced by `mask_token_id` and predicted from the rest of the block. Returns {"loss": mean NLL
    per masked token, "perplexity", "accuracy" (argmax = reference), "tokens_scored"}; the same positions on every
    call, so runs compare. Under several processes each scores its share of the batches (`rank`, `world_size`,
    `_passes`); sum
    `loss_sum`, `correct` and `tokens_scored` over processes (returned too)."""
    blocks = BlockDataset(stream, block_size).blocks
    generator = torch.Generator().manual_seed(seed)
    special = torch.tensor(sorted(special_ids), dtype=torch.long)
    masks = torch.stack([masked_positions(block_size, probability, generator, torch.isin(b, special)) for b in blocks])
    passes = _passes(list(range(0, len(blocks), batch_size)), rank, world_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    loss_sum, correct, scored = 0.0, 0, 0
    iterator = passes
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(passes, desc=progress, unit="batch")
    try:
        for start, counts in iterator:
            ids, mask = blocks[start : start + batch_size], masks[start : start + batch_size]
            inputs = ids.masked_fill(mask, mask_token_id).to(device)
            logits = model(input_ids=inputs).logits[mask.to(device)].float()  # (masked, vocab)
            if not counts:
                continue
            targets = ids[mask].to(device)
            loss_sum += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            correct += int((logits.argmax(-1) == targets).sum())
            scored += int(mask.sum())
    finally:
        model.train(was_training)
    loss = loss_sum / max(scored, 1)
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": correct / max(scored, 1), "tokens_scored": scored,
            "loss_sum": loss_sum, "correct": correct}


def lm_flops_per_token(model, sequence_length):
    """Model FLOPs of training on one input token (forward and backward), counted as PaLM does (Chowdhery et al. 2022,
    appendix B): 6 N + 12 L d K. N: the parameters without the input embedding (a lookup), the output layer counted
    (tied or not: its matmul runs); L: the attention modules; d: the width; K: the keys a query reads, the
    `sequence_length` for softmax attention (causal counted as full, as PaLM does), the head dimension for linear
    attention (a d_head x d_head state per head, read and updated once per token: 4 d d_head forward; a chunked
    kernel computes more). Exact for the decoder with a dense output layer; an upper bound elsewhere: an adaptive
    softmax runs its tail clusters for rare tokens only, and the next-token heads run their pooling, output layer,
    inducing points and latents on fewer rows than input tokens. -> (FLOPs per token, the count in words)."""
    config = model.config
    default_head_dim = config.hidden_size // config.num_attention_heads
    embedding = {id(p) for p in model.get_input_embeddings().parameters()}
    output = {id(p) for p in getattr(model, "lm_head", torch.nn.Identity()).parameters()}
    n = sum(p.numel() for p in model.parameters() if id(p) not in embedding or id(p) in output)
    linear = config.attention_type == "linear"
    keys = [getattr(m, "head_dim", default_head_dim) if linear else sequence_length
            for m in model.modules() if isinstance(m, MultiHeadAttention)]
    attention = sum(12 * config.hidden_size * k for k in keys)
    words = (f"6N + 12LdK: N={n:,} parameters without the input embedding, L={len(keys)} attention modules, "
             f"d={config.hidden_size}, K={'the head dimension (linear attention)' if linear else sequence_length}")
    return 6 * n + attention, words

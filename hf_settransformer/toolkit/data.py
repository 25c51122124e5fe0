"""Batching sets of different sizes for the Trainer: padded, or packed into one row."""

import torch


class DataCollatorForSets:
    """A batch of sets of different sizes -> padded tensors plus an `attention_mask` (1 real element, 0 padding), or
    (`packed=True`) the sets concatenated into one row with their boundaries.

    Each example is a dict with one set-valued entry, `input_features` (a (n_i, input_size) tensor or nested list)
    or `input_ids` (n_i token ids), and any other entries (`labels`, ...), which are stacked (labels: (b,), one per
    set, in both forms).

    Padded: `input_features` (b, n, input_size) float or `input_ids` (b, n), `attention_mask` (b, n), n being the
    largest set (rounded up to `pad_to_multiple_of`). Padding elements are zeros (features) or `pad_token_id`
    (tokens); the models ignore them through the mask, so outputs for a set do not depend on what else is in the batch.

    Packed (`packed=True`, for the models with `takes_packed_batches`: no compute spent on padding): `input_features`
    (1, total, input_size) or `input_ids` (1, total), `cu_seq_lens_q` and `cu_seq_lens_k` (b + 1,) int32 (0, then
    where each set ends: transformers' names, as `DataCollatorWithFlattening` gives them), `max_length_q` and
    `max_length_k` (the largest set), and no `attention_mask`. An empty set is refused (a packed row has no room for
    one): drop it, or use the padded form.

    Args:
        pad_to_multiple_of (`int`, *optional*): round the padded set size up to a multiple of this (padded only).
        pad_token_id (`int`, defaults to 0): the id written into padded token positions.
        packed (`bool`, defaults to False): pack the sets into one row instead of padding them.
    """

    set_keys = ("input_features", "input_ids")

    def __init__(self, pad_to_multiple_of=None, pad_token_id=0, packed=False):
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_token_id = pad_token_id
        self.packed = packed

    def __call__(self, examples):
        if not examples:
            raise ValueError("DataCollatorForSets got an empty list of examples.")
        keys = [k for k in self.set_keys if k in examples[0]]
        if len(keys) != 1:
            raise ValueError(f"Each example needs exactly one of {self.set_keys}; got keys {sorted(examples[0])}.")
        key = keys[0]
        sets = [torch.as_tensor(e[key]) for e in examples]
        if key == "input_features":
            width = sets[0].shape[-1] if sets[0].dim() == 2 else None
            for i, s in enumerate(sets):
                if s.dim() != 2 or s.shape[-1] != width:
                    raise ValueError(
                        f"input_features of example {i} has shape {tuple(s.shape)}; every set must be (size, {width})."
                    )
        elif any(s.dim() != 1 for s in sets):
            raise ValueError("input_ids of every example must be a 1-D sequence of token ids.")
        batch = self.pack(key, sets) if self.packed else self.pad(key, sets)
        for name in examples[0]:
            if name != key:
                values = [torch.as_tensor(e[name]) for e in examples]
                batch[name] = torch.stack(values)
        return batch

    def pad(self, key, sets):
        longest = max(len(s) for s in sets)
        if self.pad_to_multiple_of:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        longest = max(longest, 1)
        fill = 0.0 if key == "input_features" else self.pad_token_id
        padded = sets[0].new_full((len(sets), longest, *sets[0].shape[1:]), fill)
        mask = torch.zeros(len(sets), longest, dtype=torch.long)
        for i, s in enumerate(sets):
            padded[i, : len(s)] = s
            mask[i, : len(s)] = 1
        return {key: padded if key == "input_ids" else padded.float(), "attention_mask": mask}

    def pack(self, key, sets):
        lengths = [len(s) for s in sets]
        if 0 in lengths:
            raise ValueError(
                f"Example {lengths.index(0)} holds an empty set ({key} of size 0): a packed batch has no room for one "
                "(every set of the row holds at least one element). Leave it out, or use DataCollatorForSets(packed="
                "False), whose padded rows may be empty."
            )
        row = torch.cat(sets)[None]  # (1, total, ...)
        cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)  # (b + 1,)
        longest = max(lengths)
        return {key: row if key == "input_ids" else row.float(), "cu_seq_lens_q": cu, "cu_seq_lens_k": cu.clone(),
                "max_length_q": longest, "max_length_k": longest}

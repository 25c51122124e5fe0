"""Packed batches: several sequences (or sets) concatenated into one row, computed on their real elements only.

transformers' packed format (`DataCollatorWithFlattening`): `input_ids` of shape (1, total), `position_ids` that
restart at 0 at each sequence, and optionally `cu_seq_lens_q`/`cu_seq_lens_k` (the boundaries, (S + 1,) int32:
0, then where each sequence ends), `max_length_q`/`max_length_k` and `seq_idx` (the sequence of each position, as
Mamba models take it). A model reads any of them: `position_ids` alone mark a packed batch where no
`attention_mask` and no cache is given, as in transformers' own models (`masking_utils.find_packed_sequence_indices`).
The checks (`checks.check_forward`) turn them into one `Packing`, handed down as `packing`; every attention then keeps
each sequence to itself.

Shape legend: S sequences, total positions.
"""

from dataclasses import dataclass, field

import torch

PACKING_INPUTS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""The keyword inputs that describe a packed batch besides `position_ids` (transformers' names)."""


@dataclass(eq=False)
class Packing:
    """Where the sequences of a packed row begin and end.

    seq_idx: (1, total) int64, the sequence each position belongs to: 0, 0, ..., 1, 1, ... (non-decreasing, no gaps).
    cu_seqlens: (S + 1,) int32 boundaries (0 first, total last), or None where only `seq_idx` is known and no value
        may be read (a compiled forward); `boundaries()` makes them (a host read).
    lengths: the S sequence lengths as Python ints where they were read (the eager checks read them), else None.
    """

    seq_idx: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    lengths: tuple | None = None
    _positions: torch.Tensor | None = field(default=None, repr=False)
    memo: dict = field(default_factory=dict, repr=False)  # what the layers derive once per forward (`set_packing`)

    @property
    def total(self):
        return self.seq_idx.shape[-1]

    @property
    def num_sequences(self):
        """S: a shape where the boundaries are known (no host read), else read from `seq_idx`."""
        if self.cu_seqlens is not None:
            return self.cu_seqlens.shape[0] - 1
        return int(self.seq_idx[0, -1]) + 1

    @property
    def max_length(self):
        """The longest sequence (a host read where the lengths were not read already)."""
        if self.lengths is not None:
            return max(self.lengths)
        return int(self.boundaries().diff().max())

    def boundaries(self):
        """(S + 1,) int32 `cu_seqlens`, made from `seq_idx` where not given."""
        if self.cu_seqlens is None:
            counts = torch.bincount(self.seq_idx[0], minlength=self.num_sequences)
            self.cu_seqlens = torch.nn.functional.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
        return self.cu_seqlens

    def last_windows(self, length):
        """Each sequence's last `length` elements (fewer where it is shorter), as a left-padded batch: (S, L) int64
        positions in the row (0 at a padding slot) and (S, L) bool, the real slots. L is `length`, or the longest
        sequence where that is shorter and the lengths were read (no host read otherwise)."""
        cu = self.boundaries().long()
        if self.lengths is not None:
            length = min(length, max(self.lengths))
        slots = cu[1:, None] - length + torch.arange(length, device=cu.device)  # (S, L): each window ends its sequence
        real = slots >= cu[:-1, None]
        return torch.where(real, slots, 0), real

    def positions(self):
        """(1, total) int64: each position's place in its own sequence (0 at every start)."""
        if self._positions is None:
            starts = self.boundaries().long()[self.seq_idx]  # (1, total)
            self._positions = torch.arange(self.total, device=self.seq_idx.device)[None] - starts
        return self._positions


def sequences_from_positions(position_ids):
    """transformers' rule (`find_packed_sequence_indices`): a new sequence begins wherever a position is not the one
    before it plus 1. (b, n) -> (b, n) int64 sequence ids, 0 first."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).long().cumsum(-1)


def seq_idx_from_boundaries(cu_seqlens, total):
    """(S + 1,) boundaries -> (1, total) int64 sequence ids, without a host read (the output size is known)."""
    lengths = cu_seqlens.diff().long()
    ids = torch.arange(lengths.shape[0], device=cu_seqlens.device)
    return torch.repeat_interleave(ids, lengths, output_size=total)[None]


def _integers(name, x, dims, shape):
    if not torch.is_tensor(x) or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool or (
        x.dim() not in dims
    ):
        what = f"{x.dtype} of shape {tuple(x.shape)}" if torch.is_tensor(x) else f"a {type(x).__name__}"
        raise ValueError(f"`{name}` of a packed batch must be an integer tensor of shape {shape}; got {what}.")


def read_packing(inputs, b, n, *, takes_position_ids=True, keeps_a_cache=False, read_values=True, device=None):
    """The packed-batch inputs of one forward (`PACKING_INPUTS`, and `position_ids` where the model takes them) ->
    a checked `Packing`, or None for an ordinary batch. The raw inputs are taken out of `inputs`.

    Refused, naming the input: boundaries that do not start at 0, do not increase, or do not end at the total length;
    `seq_idx`, `cu_seq_lens_q`/`_k` or `position_ids` that disagree; a packed batch of more than one row, with
    padding (`attention_mask` 0) or with a cache. `max_length_q`/`_k` are not used: the lengths are read from the
    boundaries. Compiled (`read_values=False`), only types and shapes are checked, and `position_ids` of one row
    always count as packed (all one sequence where they never restart), as in transformers' own models. `device`: the
    inputs', where the boundaries and ids are put (a collator's tensors may still be on the CPU)."""
    cu_q, cu_k = inputs.pop("cu_seq_lens_q", None), inputs.pop("cu_seq_lens_k", None)
    for unused in ("max_length_q", "max_length_k"):  # read from the boundaries instead
        inputs.pop(unused, None)
    seq_idx = inputs.pop("seq_idx", None)
    position_ids = inputs.get("position_ids") if takes_position_ids else None
    explicit = [name for name, x in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k), ("seq_idx", seq_idx))
                if x is not None]
    mask, cache = inputs.get("attention_mask"), inputs.get("past_key_values")
    if not explicit:
        if position_ids is None or mask is not None or cache is not None:
            return None
        if b > 1 or position_ids.shape[0] != 1:
            if read_values and bool((sequences_from_positions(position_ids)[:, -1] > 0).any()):
                raise ValueError(
                    f"`position_ids` restart inside a row of a batch of {b} rows, and no `attention_mask` is given: a "
                    "packed batch is one row (input_ids of shape (1, total), as DataCollatorWithFlattening makes "
                    "it); pass an `attention_mask` for a padded batch."
                )
            return None
        segments = sequences_from_positions(position_ids)
        if read_values and int(segments[0, -1]) == 0:
            return None  # one sequence: an ordinary row
        packing = Packing(segments)
    else:
        if b != 1:
            raise ValueError(
                f"`{explicit[0]}` marks a packed batch, which is one row (inputs of shape (1, total), as "
                f"DataCollatorWithFlattening makes them); got {b} rows."
            )
        for name, cu in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k)):
            if cu is not None:
                _integers(name, cu, (1,), "(S + 1,): 0, then where each sequence ends")
                if not 2 <= cu.shape[0] <= n + 1:
                    raise ValueError(f"`{name}` must hold 2 to {n + 1} boundaries (0, then where each of the S "
                                     f"sequences ends); got {cu.shape[0]}.")
        if cu_q is not None and cu_k is not None and cu_q.shape != cu_k.shape:
            raise ValueError(
                f"`cu_seq_lens_q` and `cu_seq_lens_k` must be the same boundaries here (queries and keys are the "
                f"same elements); got {cu_q.shape[0] - 1} and {cu_k.shape[0] - 1} sequences."
            )
        cu_q, cu_k, seq_idx = (None if x is None else x.to(device) for x in (cu_q, cu_k, seq_idx))
        if seq_idx is not None:
            _integers("seq_idx", seq_idx, (1, 2), f"(1, {n})")
            if seq_idx.numel() != n or (seq_idx.dim() == 2 and seq_idx.shape[0] != 1):
                raise ValueError(f"`seq_idx` must have shape (1, {n}) (one id per position), got {tuple(seq_idx.shape)}.")
            seq_idx = seq_idx.reshape(1, n).long()
        cu = cu_k if cu_k is not None else cu_q
        if cu is not None:
            cu = cu.to(torch.int32)
            if read_values:  # before the ids are made from them
                _check_boundaries(cu, "cu_seq_lens_k" if cu_k is not None else "cu_seq_lens_q", n, cu_q, cu_k)
            packing = Packing(seq_idx_from_boundaries(cu, n), cu)
        else:
            packing = Packing(seq_idx)
    if cache is not None:
        raise ValueError("A packed batch carries no cache: pass `past_key_values=None` (each sequence starts anew).")
    if inputs.get("use_cache"):
        raise ValueError("A packed batch keeps no cache: pass `use_cache=False` (or leave it unset).")
    if keeps_a_cache:
        inputs["use_cache"] = False
    if read_values:
        _check_packing_values(packing, n, cu_q, cu_k, seq_idx if explicit else None, position_ids, mask)
    return packing


def _check_boundaries(cu, given, n, cu_q, cu_k):
    values = cu.tolist()
    if values[0] != 0 or values[-1] != n or any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(
            f"`{given}` must start at 0, increase (every sequence holds at least one element) and end at the total "
            f"length {n}; got {values[:8]}{' ...' if len(values) > 8 else ''}."
        )
    if cu_q is not None and cu_k is not None and not torch.equal(cu_q.to(cu.device).int(), cu):
        raise ValueError("`cu_seq_lens_q` and `cu_seq_lens_k` must be the same boundaries here (queries and keys are "
                         "the same elements).")


def _check_packing_values(packing, n, cu_q, cu_k, seq_idx, position_ids, mask):
    """The value checks of `read_packing` after the boundaries'; fills `packing.lengths`."""
    if packing.cu_seqlens is not None:
        if seq_idx is not None and not torch.equal(seq_idx.to(packing.seq_idx.device), packing.seq_idx):
            given = "cu_seq_lens_k" if cu_k is not None else "cu_seq_lens_q"
            raise ValueError(f"`seq_idx` disagrees with `{given}`: it must number the sequences 0, 1, ... in order, "
                             "each position with the sequence the boundaries put it in.")
    else:
        ids = packing.seq_idx[0]
        steps = ids.diff()
        if int(ids[0]) != 0 or bool(((steps != 0) & (steps != 1)).any()):
            raise ValueError("`seq_idx` must number the sequences 0, 1, 2, ... in order (0 first, each step 0 or 1); "
                             f"got {ids[:12].tolist()}{' ...' if n > 12 else ''}.")
    packing.lengths = tuple(packing.boundaries().diff().tolist())
    if position_ids is not None and position_ids.shape[-1] == n and packing.lengths and (
        not torch.equal(sequences_from_positions(position_ids.reshape(1, n)).to(packing.seq_idx.device),
                        packing.seq_idx)
    ):
        raise ValueError(
            "`position_ids` disagree with the packed batch's boundaries: they must restart at each sequence "
            "(0, 1, ... within it, as DataCollatorWithFlattening makes them)."
        )
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("A packed batch has no padding: its `attention_mask` must be all 1 (or not given).")

"""What the processes of a multi-process run agree on: a value decided on the main process and sent to the others."""

import torch


def from_main_process(value):
    """`value` as the main process has it, on every process (a picklable object; itself without several processes).
    What every rank must agree on (a lock's owner, a time budget's max_steps) is decided on rank 0 and sent from there:
    each rank deciding alone (its own timing probe) can disagree, and a rank that stops first leaves the others waiting
    in their next collective."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    if torch.distributed.get_world_size() == 1:
        return value
    shared = [value]
    torch.distributed.broadcast_object_list(shared, src=0)
    return shared[0]

"""Data-parallel training on ``torch.distributed``, launched with ``torchrun --nproc_per_node N``
(docs/distributed.md).

No ``DistributedDataParallel``: every rank holds the whole model and takes a disjoint, contiguous
shard of each global batch. A term ``k`` is a mean over its units, ``L_k = S_k / N_k`` (examples
or real tokens: :meth:`kd.methods.objective.Objective.term_units`); a rank weights its shard's
``L_k^r`` by ``N_k^r / N_k`` (counts all-reduced) and runs a plain backward, so that
``Σ_r (N_k^r / N_k) ∇L_k^r = ∇L_k`` after one all-reduce (SUM) of the gradients, before clipping
and the optimiser step. Accumulation is the same decomposition within a rank. Rank 0 alone
evaluates and writes the run's files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from kd.methods.objective import EXAMPLES, TOKENS, WORDED
from workbench.core.errors import WorkbenchError
from workbench.core.models import resolve_device
from workbench.core.runs import Run

# How long a process waits for the others: rank 0 alone evaluates on dev (and on test at the
# end), and the slowest process sets the pace of the teacher cache (hours for AD-KD's maps of a
# large training set); a failed process ends the job through torchrun, not through this timeout
# (the default, 30 minutes, is shorter than such waits).
WAIT = timedelta(hours=24)


UNITS = (EXAMPLES, TOKENS, WORDED)


def unit_counts(batch: dict[str, Tensor]) -> Tensor:
    """``[3]`` float64, one count per unit of :data:`UNITS` in a (micro-)batch (``attention_mask``
    ``[B, L]``): its examples; its real tokens, or across tokenizers (``word_ids`` ``[B, L]``) the
    shared words the per-token terms compare on; and the examples that share a word, over which
    the per-example word terms average (every example, with one tokenizer)."""
    mask, words = batch["attention_mask"], batch.get("word_ids")
    if words is None:
        units, worded = mask.sum(), mask.shape[0]
    else:
        per_example = words.max(1).values + 1
        units, worded = per_example.sum(), (per_example > 0).sum()
    return torch.tensor([mask.shape[0], float(units), float(worded)], dtype=torch.float64)


def unit_index(unit: str) -> int:
    return UNITS.index(unit)


def unit_shares(count: Tensor, totals: Tensor, units: list[int]) -> list[float]:
    """Each term's share of the global batch that a micro-batch of ``count`` ``[3]`` units
    (:func:`unit_counts`) holds, the batch holding ``totals`` ``[3]``; ``units``: each term's
    unit (:func:`unit_index`). A batch without a unit of a term (across tokenizers, texts that
    share no word) holds 0 of it, not 0/0."""
    return (count / totals.clamp_min(1))[units].tolist()


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def world() -> World:
    """The process group this process belongs to (rank 0 of 1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def start(device_name: str, batch_size: int, accumulation_steps: int) -> torch.device:
    """Check the batch against the launch (``WORLD_SIZE`` processes, each taking ``batch_size /
    processes`` examples of a step in ``accumulation_steps`` micro-batches: both must divide
    evenly), join the process group the launcher described (gloo on CPU, NCCL on CUDA, one GPU
    per local rank) and return this process's device."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise WorkbenchError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes"
        ) from None
    parts = size * accumulation_steps
    if batch_size % parts:
        raise WorkbenchError(
            f"--batch-size {batch_size} does not split into {size} process(es) × "
            f"{accumulation_steps} accumulation step(s): choose a batch size divisible by {parts}"
        )
    device = resolve_device(device_name)
    if size == 1:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=WAIT)
    return device


def shard(items: Sequence[int], parts: int, index: int) -> list[int]:
    """The ``index``-th of ``parts`` contiguous, near-equal pieces of ``items`` (the first
    ``len % parts`` pieces one longer; a piece may be empty)."""
    size, extra = divmod(len(items), parts)
    begin = index * size + min(index, extra)
    return list(items[begin : begin + size + (index < extra)])


def all_reduce(tensor: Tensor, op: Any = None) -> Tensor:
    """Sum (or ``op``) ``tensor`` over the processes, in place; returns it. NCCL reduces CUDA
    tensors only: a CPU tensor (counts, logged values) makes the trip through this process's
    GPU."""
    if world().size > 1:
        nccl = dist.get_backend() == "nccl"
        moved = tensor.to(torch.device("cuda", torch.cuda.current_device())) if nccl else tensor
        dist.all_reduce(moved, op=op or dist.ReduceOp.SUM)
        if moved is not tensor:
            tensor.copy_(moved)
    return tensor


def flat_gradient(parameter: nn.Parameter) -> Tensor:
    """``parameter``'s gradient flattened, zeros where it has none."""
    grad = parameter.grad
    return (grad if grad is not None else torch.zeros_like(parameter)).reshape(-1)


def all_reduce_gradients(parameters: Sequence[nn.Parameter]) -> None:
    """Sum the gradients of ``parameters`` over the processes, in one flat all-reduce. A
    parameter no process gave a gradient keeps ``grad=None`` (AdamW then skips it, as it does
    in one process); one some processes did not reach gets zeros there."""
    if world().size == 1:
        return
    reference = parameters[0]
    flat = torch.cat(
        [flat_gradient(p).to(reference.dtype) for p in parameters]
        + [torch.tensor([float(p.grad is not None) for p in parameters], device=reference.device)]
    )
    dist.all_reduce(flat)
    present = flat[-len(parameters) :] > 0
    offset = 0
    for parameter, has in zip(parameters, present.tolist(), strict=True):
        count = parameter.numel()
        if has:
            parameter.grad = flat[offset : offset + count].view_as(parameter).to(parameter.dtype)
        offset += count


def broadcast_parameters(model: nn.Module) -> None:
    """Give every process rank 0's parameters and buffers."""
    if world().size > 1:
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def gather_objects(value: Any) -> list[Any]:
    """Every process's ``value``, in rank order (on every process)."""
    if world().size == 1:
        return [value]
    values: list[Any] = [None] * world().size
    dist.all_gather_object(values, value)
    return values


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (a stop asked for on rank 0 stops them all)."""
    if world().size == 1:
        return flag
    return bool(all_reduce(torch.tensor([int(flag)]), dist.ReduceOp.MAX).item())


def barrier() -> None:
    if world().size > 1:
        dist.barrier()


@contextmanager
def run_folder(path: Any, info: dict[str, Any], manifest: dict[str, Any]) -> Iterator[Run]:
    """:meth:`Run.writing` on rank 0, which alone writes the run; the other processes open the
    folder once rank 0 has created (or checked) it."""
    if world().main:
        with Run.writing(path, info, manifest) as run:
            barrier()
            yield run
    else:
        barrier()
        yield Run.open(path)

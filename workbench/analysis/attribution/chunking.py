"""Memory-bounded chunks of the stacked ``steps × examples`` batch: a token budget derived from a
memory budget, and length-ordered slices that each fit it."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from workbench.core.errors import WorkbenchError

DEFAULT_MEMORY_MIB = 1024


def bytes_per_token(
    model: PreTrainedModel, length: int, views: int = 1, create_graph: bool = False
) -> int:
    """Estimated autograd memory of one row×position cell: per layer ``20·d`` saved activations
    plus ``3·heads·L`` attention values, ×``(1 + (V−1)/10)`` for ``V`` batched vector-Jacobian
    products, or ×``3(1 + 0.4(V−1))`` when the graph is kept for a double backward; ×1.3 for
    allocator slack. Calibrated with ``ru_maxrss`` on MiniLM-L6 at 40 positions (one chunk:
    215 KiB per cell for one view; over many chunks of varying width the peak was 1.3× the
    single-chunk figure)."""
    config = model.config
    per_layer = 20 * config.hidden_size + 3 * config.num_attention_heads * length
    size = next(model.parameters()).element_size()
    factor = 3 * (1 + 0.4 * (views - 1)) if create_graph else 1 + 0.1 * (views - 1)
    return int(1.3 * size * config.num_hidden_layers * per_layer * factor)


def default_memory_mib(model: PreTrainedModel) -> float:
    """The budget when none is given: :data:`DEFAULT_MEMORY_MIB` on the CPU; on a GPU half the
    memory free on the model's device (at least the CPU's budget), since one-row chunks of a
    BERT-base double backward would leave a GPU idle between launches."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return DEFAULT_MEMORY_MIB
    free, _ = torch.cuda.mem_get_info(device)
    return max(free / 2 / 2**20, DEFAULT_MEMORY_MIB)


def batch_token_limit(
    model: PreTrainedModel,
    length: int,
    views: int,
    create_graph: bool,
    max_batch_tokens: int | None,
    memory_mib: float | None,
) -> int:
    """Row×position cells per chunk: ``max_batch_tokens`` if given, else what fits in
    ``memory_mib`` (default :func:`default_memory_mib`) by :func:`bytes_per_token`."""
    if max_batch_tokens is not None:
        if max_batch_tokens < 1:
            raise WorkbenchError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        return max_batch_tokens
    budget = (memory_mib or default_memory_mib(model)) * 2**20
    return max(1, int(budget // bytes_per_token(model, length, views, create_graph)))


def length_chunks(lengths: list[int], limit: int) -> list[slice]:
    """Consecutive slices of rows (``lengths`` ascending) whose ``rows × longest`` stays within
    ``limit`` cells (at least one row each)."""
    chunks, start = [], 0
    for end in range(1, len(lengths) + 1):
        if end < len(lengths) and (end + 1 - start) * lengths[end] <= limit:
            continue
        chunks.append(slice(start, end))
        start = end
    return chunks

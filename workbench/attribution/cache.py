"""A frozen teacher's attribution maps (AD-KD) and input gradients (GKD), computed once per
split and reused every epoch, on :func:`workbench.cache.cached`.

The cache key holds the model fingerprint, the caller's ``data_key`` (which split, tokenised how)
and every setting that changes the values, so a change of any of them computes a new file.
Maps are stored per token as ``[n, V]`` (real tokens only) and re-padded to any batch.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from torch import Tensor
from transformers import PreTrainedModel

from workbench.attribution.gradients import input_gradients
from workbench.attribution.settings import AttributionConfig, compute_maps
from workbench.cache import ExampleCache, cached
from workbench.data import EncodedSplit
from workbench.errors import WorkbenchError
from workbench.models import fingerprint

__all__ = ["cached_maps", "teacher_gradients_cache", "teacher_maps_cache"]


def _check_frozen(model: PreTrainedModel) -> None:
    if model.training:
        raise WorkbenchError(
            "the teacher is in training mode (dropout makes its maps random): call model.eval()"
        )


def _pad_id(model: PreTrainedModel, pad_token_id: int | None) -> int:
    return int(pad_token_id if pad_token_id is not None else model.config.pad_token_id or 0)


def teacher_maps_cache(
    model: PreTrainedModel,
    dataset: EncodedSplit,
    folder: str | Path,
    *,
    data_key: str,
    config: AttributionConfig | None = None,
    special_ids: Collection[int] | None = None,
    pad_token_id: int | None = None,
) -> ExampleCache:
    """The teacher's maps of every example of ``dataset`` under ``config`` (default: IG, 1 step,
    pad baseline, all views), loaded from ``folder`` or computed and saved there.

    ``views="gold"`` uses the dataset's labels. Read a batch's maps with :func:`cached_maps`.
    """
    config = config or AttributionConfig()
    _check_frozen(model)
    key = {
        "kind": "attribution-maps",
        "model": fingerprint(model),
        "data": data_key,
        **config.key(),
        "special_ids": sorted(special_ids) if special_ids else None,
    }

    def compute(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        maps, _ = compute_maps(model, batch, config, batch["labels"], special_ids)
        return {"maps": maps.transpose(1, 2)}

    return cached(
        Path(folder),
        "attribution-maps",
        key,
        dataset,
        compute,
        per_token=("maps",),
        batch_size=config.batch_size,
        pad_token_id=_pad_id(model, pad_token_id),
        description="teacher attribution maps",
    )


def cached_maps(cache: ExampleCache, index: Tensor, length: int) -> Tensor:
    """Maps of examples ``index`` ``[B]`` from :func:`teacher_maps_cache`, zero-padded to
    ``length`` positions → ``[B, V, L]``."""
    return cache.gather("maps", index, length).transpose(1, 2)


def teacher_gradients_cache(
    model: PreTrainedModel,
    dataset: EncodedSplit,
    folder: str | Path,
    *,
    data_key: str,
    batch_size: int = 32,
    memory_mib: float | None = None,
    pad_token_id: int | None = None,
) -> ExampleCache:
    """The teacher's GKD input gradients ``∂(Σ p_max)/∂E`` per token (field ``"gradients"``,
    ``[n, d]`` per example; ``cache.gather("gradients", index, length)`` → ``[B, L, d]``)."""
    _check_frozen(model)
    key = {"kind": "input-gradients", "model": fingerprint(model), "data": data_key}

    def compute(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"gradients": input_gradients(model, batch, memory_mib=memory_mib)}

    return cached(
        Path(folder),
        "input-gradients",
        key,
        dataset,
        compute,
        per_token=("gradients",),
        batch_size=batch_size,
        pad_token_id=_pad_id(model, pad_token_id),
        description="teacher gradients",
    )

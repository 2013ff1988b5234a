"""Any labelled data set of the hub, through ``datasets.load_dataset``, or one saved by
``save_to_disk``: its splits become a task as local files do (:func:`task_from_frames`)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from workbench.core.data.local import (
    DATASET_ROWS,
    DEFAULT_COLUMNS,
    Columns,
    check_table,
    task_from_frames,
)
from workbench.core.data.splits import TaskData
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.hub import hub_offline, hub_reachable, hub_unreachable

# a hub data set's name: ``name`` or ``owner/name``
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
HUB_OFFLINE_FIX = (
    "pass a local copy (CSV/TSV/JSONL/parquet files, or a folder written by datasets' "
    "save_to_disk), or set HF_HUB_OFFLINE=1 to read the hub's local cache"
)
# our split ← the data set's split names, first found wins
SPLIT_NAMES = {"train": ("train",), "dev": ("validation", "dev"), "test": ("test",)}


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub data set's name (``owner/name`` or ``name``)."""
    return HUB_ID.fullmatch(name) is not None


def task_from_dataset_dict(
    dataset_dict, name: str, source: str, seed: int, columns: Columns = DEFAULT_COLUMNS
) -> TaskData:
    """A task from a ``datasets.DatasetDict``: its ``train``, ``validation`` (or ``dev``) and
    ``test`` splits, the texts, labels and optionally second texts in the ``columns`` named.
    A ``ClassLabel`` label's names are the class names, in its order (other labels as in
    :func:`task_from_frames`); a split other than train whose labels are all missing (-1, as
    GLUE's hidden test labels) is not used, and is made from train instead, as a missing split
    is. What was done is in the task's notes."""
    import datasets

    chosen = {
        ours: next((theirs for theirs in names if theirs in dataset_dict), None)
        for ours, names in SPLIT_NAMES.items()
    }
    if chosen["train"] is None:
        raise WorkbenchError(f"{source}: no train split; found {list(dataset_dict)}")
    feature = dataset_dict[chosen["train"]].features.get(columns.label)
    classes = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    frames: dict[str, pd.DataFrame] = {}
    where: dict[str, str] = {}
    notes = []
    for ours, theirs in chosen.items():
        if theirs is None:
            continue
        where[ours] = f"{source} {theirs} split"
        frame = columns.select(dataset_dict[theirs].to_pandas(), where[ours])
        if classes is not None:  # a ClassLabel's -1 is no label
            frame["label"] = frame["label"].map(lambda v: classes[v] if v >= 0 else None)
        if ours != "train" and (frame["label"].isna().all() or (frame["label"] == -1).all()):
            notes.append(f"{name}: its {theirs} split has no labels: not used")
            continue
        frames[ours] = check_table(frame, where[ours], DATASET_ROWS)
    if unused := sorted(set(dataset_dict) - set(chosen.values())):
        notes.append(f"{name}: splits not used: {', '.join(unused)}")
    data = task_from_frames(name, frames, where, seed, source, classes, DATASET_ROWS)
    data.notes[:0] = notes
    return data


def load_hub(
    name: str, config: str | None, seed: int, columns: Columns = DEFAULT_COLUMNS
) -> TaskData:
    """The hub data set ``name`` (configuration ``config``) as a task
    (:func:`task_from_dataset_dict`); without the hub, one line saying how to do without."""
    import datasets

    what = f"hub data set {name!r}" + (f" ({config})" if config else "")
    if "/" in name:  # it could have been meant as a local folder
        what += " (no local file or folder of that name either)"
    loaded = hub_dataset(name, config, what)
    if not isinstance(loaded, datasets.DatasetDict):
        raise WorkbenchError(f"cannot load {what}: it has no splits")
    source = f"hub:{name}" + (f"/{config}" if config else "")
    return task_from_dataset_dict(loaded, name, source, seed, columns)


def hub_dataset(name: str, config: str | None, what: str):
    """``datasets.load_dataset(name, config)``; without the hub, or a data set it cannot load,
    one line naming ``what`` and saying how to do without."""
    import datasets

    if not hub_reachable() and not hub_offline():  # in offline mode it reads its cache
        raise hub_unreachable(what, HUB_OFFLINE_FIX)
    try:
        return datasets.load_dataset(name, config)
    except (OSError, ValueError) as error:  # not found, a missing config, offline mode's miss
        raise WorkbenchError(
            f"cannot load {what}: {first_line(error)}; {HUB_OFFLINE_FIX}"
        ) from None


def read_saved(path: Path, what: str):
    """The data set ``save_to_disk`` wrote in ``path``; one it cannot read is one line naming
    ``what``."""
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except (OSError, ValueError) as error:
        raise WorkbenchError(
            f"{what}: cannot read the saved data set: {first_line(error)}"
        ) from None


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``DatasetDict.save_to_disk``."""
    return (path / "dataset_dict.json").is_file()


def load_saved(path: Path, seed: int, columns: Columns = DEFAULT_COLUMNS) -> TaskData:
    """A data set saved by ``DatasetDict.save_to_disk`` as a task
    (:func:`task_from_dataset_dict`)."""
    loaded = read_saved(path, str(path))
    return task_from_dataset_dict(loaded, path.name, str(path), seed, columns)

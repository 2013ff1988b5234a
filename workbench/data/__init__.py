"""Tasks: the bundled offline sets, GLUE through ``datasets``, and local files.

Every task yields :class:`TaskData` — train/dev/test :class:`Split` lists of texts, optional second
texts, labels and stable example ids — which :func:`encode` tokenises (truncation counted) and
:func:`collate` pads per batch (dynamic padding).

Modules: :mod:`~workbench.data.splits` (the types, deterministic splits and samples),
:mod:`~workbench.data.bundled` (tweets, BBC News), :mod:`~workbench.data.glue` (hub parquet and
GLUE TSV layouts), :mod:`~workbench.data.local` (CSV/TSV/JSONL/parquet files, checked),
:mod:`~workbench.data.encoding` (tokenisation and padding). :func:`load_task` picks the source.
"""

from __future__ import annotations

from workbench.config import DataConfig
from workbench.data.bundled import load_bbc_news, load_tweets
from workbench.data.encoding import EncodedSplit, batches, collate, encode, pad_id, to_device
from workbench.data.glue import GLUE_TASKS, load_glue
from workbench.data.local import load_local
from workbench.data.splits import MIN_EXAMPLES, SPLITS, Split, TaskData, TaskSpec, sample_split
from workbench.errors import WorkbenchError
from workbench.files import local_path

BUNDLED = {"tweets": load_tweets, "bbc-news": load_bbc_news}


def task_names() -> list[str]:
    return [*BUNDLED, *GLUE_TASKS]


def load_task(config: DataConfig) -> TaskData:
    """The task a :class:`DataConfig` names, subsampled as it says."""
    name = config.task
    if name in BUNDLED:
        data = BUNDLED[name](config.split_seed)
    elif name in GLUE_TASKS:
        data = load_glue(name, config.split_seed, config.glue_dir)
    elif (path := local_path(name)) is not None:
        data = load_local(str(path), config.split_seed)
    else:
        raise WorkbenchError(
            f"unknown task {name!r}: use one of {', '.join(task_names())} or a path to a "
            "local CSV/TSV/JSONL/parquet file or directory"
        )
    limits = {"train": config.max_train_examples}
    limits |= {s: config.max_eval_examples for s in data.splits if s != "train"}
    for split_name, limit in limits.items():
        data.splits[split_name] = sample_split(
            data.splits[split_name], limit, config.split_seed, stratify=not data.spec.regression
        )
    sizes = {split: len(data.splits.get(split, ())) for split in SPLITS}
    short = [split for split, size in sizes.items() if size < MIN_EXAMPLES[split]]
    if short:
        needs = ", ".join(f"{split} {n}" for split, n in MIN_EXAMPLES.items())
        got = ", ".join(f"{split} {n}" for split, n in sizes.items())
        raise WorkbenchError(
            f"{data.source}: too few examples in {', '.join(short)} (each split needs at least: "
            f"{needs}; got {got}); a single file is split 80/10/10, so give it more rows or "
            "give dev and test files"
        )
    return data


__all__ = [
    "EncodedSplit",
    "Split",
    "TaskData",
    "TaskSpec",
    "batches",
    "collate",
    "encode",
    "load_glue",
    "load_local",
    "load_task",
    "pad_id",
    "sample_split",
    "task_names",
    "to_device",
]

"""Tasks: the bundled offline sets, GLUE through ``datasets``, local files and hub data sets.

Every task yields :class:`TaskData` — train/dev/test :class:`Split` lists of texts, optional second
texts, labels and stable example ids — which :func:`encode` tokenises (truncation counted) and
:func:`collate` pads per batch (dynamic padding).

Modules: :mod:`~workbench.core.data.splits` (the types, deterministic splits and samples),
:mod:`~workbench.core.data.bundled` (tweets, BBC News), :mod:`~workbench.core.data.glue` (hub
parquet and GLUE TSV layouts), :mod:`~workbench.core.data.local` (CSV/TSV/JSONL/parquet files,
checked), :mod:`~workbench.core.data.hub_sets` (any labelled hub data set, or one saved by
``save_to_disk``), :mod:`~workbench.core.data.encoding` (tokenisation and padding).
:func:`load_task` picks the source.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from workbench.core.config import DataConfig, option_name, set_settings
from workbench.core.data.bundled import TWEETS_VERSION, load_bbc_news, load_tweets
from workbench.core.data.glue import load_glue
from workbench.core.data.hub_sets import is_hub_id, is_saved_dataset, load_hub, load_saved
from workbench.core.data.local import Columns, load_local
from workbench.core.data.splits import (
    MIN_EXAMPLES,
    OVERLAP_RULE,
    SPLITS,
    Split,
    TaskData,
    TaskSpec,
    drop_train_repeats,
    sample_split,
    split_overlap,
)
from workbench.core.errors import WorkbenchError
from workbench.core.files import local_path
from workbench.core.lazy import lazy_names
from workbench.core.names import BUNDLED_TASKS, GLUE_TASKS, TASK_NAMES

# tokenisation and padding need torch and transformers: imported when first asked for, so that a
# data file is read and checked before they load (a bad column is found in a second)
ENCODING = (
    "EncodedSplit",
    "batches",
    "collate",
    "count_tokens",
    "encode",
    "pad_id",
    "prefixes",
    "share_words",
    "to_device",
    "tokenizer_kind",
)
__getattr__ = lazy_names(__name__, dict.fromkeys(ENCODING, "workbench.core.data.encoding"))

BUNDLED = dict(zip(BUNDLED_TASKS, (load_tweets, load_bbc_news), strict=True))
VERSIONS = {"tweets": TWEETS_VERSION}  # bundled sets whose cleaning changed since version 1


def data_version(task: str) -> str | None:
    """The data version of a bundled task whose cleaning changed (None for the others), known
    without loading it: what a record keyed by settings alone must include."""
    return VERSIONS.get(task)


def _columns(config: DataConfig) -> Columns:
    """The columns a :class:`DataConfig` names."""
    return Columns(config.text_column, config.text_pair_column, config.label_column)


def _check_options(config: DataConfig, hub: bool) -> None:
    """Refuse the data set options that the task does not take: the columns for the bundled
    and GLUE tasks, ``--task-config`` for all but hub data sets."""
    columns = ("task_config", "text_column", "text_pair_column", "label_column")
    given = [option_name(f) for f in set_settings(config) if f in columns]
    named = config.task in BUNDLED or config.task in GLUE_TASKS
    refused = given if named else [o for o in given if o == "--task-config" and not hub]
    if refused:
        kind = "hub data sets" if refused == ["--task-config"] else "local files and hub data sets"
        raise WorkbenchError(f"{', '.join(refused)}: only for {kind}, not for {config.task!r}")


def overlap_note(data: TaskData) -> str | None:
    """One line on the examples of dev and test that repeat a training example
    (:attr:`TaskData.overlap`), None when there are none."""
    counts = {pair: n for pair, n in data.overlap.items() if n}
    inflated = [
        (split, counts[f"train/{split}"]) for split in ("dev", "test") if f"train/{split}" in counts
    ]
    if not inflated:
        return None
    sizes = {split: len(data.splits[split]) for split, _ in inflated}
    shown = " and ".join(f"{n} of {sizes[split]} {split}" for split, n in inflated)
    names = " and ".join(split for split, _ in inflated)
    text = (
        f"{data.spec.name}: {shown} examples repeat a training example ({OVERLAP_RULE}): "
        f"scores on {names} are inflated by them ({option_name('dedupe')} drops them)"
    )
    if counts.get("dev/test"):
        text += f"; {counts['dev/test']} test examples also repeat a dev example"
    return text


def load_task(config: DataConfig, notify: Callable[[str], None] | None = None) -> TaskData:
    """The task a :class:`DataConfig` names, subsampled as it says: a bundled task, a GLUE
    task, a local file or folder, else a hub data set. Examples of dev and test that repeat a
    training example are counted (:attr:`TaskData.overlap`) and, with ``config.dedupe``,
    dropped from dev and test before their subsample; either is said once, in one line, to
    ``notify`` (default: standard error) and kept in the task's notes."""
    say = notify or (lambda text: print(f"note: {text}", file=sys.stderr))
    name = config.task
    path = None if name in BUNDLED or name in GLUE_TASKS else local_path(name, hub_ids=True)
    hub = path is None and name not in BUNDLED and name not in GLUE_TASKS
    _check_options(config, hub)
    if name in BUNDLED:
        data = BUNDLED[name](config.split_seed)
    elif name in GLUE_TASKS:
        data = load_glue(name, config.split_seed, config.glue_dir)
    elif path is not None and is_saved_dataset(path):
        data = load_saved(path, config.split_seed, _columns(config))
    elif path is not None:
        data = load_local(str(path), config.split_seed, _columns(config))
    elif is_hub_id(name):
        data = load_hub(name, config.task_config, config.split_seed, _columns(config))
    else:
        raise WorkbenchError(
            f"unknown task {name!r}: use one of {', '.join(TASK_NAMES)}, a path to a "
            "local CSV/TSV/JSONL/parquet file or directory, or a hub data set (owner/name)"
        )
    splits, stratify = data.splits, not data.spec.regression
    sample = functools.partial(sample_split, seed=config.split_seed, stratify=stratify)
    splits["train"] = sample(splits["train"], config.max_train_examples)
    if config.dedupe:  # against the training examples used, before dev and test are sampled
        data.deduped = drop_train_repeats(splits)
        shown = " and ".join(f"{n} {split}" for split, n in data.deduped.items())
        data.notes.append(
            f"{data.spec.name}: {option_name('dedupe')} dropped {shown} examples that repeat "
            f"a training example ({OVERLAP_RULE})"
        )
        say(data.notes[-1])
    for split in splits.keys() - {"train"}:  # values replaced: the order stays
        splits[split] = sample(splits[split], config.max_eval_examples)
    data.overlap = split_overlap(splits)
    if (note := overlap_note(data)) is not None:
        data.notes.append(note)
        say(note)
    sizes = {split: len(splits.get(split, ())) for split in SPLITS}
    if short := [split for split, size in sizes.items() if size < MIN_EXAMPLES[split]]:
        needs = ", ".join(f"{split} {n}" for split, n in MIN_EXAMPLES.items())
        got = ", ".join(f"{split} {n}" for split, n in sizes.items())
        after = f" after {option_name('dedupe')}" if config.dedupe else ""
        raise WorkbenchError(
            f"{data.source}: too few examples in {', '.join(short)}{after} (each split needs "
            f"at least: {needs}; got {got}); a single file is split 80/10/10, so give it more "
            "rows or give dev and test files"
        )
    return data


__all__ = [
    *ENCODING,
    "Split",
    "TaskData",
    "TaskSpec",
    "data_version",
    "load_glue",
    "load_hub",
    "load_local",
    "load_task",
    "overlap_note",
    "sample_split",
]

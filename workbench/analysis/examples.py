"""The examples that heatmaps and attributions explain: :class:`Example`, a text with an
optional second text and gold label, taken from a split of a run's task
(:func:`split_examples`, chosen by :func:`parse_indices`) or read from an uploaded CSV or JSONL
file (:func:`read_examples`, checked for type, size, encoding and content);
:func:`gather_examples` collects typed texts, a file and a split's examples for ``kdw export``
and ``kdw attribute``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.core.errors import WorkbenchError
from workbench.core.files import parse_json_lines, read_limited

if TYPE_CHECKING:
    from workbench.core.data import Split, TaskSpec
    from workbench.core.models import LoadedModel

UPLOAD_SUFFIXES = (".csv", ".jsonl")
MAX_UPLOAD_BYTES = 2_000_000
MAX_UPLOAD_EXAMPLES = 1000


@dataclass(frozen=True)
class Example:
    """A text to explain, with an optional second text (pair tasks) and gold label (a class
    name or index)."""

    text: str
    pair: str | None = None
    label: str | int | None = None
    uid: str = ""


# --------------------------------------------------------------------------- splits


def split_examples(split: Split, spec: TaskSpec) -> list[Example]:
    """A split's examples with their gold labels as class names."""
    names, pairs = spec.label_names, split.pairs or [None] * len(split.texts)
    return [
        Example(text, pair, names[int(label)] if names else label, uid)
        for text, pair, label, uid in zip(split.texts, pairs, split.labels, split.uids, strict=True)
    ]


def parse_indices(text: str, size: int, limit: int = MAX_UPLOAD_EXAMPLES) -> list[int]:
    """``"0,3,7-9"`` → ``[0, 3, 7, 8, 9]``, each checked against ``size`` examples, at most
    ``limit`` in all (as many as a file of texts may hold); every range is checked before its
    indices are listed, so that no range, however large, is ever materialised."""
    indices: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        if not re.fullmatch(r"[0-9]+", first) or (last and not re.fullmatch(r"[0-9]+", last)):
            raise WorkbenchError(f"examples {text!r}: use indices such as 0,3,7-9")
        low, high = int(first[:19]), int((last or first)[:19])  # 19 digits: already too many
        if high >= size or max(len(first), len(last)) > 19:
            raise WorkbenchError(f"examples {text!r}: the split has examples 0..{size - 1}")
        if low > high:
            raise WorkbenchError(f"examples {text!r}: range {part} runs backwards")
        if len(indices) + high - low + 1 > limit:
            raise WorkbenchError(
                f"examples {text!r}: more than {limit} examples; choose at most {limit} at once"
            )
        indices.extend(range(low, high + 1))
    if not indices:
        raise WorkbenchError(f"examples {text!r}: the split has examples 0..{size - 1}")
    return indices


def gather_examples(
    loaded: LoadedModel,
    verb: str,
    *,
    texts: Sequence[str] = (),
    pair: str | None = None,
    texts_file: str | Path | None = None,
    split: str | None = None,
    indices: str = "0",
) -> list[Example]:
    """Typed texts, a CSV/JSONL file of texts, and examples of a split of ``loaded``'s task
    (``verb``: what the command does with them, for its error message)."""
    from workbench.core.data import load_task

    examples = [Example(text, pair) for text in texts]
    if texts_file is not None:
        path = Path(texts_file)
        if not path.exists():
            raise WorkbenchError(f"{path} does not exist")
        # the size checked before anything is read; a pipe or a device refused unopened
        examples += read_examples(read_limited(path, MAX_UPLOAD_BYTES, "--texts-file"), path.name)
    if split is not None:
        if loaded.data is None:
            raise WorkbenchError(
                f"{loaded.source} is not a run folder, so it has no task whose --split to "
                "take: give --text or --texts-file"
            )
        data = load_task(loaded.data)
        if split not in data.splits:
            raise WorkbenchError(f"no split {split!r}: the task has {sorted(data.splits)}")
        chosen = split_examples(data.splits[split], loaded.spec)
        examples += [chosen[i] for i in parse_indices(indices, len(chosen))]
    if not examples:
        raise WorkbenchError(f"nothing to {verb}: give --text, --texts-file or --split")
    return examples


# --------------------------------------------------------------------------- input files


def _check_upload(data: bytes, filename: str, max_bytes: int) -> str:
    suffix = Path(filename).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES:
        raise WorkbenchError(
            f"{filename}: unsupported file type; upload {' or '.join(UPLOAD_SUFFIXES)}"
        )
    if len(data) > max_bytes:
        raise WorkbenchError(f"{filename} is {len(data):,} bytes: the limit is {max_bytes:,} bytes")
    if b"\x00" in data:
        raise WorkbenchError(f"{filename} is not a text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise WorkbenchError(f"{filename} is not UTF-8 text ({error.reason})") from None


def _records(text: str, filename: str) -> list[dict]:
    if filename.lower().endswith(".csv"):
        try:
            return [dict(row) for row in csv.DictReader(io.StringIO(text))]
        except csv.Error as error:
            raise WorkbenchError(f"{filename}: not a valid CSV file ({error})") from None
    records = parse_json_lines(text, filename)
    for number, record in records:
        if not isinstance(record, dict):
            raise WorkbenchError(f"{filename}, line {number}: expected an object with a text")
    return [record for _, record in records]


def read_examples(
    data: bytes,
    filename: str,
    max_bytes: int = MAX_UPLOAD_BYTES,
    max_examples: int = MAX_UPLOAD_EXAMPLES,
) -> list[Example]:
    """Examples from an uploaded CSV (header with ``text``, optional ``text_pair`` and
    ``label``) or JSONL file (one object per line with the same keys), checked for type, size,
    encoding and content."""
    records = _records(_check_upload(data, filename, max_bytes), filename)
    if not records:
        raise WorkbenchError(f"{filename} holds no examples")
    if len(records) > max_examples:
        raise WorkbenchError(
            f"{filename} holds {len(records)} examples: the limit is {max_examples}"
        )
    examples = []
    for number, record in enumerate(records, 1):
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            raise WorkbenchError(f"{filename} example {number}: no 'text' (a non-empty string)")
        pair = record.get("text_pair")
        label = record.get("label")
        examples.append(
            Example(
                text=text.strip(),
                pair=str(pair).strip() if pair not in (None, "") else None,
                label=label if label not in (None, "") else None,
                uid=f"{Path(filename).name}:{number}",
            )
        )
    return examples

"""Per-example tensors that a frozen model computes once: teacher logits, [CLS] states,
attribution maps, input gradients.

A cache lives in a folder (a run's ``teacher_cache/``) as one safetensors file per *key* — a dict
of everything that changes the values (model fingerprint, data fingerprint, settings). Per-token
fields are stored unpadded (concatenated, with offsets) so that :meth:`ExampleCache.gather`
re-pads them to whatever batch they are asked for: values do not depend on the padding of the
batch in which they were computed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from workbench.core.data import EncodedSplit, collate, to_device
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import atomic_path, regular_file
from workbench.core.shards import Shard

BatchFunction = Callable[[dict[str, Tensor]], dict[str, Tensor]]
Progress = Callable[[str, int, int], None]  # (description, examples done, examples in all)
Rows = dict[str, list[tuple[int, Tensor]]]  # field → (example index, value) of computed examples


def key_digest(key: Mapping) -> str:
    """A stable short hash of a JSON-serialisable key."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(eq=False)
class ExampleCache:
    """Fields of every example of one split, keyed by what produced them.

    ``per_example[name]``: ``[N, ...]``; ``per_token[name]``: values ``[T, ...]`` with
    ``offsets[name]`` ``[N + 1]`` so example ``i`` owns rows ``offsets[i]:offsets[i + 1]``.
    """

    per_example: dict[str, Tensor]
    per_token: dict[str, Tensor]
    offsets: Tensor

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def example(self, name: str, index: int) -> Tensor:
        """One example's field, unpadded."""
        if name in self.per_example:
            return self.per_example[name][index]
        return self.per_token[name][self.offsets[index] : self.offsets[index + 1]]

    def gather(self, name: str, index: Tensor, length: int | None = None) -> Tensor:
        """Field ``name`` of examples ``index`` ``[B]``; per-token fields zero-padded to
        ``length`` positions → ``[B, length, ...]``."""
        if name in self.per_example:
            return self.per_example[name][index]
        rows = [self.example(name, int(i)) for i in index]
        length = length or max(len(r) for r in rows)
        values = self.per_token[name]
        out = values.new_zeros((len(rows), length, *values.shape[1:]))
        for b, row in enumerate(rows):
            out[b, : len(row)] = row
        return out

    @classmethod
    def compute(
        cls,
        dataset: EncodedSplit,
        compute_batch: BatchFunction,
        per_token: Iterable[str] = (),
        batch_size: int = 64,
        pad_token_id: int = 0,
        description: str = "teacher cache",
        device: torch.device | str = "cpu",
        on_progress: Progress | None = None,
        part: tuple[int, int] = (0, 1),
        gather: Callable[[Rows], list[Rows]] | None = None,
        inference: bool = False,
        on_note: Callable[[str], None] | None = None,
    ) -> ExampleCache:
        """Run ``compute_batch`` over ``dataset`` in length order on ``device`` and collect its
        fields on the CPU (``per_token`` ones ``[B, L, ...]``, kept for real tokens only); progress
        goes to a tqdm bar and ``on_progress(description, done, total)``.

        Batches run under ``no_grad``, or in inference mode with ``inference``. A batch that runs
        out of memory is halved (down to one example, said to ``on_note``) for the rest: the values
        do not depend on the size. ``part=(i, n)``: only every ``n``-th example of the length order
        from the ``i``-th; ``gather`` then returns every part's rows
        (:func:`kd.training.distributed.gather_objects`)."""
        order = length_order(dataset)[part[0] :: part[1]]
        bar = tqdm(total=len(order), desc=description, unit="ex", leave=False)

        def advanced(count: int) -> None:
            bar.update(count)
            if on_progress is not None:
                on_progress(description, bar.n, len(order))

        def halved(size: int) -> None:
            if on_note is not None:
                on_note(f"{description}: out of memory, batches of {size} from here")

        options = (per_token, batch_size, pad_token_id, device, inference, advanced, halved)
        collected = compute_rows(dataset, order, compute_batch, *options)
        bar.close()
        return cls.from_rows(gather(collected) if gather else [collected], dataset, per_token)

    @classmethod
    def from_rows(
        cls, parts: Iterable[Rows], dataset: EncodedSplit, per_token: Iterable[str] = ()
    ) -> ExampleCache:
        """The cache of every example of ``dataset`` from the rows that parts of it computed
        (each example's in exactly one part), in example order whatever the parts' order."""
        parts, token_fields = list(parts), set(per_token)
        lengths = torch.tensor([len(ids) for ids in dataset.input_ids])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        per_example, token_values = {}, {}
        for name in dict.fromkeys(name for rows in parts for name in rows):
            items = [item for rows in parts for item in rows.get(name, [])]
            ordered = [value for _, value in sorted(items, key=lambda item: item[0])]
            target = token_values if name in token_fields else per_example
            target[name] = torch.cat(ordered) if name in token_fields else torch.stack(ordered)
        return cls(per_example, token_values, offsets)

    def save(self, path: Path, key: Mapping) -> None:
        """Write atomically (:func:`~workbench.core.files.atomic_path`), the key alongside."""
        tensors = {f"example.{k}": v.contiguous() for k, v in self.per_example.items()}
        tensors |= {f"token.{k}": v.contiguous() for k, v in self.per_token.items()}
        tensors["offsets"] = self.offsets
        metadata = {"key": json.dumps(key, sort_keys=True, default=str)}
        with atomic_path(path) as temporary:
            save_file(tensors, str(temporary), metadata=metadata)

    @classmethod
    def load(cls, path: Path, examples: int | None = None) -> ExampleCache:
        """The cache :meth:`save` wrote to ``path``, checked: a damaged file (truncated,
        overwritten) or one whose tensors do not fit together or cover another number of
        ``examples`` than the split's is a one-line error naming it."""
        from safetensors import SafetensorError

        regular_file(path, "the cache file", CACHE_REMEDY)  # a pipe would block the reader
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as error:
            raise WorkbenchError(
                f"{path} is damaged ({first_line(error)}): {CACHE_REMEDY}"
            ) from None
        fields: dict[str, dict[str, Tensor]] = {"example": {}, "token": {}}
        for name, value in tensors.items():
            kind, _, field = name.partition(".")
            if kind in fields and field:
                fields[kind][field] = value
        problem = _cache_problem(tensors, fields, examples)
        if problem:
            raise WorkbenchError(f"{path} is not a cache of this split ({problem}): {CACHE_REMEDY}")
        bad = [
            name
            for name, value in tensors.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())
        ]
        if bad:  # a term computed from them would stop the training as if it diverged
            raise WorkbenchError(
                f"{path} holds NaN or infinite values ({', '.join(sorted(bad))}): {CACHE_REMEDY}"
            )
        return cls(fields["example"], fields["token"], tensors["offsets"])


def length_order(dataset: EncodedSplit) -> list[int]:
    """The examples' indices by token count (stable): the order caches compute them in, so that
    a batch pads little."""
    return sorted(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))


def compute_rows(
    dataset: EncodedSplit,
    order: Sequence[int],
    compute_batch: BatchFunction,
    per_token: Iterable[str],
    batch_size: int,
    pad_token_id: int,
    device: torch.device | str,
    inference: bool,
    on_batch: Callable[[int], None] | None = None,
    on_halved: Callable[[int], None] | None = None,
) -> Rows:
    """``compute_batch``'s fields of the examples ``order`` names, in batches of ``batch_size``
    consecutive ones (halved on running out of memory: ``on_halved`` hears the new size), each
    value on the CPU: per-token fields (``per_token``, ``[B, L, ...]``) for real tokens only.
    ``on_batch`` hears how many examples each batch computed."""
    token_fields = set(per_token)
    collected: Rows = {}
    mode = torch.inference_mode if inference else torch.no_grad
    done = 0
    while done < len(order):
        chunk = order[done : done + batch_size]
        batch = collate([dataset[i] for i in chunk], pad_token_id)
        try:
            with mode():
                values = compute_batch(to_device(batch, device))
        except torch.OutOfMemoryError:
            if batch_size == 1:
                raise
            batch_size //= 2
            if on_halved is not None:
                on_halved(batch_size)
            continue
        lengths = batch["attention_mask"].sum(1).tolist()
        for name, tensor in values.items():
            tensor = tensor.detach().cpu()
            for row, (i, n) in enumerate(zip(chunk, lengths, strict=True)):
                value = tensor[row, :n] if name in token_fields else tensor[row]
                # a clone outside inference mode: a plain tensor, usable in a loss
                collected.setdefault(name, []).append((i, value.clone()))
        done += len(chunk)
        if on_batch is not None:
            on_batch(len(chunk))
    return collected


CACHE_REMEDY = "delete it: what it holds is computed again"


def _cache_problem(
    tensors: dict[str, Tensor], fields: dict[str, dict[str, Tensor]], examples: int | None
) -> str | None:
    """Why a cache file's tensors cannot be the cache of a split of ``examples`` examples: no
    offsets, offsets that do not grow from 0, fields of another length; None when they fit."""
    offsets = tensors.get("offsets")
    if offsets is None or offsets.ndim != 1 or len(offsets) == 0 or offsets.is_floating_point():
        return "no offsets of its examples"
    if int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()):
        return "its offsets do not grow from 0"
    count, tokens = len(offsets) - 1, int(offsets[-1])
    if examples is not None and count != examples:
        return f"it holds {count} examples, the split {examples}"
    for kind, size in (("example", count), ("token", tokens)):
        for name, value in fields[kind].items():
            if value.ndim == 0 or len(value) != size:
                return f"{kind}.{name} has {len(value) if value.ndim else 0} rows, not {size}"
    return None


def cache_path(folder: Path, name: str, key: Mapping) -> Path:
    """Where :func:`cached` keeps the values of ``key``."""
    return Path(folder) / f"{name}-{key_digest(key)}.safetensors"


def cached(
    folder: Path,
    name: str,
    key: Mapping,
    dataset: EncodedSplit,
    compute_batch: BatchFunction,
    save: bool = True,
    **compute_options,
) -> ExampleCache:
    """Load the cache ``folder/name-<digest of key>.safetensors``, or compute it (options of
    :meth:`ExampleCache.compute`) and save it unless ``save`` is false (another process saves it);
    another ``key`` is another file, so stale values are never reused."""
    path = cache_path(folder, name, key)
    if path.exists():
        return ExampleCache.load(path, len(dataset))
    cache = ExampleCache.compute(dataset, compute_batch, **compute_options)
    if save:
        cache.save(path, key)
    return cache


PIECE_BATCHES = 8  # batches a piece holds: what a shard computes and a resumed build skips


def _save_piece(path: Path, rows: Rows, per_token: set[str], seconds: dict[str, float]) -> None:
    """One piece's rows: each field's values in the order of ``index`` (per-token ones
    concatenated, with their ``lengths``), and the seconds each field took."""
    tensors: dict[str, Tensor] = {}
    for name, items in rows.items():
        values = [value for _, value in items]
        tensors["index"] = torch.tensor([i for i, _ in items])
        if name in per_token:
            tensors[f"token.{name}"] = torch.cat(values).contiguous()
            tensors["lengths"] = torch.tensor([len(v) for v in values])
        else:
            tensors[f"example.{name}"] = torch.stack(values).contiguous()
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary), metadata={"seconds": json.dumps(seconds)})


def _load_piece(path: Path) -> tuple[Rows, dict[str, float]]:
    """The rows and field seconds :func:`_save_piece` wrote; a damaged piece is one line."""
    from safetensors import SafetensorError, safe_open

    regular_file(path, "the cache piece", "delete it, and it is computed again")
    try:
        with safe_open(str(path), "pt") as file:
            seconds = json.loads((file.metadata() or {}).get("seconds", "{}"))
        tensors = load_file(str(path))
        index = tensors["index"].tolist()
        rows: Rows = {}
        for name, value in tensors.items():
            kind, _, field = name.partition(".")
            if kind in ("example", "token"):  # per-token values split by their lengths
                values = value if kind == "example" else value.split(tensors["lengths"].tolist())
                rows[field] = list(zip(index, values, strict=True))
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as error:
        raise WorkbenchError(
            f"{path} is damaged ({first_line(error)}): delete it, and it is computed again"
        ) from None
    return rows, seconds


def build_in_pieces(
    folder: Path,
    name: str,
    key: Mapping,
    dataset: EncodedSplit,
    compute_fields: Callable[[dict[str, Tensor], dict[str, float]], dict[str, Tensor]],
    per_token: Iterable[str],
    batch_size: int,
    pad_token_id: int,
    device: torch.device | str,
    inference: bool,
    shard: Shard | None = None,
    description: str = "teacher cache",
) -> tuple[ExampleCache | None, dict[str, float]]:
    """The cache :func:`cached` keeps for ``key``, built resumably in pieces of
    :data:`PIECE_BATCHES` batches of :func:`length_order` (each saved once computed; a rerun
    computes only those it lacks), ``shard``'s of them (all without one) by this call, so that the
    cache equals one computed whole. ``compute_fields(batch, seconds)`` returns a batch's fields and
    adds each field's seconds. Returns the cache once every piece exists (merged, the pieces
    removed; None while other shards' pieces are missing) and each field's seconds summed over the
    pieces."""
    path = cache_path(folder, name, key)
    pieces_dir = path.with_suffix(".pieces")
    order, size = length_order(dataset), batch_size * PIECE_BATCHES
    pieces = [order[start : start + size] for start in range(0, len(order), size)]
    mine = (shard or Shard(1, 1)).positions(len(pieces))
    paths = [pieces_dir / f"piece-{j:05d}.safetensors" for j in range(len(pieces))]
    bar = tqdm(
        total=sum(len(pieces[j]) for j in mine),
        initial=sum(len(pieces[j]) for j in mine if paths[j].exists()),
        desc=description,
        unit="ex",
    )
    token_fields = set(per_token)
    options = (token_fields, batch_size, pad_token_id, device, inference, bar.update)
    for j in mine:
        if paths[j].exists():
            continue
        seconds: dict[str, float] = {}
        rows = compute_rows(dataset, pieces[j], partial(compute_fields, seconds=seconds), *options)
        _save_piece(paths[j], rows, token_fields, seconds)
    bar.close()
    if not all(p.exists() for p in paths):
        return None, {}
    loaded = [_load_piece(p) for p in paths]
    named = dict.fromkeys(field for _, seconds in loaded for field in seconds)
    totals = {field: sum(seconds.get(field, 0.0) for _, seconds in loaded) for field in named}
    cache = ExampleCache.from_rows([rows for rows, _ in loaded], dataset, token_fields)
    cache.save(path, key)
    shutil.rmtree(pieces_dir, ignore_errors=True)
    return cache, totals

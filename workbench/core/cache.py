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
    def load(cls, path: Path, layout: Layout | None = None) -> ExampleCache:
        """The cache :meth:`save` wrote to ``path``, checked against ``layout`` (None: only that
        its tensors fit together): a damaged file (truncated, overwritten) or one that is not the
        cache of the split ``layout`` describes is a one-line error naming it."""
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
        problem = _cache_problem(tensors, fields, layout)
        if problem:
            raise WorkbenchError(f"{path} is not a cache of this split ({problem}): {CACHE_REMEDY}")
        if bad := _not_finite(tensors):  # a term would stop the training as if it diverged
            raise WorkbenchError(f"{path} holds NaN or infinite values ({bad}): {CACHE_REMEDY}")
        return cls(fields["example"], fields["token"], tensors["offsets"])


@dataclass(frozen=True)
class Layout:
    """What the cache of one split must hold: ``lengths``, each example's token count (None:
    only their number, ``examples``, is known), the ``fields`` (empty: any), which of them are
    ``per_token``, and the classes of its ``logits`` (None: not known)."""

    examples: int
    lengths: tuple[int, ...] | None = None
    fields: tuple[str, ...] = ()
    per_token: tuple[str, ...] = ()
    classes: int | None = None

    @classmethod
    def of(
        cls,
        dataset: EncodedSplit,
        fields: Iterable[str] = (),
        per_token: Iterable[str] = (),
        classes: int | None = None,
    ) -> Layout:
        """The layout of ``dataset``'s cache of ``fields``."""
        lengths = tuple(len(ids) for ids in dataset.input_ids)
        return cls(len(lengths), lengths, tuple(fields), tuple(per_token), classes)


def _not_finite(tensors: Mapping[str, Tensor]) -> str:
    """The names of ``tensors`` that hold NaN or infinite values, joined ("" when none)."""
    return ", ".join(
        sorted(
            name
            for name, value in tensors.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())
        )
    )


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
    tensors: dict[str, Tensor], fields: dict[str, dict[str, Tensor]], layout: Layout | None
) -> str | None:
    """Why a cache file's tensors cannot be the cache of the split ``layout`` describes: no
    offsets, offsets that do not grow from 0 or are not the split's token counts, fields missing,
    of another kind, dtype or length, logits of another class count; None when they fit."""
    offsets = tensors.get("offsets")
    if offsets is None or offsets.ndim != 1 or len(offsets) == 0 or offsets.is_floating_point():
        return "no offsets of its examples"
    if int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()):
        return "its offsets do not grow from 0"
    count, tokens = len(offsets) - 1, int(offsets[-1])
    if layout is not None and count != layout.examples:
        return f"it holds {count} examples, the split {layout.examples}"
    lengths = layout.lengths if layout is not None else None
    if lengths is not None and offsets.diff().tolist() != list(lengths):
        return "its examples' token counts are not the split's"
    for kind, size in (("example", count), ("token", tokens)):
        for name, value in fields[kind].items():
            if value.ndim == 0 or len(value) != size:
                return f"{kind}.{name} has {len(value) if value.ndim else 0} rows, not {size}"
    return _fields_problem(fields, layout)


def _fields_problem(fields: dict[str, dict[str, Tensor]], layout: Layout | None) -> str | None:
    """Why a cache's (or a piece's) ``fields`` by kind (``example``, ``token``) are not those
    ``layout`` asks for: a field of another dtype than floating point (a header may call float
    values integers), missing, stored per example where it is per token or the reverse, logits
    of another class count; None when they fit."""
    for kind, named in fields.items():
        for name, value in named.items():
            if not value.is_floating_point():
                return f"{kind}.{name} is {str(value.dtype).removeprefix('torch.')}, not float"
    if layout is None:
        return None
    for name in layout.fields:
        kind = "token" if name in layout.per_token else "example"
        if name not in fields[kind]:
            return f"it holds no {kind}.{name}"
    logits, classes = fields["example"].get("logits"), layout.classes
    if classes is not None and logits is not None and logits.shape[1:] != (classes,):
        return f"its logits are {list(logits.shape)}, not [{len(logits)}, {classes}]: one a class"
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
        return ExampleCache.load(path, Layout.of(dataset))
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


PIECE_REMEDY = "delete it, and it is computed again"


def _load_piece(path: Path, examples: Sequence[int], layout: Layout) -> tuple[Rows, dict]:
    """The rows and field seconds :func:`_save_piece` wrote, checked to be those of the split's
    ``examples`` (its indices, in any order, each once) that ``layout`` describes: each field
    there, floating point, finite and of one row per example (per token: the example's tokens);
    a damaged or foreign piece is one line naming it."""
    from safetensors import SafetensorError, safe_open

    regular_file(path, "the cache piece", PIECE_REMEDY)
    try:
        with safe_open(str(path), "pt") as file:
            seconds = json.loads((file.metadata() or {}).get("seconds", "{}"))
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise WorkbenchError(f"{path} is damaged ({first_line(error)}): {PIECE_REMEDY}") from None
    problem = _piece_problem(tensors, examples, layout)
    if problem is None and (bad := _not_finite(tensors)):
        problem = f"NaN or infinite values in {bad}"
    if problem is None and not (
        isinstance(seconds, dict) and all(isinstance(v, int | float) for v in seconds.values())
    ):
        problem = "its seconds are not a number per field"
    if problem is not None:
        raise WorkbenchError(f"{path} is not a piece of this cache ({problem}): {PIECE_REMEDY}")
    index, rows = tensors["index"].tolist(), {}
    for name, value in tensors.items():
        kind, _, field = name.partition(".")
        if kind in ("example", "token"):  # per-token values split by their lengths
            values = value if kind == "example" else value.split(tensors["lengths"].tolist())
            rows[field] = list(zip(index, values, strict=True))
    return rows, seconds


def _piece_problem(
    tensors: dict[str, Tensor], examples: Sequence[int], layout: Layout
) -> str | None:
    """Why a piece's ``tensors`` are not the fields of ``examples`` (indices into the split
    ``layout`` describes); None when they are."""
    index = tensors.get("index")
    if index is None or index.ndim != 1 or index.is_floating_point():
        return "no index of its examples"
    if sorted(index.tolist()) != sorted(examples):
        return f"its index names other examples than the {len(examples)} it is for"
    fields: dict[str, dict[str, Tensor]] = {"example": {}, "token": {}}
    for name, value in tensors.items():
        kind, _, field = name.partition(".")
        if kind in fields and field:
            fields[kind][field] = value
    wanted = [layout.lengths[i] for i in index.tolist()] if layout.lengths else []
    if fields["token"]:
        lengths = tensors.get("lengths")
        if lengths is None or lengths.is_floating_point() or lengths.tolist() != wanted:
            return "its lengths are not its examples' token counts"
    for kind, size in (("example", len(index)), ("token", sum(wanted))):
        for name, value in fields[kind].items():
            if value.ndim == 0 or len(value) != size:
                return f"{kind}.{name} has {len(value) if value.ndim else 0} rows, not {size}"
    return _fields_problem(fields, layout)


def build_in_pieces(
    folder: Path,
    name: str,
    key: Mapping,
    dataset: EncodedSplit,
    compute_fields: Callable[[dict[str, Tensor], dict[str, float]], dict[str, Tensor]],
    layout: Layout,
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
    adds each field's seconds; ``layout`` (:meth:`Layout.of` ``dataset``) says which fields and
    classes. Returns the cache once every piece exists (each checked against ``layout``, then
    merged and the pieces removed; None while other shards' pieces are missing) and each field's
    seconds summed over the pieces. A piece that is not what it should be (copied from another
    cache, damaged) is refused in one line naming it, before anything is merged or removed."""
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
    token_fields = set(layout.per_token)
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
    loaded, refused = [], []
    for j, piece in enumerate(paths):
        try:
            loaded.append(_load_piece(piece, pieces[j], layout))
        except WorkbenchError as error:
            refused.append(str(error))
    if refused:  # every piece kept: the good ones merge once the bad ones are computed again
        more = f" ({len(refused) - 1} more pieces refused)" if len(refused) > 1 else ""
        raise WorkbenchError(f"{refused[0]}{more}")
    named = dict.fromkeys(field for _, seconds in loaded for field in seconds)
    totals = {field: sum(seconds.get(field, 0.0) for _, seconds in loaded) for field in named}
    cache = ExampleCache.from_rows([rows for rows, _ in loaded], dataset, token_fields)
    cache.save(path, key)
    shutil.rmtree(pieces_dir, ignore_errors=True)
    return cache, totals

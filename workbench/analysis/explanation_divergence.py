"""Where a student's explanations diverge from its teacher's, over a split (no Streamlit here;
the app's page: docs/app.md).

For a teacher and its students on a fixed stratified sample, each model's logits, attribution map
of every class and AOPC of its own prediction's map are computed once and cached in its run
folder (``analysis_cache/``, keyed by weights, examples, settings and explainer). From them:
:attr:`Divergence.occurrences` (a row per word occurrence, every model's attribution),
:func:`word_table` (per word type, teacher against student) and :attr:`Divergence.examples`
(predictions, AOPC and each student's attribution gap). Students of another tokenizer are
compared on the words all tokenisations share (:mod:`workbench.core.data.alignment`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from workbench.analysis.agreement import attribution_gap
from workbench.analysis.attribution import (
    AttributionSettings,
    ExplainerChoice,
    compute_maps,
)
from workbench.analysis.faithfulness import aopc
from workbench.analysis.settings import DivergenceSettings
from workbench.core.cache import ExampleCache, cache_path, cached, key_digest
from workbench.core.cache import Progress as CacheProgress
from workbench.core.data import EncodedSplit, Split, encode, pad_id, sample_split
from workbench.core.data.alignment import Alignment, align, pool_words, word_maps
from workbench.core.data.encoding import token_spans_of
from workbench.core.errors import WorkbenchError
from workbench.core.models import LoadedModel, fingerprint, forward
from workbench.core.runs import Run
from workbench.export import merge_wordpieces

Progress = Callable[[float, str], None]  # (fraction done in [0, 1], what is being done)
TEACHER = "teacher"
RESERVED = (TEACHER, "example", "word", "class", "count", "difference")

__all__ = ["Divergence", "Progress", "divergence", "word_table"]


@dataclass
class Divergence:
    """What :func:`divergence` found: ``occurrences`` (a row per word occurrence: ``example``,
    ``word``, ``class`` (gold), then ``teacher`` and each student's attribution), ``examples``
    (a row per example: ``text``, ``pair``, ``label``, ``uid``, then per model
    ``<model> prediction``, ``<model> comprehensiveness``, ``<model> sufficiency`` and per
    student ``<student> gap``), the models' names, the settings, the explainer that made the
    maps (with its settings), which models were computed rather than read from their cache, and
    how many examples were truncated."""

    teacher: str
    students: list[str]
    occurrences: pd.DataFrame
    examples: pd.DataFrame
    settings: DivergenceSettings
    explainer: ExplainerChoice
    computed: list[str]
    truncated: int  # examples cut at the teacher's max_length (by the tokenisation that cuts most)

    def models(self) -> list[str]:
        """``teacher`` and the students' names, the columns of :attr:`occurrences`."""
        return [TEACHER, *self.students]


def _check(teacher: LoadedModel, students: Sequence[LoadedModel], part: Split) -> None:
    if not students:
        raise WorkbenchError("choose at least one student to compare with the teacher")
    if teacher.spec.regression:
        raise WorkbenchError("the divergence view needs a classification task (AOPC, classes)")
    if len(part) < 2:
        raise WorkbenchError(
            f"the split has {len(part)} example(s): the divergence view needs at least 2"
        )
    names = [s.name for s in students]
    clash = sorted({n for n in names if n in RESERVED or names.count(n) > 1})
    if clash:
        raise WorkbenchError(f"student names {clash} are reserved or repeated: rename the runs")
    for student in students:
        if student.spec.label_names != teacher.spec.label_names:
            raise WorkbenchError(
                f"{student.name} has the classes {list(student.spec.label_names)}, the "
                f"teacher {list(teacher.spec.label_names)}: choose students of the same task"
            )


def _encoded(
    teacher: LoadedModel, students: Sequence[LoadedModel], part: Split
) -> tuple[list[EncodedSplit], list[Alignment] | None]:
    """The sample as each model tokenises it (at the teacher's length), and, where a student
    reads other tokens than the teacher, the words all the tokenisations share (each model's
    ``word_ids`` set); None when every model reads the teacher's tokens."""
    models = [teacher, *students]
    datasets = [encode(part, m.tokenizer, teacher.max_length) for m in models]
    if all(d.input_ids == datasets[0].input_ids for d in datasets[1:]):
        return datasets, None
    spans = [token_spans_of(part, m.tokenizer, teacher.max_length) for m in models]
    alignments = [align(*sides) for sides in zip(*spans, strict=True)]
    for k, dataset in enumerate(datasets):
        dataset.word_ids = [a.sides[k] for a in alignments]
    return datasets, alignments


def _outputs(
    loaded: LoadedModel,
    dataset: EncodedSplit,
    settings: DivergenceSettings,
    explainer: ExplainerChoice,
    progress: CacheProgress,
) -> tuple[ExampleCache, bool]:
    """A model's logits ``[N, C]``, maps (per token ``[n, C]``) and AOPC values ``[N]``, from
    its ``analysis_cache/`` or computed there; and whether they were computed now."""
    model = loaded.model
    config = AttributionSettings(views="all")
    data = {"ids": dataset.input_ids, "types": dataset.token_type_ids}
    key = {
        "kind": "divergence",
        "model": fingerprint(model),
        "data": key_digest(data | {"labels": dataset.labels.tolist()}),
        **settings.key(),
        **explainer.record(),
    }

    def compute(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A padded batch (``[B, L]``) → logits ``[B, C]``, maps ``[B, L, C]`` and the AOPC
        comprehensiveness and sufficiency of the predicted class's map ``[B]``."""
        logits = forward(model, batch).logits.float()
        maps, _ = compute_maps(model, batch, config, explainer=explainer)  # [B, C, L]
        own = maps[torch.arange(len(maps)), logits.argmax(-1)]
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        faithful = aopc(model, *inputs, scores=own, rules=settings.rules)
        return {
            "logits": logits,
            "maps": maps.transpose(1, 2),
            "comprehensiveness": faithful.comprehensiveness,
            "sufficiency": faithful.sufficiency,
        }

    folder = loaded.analysis_dir
    computed = not cache_path(folder, "divergence", key).exists()
    folder.mkdir(parents=True, exist_ok=True)
    cache = cached(
        folder,
        "divergence",
        key,
        dataset,
        compute,
        per_token=("maps",),
        batch_size=16,
        pad_token_id=pad_id(loaded.tokenizer),
        description=f"{loaded.name}: maps and AOPC",
        on_progress=progress,
    )
    return cache, computed


def divergence(
    teacher: LoadedModel,
    students: Sequence[LoadedModel],
    split: Split,
    settings: DivergenceSettings | None = None,
    progress: Progress | None = None,
    explainer: ExplainerChoice | None = None,
) -> Divergence:
    """The teacher's and the students' explanations compared over a fixed stratified sample of
    ``settings.examples`` examples of ``split`` (seed 0), with the maps of ``explainer``
    (default: ig with its defaults); ``progress`` hears how far the computation has come."""
    settings, explainer = settings or DivergenceSettings(), explainer or ExplainerChoice()
    for loaded in (teacher, *students):
        if loaded.run is not None:
            Run.open(loaded.run.path)  # a folder that disappeared: a one-line error
    part = sample_split(split, settings.examples, seed=0, stratify=True)
    _check(teacher, students, part)
    datasets, alignments = _encoded(teacher, students, part)
    models = [teacher, *students]
    names = [TEACHER, *(s.name for s in students)]
    size = len(part)
    caches, computed = [], []
    for m, (name, loaded) in enumerate(zip(names, models, strict=True)):

        def report(
            _description: str, done: int, _total: int, m: int = m, label: str = loaded.name
        ) -> None:
            if progress is not None:
                text = f"{label}: attribution maps and AOPC, {done}/{size} examples"
                progress((m + done / size) / len(models), text)

        cache, fresh = _outputs(loaded, datasets[m], settings, explainer, report)
        caches.append(cache)
        if fresh:
            computed.append(name)
    if progress is not None:
        progress(1.0, "done")
    teacher_logits = caches[0].per_example["logits"]
    explained = teacher_logits.argmax(-1) if settings.explained == TEACHER else datasets[0].labels
    if alignments is None:
        rows, maps, mask = _by_tokens(teacher, caches, datasets[0], explained)
    else:
        rows, maps, mask = _by_words(caches, part, datasets, alignments, explained)
    classes = list(teacher.spec.label_names)
    gold = [classes[int(y)] for y in datasets[0].labels]
    occurrences = pd.DataFrame(
        [[i, word, gold[i], *scores] for i, word, scores in rows],
        columns=["example", "word", "class", *names],
    )
    examples = pd.DataFrame(
        {"text": part.texts, "pair": part.pairs or [None] * size, "label": gold, "uid": part.uids}
    )
    for name, cache in zip(names, caches, strict=True):
        predicted = cache.per_example["logits"].argmax(-1)
        examples[f"{name} prediction"] = [classes[int(c)] for c in predicted]
        examples[f"{name} comprehensiveness"] = cache.per_example["comprehensiveness"].numpy()
        examples[f"{name} sufficiency"] = cache.per_example["sufficiency"].numpy()
    for name, student_maps in zip(names[1:], maps[1:], strict=True):
        examples[f"{name} gap"] = attribution_gap(maps[0], student_maps, mask).numpy()
    truncated = max(d.truncated for d in datasets)  # each model reads at the teacher's length
    return Divergence(
        teacher.name, names[1:], occurrences, examples, settings, explainer, computed, truncated
    )


Rows = list[tuple[int, str, list[float]]]  # (example, word, each model's attribution)


def _by_tokens(
    teacher: LoadedModel, caches: list[ExampleCache], dataset: EncodedSplit, explained: Tensor
) -> tuple[Rows, list[Tensor], Tensor]:
    """Every model reads the teacher's tokens: the word occurrences (word pieces merged,
    special tokens left out) with each model's attribution of the explained class, each
    model's maps ``[N, C, L]`` and their mask ``[N, L]``."""
    size, length = len(dataset), max(len(ids) for ids in dataset.input_ids)
    special_ids = set(teacher.tokenizer.all_special_ids)
    rows: Rows = []
    for i, ids in enumerate(dataset.input_ids):
        tokens = teacher.tokenizer.convert_ids_to_tokens(ids)
        kept = [k for k, t in enumerate(ids) if t not in special_ids]
        scores = [c.example("maps", i)[kept, int(explained[i])].tolist() for c in caches]
        merged = [merge_wordpieces([tokens[k] for k in kept], values) for values in scores]
        rows += [(i, word, [m[1][w] for m in merged]) for w, word in enumerate(merged[0][0])]
    lengths = torch.tensor([len(ids) for ids in dataset.input_ids])
    mask = (torch.arange(length) < lengths[:, None]).long()
    index = torch.arange(size)
    maps = [c.gather("maps", index, length).transpose(1, 2) for c in caches]  # [N, C, L]
    return rows, maps, mask


def _by_words(
    caches: list[ExampleCache],
    part: Split,
    datasets: list[EncodedSplit],
    alignments: list[Alignment],
    explained: Tensor,
) -> tuple[Rows, list[Tensor], Tensor]:
    """Models of several tokenizers: the occurrences of the words all of them read (a word's
    text is the characters it spans; each model's attribution of the explained class summed
    over its tokens in it), each model's word maps ``[N, C, W]`` (summed, normalised over the
    words) and their mask ``[N, W]``."""
    size = len(part)
    width = max(max(a.words for a in alignments), 1)
    index = torch.arange(size)
    scores, maps = [], []
    for cache, dataset in zip(caches, datasets, strict=True):
        length = max(len(ids) for ids in dataset.input_ids)
        ids = torch.full((size, length), -1, dtype=torch.long)
        for i, row in enumerate(dataset.word_ids):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        token_maps = cache.gather("maps", index, length)  # [N, L, C]
        scores.append(pool_words(token_maps, ids, "sum", width)[index, :, explained])  # [N, W]
        maps.append(word_maps(token_maps, ids, width).transpose(1, 2))
    texts = [part.texts, part.pairs or []]
    rows: Rows = [
        (i, texts[sequence][i][start:end], [float(model[i, w]) for model in scores])
        for i, alignment in enumerate(alignments)
        for w, (sequence, start, end) in enumerate(alignment.spans)
    ]
    mask = torch.stack([torch.arange(width) < a.words for a in alignments]).long()
    return rows, maps, mask


def word_table(
    result: Divergence, student: str, by_class: bool = False, min_count: int | None = None
) -> pd.DataFrame:
    """Per word type (with ``by_class``: per gold class and word) seen at least ``min_count``
    times (default: the settings'): ``count``, the ``teacher``'s and the student's mean
    attribution, ``difference`` (student − teacher) and ``example``, the example where the two
    differ most on that word; sorted by ``difference``, most over-attributed first."""
    if student not in result.students:
        raise WorkbenchError(f"{student!r} is not one of the students {result.students}")
    keys = ["class", "word"] if by_class else ["word"]
    frame = result.occurrences.assign(
        difference=result.occurrences[student] - result.occurrences[TEACHER]
    )
    groups = frame.groupby(keys, sort=False)
    table = groups[[TEACHER, student, "difference"]].mean()
    table.insert(0, "count", groups.size())
    widest = groups["difference"].agg(lambda d: d.abs().idxmax())  # where the two differ most
    table["example"] = frame.loc[widest, "example"].values
    minimum = result.settings.min_count if min_count is None else min_count
    table = table[table["count"] >= minimum]
    return table.sort_values("difference", ascending=False, kind="stable").reset_index()

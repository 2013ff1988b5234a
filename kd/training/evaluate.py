"""Score runs on a split: task metrics and, for students, loyalty to their teacher."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kd.methods.objective import METHODS
from kd.training.config import StudentConfig
from kd.training.diagnostics import summarise
from kd.training.pipeline import notice, teacher_pin
from kd.training.teacher_cache import cached_logits, is_cache, open_cache
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.core.config import DataConfig, config_key, parse_label_map
from workbench.core.data import encode, load_task, pad_id
from workbench.core.errors import WorkbenchError
from workbench.core.models import is_run, layer_count, load_for_task, load_model
from workbench.core.runs import Run, RunRecord, task_beside, teacher_change

if TYPE_CHECKING:
    from torch import Tensor

    from workbench.core.data import TaskData
    from workbench.core.models import LoadedModel


def term_summary(records: Sequence[dict]) -> dict[str, str]:
    """ "What dominates this objective", from a run's logged diagnostics: each term's share of
    the gradient and weighted value at the first and last logged step, and those steps, e.g.
    ``{"start step": 1, "grad share, start": "attr 94% · kd 5% · ce 1%", ...}`` (empty if
    none were logged): the same columns for every run, however long it trained."""
    row = {}
    for moment, record in summarise(records).items():
        row[f"{moment} step"] = record["step"]
        for prefix, label, form in (
            ("grad_share/", "grad share", "{:.0%}"),
            ("value/", "weighted value", "{:.3g}"),
        ):
            terms = {k.removeprefix(prefix): v for k, v in record.items() if k.startswith(prefix)}
            ranked = sorted(terms.items(), key=lambda item: -abs(item[1]))
            row[f"{label}, {moment}"] = " · ".join(
                f"{name} {form.format(value)}" for name, value in ranked
            )
    return row


def objective_description(info: RunRecord) -> str:
    """A run's objective as trained, from ``run.json``'s resolved record, e.g.
    ``"attr 1 · ce 0.1 · kd 0.9 (official distance), τ 2"``."""
    record = info.resolved.objective
    text = " · ".join(f"{name} {weight:g}" for name, weight in record.weights.items())
    for entry in METHODS.values():  # what each method in use adds, from its record
        note = entry.describe(record.model_dump()) if entry.describe else ""
        text += f" ({note})" if note else ""
    if "kd" in record.weights:
        text += f", τ {record.temperature:g}"
    return text


def evaluate_runs(
    paths: Sequence[str],
    split: str = "test",
    teacher: str | None = None,
    terms: bool = False,
    data: DataConfig | None = None,
    label_map: str = "",
    notify: Callable[[str], None] | None = None,
    dedupe: bool = False,
) -> list[dict]:
    """One row per run or model: name, kind, method, layers, parameters, task metrics, and for
    students label/probability loyalty to ``teacher`` (default: the nearest teacher, cache or model
    in the rows above the student, else its own); with ``terms``, the
    objective's diagnostics (:func:`term_summary`). A model the workbench did not train is scored on
    ``data``'s task (``label_map`` where class names differ), else on that of the first run among
    ``paths`` (:func:`task_beside`); ``dedupe`` scores a run on its own task deduplicated. An
    unfinished run is scored with its best dev model so far, said to ``notify`` and in its row's
    ``unfinished``."""
    rows, teacher_logits, taught, above = [], {}, {}, ""
    said: set[str] = set()

    def once(text: str) -> None:  # runs of one task: their data's notes said once
        if text not in said:
            said.add(text)
            (notify or notice)(text)

    for path in paths:
        if is_cache(path):
            rows.append(_cache_row(path, split, once))
            above = path
            continue
        loaded, task, unfinished = _load(path, paths, data, label_map, dedupe, once)
        if split not in task.splits:
            raise WorkbenchError(f"split {split!r} not in {sorted(task.splits)}")
        part = task.splits[split]
        dataset = encode(part, loaded.tokenizer, loaded.max_length, task.spec.regression)
        logits = predict_logits(loaded.model, dataset, 64, pad_id(loaded.tokenizer))
        info = loaded.run.info() if loaded.run else None
        reference, changed, source, own = None, None, "", ""
        if info is not None and info.kind == "student":
            recorded = loaded.run.config(StudentConfig, "student")
            own = recorded.teacher_cache or recorded.teacher
            taught[len(rows)] = _source(own)
            source, mapping = _loyal_to(loaded.name, teacher, label_map, above, own, once)
            mapping = recorded.label_map if source == own else mapping
        else:
            above = path  # a teacher, a model: the students below are scored against it
        if source:  # a student trained alone has no teacher to be loyal to
            key = (source, mapping, config_key(loaded.data), split)
            if key not in teacher_logits:
                teacher_logits[key] = _teacher_logits(source, mapping, loaded, task, split, once)
            reference = teacher_logits[key]
            if source == own and not is_cache(source):  # a cache is pinned as its student
                changed = teacher_change(info.resolved.teacher, teacher_pin(source))
                if changed:
                    once(
                        f"{loaded.name}: {changed}: its loyalty is measured against "
                        "the teacher as it is now, not the one it learnt from"
                    )
        rows.append(
            {
                "run": loaded.name,
                "kind": info.kind if info else "model",
                "method": (info.method or "–") if info else loaded.origin,
                "objective": objective_description(info) if info else None,
                "layers": layer_count(loaded.model),
                "parameters_m": round(sum(p.numel() for p in loaded.model.parameters()) / 1e6, 1),
                "split": split,
                "examples": len(dataset),
                **evaluate_logits(task.spec, logits, dataset.labels, reference),
                **({"teacher_changed": changed} if changed else {}),
                **(term_summary(loaded.run.metrics("train")) if terms and loaded.run else {}),
                **({"unfinished": unfinished} if unfinished is not None else {}),
            }
        )
    for line in teacher_bought(rows, [_source(path) for path in paths], taught):
        (notify or notice)(line)
    return rows


def _load(
    path: str, paths: Sequence[str], data: DataConfig | None, label_map: str, dedupe: bool, once
) -> tuple[LoadedModel, TaskData, str | None]:
    """The model ``path`` names, the task it is scored on (as :func:`evaluate_runs` says) and,
    for a run that has not finished, where it stands (said to ``once``)."""
    given, mapping = data, label_map
    if given is None and dedupe and is_run(path):
        given = replace(Run.open(path).config(DataConfig, "data"), dedupe=True)
    if given is None and not is_run(path) and (beside := task_beside(path, paths, once)):
        given, recorded_map = beside  # a model beside a run: the run's task and settings
        given, mapping = replace(given, dedupe=dedupe or given.dedupe), mapping or recorded_map
    loaded, task = load_for_task(path, given, mapping, once)
    unfinished = loaded.run.unfinished() if loaded.run else None
    if unfinished is not None:
        once(
            f"{loaded.name} has not finished training ({unfinished}): scored with "
            f"{loaded.run.snapshot()}"
        )
    return loaded, task, unfinished


def _teacher_logits(
    source: str, mapping: str, loaded: LoadedModel, task: TaskData, split: str, once
) -> Tensor:
    """The logits ``[N, C]`` that the teacher ``source`` gives ``split`` (a cache: those it
    holds; a model: its own, its classes matched by ``mapping``, reading as far as ``loaded``
    reads); a teacher run that has not finished is said to ``once``."""
    if is_cache(source):
        return cached_logits(source, split, task)
    if is_run(source) and (state := Run.open(source).unfinished()) is not None:
        once(
            f"loyalty is measured against the teacher {source}, which has not finished "
            f"training ({state}): {Run.open(source).snapshot()}"
        )
    theirs = load_model(source, task.spec, loaded.data, parse_label_map(mapping), once)
    part = task.splits[split]
    encoded = encode(part, theirs.tokenizer, loaded.max_length, task.spec.regression)
    return predict_logits(theirs.model, encoded, 64, pad_id(theirs.tokenizer))


def _loyal_to(
    name: str, teacher: str, label_map: str, above: str, own: str, say: Callable[[str], None]
) -> tuple[str, str]:
    """Which teacher the student ``name`` is scored against, and with which label map: the one
    asked for (``teacher``), else the teacher or model in the rows above it (``above``: said when
    it is not the student's ``own``), else its own ("" for a student trained alone)."""
    if teacher:
        return teacher, label_map
    if above and _source(above) != _source(own):
        learnt = f"learnt from {own}" if own else "was trained without a teacher"
        say(f"{name} {learnt}: its loyalty is measured against {above}, in the row above it")
        return above, label_map
    return own, label_map


def _source(path: str) -> str:
    """Where the model ``path`` names lies: a run folder's model folder (the same teacher named
    either way), else the path itself, resolved; "" for none."""
    if not path:
        return ""
    resolved = Path(path).resolve()
    return str(resolved / "model" if (resolved / "model" / "config.json").exists() else resolved)


def teacher_bought(rows: Sequence[dict], sources: Sequence[str], taught: dict[int, str]) -> list:
    """What each teacher bought its students, one line each, among :func:`evaluate_runs`'
    ``rows`` (``sources[i]``: row i's folder; ``taught[i]``: student row i's teacher, "" for one
    trained alone): a teacher that scores below a student it taught, and a distilled student
    against the first student trained alone (``finetune``) on the split."""
    metric = next((m for m in ("accuracy", "spearman") if rows and m in rows[0]), None)
    if metric is None:
        return []
    lines = []
    for i, teacher in taught.items():
        if (
            teacher
            and teacher in sources
            and (t := rows[sources.index(teacher)])[metric] < (student := rows[i])[metric]
        ):
            lines.append(
                f"the teacher {t['run']} scores {t[metric]:.4f} {metric} on {t['split']}, below "
                f"its student {student['run']} ({student[metric]:.4f}): it teaches less than "
                "the labels do; a stronger teacher, or a transfer set (--transfer), may help"
            )
    alone = next((rows[i] for i, teacher in taught.items() if not teacher), None)
    for i, teacher in taught.items():
        if teacher and alone is not None:
            gain = rows[i][metric] - alone[metric]
            where = f"{abs(gain):.4f} {'above' if gain > 0 else 'below'}" if gain else "level with"
            lines.append(
                f"{rows[i]['run']} scores {rows[i][metric]:.4f} {metric}, {where} the student "
                f"trained alone, {alone['run']} ({alone[metric]:.4f}): "
                + ("what distilling bought" if gain > 0 else "distilling bought nothing here")
            )
    return lines


def _cache_row(folder: str, split: str, notify: Callable[[str], None]) -> dict:
    """The row of a teacher that is only a cache (``kdw cache``): its metrics from the logits it
    holds on its own task's ``split``, its layers and parameters from its config."""
    teacher = open_cache(folder)
    task = load_task(teacher.data, notify)
    if split not in task.splits:
        raise WorkbenchError(f"split {split!r} not in {sorted(task.splits)}")
    logits = cached_logits(folder, split, task)
    labels = encode(task.splits[split], teacher.tokenizer, teacher.data.max_length).labels
    return {
        "run": Path(folder).name,
        "kind": "teacher cache",
        "method": "–",
        "objective": None,
        "layers": layer_count(teacher.model),
        "parameters_m": round(sum(p.numel() for p in teacher.model.parameters()) / 1e6, 1),
        "split": split,
        "examples": len(labels),
        **evaluate_logits(task.spec, logits, labels),
    }


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of :func:`evaluate_runs` rows (numbers to 4 decimals)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return "–" if value is None else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)

"""Token attribution heatmaps of trained runs as files: what the app's Export page and
``kdw export`` write, and the attributions that ``kdw attribute`` saves.

:func:`to_heatmap` puts several models' explanations on one scale with their settings in the
metadata (anonymous: models by role, no run id); :func:`write_heatmaps` writes any format of
:mod:`workbench.export`. torch, transformers and matplotlib are imported inside the functions
that compute, so that building ``kdw``'s parser (which reads :class:`ExportSettings`) stays fast.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.analysis.examples import Example, gather_examples
from workbench.analysis.explanation_agreement import shown_classes
from workbench.analysis.explanations import (
    Explanation,
    HeatmapSettings,
    _class_names,
    explain,
    gold_index,
)
from workbench.core.config import MAX_DPI, Checked, colormap, dpi_range, option
from workbench.core.errors import WorkbenchError
from workbench.core.files import check_writable, staging_folder
from workbench.core.names import TASK_NAMES

if TYPE_CHECKING:
    from workbench.analysis.attribution import AttributionSettings, ExplainerChoice
    from workbench.core.models import LoadedModel
    from workbench.export import ExportOptions, Heatmap

FORMAT_CHOICES = ("svg", "pdf", "png", "tex", "html")


@dataclass
class ExportSettings(Checked):
    """Which files are written and how they look."""

    formats: str = option(
        "svg,pdf,png,tex,html", "comma-separated formats: svg, pdf, png, tex, html"
    )
    dpi: float = option(
        200.0,
        f"PNG resolution in dots per inch, at most {MAX_DPI}: the finest that journals ask of line "
        "art, and beyond it one figure needs gigabytes; PDF and SVG are vectors, sharp at any "
        "size",
        domain=dpi_range,
    )
    cmap: str | None = option(
        None,
        "matplotlib colormap (default: colour-blind-safe PuOr_r for signed scores, "
        "Oranges for non-negative ones)",
        domain=colormap,
    )
    merge_wordpieces: bool = option(
        False, "join WordPiece continuations (##ing) onto their word, summing their scores"
    )
    anonymous: bool = option(
        False,
        "for double-blind review: name the models by role (the first teacher, the others "
        "student 1, student 2, … in the order given) and write no run folder, run id, path, "
        "user or host name into any file",
    )

    def format_list(self) -> list[str]:
        """The formats, checked."""
        chosen = [f.strip().lstrip(".").lower() for f in self.formats.split(",") if f.strip()]
        unknown = sorted(set(chosen) - set(FORMAT_CHOICES))
        if unknown or not chosen:
            raise WorkbenchError(
                f"formats {self.formats!r}: choose among {', '.join(FORMAT_CHOICES)}"
            )
        return list(dict.fromkeys(chosen))

    def options(self) -> ExportOptions:
        """The rendering options of :mod:`workbench.export` these settings choose."""
        from workbench.export import ExportOptions

        return ExportOptions(cmap=self.cmap or None, merge_wordpieces=self.merge_wordpieces)


def public_task(task: str) -> str:
    """The task as an anonymous export names it: a bundled or GLUE task by its name, any other
    (a local path, a hub data set under someone's account) as ``task``."""
    return task if task in TASK_NAMES else "task"


def heatmap_metadata(
    explanations: Sequence[Explanation],
    example: Example,
    settings: HeatmapSettings,
    explained: dict | None = None,
    anonymous: bool = False,
) -> dict[str, str]:
    """What each exported file records: models, run ids, the example, the settings (``explained``:
    :func:`explained_settings`), each model's preset and layers and the task. ``anonymous`` leaves
    out run ids and the example's id, names the task by :func:`public_task` (the models by role:
    :func:`build_heatmaps`) and records ``anonymous: yes``. ``truncated`` names each model that
    read the text in part, with its tokenizer; ``warnings`` holds the explainers' warnings, one
    per line; ``ig_completeness_gap`` each IG map's gap, whatever its size."""
    runs = {} if anonymous else {"run_ids": json.dumps([e.run_id for e in explanations])}
    task = next((e.task for e in explanations if e.task), None)  # a model given alone has none
    named = {} if task is None else {"task": public_task(task) if anonymous else task}
    meta = {
        "models": ", ".join(e.name for e in explanations),
        "model_details": "; ".join(f"{e.name}: {e.model}" for e in explanations),
        **named,
        **runs,
        "anonymous": "yes" if anonymous else "no",
        "text": example.text,
        "truncated": "; ".join(e.truncation_note for e in explanations if e.truncated) or "no",
        "warnings": "\n".join(e.gap_warning for e in explanations if e.gap_warning) or "none",
        "ig_completeness_gap": "; ".join(
            f"{e.name}: {e.completeness_gap:.2%}"
            for e in explanations
            if e.completeness_gap is not None
        )
        or "none",
        **{
            f"settings.{k}": "default" if v is None else str(v)
            for k, v in {**asdict(settings), **(explained or {})}.items()
        },
    }
    if example.pair is not None:
        meta["text_pair"] = example.pair
    if example.label is not None:
        meta["gold"] = str(example.label)
    if example.uid and not anonymous:
        meta["example_id"] = example.uid
    return meta


def explained_settings(explainer: ExplainerChoice | None, words: str | None) -> dict:
    """The explainer that computes the maps (default: ig), its settings and the word
    aggregation, as a heatmap's metadata records them (flat)."""
    from workbench.analysis.attribution import ExplainerChoice

    choice = explainer or ExplainerChoice()
    values = {f"explainer.{k}": v for k, v in choice.record()["explainer_settings"].items()}
    return {"explainer": choice.name, **values, "words": words or "tokens"}


def word_columns(explanations: Sequence[Explanation]) -> list[list[int]] | None:
    """The columns in which the words of several models' word maps stand: each word (a span
    of the text, from ``Explanation.spans``) one column, shared by every model that read it
    as a word, in reading order; a special token after the row's last word before it (so
    ``[CLS]`` stands above ``<s>``). ``columns[m][i]``: the column of model ``m``'s word ``i``.
    None where a model has no spans (a slow tokenizer)."""
    if any(e.spans is None for e in explanations):
        return None
    keys = []
    for explanation in explanations:
        row, last, specials = [], (-1, -1), 0
        for span in explanation.spans:
            if span is None:
                row.append((*last, last[1], 1, specials))
                specials += 1
            else:
                row.append((*span, 0, 0))
                last, specials = (span[0], span[2]), 0
        keys.append(row)
    order = {key: n for n, key in enumerate(sorted({key for row in keys for key in row}))}
    return [[order[key] for key in row] for row in keys]


def to_heatmap(
    explanations: Sequence[Explanation],
    example: Example,
    settings: HeatmapSettings,
    title: str = "",
    explained: dict | None = None,
    anonymous: bool = False,
) -> Heatmap:
    """One heatmap with a row per model (per model and class for the view ``all``);
    ``explained``: :func:`explained_settings` (default: ig with its defaults, per sub-token);
    ``anonymous``: as :func:`heatmap_metadata`. Word maps of several models stand in columns
    (:func:`word_columns`): a word read by models of different tokenizers above itself, a blank
    cell where a model did not read it as a word."""
    from workbench.analysis.attribution import get_explainer
    from workbench.export import Heatmap, HeatmapRow

    explained = explained or explained_settings(None, None)
    per_word = explained["words"] != "tokens" and len(explanations) > 1
    columns = word_columns(explanations) if per_word else None
    width = 0 if columns is None else 1 + max(max(row) for row in columns)
    rows = []
    for m, explanation in enumerate(explanations):
        classes = shown_classes(explanation, settings.view)
        for c in classes:
            label = explanation.name
            if len(classes) > 1 or settings.view != "pred":
                label = f"{label} · {explanation.class_names[c]}"
            tokens, scores = explanation.tokens, explanation.maps[c]
            if columns is not None:
                tokens, scores = [""] * width, [None] * width
                for i, column in enumerate(columns[m]):
                    tokens[column], scores[column] = explanation.tokens[i], explanation.maps[c][i]
            rows.append(HeatmapRow(label, tokens, scores, explanation.prediction_text()))

    method = get_explainer(explained["explainer"]).title
    unit = "" if explained["words"] == "tokens" else f", words ({explained['words']})"
    return Heatmap(
        rows,
        title or f"{method}, view {settings.view}{unit}",
        heatmap_metadata(explanations, example, settings, explained, anonymous),
        columns=columns is not None,
    )


def build_heatmaps(
    runs: Sequence[LoadedModel],
    examples: Sequence[Example],
    settings: HeatmapSettings,
    names: Sequence[str] | None = None,
    explainer: ExplainerChoice | None = None,
    words: str | None = None,
    anonymous: bool = False,
) -> list[Heatmap]:
    """One heatmap per example, a row per run (each explaining all examples in one batch), under
    ``explainer`` (default: ig), per sub-token or per word; rows named ``names``
    (default: the runs'), or with ``anonymous`` by role, without run ids."""
    if anonymous:  # by role, in the order given
        names = ["teacher", *(f"student {n}" for n in range(1, len(runs)))]
    names = names or [loaded.name for loaded in runs]
    explained = explained_settings(explainer, words)
    per_run = [
        explain(loaded, examples, name, explainer, words)
        for loaded, name in zip(runs, names, strict=True)
    ]
    return [
        to_heatmap(
            [e[i] for e in per_run], example, settings, explained=explained, anonymous=anonymous
        )
        for i, example in enumerate(examples)
    ]


def output_folder(out: str | Path) -> Path:
    """``--out`` as a folder to write into: one that exists as a file, or where nothing can be
    written (:func:`~workbench.core.files.check_writable`), is a one-line error."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(f"--out {out} is a file: name a folder to write to")
    check_writable(folder, "--out")
    return folder


def _names(heatmaps: Sequence[Heatmap], stem: str) -> list[str]:
    """``<stem>-<n>``, the name of each heatmap's files (numbered from 0, at least 3 digits)."""
    width = max(3, len(str(len(heatmaps))))
    return [f"{stem}-{n:0{width}d}" for n in range(len(heatmaps))]


def write_heatmaps(
    heatmaps: Sequence[Heatmap], folder: str | Path, settings: ExportSettings, stem: str = "heatmap"
) -> list[Path]:
    """Write every heatmap in every chosen format as ``<stem>-<n>.<format>``. The set replaces
    a previous export's in ``folder`` whole: its ``<stem>-<n>.<format>`` files are removed once
    the new ones are written (other files stay), so no file of other texts is left beside them."""
    from workbench.export import check_png_size, export

    formats = settings.format_list()
    folder = output_folder(folder)
    if "png" in formats:  # too many pixels: refused before anything is written
        for heatmap in heatmaps:
            check_png_size(heatmap, settings.dpi, settings.options())
    previous = re.compile(rf"{re.escape(stem)}-\d+\.(?:{'|'.join(FORMAT_CHOICES)})")
    staging = staging_folder(folder / stem)
    try:
        written = [
            export(heatmap, staging / f"{name}.{fmt}", dpi=settings.dpi, options=settings.options())
            for name, heatmap in zip(_names(heatmaps, stem), heatmaps, strict=True)
            for fmt in formats
        ]
        for old in folder.iterdir():
            if old.is_file() and previous.fullmatch(old.name):
                old.unlink()
        return [path.replace(folder / path.name) for path in written]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_notes(
    heatmaps: Sequence[Heatmap], settings: ExportSettings, stem: str = "heatmap"
) -> list[str]:
    """What a reader of the files should know, one line per heatmap and thing that needs it:
    a text the models read only in part (truncated), an explainer's warning (IG's completeness
    gap), and characters that PNG and PDF draw as boxes because no installed font has them."""
    from workbench.export import describe_characters, undrawable_characters

    raster = {"png", "pdf"} & set(settings.format_list())
    notes = []
    for name, heatmap in zip(_names(heatmaps, stem), heatmaps, strict=True):
        if heatmap.metadata.get("truncated", "no") != "no":
            notes.append(f"{name}: the text was truncated: {heatmap.metadata['truncated']}")
        if heatmap.metadata.get("warnings", "none") != "none":
            notes.extend(f"{name}: {line}" for line in heatmap.metadata["warnings"].splitlines())
        missing = undrawable_characters(heatmap, settings.options()) if raster else []
        if missing:
            notes.append(
                f"{name}: no installed font has {describe_characters(missing)}: the "
                f"{'/'.join(sorted(raster)).upper()} files draw boxes there (install a font "
                "covering them, e.g. a Noto font of that script; SVG, HTML and LaTeX are "
                "unaffected)"
            )
    return notes


def export_runs(
    runs: Sequence[str | Path],
    out: str | Path,
    settings: HeatmapSettings,
    export_settings: ExportSettings,
    notify: Callable[[str], None] = lambda note: None,
    explainer: ExplainerChoice | None = None,
    words: str | None = None,
    **sources,
) -> list[Path]:
    """What ``kdw export`` does: explain the examples :func:`gather_examples` collects from
    ``sources`` (of the first run's task; a classifier the workbench did not train has its classes
    matched to the first one's by name) under every run, and write one heatmap per example in each
    format to ``out`` (:func:`write_heatmaps`); ``notify`` receives :func:`export_notes`' lines."""
    from workbench.core.models import load_model

    export_settings.format_list()  # fail early on a bad format
    output_folder(out)
    first = load_model(str(runs[0]))
    loaded = [first, *(load_model(str(path), first.spec, notify=notify) for path in runs[1:])]
    classes = [[name.casefold() for name in run.spec.label_names] for run in loaded]
    if any(names != classes[0] for names in classes):  # run folders, matched as load_model does
        raise WorkbenchError("the runs predict different classes: export runs of one task")
    examples = gather_examples(first, "export", **sources)
    anonymous = export_settings.anonymous
    heatmaps = build_heatmaps(
        loaded, examples, settings, explainer=explainer, words=words, anonymous=anonymous
    )
    for note in export_notes(heatmaps, export_settings):
        notify(note)
    return write_heatmaps(heatmaps, out, export_settings)


def attribute_runs(
    runs: Sequence[str | Path],
    out: str | Path,
    config: AttributionSettings,
    explainer: ExplainerChoice | None = None,
    words: str | None = None,
    **sources,
) -> list[Path]:
    """What ``kdw attribute`` does: attribute the examples :func:`gather_examples` collects under
    each run with ``explainer`` (per word with ``words``) and save them as ``<out>/<run>.jsonl``."""
    from workbench.analysis.attribution import (
        ExplainerChoice,
        attribute_texts,
        check_layer,
        save_attributions,
    )
    from workbench.analysis.attribution.words import check_words
    from workbench.core.models import load_model

    check_layer(config, explainer or ExplainerChoice())  # refused before any work
    check_words(words)
    folder, paths = output_folder(out), []
    for path in runs:
        loaded = load_model(str(path))
        examples = gather_examples(loaded, "attribute", **sources)
        pairs = [e.pair or "" for e in examples] if any(e.pair for e in examples) else None
        gold = [gold_index(e.label, _class_names(loaded)) for e in examples]
        records = attribute_texts(
            loaded.model,
            loaded.tokenizer,
            [e.text for e in examples],
            pairs,
            settings=config,
            labels=None if None in gold else gold,
            explainer=explainer,
            words=words,
        )
        paths.append(save_attributions(records, folder / f"{loaded.name}.jsonl"))
    return paths

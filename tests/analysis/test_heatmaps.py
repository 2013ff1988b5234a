"""Heatmaps of runs and ``kdw export`` (``workbench.analysis.explanations``,
``explanation_agreement``, ``heatmap_export`` and ``examples``): explanations, rows per view,
agreement, metadata, escaping, uploaded files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kd.cli import main
from tests.app.test_app import HOSTILE, STUDENTS, build_tiny_runs
from workbench.analysis.attribution import ExplainerChoice, ig_completeness
from workbench.analysis.examples import Example, parse_indices, read_examples
from workbench.analysis.explanation_agreement import agreement
from workbench.analysis.explanations import HeatmapSettings, explain
from workbench.analysis.heatmap_export import (
    ExportSettings,
    build_heatmaps,
    explained_settings,
    to_heatmap,
    write_heatmaps,
)
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_model, load_run

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("heatmaps")
    build_tiny_runs(work / "runs", work)
    return work / "runs"


@pytest.fixture(scope="module")
def loaded(runs):
    return [load_run(runs / name) for name in ("teacher", *STUDENTS)]


EXAMPLES = [Example("good movie but sad story", label="positive"), Example("awful", label=0)]


@pytest.mark.parametrize("method", ["ig", "grad"])
@pytest.mark.slow
def test_explain_gives_probabilities_and_a_map_per_class(loaded, method):
    choice = ExplainerChoice(method, {"steps": 3} if method == "ig" else None)
    first, second = explain(loaded[0], EXAMPLES, explainer=choice)
    assert first.tokens[0] == "[CLS]" and first.tokens[-1] == "[SEP]" and len(second.tokens) == 3
    assert math.isclose(sum(first.probabilities), 1, rel_tol=1e-5)
    assert first.gold == 2 and second.gold == 0
    assert len(first.maps) == 3 and all(len(m) == len(first.tokens) for m in first.maps)
    assert len(first.saliency) == len(first.tokens)
    if method == "ig":
        assert all(math.isclose(sum(v * v for v in m), 1, rel_tol=1e-4) for m in first.maps)
        alone = loaded[0].tokenizer(EXAMPLES[0].text, return_tensors="pt")
        expected = ig_completeness(loaded[0].model, **alone, target=first.predicted, steps=3)
        assert first.completeness == pytest.approx([float(v[0]) for v in expected], abs=1e-5)
        attributed, change = first.completeness
        assert first.completeness_gap == pytest.approx(abs(attributed - change) / abs(change))
    else:
        assert first.maps[first.predicted] == pytest.approx(first.saliency, abs=1e-6)
        assert first.completeness is None and first.completeness_gap is None


def test_views_choose_the_rows(loaded):
    def rows(view: str) -> list[str]:
        settings = HeatmapSettings(view=view)
        return [row.label for row in build_heatmaps(loaded[:2], EXAMPLES[:1], settings)[0].rows]

    assert rows("pred") == ["teacher", "student-kd"]
    assert rows("all") == [
        f"{m} · {c}" for m in ("teacher", "student-kd") for c in ("negative", "neutral", "positive")
    ]
    assert rows("gold") == ["teacher · positive", "student-kd · positive"]
    assert rows("1") == rows("neutral") == ["teacher · neutral", "student-kd · neutral"]
    with pytest.raises(WorkbenchError, match="needs examples with a label"):
        build_heatmaps(loaded[:1], [Example("good")], HeatmapSettings(view="gold"))
    with pytest.raises(WorkbenchError, match="not one of the classes"):
        rows("happy")


def test_agreement_of_a_model_with_itself_is_perfect(loaded):
    teacher = explain(loaded[0], EXAMPLES[:1])[0]
    same = agreement(teacher, teacher)
    assert same.saliency_loyalty == pytest.approx(1) and same.rank_correlation == pytest.approx(1)
    student = explain(loaded[1], EXAMPLES[:1])[0]
    other = agreement(teacher, student, "all")
    assert -1 <= other.saliency_loyalty <= 1 and -1 <= other.rank_correlation <= 1


def test_metadata_records_models_runs_settings_and_text(loaded, runs, tmp_path):
    settings = HeatmapSettings()
    choice = ExplainerChoice("ig", {"steps": 2, "baseline": "zero", "top_k": 4})
    explained = explained_settings(choice, None)
    explanations = [explain(run, [Example(HOSTILE)], explainer=choice)[0] for run in loaded]
    heatmap = to_heatmap(explanations, Example(HOSTILE, uid="ex-1"), settings, explained=explained)
    meta = heatmap.metadata
    assert json.loads(meta["run_ids"]) == [str(runs / n) for n in ("teacher", *STUDENTS)]
    assert meta["models"] == "teacher, student-kd, student-pkd"
    assert meta["settings.explainer"] == "ig" and meta["settings.explainer.steps"] == "2"
    assert meta["settings.explainer.baseline"] == "zero" and meta["settings.explainer.top_k"] == "4"
    assert not {"settings.method", "settings.steps", "settings.top_k"} & set(meta)
    assert meta["text"] == HOSTILE and meta["example_id"] == "ex-1"
    assert meta["task"] == loaded[0].data.task
    # the teacher's saved model given alone has no task: the field names none, not the model
    plain = load_model(str(runs / "teacher" / "model"))
    alone = explain(plain, [Example(HOSTILE)], explainer=choice)
    assert "task" not in to_heatmap(alone, Example(HOSTILE), settings).metadata
    both = [*alone, explanations[1]]
    assert to_heatmap(both, Example(HOSTILE), settings).metadata["task"] == loaded[1].data.task
    paths = write_heatmaps([heatmap], tmp_path, ExportSettings(formats="svg,html,tex,png", dpi=72))
    assert sorted(p.suffix for p in paths) == [".html", ".png", ".svg", ".tex"]
    svg = ET.parse(tmp_path / "heatmap-000.svg").getroot()
    embedded = json.loads(svg.find(f"{SVG}metadata").text)
    assert embedded["run_ids"] == meta["run_ids"] and embedded["text"] == HOSTILE
    html = (tmp_path / "heatmap-000.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html
    tex = (tmp_path / "heatmap-000.tex").read_text().splitlines()
    assert all(line.startswith("%") for line in tex if "textbf" in line)


def test_uploaded_files_are_checked():
    csv = b'text,label\ngood film,positive\n"a, b",negative\n'
    assert read_examples(csv, "texts.csv") == [
        Example("good film", label="positive", uid="texts.csv:1"),
        Example("a, b", label="negative", uid="texts.csv:2"),
    ]
    jsonl = b'{"text": "x", "text_pair": "y"}\n\n{"text": "z"}\n'
    assert [(e.text, e.pair) for e in read_examples(jsonl, "t.jsonl")] == [("x", "y"), ("z", None)]
    bad = [
        (b"text\nx\n", "texts.exe", "unsupported file type"),
        (b"text\n" + b"x\n" * 50, "big.csv", "the limit is 100 bytes"),
        (b"text\nx\x00y\n", "bin.csv", "not a text file"),
        (b"text\n\xff\xfe\n", "latin.csv", "not UTF-8"),
        (b'{"text": "x"}\nnot json\n', "t.jsonl", "line 2: not JSON"),
        (b"label\npositive\n", "t.csv", "no 'text'"),
        (b"", "empty.csv", "no examples"),
    ]
    for data, name, message in bad:
        with pytest.raises(WorkbenchError, match=message):
            read_examples(data, name, max_bytes=100)
    with pytest.raises(WorkbenchError, match="the limit is 2"):
        read_examples(b"text\na\nb\nc\n", "t.csv", max_examples=2)


def test_parse_indices():
    assert parse_indices("0,3,7-9", 10) == [0, 3, 7, 8, 9]
    for text in ("10", "a", "3-x", ""):
        with pytest.raises(WorkbenchError):
            parse_indices(text, 10)


@pytest.mark.slow
def test_kdw_export_writes_every_format(runs, tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"text": HOSTILE, "label": "neutral"}) + "\n")
    out = tmp_path / "out"
    status = main(
        [
            "export",
            str(runs / "teacher"),
            str(runs / "student-kd"),
            "--out",
            str(out),
            "--text",
            "good movie",
            "--texts-file",
            str(texts),
            "--split",
            "test",
            "--examples",
            "0-1",
            "--explainer",
            "grad",
            "--view",
            "all",
            "--dpi",
            "60",
        ]
    )
    assert status == 0
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 4 * 5 and len(capsys.readouterr().out.splitlines()) == 20
    svg = ET.parse(out / "heatmap-001.svg").getroot()
    meta = json.loads(svg.find(f"{SVG}metadata").text)
    assert meta["settings.explainer"] == "grad" and meta["text"] == HOSTILE
    assert json.loads(meta["run_ids"]) == [str(runs / "teacher"), str(runs / "student-kd")]
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert "student-kd · neutral" in labels
    html = (out / "heatmap-001.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_kdw_export_errors_are_one_line(runs, tmp_path, capsys):
    assert main(["export", str(runs / "teacher"), "--out", str(tmp_path)]) == 2
    assert "nothing to export" in capsys.readouterr().err
    assert (
        main(
            [
                "export",
                str(runs / "teacher"),
                "--out",
                str(tmp_path),
                "--text",
                "a",
                "--formats",
                "svg,gif",
            ]
        )
        == 2
    )
    assert "gif" in capsys.readouterr().err
    assert main(["export", str(runs / "corrupt"), "--out", str(tmp_path), "--text", "a"]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_a_run_is_explained_at_its_recorded_length_and_every_ig_gap_recorded(loaded, runs):
    """A run reads a text as ``kdw evaluate`` scored it: cut at its ``--max-length``, said in the
    metadata; its saved model given alone reads it whole. Each IG map's completeness gap is in
    the metadata whatever its size."""
    run = loaded[0]
    words = " ".join(["good movie but sad story"] * 12)
    settings, two = HeatmapSettings(), ExplainerChoice("ig", {"steps": 2})
    (cut,) = explain(run, [Example(words)], explainer=two)
    assert cut.read == run.max_length < cut.full_length and len(cut.tokens) == run.max_length
    (whole,) = explain(load_model(str(runs / "teacher" / "model")), [Example(words)], explainer=two)
    assert whole.read == whole.full_length == cut.full_length
    meta = to_heatmap([cut, whole], Example(words), settings).metadata
    assert meta["truncated"] == cut.truncation_note
    gaps = dict(part.split(": ") for part in meta["ig_completeness_gap"].split("; "))
    assert gaps == {e.name: f"{e.completeness_gap:.2%}" for e in (cut, whole)}
    grad = to_heatmap(
        explain(run, [Example(words)], explainer=ExplainerChoice("grad")),
        Example(words),
        settings,
        explained=explained_settings(ExplainerChoice("grad"), None),
    )
    assert grad.metadata["ig_completeness_gap"] == "none"

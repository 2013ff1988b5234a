"""What a figure of an LLM teacher beside a student says: a tiny Llama reading through a
byte-level BPE tokenizer (SmolLM2's kind) and a tiny BERT through WordPiece. Truncation is
counted on tokens before any word aggregation and names each model's tokenizer; IG's
completeness gap is carried into the files, their notes and the JSONL records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_families import save_family_model
from workbench.analysis.attribution import (
    AttributionSettings,
    ExplainerChoice,
    attribute_texts,
    completeness_warning,
    ig_completeness,
)
from workbench.analysis.examples import Example
from workbench.analysis.explanations import HeatmapSettings, explain
from workbench.analysis.heatmap_export import ExportSettings, build_heatmaps, export_notes
from workbench.core.models import load_model

LABELS = ["negative", "neutral", "positive"]
TEXT = "Great crew, smooth flight"  # words the byte-level tokenizer splits into pieces
LONG = " ".join(["good movie"] * 70)  # more than the tiny models' 128 positions


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple:
    """A tiny Llama (byte-level BPE) and a tiny BERT (WordPiece) classifier, loaded."""
    root = tmp_path_factory.mktemp("llm-figure")
    llama = load_model(str(save_family_model("llama", root / "llama", LABELS, seed=1)))
    bert = load_model(str(save_family_model("bert", root / "bert", LABELS, seed=2)))
    return llama, bert


def test_word_views_claim_no_truncation_and_notes_name_the_tokenizer(models):
    llama, bert = models
    settings, two = HeatmapSettings(), ExplainerChoice("ig", {"steps": 2})
    for loaded, kind in ((llama, "byte-level BPE"), (bert, "WordPiece")):
        examples = [Example(TEXT), Example(LONG)]
        short, long = explain(loaded, examples, explainer=two, words="sum")
        ids = loaded.tokenizer(TEXT)["input_ids"]
        assert short.read == len(ids) and not short.truncated and short.truncation_note is None
        whole = len(loaded.tokenizer(LONG)["input_ids"])
        assert long.read == 128 < whole and long.truncated
        assert long.truncation_note == (
            f"{loaded.name} ({kind} tokenizer) read the first 128 of the text's {whole} tokens"
        )
    assert len(explain(llama, [Example(TEXT)], explainer=two, words="sum")[0].tokens) < len(
        llama.tokenizer(TEXT)["input_ids"]
    )  # the words are fewer than the tokens: what a count of words would take for truncation
    (heatmap,) = build_heatmaps(
        [llama, bert], [Example(TEXT)], settings, explainer=two, words="sum"
    )
    assert heatmap.metadata["truncated"] == "no"


def test_the_ig_gap_is_in_the_records_the_files_and_their_notes(models):
    llama, _ = models
    attribution = AttributionSettings(views="pred")
    four = ExplainerChoice("ig", {"steps": 4, "baseline": "pad"})
    (record,) = attribute_texts(
        llama.model, llama.tokenizer, [TEXT], settings=attribution, explainer=four
    )
    alone = llama.tokenizer(TEXT, return_tensors="pt")
    attributed, change = ig_completeness(
        llama.model, **alone, target=record.prediction, steps=4, baseline="pad"
    )
    expected = completeness_warning(float(attributed), float(change), "pad", True, 4)
    assert expected is not None and "use the baseline mean-keep-first" in expected
    assert record.warnings == [expected]
    settings = HeatmapSettings()
    (heatmap,) = build_heatmaps([llama], [Example(TEXT)], settings, explainer=four, words="sum")
    assert heatmap.metadata["warnings"] == f"llama: {expected}"
    notes = export_notes([heatmap], ExportSettings(formats="svg"))
    assert notes == [f"heatmap-000: llama: {expected}"]
    grad = ExplainerChoice("grad")
    (quiet,) = build_heatmaps([llama], [Example(TEXT)], settings, explainer=grad)
    assert quiet.metadata["warnings"] == "none"


def test_distillation_notes_say_whose_tokenizer_truncated(models, tiny_task_dir: Path, capsys):
    from kd.training.pipeline import _encode_all
    from workbench.core.config import DataConfig
    from workbench.core.data import load_task

    data = load_task(DataConfig(task=str(tiny_task_dir)))
    _encode_all(data, models[1].tokenizer, 4, "the student's")
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.endswith("by the student's WordPiece tokenizer") for line in lines)
    _encode_all(data, models[1].tokenizer, 4)
    assert all("tokenizer" not in line for line in capsys.readouterr().out.splitlines())


MARKERS = ("Ġ", "Ċ", "▁")
SPLIT = "Great crew, smooth flight\ndon't go"  # "don't": don 't (byte-level), don ' t (BERT)


def _svg_rows(svg: str) -> dict[float, dict[float, str]]:
    """The token cells of an SVG heatmap by the top of their box: ``{top: {centre x: text}}``."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    rows: dict[float, dict[float, str]] = {}
    for group in ET.fromstring(svg).iter(f"{ns}g"):
        rect, text = group.find(f"{ns}rect"), group.find(f"{ns}text")
        if group.get("class") == "token-cell":
            rows.setdefault(float(rect.get("y")), {})[float(text.get("x"))] = text.text
    return rows


def _latex_rows(tex: str) -> list[list[str]]:
    """The rows of a LaTeX heatmap in columns: each cell's word ("" for a blank cell)."""
    import re

    lines = [line for line in tex.splitlines() if line.endswith(r" \\")]
    return [
        [
            (re.search(r"\\textcolor\[RGB\]\{[\d,]+\}\{(.*)\}\}$", cell) or [None, ""])[1]
            for cell in line.removesuffix(r" \\").split(" & ")[1:]
        ]
        for line in lines
    ]


def test_words_of_two_tokenizers_stand_in_columns_without_markers(models, tmp_path):
    from kd.cli import main

    llama, bert = models
    out = tmp_path / "figure"
    arguments = ["export", llama.source, bert.source, "--text", SPLIT, "--words", "sum"]
    assert main([*arguments, "--steps", "2", "--formats", "svg,png,tex", "--out", str(out)]) == 0
    svg, tex = (out / "heatmap-000.svg").read_text(), (out / "heatmap-000.tex").read_text()
    assert (out / "heatmap-000.png").stat().st_size > 0  # drawn from the SVG's scene
    assert not any(marker in svg + tex for marker in MARKERS)
    assert '"truncated": "no"' in svg and "%   truncated: no" in tex
    teacher_words = ["Great", "crew", ",", "smooth", "flight", "↵", "don", "'t", "go"]
    student_words = ["Great", "crew", ",", "smooth", "flight", "don", "'", "t", "go"]
    teacher_row, student_row = _svg_rows(svg).values()
    by_word = [{text: x for x, text in row.items()} for row in (teacher_row, student_row)]
    assert [text for _, text in sorted(teacher_row.items())] == teacher_words
    assert [text for _, text in sorted(student_row.items())] == ["[CLS]", *student_words, "[SEP]"]
    shared = set(teacher_words) & set(student_words)
    for word in shared:  # one above the other
        assert by_word[0][word] == by_word[1][word]
    for word in set(teacher_words) ^ set(student_words):  # the other row blank there
        x = by_word[0].get(word, by_word[1].get(word))
        assert sum(x in row for row in (teacher_row, student_row)) == 1
    teacher_cells, student_cells = _latex_rows(tex)
    assert len(teacher_cells) == len(student_cells)
    assert [w for w in teacher_cells if w] == teacher_words
    assert [w for w in student_cells if w] == ["[CLS]", *student_words, "[SEP]"]
    for mine, theirs in zip(teacher_cells, student_cells, strict=True):
        assert mine == theirs or "" in (mine, theirs)


@pytest.mark.slow  # a Unigram tokenizer trained for it
def test_tokens_read_as_the_texts_characters(models, tmp_path):
    llama, bert = models
    grad = ExplainerChoice("grad")
    (explanation,) = explain(llama, [Example(SPLIT)], explainer=grad)
    assert not any(marker in token for token in explanation.tokens for marker in MARKERS)
    assert "".join(t for t in explanation.tokens if t not in "␣↵") == "".join(SPLIT.split())
    assert "↵" in explanation.tokens  # the line break, a token of its own, drawn visible
    unigram = save_family_model("xlm-roberta", tmp_path / "unigram", LABELS)
    loaded = load_model(str(unigram))
    raw = loaded.tokenizer.convert_ids_to_tokens(loaded.tokenizer(SPLIT)["input_ids"])
    assert any(token.startswith("▁") for token in raw)
    settings = AttributionSettings(views="pred")
    (record,) = attribute_texts(
        loaded.model, loaded.tokenizer, [SPLIT], settings=settings, explainer=grad
    )
    assert record.tokens[0] == "<s>" and record.tokens[-1] == "</s>"
    inner = record.tokens[1:-1]
    assert not any(marker in token for token in inner for marker in MARKERS)
    assert "".join(t for t in inner if t not in "␣↵") == "".join(SPLIT.split())
    (bert_record,) = attribute_texts(
        bert.model, bert.tokenizer, ["Playing"], settings=settings, explainer=grad
    )
    assert bert_record.tokens == bert.tokenizer.convert_ids_to_tokens(
        bert.tokenizer("Playing")["input_ids"]
    )  # WordPiece's tokens kept: ## marks a continuation


def test_rows_in_columns_are_one_table_in_the_html_and_the_app():
    import re

    from workbench.app.heatmap_view import heatmap_html
    from workbench.export import Heatmap, HeatmapRow, to_html

    rows = [
        HeatmapRow("teacher", ["", "don", "'t", "", ""], [None, 0.2, 0.5, None, None]),
        HeatmapRow("student", ["[CLS]", "don", "", "'", "t"], [0.1, 0.3, None, 0.4, 0.0]),
    ]
    for page in (to_html(Heatmap(rows, columns=True)), heatmap_html(Heatmap(rows, columns=True))):
        lines = re.findall(r"<tr><th class=.*?</tr>", page, re.S)  # the heatmap's rows
        assert len(lines) == 2 and page.count("<table") == 1 + page.count('class="settings"')
        assert [line.count("<td") for line in lines] == [5, 5]
        assert [line.count("<td></td>") for line in lines] == [3, 1]
        assert re.findall(r'data-score="([^"]+)"', lines[0]) == ["0.2", "0.5"]
    with pytest.raises(ValueError, match="as many cells"):
        Heatmap([rows[0], HeatmapRow("x", ["a"], [1.0])], columns=True)

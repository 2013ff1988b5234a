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
    settings = HeatmapSettings(steps=2)
    for loaded, kind in ((llama, "byte-level BPE"), (bert, "WordPiece")):
        short, long = explain(loaded, [Example(TEXT), Example(LONG)], settings, words="sum")
        ids = loaded.tokenizer(TEXT)["input_ids"]
        assert short.read == len(ids) and not short.truncated and short.truncation_note is None
        whole = len(loaded.tokenizer(LONG)["input_ids"])
        assert long.read == 128 < whole and long.truncated
        assert long.truncation_note == (
            f"{loaded.name} ({kind} tokenizer) read the first 128 of the text's {whole} tokens"
        )
    assert len(explain(llama, [Example(TEXT)], settings, words="sum")[0].tokens) < len(
        llama.tokenizer(TEXT)["input_ids"]
    )  # the words are fewer than the tokens: what a count of words would take for truncation
    (heatmap,) = build_heatmaps([llama, bert], [Example(TEXT)], settings, words="sum")
    assert heatmap.metadata["truncated"] == "no"


def test_the_ig_gap_is_in_the_records_the_files_and_their_notes(models):
    llama, _ = models
    attribution = AttributionSettings(views="pred", steps=4, baseline="pad")
    (record,) = attribute_texts(llama.model, llama.tokenizer, [TEXT], settings=attribution)
    alone = llama.tokenizer(TEXT, return_tensors="pt")
    attributed, change = ig_completeness(
        llama.model, **alone, target=record.prediction, steps=4, baseline="pad"
    )
    expected = completeness_warning(float(attributed), float(change), "pad", True, 4)
    assert expected is not None and "use the baseline mean-keep-first" in expected
    assert record.warnings == [expected]
    settings = HeatmapSettings(steps=4, baseline="pad")
    (heatmap,) = build_heatmaps([llama], [Example(TEXT)], settings, words="sum")
    assert heatmap.metadata["warnings"] == f"llama: {expected}"
    notes = export_notes([heatmap], ExportSettings(formats="svg"))
    assert notes == [f"heatmap-000: llama: {expected}"]
    (quiet,) = build_heatmaps([llama], [Example(TEXT)], HeatmapSettings(method="grad"))
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

"""A teacher and a student of different tokenizers compared on the words they share: the case
study's saliency loyalty and the split-level loyalty and attribution gap, against a direct
computation from each model's per-token scores and words found independently (whitespace)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import TEXTS_WITHOUT_PUNCTUATION as TEXTS
from tests.conftest import whitespace_words
from workbench.analysis.examples import Example
from workbench.analysis.explanation_agreement import agreement
from workbench.analysis.explanations import explain
from workbench.analysis.loyalty import agreement_per_example, split_outputs
from workbench.core.data import Split


def _per_word(scores, word_ids, words: int) -> np.ndarray:
    out = np.zeros(words)
    for score, word in zip(scores, word_ids, strict=True):
        if word >= 0:
            out[word] += score
    return out


def test_the_case_study_compares_two_tokenizers_on_words(two_tokenizers):
    teacher, student = two_tokenizers
    t, s = (explain(m, [Example(TEXTS[0])])[0] for m in two_tokenizers)
    assert t.tokens != s.tokens
    result = agreement(t, s)
    words = len(TEXTS[0].split())
    a = _per_word(t.saliency, whitespace_words(teacher, TEXTS[0]), words)
    b = _per_word(s.saliency, whitespace_words(student, TEXTS[0]), words)
    assert np.isclose(result.saliency_loyalty, np.corrcoef(a, b)[0, 1], atol=1e-6)
    assert f"compared on the {words} words both read" in result.notes[0]


def test_loyalty_over_a_split_compares_two_tokenizers_on_words(two_tokenizers):
    split = Split(texts=list(TEXTS), labels=[0, 2], uids=["a", "b"])
    outputs = [split_outputs(m, split, maps=True) for m in two_tokenizers]
    scores = agreement_per_example(*outputs)
    for row, text in enumerate(TEXTS):
        words = len(text.split())
        ids = [whitespace_words(m, text) for m in two_tokenizers]
        a, b = (
            _per_word(out.saliency[row, : len(i)].tolist(), i, words)
            for out, i in zip(outputs, ids, strict=True)
        )
        assert np.isclose(
            float(scores["saliency_loyalty"][row]), np.corrcoef(a, b)[0, 1], atol=1e-5
        )
        maps = []
        for out, i in zip(outputs, ids, strict=True):
            views = out.maps[row, :, : len(i)].numpy()
            summed = np.stack([_per_word(v, i, words) for v in views])
            maps.append(summed / np.linalg.norm(summed, axis=1, keepdims=True))
        gap = np.linalg.norm(maps[0] - maps[1])
        assert np.isclose(float(scores["attribution_gap"][row]), gap, atol=1e-5)
    same = agreement_per_example(outputs[0], outputs[0])  # one tokenizer: token by token
    torch.testing.assert_close(same["attribution_gap"], torch.zeros(2))


def test_the_loyalty_table_says_over_what_and_fills_the_teachers_row(two_tokenizers):
    from workbench.analysis.examples import split_examples
    from workbench.analysis.loyalty import loyalty_tables

    teacher = two_tokenizers[0]
    split = Split(texts=list(TEXTS), labels=[0, 2], uids=["a", "b"])
    outputs = [split_outputs(m, split) for m in two_tokenizers]
    summary, _ = loyalty_tables(
        teacher.spec,
        split_examples(split, teacher.spec),
        outputs[0],
        {"student": outputs[1], "twin": outputs[0]},
    )
    assert list(summary["SL over"]) == ["itself", "the words both share", "the same positions"]
    assert summary.loc["teacher", ["LL", "PL", "SL×100"]].tolist() == pytest.approx(
        [1.0, 1.0, 100.0], abs=1e-4
    )  # the teacher against itself: no gap in its row
    assert summary.loc["twin"].drop("SL over").tolist() == pytest.approx(
        summary.loc["teacher"].drop("SL over").tolist()
    )

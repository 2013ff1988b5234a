"""A teacher and a student of different tokenizers compared on the words they share: the case
study's saliency loyalty and the split-level loyalty and attribution gap, against a direct
computation from each model's per-token scores and words found independently (whitespace)."""

from __future__ import annotations

import numpy as np
import torch

from tests.conftest import TEXTS_WITHOUT_PUNCTUATION as TEXTS
from tests.conftest import whitespace_words
from workbench.analysis.examples import Example
from workbench.analysis.explanation_agreement import agreement
from workbench.analysis.explanations import HeatmapSettings, explain
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
    t, s = (explain(m, [Example(TEXTS[0])], HeatmapSettings())[0] for m in two_tokenizers)
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

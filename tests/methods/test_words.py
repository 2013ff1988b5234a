"""Per-token methods across tokenizers, on words: the alignment of two tokenisations, and the
word-level AD-KD and GKD terms checked against direct computations from the two models'
per-token maps and gradients and words found independently (whitespace, texts without
punctuation)."""

from __future__ import annotations

import pytest
import torch

from kd.methods.adkd import ADKDSettings
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from tests.conftest import TEXTS_WITHOUT_PUNCTUATION as TEXTS
from tests.conftest import whitespace_words, word_batches
from workbench.analysis.attribution import attribution_maps
from workbench.core.data.alignment import align, pool_words, token_spans, word_mask
from workbench.core.models import embeddings_module


def _spans(starts_ends, text, sequence=0):
    return token_spans(starts_ends, [sequence] * len(starts_ends), [text])


def test_words_are_the_spans_no_token_of_either_side_crosses():
    text = "so awful, really"
    # one side: "so" "awful" "," "really"; the other: "so" "aw" "ful," "re" "ally" (+ a special)
    one = _spans([(0, 2), (3, 8), (8, 9), (10, 16)], text)
    other = [None, *_spans([(0, 2), (2, 5), (5, 9), (9, 12), (12, 16)], text)]  # " aw": trimmed
    aligned = align(one, other)
    assert aligned.teacher == [0, 1, 1, 2]
    assert aligned.student == [-1, 0, 1, 1, 2, 2]
    assert (aligned.words, aligned.dropped) == (3, 0)


def test_a_word_one_side_lacks_or_cuts_is_left_out_of_both():
    text = "fine ☃ day today"
    one = _spans([(0, 4), (5, 6), (7, 10), (11, 16)], text)  # reads the snowman
    other = _spans([(0, 4), (7, 10), (11, 13)], text)  # drops it, truncated inside "today"
    aligned = align(one, other)
    assert aligned.teacher == [0, -1, 1, -1] and aligned.student == [0, 1, -1]
    assert (aligned.words, aligned.dropped) == (2, 2)


def test_pooling_sums_or_averages_each_words_tokens_and_masks_the_rest():
    ids = torch.tensor([[-1, 0, 0, 1, -1], [0, 1, 2, -1, -1]])
    values = torch.arange(10.0).reshape(2, 5, 1)
    assert pool_words(values, ids, "sum")[..., 0].tolist() == [[3.0, 3.0, 0.0], [5.0, 6.0, 7.0]]
    assert pool_words(values, ids, "mean")[..., 0].tolist() == [[1.5, 3.0, 0.0], [5.0, 6.0, 7.0]]
    assert word_mask(ids).tolist() == [[True, True, False], [True, True, True]]


def test_word_level_attribution_term_equals_a_direct_computation(two_tokenizers):
    teacher, student = two_tokenizers
    sides = {"teacher": teacher, "student": student}
    encoded, batches = word_batches(teacher, student, list(TEXTS))
    for name, side in sides.items():
        assert encoded[name].word_ids == [whitespace_words(side, text) for text in TEXTS]
    objective = Objective.resolve(ObjectiveConfig(preset="adkd"), 4, 4, 3, 32)
    fields = objective.teacher_batch(teacher.model, batches["teacher"])
    value = objective(student.model, batches["student"], fields)["attr"]

    def word_maps(name, top_k) -> list[torch.Tensor]:
        loaded, batch = sides[name], batches[name]
        maps = attribution_maps(
            loaded.model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            views="all",
            labels=batch["labels"],
            steps=objective.of(ADKDSettings).attr_steps,
            baseline=objective.of(ADKDSettings).attr_baseline,
            top_k=top_k,
        )  # [B, C, L]
        out = []
        for row, text in enumerate(TEXTS):
            ids = torch.tensor(whitespace_words(loaded, text))
            words = torch.stack(
                [maps[row, :, : len(ids)][:, ids == w].sum(-1) for w in range(len(text.split()))],
                -1,
            )
            out.append(words / words.norm(dim=-1, keepdim=True))  # [C, W]
        return out

    t_maps = word_maps("teacher", objective.of(ADKDSettings).attr_top_k)
    s_maps = word_maps("student", None)
    assert objective.of(ADKDSettings).attr_reduction == "official"  # Σ squared diffs / words
    squared = sum(((s - t) ** 2).sum() for s, t in zip(s_maps, t_maps, strict=True))
    expected = squared / sum(len(text.split()) for text in TEXTS)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-7)


def _embedding_gradients(loaded, batch) -> torch.Tensor:
    """``∂(Σ_b p_max,b)/∂e`` ``[B, L, d]`` at the embedding output, taken with a plain hook
    and autograd (independent of the workbench's gradient code)."""
    kept = []

    def keep(_module, _inputs, output):
        kept.append(output if torch.is_tensor(output) else output[0])

    handle = embeddings_module(loaded.model).register_forward_hook(keep)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    with torch.enable_grad():
        try:
            logits = loaded.model(**inputs).logits
        finally:
            handle.remove()
        (gradients,) = torch.autograd.grad(logits.softmax(-1).max(-1).values.sum(), kept[0])
    return gradients


def test_word_level_gradient_term_equals_a_direct_computation(two_tokenizers):
    """GKD across tokenizers: each model's token gradient norms summed per shared word and
    normalised over the words; the term is their squared difference over the real words."""
    teacher, student = two_tokenizers
    sides = {"teacher": teacher, "student": student}
    _, batches = word_batches(teacher, student, list(TEXTS))
    objective = Objective.resolve(ObjectiveConfig(preset="gkd"), 4, 4, 3, 32, words=True)
    fields = objective.teacher_batch(teacher.model, batches["teacher"])
    value = objective(student.model, batches["student"], fields)["grad"]

    def saliency(name) -> list[torch.Tensor]:
        norms = _embedding_gradients(sides[name], batches[name]).norm(dim=-1)  # [B, L]
        out = []
        for row, text in enumerate(TEXTS):
            ids = torch.tensor(whitespace_words(sides[name], text))
            words = torch.stack(
                [norms[row, : len(ids)][ids == w].sum() for w in range(len(text.split()))]
            )
            out.append(words / words.norm())
        return out

    pairs = zip(saliency("student"), saliency("teacher"), strict=True)
    squared = sum(((s - t) ** 2).sum() for s, t in pairs)
    expected = squared / sum(len(text.split()) for text in TEXTS)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-7)


LONG = "supercalifragilisticexpialidocious" * 3  # cut inside by either side's truncation


def test_a_batch_whose_texts_share_no_word_gives_finite_word_terms_of_zero(two_tokenizers):
    """Texts of long words that truncation cuts at other places on each side share no word: the
    word terms of CKD, AD-KD and GKD leave them out (0, finite gradients), never a traceback or a
    NaN that would read as a diverged training; such examples are counted."""
    from kd.training.distributed import unit_counts, unit_shares

    teacher, student = two_tokenizers
    _, batches = word_batches(teacher, student, [LONG, LONG + "x"], max_length=8)
    assert all(i == -1 for i in batches["student"]["word_ids"].flatten().tolist())
    for preset, term in (("ckd", "wr"), ("adkd", "attr"), ("gkd", "grad")):
        objective = Objective.resolve(ObjectiveConfig(preset=preset), 4, 4, 3, 32)
        fields = objective.teacher_batch(teacher.model, batches["teacher"])
        student.model.zero_grad()
        values = objective(student.model, batches["student"], fields)
        assert float(values[term].detach()) == 0.0, preset
        values["loss"].backward()
        grads = [p.grad for p in student.model.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads), preset
    count = unit_counts(batches["student"])
    assert count.tolist() == [2.0, 0.0, 0.0]  # two examples, no shared word, none with one
    assert unit_shares(count, count, [0, 1, 2]) == [1.0, 0.0, 0.0]  # not 0/0


@pytest.mark.parametrize("reduction", ["paper", "squared", "official"])
def test_an_example_that_shares_no_word_is_left_out_of_the_word_terms(reduction, two_tokenizers):
    """AD-KD's distances across tokenizers average over the examples that share a word (per
    example, "paper" and "squared"; per word, "official"): a batch holding an example that
    shares none gives the term of the batch without it, and a batch split in parts, one of
    them holding that example, is its parts weighted by their shares of the term's unit."""
    from kd.training.distributed import unit_counts, unit_index

    teacher, student = two_tokenizers
    texts = ["good movie today", "bad day for a flight", "the crew was great"]
    config = ObjectiveConfig(preset="adkd").with_settings(attr_reduction=reduction)
    objective = Objective.resolve(config, 4, 4, 3, 32)
    unit = unit_index(objective.term_units()["attr"])

    def value_and_count(part: list[str]) -> tuple[torch.Tensor, float]:
        _, batches = word_batches(teacher, student, part, max_length=8)
        fields = objective.teacher_batch(teacher.model, batches["teacher"])
        value = objective(student.model, batches["student"], fields)["attr"].detach()
        return value, float(unit_counts(batches["student"])[unit])

    without, _ = value_and_count(texts)
    assert float(without) > 0
    whole, _ = value_and_count([texts[0], LONG, *texts[1:]])
    torch.testing.assert_close(whole, without, rtol=1e-5, atol=1e-7)
    parts = [value_and_count([texts[0], LONG]), value_and_count(texts[1:])]
    total = sum(count for _, count in parts)
    combined = sum(value * count / total for value, count in parts)
    torch.testing.assert_close(combined, whole, rtol=1e-5, atol=1e-7)


def test_examples_without_a_shared_word_are_counted(two_tokenizers):
    from workbench.core.data import Split, encode, share_words

    teacher, student = two_tokenizers
    texts = ["good movie today", LONG, "bad day"]
    split = Split(texts=texts, labels=[0, 1, 2], uids=texts)
    sides = [(encode(split, m.tokenizer, 8), m.tokenizer) for m in (teacher, student)]
    words, _, wordless = share_words(split, *sides, 8)
    assert wordless == 1 and words > 0
    assert sides[1][0].word_ids[1] == [-1] * len(sides[1][0].word_ids[1])

"""Saliency per word over a split, and saliency loyalty only where teacher and student read the
same positions."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import pearsonr

from tests.analysis.test_explainers import _tokenizer
from tests.conftest import write_tiny_runs
from tests.tolerances import assert_close_to_scale
from workbench.analysis.loyalty import (
    SplitOutputs,
    saliency_loyalties,
    split_outputs,
    word_saliency,
)
from workbench.core.data import Split, load_task, sample_split
from workbench.core.models import load_model


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("loyalty")
    write_tiny_runs(work)
    return work


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("sum", [[1.0, 5.0, -4.0, 18.0, 8.0, 9.0], [1.0, -2.0, 3.0, 4.0, 0.0, 0.0]]),
        ("max-abs", [[1.0, 3.0, 4.0, 7.0, 8.0, 9.0], [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]]),
    ],
)
def test_word_saliency_of_a_split_as_computed_by_hand(how, expected):
    """[CLS] play ##ing the un ##believ ##able movie [SEP] and [CLS] good movie [SEP]: the
    pieces of "playing" and "unbelievable" gathered, special tokens a word each."""
    loaded = SimpleNamespace(tokenizer=_tokenizer(), max_length=16)
    split = Split(["playing the unbelievable movie", "good movie"], [0, 1], ["a", "b"])
    saliency = torch.zeros(2, 9)
    saliency[0] = torch.tensor([1.0, 2, 3, -4, 5, 6, 7, 8, 9])
    saliency[1, :4] = torch.tensor([1.0, -2, 3, 4])
    scores, mask, spans = word_saliency(loaded, split, saliency, how)
    assert scores.tolist() == expected
    assert mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    # each word's characters (for comparisons across tokenizers); special tokens have none
    assert spans == [
        [None, (0, 0, 7), (0, 8, 11), (0, 12, 24), (0, 25, 30), None],
        [None, (0, 0, 4), (0, 5, 10), None],
    ]


def test_a_split_scored_per_word_reads_each_whole_word_as_one(runs):
    """The tiny vocabulary holds whole words only, so words change nothing but the width."""
    teacher = load_model(str(runs / "teacher"))
    part = sample_split(load_task(teacher.data).splits["test"], 12, seed=0)
    tokens = split_outputs(teacher, part)
    words = split_outputs(teacher, part, words="sum")
    assert torch.equal(words.mask, tokens.mask[:, : words.mask.shape[1]])
    torch.testing.assert_close(
        words.saliency * words.mask, tokens.saliency[:, : words.mask.shape[1]]
    )


def test_saliency_loyalty_is_undefined_where_the_positions_differ():
    """A text both models read in 4 positions is compared; one the student reads in 3 (another
    tokenizer's split) is NaN, not a comparison of misaligned positions."""
    teacher = SplitOutputs(
        torch.zeros(2, 3),
        torch.tensor([[0.1, 0.5, 0.2, 0.9], [0.3, 0.1, 0.4, 0.2]]),
        torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1]]),
    )
    student = SplitOutputs(
        torch.zeros(2, 3), torch.tensor([[0.2, 0.4, 0.1, 0.7], [0.3, 0.2, 0.1, 0.0]]), teacher.mask
    )
    student.mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    loyalty = saliency_loyalties(teacher, student)
    expected = pearsonr([0.1, 0.5, 0.2, 0.9], [0.2, 0.4, 0.1, 0.7]).statistic
    assert float(loyalty[0]) == pytest.approx(expected, abs=1e-6)
    assert math.isnan(float(loyalty[1]))
    narrower = SplitOutputs(student.logits, student.saliency[:, :3], student.mask[:, :3])
    assert math.isnan(float(saliency_loyalties(teacher, narrower)[0]))  # 4 positions against 3


@pytest.mark.parametrize("model_type", ["bert", "mpnet", "llama"])
def test_the_saliency_loyalty_reads_is_captums_input_x_gradient(model_type, tmp_path):
    """The saliency each model of the loyalty tables gives (an encoder of BERT's or MPNet's
    family, a decoder of Llama's) is Captum's gradient × activation of the embedding output
    for the predicted class's probability, called directly on each text alone; a model's
    saliency loyalty to itself is 1."""
    from captum.attr import LayerGradientXActivation

    from tests.tiny_families import save_family_model
    from workbench.core.models import embeddings_module

    folder = save_family_model(model_type, tmp_path / model_type, ["a", "b", "c"], seed=3)
    loaded = load_model(str(folder))
    texts = ["good movie but sad story", "awful", "a fine day and a long night"]
    split = Split(texts=texts, labels=[0, 1, 2], uids=["u0", "u1", "u2"])
    outputs = split_outputs(loaded, split, batch_size=2)
    model = loaded.model

    def probabilities(ids, mask):
        return model(input_ids=ids, attention_mask=mask).logits.softmax(-1)

    for row, text in enumerate(texts):
        alone = loaded.tokenizer(text, return_tensors="pt")
        ids, mask = alone["input_ids"], alone["attention_mask"]
        target = int(outputs.logits[row].argmax())
        theirs = LayerGradientXActivation(probabilities, embeddings_module(model)).attribute(
            ids, target=target, additional_forward_args=(mask,)
        )
        ours = outputs.saliency[row][outputs.mask[row].bool()]
        # batched with padding against alone, and Σ_d over terms that cancel: float32 rounding
        # of terms up to ten times the largest sum
        terms = theirs[0].abs().sum(-1)
        assert_close_to_scale(ours, theirs.sum(-1)[0], 1e-5, operands=(10 * terms,))
    itself = saliency_loyalties(outputs, outputs)
    assert itself.tolist() == pytest.approx([1.0] * len(texts), abs=1e-6)

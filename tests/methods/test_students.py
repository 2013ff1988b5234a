"""How students are built from a teacher: the layers a cut student keeps, the cut student
itself, frozen embeddings and a narrower random student, on tiny random BERTs."""

from __future__ import annotations

import pytest
import torch

from kd.methods.layer_map import select_layers
from kd.methods.students import cut_student, random_student, set_embeddings_trainable
from tests.conftest import id_batch, tiny_model
from workbench.core.errors import WorkbenchError
from workbench.core.models import embed, embeddings_module, encoder_layers, forward


@pytest.mark.parametrize(
    ("n", "m", "strategy", "expected"),
    [
        (12, 6, "skip", [1, 3, 5, 7, 9, 11]),
        (6, 3, "skip", [1, 3, 5]),
        (6, 3, "first", [0, 1, 2]),
        (6, 3, "last", [3, 4, 5]),
        (6, 2, "0,5", [0, 5]),
    ],
)
def test_select_layers(n, m, strategy, expected):
    assert select_layers(n, m, strategy) == expected


@pytest.mark.parametrize("strategy", ["1,1", "0,9", "x,y"])
def test_select_layers_rejects_bad_lists(strategy):
    with pytest.raises(WorkbenchError):
        select_layers(6, 2, strategy)


def test_cut_student_copies_the_chosen_layers_and_runs_like_them():
    teacher = tiny_model(layers=4)
    student = cut_student(teacher, [1, 3]).eval()
    assert len(encoder_layers(student)) == 2
    for s_index, t_index in enumerate([1, 3]):
        for (name, p_s), (_, p_t) in zip(
            encoder_layers(student)[s_index].named_parameters(),
            encoder_layers(teacher)[t_index].named_parameters(),
            strict=True,
        ):
            assert torch.equal(p_s, p_t), name
    batch = id_batch([[2, 7, 8, 9, 3], [2, 10, 3]])
    # run the teacher's embeddings → layer 1 → layer 3 → pooler → classifier by hand
    keep = batch["attention_mask"][:, None, None, :].bool()
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with torch.no_grad():
        hidden = embed(teacher, batch)
        for index in (1, 3):
            hidden = encoder_layers(teacher)[index](hidden, attention_mask=mask)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        expected = teacher.classifier(teacher.bert.pooler(hidden))
        got = forward(student, batch).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4


def test_frozen_embeddings_get_no_gradient():
    student = cut_student(tiny_model(), [0, 2])
    set_embeddings_trainable(student, False)
    out = forward(student, id_batch([[2, 7, 8, 3]]))
    out.logits.sum().backward()
    assert all(p.grad is None for p in embeddings_module(student).parameters())
    assert all(p.grad is not None for p in encoder_layers(student).parameters())


def test_random_student_can_be_narrower():
    teacher = tiny_model(hidden=16)
    student = random_student(teacher.config, num_layers=2, hidden_size=8, num_heads=2)
    out = forward(student, id_batch([[2, 7, 3]]), hidden_states=True)
    assert out.hidden_states[0].shape == (1, 3, 8) and len(out.hidden_states) == 3
    assert student.config.vocab_size == teacher.config.vocab_size
    with pytest.raises(WorkbenchError, match="not divisible"):
        random_student(teacher.config, 2, hidden_size=9, num_heads=2)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_head_counts_that_do_not_divide_the_width_are_refused_before_training(family, tmp_path):
    """A Llama student of 3 heads over a width of 32 builds (its head width rounds down) and
    trains, and only save_pretrained, at the end, refuses it: it is refused when it is built,
    for every family, in one line."""
    from transformers import AutoConfig

    from tests.tiny_families import save_family_model

    folder = save_family_model(family, tmp_path / family, ["a", "b", "c"])
    config = AutoConfig.from_pretrained(folder)
    width = config.hidden_size
    with pytest.raises(WorkbenchError) as raised:
        random_student(config, 1, num_heads=3)
    assert str(raised.value) == (
        f"hidden size {width} is not divisible by 3 heads: choose --num-heads and --hidden-size "
        "so that the heads divide the width"
    )
    student = random_student(config, 1, num_heads=4)  # a count that divides it: saved as built
    student.save_pretrained(tmp_path / "student")
    assert AutoConfig.from_pretrained(tmp_path / "student").num_attention_heads == 4

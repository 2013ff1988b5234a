"""AD-KD, GKD, GKD-CLS and CKD wired into the objective: values equal the pure functions applied
to independently computed inputs, cached teacher fields equal live ones, GKD's student set-up."""

from __future__ import annotations

import itertools

import pytest
import torch

from kd.methods.adkd import ADKDSettings, attribution_loss, sampled_view_loss
from kd.methods.ckd import layer_relation_loss, relation_pairs, word_relation_loss
from kd.methods.config import ObjectiveConfig
from kd.methods.gkd import gradient_alignment_loss, prepare_gradient_student, state_gradients
from kd.methods.objective import Objective
from kd.methods.pkd import mapped_pairs
from kd.methods.students import cut_student, random_student
from tests.conftest import tiny_model
from workbench.analysis.attribution.gradients import attribution_maps, input_gradients
from workbench.core.cache import ExampleCache
from workbench.core.data import EncodedSplit, batches
from workbench.core.errors import WorkbenchError
from workbench.core.models import embeddings_module, forward
from workbench.core.parts import parts_of


def _dataset(count: int = 12, seed: int = 0) -> EncodedSplit:
    generator = torch.Generator().manual_seed(seed)
    ids = [
        [2, *torch.randint(5, 40, (int(n),), generator=generator).tolist(), 3]
        for n in torch.randint(2, 9, (count,), generator=generator)
    ]
    return EncodedSplit(
        ids, [[0] * len(i) for i in ids], torch.randint(0, 3, (count,), generator=generator), 0
    )


def _setup(preset: str, **options):
    teacher = tiny_model(layers=4).requires_grad_(False)
    student = cut_student(teacher, [1, 3]).eval()
    objective = Objective.resolve(
        ObjectiveConfig(preset=preset).with_settings(**options), 4, 2, num_labels=3
    )
    batch = next(batches(_dataset(), list(range(6)), 6, 0))
    return teacher, student, objective, batch


@pytest.mark.parametrize(
    ("chosen", "reduction"), [(None, "official"), ("paper", "paper"), ("squared", "squared")]
)
def test_adkd_term_equals_the_loss_of_independent_maps(chosen, reduction):
    """The preset computes the authors' distance (its β grid belongs to it); Eq. 9 on request."""
    teacher, student, objective, batch = _setup("adkd", attr_top_k=8, attr_reduction=chosen)
    assert objective.of(ADKDSettings).attr_reduction == reduction
    values = objective(student, batch, objective.teacher_batch(teacher, batch))
    inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    teacher_maps = attribution_maps(teacher, *inputs, views="all", top_k=8)
    student_maps = attribution_maps(student, *inputs, views="all", create_graph=True)
    expected = attribution_loss(
        student_maps, teacher_maps, batch["attention_mask"], reduction=reduction
    )
    torch.testing.assert_close(values["attr"], expected)
    values["loss"].backward()
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in student.bert.encoder.parameters()
    )


def test_adkd_pred_view_uses_the_teachers_class_for_both_models():
    teacher, student, objective, batch = _setup("adkd", attr_views="pred")
    fields = objective.teacher_batch(teacher, batch)
    classes = fields["logits"].argmax(-1)
    inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    expected = attribution_loss(
        attribution_maps(student, *inputs, views="gold", labels=classes, create_graph=True),
        attribution_maps(teacher, *inputs, views="pred"),
        batch["attention_mask"],
        reduction="official",
    )
    torch.testing.assert_close(objective(student, batch, fields)["attr"], expected)


def test_gkd_terms_equal_direct_gradients():
    teacher, student, objective, batch = _setup("gkd-cls")
    fields = objective.teacher_batch(teacher, batch)
    values = objective(student, batch, fields)
    grads_s = input_gradients(student, batch, create_graph=True)
    grads_t = input_gradients(teacher, batch)
    torch.testing.assert_close(
        values["grad"], gradient_alignment_loss(grads_s, grads_t, batch["attention_mask"])
    )
    # [CLS]-state gradients against a plain autograd computation on a grad-enabled copy
    copy = tiny_model(layers=4)
    out = forward(copy, batch, hidden_states=True)
    signal = out.logits.softmax(-1).max(-1).values.sum()
    direct = torch.autograd.grad(signal, [out.hidden_states[2]])[0][:, 0]
    torch.testing.assert_close(fields["cls_grads"][:, 0], direct)
    torch.testing.assert_close(
        values["cls_grad"],
        gradient_alignment_loss(state_gradients(student, batch, [1], True), fields["cls_grads"]),
    )


def test_ckd_terms_use_the_uniform_mapping_with_embeddings():
    teacher, student, objective, batch = _setup("ckd")
    assert relation_pairs(objective) == [(0, 0), (1, 2), (2, 4)]
    assert objective.live_fields() == ["relation_states"]
    fields = objective.teacher_batch(teacher, batch)
    values = objective(student, batch, fields)
    s = forward(student, batch, hidden_states=True).hidden_states
    t = forward(teacher, batch, hidden_states=True).hidden_states
    s_stack, t_stack = torch.stack(s, 1), torch.stack([t[0], t[2], t[4]], 1)
    mask = batch["attention_mask"]
    torch.testing.assert_close(values["wr"], word_relation_loss(s_stack, t_stack, mask))
    torch.testing.assert_close(values["ltr"], layer_relation_loss(s_stack, t_stack, mask))


@pytest.mark.parametrize("preset", ["adkd", "gkd", "gkd-cls", "pkd-skip"])
def test_cached_teacher_fields_equal_fresh_ones(preset):
    teacher, _, objective, _ = _setup(preset)
    dataset = _dataset(count=10, seed=3)
    cache = ExampleCache.compute(
        dataset,
        lambda b: objective.teacher_batch(teacher, b, objective.cached_fields()),
        per_token=objective.per_token_fields(),
        batch_size=4,
    )
    batch = next(batches(dataset, [9, 2, 5, 0, 7], 5, 0))  # other order, other padding
    fresh = objective.teacher_batch(teacher, batch, objective.cached_fields())
    for name, value in fresh.items():
        per_token = name in objective.per_token_fields()
        if per_token:
            value = value * batch["attention_mask"].reshape(5, -1, *[1] * (value.dim() - 2))
        gathered = cache.gather(name, batch["index"], batch["input_ids"].shape[1])
        torch.testing.assert_close(gathered, value.detach(), atol=1e-5, rtol=1e-4)


def test_two_classes_attribute_one_view_official_uses_gold_and_zero_baseline():
    objective = Objective.resolve(ObjectiveConfig(preset="adkd", parity="official"), 4, 2, 2)
    official = objective.of(ADKDSettings)
    assert official.attr_views == "gold" and official.attr_baseline == "zero"
    assert objective.kd_form == "soft-ce" and objective.temperature == 2.0
    paper = Objective.resolve(ObjectiveConfig(preset="adkd"), 4, 2, 3)
    assert paper.of(ADKDSettings).attr_views == "all"
    assert paper.of(ADKDSettings).attr_baseline == "pad"
    # an explicit choice is honoured, never silently replaced by the official default
    chosen = ObjectiveConfig(preset="adkd", parity="official").with_settings(attr_views="all")
    assert Objective.resolve(chosen, 4, 2, 2).of(ADKDSettings).attr_views == "all"
    assert chosen.of(ADKDSettings).attr_baseline is None  # the config keeps what was given


def test_view_sampling_expectation_is_the_multi_view_squared_loss():
    """Enumerate every assignment of classes to the examples of a batch: the mean of the sampled
    loss over them equals the multi-view squared loss (both reductions)."""
    teacher, student, _, batch = _setup("adkd", attr_views="sample")
    batch = {k: v[:3] for k, v in batch.items()}
    inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    mask = batch["attention_mask"]
    teacher_maps = attribution_maps(teacher, *inputs, views="all")
    student_all = attribution_maps(student, *inputs, views="all")
    per_class = [attribution_maps(student, *inputs, views=c) for c in range(3)]  # [B, 1, L]
    for reduction in ("squared", "official"):
        losses = []
        for assignment in itertools.product(range(3), repeat=3):
            classes = torch.tensor(assignment)
            student_maps = torch.stack([per_class[c][b] for b, c in enumerate(assignment)])
            losses.append(
                sampled_view_loss(student_maps, teacher_maps, classes, mask, 3, reduction)
            )
        expected = attribution_loss(student_all, teacher_maps, mask, reduction=reduction)
        # a mean of 27 float32 losses: tens of units of rounding apart from the direct one
        torch.testing.assert_close(torch.stack(losses).mean(), expected, rtol=1e-5, atol=1e-7)


def test_view_sampling_term_attributes_the_drawn_classes():
    teacher, student, objective, batch = _setup("adkd", attr_views="sample")
    fields = objective.teacher_batch(teacher, batch)
    assert fields["maps"].shape[-1] == 3  # the teacher's maps keep every class
    torch.manual_seed(7)
    values = objective(student, batch, fields)
    torch.manual_seed(7)
    classes = torch.randint(3, (batch["input_ids"].shape[0],))
    inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    student_maps = attribution_maps(
        student, *inputs, views="gold", labels=classes, create_graph=True
    )
    assert objective.of(ADKDSettings).attr_reduction == "official"  # the preset's distance
    expected = sampled_view_loss(
        student_maps,
        fields["maps"].transpose(1, 2),
        classes,
        batch["attention_mask"],
        3,
        reduction="official",
    )
    torch.testing.assert_close(values["attr"], expected, rtol=1e-5, atol=0)


def test_gradient_student_setup():
    teacher = tiny_model(layers=4)
    student = random_student(teacher.config, num_layers=2)
    prepare_gradient_student(teacher, student)
    for (name, p_t), p_s in zip(
        embeddings_module(teacher).named_parameters(),
        embeddings_module(student).parameters(),
        strict=True,
    ):
        assert torch.equal(p_t, p_s) and not p_s.requires_grad, name
    assert all(m.p == 0 for m in student.modules() if isinstance(m, torch.nn.Dropout))
    student.train()
    batch = next(batches(_dataset(), [0, 1], 2, 0))
    torch.testing.assert_close(forward(student, batch).logits, forward(student, batch).logits)
    kept = random_student(teacher.config, num_layers=2)
    prepare_gradient_student(teacher, kept, dropout=True)
    assert any(m.p > 0 for m in kept.modules() if isinstance(m, torch.nn.Dropout))
    own = random_student(teacher.config, num_layers=2)  # another tokenizer's: its own, trained
    before = [p.detach().clone() for p in embeddings_module(own).parameters()]
    prepare_gradient_student(teacher, own, same_tokens=False)
    for p_before, p_own in zip(before, embeddings_module(own).parameters(), strict=True):
        assert torch.equal(p_before, p_own) and p_own.requires_grad
    assert all(m.p == 0 for m in own.modules() if isinstance(m, torch.nn.Dropout))


def test_gradient_terms_need_the_teachers_width_where_they_compare_one_space():
    """Gradients w.r.t. one token's embedding (same tokenizer) or w.r.t. the states the heads
    read (GKD-CLS) live in the two models' spaces: a student of another width is refused when
    the objective resolves; across tokenizers GKD compares per-word saliencies, of any width."""
    narrow = {"student_width": 8}
    with pytest.raises(WorkbenchError, match="embedding width 16, not 8"):
        Objective.resolve(ObjectiveConfig(preset="gkd"), 4, 2, 3, 16, **narrow)
    for words in (False, True):
        with pytest.raises(WorkbenchError, match=r"GKD-CLS .* hidden size 16, not 8"):
            Objective.resolve(ObjectiveConfig(preset="gkd-cls"), 4, 2, 3, 16, **narrow, words=words)
    across = Objective.resolve(ObjectiveConfig(preset="gkd"), 4, 2, 3, 16, **narrow, words=True)
    assert across.record()["student_embeddings"] == "own"
    same = Objective.resolve(ObjectiveConfig(preset="gkd"), 4, 2, 3, 16).record()
    assert "student_embeddings" not in same  # the teacher's, frozen: as a run always recorded


@pytest.mark.parametrize("preset", ["adkd", "gkd"])
def test_objective_equals_the_straightforward_authors_form(preset):
    from bench.reference import authors_step_loss

    teacher, student, objective, batch = _setup(preset)
    student = cut_student(teacher, [1, 3]).eval()
    if preset == "gkd":
        prepare_gradient_student(teacher, student)
    ours = objective(student, batch, objective.teacher_batch(teacher, batch))
    reference = authors_step_loss(preset, teacher, student, batch, objective)
    for name in reference:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("preset", "forwards"), [("adkd", 1), ("gkd", 1), ("kd", 1), ("gkd-cls", 3)]
)
def test_gradient_terms_share_the_students_forward_pass(preset, forwards):
    teacher, student, objective, batch = _setup(preset)
    fields = objective.teacher_batch(teacher, batch)
    parts_of(student)  # found once per model, by a probe forward pass of its own
    calls = []
    handle = student.classifier.register_forward_hook(lambda *_: calls.append(1))
    objective(student, batch, fields)
    handle.remove()
    assert len(calls) == forwards  # gkd-cls: input gradients, [CLS]-state gradients, PKD states


def test_a_student_of_another_width_compares_its_states_through_a_trained_projection():
    """PKD between widths: one bias-free map from the student's width to the teacher's, shared
    by the mapped layers, recorded and trained by the term; at equal widths there is none."""
    teacher = tiny_model(layers=4).requires_grad_(False)
    student = random_student(teacher.config, num_layers=2, hidden_size=8, num_heads=2).eval()
    config = ObjectiveConfig(preset="pkd-skip")
    objective = Objective.resolve(config, 4, 2, 3, 16, student_width=8)
    projection = objective.modules["pkd"]
    assert projection.weight.shape == (16, 8) and projection.bias is None
    assert objective.record()["pkd_projection"] == {"student": 8, "teacher": 16}
    batch = next(batches(_dataset(), list(range(6)), 6, 0))
    values = objective(student, batch, objective.teacher_batch(teacher, batch))

    student_states = forward(student, batch, hidden_states=True).hidden_states
    teacher_states = forward(teacher, batch, hidden_states=True).hidden_states
    expected = 0.0
    for s, t in mapped_pairs(objective):  # the paper's form: Σ over layers and dims, batch mean
        mapped = student_states[s][:, 0] @ projection.weight.T  # [B, 16]
        unit_s = mapped / mapped.norm(dim=-1, keepdim=True)
        unit_t = teacher_states[t][:, 0] / teacher_states[t][:, 0].norm(dim=-1, keepdim=True)
        expected = expected + (unit_s - unit_t).pow(2).sum(-1).mean()
    torch.testing.assert_close(values["pkd"], expected)
    values["loss"].backward()
    assert projection.weight.grad.abs().sum() > 0

    same = Objective.resolve(config, 4, 2, 3, 16, student_width=16)
    assert not len(same.modules) and "pkd_projection" not in same.record()

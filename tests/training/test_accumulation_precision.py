"""Gradient accumulation gives the step of the whole batch; bf16 autocast (on CPU here) keeps
the losses, attribution maps and double-backward gradients of AD-KD and GKD close to float32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kd.methods.adkd import ADKDSettings, attribution_views
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import TERMS, Objective
from kd.methods.students import cut_student, disable_dropout
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.distributed import unit_counts, unit_index
from kd.training.pipeline import distill, train_teacher
from tests.conftest import (
    assert_same_weights,
    make_sentences,
    tiny_model,
    tiny_tokenizer,
    word_batches,
)
from tests.tolerances import float32_floor
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError

BF16_EPS = 2**-8  # bfloat16 keeps 8 significant bits: one unit of its last place, relatively


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """A tiny BERT without dropout (so that micro-batches draw no other masks than the whole
    batch) and 40 training sentences."""
    folder = tmp_path_factory.mktemp("accumulation")
    tokenizer = tiny_tokenizer(folder / "model")
    model = tiny_model()
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "task").mkdir()
    frame = make_sentences(80, seed=5)
    frame.iloc[:40].to_csv(folder / "task" / "train.csv", index=False)
    frame.iloc[40:60].to_csv(folder / "task" / "dev.csv", index=False)
    frame.iloc[60:].to_csv(folder / "task" / "test.csv", index=False)
    return folder


def _optim(**changes) -> OptimConfig:
    values = dict(epochs=1.0, batch_size=12, learning_rate=1e-3, threads=1, warmup_ratio=0.0)
    return OptimConfig(**(values | changes))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.slow
def test_accumulated_micro_batches_make_the_step_of_the_batch(folders):
    """k micro-batches of B/k and one batch of B end with the same weights (40 = 3·12 + 4:
    the last batch splits unevenly), for a teacher (CE) and a GKD student, whose gradient term
    is a mean over real tokens rather than examples."""
    data = DataConfig(task=str(folders / "task"), max_length=16)
    teacher = TeacherConfig(model=str(folders / "model"))
    whole = train_teacher(data, teacher, _optim(epochs=2.0), folders / "teacher-1")
    for k in (2, 4):
        split = train_teacher(
            data, teacher, _optim(epochs=2.0, accumulation_steps=k), folders / f"teacher-{k}"
        )
        assert_same_weights(_weights(whole.path), _weights(split.path))
    # accumulation is how a step executes, not what it computes: the same run folder resumes
    optim = json.loads((split.path / "run.json").read_text())["configs"]["optim"]
    assert "accumulation_steps" not in optim and "precision" not in optim  # fp32: as before

    student = StudentConfig(teacher=str(whole.path), num_layers=2)
    runs = [
        distill(
            data,
            student,
            ObjectiveConfig(preset="gkd"),
            _optim(accumulation_steps=k, log_every=1),
            folders / f"gkd-{k}",
        )
        for k in (1, 3)
    ]
    assert_same_weights(_weights(runs[0].path), _weights(runs[1].path))
    logged = [run.metrics("train") for run in runs]
    measured = ("value/", "grad_norm/", "grad_share/")
    for one, three in zip(*logged, strict=True):  # the same terms measured, the same figures
        keys = {key for key in one if key.startswith(measured)}
        assert keys == {key for key in three if key.startswith(measured)}
        assert "grad_norm/total" in keys and any(k.startswith("grad_share/") for k in keys)
        for key in keys:
            # a term near 0 (KD between near-equal distributions) carries the rounding of the
            # figures of its family (the loss values, ~1): float32's, not a relative bound's
            family = [one[k] for k in keys if k.startswith(key.split("/")[0])]
            floor = float32_floor(*family)
            assert three[key] == pytest.approx(one[key], rel=1e-5, abs=floor), key


def test_accumulation_must_divide_the_batch(folders, tmp_path):
    with pytest.raises(WorkbenchError, match="--batch-size 12 does not split into 1 process"):
        train_teacher(
            DataConfig(task=str(folders / "task")),
            TeacherConfig(model=str(folders / "model")),
            _optim(accumulation_steps=5),
            tmp_path / "run",
        )


@pytest.mark.parametrize("preset", ["adkd", "gkd"])
def test_bf16_autocast_keeps_attribution_and_double_backward_sound(preset, tmp_path):
    """The student's loss terms, AD-KD maps and parameter gradients (through
    ``autograd.grad(create_graph=True)``) under CPU bf16 autocast against float32. The model
    returns float32 logits under autocast: with bf16 logits the KD term of nearly equal
    distributions read 0.07 instead of 0 (τ² times bf16's rounding of log-probabilities)."""
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    texts = list(make_sentences(8, seed=2).text)
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    batch["labels"] = torch.arange(len(texts)) % 3
    teacher = tiny_model().requires_grad_(False)
    student = cut_student(teacher, [0, 2])
    disable_dropout(student)
    objective = Objective.resolve(ObjectiveConfig(preset=preset), 4, 2, 3)
    attribution = Objective.resolve(ObjectiveConfig(preset="adkd"), 4, 2, 3)  # AD-KD's maps
    fields = objective.teacher_batch(teacher, batch)
    parameters = [p for p in student.parameters() if p.requires_grad]
    results = {}
    for precision in ("fp32", "bf16"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            losses = objective(student, batch, fields)
            settings = attribution.of(ADKDSettings)
            maps, _ = attribution_views(settings, student, batch, None, False)
        grads = torch.autograd.grad(losses["loss"], parameters, allow_unused=True)
        flat = torch.cat(
            [
                (g if g is not None else torch.zeros_like(p)).flatten()
                for g, p in zip(grads, parameters, strict=True)
            ]
        )
        results[precision] = {k: v.detach() for k, v in losses.items()}, maps.detach(), flat
    (exact, exact_maps, exact_grad), (bf16, bf16_maps, bf16_grad) = results.values()
    for name, value in exact.items():
        assert bf16[name].dtype == torch.float32
        assert float(bf16[name]) == pytest.approx(float(value), rel=BF16_EPS, abs=1e-5), name
    assert bf16_maps.isfinite().all() and (bf16_maps - exact_maps).abs().max() < 2e-2
    assert bf16_grad.isfinite().all()
    cosine = float(bf16_grad @ exact_grad / (bf16_grad.norm() * exact_grad.norm()))
    assert cosine > 0.9995


def test_bf16_training_on_cpu_and_fp16_refused_there(folders, tmp_path):
    data = DataConfig(task=str(folders / "task"), max_length=16)
    teacher = TeacherConfig(model=str(folders / "model"))
    run = train_teacher(data, teacher, _optim(precision="bf16"), tmp_path / "bf16")
    weights = _weights(run.path)
    assert all(
        value.dtype == torch.float32 and value.isfinite().all() for value in weights.values()
    )
    assert (
        json.loads((run.path / "run.json").read_text())["configs"]["optim"]["precision"] == "bf16"
    )
    exact = _weights(train_teacher(data, teacher, _optim(), tmp_path / "fp32").path)
    # bf16 computes the steps (the weights differ) of the same training (by little)
    change = max(float((weights[k] - exact[k]).abs().max()) for k in exact)
    assert 0 < change < 2e-2, change
    with pytest.raises(WorkbenchError, match="--precision fp16 needs a CUDA device"):
        train_teacher(data, teacher, _optim(precision="fp16"), tmp_path / "fp16")


@pytest.mark.parametrize(
    "name, settings",
    [(name, "") for name in sorted(TERMS)] + [("attr", "official"), ("attr", "squared")],
)
def test_each_term_splits_into_shards_by_its_unit(name, settings, tmp_path):
    """The exactness of shards and micro-batches, term by term: a term's value on a batch is
    the sum of its values on two parts, each padded to its own longest text, weighted by the
    part's share of the term's unit (examples or real tokens, :meth:`Objective.term_units`). ``wr``
    (pairs and windowed triples, two counts at once) is the stated exception."""
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    frame = make_sentences(12, seed=4)
    texts = sorted(frame.text, key=len)  # the short and the long texts in different parts
    teacher = tiny_model().requires_grad_(False)
    student = cut_student(teacher, [1, 3])
    disable_dropout(student)
    config = ObjectiveConfig(preset="kd", weights={name: 1.0}).with_settings(
        attr_reduction=settings or None
    )
    objective = Objective.resolve(config, 4, 2, 3)
    unit = unit_index(objective.term_units()[name])

    def value_and_count(part: list[str]) -> tuple[float, float]:
        batch = dict(tokenizer(part, padding=True, return_tensors="pt"))
        batch["labels"] = torch.tensor([len(t) % 3 for t in part])
        fields = objective.teacher_batch(teacher, batch)
        return float(objective(student, batch, fields)[name].detach()), float(
            unit_counts(batch)[unit]
        )

    whole, _ = value_and_count(texts)
    parts = [value_and_count(texts[:5]), value_and_count(texts[5:])]
    total = sum(count for _, count in parts)
    combined = sum(value * count / total for value, count in parts)
    if not TERMS[name].exact_split:
        assert combined != pytest.approx(whole, rel=1e-4)
    else:
        assert combined == pytest.approx(whole, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("name", ["attr", "ltr", "grad"])
def test_word_terms_split_into_shards_by_the_shared_words(name, two_tokenizers):
    """Across tokenizers the per-token terms average over the words both tokenisations share:
    a batch's value is its parts' values weighted by their shares of those words."""
    teacher, student = two_tokenizers
    texts = sorted(make_sentences(12, seed=4).text, key=len)
    config = ObjectiveConfig(preset="kd", weights={name: 1.0}).with_settings(
        attr_reduction="official"
    )
    objective = Objective.resolve(config, 4, 4, 3, words=True)
    unit = unit_index(objective.term_units()[name])
    assert objective.term_units()[name] == "tokens"

    def value_and_count(part: list[str]) -> tuple[float, float]:
        _, batch = word_batches(teacher, student, part)
        fields = objective.teacher_batch(teacher.model, batch["teacher"])
        value = objective(student.model, batch["student"], fields)[name]
        return float(value.detach()), float(unit_counts(batch["student"])[unit])

    whole, _ = value_and_count(texts)
    parts = [value_and_count(texts[:5]), value_and_count(texts[5:])]
    total = sum(count for _, count in parts)
    combined = sum(value * count / total for value, count in parts)
    assert combined == pytest.approx(whole, rel=1e-5, abs=1e-9)

"""The objective (presets, weights, sum) and the teacher cache against live teacher outputs."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from tqdm.auto import tqdm

from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.methods.pkd import mapped_pairs, patient_loss
from kd.methods.students import cut_student
from kd.methods.vanilla import logit_kd_loss, task_loss
from tests.conftest import tiny_model, tiny_tokenizer
from workbench.core import cache as cache_module
from workbench.core.cache import ExampleCache, cached
from workbench.core.config import DataConfig
from workbench.core.data import batches, encode, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward


@pytest.fixture
def encoded_train(tiny_task_dir: Path, tmp_path: Path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    data = load_task(DataConfig(task=str(tiny_task_dir)))
    return encode(data.splits["train"], tokenizer, max_length=16)


def test_presets_and_explicit_weights():
    kd = Objective.resolve(ObjectiveConfig(preset="kd"), 4, 2)
    assert kd.weights == {"ce": 0.5, "kd": 0.5} and kd.kd_form == "kl"
    official = Objective.resolve(ObjectiveConfig(preset="pkd-last", parity="official"), 4, 2)
    assert official.kd_form == "kl-mean" and mapped_pairs(official) == [(1, 3)]
    assert official.weights["pkd"] == 500.0
    skip = Objective.resolve(ObjectiveConfig(preset="pkd-skip"), 6, 3)
    assert mapped_pairs(skip) == [(1, 2), (2, 4)] and skip.teacher_fields() == ["logits", "cls"]
    custom = Objective.resolve(ObjectiveConfig(weights={"ce": 0.1, "kd": 0.9, "pkd": 0}), 4, 2)
    assert custom.weights == {"ce": 0.1, "kd": 0.9} and custom.teacher_fields() == ["logits"]
    for bad, message in [
        ({"ce": 0.1, "foo": 1}, "unknown loss term 'foo'"),
        ({"kd": "x"}, "a mapping of terms to finite numbers ≥ 0"),
        ("kd=1", "a mapping of terms to finite numbers ≥ 0"),  # the text is the CLI's
        ({"ce": 0}, "no term with a non-zero weight"),
    ]:
        with pytest.raises(WorkbenchError, match=message):
            Objective.resolve(ObjectiveConfig(weights=bad), 4, 2)
    with pytest.raises(WorkbenchError, match="unknown method preset"):
        Objective.resolve(ObjectiveConfig(preset="tinybert"), 4, 2)


def test_objective_is_the_weighted_sum_of_the_pure_terms(encoded_train):
    teacher = tiny_model(layers=4)
    student = cut_student(teacher, [1, 3]).train()
    objective = Objective.resolve(ObjectiveConfig(preset="pkd-skip", temperature=2.0), 4, 2)
    batch = next(batches(encoded_train, list(range(8)), 8, 0))
    with torch.no_grad():
        teacher_values = objective.teacher_batch(teacher, batch)
    torch.manual_seed(0)
    values = objective(student, batch, teacher_values)
    torch.manual_seed(0)  # same dropout mask
    out = forward(student, batch, hidden_states=True)
    expected = {
        "ce": task_loss(out.logits, batch["labels"]),
        "kd": logit_kd_loss(out.logits, teacher_values["logits"], 2.0),
        "pkd": patient_loss(out.hidden_states[1][:, None, 0], teacher_values["cls"]),
    }
    for name, value in expected.items():
        torch.testing.assert_close(values[name], value)
    total = 0.5 * expected["ce"] + 0.5 * expected["kd"] + 1.0 * expected["pkd"]
    torch.testing.assert_close(values["loss"], total)
    values["loss"].backward()
    assert all(p.grad is None for p in teacher.parameters())


def test_cached_teacher_fields_equal_live_ones(encoded_train, tmp_path: Path):
    teacher = tiny_model(layers=4)
    objective = Objective.resolve(ObjectiveConfig(preset="pkd-skip"), 4, 2)
    key = {"teacher": "tiny", "fields": objective.teacher_fields()}
    cache = cached(
        tmp_path,
        "teacher-train",
        key,
        encoded_train,
        lambda b: objective.teacher_batch(teacher, b),
        batch_size=7,
    )
    reloaded = cached(
        tmp_path,
        "teacher-train",
        key,
        encoded_train,
        lambda b: pytest.fail("a cached key must not be recomputed"),
    )
    # live values for a batch in another order, padded to another length
    order = list(range(len(encoded_train)))[::-3][:16]
    batch = next(batches(encoded_train, order, 16, 0))
    with torch.no_grad():
        live = objective.teacher_batch(teacher, batch)
    for source in (cache, reloaded):
        for name in ("logits", "cls"):
            torch.testing.assert_close(
                source.gather(name, batch["index"]), live[name], atol=1e-5, rtol=1e-5
            )
    other = cached(
        tmp_path,
        "teacher-train",
        {**key, "fields": ["logits"]},
        encoded_train,
        lambda b: {"logits": objective.teacher_batch(teacher, b, ["logits"])["logits"]},
    )
    assert "cls" not in other.per_example
    assert len(list(tmp_path.glob("teacher-train-*.safetensors"))) == 2


def test_per_token_fields_are_stored_unpadded(encoded_train):
    teacher = tiny_model()

    def hidden(batch):
        return {"last": forward(teacher, batch, hidden_states=True).hidden_states[-1]}

    cache = ExampleCache.compute(encoded_train, hidden, per_token=["last"], batch_size=5)
    order = [3, 0, 11, 7]
    batch = next(batches(encoded_train, order, 4, 0))
    with torch.no_grad():
        live = hidden(batch)["last"] * batch["attention_mask"][..., None]
    gathered = cache.gather("last", batch["index"], batch["input_ids"].shape[1])
    torch.testing.assert_close(gathered, live, atol=1e-5, rtol=1e-5)
    assert cache.example("last", 3).shape == (len(encoded_train.input_ids[3]), 16)


def test_an_inference_mode_cache_trains_and_halves_batches_that_run_out_of_memory(
    encoded_train, monkeypatch
):
    """Built in inference mode, the cache holds the values computed under ``no_grad`` as plain
    tensors that a loss can backpropagate through; a batch that runs out of memory (raised here
    above 3 examples: no machine runs out on a tiny model) is halved and the rest runs at the
    size that fitted, with the same values and one note; out of memory at one example is raised.
    The progress bar disabled (as in a suite's worker processes, ``TQDM_DISABLE``), the second
    cache is built all the same."""
    teacher = tiny_model()
    sizes, notes, modes = [], [], set()

    def hidden(batch):
        modes.add(torch.is_inference_mode_enabled())
        return {"last": forward(teacher, batch, hidden_states=True).hidden_states[-1]}

    def small_memory(batch):
        sizes.append(len(batch["input_ids"]))
        if len(batch["input_ids"]) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return hidden(batch)

    plain = ExampleCache.compute(encoded_train, hidden, per_token=["last"], batch_size=8)
    assert modes == {False}
    modes.clear()
    monkeypatch.setattr(cache_module, "tqdm", functools.partial(tqdm, disable=True))
    fast = ExampleCache.compute(
        encoded_train, small_memory, ["last"], 8, inference=True, on_note=notes.append
    )
    assert modes == {True}
    assert sizes[:3] == [8, 4, 2] and set(sizes[2:-1]) == {2}  # the last batch may be smaller
    assert notes == [
        "teacher cache: out of memory, batches of 4 from here",
        "teacher cache: out of memory, batches of 2 from here",
    ]
    torch.testing.assert_close(fast.per_token["last"], plain.per_token["last"])
    assert not fast.per_token["last"].is_inference()
    weight = torch.ones(16, requires_grad=True)
    (fast.gather("last", torch.tensor([0, 1])) * weight).sum().backward()
    assert weight.grad is not None

    def no_memory(batch):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        ExampleCache.compute(encoded_train, no_memory, batch_size=2, inference=True)

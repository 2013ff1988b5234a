"""The worked example of docs/adding-a-method.md: one file registers a method with an option, a
tune parameter and a sweep, which then resolves, records itself and trains a step like the
built-in ones, trains through ``kdw distill``, is searched by ``kdw tune``, joins a reproduction
suite (its sweep and ablation, ``kdw reproduce --students``) and has a verdict in its report —
with no other file changed: the example is registered from its own module alone."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kd.methods.objective as registry
from kd.cli import build_parser, main
from kd.cli.reproduce import reproduce_suite
from kd.experiments.reproduce.record import SuiteRecord
from kd.experiments.reproduce.report import write_report
from kd.experiments.reproduce.runner import compact
from kd.experiments.reproduce.suite import TaskPlan, ablations, experiments
from kd.experiments.tune import apply, search_space
from kd.methods import config
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.methods.students import cut_student
from kd.training.config import OptimConfig
from kd.training.pipeline import check_tokens
from tests.conftest import tiny_model, tiny_tokenizer, write_tiny_runs
from workbench.app.geometry import layer_mapping
from workbench.core.config import DataConfig, to_dict
from workbench.core.data import batches, encode, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.files import with_format
from workbench.core.models import forward
from workbench.core.records import checked
from workbench.core.runs import ResolvedObjective

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hidden_mse.py"


@pytest.fixture
def example():
    """The example module's names, registered for this test only: the registry's tables (which
    the parser, the tuner, the suite and the report read) are restored in place afterwards."""
    tables = [
        registry.TERMS,
        registry.TEACHER_FIELDS,
        registry.PRESETS,
        registry.PARAMETERS,
        registry.METHODS,
        registry.STUDENT_SETUPS,
        config.METHOD_SETTINGS,
    ]
    saved = [dict(table) for table in tables]
    yield runpy.run_path(str(EXAMPLE))
    for table, entries in zip(tables, saved, strict=True):
        table.clear()
        table.update(entries)


def test_example_method_registers_resolves_and_trains_a_step(example, tiny_task_dir, tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    train = encode(load_task(DataConfig(task=str(tiny_task_dir))).splits["train"], tokenizer, 16)
    batch = next(batches(train, list(range(8)), 8, 0))
    teacher = tiny_model(layers=4)
    student = cut_student(teacher, [1, 3]).eval()  # no dropout: the direct formula below
    objective = Objective.resolve(ObjectiveConfig(preset="hidden-mse"), 4, 2, num_labels=3)

    assert objective.weights == {"ce": 0.5, "kd": 0.5, "hidden": 1.0}
    assert example["hidden_pairs"](objective) == [(0, 0), (1, 2), (2, 4)]
    assert objective.record()["hidden_pairs"] == [[0, 0], [1, 2], [2, 4]]
    assert objective.teacher_fields() == ["logits", "hidden_states"]
    assert objective.teacher_settings(["hidden_states"])["hidden_pairs"] == [(0, 0), (1, 2), (2, 4)]
    later = ObjectiveConfig(preset="hidden-mse").with_settings(hidden_from=1)
    assert to_dict(later)["hidden_from"] == 1
    resolved = Objective.resolve(later, 4, 2, num_labels=3)
    assert example["hidden_pairs"](resolved) == [(1, 2), (2, 4)]

    with torch.no_grad():
        teacher_values = objective.teacher_batch(teacher, batch)
    values = objective(student, batch, teacher_values)
    student_states = forward(student, batch, hidden_states=True).hidden_states
    teacher_states = forward(teacher, batch, hidden_states=True).hidden_states
    mask = batch["attention_mask"].bool()
    expected = torch.stack(
        [
            (student_states[s] - teacher_states[t])[mask].pow(2).mean()
            for s, t in [(0, 0), (1, 2), (2, 4)]
        ]
    ).mean()
    torch.testing.assert_close(values["hidden"], expected)

    before = [p.detach().clone() for p in student.parameters()]
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    values["loss"].backward()
    optimizer.step()
    changed = [not torch.equal(a, b) for a, b in zip(before, student.parameters(), strict=True)]
    assert any(changed)
    with torch.no_grad():
        after = objective(student, batch, teacher_values)["loss"]
    assert after < values["loss"]


def test_example_option_is_a_kdw_option_with_its_domain(example, capsys):
    arguments = ["distill", "--teacher", "t", "--run-dir", "s", "--preset", "hidden-mse"]
    parsed = build_parser().parse_args([*arguments, "--hidden-from", "2"])
    assert parsed.hidden_from == 2
    with pytest.raises(WorkbenchError, match=r"^--hidden-from: -1 is not allowed"):
        ObjectiveConfig(preset="hidden-mse").with_settings(hidden_from=-1)
    beyond = ObjectiveConfig(preset="hidden-mse").with_settings(hidden_from=3)
    with pytest.raises(WorkbenchError, match=r"^--hidden-from 3: this student maps hidden states"):
        Objective.resolve(beyond, 4, 2, num_labels=3)


def test_example_loss_refuses_other_widths(example):
    hidden_mse_loss = example["hidden_mse_loss"]
    with pytest.raises(ValueError, match="equal hidden sizes"):
        hidden_mse_loss(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 8), torch.ones(1, 2))


def test_registering_the_example_gives_it_a_tune_space_an_ablation_and_a_verdict(example, tmp_path):
    weights = {"ce": 0.5, "kd": 0.5, "hidden": 1.0}
    space = search_space("hidden-mse", (), weights)
    assert {name: d.choices for name, d in space.items()} == {
        "beta": (0.1, 1.0, 10.0),
        "alpha": (0.1, 0.5, 0.9),
    }
    objective, _ = apply(
        {"beta": 10.0, "alpha": 0.9},
        weights,
        ObjectiveConfig(preset="hidden-mse"),
        OptimConfig(),
    )
    assert objective.weights == {"ce": 0.1, "kd": 0.9, "hidden": 10}  # 1 − 0.9 is 0.1, exactly
    searched = search_space("hidden-mse", ("hidden_from=0,1",), weights)
    assert searched["hidden_from"].choices == (0, 1)
    objective, _ = apply(
        {"hidden_from": 1}, weights, ObjectiveConfig(preset="hidden-mse"), OptimConfig()
    )
    assert to_dict(objective)["hidden_from"] == 1

    rows = ablations("t", TaskPlan(DataConfig(task="t")), (1, 2))
    ours = [e for e in rows if e.name.startswith("hidden-mse")]
    assert [(e.name, e.group, e.seed) for e in ours] == [
        ("hidden-mse F=1", "hidden-from", 1),
        ("hidden-mse F=1", "hidden-from", 2),
        ("hidden-mse F=2", "hidden-from", 1),
        ("hidden-mse F=2", "hidden-from", 2),
        ("hidden-mse w/o ce", "hidden-terms", 1),
        ("hidden-mse w/o ce", "hidden-terms", 2),
    ]
    assert [to_dict(e.objective)["hidden_from"] for e in ours[:4:2]] == [1, 2]
    swept = TaskPlan(DataConfig(task="t"), sweeps={"hidden_from_sweep": (2,)})
    assert [e.name for e in ablations("t", swept, (1,)) if e.group == "hidden-from"] == [
        "hidden-mse F=2"
    ]
    resolved = Objective.resolve(ours[4].objective, 4, 2)
    assert resolved.weights == {"kd": 0.5, "hidden": 1.0}  # the preset's, CE dropped

    # a hand-made record: over 2 seeds of 50 test examples, vanilla KD right on 25 of each,
    # the example right on 40: + 30 points, an interval that excludes 0
    labels = [i % 2 for i in range(50)]
    right = {"kd": 25, "hidden-mse": 40}
    students = [
        {
            "task": "t",
            "name": name,
            "group": "main",
            "seed": seed,
            "sweep": None,
            "run": "",
            "test": {"accuracy": count / 50, "macro_f1": count / 50},
            "examples": {
                "test_set": "t",
                "predictions": compact(labels[:count] + [1 - y for y in labels[count:]]),
            },
        }
        for name, count in right.items()
        for seed in (1, 2)
    ]
    results = {
        "suite": "hand-written",
        "teachers": {"t": {"run": "", "test": {"accuracy": 0.9, "macro_f1": 0.9}}},
        "test_sets": {"t": {"uids": [f"u{i}" for i in range(50)], "labels": compact(labels)}},
        "students": students,
    }
    record = checked(with_format(results), SuiteRecord)
    report = write_report(tmp_path, record, {}).read_text()
    assert "| hidden-mse | 80.0 ± 0.0 | 80.0 ± 0.0 | +30.0 [" in report
    verdict = next(line for line in report.splitlines() if "Hidden MSE ≥ vanilla KD" in line)
    assert verdict.startswith(
        "- **Hidden MSE ≥ vanilla KD (accuracy)?** Hidden MSE − vanilla KD on t +30.0 points"
    )
    assert verdict.endswith(": yes, significantly higher.")


def test_a_token_term_that_declares_no_word_form_is_refused_across_tokenizers(
    example, two_tokenizers
):
    """The example's hidden-state MSE compares token by token and declares no way to compare
    words (``on_words``): a student of another tokenizer is refused in one line naming it."""
    teacher, student = two_tokenizers
    config = ObjectiveConfig(preset="hidden-mse")
    check_tokens(Objective.resolve(config, 4, 2, 3), teacher.tokenizer, teacher.tokenizer)
    across = Objective.resolve(config, 4, 2, 3, words=True)
    with pytest.raises(WorkbenchError, match="the terms hidden compare tokens") as error:
        check_tokens(across, teacher.tokenizer, student.tokenizer)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_example_trains_with_kdw_distill_is_tuned_and_joins_a_suite(example, tmp_path):
    """``kdw distill``, ``kdw tune`` and ``kdw reproduce --students`` take the example's preset and
    option as they take a built-in method's."""
    write_tiny_runs(tmp_path)
    common = ["--teacher", str(tmp_path / "teacher"), "--task", str(tmp_path / "task")]
    fast = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--num-layers", "2"]
    run = tmp_path / "hidden"
    options = ["--preset", "hidden-mse", "--hidden-from", "1"]
    assert main(["distill", "--run-dir", str(run), *common, *fast, *options]) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["configs"]["objective"]["hidden_from"] == 1
    assert record["resolved"]["objective"]["hidden_pairs"] == [[1, 2], [2, 4]]

    out = tmp_path / "tuned"
    space = ["--space", "hidden_from=0,1", "--space", "beta=1", "--space", "alpha=0.5"]
    tune = ["tune", "--out", str(out), *common, *fast, "--preset", "hidden-mse", *space]
    assert main([*tune, "--trials", "2", "--no-prune"]) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["objective"]["hidden_from"] in (0, 1)

    students = tmp_path / "students.json"
    entry = {"name": "hidden F=1", "task": "tweets", "objective": {"preset": "hidden-mse"}}
    entry["objective"]["hidden_from"] = 1
    students.write_text(json.dumps([entry]))
    suite = reproduce_suite(build_parser().parse_args(["reproduce", "--students", str(students)]))
    joined = [e for e in experiments(suite) if e.name == "hidden F=1"]
    assert joined and all(to_dict(e.objective)["hidden_from"] == 1 for e in joined)


@pytest.mark.parametrize(
    ("preset", "pairs", "how"),
    [
        ("hidden-mse", [(1, 2), (2, 4)], "uniform mapping of the hidden-state MSE (hidden-mse)"),
        ("ckd", [(0, 0), (1, 2), (2, 4)], "uniform mapping of the relation terms (CKD)"),
        ("pkd-skip", [(1, 2)], "Patient KD mapping (pkd-skip)"),
        ("gkd-cls", [(1, 2)], "Patient KD mapping (gkd-cls)"),
    ],
)
def test_the_geometry_page_shows_the_layer_pairs_a_method_declares(example, preset, pairs, how):
    """The geometry page asks the registry which record key holds a run's layer pairs: the
    example's, declared in its module alone, as the built-in methods'."""
    config = ObjectiveConfig(preset=preset)
    if preset == "hidden-mse":
        config = config.with_settings(hidden_from=1)
    objective = Objective.resolve(config, 4, 2, num_labels=3)
    info = SimpleNamespace(
        configs={"student": {"init": "cut", "layers": "skip"}},
        method=preset,
        resolved=SimpleNamespace(objective=checked(objective.record(), ResolvedObjective)),
    )
    teacher, student = (SimpleNamespace(model=tiny_model(layers=n)) for n in (4, 2))
    student.run = SimpleNamespace(info=lambda: info)
    assert layer_mapping(teacher, student) == (pairs, how)

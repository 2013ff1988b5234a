"""Option domains: declared once per field, checked whenever a config is built — by the CLI, the
Python API, the app, or a run's saved settings."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kd.cli import main
from kd.experiments.config import TuneConfig
from kd.methods.adkd import ADKDSettings
from kd.methods.config import ObjectiveConfig, spell_weights, weight_pairs
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from tests.conftest import LEAST_RESOLVED
from workbench.analysis.attribution.registry import EXPLAINERS, AttributionSettings
from workbench.analysis.explanations import HeatmapSettings
from workbench.analysis.heatmap_export import ExportSettings
from workbench.core.config import (
    MAX_DPI,
    Checked,
    DataConfig,
    _field_type,
    from_arguments,
    from_dict,
    spelled,
    to_dict,
)
from workbench.core.errors import WorkbenchError

TRAIN = ["train-teacher", "--run-dir", "run"]
DISTILL = ["distill", "--run-dir", "run", "--teacher", "teacher"]
TUNE = ["tune", "--out", "study", "--teacher", "teacher"]
EXPORT = ["export", "run", "--out", "out", "--text", "good"]
ATTRIBUTE = ["attribute", "run", "--out", "out", "--text", "good"]

BAD = [
    (TRAIN, "--batch-size", "0"),
    (TRAIN, "--batch-size", "-3"),
    (TRAIN, "--eval-batch-size", "0"),
    (TRAIN, "--learning-rate", "0"),
    (TRAIN, "--learning-rate", "-1e-5"),
    (TRAIN, "--learning-rate", "inf"),
    (TRAIN, "--learning-rate", "nan"),
    (TRAIN, "--epochs", "0"),
    (TRAIN, "--epochs", "nan"),
    (TRAIN, "--warmup-ratio", "1.5"),
    (TRAIN, "--warmup-ratio", "-0.1"),
    (TRAIN, "--weight-decay", "-0.01"),
    (TRAIN, "--max-grad-norm", "-1"),
    (TRAIN, "--eval-every", "-1"),
    (TRAIN, "--checkpoint-every", "0"),
    (TRAIN, "--log-every", "-1"),
    (TRAIN, "--threads", "-1"),
    (TRAIN, "--max-length", "3"),
    (TRAIN, "--max-train-examples", "0"),
    (TRAIN, "--max-eval-examples", "-5"),
    (DISTILL, "--temperature", "0"),
    (DISTILL, "--temperature", "-2"),
    (DISTILL, "--attr-steps", "0"),
    (DISTILL, "--attr-top-k", "0"),
    (DISTILL, "--ckd-window", "0"),
    (DISTILL, "--num-layers", "0"),
    (DISTILL, "--hidden-size", "0"),
    (DISTILL, "--num-heads", "-1"),
    (TUNE, "--trials", "0"),
    (TUNE, "--reports-per-epoch", "0"),
    (EXPORT, "--dpi", "0"),
    (EXPORT, "--dpi", "-72"),
    (EXPORT, "--cmap", "not-a-colormap"),
    (EXPORT, "--steps", "0"),
    (EXPORT, "--top-k", "0"),
    (ATTRIBUTE, "--batch-size", "0"),
    (ATTRIBUTE, "--max-length", "2"),
    (ATTRIBUTE, "--memory-mib", "0"),
    (ATTRIBUTE, "--layer", "-1"),
]


@pytest.mark.parametrize(("command", "option", "value"), BAD)
def test_a_value_outside_its_domain_is_one_line(
    command, option, value, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main([*command, f"{option}={value}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kdw: error: {option}: ")
    assert "is not allowed (expected " in line
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_is_checked_like_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("best.json").write_text(json.dumps({"optim": {"warmup_ratio": 2}}))
    assert main([*DISTILL, "--config", "best.json"]) == 2
    assert capsys.readouterr().err == (
        "kdw: error: --config best.json: section 'optim': --warmup-ratio: 2 is not allowed "
        "(expected a number in [0, 1])\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json"]


def test_the_api_and_saved_settings_are_checked_too():
    with pytest.raises(
        WorkbenchError,
        match=r"^--batch-size: 0 is not allowed \(expected an "
        r"integer ≥ 1\)$",
    ):
        OptimConfig(batch_size=0)
    with pytest.raises(WorkbenchError, match=r"^--parity: 'exact' is not allowed"):
        ObjectiveConfig(parity="exact")
    with pytest.raises(WorkbenchError, match=r"^--max-length: 2 is not allowed"):
        from_dict(DataConfig, {"max_length": 2})
    with pytest.raises(WorkbenchError, match=r"^--epochs: True is not allowed"):
        OptimConfig(epochs=True)
    assert OptimConfig(epochs=1).epochs == 1  # an integer is a number (run.json may hold one)
    assert ExportSettings(cmap="viridis").cmap == "viridis"


def test_weights_and_views_are_typed_and_written_as_text_on_the_command_line(capsys):
    from kd.cli import build_parser

    arguments = ["distill", "--teacher", "t", "--run-dir", "s", "--task", "tweets"]
    parsed = build_parser().parse_args(
        [*arguments, "--weights", "ce=0.1,kd=0.9", "--attr-views", "0,2"]
    )
    objective = from_arguments(ObjectiveConfig, parsed)
    assert objective.weights == {"ce": 0.1, "kd": 0.9} and objective.of(
        ADKDSettings
    ).attr_views == (0, 2)
    assert to_dict(objective)["weights"] == {"ce": 0.1, "kd": 0.9}
    record = json.loads(json.dumps(to_dict(objective)))
    assert from_dict(ObjectiveConfig, record) == objective
    assert record == json.loads(json.dumps(to_dict(objective)))  # left as it was: a suite saves it
    assert spelled(objective)["weights"] == "ce=0.1,kd=0.9"  # what identities hash
    assert spelled(objective)["attr_views"] == "0,2"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*arguments, "--weights", "ce=x"])
    assert capsys.readouterr().err == (
        "kdw: error: argument --weights: weight of 'ce' must be a number, got 'x' "
        "(see kdw distill --help)\n"
    )


def test_a_config_file_may_write_weights_and_views_as_text(tmp_path):
    """A ``--config`` file may write them as the command line does; a record holds the typed
    values and refuses the text."""
    from kd.cli import config_defaults

    path = tmp_path / "best.json"
    path.write_text(
        json.dumps({"objective": {"weights": "ce=0.1,kd=0.9,attr=10", "attr_views": "1"}})
    )
    defaults = config_defaults(str(path))
    assert defaults["weights"] == {"ce": 0.1, "kd": 0.9, "attr": 10.0}
    assert defaults["attr_views"] == (1,)
    assert from_dict(AttributionSettings, {"views": "pred"}).views == "pred"
    path.write_text(json.dumps({"objective": {"weights": "ce=1,kd=-1"}}))
    with pytest.raises(WorkbenchError, match=r"--weights: weight of 'kd' must be a finite"):
        config_defaults(str(path))
    path.write_text(json.dumps({"objective": {"attr_views": "most"}}))
    with pytest.raises(WorkbenchError, match=r"--attr-views: unknown views 'most'"):
        config_defaults(str(path))
    with pytest.raises(WorkbenchError, match=r"^--weights: 'ce=1' is not allowed"):
        from_dict(ObjectiveConfig, {"weights": "ce=1"})


def test_a_run_reopens_with_its_settings_only(tmp_path):
    """``kdw distill`` resumes a run folder of the same settings; another setting is refused."""
    from workbench.core.runs import Run

    objective = ObjectiveConfig("adkd", {"ce": 0.1, "kd": 0.9, "attr": 10.0}).with_settings(
        attr_views=(0, 2)
    )
    info = {"kind": "student", "configs": {"objective": to_dict(objective)}, **LEAST_RESOLVED}
    with Run.writing(tmp_path / "run", info, {}):
        pass
    with Run.writing(tmp_path / "run", info, {}):
        pass
    other = info | {"configs": {"objective": to_dict(replace(objective, weights={}))}}
    with (
        pytest.raises(
            WorkbenchError, match=r'--weights \{"attr": 10\.0, "ce": 0\.1, "kd": 0\.9\} → \{\}'
        ),
        Run.writing(tmp_path / "run", other, {}),
    ):
        pass


@given(
    st.dictionaries(
        st.sampled_from(["ce", "kd", "attr", "grad"]),
        st.floats(0, 1e12) | st.integers(0, 10**12),
    )
)
def test_weights_read_back_from_their_text_exactly(weights: dict):
    assert weight_pairs(spell_weights(weights)) == weights


SEEDS = {"seed", "split_seed"}  # any integer is a seed


def test_every_numeric_option_declares_its_domain():
    configs = (
        DataConfig,
        TeacherConfig,
        StudentConfig,
        ObjectiveConfig,
        OptimConfig,
        TuneConfig,
        AttributionSettings,
        HeatmapSettings,
        ExportSettings,
        *(explainer.settings for explainer in EXPLAINERS.values()),
    )
    assert all(issubclass(cls, Checked) for cls in configs)
    undeclared = [
        f"{cls.__name__}.{f.name}"
        for cls in configs
        for f in dataclasses.fields(cls)
        if _field_type(cls, f)[0] in (int, float)
        and f.name not in SEEDS
        and "domain" not in f.metadata
    ]
    assert undeclared == []


def _accepted(build) -> bool:
    try:
        build()
    except WorkbenchError:
        return False
    return True


def _finite(x: float) -> bool:
    return not math.isnan(x) and not math.isinf(x)


numbers = st.floats() | st.integers()


@given(st.integers())
def test_integer_domains(n: int):
    assert _accepted(lambda: OptimConfig(batch_size=n)) is (n >= 1)
    assert _accepted(lambda: OptimConfig(eval_every=n)) is (n >= 0)
    assert _accepted(lambda: DataConfig(max_length=n)) is (n >= 4)
    assert _accepted(lambda: ObjectiveConfig().with_settings(attr_top_k=n)) is (n >= 1)
    assert _accepted(lambda: ObjectiveConfig().with_settings(attr_steps=n)) is (1 <= n <= 1000)
    assert _accepted(lambda: OptimConfig(threads=n)) is (0 <= n <= 1024)
    assert _accepted(lambda: OptimConfig(seed=n)) is (0 <= n < 2**32)


@given(numbers)
def test_number_domains(x: float):
    assert _accepted(lambda: OptimConfig(learning_rate=x)) is (_finite(x) and x > 0)
    assert _accepted(lambda: OptimConfig(warmup_ratio=x)) is (0 <= x <= 1)
    assert _accepted(lambda: OptimConfig(weight_decay=x)) is (0 <= x <= 1)
    assert _accepted(lambda: OptimConfig(epochs=x)) is (0 < x <= 1000)
    assert _accepted(lambda: ExportSettings(dpi=x)) is (_finite(x) and 0 < x <= MAX_DPI)


@given(st.none() | numbers)
def test_an_optional_option_also_takes_none(x: float | None):
    expected = x is None or (_finite(x) and 0.01 <= x <= 1000)
    assert _accepted(lambda: ObjectiveConfig(temperature=x)) is expected


@given(numbers)
def test_term_weights_are_finite_and_not_negative(x: float):
    assert _accepted(lambda: ObjectiveConfig(weights={"ce": 1, "kd": x})) is (_finite(x) and x >= 0)
    assert _accepted(lambda: weight_pairs(f"ce=1,kd={x!r}")) is (_finite(x) and x >= 0)

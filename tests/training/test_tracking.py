"""Experiment tracking (``--report-to tensorboard,mlflow``): what the trackers hold, read back
with TensorBoard's own reader and MLflow's client, against the run folder's files; resuming a
killed training continues the same tracked run without duplicate points; a search's trials are
nested runs of its run; bad tracking options are one-line errors before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kd.cli import main
from kd.experiments.config import TuneConfig
from kd.experiments.tune import tune
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from kd.training.tracking import TrackingConfig, parse_trackers
from tests.conftest import ROOT, kill_at_step, write_tiny_workspace
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError

pytest.importorskip("tensorboard", reason="needs the tracking extra")
pytest.importorskip("mlflow", reason="needs the tracking extra")

from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

BOTH = ("tensorboard", "mlflow")


@pytest.fixture(scope="module", autouse=True)
def _no_telemetry():
    """MLflow's usage reports stay off in tests (no network here)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        yield


@pytest.fixture(scope="module")
def tracked_teacher(tmp_path_factory) -> dict:
    """A tiny teacher trained with both trackers into ``runs/teacher``, MLflow in its default
    store ``runs/mlruns``, which the other tests share (``store``)."""
    work = tmp_path_factory.mktemp("tracking")
    write_tiny_workspace(work)
    data = DataConfig(task=str(work / "task"), max_length=16)
    optim = OptimConfig(epochs=1, batch_size=16, threads=1, log_every=2, eval_every=4)
    run = train_teacher(
        data,
        TeacherConfig(model=str(work / "tiny-bert")),
        optim,
        work / "runs" / "teacher",
        tracking_config=TrackingConfig(report_to=BOTH),
    )
    store = f"sqlite:///{work / 'runs' / 'mlruns' / 'mlflow.db'}"
    return {"work": work, "run": run.path, "data": data, "store": store}


def expected_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's numbers as the trackers name them: SPLIT/NAME, at the record's step;
    and results.json's under results/SPLIT/NAME at the last step."""
    curves: dict[str, list[tuple[int, float]]] = {}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        for name, value in record.items():
            if name not in ("step", "split"):
                curves.setdefault(f"{record['split']}/{name}", []).append((record["step"], value))
    if (run / "results.json").exists():
        last = json.loads((run / "status.json").read_text())["step"]
        for split, metrics in json.loads((run / "results.json").read_text()).items():
            for name, value in metrics.items():
                curves[f"results/{split}/{name}"] = [(last, value)]
    return curves


def tensorboard_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    reader = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    reader.Reload()
    return {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }


def tensorboard_hparams(run: Path) -> dict:
    reader = EventAccumulator(str(run / "tensorboard"))
    reader.Reload()
    values = {}
    for content in reader.PluginTagToContent("hparams").values():
        for _, message in plugin_data_pb2.HParamsPluginData.FromString(content).ListFields():
            if "hparams" in message.DESCRIPTOR.fields_by_name:
                for name, value in message.hparams.items():
                    values[name] = getattr(value, value.WhichOneof("kind"))
    return values


def mlflow_run_id(run: Path, store: str) -> str:
    return json.loads((run / "tracking.json").read_text())["mlflow"][store]


def mlflow_curves(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {
        key: sorted((point.step, point.value) for point in client.get_metric_history(run_id, key))
        for key in client.get_run(run_id).data.metrics
    }


def assert_same_curves(found: dict, expected: dict, rel: float = 0.0) -> None:
    assert sorted(found) == sorted(expected)
    for tag, points in expected.items():
        steps = [step for step, _ in found[tag]]
        assert steps == [step for step, _ in points], tag
        assert len(set(steps)) == len(steps), f"{tag}: a step logged twice"
        for (_, value), (_, want) in zip(found[tag], points, strict=True):
            assert value == pytest.approx(want, rel=rel, abs=rel * 1e-3), tag


def run_settings(run: Path) -> dict:
    """run.json's leaves, by dotted path: strings as they are, other values as JSON."""
    leaves = {}

    def walk(node, path):
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, [*path, key])
        else:
            leaves[".".join(path)] = node if isinstance(node, str) else json.dumps(node)

    walk(json.loads((run / "run.json").read_text()), [])
    return leaves


def test_report_to_is_a_comma_list_of_offered_trackers():
    assert parse_trackers("tensorboard,mlflow") == BOTH
    assert parse_trackers(["mlflow", "tensorboard, mlflow"]) == ("mlflow", "tensorboard")
    assert parse_trackers("none") == ()
    assert TrackingConfig(report_to="MLflow").report_to == ("mlflow",)
    with pytest.raises(WorkbenchError, match="wandb: not offered; use tensorboard, mlflow"):
        TrackingConfig(report_to=("tensorboard,wandb",))


@pytest.mark.slow
def test_tensorboard_holds_the_run_s_curves_and_settings(tracked_teacher):
    run = tracked_teacher["run"]
    expected = expected_curves(run)
    assert {"train/value/ce", "train/grad_share/ce", "train/lr", "dev/accuracy"} <= set(expected)
    # event files keep float32 values
    assert_same_curves(tensorboard_curves(run), expected, rel=1e-6)
    hparams = tensorboard_hparams(run)
    settings = run_settings(run)
    assert sorted(hparams) == sorted(settings)
    for name, value in hparams.items():
        if isinstance(value, str):
            assert value == settings[name], name
        else:
            assert json.loads(settings[name]) == pytest.approx(value), name


@pytest.mark.slow
def test_mlflow_holds_the_run_s_curves_settings_and_files(tracked_teacher):
    run, store = tracked_teacher["run"], tracked_teacher["store"]
    assert (run.parent / "mlruns" / "mlflow.db").exists()  # the default store
    client = MlflowClient(tracking_uri=store)
    run_id = mlflow_run_id(run, store)
    assert_same_curves(mlflow_curves(client, run_id), expected_curves(run))
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == "teacher"
    assert found.data.params == run_settings(run)
    results = json.loads((run / "results.json").read_text())
    assert found.data.metrics["results/test/accuracy"] == results["test"]["accuracy"]
    files = {item.path for item in client.list_artifacts(run_id)}
    assert {"run.json", "results.json", "model"} <= files
    assert [item.path for item in client.list_artifacts(run_id, "model")] == ["model/README.md"]


class Interrupt:
    """Ctrl-C at a step (after its records are logged, before its checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step: int, total: int, losses: dict) -> None:
        if step == self.step:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_a_resumed_run_continues_its_tracked_run_without_duplicates(tracked_teacher):
    work, store = tracked_teacher["work"], tracked_teacher["store"]
    folder = work / "runs" / "interrupted"
    student = StudentConfig(teacher=str(tracked_teacher["run"]), num_layers=2)
    # (an evaluation also writes a checkpoint: the only one here is at the end)
    optim = OptimConfig(epochs=1, batch_size=16, threads=1, log_every=1, checkpoint_every=3)
    tracking = TrackingConfig(report_to=BOTH, mlflow_uri=store)
    arguments = (tracked_teacher["data"], student, ObjectiveConfig(preset="kd"), optim, folder)
    with pytest.raises(KeyboardInterrupt):
        distill(*arguments, [Interrupt(5)], tracking_config=tracking)
    client = MlflowClient(tracking_uri=store)
    run_id = mlflow_run_id(folder, store)
    checkpoint = torch.load(folder / "checkpoint.pt", weights_only=True)["state"]["step"]
    logged = [point.step for point in client.get_metric_history(run_id, "train/lr")]
    assert checkpoint == 3 and logged == [1, 2, 3, 4, 5]  # steps 4 and 5 will be redone
    assert client.get_run(run_id).info.status == "KILLED"

    distill(*arguments, tracking_config=tracking)
    assert mlflow_run_id(folder, store) == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    expected = expected_curves(folder)
    assert [step for step, _ in expected["train/lr"]] == list(range(1, 9))
    assert_same_curves(mlflow_curves(client, run_id), expected)
    assert_same_curves(tensorboard_curves(folder), expected, rel=1e-6)


# slow: two kdw processes importing torch and MLflow, one killed mid-run
@pytest.mark.slow
def test_a_killed_distillation_resumes_its_tracked_run(tracked_teacher):
    work, store = tracked_teacher["work"], tracked_teacher["store"]
    folder = work / "runs" / "killed"
    command = [
        *("distill", "--run-dir", str(folder), "--teacher", str(tracked_teacher["run"])),
        *("--task", str(work / "task"), "--max-length", "16", "--num-layers", "2"),
        *("--epochs", "2", "--batch-size", "16", "--threads", "1", "--log-every", "1"),
        *("--eval-every", "2", "--checkpoint-every", "3"),
        *("--report-to", "tensorboard,mlflow", "--mlflow-uri", store),
    ]
    state = kill_at_step(command, folder, 3)
    assert state["state"] == "running" and state["step"] < state["total"], state
    run_id = mlflow_run_id(folder, store)
    resumed = subprocess.run(
        [sys.executable, "-m", "kd.cli", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    client = MlflowClient(tracking_uri=store)
    named = client.search_runs(
        [client.get_run(run_id).info.experiment_id], "attributes.run_name = 'killed'"
    )
    assert [found.info.run_id for found in named] == [run_id]  # the same run, reopened
    expected = expected_curves(folder)
    assert [step for step, _ in expected["train/lr"]] == list(range(1, state["total"] + 1))
    assert_same_curves(mlflow_curves(client, run_id), expected)
    assert_same_curves(tensorboard_curves(folder), expected, rel=1e-6)


@pytest.mark.slow
def test_a_search_s_trials_are_nested_runs_of_its_run(tracked_teacher):
    work, store = tracked_teacher["work"], tracked_teacher["store"]
    out = work / "search"
    result = tune(
        tracked_teacher["data"],
        StudentConfig(teacher=str(tracked_teacher["run"]), num_layers=2),
        ObjectiveConfig(preset="kd"),
        OptimConfig(epochs=0.5, batch_size=16, threads=1, log_every=2),
        TuneConfig(trials=2, space=("alpha=0.1,0.9", "tau=2"), prune=False),
        out,
        tracking_config=TrackingConfig(report_to=BOTH, mlflow_uri=store),
    )
    assert len(result.rows) == 2
    client = MlflowClient(tracking_uri=store)
    parent = mlflow_run_id(out, store)
    study = client.get_run(parent)
    assert study.info.status == "FINISHED" and study.data.params["tune.trials"] == "2"
    assert [item.path for item in client.list_artifacts(parent)] == ["best.json"]
    trials = client.search_runs([study.info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    folders = sorted((out / "trials").iterdir())
    assert sorted(found.info.run_name for found in trials) == [f.name for f in folders]
    for folder in folders:
        assert mlflow_run_id(folder, store) in {found.info.run_id for found in trials}
        assert_same_curves(tensorboard_curves(folder), expected_curves(folder), rel=1e-6)


BAD = {
    "an unknown tracker": (["--report-to", "wandb"], "--report-to wandb: not offered"),
    "an unreachable server": (
        ["--report-to", "mlflow", "--mlflow-uri", "http://127.0.0.1:9"],
        "--mlflow-uri http://127.0.0.1:9 cannot be reached",
    ),
    "a URI without mlflow": (
        ["--report-to", "tensorboard", "--mlflow-uri", "http://127.0.0.1:9"],
        "add mlflow to --report-to",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
@pytest.mark.parametrize("command", ["train-teacher", "distill", "tune"])
def test_bad_tracking_options_are_one_line_before_anything_is_written(
    command, case, tmp_path, capsys
):
    target = tmp_path / "run"
    place = ["--out", str(target)] if command == "tune" else ["--run-dir", str(target)]
    teacher = [] if command == "train-teacher" else ["--teacher", str(tmp_path / "teacher")]
    options, message = BAD[case]
    assert main([command, *place, *teacher, *options]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_app_s_trainings_report_to_the_trackers_its_form_names(tracked_teacher):
    from workbench.app import runner
    from workbench.core.config import to_dict

    configs = json.loads((tracked_teacher["run"] / "run.json").read_text())["configs"]
    configs["optim"] |= {"epochs": 0.5, "log_every": 1}
    configs["tracking"] = to_dict(TrackingConfig(report_to=("tensorboard",)))
    folder = tracked_teacher["work"] / "runs" / "from-the-app"
    assert runner.main(["teacher", str(folder), json.dumps(configs)]) == 0
    expected = expected_curves(folder)
    assert [step for step, _ in expected["train/lr"]] == [1, 2, 3, 4]
    assert_same_curves(tensorboard_curves(folder), expected, rel=1e-6)
    assert not (folder / "tracking.json").exists()  # MLflow was not named


@pytest.mark.parametrize("tracker", BOTH)
def test_a_tracker_whose_package_is_missing_is_one_line(tracker, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, tracker, None)  # what Python's import sees as absent
    assert main(["train-teacher", "--run-dir", str(tmp_path / "run"), "--report-to", tracker]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"--report-to {tracker} needs the" in error, error
    assert "pip install 'kd-workbench[tracking]'" in error
    assert list(tmp_path.iterdir()) == []

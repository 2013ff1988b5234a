"""``kdw tune``: bad search spaces refused in one line with nothing written, a study resumes (an
interrupted trial retried with its settings, finished ones kept), a pruned trial stops early,
the best configuration trains with ``kdw distill --config``, and two worker processes share one
study in a real PostgreSQL server (each grid setting once, the best trial a lone worker finds)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from kd.cli import main
from kd.experiments.config import TuneConfig
from kd.experiments.tune import (
    STUDY_NAME,
    PruningCallback,
    _check_record,
    _planned,
    read_best,
    study_settings,
    trial_folder,
    trials_table,
    tune,
)
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from tests.conftest import debian_package
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.files import FORMAT_KEY, RECORD_FORMAT, with_format
from workbench.core.runs import Run


@pytest.fixture
def tiny_teacher(tiny_model_dir, tiny_task_dir, tmp_path):
    data = DataConfig(task=str(tiny_task_dir), max_length=16, max_train_examples=48)
    optim = OptimConfig(epochs=2, batch_size=8, learning_rate=2e-3, threads=1)
    run = train_teacher(data, TeacherConfig(model=str(tiny_model_dir)), optim, tmp_path / "teacher")
    return data, run.path


def _tune_args(data, teacher, out, *extra):
    return [
        "tune",
        "--out",
        str(out),
        "--task",
        data.task,
        "--max-length",
        "16",
        "--max-train-examples",
        "48",
        "--teacher",
        str(teacher),
        "--num-layers",
        "2",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--log-every",
        "0",
        *extra,
    ]


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("gamma=1,10", "unknown parameter 'gamma' for adkd"),
        ("beta=", "no values given"),
        ("tau=4:1", "empty or inverted range"),
        ("tau=2:2", "empty or inverted range"),
        ("beta=-1,10", "-1 must lie in [0, inf)"),
        ("tau=0,1", "0 must lie in [0.01, 1000]"),
        ("alpha=0.5,1.5", "1.5 must lie in [0, 1]"),
        ("attr_top_k=2.5", "must be an integer"),
        ("lr=0:1e-3:log", "a log range needs LOW > 0"),
        ("beta", "use NAME=v1,v2 or NAME=LOW:HIGH"),
    ],
)
def test_bad_space_is_a_one_line_error_and_writes_nothing(
    tiny_teacher, tmp_path, capsys, space, message
):
    data, teacher = tiny_teacher
    out = tmp_path / "study"
    assert main(_tune_args(data, teacher, out, "--preset", "adkd", "--space", space)) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error
    assert not out.exists()


@pytest.mark.slow
def test_study_resumes_and_best_configuration_trains(tiny_teacher, tmp_path, capsys):
    data, teacher = tiny_teacher
    out = tmp_path / "study"
    args = _tune_args(
        data,
        teacher,
        out,
        "--preset",
        "adkd",
        "--trials",
        "2",
        "--space",
        "beta=0.1,1",
        "--space",
        "alpha=0.5,0.9",
        "--space",
        "tau=1,2",
        "--space",
        "lr=1e-3,2e-3",
        "--no-prune",
    )
    # a search killed during its first trial leaves that trial RUNNING in the study
    storage = f"sqlite:///{out / 'study.db'}"
    assert main([*args[:-1], "--trials", "1", "--no-prune"]) == 0
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    choices = {"beta": [0.1, 1.0], "alpha": [0.5, 0.9], "tau": [1.0, 2.0], "lr": [1e-3, 2e-3]}
    first = study.trials[0].params  # the killed trial tries another setting
    study.enqueue_trial({**first, "beta": next(b for b in choices["beta"] if b != first["beta"])})
    killed = study.ask()
    for name, values in choices.items():
        killed.suggest_categorical(name, values)
    folders_before = {p.name for p in (out / "trials").iterdir()}

    assert main(args) == 0
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE"], states
    assert study.trials[2].params == killed.params  # retried with the same settings
    assert len({p.name for p in (out / "trials").iterdir()} - folders_before) <= 1
    # the trials share one teacher cache, computed once
    assert len(list((out / "teacher_cache").glob("teacher-train-*.safetensors"))) == 1
    assert not list((out / "trials").glob("*/teacher_cache"))

    # a third call finds the study complete and trains nothing
    before = sorted(p.stat().st_mtime_ns for p in (out / "trials").glob("*/status.json"))
    assert main(args) == 0
    assert sorted(p.stat().st_mtime_ns for p in (out / "trials").glob("*/status.json")) == before

    best = read_best(out / "best.json")
    assert best.tuned.dev == max(t.value for t in study.trials if t.value is not None)
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(best.plain() | {"tuned": {**best.tuned.plain(), "trial": "1"}}))
    with pytest.raises(WorkbenchError, match=r'search: "tuned\.trial" is a string, expected an'):
        read_best(damaged)
    capsys.readouterr()
    assert (
        main(
            [
                "distill",
                "--config",
                str(out / "best.json"),
                "--run-dir",
                str(tmp_path / "best"),
                "--log-every",
                "0",
            ]
        )
        == 0
    )
    trained = Run.open(tmp_path / "best").info().configs
    assert trained["objective"] == best.objective
    assert trained["optim"]["learning_rate"] == best.optim["learning_rate"]


def test_study_of_another_preset_is_refused_untouched(tiny_teacher, tmp_path, capsys):
    data, teacher = tiny_teacher
    out = tmp_path / "study"
    assert (
        main(
            _tune_args(
                data, teacher, out, "--preset", "kd", "--trials", "1", "--space", "alpha=0.5"
            )
        )
        == 0
    )
    before = (out / "study.db").read_bytes()
    capsys.readouterr()
    assert main(_tune_args(data, teacher, out, "--preset", "adkd", "--trials", "1")) == 2
    error = capsys.readouterr().err
    assert "is a study of preset 'kd', not 'adkd'" in error
    assert (out / "study.db").read_bytes() == before


def test_pruned_trial_stops_early(tiny_teacher, tmp_path):
    data, teacher = tiny_teacher
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0)
    )
    trial = study.ask()
    callback = PruningCallback(trial, "accuracy", enabled=True)
    run = distill(
        data,
        StudentConfig(teacher=str(teacher), num_layers=2),
        ObjectiveConfig(preset="kd"),
        OptimConfig(epochs=2, batch_size=8, threads=1, eval_every=2, log_every=0),
        tmp_path / "pruned",
        callbacks=[callback],
    )
    assert callback.pruned
    status = run.status()
    assert status.state == "stopped" and status.step == 2 < status.total == 14


def test_tune_api_validates_trials(tiny_teacher, tmp_path):
    data, teacher = tiny_teacher
    with pytest.raises(WorkbenchError, match=r"^--trials: 0 is not allowed"):
        tune(
            data,
            StudentConfig(teacher=str(teacher)),
            ObjectiveConfig(preset="kd"),
            OptimConfig(),
            TuneConfig(trials=0),
            tmp_path / "study",
        )


@pytest.mark.slow
def test_a_grid_no_larger_than_the_budget_is_tried_whole_each_setting_once(
    tiny_teacher, tmp_path, capsys
):
    """3 settings and 5 trials asked: the grid sampler tries each setting once, and says so."""
    data, teacher = tiny_teacher
    out = tmp_path / "study"
    fixed = ["--space", "alpha=0.5", "--space", "tau=1", "--space", "lr=1e-3", "--no-prune"]
    args = _tune_args(data, teacher, out, "--preset", "adkd", "--trials", "5", *fixed)
    assert main([*args, "--space", "beta=0.1,1,10"]) == 0
    assert "the space has 3 settings: each is tried once (grid search)" in capsys.readouterr().err
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{out / 'study.db'}")
    assert sorted(t.params["beta"] for t in study.trials) == [0.1, 1.0, 10.0]
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert len(list((out / "trials").iterdir())) == 3


# slow: four AD-KD students trained, one per distinct setting the TPE search draws
@pytest.mark.slow
def test_a_larger_space_gets_as_many_distinct_settings_as_trials(tiny_teacher, tmp_path):
    """6 settings, 4 trials: TPE may propose a setting again, which keeps its first outcome and
    does not count; the search ends with 4 distinct settings tried."""
    data, teacher = tiny_teacher
    out = tmp_path / "study"
    space = ["--space", "beta=0.1,1,10", "--space", "tau=1,2", "--space", "alpha=0.5"]
    args = _tune_args(data, teacher, out, "--preset", "adkd", "--trials", "4", *space)
    assert main([*args, "--space", "lr=1e-3", "--no-prune"]) == 0
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{out / 'study.db'}")
    distinct = {tuple(sorted(t.params.items())) for t in study.trials}
    assert len(distinct) == 4 == len(list((out / "trials").iterdir()))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{ not json", "not JSON"),
        ('{"objective": {"bogus": 1}}', "unknown ObjectiveConfig settings ['bogus']"),
        ('{"optim": [1]}', "section 'optim' is not an object"),
    ],
)
def test_a_bad_config_file_is_a_one_line_error(tmp_path, capsys, content, message):
    path = tmp_path / "best.json"
    if content is not None:
        path.write_text(content)
    assert main(["distill", "--config", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error
    assert not (tmp_path / "run").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server (Debian's postgresql) on loopback, its cluster and socket in
    a temporary folder, run as the postgres user when the tests run as root (the server refuses
    root); its SQLAlchemy URL."""
    debian_package("postgres")
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not binaries:
        pytest.skip("Debian's postgresql has no pg_ctl here")
    bin_dir = binaries[-1].parent
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="kdw-postgres-"))
    if as_user:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", _free_port()
    pg_ctl = [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data)]
    try:
        subprocess.run(
            [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "kdw", "--auth=trust"],
            check=True,
            capture_output=True,
        )
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [*pg_ctl, "-l", str(folder / "log"), "-w", "-o", options, "start"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg2://kdw@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _missing_driver() -> str:
    """A database URL whose SQLAlchemy driver is not installed here."""
    for url, module in (
        ("mysql+mysqldb://kdw@127.0.0.1/studies", "MySQLdb"),
        ("postgresql+pg8000://kdw@127.0.0.1/studies", "pg8000"),
        ("mysql+mysqlconnector://kdw@127.0.0.1/studies", "mysql.connector"),
    ):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return url
    pytest.skip("every candidate driver is installed")


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("postgres is on db.lan", "--storage: not a database URL: write DIALECT+DRIVER://"),
        ("nosuchdb://kdw@127.0.0.1/studies", "SQLAlchemy knows no database 'nosuchdb'"),
        (_missing_driver, "is not installed: pip install '"),
        (
            lambda: f"postgresql+psycopg2://kdw:secret@127.0.0.1:{_free_port()}/studies",
            "postgresql+psycopg2://kdw:***@127.0.0.1:",
        ),
        ("sqlite:////no/such/folder/study.db", "no such folder"),
    ],
)
def test_a_bad_storage_is_a_one_line_error_and_writes_nothing(tmp_path, capsys, storage, message):
    """Checked before the models load: the task and teacher need not exist. An unreachable
    server (nothing listens on the port) is refused with its password hidden."""
    storage = storage() if callable(storage) else storage
    data = DataConfig(task=str(tmp_path / "task"))
    out = tmp_path / "study"
    args = _tune_args(data, tmp_path / "teacher", out, "--preset", "kd", "--storage", storage)
    assert main(args) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error
    assert "secret" not in error
    if "127.0.0.1:" in message:
        assert "cannot connect (" in error
    assert not out.exists()


def _key(trial) -> tuple:
    return tuple(sorted(trial.params.items()))


def _run_workers(*arguments: list[str]) -> str:
    """Run ``python -m kd.cli ARGS`` for each of ``arguments`` at once; their output, once all
    succeeded."""
    code = [str(Path(__file__).parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(code)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "kd.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for args in arguments
    ]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output
    return "\n".join(outputs)


# slow: four kdw tune processes and a PostgreSQL server, each started for real
@pytest.mark.slow
def test_workers_share_postgresql_studies(tiny_teacher, tmp_path, capsys, postgres):
    """Four ``kdw tune`` processes at once, two studies in one PostgreSQL server.

    A grid, two workers each with its own --out: each setting is trained once, by one of them,
    in one run folder; both write the best configuration a lone worker finds on the same grid
    with SQLite (training is deterministic on CPU); a worker with another space or other
    settings is refused. TPE, a space of 6 settings and 3 trials, two workers in one --out (a
    shared file system): 3 distinct settings trained in all, each once and in one run folder,
    whatever they proposed at the same time."""
    data, teacher = tiny_teacher
    space = ["--preset", "kd", "--trials", "4", "--metric", "macro_f1", "--space", "tau=2"]
    space += ["--space", "alpha=0.2,0.8", "--space", "lr=1e-3,3e-2"]  # one best setting
    shared = ["--storage", postgres, "--study-name", "grid", "--no-prune"]
    roots = [tmp_path / "worker0", tmp_path / "worker1"]
    tpe = ["--preset", "kd", "--trials", "3", "--space", "alpha=0.2,0.5,0.8", "--space", "tau=1,4"]
    tpe += ["--storage", postgres, "--study-name", "tpe", "--no-prune"]
    tpe_worker = _tune_args(data, teacher, tmp_path / "shared", *tpe)
    output = _run_workers(
        *(_tune_args(data, teacher, root, *space, *shared) for root in roots),
        tpe_worker,
        tpe_worker,
    )

    study = optuna.load_study(study_name="tpe", storage=postgres)
    trained = [t for t in study.trials if "run" in t.user_attrs]
    assert len({_key(t) for t in trained}) == len(trained) == 3, output
    counted = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert {_key(t) for t in counted} == {_key(t) for t in trained}
    folders = {p.name for p in (tmp_path / "shared" / "trials").iterdir()}
    assert folders == {trial_folder(t.params) for t in trained}
    gave_way = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    unexplained = [
        (t.number, t.params, t.user_attrs, t.system_attrs)
        for t in gave_way
        if not ({"duplicate", "surplus"} & t.user_attrs.keys())
    ]
    assert not unexplained, (unexplained, output)  # a failure that is not a worker giving way

    study = optuna.load_study(study_name="grid", storage=postgres)
    grid = {(("alpha", a), ("lr", lr), ("tau", 2.0)) for a in (0.2, 0.8) for lr in (1e-3, 3e-2)}
    # a worker that asks for a trial once the grid is taken gives way before choosing settings
    surplus = [t for t in study.trials if t.user_attrs.get("surplus")]
    assert all(t.state == optuna.trial.TrialState.FAIL and not t.params for t in surplus)
    tried = [t for t in study.trials if t not in surplus]
    assert sorted(_key(t) for t in tried) == sorted(grid)  # each setting once, no other
    assert {t.state for t in tried} == {optuna.trial.TrialState.COMPLETE}
    folders = [{p.name for p in (root / "trials").iterdir()} for root in roots]
    assert not folders[0] & folders[1]
    assert folders[0] | folders[1] == {trial_folder(dict(key)) for key in grid}
    assert len({t.user_attrs["worker"] for t in tried}) == 2  # both took trials

    alone = tmp_path / "alone"
    assert main([*_tune_args(data, teacher, alone, *space), "--no-prune"]) == 0
    single = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{alone / 'study.db'}")
    assert {_key(t): t.value for t in tried} == {_key(t): t.value for t in single.trials}
    expected = json.loads((alone / "best.json").read_text())
    first, second = sorted((t.value for t in single.trials), reverse=True)[:2]
    assert expected["tuned"]["dev"] == first > second  # no tie decides it
    for root in roots:
        best = json.loads((root / "best.json").read_text())
        assert best["objective"] == expected["objective"]
        assert best["tuned"]["params"] == expected["tuned"]["params"]
        assert best["tuned"]["dev"] == expected["tuned"]["dev"]
        assert best["tuned"]["storage"] == postgres and best["tuned"]["study"] == "grid"

    # a later call on the finished study trains nothing and writes the same summary
    before = sorted(p.stat().st_mtime_ns for p in roots[0].glob("trials/*/status.json"))
    summary = json.loads((roots[0] / "best.json").read_text())
    assert main(_tune_args(data, teacher, roots[0], *space, *shared)) == 0
    assert sorted(p.stat().st_mtime_ns for p in roots[0].glob("trials/*/status.json")) == before
    assert json.loads((roots[0] / "best.json").read_text()) == summary

    capsys.readouterr()
    for extra, message in (
        (["--space", "alpha=0.2,0.5"], "is a study of space"),
        (["--seed", "7"], "was made with other settings (--seed 42 → 7)"),
    ):
        other = tmp_path / "other"
        assert main(_tune_args(data, teacher, other, *space, *shared, *extra)) == 2
        error = capsys.readouterr().err.strip()
        assert "study 'grid' in postgresql+psycopg2://" in error and message in error, error
        assert len(error.splitlines()) == 1 and not other.exists()


def test_a_study_is_joined_in_its_format_with_its_settings_and_damaged_settings_refused():
    objective = ObjectiveConfig(preset="kd", weights={"ce": 0.5, "kd": 0.5})
    settings = study_settings(
        DataConfig(), StudentConfig(teacher="t"), objective, OptimConfig(), "accuracy", True
    )
    attrs = {"preset": "kd", "task": "tweets", "space": {"alpha": "0:1"}, "settings": settings}
    study = optuna.create_study()  # in memory: the attributes as a database gives them back
    recorded = json.loads(json.dumps(settings))
    for key, value in with_format(attrs | {"settings": recorded}).items():
        study.set_user_attr(key, value)
    _check_record(study, attrs, "here", "start over")  # joined: the same settings
    recorded["configs"]["objective"]["weights"] = {"ce": -1}
    study.set_user_attr("settings", recorded)
    with pytest.raises(WorkbenchError) as refused:
        _check_record(study, attrs, "here", "start over")
    assert str(refused.value).startswith(
        "here records damaged settings (configs.objective: --weights: {'ce': -1} is not allowed"
    )
    assert str(refused.value).endswith("): start over")
    study.set_user_attr(FORMAT_KEY, RECORD_FORMAT + 1)
    with pytest.raises(WorkbenchError, match=r"^here has record format 2, this release reads"):
        _check_record(study, attrs, "here", "start over")


def test_a_trial_read_while_it_writes_its_settings_keeps_them_planned():
    """A worker reads the others' trials while they write their parameters one at a time: a
    queued trial's setting stays planned (a worker that took it for untried queued it again,
    and the grid had a setting tried twice), and a trial that has chosen only some of its
    parameters plans a setting of its own, not the few it wrote."""
    study = optuna.create_study()
    study.enqueue_trial({"alpha": 0.8, "tau": 2.0})
    queued, free = study.ask(), study.ask()
    for trial in (queued, free):
        trial.suggest_float("alpha", 0.0, 1.0)  # the first of its two parameters written
    assert queued.params == {"alpha": 0.8}
    assert _planned(study.get_trials(deepcopy=False)) == {
        (("alpha", 0.8), ("tau", 2.0)),
        (("trial", free.number),),
    }
    for trial in (queued, free):
        trial.suggest_float("tau", 1.0, 4.0)
    study.tell(free, 0.5)
    assert _planned(study.get_trials(deepcopy=False)) == {
        (("alpha", 0.8), ("tau", 2.0)),
        tuple(sorted(free.params.items())),
    }


def test_the_trials_table_names_why_a_trial_gave_way_even_to_trial_0():
    """A worker's trial that meets trial 0 training the same settings records the twin's number,
    0: the table still says "duplicate", not "fail"."""
    study = optuna.create_study()
    alpha = optuna.distributions.FloatDistribution(0.0, 1.0)
    for attrs in ({"run": "trials/a"}, {"duplicate": 0}, {"surplus": True}, {}):
        trained = "run" in attrs
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE if trained else optuna.trial.TrialState.FAIL,
                value=0.5 if trained else None,
                params={"alpha": 0.2},
                distributions={"alpha": alpha},
                user_attrs=attrs,
            )
        )
    states = [row["state"] for row in trials_table(study)]
    assert states == ["complete", "duplicate", "surplus", "fail"]

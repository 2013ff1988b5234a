"""Experiment tracking: a training followed in TensorBoard or MLflow beside its run folder
(``--report-to``: :class:`TrackingConfig`). docs/tracking.md says what is
tracked (:func:`scalars`, :func:`settings`), under which names, where (:func:`store_uri`), and
how the tracked run of a killed training resumes with it.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from workbench.core.config import Checked, option
from workbench.core.errors import WorkbenchError, first_line, mask_secrets
from workbench.core.files import RECORD_LIMIT, atomic_write_json, read_json_file
from workbench.core.runs import Run

TRACKING_FILE = "tracking.json"  # in a run (or study) folder: {"mlflow": {uri: run id}}
TENSORBOARD_DIR = "tensorboard"
STORE_DIR = "mlruns"  # the default MLflow store, beside the run folders
EXPERIMENT = "kd-workbench"
REACH_TIMEOUT = 3.0  # seconds to wait for an MLflow server's answer before training
PACKAGES = {  # tracker → (module it needs, the package that has it)
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}
MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "killed": "KILLED"}
BATCH = 1000  # MLflow's most metrics in one log_batch call (and params: 100)
TRACKERS = tuple(PACKAGES)  # what --report-to offers


def parse_trackers(items: str | Sequence[str]) -> tuple[str, ...]:
    """``"tensorboard,mlflow"`` (or the repeated option's items, each a comma list) →
    ``("tensorboard", "mlflow")``, each once, in the order given; ``none`` names no tracker.
    A tracker that is not offered is a one-line error saying which are."""
    names = [
        name.strip().lower()
        for item in ([items] if isinstance(items, str) else items)
        for name in str(item).split(",")
        if name.strip()
    ]
    unknown = [name for name in names if name not in (*TRACKERS, "none")]
    if unknown:
        raise WorkbenchError(
            f"--report-to {unknown[0]}: not offered; use {', '.join(TRACKERS)} (comma-separated) "
            "or none"
        )
    return tuple(dict.fromkeys(name for name in names if name != "none"))


@dataclass
class TrackingConfig(Checked):
    """Experiment trackers that follow a training beside its run folder."""

    report_to: tuple[str, ...] = option(
        (),
        "send the training's curves (every metrics.jsonl scalar at its step), its settings "
        "and its test results to experiment trackers: a comma list of "
        f"{', '.join(TRACKERS)} (default: none). TensorBoard writes RUN/tensorboard/; MLflow "
        "writes to --mlflow-uri",
    )
    mlflow_uri: str | None = option(
        None,
        "MLflow tracking URI: a server (http://HOST:PORT) or a database such as "
        "sqlite:///PATH/mlflow.db (default: a local store, mlruns/mlflow.db beside the run "
        "folder: in the folder that holds it, or in kdw tune's --out)",
    )

    def __post_init__(self) -> None:
        self.report_to = parse_trackers(self.report_to)
        if self.mlflow_uri and "mlflow" not in self.report_to:
            raise WorkbenchError(
                f"--mlflow-uri {self.mlflow_uri} is where MLflow runs go: add mlflow to "
                "--report-to, or leave --mlflow-uri out"
            )
        super().__post_init__()


def check(config: TrackingConfig) -> None:
    """Refuse, in one line and before anything is written, a tracker whose package is not
    installed and an MLflow URI that cannot serve: a server that does not answer within
    :data:`REACH_TIMEOUT` seconds, a local folder store (retired by MLflow: a database is
    used instead), a database file whose folder does not exist."""
    for name in config.report_to:
        module, package = PACKAGES[name]
        if find_spec(module) is None:
            raise WorkbenchError(
                f"--report-to {name} needs the {package} package: pip install "
                "'kd-workbench[tracking]'"
            )
    if config.mlflow_uri:
        _check_uri(config.mlflow_uri)


def _check_uri(uri: str) -> None:
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        # credentials in the URI go in a header: urllib reads them as part of the host
        health = parsed._replace(  # its query kept: a proxy may want its token there
            netloc=parsed.netloc.rpartition("@")[2], path=f"{parsed.path.rstrip('/')}/health"
        )
        request = urllib.request.Request(health.geturl())
        if parsed.username is not None:
            user = f"{unquote(parsed.username)}:{unquote(parsed.password or '')}"
            request.add_header("Authorization", f"Basic {b64encode(user.encode()).decode()}")
        try:
            urllib.request.urlopen(request, timeout=REACH_TIMEOUT).close()
        except urllib.error.HTTPError:
            return  # it answered
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise WorkbenchError(
                f"--mlflow-uri {uri} cannot be reached ({first_line(reason)}): start the "
                "MLflow server, or give another URI"
            ) from None
    elif parsed.scheme in ("", "file"):
        raise WorkbenchError(
            f"--mlflow-uri {uri}: MLflow keeps runs in a database or behind a server, not in a "
            "folder: give sqlite:///PATH/mlflow.db or http://HOST:PORT"
        )
    elif parsed.scheme != "sqlite":  # a database server: its driver installed
        database_url(uri, "--mlflow-uri")
    else:
        database = Path(uri.removeprefix("sqlite:///"))
        if not database.parent.is_dir():
            raise WorkbenchError(f"--mlflow-uri {uri}: the folder {database.parent} does not exist")
        if database.exists() and not database.is_file():
            raise WorkbenchError(
                f"--mlflow-uri {uri}: {database} is not a database file (a device, a folder): "
                "name a file, sqlite:///PATH/mlflow.db"
            )


# the Python package of each SQLAlchemy driver not named alike, for the error to install it
DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "pymysql": "PyMySQL",
    "mysqldb": "mysqlclient",
    "mysqlconnector": "mysql-connector-python",
}


def database_url(uri: str, option: str):
    """The SQLAlchemy URL, its dialect and the URL as shown (its password hidden) of the
    database URL ``uri`` that ``option`` gave, once SQLAlchemy knows its dialect and its driver
    is installed; else one line naming the package to install. Nothing is connected to."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
    except ArgumentError:  # the text is not echoed: it may hold a password
        raise WorkbenchError(
            f"{option}: not a database URL: write DIALECT+DRIVER://USER:PASSWORD@HOST:PORT/"
            "DATABASE, such as postgresql+psycopg2://kdw@db.lan:5432/studies, or "
            "sqlite:///study.db"
        ) from None
    shown = url.render_as_string(hide_password=True)
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        raise WorkbenchError(
            f"{option} {shown}: SQLAlchemy knows no database {url.drivername!r}: use "
            "postgresql+psycopg2, postgresql+psycopg, mysql+pymysql or sqlite"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError:
        package = DRIVER_PACKAGES.get(dialect.driver, dialect.driver)
        raise WorkbenchError(
            f"{option} {shown}: the driver {dialect.driver} is not installed: "
            f"pip install '{package}'"
        ) from None
    return url, dialect, shown


def store_uri(config: TrackingConfig, root: Path) -> str:
    """Where MLflow runs go: ``--mlflow-uri``, or the local store under ``root`` (the folder
    that holds the run folders): ``root/mlruns/mlflow.db``."""
    if config.mlflow_uri:
        return config.mlflow_uri
    return f"sqlite:///{(Path(root) / STORE_DIR / 'mlflow.db').resolve()}"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A ``metrics.jsonl`` record's scalars as trackers name them: ``SPLIT/NAME`` for every
    number but the step (``{"step": 20, "split": "train", "lr": 1e-4}`` →
    ``{"train/lr": 1e-4}``)."""
    split = record.get("split", "train")
    return {
        f"{split}/{name}": float(value)
        for name, value in record.items()
        if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def results_scalars(results: dict[str, dict[str, float | None]]) -> dict[str, float]:
    """``results.json`` (``{"test": {"accuracy": 0.9}}``) as ``{"results/test/accuracy": 0.9}``;
    a metric without a value (None) is left out."""
    return {
        f"results/{split}/{name}": float(value)
        for split, metrics in results.items()
        for name, value in metrics.items()
        if value is not None
    }


def settings(record: dict[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """A JSON record (``run.json``) flattened into parameters: ``configs.optim.learning_rate``;
    strings, numbers and booleans as they are, anything else (lists, null) as JSON text."""
    flat: dict[str, str | int | float | bool] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat |= settings(value, f"{name}.")
        elif isinstance(value, str | int | float | bool):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


class Tracker:
    """What the trainer and the pipeline tell a tracker. This base tracks nothing (no
    ``--report-to``); each method of a real tracker is called on the process that writes
    the run."""

    def start(self, step: int) -> None:
        """Open the tracked run (anew, or reopened after a resume from the checkpoint of
        ``step``, 0 for none) and log the run's settings and the records it already has."""

    def log(self, record: dict[str, Any]) -> None:
        """A record just appended to ``metrics.jsonl``."""
        self._send(scalars(record), record["step"])

    def log_results(self, results: dict[str, dict[str, float | None]], step: int) -> None:
        """The best model's metrics per split (``results.json``), at the last ``step``."""
        self._send(results_scalars(results), step)

    def _send(self, values: dict[str, float], step: int) -> None:
        """Scalars named as :func:`scalars` names them, at ``step``."""

    def log_artifacts(self, paths: Sequence[Path]) -> None:
        """Files that describe the run (those that exist are sent)."""

    def finish(self, state: str) -> None:
        """Close the tracked run; ``state`` is the run's (finished, stopped, diverged, failed,
        killed). Nothing happens when it was not started."""


def _each(name: str):
    """A :class:`Trackers` method that calls ``name`` on each of its trackers."""

    def call(self: Trackers, *args: Any, **kwargs: Any) -> None:
        for tracker in self.trackers:
            getattr(tracker, name)(*args, **kwargs)

    return call


class Trackers(Tracker):
    """Several trackers told the same."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    start = _each("start")
    log = _each("log")
    log_results = _each("log_results")
    log_artifacts = _each("log_artifacts")
    finish = _each("finish")


class TensorBoardTracker(Tracker):
    """Event files in ``RUN/tensorboard/`` (``torch.utils.tensorboard``), flushed after every
    record so that a kill loses nothing logged."""

    def __init__(self, run: Run) -> None:
        self.run, self.folder, self.writer = run, run.path / TENSORBOARD_DIR, None

    def start(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        fresh = not any(self.folder.glob("events.out.tfevents.*"))
        # a resumed run's events from step + 1 on are the killed process's: purged
        self.writer = SummaryWriter(str(self.folder), purge_step=None if fresh else step + 1)
        if fresh:
            values = {
                k: v if isinstance(v, str | bool) else float(v)
                for k, v in settings(self.run.info().plain()).items()
            }
            for summary in hparams(values, {}):
                self.writer.file_writer.add_summary(summary)
            for record in self.run.metrics():  # what the run logged before it was tracked
                self.log(record)
        self.writer.flush()

    def _send(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def finish(self, state: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MlflowTracker(Tracker):
    """One MLflow run per run folder (or study folder, the parent of its trials' runs), named
    after the folder, its id kept in ``FOLDER/tracking.json`` for the store ``uri`` so that a
    resumed training reopens it. ``params`` are logged once each; with ``run``, the records its
    ``metrics.jsonl`` already has that the store lacks are logged when it starts."""

    def __init__(
        self,
        folder: Path,
        params: dict[str, Any],
        uri: str,
        parent: str | None = None,
        run: Run | None = None,
    ) -> None:
        self.folder, self.params, self.uri, self.parent, self.run = folder, params, uri, parent, run
        self.client, self.run_id, self.logged = None, None, set()

    def _experiment(self) -> str:
        """The id of the workbench's experiment in the store, created on first use (in a local
        database, with its artifacts beside the database)."""
        found = self.client.get_experiment_by_name(EXPERIMENT)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):
            location = (Path(self.uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
        return self.client.create_experiment(EXPERIMENT, artifact_location=location)

    def _reopen(self, recorded: str | None) -> bool:
        """Reopen the recorded run if the store still holds it (not deleted)."""
        from mlflow.exceptions import MlflowException

        if recorded is None:
            return False
        try:
            found = self.client.get_run(recorded)
        except MlflowException:
            return False
        if found.info.lifecycle_stage != "active":
            return False
        self.run_id = recorded
        self.client.update_run(recorded, status="RUNNING")
        self.logged = {
            (key, point.step)
            for key in found.data.metrics
            for point in self.client.get_metric_history(recorded, key)
        }
        return True

    def start(self, step: int = 0) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        for name in ("mlflow", "alembic"):  # their notes would interleave with the progress bar
            logging.getLogger(name).setLevel(logging.WARNING)
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        path = self.folder / TRACKING_FILE
        try:
            recorded = (
                read_json_file(path, RECORD_LIMIT, "the tracking record") if path.exists() else {}
            )
        except WorkbenchError as error:
            raise WorkbenchError(
                f"{error}: delete it to track the run in a new MLflow run"
            ) from None
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            shown = mask_secrets(self.uri)  # the record's key: never the password
            if not self._reopen(recorded.get("mlflow", {}).get(shown)):
                tags = {MLFLOW_PARENT_RUN_ID: self.parent} if self.parent else {}
                tags["kdw.folder"] = str(self.folder)
                created = self.client.create_run(
                    self._experiment(), run_name=self.folder.name, tags=tags
                )
                self.run_id = created.info.run_id
                mlflow = {**recorded.get("mlflow", {}), shown: self.run_id}
                atomic_write_json(path, {**recorded, "mlflow": mlflow})
            known = self.client.get_run(self.run_id).data.params
            params = [
                Param(key, value if isinstance(value, str) else json.dumps(value))
                for key, value in self.params.items()
                if key not in known
            ]
            for i in range(0, len(params), 100):
                self.client.log_batch(self.run_id, params=params[i : i + 100])
        except MlflowException as error:
            raise WorkbenchError(f"MLflow at {self.uri}: {first_line(error)}") from None
        for record in self.run.metrics() if self.run is not None else ():
            self.log(record)

    def _send(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [
            Metric(key, value, now, step)
            for key, value in values.items()
            if (key, step) not in self.logged
        ]
        for i in range(0, len(points), BATCH):
            self.client.log_batch(self.run_id, metrics=points[i : i + BATCH])
        self.logged |= {(point.key, step) for point in points}

    def log_artifacts(self, paths: Sequence[Path]) -> None:
        for path in paths:
            if path.exists():
                folder = path.parent.relative_to(self.folder).as_posix()
                self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)

    def finish(self, state: str) -> None:
        if self.run_id is not None:
            with masked_stdout():  # MLflow prints the run's address, credentials and all
                self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(state, "FAILED"))
            self.run_id = None


@contextmanager
def masked_stdout() -> Iterator[None]:
    """What the block prints to stdout (a library's lines), printed when it ends with every
    credential of a URL masked (:func:`~workbench.core.errors.mask_secrets`)."""
    buffer = io.StringIO()
    try:
        with redirect_stdout(buffer):
            yield
    finally:
        sys.stdout.write(mask_secrets(buffer.getvalue()))


@contextmanager
def tracked(config: TrackingConfig, run: Run, parent: str | None = None) -> Iterator[Tracker]:
    """The trackers ``config`` asks for, following ``run`` (in MLflow, a nested run of
    ``parent`` when given); on leaving, each closes with the run's state (failed on an error,
    killed on an interrupt)."""
    trackers: list[Tracker] = []
    if "tensorboard" in config.report_to:
        trackers.append(TensorBoardTracker(run))
    if "mlflow" in config.report_to:
        uri = store_uri(config, run.path.parent)
        trackers.append(MlflowTracker(run.path, settings(run.info().plain()), uri, parent, run))
    tracker = Trackers(trackers)
    with _closing(tracker):
        yield tracker
    tracker.finish(run.status().state)


@contextmanager
def _closing(tracker: Tracker) -> Iterator[None]:
    """Close ``tracker`` as failed on an error, killed on an interrupt, and raise it again."""
    try:
        yield
    except KeyboardInterrupt:
        tracker.finish("killed")
        raise
    except BaseException:
        tracker.finish("failed")
        raise


@contextmanager
def tracked_study(
    config: TrackingConfig, folder: Path, params: dict[str, Any]
) -> Iterator[str | None]:
    """A study's parent MLflow run (``params``: its settings), whose id each trial's run names
    as its parent; None without MLflow. It ends with ``best.json`` as an artifact."""
    if "mlflow" not in config.report_to:
        yield None
        return
    parent = MlflowTracker(folder, settings(params), store_uri(config, folder))
    parent.start()
    with _closing(parent):
        yield parent.run_id
    parent.log_artifacts([folder / "best.json"])
    parent.finish("finished")

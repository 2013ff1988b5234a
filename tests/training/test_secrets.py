"""A password in a URL (``--mlflow-uri``, ``--storage``) never leaves: it is masked in every
message, and no file a run writes — ``run.json``, the manifest, the model card, the tracking
record, the tracker's parameters — holds it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import kdw_here, write_tiny_workspace

PASSWORD = "PLANTED-s3cret"
FAST = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("secrets")
    write_tiny_workspace(work)
    return work


class _Health(BaseHTTPRequestHandler):
    """An MLflow server's health check, behind basic authentication."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_port
    httpd.shutdown()


def _files_holding(folder: Path, secret: str) -> list[str]:
    return [
        str(path)
        for path in folder.rglob("*")
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


REFUSED = {
    "an unreachable MLflow server": (
        ["--report-to", "mlflow", "--mlflow-uri", f"http://kd:{PASSWORD}@127.0.0.1:9"],
        "--mlflow-uri http://kd:***@127.0.0.1:9 cannot be reached",
    ),
    "a device as MLflow's database": (
        ["--report-to", "mlflow", "--mlflow-uri", "sqlite:////dev/zero"],
        "--mlflow-uri sqlite:////dev/zero: /dev/zero is not a database file",
    ),
    "a database in a folder that does not exist": (
        ["--report-to", "mlflow", "--mlflow-uri", f"sqlite://kd:{PASSWORD}@/nowhere/x/ml.db"],
        "--mlflow-uri sqlite://kd:***@/nowhere/x/ml.db: the folder sqlite:/kd:***@/nowhere/x does "
        "not exist",
    ),
    "a database server whose driver is not installed": (
        ["--report-to", "mlflow", "--mlflow-uri", f"postgresql://kd:{PASSWORD}@127.0.0.1:9/x"],
        "--mlflow-uri postgresql://kd:***@127.0.0.1:9/x: the driver psycopg",
    ),
    "a run folder where nothing can be written": (
        ["--run-dir", "/proc/x/run"],
        "--run-dir /proc/x/run: cannot write in /proc",
    ),
    "an MLflow URI without --report-to mlflow": (
        ["--mlflow-uri", f"http://kd:{PASSWORD}@127.0.0.1:9"],
        "--mlflow-uri http://kd:***@127.0.0.1:9 is where MLflow runs go",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_refused_uri_is_named_without_its_password(work, tmp_path, case):
    options, said = REFUSED[case]
    command = ["train-teacher", "--model", str(work / "tiny-bert"), "--task", str(work / "task")]
    status, err = kdw_here([*command, "--run-dir", str(tmp_path / "run"), *options], tmp_path)
    assert status == 2 and err.startswith("kdw: error: ") and len(err.splitlines()) == 1
    assert said in err and PASSWORD not in err
    assert not (tmp_path / "run").exists()


def test_the_storage_of_a_search_is_named_without_its_password(work, tmp_path):
    storage = f"postgresql://kd:{PASSWORD}@127.0.0.1:9/optuna"
    command = ["tune", "--teacher", str(work / "tiny-bert"), "--task", str(work / "task")]
    status, err = kdw_here([*command, "--out", str(tmp_path / "s"), "--storage", storage], tmp_path)
    assert status == 2 and "postgresql://kd:***@127.0.0.1:9/optuna" in err
    assert PASSWORD not in err


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("http://kd:S@h:5000/x", "http://kd:***@h:5000/x"),
        ("https://S@h/api", "https://***@h/api"),  # a token as the user
        ("http://h:5000/?token=S&experiment=1", "http://h:5000/?token=***&experiment=1"),
        ("s3://b/k?X-Amz-Signature=S&X-Amz-Date=1", "s3://b/k?X-Amz-Signature=***&X-Amz-Date=1"),
        ("http://h/?api_key=S;password=S", "http://h/?api_key=***;password=***"),
        ("sqlite:///runs/mlflow.db", "sqlite:///runs/mlflow.db"),
        ("sqlite:/kd:S@/tmp/x", "sqlite:/kd:***@/tmp/x"),  # a path made of a URL: one slash
        (
            "postgresql://kd:S@db/optuna?sslmode=require",
            "postgresql://kd:***@db/optuna?sslmode=require",
        ),
    ],
)
def test_every_credential_of_a_url_is_masked(given, shown):
    from workbench.core.errors import mask_secrets

    assert mask_secrets(f"at {given} now") == f"at {shown} now"


def test_what_mlflow_prints_of_a_run_is_masked(capsys):
    """MLflow prints where a finished run is (``View run … at: URL``) with the URI's
    credentials: the workbench prints that line masked."""
    from kd.training.tracking import masked_stdout

    with masked_stdout():
        print(f"View run teacher at: http://kd:{PASSWORD}@h:5000/#/runs/1?token={PASSWORD}")
    assert (
        capsys.readouterr().out == "View run teacher at: http://kd:***@h:5000/#/runs/1?token=***\n"
    )


@pytest.mark.parametrize(
    "uri",
    [
        f"http://kd:{PASSWORD}@127.0.0.1:{{port}}",
        pytest.param(f"http://127.0.0.1:{{port}}/?token={PASSWORD}", marks=pytest.mark.slow),
    ],
)
def test_no_file_a_tracked_run_writes_holds_the_password(work, tmp_path, server, monkeypatch, uri):
    """A run tracked in an MLflow server behind a password or a token in its address (its store
    here a local database the client is pointed to: the workbench only sees the URI) writes the
    URI masked."""
    import mlflow

    uri = uri.format(port=server)
    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    real = mlflow.MlflowClient
    monkeypatch.setattr(mlflow, "MlflowClient", lambda tracking_uri: real(tracking_uri=store))
    run = tmp_path / "runs" / "teacher"
    command = [
        *("train-teacher", "--model", str(work / "tiny-bert"), "--task", str(work / "task")),
        *("--run-dir", str(run), *FAST, "--report-to", "mlflow", "--mlflow-uri", uri),
    ]
    monkeypatch.setattr(sys, "argv", ["kdw", *command])  # what the manifest records
    status, err = kdw_here(command, tmp_path)
    assert status == 0, err
    assert (run / "results.json").exists() and (run / "tracking.json").exists()
    if "kd:" in uri:  # the password sent, as a header
        assert _Health.seen and _Health.seen[-1].startswith("Basic ")
    assert PASSWORD not in err
    assert _files_holding(run, PASSWORD) == []
    assert _files_holding(tmp_path / "store", PASSWORD) == []  # the tracker's parameters
    assert uri.replace(PASSWORD, "***") in (run / "manifest.json").read_text()


def test_a_hub_endpoint_that_does_not_answer_is_named_without_its_password(
    work, tmp_path, monkeypatch
):
    """``HF_ENDPOINT`` with credentials, and no hub answering there: the refusal of a hub id
    that is not in the local cache names the endpoint, its password masked."""
    from huggingface_hub import constants

    from workbench.core import hub

    monkeypatch.setattr(constants, "ENDPOINT", f"http://kd:{PASSWORD}@127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    hub._endpoint_answers.cache_clear()
    try:
        command = ["evaluate", "someone/no-such-model", "--task", str(work / "task")]
        status, err = kdw_here(command, tmp_path)
    finally:
        hub._endpoint_answers.cache_clear()
    assert status == 2 and "the hub is unreachable (http://kd:***@127.0.0.1:9 does" in err
    assert PASSWORD not in err

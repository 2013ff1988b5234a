"""Names offline: a path that does not exist fails at once, and a hub name without the hub fails
in seconds with one line saying how to use a local copy. No test here touches the network."""

from __future__ import annotations

import socket
import time

import pytest

from workbench.core import hub
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.errors import WorkbenchError
from workbench.core.files import looks_like_path
from workbench.core.models import load_classifier, load_tokenizer, resolve_model


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _one_line_error(call, *args, **kwargs) -> str:
    start = time.monotonic()
    with pytest.raises(WorkbenchError) as info:
        call(*args, **kwargs)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("name", "hub_ids", "expected"),
    [
        ("bert-base-uncased", True, False),
        ("google/bert_uncased_L-2_H-128_A-2", True, False),
        ("models/bert/base", True, True),
        ("./bert", True, True),
        ("~/bert", True, True),
        ("/models/bert", True, True),
        ("weights.safetensors", True, True),
        ("sst2", False, False),
        ("data/reviews", False, True),
        ("reviews.CSV", False, True),
        ("reviews.parquet", False, True),
        ("C:\\data\\reviews", False, True),
    ],
)
def test_what_looks_like_a_path(name, hub_ids, expected):
    assert looks_like_path(name, hub_ids=hub_ids) is expected


def test_a_missing_path_is_named_at_once(tmp_path, no_network, monkeypatch):
    for name in ("./nowhere/model", "a/b/c", "model.safetensors", str(tmp_path / "gone")):
        assert _one_line_error(resolve_model, name) == f"no such file or folder: {name}"
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)  # models/nope: a missing folder in a local folder, no hub id
    assert _one_line_error(resolve_model, "models/nope") == "no such file or folder: models/nope"
    assert _one_line_error(load_task, DataConfig(task="data/missing.csv")) == (
        "no such file or folder: data/missing.csv"
    )
    assert _one_line_error(load_task, DataConfig(task="data/missing")).startswith(
        "cannot load hub data set 'data/missing' (no local file or folder of that name either)"
    )
    assert _one_line_error(load_task, DataConfig(task="sst2", glue_dir="./no-glue")) == (
        "no such file or folder: ./no-glue"
    )


@pytest.mark.parametrize("load", [load_tokenizer, lambda name: load_classifier(name, 2)])
def test_a_hub_id_in_offline_mode_fails_in_seconds(load, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = _one_line_error(load, "no-such-org/no-such-model")
    assert "'no-such-org/no-such-model': the hub is unreachable (HF_HUB_OFFLINE is set)" in message
    assert "not in the local cache either: pass a local directory" in message


def test_a_hub_that_does_not_answer_is_not_retried(monkeypatch, no_network):
    monkeypatch.setattr(hub, "_endpoint_answers", lambda: False)
    message = _one_line_error(load_tokenizer, "no-such-org/no-such-model")
    assert "does not answer); it is not in the local cache either" in message
    message = _one_line_error(load_task, DataConfig(task="sst2"))
    assert message.startswith("cannot load GLUE sst2: the hub is unreachable")
    assert "pass --glue-dir" in message and "HF_HUB_OFFLINE=1" in message


def test_the_hub_check_gives_up_on_a_closed_port(monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as server:  # a port that refuses: bound, never listening
        server.bind(("127.0.0.1", 0))
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        hub._endpoint_answers.cache_clear()
        start = time.monotonic()
        assert not hub._endpoint_answers()
    hub._endpoint_answers.cache_clear()
    assert time.monotonic() - start < hub.CHECK_SECONDS + 1

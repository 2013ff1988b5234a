"""``kdw app`` starts the workbench's server from the installed package, wherever it is run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import ROOT


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_kdw_app_serves_the_workbench_from_any_folder(tmp_path: Path):
    port = _free_port()
    command = [sys.executable, "-m", "kd.cli", "app", "--runs", str(tmp_path / "runs")]
    command += ["--port", str(port), "--", "--server.address", "127.0.0.1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KDW_DEMO": "off"}
    server = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline, answer = time.time() + 120, None
        while time.time() < deadline and server.poll() is None and answer is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/_stcore/health", timeout=2
                ) as r:
                    answer = r.read()
            except OSError:
                time.sleep(0.5)
        assert answer == b"ok", server.stdout.read().decode() if server.poll() is not None else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_the_servers_settings_are_the_clones():
    """``kdw app`` passes the settings that ``streamlit run app.py`` reads from the clone's
    ``.streamlit/config.toml``: local only, no usage statistics, the upload limit."""
    import tomllib

    from workbench.app import SERVER_OPTIONS

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    flat = {
        f"{section}.{key}": value for section, keys in config.items() for key, value in keys.items()
    }
    assert flat == SERVER_OPTIONS

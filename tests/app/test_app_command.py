"""``kdw app`` starts the workbench's server from the installed package, wherever it is run; a
wheel of the package installed outside the repository has the command and the app."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app.test_first_run import tiny_sizes
from tests.conftest import ROOT, served
from workbench.app import jobs, runner


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


LAUNCHES = {  # how a user starts the app: installed, from any folder; in a clone
    "kdw app": [sys.executable, "-m", "kd.cli", "app", "--runs", "{runs}", "--port", "{port}"],
    "streamlit run app.py": [
        sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", "{port}",
    ],
}  # fmt: skip


# slow: a real server started, and a tiny demo build beside it
@pytest.mark.slow
@pytest.mark.parametrize("launch", LAUNCHES)
def test_the_server_starts_the_demo_build_before_any_page_is_opened(
    tmp_path: Path, tiny_model_dir: Path, launch: str
):
    """Started as a user starts it (``kdw app`` from any folder, ``streamlit run app.py`` in
    the clone), the server answers, and the demo build has begun and says so on the terminal
    although no browser opened a page (the health check and the page's HTML run no script)."""
    port, runs = _free_port(), tmp_path / "runs"
    command = [a.format(runs=runs, port=port) for a in LAUNCHES[launch]]
    command += [*(["--"] if launch == "kdw app" else []), "--server.address", "127.0.0.1"]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KDW_RUNS": str(runs),
        "KDW_DEMO": "quick",
        runner.SIZES_ENV: tiny_sizes(tiny_model_dir),
    }
    log = tmp_path / "server.log"
    with served(
        command, f"http://127.0.0.1:{port}/_stcore/health", launch, log, env=env, cwd=tmp_path
    ):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        quick = runs / runner.DEMO_FOLDERS["quick"]
        deadline = time.time() + 60
        while not jobs.read_progress(quick) and time.time() < deadline:
            time.sleep(0.2)
        assert jobs.read_progress(quick), log.read_text()
    assert f"kd-workbench: no runs under {runs}: building the demo" in log.read_text()


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


# the first page's title, and what it says before any run exists
FIRST_PAGE = """
import sys
from streamlit.testing.v1 import AppTest
import workbench.app.main as main
assert main.__file__.startswith(sys.prefix), main.__file__  # the installed copy
at = AppTest.from_file(main.__file__, default_timeout=120).run()
assert not at.exception, [e.value for e in at.exception]
print([t.value for t in at.title], [i.value for i in at.info])
"""


REPORT_TEMPLATE = """
from kd.experiments.reproduce.report import TEMPLATE, environment
print(environment().get_template(TEMPLATE).filename)
"""


# slow: a wheel built and installed into a new virtual environment, then started
@pytest.mark.slow
def test_a_wheel_installed_outside_the_repository_has_the_command_and_the_app(tmp_path: Path):
    """The package built as a wheel (from a copy of its sources: the clone stays clean) and
    installed into a fresh virtual environment outside the repository, whose other packages
    come from this environment (after the wheel's own, on its path): ``kdw --help``,
    ``kdw app --help``, the app's entry script, found in the installed package, renders
    its first page, and the reproduction report's template is found in the installed package."""
    source = tmp_path / "source"
    for package in ("workbench", "kd"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("kd_workbench-*.whl")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = str(env / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", purelib], text=True).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True)

    variables = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    variables |= {"KDW_DEMO": "off", "KDW_RUNS": str(tmp_path / "runs")}

    def run(*command: str) -> str:
        result = subprocess.run(
            command, cwd=tmp_path, env=variables, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert run(str(env / "bin" / "kdw"), "--help").startswith("usage: kdw [-h] COMMAND")
    assert run(str(env / "bin" / "kdw"), "app", "--help").startswith("usage: kdw app ")
    page = run(python, "-c", FIRST_PAGE)
    assert page.startswith("['Case study'] ['No trained teacher yet"), page
    template = run(python, "-c", REPORT_TEMPLATE).strip()  # package data, found where installed
    assert Path(template).is_relative_to(site) and template.endswith("report.md.j2"), template


def test_streamlits_own_options_go_to_streamlit_run_as_it_takes_them(tmp_path, monkeypatch):
    from kd.cli import main

    started = []
    monkeypatch.delenv("KDW_RUNS", raising=False)  # restored after the test
    monkeypatch.setattr(os, "execv", lambda program, argv: started.append(argv))
    command = ["app", "--runs", str(tmp_path), "--server.headless", "true", "--port", "9"]
    assert main([*command, "--theme.base=dark", "--", "--server.address", "127.0.0.1"]) == 0
    (argv,) = started
    assert argv[argv.index("workbench.app.serve") + 1 :] == [
        "--server.port=9",
        "--server.headless",
        "true",
        "--theme.base=dark",
        "--server.address",
        "127.0.0.1",
    ]
    assert os.environ["KDW_RUNS"] == str(tmp_path.resolve())

"""Seconds from ``streamlit run app.py`` on an empty runs root to the first student heatmap row of
the case study, in Debian's headless Chromium through Playwright (the browser set-up of
``tests/app/test_app_e2e.py``). The app builds its first-run demo itself (``$KDW_DEMO``, default
``default``: the quick demo first, then the full one); the script also prints when each build
stage began, from the build's progress files. The server, its demo job and the browser are
stopped at the end; the runs root is a temporary folder unless ``--keep`` names one.

    python -m bench.first_launch                  # the real first launch: minutes
    python -m bench.first_launch --tiny           # the machinery on a tiny random BERT (~2 min)
    KDW_DEMO=quick python -m bench.first_launch --keep runs-first

``--tiny`` points the demo at a tiny random BERT (``$KDW_DEMO_SIZES``, built with the tests'
helpers) to check the script itself; its figures say nothing about the real first launch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import write_results
from workbench.app.runner import DEMO_FOLDERS, PROGRESS_FILE, SIZES_ENV
from workbench.core.files import read_json_lines

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ROWS = "document.querySelectorAll('.kdw-row').length"


def _tiny_sizes(folder: Path) -> str:
    """``$KDW_DEMO_SIZES`` for a demo on a tiny random BERT saved in ``folder``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tests.conftest import tiny_model, tiny_tokenizer

    tiny_tokenizer(folder)
    tiny_model().save_pretrained(folder)
    sizes = {"train_examples": 64, "eval_examples": 32, "max_length": 16, "teacher_model": folder}
    return json.dumps(sizes | {"teacher_epochs": 1.0, "student_epochs": 1.0}, default=str)


def _serve(runs: Path, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``streamlit run app.py`` in a process group of its own (its demo job joins it)."""
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
    command += ["--server.address", "127.0.0.1", "--server.headless", "true"]
    env = {**env, "KDW_RUNS": str(runs), "PYTHONPATH": str(ROOT)}
    with open(log, "w") as output:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the app did not start:\n{log.read_text()}") from None
            time.sleep(0.5)


def _stages(runs: Path, start: float) -> list[dict]:
    """When each stage of the demo build began, in seconds after the launch."""
    rows = []
    for size, folder in DEMO_FOLDERS.items():
        for record in read_json_lines(runs / folder / PROGRESS_FILE):
            if set(record) == {"stage", "time"}:
                seconds = round(record["time"] - start, 1)
                rows.append({"demo": size, "stage": record["stage"], "seconds": seconds})
    return sorted(rows, key=lambda row: row["seconds"])


def measure(runs: Path, env: dict[str, str], timeout: float, port: int, log: Path) -> dict:
    """Launch the app on ``runs`` (its output to ``log``) and time the case study's first
    teacher and student rows."""
    from playwright.sync_api import sync_playwright

    url = f"http://127.0.0.1:{port}"
    start = time.time()
    server = _serve(runs, port, env, log)
    try:
        _wait_healthy(url, server, log)
        served = time.time() - start
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            options = {"timeout": timeout * 1000, "polling": 1000}
            page.wait_for_function(f"() => {ROWS} >= 1", **options)
            teacher = time.time() - start
            page.wait_for_function(f"() => {ROWS} >= 2", **options)
            student = time.time() - start
            row = page.locator(".kdw-row").nth(1).inner_text()
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    return {
        "server_up_s": round(served, 1),
        "first_teacher_row_s": round(teacher, 1),
        "first_student_row_s": round(student, 1),
        "student_row": " ".join(row.split())[:120],
        "stages": _stages(runs, start),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random BERT (checks only)")
    parser.add_argument("--keep", help="an empty folder to use as the runs root, kept after")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait per row")
    parser.add_argument("--port", type=int, default=8531)
    args = parser.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="kdw-first-launch-") as temporary:
        runs = Path(args.keep or Path(temporary) / "runs").resolve()
        if runs.exists() and any(runs.iterdir()):
            raise SystemExit(f"{runs} is not empty: the first launch needs an empty runs root")
        runs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if args.tiny:
            env[SIZES_ENV] = _tiny_sizes(Path(temporary) / "tiny-bert")
        log = Path(temporary) / "streamlit.log"
        try:
            result = measure(runs, env, args.timeout, args.port, log)
        except Exception:
            print(log.read_text()[-4000:], file=sys.stderr)
            raise
    result |= {"demo": env.get("KDW_DEMO", "default"), "tiny": args.tiny}
    result["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    for stage in result["stages"]:
        print(f"{stage['seconds']:8.1f} s  {stage['demo']:8}  {stage['stage']}")
    print(f"first student heatmap row: {result['first_student_row_s']} s after the launch")
    if not args.tiny:
        write_results("first-launch", result)


if __name__ == "__main__":
    main()

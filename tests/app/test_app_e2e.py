"""End to end: ``streamlit run app.py`` on a loopback port, driven by Debian's headless Chromium
through Playwright — a case study typed by a user, its heatmap rows checked and screenshotted.

The runs are tiny ones built here, or ``$KDW_E2E_RUNS`` (e.g. ``runs`` after the demo build);
with ``$KDW_SCREENSHOTS`` set, a screenshot of every page is saved there (how the pictures in
``assets/``, shown by the README and docs/app.md, are made)."""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.test_app import HOSTILE, STUDENTS, build_tiny_runs
from tests.app.test_first_run import tiny_sizes
from tests.conftest import CHROMIUM, debian_package, served, tiny_model, tiny_tokenizer
from workbench.app import main as app_main
from workbench.app.runner import SIZES_ENV

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# the app's pages, by URL path (the default page's "case-study": the app's own address)
PAGES = {path or "case-study": title for _, title, path in app_main.PAGES}


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, installed with apt when missing and possible."""
    pytest.importorskip("playwright.sync_api", reason="needs the dev extra (playwright)")
    debian_package("chromium")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    """The runs the app shows: tiny ones built here, or ``$KDW_E2E_RUNS``."""
    if "KDW_E2E_RUNS" in os.environ:
        return Path(os.environ["KDW_E2E_RUNS"])
    work = tmp_path_factory.mktemp("e2e")
    build_tiny_runs(work / "runs", work)
    return work / "runs"


@pytest.fixture(scope="module")
def app_url(runs_root, tmp_path_factory) -> Iterator[str]:
    """The app served on a free loopback port, over :func:`runs_root`."""
    runs = str(runs_root)
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "streamlit.log"
    env = {**os.environ, "KDW_RUNS": runs, "KDW_DEMO": "off", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        "app.py",
        "--server.port",
        str(port),
        "--server.address",
        "127.0.0.1",
        "--server.headless",
        "true",
    ]
    url = f"http://127.0.0.1:{port}"
    with served(command, f"{url}/_stcore/health", "the app", log, cwd=ROOT, env=env):
        yield url


@pytest.fixture
def page(chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def _screenshot(page, path: Path) -> Path:
    """The whole page (the viewport stretched to the page's height) as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("() => document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(max(height, 600), 3000)})
    _settle(page)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})
    return path


def _settle(page) -> None:
    """Wait until the app has run its script and the browser has drawn the result."""
    page.wait_for_timeout(500)
    page.wait_for_selector(
        "[data-testid='stApp'][data-test-script-state='notRunning']", timeout=120_000
    )
    for busy in ("[data-testid='stSpinner']", "[data-testid='stSkeleton']"):
        page.wait_for_selector(busy, state="detached", timeout=120_000)
    page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=60_000)
    page.wait_for_timeout(500)


# slow: a real browser on the module's server explains a text with every model it shows
def test_a_case_study_in_the_browser(app_url, page, tmp_path):
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(app_url)
    page.wait_for_selector(".kdw-row", timeout=120_000)
    _settle(page)
    rows = page.locator(".kdw-row")
    assert rows.count() >= 3  # the teacher and its students
    assert "SL" in rows.nth(1).inner_text()
    text = page.get_by_label("Text", exact=True)
    text.fill(HOSTILE.replace(r" $\textbf{x}$", ""))  # within the runs' 16 tokens
    text.press("Control+Enter")
    _settle(page)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.kdw-row')].every("
        "r => r.innerText.includes('good') && !r.innerText.includes('movie'))",
        timeout=60_000,
    )
    _settle(page)
    tokens = page.locator(".kdw-row").first.locator(".kdw-token").all_inner_texts()
    assert "good" in tokens and "movie" not in tokens
    assert not dialogs, "text from the user ran as script"
    assert page.locator("script:has-text('alert(1)')").count() == 0
    shot = _screenshot(page, tmp_path / "case-study-typed.png")
    assert shot.stat().st_size > 10_000


def test_a_long_text_wraps_to_the_page_and_its_rows_wrap_alike(app_url, page):
    page.set_viewport_size({"width": 700, "height": 1000})  # a narrow page: 16 tokens wrap
    page.goto(app_url)
    page.wait_for_selector(".kdw-row", timeout=120_000)
    _settle(page)
    text = page.get_by_label("Text", exact=True)
    text.fill(" ".join(["good", "film", "bad", "end"] * 15))  # 60 words, 62 tokens
    text.press("Control+Enter")
    page.wait_for_function(  # read as the runs were trained: the first 16 tokens
        "() => document.querySelectorAll('.kdw-row')[0]?.querySelectorAll('.kdw-token')"
        ".length === 16",
        timeout=60_000,
    )
    _settle(page)
    heatmap = page.locator(".kdw-heatmap")
    assert heatmap.evaluate("e => e.scrollWidth <= e.clientWidth")
    right = heatmap.bounding_box()["x"] + heatmap.bounding_box()["width"]
    lines = page.evaluate(  # per row: the token indices where a new line starts
        """() => [...document.querySelectorAll('.kdw-row')].map(row => {
            const tops = [...row.querySelectorAll('.kdw-token')].map(t => t.offsetTop);
            return tops.flatMap((top, i) => (i > 0 && top > tops[i - 1] ? [i] : []));
        })"""
    )
    assert lines[0], "a 62-token text fits no line of the page"
    assert all(line == lines[0] for line in lines), lines  # one tokenizer: the same breaks
    last = page.locator(".kdw-row").first.locator(".kdw-token").last.bounding_box()
    assert last["x"] + last["width"] <= right


# slow: a real browser waits for each of the 8 pages' script runs
def test_every_page_renders(app_url, page, tmp_path):
    for url_path, title in PAGES.items():
        page.goto(f"{app_url}/{url_path}" if url_path != "case-study" else app_url)
        page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
        _settle(page)
        assert page.locator("[data-testid='stException']").count() == 0, url_path
        _screenshot(page, Path(os.environ.get("KDW_SCREENSHOTS", tmp_path)) / f"{url_path}.png")


def _plotly(page, key: str):
    """The Plotly graph div of the chart with element key ``key`` (its container's class:
    ``st-key-`` and the key with ``-`` for ``.``), once drawn, scrolled into view."""
    chart = page.locator(f".st-key-{key.replace('.', '-')} .js-plotly-plot").first
    chart.wait_for(timeout=120_000)
    chart.locator(".nsewdrag").first.wait_for(timeout=60_000)
    chart.scroll_into_view_if_needed()  # the mouse reaches only what the viewport shows
    return chart


def _hover_label(page) -> str:
    label = page.locator(".hoverlayer .hovertext").first
    label.wait_for(timeout=10_000)
    return label.text_content()


def test_a_relation_matrix_cell_shows_its_pair_and_value(app_url, page):
    page.goto(f"{app_url}/geometry")
    _settle(page)
    chart = _plotly(page, "geometry.distances")
    trace = chart.evaluate("gd => ({x: gd.data[0].x, z: gd.data[0].z})")
    size = len(trace["x"])
    box = chart.locator(".draglayer .xy .nsewdrag").first.bounding_box()
    row, column = 1, 2
    page.mouse.move(
        box["x"] + (column + 0.5) * box["width"] / size,
        box["y"] + (row + 0.5) * box["height"] / size,
    )
    text = _hover_label(page)
    assert text.startswith(f"token {trace['x'][row]} × token {trace['x'][column]}: "), text
    shown = float(text.rsplit(": ", 1)[1])
    assert shown == pytest.approx(trace["z"][row][column], rel=1e-5)


# slow: a real browser waits for the loyalty page to score every model, then the case study
def test_a_click_on_the_loyalty_scatter_opens_the_case_study(app_url, page):
    page.goto(f"{app_url}/loyalty")
    _settle(page)
    chart = _plotly(page, "loyalty.scatter")
    point = chart.locator(".scatterlayer .trace .points path.point").first
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    label = _hover_label(page)
    assert "gold: " in label and "teacher: " in label
    page.mouse.click(x, y)
    page.get_by_role("heading", name="Case study").first.wait_for(timeout=120_000)
    _settle(page)
    text = page.get_by_label("Text", exact=True).input_value()
    assert text and label.startswith(text), (text, label)
    page.wait_for_selector(".kdw-row", timeout=120_000)
    first_word = text.split()[0]
    tokens = page.locator(".kdw-row").first.locator(".kdw-token").all_inner_texts()
    assert first_word in tokens
    title = page.locator(".kdw-row").first.locator(".kdw-token").nth(1).get_attribute("title")
    assert title.startswith(f"{tokens[1]}: ") and math.isfinite(float(title.rsplit(": ", 1)[1]))
    page.get_by_text("gold label: ", exact=False).first.wait_for(timeout=10_000)


def test_the_students_chooser_shows_every_name_whole(app_url, page, runs_root):
    """Three students with long names: each chip of the chooser lies inside it, uncut."""
    if "KDW_E2E_RUNS" in os.environ:
        pytest.skip("adds a run: only on the runs built here")
    extra = runs_root / "student-kd-with-a-much-longer-name"
    shutil.copytree(runs_root / "student-kd", extra)
    try:
        page.goto(app_url)
        page.wait_for_selector(".kdw-row", timeout=120_000)
        _settle(page)
        chooser = page.locator("[data-testid='stMultiSelect']").filter(has_text="Students")
        box = chooser.bounding_box()
        chips = chooser.locator("[data-tag]:visible")
        assert chips.count() == 3
        for chip in chips.all():
            name = chip.locator("span[title]")
            assert name.evaluate("e => e.scrollWidth <= e.clientWidth"), name.text_content()
            edge = chip.bounding_box()
            assert edge["x"] + edge["width"] <= box["x"] + box["width"], name.text_content()
    finally:
        shutil.rmtree(extra)


# slow: a real browser waits for every model's maps and AOPC on the split, then the case study
def test_the_divergence_view_shows_its_charts_tables_and_hover(app_url, page):
    page.goto(f"{app_url}/divergence")
    page.get_by_role("heading", name="Where explanations diverge").first.wait_for(timeout=120_000)
    page.wait_for_selector(".scatterlayer .point", timeout=240_000)
    _settle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stDataFrame']").count() == 3  # words over/under, examples
    assert page.locator(".js-plotly-plot").count() == 2  # the word scatter, the histograms
    point = page.locator(".scatterlayer .point").first.bounding_box()
    page.mouse.move(point["x"] + point["width"] / 2, point["y"] + point["height"] / 2)
    page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
    hover = page.locator(".hoverlayer .hovertext").first.text_content()
    assert "teacher" in hover and "click: open example" in hover
    word = hover.split("teacher")[0].strip()
    page.mouse.click(point["x"] + point["width"] / 2, point["y"] + point["height"] / 2)
    page.get_by_role("heading", name="Case study").first.wait_for(timeout=120_000)
    _settle(page)
    assert word in page.get_by_label("Text", exact=True).input_value().split(), word


# slow: a real browser has the server time three models on 8 texts, then opens a clicked run
def test_the_compression_page_measures_and_opens_a_clicked_run(app_url, page):
    page.goto(f"{app_url}/compression")
    page.get_by_role("heading", name="Compression").first.wait_for(timeout=120_000)
    _settle(page)
    examples = page.get_by_test_id("stNumberInputField")
    examples.fill("8")
    examples.press("Enter")
    _settle(page)
    page.get_by_role("button", name="Measure size and speed").click()
    chart = _plotly(page, "compression.scatter")
    _settle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert (
        "Measured on 8 texts of test"
        in page.locator("[data-testid='stCaptionContainer']").all_inner_texts().__str__()
    )
    points = chart.locator(".scatterlayer .trace .points path.point")
    assert points.count() == 3  # the teacher and its two students, PyTorch
    box = points.nth(1).bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    label = _hover_label(page)
    heading = label.split("method:")[0].strip()  # its first line: name (engine)
    assert heading.split(" (")[0] in ("teacher", *STUDENTS), label
    page.mouse.click(x, y)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)


# slow: a server on an empty runs root builds a tiny demo while a real browser tours the pages
def test_a_newcomers_first_launch(chromium, page, runs_root, tmp_path_factory):
    """What a new user does: launch on an empty runs root (the demo build starts with the
    server and is said on the first page), open every page at once and again once its first
    student is shown (a heading on each, no exception), then add a folder of runs kept
    elsewhere and see its teacher and students compared; the terminal shows no traceback."""
    work = tmp_path_factory.mktemp("newcomer")
    tiny_tokenizer(work / "tiny-bert")
    tiny_model().bert.save_pretrained(work / "tiny-bert")
    env = {
        **os.environ,
        "KDW_RUNS": str(work / "runs"),
        "KDW_DEMO": "quick",
        SIZES_ENV: tiny_sizes(work / "tiny-bert"),
        "PYTHONPATH": str(ROOT),
    }
    port = _free_port()
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
    url = f"http://127.0.0.1:{port}"
    command += ["--server.address", "127.0.0.1"]
    with served(command, f"{url}/_stcore/health", "the app", work / "log", cwd=ROOT, env=env):
        page.goto(url)
        # the tiny demo builds in seconds, so the first page may find it building or built
        demo = re.compile("building the quick demo|quick demo building|Showing the quick demo")
        page.get_by_text(demo).first.wait_for(timeout=120_000)
        for moment in ("at once", "once its first student is shown"):
            for url_path, title in PAGES.items():
                page.goto(f"{url}/{url_path}" if url_path != "case-study" else url)
                page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
                _settle(page)
                assert page.locator("[data-testid='stException']").count() == 0, (moment, title)
            if moment == "at once":
                page.goto(url)
                page.wait_for_function(  # the teacher's row and the KD student's
                    "() => document.querySelectorAll('.kdw-row').length >= 2", timeout=180_000
                )
        page.goto(url)
        _settle(page)
        field = page.get_by_label("Add a model or runs (folder or hub id)", exact=True)
        field.fill(str(runs_root))
        field.press("Enter")
        page.get_by_text(f"{runs_root}: ", exact=False).first.wait_for(timeout=60_000)
        _settle(page)
        page.get_by_label("Teacher").click()
        page.get_by_role("option", name=f"{runs_root.name}/teacher").click()
        page.wait_for_function(
            f"() => document.querySelectorAll('.kdw-row').length === {1 + len(STUDENTS)}",
            timeout=120_000,
        )
        _settle(page)
        rows = page.locator(".kdw-row").all_inner_texts()
        assert [row.split("\n")[0] for row in rows][1:] == [
            f"{runs_root.name}/{s}" for s in STUDENTS
        ], rows
        page.close()  # the tab closed while the server runs
        time.sleep(2)
    log = (work / "log").read_text()
    assert "Traceback" not in log, log  # pages left and tabs closed say nothing on the terminal
    assert f"no runs under {work / 'runs'}: building the demo (quick demo" in log, log

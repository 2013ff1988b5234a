"""``kdw export --anonymous``: no path, run folder, run id, user or host name reaches any written
file (contents and format metadata, the PDF's streams and text, the PNG's text chunks), while
an export without it records them."""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest
from PIL import Image

from kd.cli import main
from tests.conftest import write_tiny_runs
from workbench.analysis.heatmap_export import public_task
from workbench.core.names import TASK_NAMES

SVG = "{http://www.w3.org/2000/svg}"
LAB, TEACHER, STUDENT, TEXTS = "alice-secret-lab", "run-bob-7", "run-carol-9", "dave-notes"
COMMON_NAMES = {"root", "user", "admin", "runner", "ubuntu", "debian", "test", "app"}
FORMATS = {".svg", ".pdf", ".png", ".tex", ".html"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """Tiny runs under ``<tmp>/alice-secret-lab``, copied to run folders with marked names."""
    work = tmp_path_factory.mktemp("export") / LAB
    write_tiny_runs(work)
    shutil.copytree(work / "teacher", work / TEACHER)
    shutil.copytree(work / "student", work / STUDENT)
    (work / f"{TEXTS}.jsonl").write_text(json.dumps({"text": "a fine flight"}) + "\n")
    return work


def _export(lab: Path, out: Path, *flags: str) -> list[Path]:
    command = [str(lab / TEACHER), str(lab / STUDENT), "--out", str(out)]
    sources = ["--texts-file", str(lab / f"{TEXTS}.jsonl"), "--split", "test", "--examples", "0"]
    assert main(["export", *command, *sources, "--explainer", "grad", "--dpi", "30", *flags]) == 0
    return sorted(out.iterdir())


def _pdf_streams(data: bytes) -> bytes:
    """Every stream of a PDF, inflated where it is Flate-compressed."""
    out = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.DOTALL):
        try:
            out.append(zlib.decompress(stream))
        except zlib.error:
            out.append(stream)
    return b"\n".join(out)


def readable(path: Path) -> str:
    """All a reader or a tool can get from the file: its bytes, and for a PDF its inflated
    streams and (with poppler) its text and document information; for a PNG its text chunks."""
    data = path.read_bytes()
    parts = [data, _pdf_streams(data) if path.suffix == ".pdf" else b""]
    if path.suffix == ".pdf":
        for tool in ("pdftotext", "pdfinfo"):
            if shutil.which(tool):
                arguments = [tool, str(path), "-"] if tool == "pdftotext" else [tool, str(path)]
                parts.append(subprocess.run(arguments, capture_output=True, check=True).stdout)
    if path.suffix == ".png":
        with Image.open(path) as image:
            parts.append(json.dumps(image.text, ensure_ascii=False).encode())
    return b"\n".join(parts).decode("utf-8", errors="replace")


def secrets(lab: Path) -> list[str]:
    """What an anonymous file must not hold: the markers, the tmp path, $HOME, the user's name
    (unless a common word) and the host name."""
    found = [LAB, TEACHER, STUDENT, TEXTS, str(lab), str(lab.resolve())]
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        found.append(home)
    user = getpass.getuser()
    if user.casefold() not in COMMON_NAMES and len(user) > 2:
        found.append(user)
    host = socket.gethostname()
    if host.casefold() not in COMMON_NAMES and len(host) > 2:
        found.append(host)
    return found


@pytest.mark.slow
def test_anonymous_export_writes_no_path_name_or_run_id(lab, tmp_path):
    paths = _export(lab, tmp_path / "anonymous", "--anonymous")
    assert {p.suffix for p in paths} == FORMATS and len(paths) == 2 * len(FORMATS)
    for path in paths:
        text = readable(path)
        leaked = [secret for secret in secrets(lab) if secret in text]
        assert not leaked, f"{path.name} holds {leaked}"
    svg = ET.parse(tmp_path / "anonymous" / "heatmap-000.svg").getroot()
    meta = json.loads(svg.find(f"{SVG}metadata").text)
    assert meta["anonymous"] == "yes" and meta["models"] == "teacher, student 1"
    assert meta["model_details"] == "teacher: 4 layers; student 1: kd, 2 layers"
    assert "run_ids" not in meta and "example_id" not in meta and meta["task"] == "task"
    assert meta["settings.explainer"] == "grad" and "settings.method" not in meta
    assert meta["text"] == "a fine flight"
    labels = {t.text for t in svg.iter(f"{SVG}text")}
    assert {"teacher", "student 1"} <= labels
    if shutil.which("pdftotext"):
        assert "student 1" in readable(tmp_path / "anonymous" / "heatmap-000.pdf")


def test_export_without_anonymous_records_the_runs(lab, tmp_path):
    paths = _export(lab, tmp_path / "named")
    assert {p.suffix for p in paths} == FORMATS
    for path in paths:
        text = readable(path)
        assert LAB in text and TEACHER in text and STUDENT in text, path.name
    meta = json.loads(ET.parse(paths[0].with_suffix(".svg")).getroot().find(f"{SVG}metadata").text)
    assert meta["anonymous"] == "no"
    assert json.loads(meta["run_ids"]) == [str(lab / TEACHER), str(lab / STUDENT)]
    assert meta["example_id"] == f"{TEXTS}.jsonl:1" and meta["task"] == str(lab / "task")


def test_only_bundled_and_glue_task_names_stay_in_an_anonymous_export():
    assert [public_task(name) for name in TASK_NAMES] == list(TASK_NAMES)
    assert public_task("/home/alice/sentiment.csv") == "task"
    assert public_task("alice-lab/private-reviews") == "task"  # a hub data set names its owner

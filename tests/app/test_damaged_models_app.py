"""The app lists each damaged model folder of the shared table (``tests/damaged_models.py``) in
its one line, beside the folders that work, in the sidebar and in "Add a model", and every page
draws beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.damaged_models import HEADER_CASES, IDS, build, error
from workbench.app.catalog import discover_runs, model_entry
from workbench.app.launch import ENTRY


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("damaged-models"))


def test_the_catalog_lists_a_broken_folder_in_one_line_beside_the_others(work, tmp_path):
    """Every damaged folder under the runs root is listed; those found from the config and the
    weights' headers (no weights are read to list a folder) with their one line, in the sidebar
    and in "Add a model" alike."""
    root = tmp_path / "runs"
    shutil.copytree(work / "good", root / "good")
    for case in IDS:
        shutil.copytree(work / "cases" / case, root / case)
    entries = {entry.name: entry for entry in discover_runs(root)}
    assert sorted(entries) == sorted(["good", *IDS])
    assert entries["good"].usable
    for case in HEADER_CASES:
        expected = error(case, work).replace(str(work / "cases"), str(root))
        assert entries[case].problem == expected
        assert model_entry(str(root / case)).problem == expected


@pytest.mark.slow
def test_every_page_draws_beside_damaged_model_folders(work, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    root = tmp_path / "runs"
    shutil.copytree(work / "good", root / "good")
    for case in IDS:
        shutil.copytree(work / "cases" / case, root / case)
    monkeypatch.setenv("KDW_RUNS", str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.sidebar.caption).replace("\\", "")
    for case in HEADER_CASES:
        assert f"{case}: " in captions, case
    for page in ("geometry", "loyalty", "divergence", "exports", "train"):
        at.switch_page(f"{page}.py")
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
    shown = {c.value.replace("\\", "") for c in at.main.caption}  # the runs table's problems
    for case in HEADER_CASES:  # whole, under the table that cuts them
        expected = error(case, work).replace(str(work / "cases"), str(root))
        assert f"{case}: {expected}" in shown, case
    for case in ("good", *IDS):  # the train page's details of each folder
        at.selectbox(key="train.details").set_value(case).run()
        assert not at.exception, (case, [e.value for e in at.exception])
    at.selectbox(key="train.details").set_value("labels with a gap").run()
    shown = [m.value.replace("\\", "") for m in at.error]
    assert shown == [error("labels with a gap", work).replace(str(work / "cases"), str(root))]

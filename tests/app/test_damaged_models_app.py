"""The app lists each damaged model folder of the shared table (``tests/damaged_models.py``) in
its one line, beside the folders that work, in the sidebar and in "Add a model", and every page
draws beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.damaged_models import HEADER_CASES, IDS, build, copy_case, error
from workbench.app.catalog import (
    ADDED_FILE,
    added_entries,
    added_sources,
    discover_runs,
    model_entry,
    remove_added,
)
from workbench.app.launch import ENTRY
from workbench.core.files import atomic_write_json, user_cache
from workbench.core.runs import RUN_REMEDY


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
        copy_case(work / "cases" / case, root / case)
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
        copy_case(work / "cases" / case, root / case)
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


def test_an_added_entry_the_catalog_cannot_open_is_one_line_and_can_be_removed(
    work, tmp_path, monkeypatch
):
    """A name too long for the file system, a NUL in a name (no path: a hub id), a run folder
    whose record is nested too deep and a folder whose weights link in a loop are each one entry
    with its problem (never an error that stops the pages), named in at most 80 characters, and
    each can be removed."""
    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    loop = tmp_path / "loop"
    copy_case(work / "cases" / "weights in a link loop", loop)
    long = "x" * 5000
    sources = [long, "a\0b", str(deep), str(loop)]
    for source in sources:
        _add(source)
    assert added_sources() == sources
    entries = {source: added_entries(source) for source in sources}
    assert [len(found) for found in entries.values()] == [1, 1, 1, 1]
    problems = {source: found[0].problem for source, found in entries.items()}
    assert problems.pop("a\0b").startswith("cannot load the config of 'a\\x00b': ")  # a hub id
    assert problems == {
        long: "cannot be read (File name too long)",
        str(deep): f"run file {deep / 'run.json'}: JSON nested too deep to read: {RUN_REMEDY}",
        str(loop): error("weights in a link loop", work).replace(
            str(work / "cases" / "weights in a link loop"), str(loop)
        ),
    }
    assert entries[long][0].name == "x" * 79 + "…"
    for source in sources:
        remove_added(source)
    assert added_sources() == []


def _add(source: str) -> None:
    path = user_cache() / ADDED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, [*added_sources(), source])


@pytest.mark.slow
def test_the_app_draws_beside_added_entries_it_cannot_open_and_removes_them(
    work, tmp_path, monkeypatch
):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KDW_RUNS", str(tmp_path / "runs"))
    copy_case(work / "cases" / "weights that are a pipe", tmp_path / "runs" / "pipe")
    for source in ("x" * 5000, str(work / "cases" / "a config nested too deep")):
        _add(source)
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.sidebar.caption).replace("\\", "")
    assert "pipe: the model file" in captions
    assert "nested too deep" in captions and "File name too long" in captions
    for _ in range(2):
        at.sidebar.button(key="models.remove.0").click().run()
        assert not at.exception, [e.value for e in at.exception]
    assert added_sources() == []

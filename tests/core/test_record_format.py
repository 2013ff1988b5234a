"""Every record carries the format number it is written in; a record of another format, or
without one, is refused in one line naming the versions and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import LEAST_RESOLVED
from workbench.core.errors import WorkbenchError
from workbench.core.files import FORMAT_KEY, RECORD_FORMAT, check_format, with_format
from workbench.core.runs import RUN_FILE, Run

OTHER = RECORD_FORMAT + 1


def _refused(found: str) -> str:
    return rf"has {found}, this release reads format {RECORD_FORMAT}: "


def test_a_record_is_written_with_the_format_and_read_only_in_it():
    record = with_format({"kind": "teacher"})
    assert record[FORMAT_KEY] == RECORD_FORMAT
    check_format(record, "r.json", "do it again")
    with pytest.raises(WorkbenchError, match=_refused(f"record format {OTHER}") + "do it again$"):
        check_format({**record, FORMAT_KEY: OTHER}, "r.json", "do it again")
    with pytest.raises(WorkbenchError, match=_refused("no record format")):
        check_format({"kind": "teacher"}, "r.json", "do it again")
    with pytest.raises(WorkbenchError, match=_refused("record format True")):
        check_format({FORMAT_KEY: True}, "r.json", "do it again")


@pytest.mark.parametrize("found", [OTHER, None])
def test_a_run_record_of_another_format_or_none_is_refused(tmp_path: Path, found):
    info = {"kind": "teacher", "configs": {}, **LEAST_RESOLVED}
    with Run.writing(tmp_path / "run", info, {}):
        pass
    path = tmp_path / "run" / RUN_FILE
    record = json.loads(path.read_text())
    assert record[FORMAT_KEY] == RECORD_FORMAT
    Run.open(tmp_path / "run")
    if found is None:
        del record[FORMAT_KEY]
    else:
        record[FORMAT_KEY] = found
    path.write_text(json.dumps(record))
    shown = "no record format" if found is None else f"record format {found}"
    with pytest.raises(
        WorkbenchError, match=r"^.*run\.json " + _refused(shown) + "train the run"
    ) as error:
        Run.open(tmp_path / "run")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("found", [OTHER, None])
def test_a_suite_record_of_another_format_or_none_is_refused(tmp_path: Path, found):
    from kd.experiments.reproduce.record import read_results

    record = {"suite": "hand-written", "teachers": {}, "students": []}
    if found is not None:
        record[FORMAT_KEY] = found
    (tmp_path / "results.json").write_text(json.dumps(record))
    shown = "no record format" if found is None else f"record format {found}"
    with pytest.raises(
        WorkbenchError, match=r"^.*results\.json " + _refused(shown) + "run the suite"
    ):
        read_results(tmp_path)


def test_a_faithfulness_report_and_a_tune_record_of_another_format_are_refused(tmp_path: Path):
    from kd.cli import config_defaults
    from workbench.analysis.faithfulness_report import check_report

    report = {key: [] for key in ("models", "rows", "intervals", "load_average")} | {
        "settings": {},
        "explainers": {},
        FORMAT_KEY: OTHER,
    }
    with pytest.raises(WorkbenchError, match=_refused(f"record format {OTHER}") + "run kdw faith"):
        check_report(report)
    best = tmp_path / "best.json"
    best.write_text(json.dumps({FORMAT_KEY: OTHER, "objective": {"preset": "kd"}}))
    with pytest.raises(WorkbenchError, match=_refused(f"record format {OTHER}") + "tune again$"):
        config_defaults(str(best))
    best.write_text(json.dumps({"objective": {"preset": "kd"}}))  # a file written by hand
    assert config_defaults(str(best)) == {"preset": "kd"}

"""A record read back is checked against its typed model, and a departure is one phrase naming
its place, whatever pydantic's error looks like (a union's members, a missing key, a literal)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from workbench.core.records import Record, RecordProblem, checked


class Row(Record):
    seed: int
    score: float | None = None


class Suite(Record):
    kind: Literal["teacher", "student"]
    rows: list[Row] = Field(default_factory=list)
    labels: str | list[str] = ""
    metrics: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    seconds: int | float = 0


S = {"kind": "student"}


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        ([1], "the file is a list, expected an object"),
        ({}, '"kind" is missing'),
        ({"kind": "judge"}, "\"kind\" is 'judge', expected 'teacher' or 'student'"),
        ({**S, "rows": {}}, '"rows" is an object, expected a list'),
        ({**S, "rows": [{"seed": 1}, {}]}, '"rows[1].seed" is missing'),
        ({**S, "rows": [{"seed": "1"}]}, '"rows[0].seed" is a string, expected an integer'),
        ({**S, "rows": [{"seed": True}]}, '"rows[0].seed" is a boolean, expected an integer'),
        ({**S, "rows": [{"seed": 1, "score": "x"}]},
         '"rows[0].score" is a string, expected a number'),
        ({**S, "labels": 3}, '"labels" is a number, expected a string or a list'),
        ({**S, "metrics": {"test": {"acc": []}}},
         '"metrics.test.acc" is a list, expected a number'),
        ({**S, "seconds": "1"}, '"seconds" is a string, expected a number'),
    ],
)  # fmt: skip
def test_a_departure_is_one_phrase_naming_its_place(value, phrase):
    with pytest.raises(RecordProblem) as problem:
        checked(value, Suite)
    assert str(problem.value) == phrase


def test_a_record_is_read_by_attribute_and_keeps_keys_its_model_does_not_name():
    suite = checked({**S, "rows": [{"seed": 2, "score": 1}], "note": "x"}, Suite)
    assert suite.rows[0].seed == 2 and suite.rows[0].score == 1.0 and suite.note == "x"
    assert checked({"a": {"b": None}}, dict[str, dict[str, float | None]]) == {"a": {"b": None}}
    with pytest.raises(RecordProblem, match=r'^"a\.b" is a string, expected a number$'):
        checked({"a": {"b": "1"}}, dict[str, dict[str, float | None]])

"""The JSON records the workbench writes, declared once as typed models (pydantic), checked when
a file is read back: a file damaged or edited by hand is refused with one phrase saying where it
differs (``"configs" is a list, expected an object``), never met later as a ``KeyError`` or
``TypeError``; a record that passes is read by attribute.

A :class:`Record` is strict (an integer is not a string of digits, a boolean is not a number;
an integer is a number) and open: keys its model does not name are kept, not refused.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import RECORD_LIMIT, check_format, parse_json, read_limited

T = TypeVar("T")


class Record(BaseModel):
    """A JSON object of a known shape, read by attribute."""

    model_config = ConfigDict(strict=True, extra="allow")

    def plain(self) -> dict[str, Any]:
        """The record as plain JSON-ready data, with the keys it was read or made with (none
        of the defaults it filled in)."""
        return self.model_dump(exclude_unset=True)


class RecordProblem(ValueError):
    """Where a value departs from its model, as one phrase (:func:`checked`)."""


EXPECTED = {  # what a pydantic error's type expected, in a message's words
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "list_type": "a list",
    "none_required": "null",
}


_KINDS = (  # what a JSON value is, in a message's words (a bool before the numbers it is one of)
    (type(None), "null"),
    (bool, "a boolean"),
    (int | float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


def kind_of(value: Any) -> str:
    """What a JSON value is, in a message's words."""
    return next((name for kind, name in _KINDS if isinstance(value, kind)), type(value).__name__)


def _place(loc: tuple, value: Any) -> str:
    """The place in ``value`` that an error's ``loc`` names (``"a.b"``, ``"rows[3]"``): the
    steps into ``value`` only, so that the tags pydantic gives the members of a union are
    left out, and a missing key (not in ``value``) ends the place."""
    place = ""
    for step in loc:
        if isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            place, value = f"{place}[{step}]", value[step]
        elif isinstance(value, dict) and isinstance(step, str):
            place = f"{place}.{step}" if place else step
            if step not in value:
                break
            value = value[step]
    return place


def _phrase(error: ValidationError, value: Any, whole: str) -> str:
    first, *others = error.errors()
    place = _place(first["loc"], value)
    where = f'"{place}"' if place else whole
    if first["type"] == "missing":
        return f"{where} is missing"
    if first["type"] == "literal_error":
        return f"{where} is {first['input']!r}, expected {first['ctx']['expected']}"
    if first["type"] not in EXPECTED:  # a constraint: a list too short, a number too large
        return f"{where}: {first['msg'][:1].lower()}{first['msg'][1:]}"
    expected = [EXPECTED[first["type"]]]
    for other in others:  # a union's members, each refusing the value at the same place
        if _place(other["loc"], value) == place and other["type"] in EXPECTED:
            expected.append(EXPECTED[other["type"]])
    if "a number" in expected:  # an integer is a number (``int | float``: either, kept as written)
        expected = [e for e in expected if e != "an integer"]
    return f"{where} is {kind_of(first['input'])}, expected {' or '.join(dict.fromkeys(expected))}"


@cache
def _adapter(model: Any) -> TypeAdapter:
    return TypeAdapter(model)


def checked(value: Any, model: type[T] | Any, whole: str = "the file") -> T:
    """``value`` read as ``model`` (a :class:`Record`, or a type such as ``dict[str, float]``);
    a value of another shape is a :class:`RecordProblem` saying where (``whole``: the value
    itself)."""
    try:
        return _adapter(model).validate_python(value, strict=True)
    except ValidationError as error:
        raise RecordProblem(_phrase(error, value, whole)) from None


def read_record_file(
    path: Path, model: Any, what: str, remedy: str, kind: str, format_remedy: str = ""
) -> Any:
    """The JSON file ``path`` (a ``kind`` of at most :data:`~workbench.core.files.RECORD_LIMIT`
    bytes) read as ``model``, its record format checked first with ``format_remedy``; an unreadable
    or corrupt file, or one that is not ``what`` it should be, is one line ending in ``remedy``."""
    try:
        value = parse_json(read_limited(path, RECORD_LIMIT, kind), f"{kind} {path}")
    except WorkbenchError as error:  # a device, a pipe, a file past the limit, too deep
        raise WorkbenchError(f"{error}: {remedy}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
        raise WorkbenchError(f"{path} is corrupt ({reason}): {remedy}") from None
    except OSError as error:  # a folder, a file without read permission
        raise WorkbenchError(f"{path} cannot be read ({first_line(error)})") from None
    if format_remedy:
        check_format(value, path, format_remedy)
    try:
        return checked(value, model)
    except RecordProblem as problem:
        raise WorkbenchError(f"{path} is not {what}: {problem}: {remedy}") from None

"""The shapes of the JSON records the workbench writes, checked when a file is read back: a
file damaged or edited by hand is refused with one phrase saying where it differs (``"configs"
is a list, expected an object``), never met later as a ``KeyError`` or ``TypeError``.

A shape is a small declarative value:

- :data:`STRING`, :data:`INTEGER`, :data:`NUMBER`, :data:`BOOLEAN`, :data:`ANY`: one JSON value;
- ``{"key": shape, "other?": shape}``: an object with those keys (``?``: optional; other keys
  are allowed);
- ``[shape]``: a list of values of that shape;
- :class:`Mapping` ``(shape)``: an object whose every value has that shape;
- :class:`Either` ``(shape, ...)``: any of them (``Either(INTEGER, None)``: an integer or null);
- :class:`Choice` ``("a", "b")``: one of these strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.core.records import kind_of


@dataclass(frozen=True)
class Simple:
    """One JSON value tested by ``accepts``, called ``name`` in messages."""

    name: str
    accepts: Any

    def __repr__(self) -> str:
        return self.name


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An integer or a float, NaN and infinities included (Python's JSON writes them, and a
    metric may be undefined)."""
    return _is_integer(value) or isinstance(value, float)


STRING = Simple("a string", lambda value: isinstance(value, str))
INTEGER = Simple("an integer", _is_integer)
NUMBER = Simple("a number", _is_number)
BOOLEAN = Simple("true or false", lambda value: isinstance(value, bool))
ANY = Simple("any value", lambda value: True)


@dataclass(frozen=True)
class Mapping:
    """An object whose every value has the shape ``values``."""

    values: Any


@dataclass(frozen=True)
class Either:
    """A value of any of ``shapes`` (``None`` for null)."""

    shapes: tuple

    def __init__(self, *shapes: Any) -> None:
        object.__setattr__(self, "shapes", shapes)


@dataclass(frozen=True)
class Choice:
    """One of these strings."""

    values: tuple[str, ...]

    def __init__(self, *values: str) -> None:
        object.__setattr__(self, "values", values)


def _expected(shape: Any) -> str:
    if shape is None:
        return "null"
    if isinstance(shape, Simple):
        return shape.name
    if isinstance(shape, dict | Mapping):
        return "an object"
    if isinstance(shape, list):
        return "a list"
    if isinstance(shape, Choice):
        return "one of " + ", ".join(shape.values)
    if isinstance(shape, Either):
        return " or ".join(_expected(s) for s in shape.shapes)
    raise TypeError(f"not a shape: {shape!r}")


def _where(path: str, whole: str) -> str:
    return f'"{path}"' if path else whole


def problem(value: Any, shape: Any, path: str = "", whole: str = "the file") -> str | None:
    """Where ``value`` departs from ``shape``, as one phrase naming the place (``"a.b"``,
    ``"rows[3]"``; ``whole`` for the value itself), or None when it has the shape."""
    if isinstance(shape, Either):
        if any(problem(value, s) is None for s in shape.shapes):
            return None
        objects = [s for s in shape.shapes if isinstance(s, dict) and isinstance(value, dict)]
        if objects:  # the object's own problem says more than "expected an object"
            return problem(value, objects[0], path, whole)
    elif shape is None:
        if value is None:
            return None
    elif isinstance(shape, Simple):
        if shape.accepts(value):
            return None
    elif isinstance(shape, Choice):
        if isinstance(value, str) and value in shape.values:
            return None
        if isinstance(value, str):
            return f"{_where(path, whole)} is {value!r}, expected {_expected(shape)}"
    elif isinstance(shape, list):
        if isinstance(value, list):
            for index, item in enumerate(value):
                found = problem(item, shape[0], f"{path}[{index}]")
                if found:
                    return found
            return None
    elif isinstance(shape, Mapping):
        if isinstance(value, dict):
            for key, item in value.items():
                found = problem(item, shape.values, f"{path}.{key}" if path else str(key))
                if found:
                    return found
            return None
    elif isinstance(shape, dict):
        if isinstance(value, dict):
            for name, inner in shape.items():
                key = name.removesuffix("?")
                where = f"{path}.{key}" if path else key
                if key not in value:
                    if name.endswith("?"):
                        continue
                    return f'"{where}" is missing'
                found = problem(value[key], inner, where)
                if found:
                    return found
            return None
    else:
        raise TypeError(f"not a shape: {shape!r}")
    return f"{_where(path, whole)} is {kind_of(value)}, expected {_expected(shape)}"

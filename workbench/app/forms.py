"""Widgets generated from the config dataclasses: one widget per field, labelled by its name, with
its ``metadata["help"]`` as the tooltip and ``metadata["choices"]`` as the options, so the app
describes no option a second time (the CLI is generated from the same fields). Integer inputs
start at their domain's minimum; every other value is checked when the config is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import streamlit as st

import kd.methods.objective  # noqa: F401  (registers the lists that help texts name)
from workbench.core.config import _field_type, default_of, fill_help

T = TypeVar("T")
DEFAULT_CHOICE = "(default)"
# a widget for one field: (label, default, help, key) -> value
Widget = Callable[[str, Any, str, str], Any]


def fixed(value: Any) -> Widget:
    """A widget of :func:`config_widgets` that shows nothing and returns ``value`` (a setting
    another widget of the page already chose)."""
    return lambda *_: value


def field_label(name: str) -> str:
    return name.replace("_", " ")


def choice_widget(label: str, default: Any, help_text: str, key: str, choices: tuple) -> Any:
    shown = [DEFAULT_CHOICE if c is None else c for c in choices]
    index = shown.index(DEFAULT_CHOICE if default is None else default)
    picked = st.selectbox(label, shown, index=index, help=help_text, key=key)
    return None if picked == DEFAULT_CHOICE else picked


def _widget(cls: type, f: dataclasses.Field, default: Any, key: str) -> Any:
    kind, optional = _field_type(cls, f)
    label, help_text = field_label(f.name), fill_help(f.metadata.get("help", ""))
    if f.metadata.get("choices"):
        return choice_widget(label, default, help_text, key, tuple(f.metadata["choices"]))
    syntax = f.metadata.get("syntax")
    if syntax:  # typed as the command line writes it; malformed text fails the config's check
        shown = "" if default is None else syntax.spell(default)
        text = st.text_input(label, value=shown, help=help_text, key=key).strip()
        return None if optional and not text else syntax.parse(text)
    if kind is bool:
        return st.checkbox(label, value=bool(default), help=help_text, key=key)
    if kind in (int, float):
        domain = f.metadata.get("domain")
        # an integer counts up from its domain's minimum (a float is checked by the config)
        own = {"step": 1, "min_value": domain.minimum if domain else None} if kind is int else {}
        return st.number_input(
            label,
            value=None if default is None else kind(default),
            max_value=None if domain is None or domain.maximum is None else kind(domain.maximum),
            format="%g" if kind is float else None,
            help=help_text,
            key=key,
            placeholder="default" if optional else None,
            **own,
        )
    if kind is tuple:  # a repeatable option: one value per line
        text = st.text_area(label, value="\n".join(default), help=help_text, key=key)
        return tuple(line.strip() for line in text.splitlines() if line.strip())
    text = st.text_input(label, value=default or "", help=help_text, key=key)
    return (text.strip() or None) if optional else text.strip()


def config_widgets(
    cls: type[T],
    key: str,
    defaults: T | None = None,
    overrides: Mapping[str, Widget] | None = None,
    columns: int = 2,
) -> T:
    """An instance of the dataclass ``cls`` read from one widget per field (keys
    ``<key>.<field>``); ``overrides`` replaces the generated widget of some fields. A settings
    map (the objective's methods' settings) is read as one instance of each registered settings
    dataclass, its fields keyed as the config's own."""
    values: dict[str, Any] = {}
    fields = [f for f in dataclasses.fields(cls) if "settings" not in f.metadata]
    slots = st.columns(columns)
    for i, f in enumerate(fields):
        default = getattr(defaults, f.name) if defaults is not None else default_of(f)
        widget = (overrides or {}).get(f.name)
        with slots[i % columns]:
            if widget is not None:
                help_text = fill_help(f.metadata.get("help", ""))
                values[f.name] = widget(field_label(f.name), default, help_text, f"{key}.{f.name}")
            else:
                values[f.name] = _widget(cls, f, default, f"{key}.{f.name}")
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            values[f.name] = {
                name: config_widgets(
                    settings,
                    key,
                    getattr(defaults, f.name)[name] if defaults is not None else None,
                    overrides,
                    columns,
                )
                for name, settings in f.metadata["settings"].items()
            }
    return cls(**values)

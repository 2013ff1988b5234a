"""Every registry of the methods (and the run record's sections) is filled one way, and a name
registered already is refused in one line naming both registrations' places."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kd.methods.adkd import ADKDSettings
from kd.methods.config import METHOD_SETTINGS, ObjectiveConfig
from kd.methods.objective import (
    METHODS,
    PARAMETERS,
    PRESETS,
    STUDENT_SETUPS,
    TEACHER_FIELDS,
    TERMS,
    Method,
    Parameter,
    Preset,
    StudentSetup,
    TeacherField,
    Term,
    register_method,
)
from workbench.core.config import SECTIONS, Checked, option, register_section
from workbench.core.errors import WorkbenchError


@dataclass
class Other(Checked):
    """Settings of a method that registers a name taken already."""

    other_setting: int = option(1, "a setting no method has")


@dataclass
class Fresh(Checked):
    """Settings of a method whose other names are new but one."""

    fresh_setting: int = option(1, "a setting no method has")


def _never(*_args):
    raise AssertionError("a refused entry is never called")


REGISTRATIONS = {  # registry: (a second registration of a built-in name, its first's module)
    "settings": (lambda: register_method("adkd", settings=Other), "adkd.py", METHOD_SETTINGS),
    "term": (lambda: register_method("x", terms={"kd": Term(_never)}), "vanilla.py", TERMS),
    "teacher field": (
        lambda: register_method("x", teacher_fields={"logits": TeacherField(_never)}),
        "vanilla.py",
        TEACHER_FIELDS,
    ),
    "student set-up": (
        lambda: register_method("gkd", setup=StudentSetup(_never, _never, _never, _never)),
        "gkd.py",
        STUDENT_SETUPS,
    ),
    "tune parameter": (
        lambda: register_method("x", parameters={"alpha": Parameter("again", 0.0)}),
        "vanilla.py",
        PARAMETERS,
    ),
    "preset": (
        lambda: register_method("x", presets={"kd": Preset({"ce": 1.0}, {"ce": 1.0})}),
        "vanilla.py",
        PRESETS,
    ),
    "record section": (
        lambda: register_section("objective", ObjectiveConfig),
        "config.py",
        SECTIONS,
    ),
}


def test_one_call_registers_nothing_when_any_of_its_names_is_taken():
    tables = (TERMS, TEACHER_FIELDS, PARAMETERS, PRESETS, METHOD_SETTINGS)
    before = [dict(table) for table in tables]
    with pytest.raises(WorkbenchError, match="preset 'kd' is registered twice"):
        register_method(
            "fresh",
            settings=Fresh,
            terms={"fresh_term": Term(_never)},
            parameters={"fresh_parameter": Parameter("new", 0.0)},
            presets={"fresh": Preset({"ce": 1.0}, {"ce": 1.0}), "kd": Preset({}, {})},
        )
    assert [dict(table) for table in tables] == before
    methods = dict(METHODS)
    with pytest.raises(WorkbenchError, match="its method resolves 'pkd', which it does not"):
        register_method("fresh", method=Method(frozenset({"pkd"}), _never, _never))
    assert dict(METHODS) == methods


@pytest.mark.parametrize("registry", sorted(REGISTRATIONS))
def test_a_name_registered_twice_is_refused_in_one_line_naming_both_places(registry):
    register, first, table = REGISTRATIONS[registry]
    before = dict(table)
    with pytest.raises(WorkbenchError) as refused:
        register()
    message = str(refused.value)
    assert "\n" not in message
    here = re.escape(Path(__file__).name)
    if registry != "record section":  # a section names the two dataclasses' modules
        assert re.search(rf"at \S*{re.escape(first)}:\d+ and at \S*{here}:\d+$", message), message
    assert dict(table) == before  # the first entry stands


def test_a_method_setting_of_a_name_the_objective_has_is_refused():
    @dataclass
    class Clashing(Checked):
        """Settings whose field another method declares."""

        attr_top_k: int = option(1, "AD-KD's already")

    with pytest.raises(WorkbenchError, match=r"setting 'attr_top_k' of .*Clashing is ADKDSettings"):
        register_method("clashing", settings=Clashing)
    assert "clashing" not in METHOD_SETTINGS and ADKDSettings in METHOD_SETTINGS.values()


def test_each_tune_parameter_of_a_setting_is_named_as_the_setting():
    assert "attr_top_k" in PARAMETERS and "top_k" not in PARAMETERS

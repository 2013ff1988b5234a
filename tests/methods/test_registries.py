"""Every registry of the methods (and the run record's sections) is filled one way, and a name
registered already is refused in one line naming both registrations' places."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kd.methods.adkd import ADKDSettings
from kd.methods.config import METHOD_SETTINGS, ObjectiveConfig, register_settings
from kd.methods.objective import (
    METHODS,
    PARAMETERS,
    PRESETS,
    STUDENT_SETUPS,
    TEACHER_FIELDS,
    TERMS,
    Parameter,
    Preset,
    StudentSetup,
    method,
    parameter,
    preset,
    student_setup,
    teacher_field,
    term,
)
from workbench.core.config import SECTIONS, Checked, option, register_section
from workbench.core.errors import WorkbenchError


@dataclass
class Other(Checked):
    """Settings of a method that registers a name taken already."""

    other_setting: int = option(1, "a setting no method has")


def _never(*_args):
    raise AssertionError("a refused entry is never called")


REGISTRATIONS = {  # registry: (a second registration of a built-in name, its first's module)
    "settings": (lambda: register_settings("adkd", Other), "adkd.py", METHOD_SETTINGS),
    "term": (lambda: term("kd")(_never), "vanilla.py", TERMS),
    "teacher field": (lambda: teacher_field("logits")(_never), "vanilla.py", TEACHER_FIELDS),
    "method": (lambda: method("pkd", record=_never)(_never), "pkd.py", METHODS),
    "student set-up": (
        lambda: student_setup("gkd", StudentSetup(_never, _never, _never, _never)),
        "gkd.py",
        STUDENT_SETUPS,
    ),
    "tune parameter": (
        lambda: parameter("alpha", Parameter("again", 0.0)),
        "vanilla.py",
        PARAMETERS,
    ),
    "preset": (lambda: preset("kd", Preset({"ce": 1.0}, {"ce": 1.0})), "vanilla.py", PRESETS),
    "record section": (
        lambda: register_section("objective", ObjectiveConfig),
        "config.py",
        SECTIONS,
    ),
}


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
        register_settings("clashing", Clashing)
    assert "clashing" not in METHOD_SETTINGS and ADKDSettings in METHOD_SETTINGS.values()


def test_each_tune_parameter_of_a_setting_is_named_as_the_setting():
    assert "attr_top_k" in PARAMETERS and "top_k" not in PARAMETERS

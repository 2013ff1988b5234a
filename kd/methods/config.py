"""The objective's settings: those every method shares (the preset, the terms' weights, τ, the KD
term's form) and each registered method's own settings dataclass (:data:`METHOD_SETTINGS`, filled by
:func:`kd.methods.objective.register_method` as a method's module is imported), held by one
:class:`ObjectiveConfig` that the CLI, the Python API, the app, ``--config`` files and run records
read. The run record's ``objective`` section is registered here."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from workbench.core.config import (
    Checked,
    Domain,
    Syntax,
    fields_of,
    flat_fields,
    is_number,
    option,
    register_section,
    spell_number,
)
from workbench.core.errors import WorkbenchError

T = TypeVar("T")

MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 1000.0  # --temperature's range (its help says why)
temperature_range = Domain(
    lambda v: is_number(v) and MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
    f"a number in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]",
    maximum=MAX_TEMPERATURE,
)


def weight_pairs(text: str) -> dict[str, float]:
    """``"ce=0.1,kd=0.9"`` → ``{"ce": 0.1, "kd": 0.9}``; a weight that is not a finite number
    ≥ 0 (NaN, infinite, negative) is a one-line error. The names are not checked here:
    :func:`kd.methods.objective.check_terms` knows the terms."""
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = (piece.strip() for piece in part.partition("="))
        try:
            weights[name] = float(value)
        except ValueError:
            raise WorkbenchError(f"weight of {name!r} must be a number, got {value!r}") from None
        if not weights[name] >= 0 or not math.isfinite(weights[name]):
            raise WorkbenchError(f"weight of {name!r} must be a finite number ≥ 0, got {value!r}")
    return weights


def spell_weights(weights: dict[str, float]) -> str:
    """``{"ce": 0.1, "kd": 0.9}`` → ``"ce=0.1,kd=0.9"``, which :func:`weight_pairs` reads back
    to the same numbers."""
    return ",".join(f"{name}={spell_number(weight)}" for name, weight in weights.items())


def _is_weights(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and is_number(weight) and weight >= 0
        for name, weight in value.items()
    )


WEIGHTS = Syntax(weight_pairs, spell_weights)


class Registry(MutableMapping[str, T]):
    """Entries by name, in the order they registered. :meth:`add` is the one way to register: a
    name registered already is refused in one line naming both places. Assigning an entry
    (``registry[name] = entry``) replaces it, for a test."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # what an entry is, in the refusal: "loss term", "preset"
        self._entries: dict[str, T] = {}
        self._places: dict[str, str] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``, a name no entry has; ``entry`` is returned."""
        self.check_new(name)
        self._entries[name] = entry
        self._places[name] = registration_place()
        return entry

    def check_new(self, name: str) -> None:
        """Refuse ``name`` where an entry has it, in one line naming both places."""
        if name in self:
            raise WorkbenchError(
                f"{self.kind} {name!r} is registered twice: at {self._places.get(name, '?')} "
                f"and at {registration_place()}"
            )

    def _load(self) -> None:
        """Register what is registered on a first read (none here)."""

    def __getitem__(self, name: str) -> T:
        self._load()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(self._entries)

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]  # its place is kept, for the entry put back (registry[name] = …)


def registration_place() -> str:
    """``file:line`` of the registration: the first frame outside the registries' modules."""
    frame = inspect.currentframe()
    while frame and frame.f_code.co_filename in _REGISTRIES:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"


_REGISTRIES = {__file__, str(Path(__file__).with_name("objective.py"))}

METHODS_GROUP = "kd_workbench.methods"  # the entry points of the packages that hold methods


class MethodSettings(Registry[type]):
    """Each distillation method's settings dataclass, by method name, in the order the methods
    registered (:func:`~kd.methods.objective.register_method`, as a method's module is imported).
    The first read imports the modules that installed packages name as entry points of
    :data:`METHODS_GROUP` (a package of one's own methods), so that a process which reads a run
    record without importing them (the Python API, the app's background jobs) knows the settings
    it holds."""

    def __init__(self) -> None:
        super().__init__("settings of method")
        self._loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: the modules loaded here register, and read, the map
            for point in entry_points(group=METHODS_GROUP):
                point.load()


METHOD_SETTINGS = MethodSettings()


@dataclass
class ObjectiveConfig(Checked):
    """The distillation objective: a preset or explicit weights over loss terms, and the settings
    of each registered method (``methods``: method name → its settings dataclass, read typed
    with :meth:`of`)."""

    preset: str = option("kd", "method preset ({presets})")
    weights: dict[str, float] = option(
        {},
        "explicit term weights replacing the preset's, e.g. ce=0.1,kd=0.9,attr=10,wr=1; terms: "
        "{terms}",
        domain=Domain(_is_weights, "a mapping of terms to finite numbers ≥ 0"),
        syntax=WEIGHTS,
    )
    parity: str = option(
        "paper",
        "paper: the equations of the papers; official: the authors' released code's choices",
        choices=("paper", "official"),
    )
    temperature: float | None = option(
        None,
        "softmax temperature τ of the KD term (default: the preset's τ; {temperatures}), from "
        f"{MIN_TEMPERATURE:g} (far below, the logits over τ overflow float32 and the term is "
        f"NaN) to {MAX_TEMPERATURE:g} (the term is scaled by τ², and far above, the logits over "
        "τ fall to float32 rounding; τ² overflows it from 2e19); the papers use 1 to 20",
        domain=temperature_range,
    )
    kd_form: str | None = option(
        None,
        "KD term form: kl (τ²·KL, batch mean), soft-ce (AD-KD/CKD code, no τ²), kl-mean "
        "(GKD/PKD code: KLDivLoss mean × τ²); default from --parity",
        choices=(None, "kl", "soft-ce", "kl-mean"),
    )
    methods: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "the registered methods' settings", "settings": METHOD_SETTINGS},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.weights = {name: float(weight) for name, weight in self.weights.items()}
        unknown = sorted(set(self.methods) - set(METHOD_SETTINGS))
        if unknown:
            raise WorkbenchError(f"no registered method {unknown[0]!r} has settings")
        given, self.methods = self.methods, {}
        for name, cls in METHOD_SETTINGS.items():  # as a dataclass, keyword values or defaults
            values = given.get(name) or {}
            self.methods[name] = cls(**values) if isinstance(values, dict) else values

    def of(self, cls: type[T]) -> T:
        """The settings of the method whose settings dataclass is ``cls``."""
        for settings in self.methods.values():
            if type(settings) is cls:
                return settings
        raise WorkbenchError(f"{cls.__name__} are no registered method's settings")

    def get(self, name: str) -> Any:
        """The value of the setting ``name``, whether every method shares it or one declares it."""
        owner = next((s for s in self.methods.values() if name in fields_of(s)), self)
        return getattr(owner, name)

    def with_settings(self, **values: Any) -> ObjectiveConfig:
        """This config with settings replaced, each by its name, whether every method shares it
        (``weights``) or one method declares it (``attr_views``)."""
        methods = dict(self.methods)
        for name, settings in methods.items():
            own = {key: values.pop(key) for key in list(values) if key in fields_of(settings)}
            if own:
                methods[name] = dataclasses.replace(settings, **own)
        return dataclasses.replace(self, methods=methods, **values)


def check_settings(method: str, cls: type) -> None:
    """Refuse ``cls`` as the settings dataclass of the distillation method ``method`` where the
    method has settings already, or where a field's name is another setting's of the
    objective."""
    METHOD_SETTINGS.check_new(method)
    clash = sorted(set(flat_fields(ObjectiveConfig)) & set(fields_of(cls)))
    if clash:
        owner = flat_fields(ObjectiveConfig)[clash[0]][0]
        raise WorkbenchError(
            f"method {method!r}: setting {clash[0]!r} of {cls.__qualname__} is "
            f"{owner.__qualname__}'s already"
        )


register_section("objective", ObjectiveConfig)

"""The objective's settings: those every method shares (the preset, the terms' weights, τ, the KD
term's form) and each registered method's own settings dataclass (:data:`METHOD_SETTINGS`,
filled by :func:`register_settings` as a method's module is imported), held by one
:class:`ObjectiveConfig` that the CLI, the Python API, the app, ``--config`` files and run
records read. The run record's ``objective`` section is registered here."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
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


METHODS_GROUP = "kd_workbench.methods"  # the entry points of the packages that hold methods


class MethodSettings(MutableMapping[str, type]):
    """Each distillation method's settings dataclass, by method name, in the order the methods
    registered (:func:`register_settings`, as a method's module is imported). The first read
    imports the modules that installed packages name as entry points of
    :data:`METHODS_GROUP` (the built-in methods, ``kd.methods``; a package of one's own methods
    the same way), so that a process which reads a run record without importing the methods
    (the Python API, the app's background jobs) knows the settings it holds."""

    def __init__(self) -> None:
        self._classes: dict[str, type] = {}
        self._loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: the modules loaded here register, and read, the map
            for point in entry_points(group=METHODS_GROUP):
                point.load()

    def __getitem__(self, method: str) -> type:
        self._load()
        return self._classes[method]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(self._classes)

    def __len__(self) -> int:
        self._load()
        return len(self._classes)

    def __setitem__(self, method: str, cls: type) -> None:
        self._classes[method] = cls

    def __delitem__(self, method: str) -> None:
        del self._classes[method]


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
        self.methods = {
            name: _settings(cls, self.methods.get(name)) for name, cls in METHOD_SETTINGS.items()
        }

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


def _settings(cls: type[T], values: T | dict[str, Any] | None) -> T:
    """A method's settings given as its dataclass, as keyword values, or not at all (its
    defaults)."""
    if values is None:
        return cls()
    return cls(**values) if isinstance(values, dict) else values


def register_settings(method: str, cls: type[T]) -> type[T]:
    """Register ``cls``, the settings dataclass of the distillation method ``method``: every
    :class:`ObjectiveConfig` holds one (built from its defaults unless given), and the CLI, the
    app, ``--config`` files and run records show its fields as the objective's own settings, under
    their names, which no other setting of the objective may take."""
    if method in METHOD_SETTINGS:
        raise ValueError(f"method {method!r} has its settings registered already")
    clash = sorted(set(flat_fields(ObjectiveConfig)) & set(fields_of(cls)))
    if clash:
        raise ValueError(f"method {method!r}: settings {clash} are the objective's already")
    METHOD_SETTINGS[method] = cls
    return cls


register_section("objective", ObjectiveConfig)

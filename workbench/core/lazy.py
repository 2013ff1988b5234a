"""Names a package re-exports from its modules, imported when first asked for (a module-level
``__getattr__``, PEP 562), and modules bound by name and imported when first used, so that
importing a package, or a module that declares settings beside its computations (a distillation
method), loads neither torch nor transformers."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` that imports each name of ``names`` (a name → the
    module that defines it) from its module when it is first asked for, and keeps it in the
    package."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__


class LazyModule(types.ModuleType):
    """The module ``name``, imported when one of its attributes is first read."""

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attribute)


def lazy_module(name: str) -> Any:
    """The module ``name`` (``"torch"``, ``"workbench.core.models"``), imported when one of its
    attributes is first read: ``torch = lazy_module("torch")`` at the top of a module, and
    ``torch.stack`` in its functions."""
    return LazyModule(name)

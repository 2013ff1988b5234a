"""The foundation: the settings' machinery and the data's settings (config), errors, files, the
cache, run folders, the hub, the parts of any classifier (parts), models and their adaptor,
shapes, and the data sets (data/). It imports nothing above it.

:class:`DataConfig` and :func:`load_model` are importable from here; they are imported when
first asked for, so that importing the package loads neither torch nor transformers."""

from __future__ import annotations

from workbench.core.lazy import lazy_names

_NAMES = {
    "DataConfig": "workbench.core.config",
    "WorkbenchError": "workbench.core.errors",
    "load_model": "workbench.core.models",
}
__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)

"""The public names: what the README and docs/ show users importing is importable, each from the
layer package that re-exports it is the object its module defines, and importing the packages
loads neither torch nor transformers."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# The names a user imports from a layer's package, and the module each is defined in.
PUBLIC = {
    "workbench.core": {
        "DataConfig": "workbench.core.config",
        "WorkbenchError": "workbench.core.errors",
        "load_model": "workbench.core.models",
    },
    "kd.training": {
        "ObjectiveConfig": "kd.methods.config",
        "OptimConfig": "kd.training.config",
        "StudentConfig": "kd.training.config",
        "TeacherConfig": "kd.training.config",
        "distill": "kd.training.pipeline",
        "train_teacher": "kd.training.pipeline",
        "evaluate_runs": "kd.training.evaluate",
        "format_table": "kd.training.evaluate",
    },
    "kd": {
        "logit_kd_loss": "kd.methods.vanilla",
        "task_loss": "kd.methods.vanilla",
        "patient_loss": "kd.methods.pkd",
        "layer_relation_loss": "kd.methods.ckd",
        "word_relation_loss": "kd.methods.ckd",
        "attribution_loss": "kd.methods.adkd",
        "gradient_alignment_loss": "kd.methods.gkd",
    },
    "kd.cli": {
        "main": "kd.cli.commands",
        "build_parser": "kd.cli.commands",
        "config_defaults": "kd.cli.common",
        "reproduce_suite": "kd.cli.reproduce",
    },
}
LAZY_PACKAGES = ["workbench", "workbench.core", "workbench.analysis", "kd", "kd.training", "kd.cli"]
DOCUMENTED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _documented_imports() -> list[tuple[str, str, str]]:
    """(page, module, name) for every ``from workbench…/kd… import name`` in a Python block of
    the README and the docs pages."""
    found = []
    for page in DOCUMENTED:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for node in ast.walk(ast.parse(block)):
                root = (getattr(node, "module", None) or "").split(".")[0]
                if isinstance(node, ast.ImportFrom) and root in ("workbench", "kd"):
                    found += [(page.name, node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize(
    ("package", "name"), [(package, name) for package, names in PUBLIC.items() for name in names]
)
def test_public_name_is_its_modules_object(package, name):
    home = importlib.import_module(PUBLIC[package][name])
    assert getattr(importlib.import_module(package), name) is getattr(home, name)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_package_lists_exactly_its_public_names(package):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    # a submodule of the same name, once imported, would shadow the name
    assert not {info.name for info in pkgutil.iter_modules(module.__path__)} & set(module.__all__)
    with pytest.raises(AttributeError, match="no attribute 'load_modle'"):
        module.load_modle  # noqa: B018


def test_documented_imports_resolve():
    documented = _documented_imports()
    # the README's quickstart imports from the packages above, so the list is never empty
    assert {
        ("README.md", "kd.training", "distill"),
        ("README.md", "workbench.core", "load_model"),
    } <= {*documented}
    missing = [
        f"{page}: from {module} import {name}"
        for page, module, name in documented
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing, missing


def test_importing_the_packages_loads_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        + "".join(f"import {package}\n" for package in LAZY_PACKAGES)
        + "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr

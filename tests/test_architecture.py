"""Standing checks of the code's shape, run by the test command: import-linter's contracts
(pyproject.toml, docs/architecture.md) are kept, so a reversed import (a foundation module
importing analysis or kd, analysis importing kd, kd importing a front end) fails, and the
foundation loads no entry point; and the code stays ``ruff format``-ted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_flow_one_way():
    command = Path(sys.executable).with_name("lint-imports")  # installed beside this Python
    assert command.exists(), "lint-imports missing: install the dev extra (import-linter)"
    result = subprocess.run(
        [str(command), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_foundation_loads_no_entry_point():
    """An entry point loads a module by name at run time, unseen by import-linter: the
    foundation loads none, so that it imports nothing of a layer above it that way either."""
    loading = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "workbench" / "core").rglob("*.py"))
        if "entry_points" in path.read_text(encoding="utf-8")
    ]
    assert loading == []


def test_code_is_formatted():
    """``ruff format`` was applied once and stays applied (``ruff format .`` fixes a failure)."""
    command = Path(sys.executable).with_name("ruff")
    assert command.exists(), "ruff missing: install the dev extra"
    result = subprocess.run(
        [str(command), "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

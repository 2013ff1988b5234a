"""The machine record every benchmark carries, against the kernel's own account of the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.common import portable
from workbench.core.machine import INSTRUCTIONS, check_bf16, describe, machine

CPUINFO = Path("/proc/cpuinfo")


def _linux_flags() -> set[str]:
    """The first processor's flags as Linux lists them."""
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@pytest.mark.skipif(not CPUINFO.exists(), reason="the processor's flags are read from Linux")
def test_the_record_names_the_processor_and_the_instruction_sets_linux_lists():
    record = machine()
    flags = _linux_flags()
    assert record["instructions"] == [name for flag, name in INSTRUCTIONS.items() if flag in flags]
    model = next(
        line.partition(":")[2].strip()
        for line in CPUINFO.read_text().splitlines()
        if line.startswith("model name")
    )
    assert record["processor"] == model
    assert record["usable_cores"] == len(os.sched_getaffinity(0))
    assert record["torch_kernels"] in ("DEFAULT", "AVX2", "AVX512")
    assert {"python", "torch", "transformers", "onnxruntime"} <= set(record["versions"])
    assert describe(record).startswith(f"{model} (")

    notes: list[str] = []
    check_bf16("cpu", "--precision bf16", notes.append)
    check_bf16("cuda", "--precision bf16", notes.append)  # a GPU's bfloat16 is its own
    emulated = not flags & {"avx512_bf16", "amx_bf16"}
    assert notes == (
        [
            f"--precision bf16: this CPU ({model}) has no bfloat16 instructions (AVX-512 BF16 "
            "or AMX), so PyTorch emulates them, slower than float32; fp32 is faster here"
        ]
        if emulated
        else []
    )


def test_results_name_no_folder_of_the_machine_they_ran_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = {
        "teacher": str(tmp_path / "runs" / "mpnet-full"),
        "rows": [{"student": "/elsewhere/runs/kd-1", "text": "a/b", "command": "kdw distill"}],
        "seeds": (1, 2),
    }
    assert portable(record) == {
        "teacher": "runs/mpnet-full",
        "rows": [{"student": "kd-1", "text": "a/b", "command": "kdw distill"}],
        "seeds": [1, 2],
    }

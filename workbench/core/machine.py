"""The machine a figure was measured on: the processor and the instruction sets that decide
which kernels PyTorch and ONNX Runtime run (AVX2, AVX-512, VNNI, bfloat16, AMX), the cores and
threads, the load, and the library versions. Every benchmark records it beside its figures,
since a ratio measured on one processor need not hold on another."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from collections.abc import Callable

# the instruction sets that matter to the int8 and bfloat16 kernels, by their Linux flag
INSTRUCTIONS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "amx_bf16": "AMX BF16",
    "amx_int8": "AMX INT8",
}
BF16_INSTRUCTIONS = ("AVX-512 BF16", "AMX BF16")
LIBRARIES = ("torch", "transformers", "onnxruntime", "optimum", "captum")


@functools.cache
def processor() -> dict[str, object]:
    """The processor's model name, architecture and :data:`INSTRUCTIONS` it has (read once:
    py-cpuinfo asks the processor itself)."""
    import cpuinfo

    info = cpuinfo.get_cpu_info()
    flags = set(info.get("flags", ()))
    return {
        "processor": info.get("brand_raw") or platform.processor() or platform.machine(),
        "architecture": platform.machine(),
        "instructions": [name for flag, name in INSTRUCTIONS.items() if flag in flags],
    }


def has_bf16() -> bool:
    """Whether the CPU computes bfloat16 in hardware; elsewhere PyTorch emulates it, slower
    than float32."""
    return any(name in processor()["instructions"] for name in BF16_INSTRUCTIONS)


def check_bf16(device_type: str, what: str, say: Callable[[str], None]) -> None:
    """Say in one line that ``what`` (``--precision bf16``) will run emulated, hence slower
    than float32, on a CPU without bfloat16 instructions; nothing on CUDA or on such a CPU."""
    if device_type == "cpu" and not has_bf16():
        say(
            f"{what}: this CPU ({processor()['processor']}) has no bfloat16 instructions "
            "(AVX-512 BF16 or AMX), so PyTorch emulates them, slower than float32; fp32 is "
            "faster here"
        )


def _version(library: str) -> str | None:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, object]:
    """Where a measurement ran: :func:`processor`, the kernels PyTorch chose
    (``ATEN_CPU_CAPABILITY``), the cores (and those this process may use), PyTorch's threads,
    the 1-minute load average and the versions of Python and the libraries that compute."""
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    versions = {"python": platform.python_version()} | {
        library: version for library in LIBRARIES if (version := _version(library))
    }
    return {
        **processor(),
        "torch_kernels": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "torch_threads": torch.get_num_threads(),
        "load_1min": None if load is None else round(load, 2),
        "versions": versions,
    }


def describe(record: dict[str, object]) -> str:
    """One line naming a :func:`machine` record: ``AMD EPYC (AVX2), 2 cores, load 0.4``."""
    instructions = ", ".join(record.get("instructions") or ()) or "no AVX2"
    load = record.get("load_1min")
    return f"{record.get('processor')} ({instructions}), {record.get('usable_cores')} cores" + (
        "" if load is None else f", load {load}"
    )

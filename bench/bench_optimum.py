"""The project's ONNX exports of a student beside Hugging Face Optimum's, timed in one run: the
PyTorch teacher and student (float32, and bfloat16: weights cast, slow where the CPU has no
bfloat16 instructions), the student's ``kdw export-model --onnx --quantize int8`` graphs
(float32; int8 as exported by default: dynamic, per-channel weights, the int8 search leaving in
float32 the nodes that cost agreement until ``--min-agreement`` holds; and the plain int8 graph,
``--no-accuracy-aware``, whatever its agreement), and Optimum's export
of the same student (``optimum-cli export onnx``) with its int8 presets (``optimum-cli
onnxruntime quantize``: ``--avx2``, the preset for this CPU, which quantises weights to uint8,
and ``--avx512_vnni``, whose weights are int8 as the project's are).

    python -m bench.bench_optimum                    # runs/demo/teacher, runs/demo/student-kd
    python -m bench.bench_optimum TEACHER STUDENT    # any teacher run and a student of it

Optimum's ONNX exporter (``optimum-onnx``) needs transformers older than the project's, so it
runs in an environment of its own (``--optimum-env``): on first use the benchmark creates it
with ``python -m venv`` and installs into it this torch, this ONNX Runtime,
``optimum-onnx[onnxruntime]`` and ``transformers<4.58``; later runs reuse it.

Every graph and model runs on ``--threads`` threads (1 by default: one engine per core), in
interleaved rounds (1 warm-up, ``--repeats`` timed; medians): throughput over a random sample of
``--examples`` test texts in batches of 32, latency over 100 of them one by one. Label agreement
is with the PyTorch teacher and with the PyTorch student on the same texts; the teacher reads
them through its own tokenizer (an LLM teacher's byte-level BPE, for one).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from bench.common import interleaved_medians, setup, table, write_results
from kd.training.pipeline import export_model
from workbench.analysis.deployment import GRAPHS, RECORD, open_session
from workbench.analysis.metrics import label_loyalty
from workbench.analysis.settings import OnnxSettings
from workbench.core.data import Split, batches, encode, load_task, pad_id, sample_split
from workbench.core.files import user_cache
from workbench.core.models import LoadedModel, load_run

DEMO = Path("runs/demo")
OPTIMUM_PRESETS = ("avx2", "avx512_vnni")
OPTIMUM_PACKAGES = ("optimum-onnx[onnxruntime]", "transformers<4.58")
LATENCY_TEXTS = 100


def optimum_env(folder: Path) -> Path:
    """``optimum-cli`` of the environment in ``folder``, created on first use."""
    cli = folder / "bin" / "optimum-cli"
    if not cli.exists():
        print(f"creating Optimum's environment in {folder} (a few minutes, once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
        torch_pin = f"torch=={torch.__version__.split('+')[0]}"
        subprocess.run([*pip, torch_pin], check=True)  # first: pip would pull another build
        runtime = f"onnxruntime=={onnxruntime.__version__}"
        subprocess.run([*pip, runtime, *OPTIMUM_PACKAGES], check=True)
    return cli


def optimum_graphs(cli: Path, model_dir: Path, root: Path) -> dict[str, Path]:
    """Optimum's float32 export of ``model_dir`` and its int8 graph of each preset."""
    quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    fp32 = root / "optimum"
    export = [str(cli), "export", "onnx", "--model", str(model_dir)]
    subprocess.run([*export, "--task", "text-classification", str(fp32)], **quiet)
    graphs = {"optimum fp32": fp32 / "model.onnx"}
    for preset in OPTIMUM_PRESETS:
        out = root / f"optimum-{preset}"
        quantize = [str(cli), "onnxruntime", "quantize", "--onnx_model", str(fp32)]
        subprocess.run([*quantize, f"--{preset}", "-o", str(out)], **quiet)
        graphs[f"optimum int8 --{preset}"] = out / "model_quantized.onnx"
    return graphs


def encoded(sample: Split, model: LoadedModel) -> tuple[list[dict], list[dict]]:
    """``sample`` in ``model``'s own tokens (a teacher of another tokenizer reads its own):
    padded batches of 32, and the first :data:`LATENCY_TEXTS` texts one by one."""
    texts = encode(sample, model.tokenizer, model.max_length)
    pad = pad_id(model.tokenizer)
    by_32 = list(batches(texts, list(range(len(texts))), 32, pad))
    by_1 = list(batches(texts, list(range(min(LATENCY_TEXTS, len(texts)))), 1, pad))
    return by_32, by_1


def graph_call(path: Path, threads: int) -> Callable[[dict], torch.Tensor]:
    """The graph ``path`` run by ONNX Runtime: a padded batch (``[B, L]``) → logits ``[B, C]``."""
    runtime = open_session(path, threads)
    names = [i.name for i in runtime.get_inputs()]
    return lambda batch: torch.from_numpy(
        np.asarray(runtime.run(None, {n: batch[n].numpy() for n in names})[0])
    )


def model_call(model) -> Callable[[dict], torch.Tensor]:
    """The PyTorch ``model``: a padded batch (``[B, L]``) → logits ``[B, C]``."""

    def call(batch: dict) -> torch.Tensor:
        with torch.inference_mode():
            return model(**batch).logits

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="teacher and student run folders")
    parser.add_argument("--examples", type=int, default=500, help="test texts (default 500)")
    parser.add_argument("--threads", type=int, default=1, help="threads of every engine")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument(
        "--optimum-env",
        type=Path,
        default=user_cache() / "optimum-env",
        help="Optimum's environment (created on first use)",
    )
    parser.add_argument("--results", default="optimum", help="bench/results/<name>.json")
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=0.99,
        help="label agreement the project's int8 export needs with its PyTorch student",
    )
    args = parser.parse_args()
    setup(threads=args.threads)
    teacher_run, student_run = map(Path, args.runs or (DEMO / "teacher", DEMO / "student-kd"))
    teacher, student = load_run(teacher_run), load_run(student_run)
    cli = optimum_env(args.optimum_env)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        ours = root / "kdw"
        export = OnnxSettings(quantize="int8", min_agreement=args.min_agreement)
        start = time.perf_counter()
        export_model(student_run, ours, onnx=True, settings=export)
        export_seconds = time.perf_counter() - start
        plain = OnnxSettings(quantize="int8", min_agreement=0.0, accuracy_aware=False)
        export_model(student_run, root / "kdw-plain", onnx=True, settings=plain)
        calls = {
            "teacher pytorch": model_call(teacher.model),
            "student pytorch": model_call(student.model),
            "student pytorch bf16": model_call(copy.deepcopy(student.model).to(torch.bfloat16)),
            "kdw fp32": graph_call(ours / GRAPHS["fp32"], args.threads),
            "kdw int8": graph_call(ours / GRAPHS["int8"], args.threads),
            "kdw int8 plain": graph_call(root / "kdw-plain" / GRAPHS["int8"], args.threads),
        }
        exported = json.loads((ours / RECORD).read_text())
        for name, path in optimum_graphs(cli, student.run.model_dir, root).items():
            calls[name] = graph_call(path, args.threads)
        test = load_task(student.data).splits["test"]
        sample = sample_split(test, args.examples, student.data.split_seed)
        inputs = {"teacher": encoded(sample, teacher), "student": encoded(sample, student)}
        logits, steps = {}, {}
        for name, call in calls.items():
            by_32, by_1 = inputs["teacher" if name == "teacher pytorch" else "student"]
            logits[name] = torch.cat([call(b) for b in by_32]).float()
            steps[(name, 32)] = lambda call=call, by_32=by_32: [call(b) for b in by_32]
            steps[(name, 1)] = lambda call=call, by_1=by_1: [call(b) for b in by_1]
        seconds = interleaved_medians(steps, args.repeats)
        labels = torch.as_tensor(sample.labels)
    rows = []
    latency_texts = min(LATENCY_TEXTS, len(sample.texts))
    for name in calls:
        rows.append(
            {
                "model": name,
                "throughput_b32": len(sample.texts) / seconds[(name, 32)],
                "latency_ms_b1": 1000 * seconds[(name, 1)] / latency_texts,
                "accuracy": float((logits[name].argmax(-1) == labels).float().mean()),
                "agreement_with_teacher": label_loyalty(logits["teacher pytorch"], logits[name]),
                "agreement_with_student": label_loyalty(logits["student pytorch"], logits[name]),
            }
        )
    base = {r["model"]: r for r in rows}
    for row in rows:
        for other in ("teacher pytorch", "kdw fp32", "optimum int8 --avx512_vnni"):
            short = other.split("--")[-1].replace(" ", "_")
            row[f"b32_x_{short}"] = row["throughput_b32"] / base[other]["throughput_b32"]
            row[f"b1_x_{short}"] = base[other]["latency_ms_b1"] / row["latency_ms_b1"]
    print(table(rows, list(rows[0])))
    settings = {
        "teacher": str(teacher_run),
        "student": str(student_run),
        "examples": len(sample.texts),
        "latency_texts": latency_texts,
        "threads": args.threads,
        "repeats": args.repeats,
        "min_agreement": args.min_agreement,
    }
    # the default export's check and search, and its time (the search's included)
    search = exported["quantization"]["search"]
    export = {
        "seconds": export_seconds,
        "examples": exported["examples"],
        "agreement": {p: g["label_agreement"] for p, g in exported["graphs"].items()},
        "search": search,
    }
    print(
        f"\nkdw export-model: {export_seconds:.0f} s; int8 agreement "
        f"{export['agreement']['int8']:.4f} on {exported['examples']} test texts; the search "
        f"kept {len(search['kept'])} of {search['quantised_nodes']} nodes in float32: "
        + ", ".join(node["node"] for node in search["kept"])
    )
    payload = {"settings": settings, "export": export, "rows": rows}
    path = write_results(args.results, payload)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()

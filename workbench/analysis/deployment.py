"""Deployable exports of a run's classifier: an ONNX graph that ONNX Runtime runs, optionally
fused and int8-quantised (dynamic or calibrated static), each checked against the PyTorch model
before it is released (:class:`~workbench.analysis.settings.OnnxSettings`; docs/deployment.md,
"How the graphs are built": ``torch.onnx.export``'s TorchScript exporter, ``dynamo=False``).

An export folder holds ``model.onnx``, ``model.int8.onnx`` when quantised, the tokenizer,
``config.json``, the run's model card and :data:`RECORD` (``export.json``: each graph's parity and
the run's task, so that ``kdw benchmark`` scores the folder on that task).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from workbench.analysis.evaluation import logits_in_order, predict_logits
from workbench.analysis.int8 import search_int8
from workbench.analysis.metrics import label_loyalty
from workbench.analysis.settings import OnnxSettings
from workbench.core.config import DataConfig, from_dict, option_name, set_settings, to_dict
from workbench.core.data import (
    EncodedSplit,
    Split,
    TaskData,
    TaskSpec,
    batches,
    encode,
    load_task,
    pad_id,
    sample_split,
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_write_json,
    atomic_write_text,
    check_format,
    existing_path,
    read_json_file,
    staging_folder,
    with_format,
)
from workbench.core.machine import describe, machine
from workbench.core.models import LoadedModel, load_tokenizer, set_label_names
from workbench.core.parts import parts_of
from workbench.core.runs import model_card, replace_directory
from workbench.core.verify import check_onnx_graph

GRAPHS = {"fp32": "model.onnx", "int8": "model.int8.onnx"}  # precision → file in the folder
RECORD = "export.json"
OPSET = 17
# model types whose graphs ONNX Runtime's transformer optimizer fuses, as the type it fuses them as
FUSION_TYPES = {
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert", "mpnet"),
        "bert",
    ),
    "gpt2": "gpt2",
}
REJECTED_SUFFIX = ".rejected"
# --quantize's settings
INT8_SETTINGS = ("int8", "per_channel", "calibration_examples", "keep_float", "accuracy_aware")


class _Logits(nn.Module):
    """A classifier as a function of positional input tensors ``[B, L]`` (in the order of
    ``names``) to its logits ``[B, C]``: the signature an ONNX graph has."""

    def __init__(self, model: PreTrainedModel, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True))).logits


def graph_inputs(model: PreTrainedModel) -> tuple[str, ...]:
    """The inputs of a model's graph, each ``[batch, length]`` int64: token ids, the attention
    mask, and token types for a family that reads them."""
    types = ("token_type_ids",) if parts_of(model).token_types else ()
    return ("input_ids", "attention_mask", *types)


def export_onnx(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Write ``model`` (in eval mode, eager attention) as an ONNX graph: inputs
    :func:`graph_inputs`, output ``logits`` ``[batch, C]`` float32, batch and length dynamic."""
    names = graph_inputs(model)
    texts = Split(texts=["an example text", "a"], labels=[0, 0], uids=["0", "1"])
    example = next(batches(encode(texts, tokenizer, 16), [0, 1], 2, pad_id(tokenizer)))
    arguments = tuple(example[name] for name in names)
    axes = {name: {0: "batch", 1: "length"} for name in names} | {"logits": {0: "batch"}}
    module = _Logits(model, names).eval()  # the exporter restores the wrapper's mode after
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings on shape-dependent Python code
            torch.onnx.export(
                module,
                arguments,
                str(path),
                dynamo=False,
                input_names=list(names),
                output_names=["logits"],
                dynamic_axes=axes,
                opset_version=OPSET,
            )
    except Exception as error:  # the exporter's errors have no common type
        raise WorkbenchError(
            f"torch.onnx cannot export this {type(model).__name__}: {first_line(error)}"
        ) from None


def fusion_type(model: PreTrainedModel) -> str | None:
    """The model type ONNX Runtime's transformer optimizer fuses a family's graph as, or
    ``None`` for a family it has no fusions for."""
    return FUSION_TYPES.get(model.config.model_type)


def fuse_graph(model: PreTrainedModel, source: Path, target: Path) -> dict[str, int]:
    """Write ``source``'s graph optimised offline by ONNX Runtime's transformer optimizer
    (attention, skip-LayerNorm, bias-GELU and embedding-LayerNorm fusions, as the family's
    graph allows) to ``target``; return how many nodes of each fused type it holds."""
    from onnxruntime.transformers.optimizer import optimize_model

    logging.disable(logging.WARNING)  # the optimizer's notes on patterns it did not find
    try:
        optimized = optimize_model(
            str(source),
            model_type=fusion_type(model),
            num_heads=model.config.num_attention_heads,
            hidden_size=model.config.hidden_size,
        )
        optimized.save_model_to_file(str(target))
    finally:
        logging.disable(logging.NOTSET)
    return {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}


def open_session(path: Path, threads: int):
    """An ONNX Runtime session of the graph ``path`` on the CPU with ``threads`` threads within
    an operator; a file ONNX Runtime cannot load is a one-line error."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ONNX Runtime's errors have no common base
        raise WorkbenchError(
            f"{path} cannot be loaded by ONNX Runtime: {first_line(error)}"
        ) from None


@dataclass
class OnnxClassifier:
    """An exported graph run by ONNX Runtime, with the tokenizer, task and tokens per text of
    its export folder. Called on a padded batch (tensors ``[B, L]``), it returns the logits
    ``[B, C]`` float32 on the CPU."""

    session: object  # onnxruntime.InferenceSession
    tokenizer: PreTrainedTokenizerBase
    spec: TaskSpec
    data: DataConfig
    name: str
    path: Path
    precision: str

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        feeds = {i.name: batch[i.name].numpy() for i in self.session.get_inputs()}
        return torch.from_numpy(np.asarray(self.session.run(["logits"], feeds)[0]))


def graph_parameters(path: Path) -> int:
    """The elements of a graph's initializers (its weights: int8 ones count one each)."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as error:  # a truncated or foreign file: protobuf's DecodeError and others
        raise WorkbenchError(f"{path} is not an ONNX graph: {first_line(error)}") from None
    return sum(int(np.prod(tensor.dims)) for tensor in graph.initializer)


def is_onnx_export(source: str | Path) -> bool:
    """Whether ``source`` is an ONNX export folder (it has :data:`RECORD`) or a graph file."""
    path = Path(source)
    return path.suffix == ".onnx" or (path / RECORD).is_file()


def load_onnx(
    source: str | Path, data: DataConfig | None = None, threads: int = 1
) -> list[OnnxClassifier]:
    """The graphs of an export folder (float32, then int8), or the one graph file ``source``, on the
    folder's recorded task (``data`` must name it, and then samples it), each reading texts at the
    length its run was exported with."""
    path = existing_path(str(source))
    folder = path.parent if path.is_file() else path
    if not (folder / RECORD).is_file():
        raise WorkbenchError(
            f"{folder} has no {RECORD}: not a folder written by kdw export-model --onnx"
        )
    try:
        record = read_json_file(folder / RECORD, RECORD_LIMIT, "the export record")
    except WorkbenchError as error:
        raise WorkbenchError(f"{error}: export again") from None
    check_format(record, folder / RECORD, "export again")
    recorded = from_dict(DataConfig, record["data"])
    if data is not None and data.task != recorded.task:
        raise WorkbenchError(
            f"{source} was exported from a run on {recorded.task!r}, not {data.task!r}: "
            f"pass --task {recorded.task}"
        )
    task = record["task"]
    spec = TaskSpec(**task | {k: tuple(task[k]) for k in ("label_names", "metrics")})
    tokenizer = load_tokenizer(str(folder))
    graphs = {p: folder / f for p, f in GRAPHS.items() if p in record["graphs"]}
    if path.is_file():
        graphs = {p: file for p, file in graphs.items() if file.name == path.name}
        if not graphs:
            raise WorkbenchError(f"{path} is not one of the graphs {RECORD} records")
    for file in graphs.values():
        check_onnx_graph(file)
    return [
        OnnxClassifier(
            open_session(file, threads),
            tokenizer,
            spec,
            recorded if data is None else replace(data, max_length=recorded.max_length),
            f"{folder.name} (onnx {precision})",
            file,
            precision,
        )
        for precision, file in graphs.items()
    ]


def onnx_logits(classifier: OnnxClassifier, dataset: EncodedSplit, batch_size: int = 64) -> Tensor:
    """Logits ``[N, C]`` of an exported graph in dataset order."""
    return logits_in_order(classifier, dataset, batch_size, pad_id(classifier.tokenizer))


def parity(reference: Tensor, logits: Tensor) -> dict[str, float]:
    """How far an export's logits ``[N, C]`` are from the PyTorch model's: the largest absolute
    difference, and the share of examples whose predicted class is the same."""
    return {
        "max_abs_logit_difference": float((reference - logits).abs().max()),
        "label_agreement": label_loyalty(reference, logits),
    }


def _graphs_note(record: dict) -> str:
    """How the graphs were built: the fusions, and the int8 quantisation."""
    fusions = record["fusions"]
    text = (
        "Fused offline by ONNX Runtime's transformer optimizer: "
        + ", ".join(f"{count} {op}" for op, count in fusions.items())
        + "."
        if fusions is not None
        else "Not fused offline (ONNX Runtime optimises the graph as it loads it)."
    )
    int8 = record["quantization"]
    if int8 is not None:
        scales = "per output channel" if int8["per_channel"] else "per weight"
        calibration = int8["calibration"]
        text += (
            f" Int8 weights, scaled {scales}; activations quantised "
            + (
                f"with ranges calibrated on {calibration['examples']} {calibration['split']} texts"
                if calibration
                else "per batch as the graph runs"
            )
            + (f"; left in float32: {', '.join(int8['kept_float'])}" if int8["kept_float"] else "")
            + "."
            + _search_sentence(int8["search"])
        )
    return text


def _search_sentence(search: dict) -> str:
    """What the int8 search kept in float32 and why, for the card."""
    if not search["kept"]:
        return ""
    nodes = ", ".join(f"`{node['node']}` ({node['cost']:+.4f})" for node in search["kept"])
    return (
        f" All in int8, the graph agreed with the float32 one on "
        f"{search['all_int8']['agreement']:.4f} of {search['examples']} {search['split']} texts, "
        f"under the gate of {search['gate']}; the int8 search left in float32 the "
        f"{len(search['kept'])} of its {search['quantised_nodes']} quantised nodes that cost most "
        f"(each with the rise in mean probability loyalty it alone buys): {nodes}, which brought "
        f"it to {search['agreement']:.4f} at {search['speed']:.2f}x the float32 graph's speed."
    )


def _card_section(record: dict) -> str:
    lines = [
        "",
        "## ONNX export",
        "",
        f"Written by `torch.onnx.export` (TorchScript exporter, opset {record['opset']}) with "
        "dynamic batch and length axes; inputs "
        + ", ".join(f"`{name}`" for name in record["inputs"])
        + ", output `logits`. Each graph was run by ONNX Runtime on "
        f"{record['examples']} examples of the {record['split']} split, on "
        f"{describe(record['machine'])}, and compared with the PyTorch model (released at a "
        f"label agreement of at least {record['min_agreement']}; an int8 graph's agreement "
        "depends on the processor's int8 kernels and on the texts batched together):",
        "",
        _graphs_note(record),
        "",
        "| graph | file | max abs logit difference | label agreement |",
        "|---|---|---|---|",
    ]
    for precision, graph in record["graphs"].items():
        lines.append(
            f"| {precision} | `{graph['file']}` | {graph['max_abs_logit_difference']:.3g} | "
            f"{graph['label_agreement']:.4f} |"
        )
    return "\n".join(lines) + LOADING.replace("MAX_LENGTH", str(record["data"]["max_length"]))


# how the card says to run a graph (transformers' pipeline reads no ONNX folder); MAX_LENGTH: the
# run's length
LOADING = """
## Running it

`transformers.pipeline` does not read this folder: run a graph with ONNX Runtime and the
folder's tokenizer, at the length the model was trained and checked with:

```python
import numpy as np
import onnxruntime
from transformers import AutoConfig, AutoTokenizer

folder = "path/to/this/folder"
tokenizer = AutoTokenizer.from_pretrained(folder)
graph = onnxruntime.InferenceSession(folder + "/model.onnx")  # or model.int8.onnx
batch = tokenizer(["a text to classify"], truncation=True, max_length=MAX_LENGTH,
                  padding=True, return_tensors="np")
feed = {i.name: batch[i.name].astype(np.int64) for i in graph.get_inputs()}
logits = graph.run(["logits"], feed)[0]
labels = AutoConfig.from_pretrained(folder).id2label
print([labels[int(i)] for i in logits.argmax(-1)])
```
"""


def check_onnx_settings(loaded: LoadedModel, settings: OnnxSettings) -> None:
    """Refuse, in one line, settings of an ONNX export that cannot apply: a regression run, int8
    options without ``--quantize``, a static calibration for a dynamic graph, an empty
    ``--keep-float`` name, ``--fuse`` for an architecture ONNX Runtime cannot fuse."""
    if loaded.spec.regression:
        raise WorkbenchError(
            "the ONNX export is checked by label agreement: regression runs are not supported"
        )
    given = set_settings(settings)
    unused = [name for name in given if name in INT8_SETTINGS]
    if unused and settings.quantize is None:
        raise WorkbenchError(f"{option_name(unused[0])} sets the int8 graph: add --quantize int8")
    if (
        "calibration_examples" in given
        and settings.int8 == "dynamic"
        and not settings.accuracy_aware
    ):
        raise WorkbenchError(
            "--calibration-examples calibrates a static int8 graph and is the int8 search's "
            "texts (a dynamic one quantises its activations as it runs): add --int8 static, or "
            "leave out --no-accuracy-aware or --calibration-examples"
        )
    empty = [key for key in settings.keep_float if not key.strip()]
    if empty:
        raise WorkbenchError(
            f"--keep-float {empty[0]!r}: an empty name is part of every node's name, so no "
            "node would be quantised: name a node type (Gather) or a part of node names"
        )
    if settings.fuse and fusion_type(loaded.model) is None:
        raise WorkbenchError(
            f"--fuse: ONNX Runtime's transformer optimizer has no fusions for "
            f"{loaded.model.config.model_type} models; export without --fuse (ONNX Runtime "
            "still optimises the graph as it loads it)"
        )


def search_split(split: str) -> str:
    """The split whose texts calibrate a static int8 graph and the int8 search: dev, or train
    when the graphs are checked on dev."""
    return "train" if split == "dev" else "dev"


def _search_note(search: dict) -> str:
    """What the int8 search reached, for an export whose int8 graph missed the gate."""
    reached = f"{search['agreement']:.4f} on {search['examples']} {search['split']} texts"
    if search["kept"]:
        return (
            f"; the int8 search reached {reached} with {len(search['kept'])} of "
            f"{search['quantised_nodes']} quantised nodes in float32, at {search['speed']:.2f}x "
            "the float32 graph's speed"
        )
    if search["quantised_nodes"]:
        return f"; no node kept in float32 raised the all-int8 graph's {reached}"
    return f"; the all-int8 graph agreed on {reached}" + (
        "" if search["reached"] else " and the search was off (--no-accuracy-aware)"
    )


def _session_classifier(
    loaded: LoadedModel, graph: Path, name: str, precision: str
) -> OnnxClassifier:
    """The graph file ``graph`` of ``loaded``'s export run by ONNX Runtime with torch's threads."""
    session = open_session(graph, torch.get_num_threads())
    return OnnxClassifier(
        session, loaded.tokenizer, loaded.spec, loaded.data, name, graph, precision
    )


def _write_int8(
    loaded: LoadedModel, fp32: Path, int8: Path, settings: OnnxSettings, task: TaskData, split: str
) -> dict:
    """Write the float32 graph ``fp32`` as the int8 graph ``int8``
    (:func:`~workbench.analysis.int8.search_int8`) on ``settings.calibration_examples`` texts of
    ``task``'s :func:`search_split` (a static graph calibrated on them, in batches of 16 of the
    graph's inputs); return the record of how it was quantised."""
    held = search_split(split)
    texts = sample_split(task.splits[held], settings.calibration_examples, loaded.data.split_seed)
    encoded = encode(texts, loaded.tokenizer, loaded.max_length)
    static = settings.int8 == "static"
    feeds = (
        [  # a static graph's calibration batches; a dynamic one reads none
            {name: batch[name].numpy() for name in graph_inputs(loaded.model)}
            for batch in batches(encoded, list(range(len(encoded))), 16, pad_id(loaded.tokenizer))
        ]
        if static
        else None
    )

    def logits_of(graph: Path) -> tuple[Tensor, float]:
        classifier = _session_classifier(loaded, graph, graph.name, "search")
        start = time.perf_counter()
        return onnx_logits(classifier, encoded), time.perf_counter() - start

    search = search_int8(fp32, int8, settings, feeds, logits_of)
    return {
        "weights": "int8",
        "activations": settings.int8,
        "per_channel": settings.per_channel,
        "kept_float": list(settings.keep_float),
        "calibration": {"split": held, "examples": len(encoded)} if static else None,
        "search": search | {"split": held},
    }


def _write_graphs(
    loaded: LoadedModel,
    staging: Path,
    out: Path,
    settings: OnnxSettings,
    record: dict,
    task: TaskData,
    dataset: EncodedSplit,
    reference: Tensor,
) -> None:
    """Into ``staging``: the config, tokenizer, float32 graph (fused with ``settings.fuse``),
    int8 graph (``settings.quantize``), each graph's parity with the PyTorch model's
    ``reference`` logits ``[N, C]`` on ``dataset`` (in ``record``), the record and the card."""
    loaded.model.config.save_pretrained(staging)
    loaded.tokenizer.save_pretrained(staging)
    fp32 = staging / GRAPHS["fp32"]
    exported = staging / "unfused.onnx" if settings.fuse else fp32
    export_onnx(loaded.model, loaded.tokenizer, exported)
    if settings.fuse:
        record["fusions"] = fuse_graph(loaded.model, exported, fp32)
        exported.unlink()
    if settings.quantize:
        int8 = staging / GRAPHS["int8"]
        record["quantization"] = _write_int8(loaded, fp32, int8, settings, task, record["split"])
    for precision in ("fp32", *([settings.quantize] if settings.quantize else [])):
        file = staging / GRAPHS[precision]
        classifier = _session_classifier(loaded, file, out.name, precision)
        record["graphs"][precision] = {"file": file.name, "size_mb": file.stat().st_size / 1e6}
        record["graphs"][precision] |= parity(reference, onnx_logits(classifier, dataset))
    atomic_write_json(staging / RECORD, with_format(record))
    atomic_write_text(staging / "README.md", model_card(loaded.run, "onnx") + _card_section(record))


def export_onnx_folder(
    loaded: LoadedModel, out: Path, settings: OnnxSettings, split: str = "test"
) -> dict:
    """Export a run's model (:func:`export_onnx`, :func:`fuse_graph` with ``settings.fuse``,
    :func:`~workbench.analysis.int8.search_int8` with ``settings.quantize``, on texts of
    :func:`search_split`) into ``out`` and return the export's record.
    Every graph is checked against the PyTorch model (:func:`parity`) on a stratified sample of
    about ``settings.examples`` texts of the run's ``split`` in a temporary folder beside ``out``,
    renamed to ``out`` only when every graph reaches ``settings.min_agreement``, otherwise to
    ``out.rejected``, said in one line."""
    check_onnx_settings(loaded, settings)
    task = load_task(loaded.data)
    for needed in (split, *([search_split(split)] if settings.quantize else [])):
        if needed not in task.splits:
            raise WorkbenchError(f"split {needed!r} not in {sorted(task.splits)}")
    part = sample_split(task.splits[split], settings.examples or None, loaded.data.split_seed)
    dataset = encode(part, loaded.tokenizer, loaded.max_length)
    reference = predict_logits(loaded.model, dataset, 64, pad_id(loaded.tokenizer))
    set_label_names(loaded.model, loaded.spec)
    record = {
        "format": "onnx",
        "exporter": "torch.onnx.export (TorchScript, dynamo=False)",
        "opset": OPSET,
        "inputs": list(graph_inputs(loaded.model)),
        "run": str(Path(loaded.source).resolve()),
        "split": split,
        "examples": len(dataset),
        "min_agreement": settings.min_agreement,
        # int8 kernels differ by processor (VNNI or not): the agreement is this machine's
        "machine": machine(),
        "fusions": None,
        "quantization": None,
        "task": asdict(loaded.spec),
        "data": to_dict(loaded.data),
        "graphs": {},
    }
    staging = staging_folder(out)
    try:
        _write_graphs(loaded, staging, out, settings, record, task, dataset, reference)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    failed = {
        precision: graph["label_agreement"]
        for precision, graph in record["graphs"].items()
        if graph["label_agreement"] < settings.min_agreement
    }
    target = out.with_name(out.name + REJECTED_SUFFIX) if failed else out
    replace_directory(target, lambda path: os.replace(staging, path))
    if failed:
        found = ", ".join(f"{p} {value:.4f}" for p, value in failed.items())
        raise WorkbenchError(
            f"the ONNX export disagrees with the PyTorch model (label agreement {found} < "
            f"{settings.min_agreement} on {len(dataset)} {split} examples"
            + (_search_note(record["quantization"]["search"]) if "int8" in failed else "")
            + f"): kept for inspection in {target}"
        )
    return record

"""The settings of the analyses run over a split and of deployment: faithfulness
(:class:`FaithfulnessSettings`, read by :mod:`~workbench.analysis.faithfulness_report`),
divergence (:class:`DivergenceSettings`, :mod:`~workbench.analysis.explanation_divergence`), the
benchmark (:class:`BenchmarkSettings`, :mod:`~workbench.analysis.benchmark`) and ONNX export
(:class:`OnnxSettings`, :mod:`~workbench.analysis.deployment`). They are kept apart from the
modules that read them because those load torch, and ``kdw``'s parser and the app's forms, built
from these dataclasses, must not."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from workbench.core.config import (
    Checked,
    Domain,
    at_least,
    between,
    non_negative_int,
    option,
    parses,
    positive,
    unit_interval,
)
from workbench.core.errors import WorkbenchError

AOPC_RULES = ("project", "ferret")  # see workbench.analysis.faithfulness
EXPLAINED = ("teacher", "gold")


@dataclass
class FaithfulnessSettings(Checked):
    """Which explainers ``kdw faithfulness`` compares, on which examples, under which AOPC
    rules and removal."""

    explainers: str = option(
        "ig,grad,gxi,deeplift,occlusion,ablation",
        "comma-separated registered explainers (docs/explainers.md)",
    )
    split: str = option("test", "split whose examples are explained")
    examples: int = option(
        100,
        "a fixed stratified sample of about this many examples of the split",
        domain=at_least(2),
    )
    rules: str = option(
        "project",
        "AOPC rules: project (k = ⌈q·n⌉, q = 0.1–0.5) or ferret (ferret-xai's: k = ⌊q·n⌋, "
        "q = 0.1–1, positive scores only)",
        choices=AOPC_RULES,
    )
    removal: str = option(
        "delete",
        "how AOPC and leave-one-out remove a token: delete (the text shortens) or pad "
        "(replaced by [PAD], still attended)",
        choices=("delete", "pad"),
    )
    batch_size: int = option(16, "examples explained at once", domain=positive)
    resamples: int = option(
        10_000, "bootstrap resamples of each student − teacher interval", domain=positive
    )

    def names(self) -> list[str]:
        """The explainers, in the order given, each once."""
        return list(dict.fromkeys(n.strip() for n in self.explainers.split(",") if n.strip()))


@dataclass
class DivergenceSettings(Checked):
    """Where a student's explanations diverge from its teacher's, over a split: which
    examples, which class's maps are compared per word, the AOPC rules and the tables' size."""

    split: str = option("test", "split analysed", choices=("test", "dev", "train"))
    examples: int = option(
        300, "a fixed stratified sample of this many examples of the split", domain=at_least(2)
    )
    explained: str = option(
        "teacher",
        "class whose maps are compared word by word: teacher (the teacher's prediction, for "
        "every model) or gold (the example's label)",
        choices=EXPLAINED,
    )
    rules: str = option(
        "project",
        "AOPC rules: project (k = ⌈q·n⌉, q = 10–50 %) or ferret (ferret-xai's: k = ⌊q·n⌋, "
        "q = 10–100 %, positive scores only, repeated rationales skipped)",
        choices=AOPC_RULES,
    )
    min_count: int = option(
        3, "a word enters the tables when it occurs at least this often", domain=positive
    )
    top: int = option(10, "rows of each over/under-attributed table", domain=positive)

    def key(self) -> dict:
        """The settings that change a model's cached outputs (maps, logits, AOPC)."""
        return {"rules": self.rules}


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"1,32"`` → ``(1, 32)``: distinct integers ≥ 1, ascending; anything else is an error."""
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise WorkbenchError(
            f"--batch-sizes {text!r}: expected comma-separated integers ≥ 1, such as 1,32"
        )
    return sizes


PRECISIONS = ("fp32", "bf16", "fp16")


def parse_precisions(text: str, device_type: str) -> tuple[str, ...]:
    """``"fp32,bf16"`` → ``("fp32", "bf16")`` in :data:`PRECISIONS`' order; ``"auto"`` is fp32
    on the CPU and fp32 and bf16 on CUDA; anything else is an error."""
    if text == "auto":
        return ("fp32", "bf16") if device_type == "cuda" else ("fp32",)
    named = {part.strip() for part in text.split(",") if part.strip()}
    if not named or not named <= set(PRECISIONS):
        raise WorkbenchError(
            f"--precisions {text!r}: expected auto or comma-separated {', '.join(PRECISIONS)}"
        )
    return tuple(p for p in PRECISIONS if p in named)


@dataclass
class BenchmarkSettings(Checked):
    """What is timed and how: the texts, the batch sizes, warm-up, repeats, threads, device and
    weight precisions."""

    split: str = option("test", "split whose texts are timed and scored")
    examples: int = option(
        0,
        "time and score a stratified sample of about this many texts of the split (0: all)",
        domain=non_negative_int,
    )
    batch_sizes: str = option(
        "1,32",
        "comma-separated batch sizes: latency per text is timed at 1, throughput "
        "(examples/s) at every larger one",
        domain=Domain(parses(parse_batch_sizes), "comma-separated integers ≥ 1, such as 1,32"),
    )
    warmup: int = option(1, "untimed rounds over every model first", domain=non_negative_int)
    repeats: int = option(
        5, "timed rounds, each running every model in turn (round-robin)", domain=positive
    )
    threads: int = option(
        0,
        "CPU threads of torch and of ONNX Runtime's operators (0: torch's default), at most 1024",
        domain=between(0, 1024),
    )
    device: str = option("cpu", "cpu, cuda or cuda:N (ONNX graphs run on the CPU only)")
    precisions: str = option(
        "auto",
        "comma-separated weight precisions each PyTorch model is timed in, of fp32, bf16, fp16 "
        "(auto: fp32 on the CPU, fp32 and bf16 on CUDA); ONNX graphs keep their own",
        domain=Domain(
            parses(functools.partial(parse_precisions, device_type="cpu")),
            "auto or comma-separated fp32, bf16, fp16",
        ),
    )


INT8_MODES = ("dynamic", "static")


@dataclass
class OnnxSettings(Checked):
    """How an ONNX export is built and checked: graph fusions, int8 quantisation and the test
    texts its graphs must agree on with the PyTorch model."""

    fuse: bool = option(
        False,
        "optimise the graph offline with ONNX Runtime's transformer fusions (attention, "
        "skip-LayerNorm, bias-GELU, embedding-LayerNorm) for the families its optimiser knows; "
        "ONNX Runtime's own session-time optimisations apply either way (docs/deployment.md "
        "says which is faster where)",
    )
    quantize: str | None = option(
        None,
        "also write model.int8.onnx with int8 weights, checked like the float32 graph",
        choices=(None, "int8"),
    )
    int8: str = option(
        "dynamic",
        "dynamic: activations quantised per batch as the graph runs; static: their ranges "
        "calibrated once on --calibration-examples dev texts",
        choices=INT8_MODES,
    )
    per_channel: bool = option(
        True, "one int8 scale per output channel of a weight rather than one per weight"
    )
    calibration_examples: int = option(
        256,
        "dev texts a static int8 graph is calibrated on, and on which the int8 search measures "
        "its agreement",
        domain=positive,
    )
    accuracy_aware: bool = option(
        True,
        "when the int8 graph agrees with the float32 one on fewer than --min-agreement of "
        "--calibration-examples dev texts, leave in float32 the fewest nodes, costliest first, "
        "that bring it to the gate (recorded in export.json and the card)",
    )
    keep_float: tuple[str, ...] = option(
        (),
        "nodes left in float32 by the int8 graph (repeatable): a node type, such as Gather "
        "(the embedding tables), or a part of node names, such as layer.0/ (the first layer, "
        "often the one int8 disturbs most)",
    )
    examples: int = option(
        0,
        "check the ONNX graphs on a stratified random sample of about this many test texts "
        "(0: all of them)",
        domain=non_negative_int,
    )
    min_agreement: float = option(
        0.99,
        "the share of test texts on which each ONNX graph must predict the PyTorch model's "
        "class; below it the export is an error and its files are kept in OUT.rejected",
        domain=unit_interval,
    )

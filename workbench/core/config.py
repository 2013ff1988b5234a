"""Configuration dataclasses shared by the CLI, the Python API and the app.

Each field carries its help text in ``metadata["help"]`` and, where not every value of its type
makes sense, its ``choices`` or its :class:`Domain`; :func:`add_arguments` turns a dataclass into
``argparse`` options and :func:`from_arguments` reads them back, so the three front ends never
describe an option twice. Every config checks its fields when it is built (:func:`validate`), so
the CLI, the Python API and the app refuse the same values with the same one-line error. Every
run saves its configs as JSON (:func:`to_dict` / :func:`from_dict`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

from workbench.core.errors import WorkbenchError
from workbench.core.names import BUILTIN_MODELS, TASK_NAMES

T = TypeVar("T")


@dataclass(frozen=True)
class Domain:
    """The values an option accepts: a test, and how the error says what was expected.
    ``minimum`` is the smallest integer accepted and ``maximum`` the largest value, for the
    app's number inputs."""

    accepts: Callable[[Any], bool]
    expected: str
    minimum: int | None = None
    maximum: float | None = None


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A finite number: an integer, or a real that is neither infinite nor NaN (not a bool)."""
    if isinstance(value, bool):
        return False
    return _is_integer(value) or (isinstance(value, numbers.Real) and math.isfinite(value))


def at_least(low: int) -> Domain:
    """Integers of at least ``low``."""
    return Domain(lambda v: _is_integer(v) and v >= low, f"an integer ≥ {low}", low)


def between(low: int, high: int) -> Domain:
    """Integers from ``low`` to ``high``."""
    expected = f"an integer in {low}..{high}"
    return Domain(lambda v: _is_integer(v) and low <= v <= high, expected, low, high)


def number_in(low: float, high: float) -> Domain:
    """Finite numbers above ``low``, up to ``high``."""
    expected = f"a number in ({low:g}, {high:g}]"
    return Domain(lambda v: _is_number(v) and low < v <= high, expected, maximum=high)


def _is_colormap(name: Any) -> bool:
    from matplotlib import colormaps  # imported only to check a name that was given

    return isinstance(name, str) and name in colormaps


positive = at_least(1)
non_negative_int = at_least(0)
seed_range = between(0, 2**32 - 1)
positive_number = Domain(lambda v: _is_number(v) and v > 0, "a finite number > 0")
MAX_IG_STEPS = 1000  # integrated-gradients steps: the path's rows are listed per step
ig_steps = between(1, MAX_IG_STEPS)
non_negative_number = Domain(lambda v: _is_number(v) and v >= 0, "a finite number ≥ 0")
ADAPTATIONS = ("full", "lora", "head")  # --adapt: what a teacher's fine-tuning trains
unit_interval = Domain(lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]")
colormap = Domain(_is_colormap, "a matplotlib colormap name, such as viridis or PuOr_r")
MAX_DPI = 1200  # the largest --dpi (its help says why)
dpi_range = number_in(0, MAX_DPI)
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 1000.0  # --temperature's range (its help says why)
temperature_range = Domain(
    lambda v: _is_number(v) and MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
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


def spell_number(value: float) -> str:
    """A number as short as it reads back exactly: ``0.1``, ``10``, ``0.09999999999999998``."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def spell_weights(weights: dict[str, float]) -> str:
    """``{"ce": 0.1, "kd": 0.9}`` → ``"ce=0.1,kd=0.9"``, which :func:`weight_pairs` reads back
    to the same numbers."""
    return ",".join(f"{name}={spell_number(weight)}" for name, weight in weights.items())


def _is_weights(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(name, str) and _is_number(weight) and weight >= 0
        for name, weight in value.items()
    )


@dataclass(frozen=True)
class Syntax:
    """How a setting of a structured type (a mapping, a tuple of class indices) is written as
    text: on the command line, in the app's text boxes, and in records of versions that stored
    the text. ``parse`` reads text (malformed text is a one-line error); ``spell`` writes a value
    as the text ``parse`` reads back to it."""

    parse: Callable[[str], Any]
    spell: Callable[[Any], str]


WEIGHTS = Syntax(weight_pairs, spell_weights)


VIEWS = ("all", "pred", "gold")
Views = str | tuple[int, ...]  # a view's name, or class indices


def parse_views(text: str, names: Sequence[str] = VIEWS) -> Views:
    """Views as written (``"all"``, ``"pred"``, ``"gold"``, ``"2"``, ``"0,2"``) as
    :func:`~workbench.analysis.attribution.attribution_maps` takes them: one of ``names``, or a
    tuple of class indices."""
    if text in names:
        return text
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isdigit() for part in parts):
        raise WorkbenchError(
            f"unknown views {text!r}: use {', '.join(names)} or class indices like 0,2"
        )
    return tuple(int(part) for part in parts)


def spell_views(views: Views) -> str:
    """``(0, 2)`` → ``"0,2"``; a name as it is."""
    return views if isinstance(views, str) else ",".join(map(str, views))


def views_option(default: Views | None, help: str, names: Sequence[str]) -> Any:
    """A setting of views: one of ``names``, or class indices (``0,2`` on the command line)."""

    def accepts(value: Any) -> bool:
        if isinstance(value, str):
            return value in names
        return (
            isinstance(value, list | tuple)
            and bool(value)
            and all(_is_integer(c) and c >= 0 for c in value)
        )

    return option(
        default,
        help,
        domain=Domain(accepts, f"{', '.join(names)} or a list of class indices"),
        syntax=Syntax(functools.partial(parse_views, names=names), spell_views),
    )


# Lists that help texts name as ``{presets}``, ``{terms}``, ``{temperatures}``, ``{ablations}``,
# ``{words}`` (how the per-token terms compare across tokenizers), ``{parameters}`` (what kdw tune
# searches), never written out by hand: kd.methods.objective registers them from its registry,
# and :func:`fill_help` fills them in when a help text is shown. Where the registry is not loaded
# (the foundation alone), the text points to ``kdw methods``, which lists them.
HELP_LISTS: dict[str, Callable[[], str]] = {}
LISTED = ("presets", "terms", "temperatures", "ablations", "words", "parameters")


def fill_help(text: str) -> str:
    """``text`` with the registered lists (:data:`HELP_LISTS`) filled in."""
    for name in LISTED:
        values = HELP_LISTS.get(name)
        text = text.replace("{" + name + "}", values() if values else "`kdw methods` lists them")
    return text


def option(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text and, optionally, its ``choices`` or ``domain``
    (a :class:`Domain`), for the CLI, the app and :func:`validate`, ``path`` for a file or
    folder made absolute (:func:`resolve_paths`), ``syntax`` (a :class:`Syntax`) for a value
    of a structured type written as text on the command line, or ``recorded_if_set=True`` for
    a setting that records and identities (:func:`to_dict`) hold only when it differs from its
    default."""
    metadata = {"help": help, **extra}
    if isinstance(default, dict):  # each config gets its own copy
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def default_of(f: dataclasses.Field) -> Any:
    """The default value of the config field ``f``."""
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


def set_settings(config: Any) -> list[str]:
    """The names of the settings of ``config`` (a config dataclass) that differ from their
    defaults, in field order."""
    return [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != default_of(f)]


def option_name(name: str) -> str:
    """A field's name as the CLI spells it: ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _outside(cls: type, f: dataclasses.Field, value: Any) -> str | None:
    """What field ``f`` of ``cls`` expects, when ``value`` is outside its ``choices`` and
    ``domain`` (None passes where the field is optional); None when it is inside."""
    if value is None and _field_type(cls, f)[1]:
        return None
    choices, domain = f.metadata.get("choices"), f.metadata.get("domain")
    if choices and value not in choices:
        return "one of " + ", ".join("none" if c is None else str(c) for c in choices)
    return domain.expected if domain and not domain.accepts(value) else None


_TYPES = {  # a field's type: the test of a value read from a file, and its name in messages
    str: (lambda v: isinstance(v, str), "a string"),
    int: (_is_integer, "an integer"),
    float: (_is_number, "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    tuple: (
        lambda v: isinstance(v, list | tuple) and all(isinstance(i, str) for i in v),
        "a list of strings",
    ),
}


def _mistyped(cls: type, f: dataclasses.Field, value: Any) -> str | None:
    """The type field ``f`` of ``cls`` expects, when ``value`` (read from a file: JSON) is not
    of it; None when it is."""
    kind, optional = _field_type(cls, f)
    if (value is None and optional) or "syntax" in f.metadata:  # a syntax's domain checks it
        return None
    accepts, name = _TYPES.get(kind, (lambda v: True, ""))
    if accepts(value):
        return None
    domain = f.metadata.get("domain")
    described = f"{name} of {domain.expected}" if kind is str and domain else name
    return described + (" or null" if optional else "")


def validate(config: Any) -> None:
    """Check every field of the config dataclass ``config`` against its ``choices`` and
    ``domain`` (None passes where the field is optional); the first value outside is a
    one-line error naming the option."""
    cls = type(config)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        expected = _outside(cls, f, value)
        if expected:
            raise WorkbenchError(
                f"{option_name(f.name)}: {value!r} is not allowed (expected {expected})"
            )


def resolve_paths(config: Any) -> None:
    """Make the path fields of ``config`` absolute: a field declared with ``path`` (the names
    that win over a path, such as task names) whose value names an existing file or folder, and
    none of those names, gets the absolute path, so that a run's record (its teacher run, its
    data) opens from any working directory."""
    for f in dataclasses.fields(config):
        names, value = f.metadata.get("path"), getattr(config, f.name)
        if names is None or not isinstance(value, str) or not value:
            continue
        path = Path(value).expanduser()
        if path.exists() and value not in names:
            setattr(config, f.name, str(path.resolve()))


class Checked:
    """Base of the config dataclasses: every instance is validated when it is built, its paths
    made absolute (:func:`resolve_paths`), a list of class indices made a tuple."""

    def __post_init__(self) -> None:
        validate(self)
        resolve_paths(self)
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), list):
                setattr(self, f.name, tuple(getattr(self, f.name)))


def parse_label_map(text: str) -> dict[str, str]:
    """``positive=POS,negative=NEG`` as ``{task class: model label}``; a malformed one is a
    one-line error."""
    pairs = [part.partition("=") for part in text.split(",")] if text.strip() else []
    mapping = {task.strip(): label.strip() for task, _, label in pairs}
    if any(not sep or not task.strip() or not label.strip() for task, sep, label in pairs):
        raise WorkbenchError(
            f"--label-map {text!r}: write TASK_CLASS=MODEL_LABEL pairs separated by commas, "
            "e.g. positive=POS,negative=NEG"
        )
    if len(mapping) != len(pairs) or len(set(mapping.values())) != len(mapping):
        raise WorkbenchError(f"--label-map {text!r}: each class and each label once")
    return mapping


def _parses(parse: Callable[[str], Any]) -> Callable[[Any], bool]:
    """A :class:`Domain`'s test: the value is a string that ``parse`` reads without an error."""

    def accepts(value: Any) -> bool:
        with suppress(WorkbenchError):
            return isinstance(value, str) and parse(value) is not None
        return False

    return accepts


def label_map_option(model: str) -> Any:
    """The ``--label-map`` setting of a config that loads ``model`` (a field recorded only
    when set)."""
    return option(
        "",
        f"how the task's classes are named by the {model} where the names differ: "
        "TASK_CLASS=MODEL_LABEL pairs, e.g. positive=POS,negative=NEG (default: matched by "
        "name, case-insensitively; generic LABEL_n names by position)",
        domain=Domain(_parses(parse_label_map), "TASK_CLASS=MODEL_LABEL pairs, e.g. positive=POS"),
        recorded_if_set=True,
    )


@dataclass
class DataConfig(Checked):
    """Which task and how its text is tokenised."""

    task: str = option(
        "tweets",
        "task name: tweets, bbc-news (bundled offline), a GLUE task (cola, sst2, mrpc, qqp, stsb, "
        "mnli, qnli, rte), a local file/directory (CSV, TSV, JSONL, parquet, or a data set saved "
        "by datasets' save_to_disk), or a hub data set (owner/name or name)",
        path=TASK_NAMES,
    )
    task_config: str | None = option(
        None,
        "configuration of a hub data set, as datasets.load_dataset(task, task_config) takes it",
        recorded_if_set=True,
    )
    text_column: str = option(
        "text", "column of the texts, in local files and hub data sets", recorded_if_set=True
    )
    text_pair_column: str | None = option(
        None,
        "column of the second texts of pairs, in local files and hub data sets (default: "
        "text_pair where there is one)",
        recorded_if_set=True,
    )
    label_column: str = option(
        "label", "column of the labels, in local files and hub data sets", recorded_if_set=True
    )
    max_length: int = option(
        128, "maximum tokens per example, [CLS]/[SEP] included", domain=at_least(4)
    )
    max_train_examples: int | None = option(
        None, "use a stratified subsample of this many training examples", domain=positive
    )
    max_eval_examples: int | None = option(
        None, "use a stratified subsample of this many dev/test examples", domain=positive
    )
    split_seed: int = option(
        13, "seed of the deterministic train/dev/test split and subsamples", domain=seed_range
    )
    dedupe: bool = option(
        False,
        "drop from dev and test (never from train) the examples whose text (and second text) "
        "also occurs in train, compared with whitespace collapsed and case kept, before their "
        "subsample: scores on repeated texts are inflated. Without it, such repeats are "
        "counted and reported at load time",
        recorded_if_set=True,
    )
    glue_dir: str | None = option(
        None,
        "local GLUE data: the hub's parquet files (<dir>/<task>/<split>-*.parquet) or the "
        "original distribution's TSV files (<dir>/SST-2/train.tsv, dev.tsv); "
        "default: download nyu-mll/glue from the hub",
        path=(),
    )


@dataclass
class TeacherConfig(Checked):
    """The model fine-tuned as a teacher."""

    model: str = option(
        "minilm-l6",
        "built-in offline model (minilm-l6; smollm2-135m, mpnet-base with the llm extra), a hub "
        "id such as bert-base-uncased, a local directory with config.json and weights, or a "
        "GGUF file; a sequence classifier keeps its head, its classes matched to the task's by "
        "name",
        path=BUILTIN_MODELS,
    )
    label_map: str = label_map_option("--model")
    adapt: str = option(
        "full",
        "which weights fine-tuning trains: full: all of them; lora: low-rank adapters on "
        "--lora-targets and the whole classification head (the saved model has them merged); "
        "head: only the head's output layer, on the frozen model's states, computed once and "
        "cached in the run",
        choices=ADAPTATIONS,
        recorded_if_set=True,
    )
    lora_rank: int = option(
        8, "LoRA's rank r (--adapt lora)", domain=positive, recorded_if_set=True
    )
    lora_alpha: float = option(
        16.0,
        "LoRA's scale α: the update B·A is scaled by α/r (--adapt lora)",
        domain=positive_number,
        recorded_if_set=True,
    )
    lora_dropout: float = option(
        0.05,
        "dropout on LoRA's input (--adapt lora)",
        domain=number_in(0, 0.99),
        recorded_if_set=True,
    )
    lora_targets: str = option(
        "",
        "the modules LoRA adapts, as comma-separated names or all-linear (--adapt lora); "
        "default: peft's choice for the architecture (BERT's query and value, Llama's q_proj and "
        "v_proj), else all-linear",
        recorded_if_set=True,
    )
    lora_layers: int | None = option(
        None,
        "adapt only the top N layers (--adapt lora): the backward pass stops below them, so a "
        "step costs less time and memory; default: every layer",
        domain=positive,
        recorded_if_set=True,
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them "
        "(--adapt full or lora): less memory, about a fifth more time per step",
        recorded_if_set=True,
    )


@dataclass
class StudentConfig(Checked):
    """How the student is built."""

    teacher: str = option(
        "",
        "the fine-tuned teacher: a run folder (from train-teacher), a Hugging Face sequence "
        "classifier's folder (config, weights, tokenizer) or a PEFT adapter folder of one, a "
        "built-in name or a hub id",
        path=BUILTIN_MODELS,
    )
    label_map: str = label_map_option("teacher")
    teacher_cache: str | None = option(
        None,
        "a folder that kdw cache built: every teacher field is read from it, and the teacher "
        "need not exist here (a --teacher named too must be the cache's)",
        path=(),
    )
    allow_unfinished: bool = option(
        False,
        "distil from a teacher run that has not finished training (stopped, killed, diverged "
        "or still training): its best dev model so far, which the run saves at each dev "
        "improvement (default: such a teacher is refused)",
        recorded_if_set=True,
    )
    init: str = option(
        "cut",
        "cut: teacher embeddings + a subset of its layers; pretrained: another checkpoint "
        "(--pretrained); random: a fresh, possibly narrower, config",
        choices=("cut", "pretrained", "random"),
    )
    num_layers: int | None = option(
        None,
        "number of student layers (default: 3 for cut and random; every layer of a pretrained "
        "checkpoint, which a number given here cuts as --init cut does, by --layers)",
        domain=positive,
    )
    layers: str = option(
        "skip",
        "which layers a cut student keeps of its source (the teacher's, or with --init "
        "pretrained --num-layers the checkpoint's): first, skip, last, or an explicit list "
        "of 0-based indices such as 1,3,5",
    )
    freeze_embeddings: bool = option(False, "freeze the student's embeddings")
    pretrained: str | None = option(
        None,
        "checkpoint for --init pretrained (hub id or directory); one of another tokenizer "
        "than the teacher's learns the per-token terms on the words both share ({words})",
        path=BUILTIN_MODELS,
    )
    hidden_size: int | None = option(
        None, "hidden size for --init random (default: teacher's)", domain=positive
    )
    num_heads: int | None = option(
        None, "attention heads for --init random (default: teacher's)", domain=positive
    )


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


def fields_of(config: Any) -> dict[str, dataclasses.Field]:
    """The fields of a config dataclass (or instance) by name."""
    return {f.name: f for f in dataclasses.fields(config)}


def register_settings(method: str, cls: type[T]) -> type[T]:
    """Register ``cls``, the settings dataclass of the distillation method ``method``: every
    :class:`ObjectiveConfig` holds one (built from its defaults unless given), and the CLI, the
    app, ``--config`` files and run records show its fields as the objective's own settings, under
    their names, which no other setting of the objective may take."""
    if method in METHOD_SETTINGS:
        raise ValueError(f"method {method!r} has its settings registered already")
    clash = sorted(set(_flat_fields(ObjectiveConfig)) & set(fields_of(cls)))
    if clash:
        raise ValueError(f"method {method!r}: settings {clash} are the objective's already")
    METHOD_SETTINGS[method] = cls
    return cls


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
        domain=Domain(_parses(parse_batch_sizes), "comma-separated integers ≥ 1, such as 1,32"),
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
            _parses(functools.partial(parse_precisions, device_type="cpu")),
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
        256, "dev texts a static int8 graph is calibrated on", domain=positive
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


@dataclass
class OptimConfig(Checked):
    """Optimisation, evaluation and checkpointing."""

    epochs: float = option(
        3.0, "training epochs (fractions allowed), at most 1000", domain=number_in(0, 1000)
    )
    batch_size: int = option(
        32,
        "training batch size: the global batch of a step, over all processes and "
        "accumulation steps",
        domain=positive,
    )
    accumulation_steps: int = option(
        1,
        "split each batch into N micro-batches run one after another, their gradients summed "
        "into the batch's (the same step with less memory; N must divide the batch per process)",
        domain=positive,
    )
    precision: str = option(
        "fp32",
        "fp32; bf16 (autocast on CUDA, or on CPU); fp16 (CUDA only: autocast with a gradient "
        "scaler). Evaluation and the teacher cache stay in float32",
        choices=PRECISIONS,
        recorded_if_set=True,
    )
    eval_batch_size: int = option(64, "evaluation batch size", domain=positive)
    learning_rate: float = option(
        5e-5,
        "peak AdamW learning rate (fine-tuning uses about 1e-5 to 1e-4; a training that "
        "diverges stops with an error naming the step and the term)",
        domain=positive_number,
    )
    weight_decay: float = option(
        0.01,
        "AdamW weight decay (not applied to biases and LayerNorm), in [0, 1]: each step scales "
        "the weights by 1 − learning rate × decay",
        domain=unit_interval,
    )
    warmup_ratio: float = option(
        0.1, "share of steps with linear warm-up, then linear decay", domain=unit_interval
    )
    max_grad_norm: float = option(
        1.0, "gradient clipping norm (0 disables)", domain=non_negative_number
    )
    eval_every: int = option(
        0, "evaluate on dev every N steps (0: at the end of each epoch)", domain=non_negative_int
    )
    checkpoint_every: int = option(50, "save a resumable checkpoint every N steps", domain=positive)
    log_every: int = option(
        20,
        "every N steps (and at the first and last), log each loss term's weighted value and "
        "its share of the gradient to metrics.jsonl: every term's share at the first and last "
        "step, one term's in turn between (0: never; costs one extra backward pass per share, "
        "and changes no weight)",
        domain=non_negative_int,
    )
    seed: int = option(42, "seed of initialisation, data order and dropout", domain=seed_range)
    threads: int = option(
        0, "torch CPU threads (0: torch's default), at most 1024", domain=between(0, 1024)
    )
    device: str = option("auto", "cpu, cuda, cuda:N, or auto (cuda when available)")


# a configuration file's sections (kdw distill --config, kdw tune's best.json), as their dataclasses
CONFIG_SECTIONS = {
    "data": DataConfig,
    "student": StudentConfig,
    "objective": ObjectiveConfig,
    "optim": OptimConfig,
}


@dataclass
class TuneConfig(Checked):
    """The search: how many trials, over which space, scored by which dev metric."""

    trials: int = option(
        20, "trials in the study in all (a resumed study runs the rest)", domain=positive
    )
    space: tuple[str, ...] = option(
        (),
        "override one parameter's search space: NAME=v1,v2,... (choices) or NAME=LOW:HIGH "
        "(uniform; LOW:HIGH:log for a log scale); repeat for several. Parameters: {parameters}, "
        "lr (those the method has)",
    )
    metric: str | None = option(None, "dev metric to maximise (default: the task's main one)")
    prune: bool = option(True, "stop trials whose dev curve falls below the running median")
    reports_per_epoch: int = option(
        4,
        "dev evaluations per epoch reported to the pruner (used when --eval-every is 0)",
        domain=positive,
    )
    storage: str | None = option(
        None,
        "database of the study, an SQLAlchemy URL (postgresql+psycopg2://user:password@host/db, "
        "mysql+pymysql://..., sqlite:///file.db): several kdw tune workers, on one machine or "
        "several, given the same --storage and --study-name share one study (default: "
        "<out>/study.db, one worker)",
        recorded_if_set=True,
    )
    study_name: str = option(
        "kdw-tune",
        "name of the study in --storage",
        domain=Domain(lambda v: isinstance(v, str) and v.strip() == v != "", "a name"),
        recorded_if_set=True,
    )


TRACKERS = ("tensorboard", "mlflow")  # what --report-to offers (kd.training.tracking)


def parse_trackers(items: str | Sequence[str]) -> tuple[str, ...]:
    """``"tensorboard,mlflow"`` (or the repeated option's items, each a comma list) →
    ``("tensorboard", "mlflow")``, each once, in the order given; ``none`` names no tracker.
    A tracker that is not offered is a one-line error saying which are."""
    names = [
        name.strip().lower()
        for item in ([items] if isinstance(items, str) else items)
        for name in str(item).split(",")
        if name.strip()
    ]
    unknown = [name for name in names if name not in (*TRACKERS, "none")]
    if unknown:
        raise WorkbenchError(
            f"--report-to {unknown[0]}: not offered; use {', '.join(TRACKERS)} (comma-separated) "
            "or none"
        )
    return tuple(dict.fromkeys(name for name in names if name != "none"))


@dataclass
class TrackingConfig(Checked):
    """Experiment trackers that follow a training beside its run folder."""

    report_to: tuple[str, ...] = option(
        (),
        "send the training's curves (every metrics.jsonl scalar at its step), its settings "
        "and its test results to experiment trackers: a comma list of "
        f"{', '.join(TRACKERS)} (default: none). TensorBoard writes RUN/tensorboard/; MLflow "
        "writes to --mlflow-uri",
    )
    mlflow_uri: str | None = option(
        None,
        "MLflow tracking URI: a server (http://HOST:PORT) or a database such as "
        "sqlite:///PATH/mlflow.db (default: a local store, mlruns/mlflow.db beside the run "
        "folder: in the folder that holds it, or in kdw tune's --out)",
    )

    def __post_init__(self) -> None:
        self.report_to = parse_trackers(self.report_to)
        if self.mlflow_uri and "mlflow" not in self.report_to:
            raise WorkbenchError(
                f"--mlflow-uri {self.mlflow_uri} is where MLflow runs go: add mlflow to "
                "--report-to, or leave --mlflow-uri out"
            )
        super().__post_init__()


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field_type(cls: type, f: dataclasses.Field) -> tuple[Any, bool]:
    """The concrete type of a field and whether it is optional (``tuple[str, ...]`` fields are
    ``tuple``: a repeatable option)."""
    hint = _type_hints(cls)[f.name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return typing.get_origin(hint) or hint, False


def _parse_optional(kind: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "") else kind(text)

    parse.__name__ = kind.__name__  # argparse names it in a refusal: "invalid int value: 'abc'"
    return parse


def _parse_text(syntax: Syntax) -> Callable[[str], Any]:
    """``syntax.parse`` for ``argparse``: malformed text is a usage error that says why."""

    def parse(text: str) -> Any:
        try:
            return syntax.parse(text)
        except WorkbenchError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--option`` per field of the dataclass ``cls`` to ``parser``; a settings map's
    (:data:`METHOD_SETTINGS`), one group of options per registered settings dataclass."""
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            for settings in f.metadata["settings"].values():
                add_arguments(parser, settings)
            continue
        kind, optional = _field_type(cls, f)
        name = option_name(f.name)
        default, syntax = default_of(f), f.metadata.get("syntax")
        help_text = f.metadata.get("help", "")
        if "default" not in help_text:
            help_text += f" (default: {syntax.spell(default) if syntax else default})"
        options = {"default": default, "help": help_text, "dest": f.name}
        if kind is bool:
            group.add_argument(name, action=argparse.BooleanOptionalAction, **options)
            continue
        options["metavar"] = f.name.upper()
        if kind is tuple:
            group.add_argument(name, action="append", **options | {"default": None})
            continue
        choices = f.metadata.get("choices")  # None, where offered, last
        options["choices"] = sorted(choices, key=lambda c: c is None) if choices else None
        kind = _parse_text(syntax) if syntax else kind
        group.add_argument(name, type=_parse_optional(kind) if optional else kind, **options)


def from_arguments(cls: type[T], namespace: argparse.Namespace) -> T:
    """Build ``cls`` from the options :func:`add_arguments` added."""
    values = {}
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            values[f.name] = {
                name: from_arguments(settings, namespace)
                for name, settings in f.metadata["settings"].items()
            }
            continue
        value = getattr(namespace, f.name)
        if _field_type(cls, f)[0] is tuple:
            value = f.default if value is None else tuple(value)
        values[f.name] = value
    return cls(**values)


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass, a settings map's settings among its own (flat,
    by name); a ``recorded_if_set`` field at its default is left out (:func:`from_dict` restores
    it), so that adding a setting changes no suite row's identity."""
    values = dataclasses.asdict(config)
    for f in dataclasses.fields(config):
        if "settings" in f.metadata:
            del values[f.name]
            for settings in getattr(config, f.name).values():
                values.update(to_dict(settings))
        elif f.metadata.get("recorded_if_set") and values[f.name] == default_of(f):
            del values[f.name]
    return values


def _flat_fields(cls: type) -> dict[str, tuple[type, dataclasses.Field]]:
    """Each setting of the config dataclass ``cls`` by name, with the dataclass that declares
    it: its own fields and, for a settings map, each registered settings dataclass's."""
    flat: dict[str, tuple[type, dataclasses.Field]] = {}
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            for settings in f.metadata["settings"].values():
                flat.update(_flat_fields(settings))
        else:
            flat[f.name] = (cls, f)
    return flat


def spell(cls: type, name: str, value: Any) -> Any:
    """The value of setting ``name`` of the config dataclass ``cls`` as its :class:`Syntax`
    writes it (``{"ce": 0.1}`` → ``"ce=0.1"``); a value of another setting as it is."""
    syntax = _flat_fields(cls)[name][1].metadata.get("syntax")
    return syntax.spell(value) if syntax and value is not None else value


def spelled(config: Any) -> dict[str, Any]:
    """:func:`to_dict` with each setting of a :class:`Syntax` as its text: the form in which
    fingerprints hash a config (a suite's identities)."""
    return {name: spell(type(config), name, value) for name, value in to_dict(config).items()}


def config_key(config: Any) -> str:
    """A config dataclass as canonical JSON: a hashable cache key that
    ``from_dict(cls, json.loads(key))`` turns back into the config."""
    return json.dumps(to_dict(config), sort_keys=True)


def _read(f: dataclasses.Field, value: Any) -> Any:
    """A setting's value as a ``--config`` file may write it: the text of a :class:`Syntax`, as
    on the command line, parsed."""
    syntax = f.metadata.get("syntax")
    if syntax and isinstance(value, str):
        try:
            return syntax.parse(value)
        except WorkbenchError as error:
            raise WorkbenchError(f"{option_name(f.name)}: {error}") from None
    return value


def check_values(cls: type, values: Any, *, text: bool = False) -> dict[str, Any]:
    """The settings ``values`` read from a file (a run's record, a ``--config`` file) for the
    config dataclass ``cls`` (with ``text``, as a ``--config`` file may hold them: a
    :class:`Syntax`'s values as their text), checked without building the config: an object,
    of known settings, each of its field's type (JSON's: a list for a tuple, an integer for a
    float) and inside its choices and domain; the first problem is a one-line error naming the
    option."""
    if not isinstance(values, dict):
        raise WorkbenchError(f"the {cls.__name__} settings are not an object")
    fields = _flat_fields(cls)
    unknown = set(values) - set(fields)
    if unknown:
        raise WorkbenchError(
            f"unknown {cls.__name__} settings {sorted(unknown)}; known: {sorted(fields)}"
        )
    if text:
        values = {name: _read(fields[name][1], value) for name, value in values.items()}
    for name, value in values.items():
        owner, f = fields[name]
        expected = _mistyped(owner, f, value) or _outside(owner, f, value)
        if expected:
            raise WorkbenchError(
                f"{option_name(name)}: {value!r} is not allowed (expected {expected})"
            )
    return values


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Rebuild ``cls`` from :func:`to_dict`'s output; unknown keys and values of another type
    are an error (:func:`check_values`); a settings map's settings are given to their
    dataclasses."""
    values = dict(check_values(cls, values))  # a copy: the caller's record stays as it is
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            values[f.name] = {
                name: {key: values.pop(key) for key in fields_of(settings) if key in values}
                for name, settings in f.metadata["settings"].items()
            }
    return cls(**values)


BASELINES = ("pad", "pad-keep-special", "zero", "mean-keep-first")
DECODER_BASELINE = "mean-keep-first"  # the default of a decoder classifier (its head reads the
# last token); every other classifier's is "pad"
BASELINE_HELP = (
    "IG baseline: pad (embedding output of an all-[PAD] sequence), pad-keep-special "
    "([CLS]/[SEP] kept), zero (the AD-KD authors' code), mean-keep-first (each text's first "
    "token kept, the mean word embedding elsewhere: a decoder's attention sink stays where it "
    "is, so its path is smooth; the first token gets no attribution); default: mean-keep-first "
    "for a decoder classifier, pad otherwise"
)


def check_steps(steps: int) -> None:
    if not ig_steps.accepts(steps):
        raise WorkbenchError(f"steps: {steps!r} is not allowed (expected {ig_steps.expected})")


def check_baseline(baseline: str) -> None:
    if baseline not in BASELINES:
        raise WorkbenchError(f"unknown baseline {baseline!r}: use one of {', '.join(BASELINES)}")


METHODS = ("ig", "grad")


@dataclass
class MapSettings(Checked):
    """How one attribution map is computed: method, IG path and baseline, top-K dimensions."""

    method: str = option(
        "ig",
        "ig: Integrated Gradients maps (per token ‖TopK(|IG|)‖₂, unit norm per view); "
        "grad: Grad saliency (gradient × input summed over dimensions, signed)",
        choices=METHODS,
    )
    steps: int = option(
        50,
        "IG interpolation steps m (right Riemann sum; 1 = (E − E')⊙∇F(E), AD-KD's training "
        "signal); 50, Captum's default, keeps the completeness gap under 5 percent on the demo's "
        "teacher (docs/results.md)",
        domain=ig_steps,
    )
    baseline: str | None = option(None, BASELINE_HELP, choices=(None, *BASELINES))
    top_k: int | None = option(
        None,
        "keep the K largest |IG| dimensions per token before the norm (None: all)",
        domain=positive,
    )


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
class DivergenceSettings(MapSettings):
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
        return {
            name: getattr(self, name) for name in ("method", "steps", "baseline", "top_k", "rules")
        }


@dataclass
class AttributionSettings(MapSettings):
    """How tokens are attributed: the map's settings, the classes (views), the layer, and the
    batching of the texts."""

    views: Views = views_option(
        "all",
        "classes attributed: all, pred, gold (needs labels), or class indices such as 0,2",
        VIEWS,
    )
    layer: int | None = option(
        None,
        "attribute w.r.t. this encoder layer's output (0-based; None: embedding output)",
        domain=non_negative_int,
    )
    max_length: int = option(
        128, "maximum tokens per text; longer texts are truncated (flagged)", domain=at_least(4)
    )
    batch_size: int = option(
        16, "texts per batch (padded per batch to its longest text)", domain=positive
    )
    memory_mib: float = option(
        1024.0,
        "memory budget for one chunk of the step × example batch, in MiB (estimated)",
        domain=positive_number,
    )

    def key(self) -> dict:
        """The settings that change the maps (the key of cached maps)."""
        keep = ("method", "steps", "baseline", "top_k", "views", "layer")
        if self.method == "grad":
            keep = ("method", "views", "layer")
        return {name: getattr(self, name) for name in keep}

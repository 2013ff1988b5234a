"""The configuration machinery shared by the CLI, the Python API and the app, the data's
settings (:class:`DataConfig`, read by :mod:`workbench.core.data`) and a prompted classifier's
(:class:`PromptConfig`, read by :mod:`workbench.core.prompted`; here, because the CLI parses it
before torch loads); every other config dataclass lives beside the code that reads it, built
with the functions here.

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
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from workbench.core.errors import WorkbenchError
from workbench.core.names import TASK_NAMES

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


def is_number(value: Any) -> bool:
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
    return Domain(lambda v: is_number(v) and low < v <= high, expected, maximum=high)


def _is_colormap(name: Any) -> bool:
    from matplotlib import colormaps  # imported only to check a name that was given

    return isinstance(name, str) and name in colormaps


positive = at_least(1)
non_negative_int = at_least(0)
seed_range = between(0, 2**32 - 1)
positive_number = Domain(lambda v: is_number(v) and v > 0, "a finite number > 0")
MAX_IG_STEPS = 1000  # integrated-gradients steps: the path's rows are listed per step
ig_steps = between(1, MAX_IG_STEPS)
non_negative_number = Domain(lambda v: is_number(v) and v >= 0, "a finite number ≥ 0")
unit_interval = Domain(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]")
colormap = Domain(_is_colormap, "a matplotlib colormap name, such as viridis or PuOr_r")
MAX_DPI = 1200  # the largest --dpi (its help says why)
dpi_range = number_in(0, MAX_DPI)


def spell_number(value: float) -> str:
    """A number as short as it reads back exactly: ``0.1``, ``10``, ``0.09999999999999998``."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


@dataclass(frozen=True)
class Syntax:
    """How a setting of a structured type (a mapping, a tuple of class indices) is written as
    text: on the command line, in the app's text boxes, and in records of versions that stored
    the text. ``parse`` reads text (malformed text is a one-line error); ``spell`` writes a value
    as the text ``parse`` reads back to it."""

    parse: Callable[[str], Any]
    spell: Callable[[Any], str]


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


def fields_of(config: Any) -> dict[str, dataclasses.Field]:
    """The fields of a config dataclass (or instance) by name."""
    return {f.name: f for f in dataclasses.fields(config)}


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
    float: (is_number, "a number"),
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
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        _refuse(f.name, value, _outside(type(config), f, value))


def _refuse(name: str, value: Any, expected: str | None) -> None:
    """Refuse ``name``'s ``value`` in one line when ``expected`` (what it should be) is given."""
    if expected:
        raise WorkbenchError(f"{option_name(name)}: {value!r} is not allowed (expected {expected})")


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


def parses(parse: Callable[[str], Any]) -> Callable[[Any], bool]:
    """A :class:`Domain`'s test: the value is a string that ``parse`` reads without an error."""

    def accepts(value: Any) -> bool:
        with suppress(WorkbenchError):
            return isinstance(value, str) and parse(value) is not None
        return False

    return accepts


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


# a run record's config sections (run.json's "configs"), as their dataclasses: each layer registers
# the sections it owns (register_section), and reading a record checks a registered section's
# settings (workbench.core.runs)
SECTIONS: dict[str, type] = {"data": DataConfig}


def register_section(name: str, cls: type) -> None:
    """Register ``cls`` as the dataclass of the run record's config section ``name``; a name
    registered already is an error."""
    if name in SECTIONS:
        raise WorkbenchError(
            f"config section {name!r}: {cls.__module__}.{cls.__qualname__} and "
            f"{SECTIONS[name].__module__}.{SECTIONS[name].__qualname__} both register it"
        )
    SECTIONS[name] = cls


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


def _text_type(kind: Any, syntax: Syntax | None, optional: bool) -> Callable[[str], Any]:
    """How ``argparse`` reads an option's text: by ``syntax`` (malformed text is a usage error
    that says why) or as ``kind``; ``none`` or nothing is None where the option is optional."""

    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", ""):
            return None
        try:
            return syntax.parse(text) if syntax else kind(text)
        except WorkbenchError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    # argparse names it in a refusal: "invalid int value: 'abc'"
    parse.__name__ = "parse" if syntax else kind.__name__
    return parse


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--option`` per field of the dataclass ``cls`` to ``parser``; a settings map's
    (a field whose ``settings`` metadata maps names to dataclasses), one group of options per
    registered settings dataclass."""
    group = parser.add_argument_group(cls.__name__, (cls.__doc__ or "").strip().splitlines()[0])
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            for settings in f.metadata["settings"].values():
                add_arguments(parser, settings)
            continue
        kind = _field_type(cls, f)[0]
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
        kind, options["choices"] = option_type(cls, f)
        group.add_argument(name, type=kind, **options)


def option_type(cls: type, f: dataclasses.Field) -> tuple[Callable[[str], Any], list | None]:
    """How ``argparse`` reads field ``f`` of ``cls`` (not a flag or a repeatable option): the
    ``type`` that parses its text, and its ``choices`` (None, where offered, last)."""
    kind, optional = _field_type(cls, f)
    syntax, choices = f.metadata.get("syntax"), f.metadata.get("choices")
    kind = _text_type(kind, syntax, optional) if syntax or optional else kind
    return kind, sorted(choices, key=lambda c: c is None) if choices else None


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


def flat_fields(cls: type) -> dict[str, tuple[type, dataclasses.Field]]:
    """Each setting of the config dataclass ``cls`` by name, with the dataclass that declares
    it: its own fields and, for a settings map, each registered settings dataclass's."""
    flat: dict[str, tuple[type, dataclasses.Field]] = {}
    for f in dataclasses.fields(cls):
        if "settings" in f.metadata:
            for settings in f.metadata["settings"].values():
                flat.update(flat_fields(settings))
        else:
            flat[f.name] = (cls, f)
    return flat


def spell(cls: type, name: str, value: Any) -> Any:
    """The value of setting ``name`` of the config dataclass ``cls`` as its :class:`Syntax`
    writes it (``{"ce": 0.1}`` → ``"ce=0.1"``); a value of another setting as it is."""
    syntax = flat_fields(cls)[name][1].metadata.get("syntax")
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
    fields = flat_fields(cls)
    if unknown := set(values) - set(fields):
        raise WorkbenchError(
            f"unknown {cls.__name__} settings {sorted(unknown)}; known: {sorted(fields)}"
        )
    if text:
        values = {name: _read(fields[name][1], value) for name, value in values.items()}
    for name, value in values.items():
        owner, f = fields[name]
        _refuse(name, value, _mistyped(owner, f, value) or _outside(owner, f, value))
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


# --- a prompted classifier's settings (the model itself: workbench.core.prompted) -------------

PROMPT_TEXT = "{text}"  # where a prompt template puts the text
PROMPT_ANSWER = "{answer}"  # what follows it in a template opens the model's answer
CONTENT_FREE = "N/A"  # the content-free text of contextual calibration


def parse_verbalizer(text: str) -> dict[str, tuple[str, ...]]:
    """``negative=bad|awful,positive=good`` as ``{class: words}``; a malformed one is a
    one-line error."""
    found: dict[str, tuple[str, ...]] = {}
    for part in filter(str.strip, text.split(",")):
        name, sep, words = part.partition("=")
        kept = tuple(w.strip() for w in words.split("|") if w.strip())
        if not sep or not name.strip() or not kept:
            raise WorkbenchError(
                f"--verbalizer {text!r}: write CLASS=WORD pairs separated by commas, a class's "
                "words separated by |, e.g. negative=negative|bad,positive=positive|good"
            )
        found[name.strip()] = kept
    return found


def _verbalizer_syntax(text: str) -> bool:
    return not text or bool(parse_verbalizer(text))


@dataclass
class PromptConfig(Checked):
    """A causal language model without a classification head made a classifier by a prompt."""

    prompt: str = option(
        "",
        "a prompt template with {text} where the text goes, such as 'Is the sentiment of this "
        "tweet negative, neutral or positive? {text}': with --verbalizer, a causal language "
        "model without a classification head (an instruction-tuned LLM) is a classifier that "
        "reads its answer's words, the prompt wrapped in its chat template where it has one; "
        "text after {answer} opens the model's answer, such as '{answer}The sentiment is'",
        recorded_if_set=True,
    )
    verbalizer: str = option(
        "",
        "each class's answer words (--prompt): CLASS=WORD pairs, a class's words separated by "
        "|, e.g. negative=negative,neutral=neutral,positive=positive",
        domain=Domain(_verbalizer_syntax, "CLASS=WORD pairs, e.g. negative=negative"),
        recorded_if_set=True,
    )
    shots: int = option(
        0,
        "show the model K labelled training examples of each class before the text, with their "
        "answers (--prompt; drawn with --split-seed)",
        domain=non_negative_int,
        recorded_if_set=True,
    )
    calibrate: bool = option(
        False,
        "contextual calibration (--prompt): divide each class's probability by its probability "
        f"for the content-free text {CONTENT_FREE!r}",
        recorded_if_set=True,
    )

    @property
    def given(self) -> bool:
        """Whether a prompt is asked for; the other settings without one are a one-line error."""
        if not self.prompt and (self.verbalizer or self.shots or self.calibrate):
            raise WorkbenchError("--verbalizer, --shots and --calibrate go with --prompt")
        if self.prompt and not self.verbalizer:
            raise WorkbenchError("--prompt needs --verbalizer: the answer words of each class")
        return bool(self.prompt)

"""The distillation objective: a registry of loss terms and their weighted sum.

Each method's module of :mod:`kd.methods` registers its parts here, in one call
(:func:`register_method`): its *terms* (:class:`Term`: how a pure loss function reads a training
step), the *teacher fields* they need (:class:`TeacherField`), its *presets* (:class:`Preset`)
and, where it has them, a *method* (:class:`Method`: its settings resolved for the models, as its
terms read them through :meth:`Objective.of`) and a *student set-up* (:class:`StudentSetup`).
Cacheable teacher fields are served from the run's cache; the others (CKD's hidden states) are
recomputed without a graph each step.
Explicit weights (``ce=0.1,kd=0.9,attr=10``) replace a preset's, so any terms combine. Importing
this module imports its package, and so registers the built-in methods.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from kd.methods.config import (
    METHOD_SETTINGS,
    ObjectiveConfig,
    Registry,
    check_settings,
    spell_weights,
)
from workbench.core.config import HELP_LISTS, spell
from workbench.core.errors import WorkbenchError, listed
from workbench.core.lazy import lazy_module

T = TypeVar("T")

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

    from workbench.core.models import ModelOutput

torch = lazy_module("torch")
models = lazy_module("workbench.core.models")


@dataclass
class StepInputs:
    """One step's inputs to the terms; the student runs at most once, lazily. A gradient term's
    forward pass leaves its logits in ``shared_logits``, which serve the other terms when none
    needs hidden states (as in the authors' code)."""

    model: PreTrainedModel
    batch: dict[str, Tensor]
    teacher: dict[str, Tensor]
    hidden_states: bool
    shared_logits: Tensor | None = None
    _student: ModelOutput | None = None

    @property
    def student(self) -> ModelOutput:
        if self._student is None and self.shared_logits is not None and not self.hidden_states:
            self._student = models.ModelOutput(self.shared_logits, self.batch["attention_mask"])
        if self._student is None:
            self._student = models.forward(self.model, self.batch, hidden_states=self.hidden_states)
        return self._student

    def share(self, logits: Tensor) -> None:
        """Offer the logits of a gradient term's forward pass to the other terms."""
        if self.shared_logits is None:
            self.shared_logits = logits


EXAMPLES, TOKENS = "examples", "tokens"
WORDED = "examples with words"  # across tokenizers, those that share a word; else every example
LABELLED = "labelled"  # a term's labels: it averages over the labelled examples only


@dataclass(frozen=True)
class Term:
    """How a loss term is computed in a step, and what it needs. ``unit``: what its value is a
    mean over, ``"examples"``, ``"tokens"`` (real tokens; across tokenizers, shared words) or
    ``"examples with words"`` (across tokenizers, the examples that share a word; else every
    example), or a function of the objective giving it; data-parallel training and accumulation
    weight each part of a batch by its share of it (:mod:`kd.training.distributed`), exactly
    unless ``exact_split=False`` (a denominator that is no such count). ``on_words``: how a
    per-token term compares on words across tokenizers (batches with ``word_ids``,
    :mod:`workbench.core.data.alignment`); empty if it cannot."""

    compute: Callable[[Objective, StepInputs], Tensor]
    teacher_fields: tuple[str, ...] = ()
    hidden_states: bool = False
    runs_student: bool = False  # runs its own student forward (and shares its logits)
    unit: str | Callable[[Objective], str] = EXAMPLES
    exact_split: bool = True
    on_words: str = ""  # how it compares on shared words across tokenizers ("": it cannot)
    # how it reads gold labels: "" not at all; LABELLED: a mean over the labelled examples only
    # (a transfer set's are left out); else why it cannot do without them (refused with one)
    labels: str | Callable[[Objective], str] = ""


@dataclass(frozen=True)
class TeacherField:
    """A value the frozen teacher computes per example: ``compute(objective, teacher, batch)``
    gives ``[B, ...]`` (``[B, L, ...]`` when ``per_token``). ``cacheable=False`` fields are
    recomputed each step instead of being stored for every example. ``key(objective)``: the
    settings that change the values (part of the teacher cache's key). ``gradients``: the
    value takes gradients through the teacher (it cannot be computed in inference mode)."""

    compute: Callable[[Objective, PreTrainedModel, dict[str, Tensor]], Tensor]
    per_token: bool = False
    cacheable: bool = True
    key: Callable[[Objective], dict] | None = None
    gradients: bool = False


@dataclass(frozen=True)
class Method:
    """A method's own settings: when any of ``terms`` has a weight, ``resolve(objective)`` checks
    the models and gives the method's settings dataclass as its terms read it, every value the
    preset or the parity decides in place of None (:meth:`Objective.of` returns it), or None
    where nothing is left to decide; ``record(objective)`` what ``run.json`` keeps of them and
    ``modules(objective)`` the trainable modules its terms own (PKD's projection), trained with
    the student and left out of the saved model. A method whose terms match layers names the key
    of its record that holds the ``(student, teacher)`` layer pairs (``layer_pairs``, as
    ``hidden_states`` indices) and how the app's geometry page names the mapping (``mapping``;
    ``{method}``: the run's preset). ``describe(record)``: what a run's description adds for the
    method, from the run's resolved objective (``"official distance"``; empty where the method
    was not in use)."""

    terms: frozenset[str]
    resolve: Callable[[Objective], Any]
    record: Callable[[Objective], dict[str, Any]]
    modules: Callable[[Objective], dict[str, torch.nn.Module]] | None = None
    layer_pairs: str = ""
    mapping: str = ""
    describe: Callable[[dict[str, Any]], str] | None = None


@dataclass(frozen=True)
class StudentSetup:
    """How a method sets the student up before training (GKD: the teacher's embeddings, frozen,
    no dropout): ``active(objective)`` whether it applies; ``prepare(objective, teacher,
    student)`` does it; ``record(objective)`` what ``run.json`` keeps of it; ``pin(config,
    weights)`` the config with the set-up fixed, so that its control (weights 0) keeps it."""

    active: Callable[[Objective], bool]
    prepare: Callable[[Objective, PreTrainedModel, PreTrainedModel], None]
    record: Callable[[Objective], dict[str, Any]]
    pin: Callable[[ObjectiveConfig, dict[str, float]], ObjectiveConfig]


@dataclass(frozen=True)
class Ablation:
    """A variant of a preset that ``kdw reproduce --ablations`` trains beside it, named
    ``"<preset> <name>"`` in the group ``group``: ``weights`` set in the preset's (``{"ce": 0}``
    drops CE) and ``settings`` replaced in its config (``{"attr_views": "pred"}``)."""

    name: str
    group: str
    weights: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """A sweep of a preset's config ``setting`` over ``values`` (a suite's task plan may hold
    others under ``key``, :attr:`kd.experiments.reproduce.suite.TaskPlan.sweeps`): one student
    per value, ``"<preset> <label>=<value>"`` in the group ``group``. The report draws test
    accuracy against the values on the axis ``axis``, the full method at the preset's value or,
    where it leaves it unset, as a line named ``unset``. ``quick``: the fewer values the 2-core
    default suite trains (empty: ``values``)."""

    label: str
    group: str
    setting: str
    key: str
    values: tuple[int, ...]
    axis: str
    unset: str = ""
    quick: tuple[int, ...] = ()


@dataclass(frozen=True)
class Parameter:
    """A parameter ``kdw tune`` searches: its domain (finite, ``low < value`` — ``low ≤ value``
    when ``closed`` — ``≤ high``; an integer when ``integer``), the terms it needs (β: the preset's
    own, :attr:`Preset.beta`), how a trial's value sets the config (``apply``; None: the learning
    rate) and its value in a preset's config (``read``; None if unset), held where not searched."""

    help: str
    low: float
    high: float = math.inf
    closed: bool = True
    integer: bool = False
    needs: tuple[str, ...] = ()
    apply: Callable[[ObjectiveConfig, float], ObjectiveConfig] | None = None
    read: Callable[[ObjectiveConfig], float | None] = lambda _config: None

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the domain, or None."""
        above = value >= self.low if self.closed else value > self.low
        if not math.isfinite(value) or not (above and value <= self.high):
            left, right = "[" if self.closed else "(", ")" if self.high == math.inf else "]"
            return f"must lie in {left}{self.low:g}, {self.high:g}{right}"
        if self.integer and value != int(value):
            return "must be an integer"
        return None


@dataclass(frozen=True)
class Claim:
    """A claim of a method's paper that the reproduction report checks: the method's test
    ``metric`` stands in ``relation`` to that of the preset ``than`` (``">"``; ``"≫"``, checked
    as ``">"``; ``"≥"``: not worse; ``"<"``), or, with ``relation="lowest"``, is the lowest of
    all the main table's students. The verdict is the bootstrap interval of the difference.
    ``metric``: ``accuracy`` or a per-example one the suite records (``saliency_loyalty``,
    ``attribution_gap``, ``aopc_comprehensiveness``, ``aopc_sufficiency``)."""

    metric: str
    relation: str = ">"
    than: str = "kd"

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ValueError(f"claim relation {self.relation!r}: use one of {RELATIONS}")


RELATIONS = (">", "≫", "≥", "<", "lowest")


@dataclass(frozen=True)
class Preset:
    """A method's weights per parity, temperature, official KD form, the settings it fixes
    (``settings``: PKD-last's mapping) and those it chooses where the config leaves them unset
    (``defaults``), and its own terms (``own``), which its control goes without (:func:`control`).
    Beside them, all else about the method: its display ``name`` and paper ``reference``, ``kdw
    tune``'s default ``space`` (parameter → ``--space`` spec), the term β weighs (``beta``), the
    parameters tuned on dev (``tuned``), its ``ablations`` and the ``claims`` its report checks."""

    paper: dict[str, float]
    official: dict[str, float]
    temperature: float = 4.0
    official_kd_form: str = "kl-mean"
    settings: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    own: tuple[str, ...] = ()
    name: str = ""
    reference: str = ""
    space: dict[str, str] = field(default_factory=dict)
    beta: str | None = None
    tuned: tuple[str, ...] = ()
    ablations: tuple[Ablation | Sweep, ...] = ()
    claims: tuple[Claim, ...] = ()
    gallery: bool = False  # the report's heatmap gallery shows its students


TERMS: Registry[Term] = Registry("loss term")
TEACHER_FIELDS: Registry[TeacherField] = Registry("teacher field")
METHODS: Registry[Method] = Registry("method of the terms")  # by its terms, "+"-joined
STUDENT_SETUPS: Registry[StudentSetup] = Registry("student set-up")
PARAMETERS: Registry[Parameter] = Registry("tune parameter")
PRESETS: Registry[Preset] = Registry("preset")


def register_method(
    name: str,
    *,
    settings: type | None = None,
    teacher_fields: Mapping[str, TeacherField] | None = None,
    terms: Mapping[str, Term] | None = None,
    method: Method | None = None,
    setup: StudentSetup | None = None,
    parameters: Mapping[str, Parameter] | None = None,
    presets: Mapping[str, Preset] | None = None,
) -> None:
    """Register everything the distillation method ``name`` declares, in one call, the one way
    a method enters the registries that every consumer reads (the CLI, the app, the tuner, the
    suite, the tests): its settings dataclass (:func:`~kd.methods.config.check_settings`), the
    teacher fields and loss terms by name, how its settings resolve for the models
    (:class:`Method`, over some of ``terms``), its set-up of the student, the parameters ``kdw
    tune`` searches and its presets, in their order. A name registered already is refused in
    one line naming both places, before anything is registered; a method over terms the call
    does not register, in one line."""
    parts = [
        (TEACHER_FIELDS, teacher_fields or {}),
        (TERMS, terms or {}),
        (STUDENT_SETUPS, {name: setup} if setup is not None else {}),
        (PARAMETERS, parameters or {}),
        (PRESETS, presets or {}),
    ]
    if settings is not None:  # every name checked before any is registered
        check_settings(name, settings)
    for registry, entries in parts:
        for key in entries:
            registry.check_new(key)
    if method is not None:
        if stray := sorted(method.terms - set(terms or {})):
            raise WorkbenchError(
                f"method {name!r}: its method resolves {listed(map(repr, stray))}, which it does "
                "not register among its terms"
            )
        METHODS.add("+".join(t for t in terms or {} if t in method.terms), method)
    if settings is not None:
        METHOD_SETTINGS.add(name, settings)
    for registry, entries in parts:
        for key, entry in entries.items():
            registry.add(key, entry)


def weight_parameter(help: str, *terms: str) -> Parameter:
    """A parameter that is the weight of ``terms`` (each set to its value)."""
    return Parameter(
        help,
        0.0,
        needs=terms,
        apply=lambda config, value: replace(
            config, weights=config.weights | dict.fromkeys(terms, value)
        ),
        read=lambda config: preset_weights(config).get(terms[0]),
    )


def setting_parameter(help: str, settings: type, name: str, *needs: str, low: int = 0) -> Parameter:
    """A parameter that is the integer setting ``name`` of a method's settings dataclass
    ``settings``, from ``low``; it applies where the objective has the terms ``needs``."""
    return Parameter(
        help,
        low,
        integer=True,
        needs=needs,
        apply=lambda config, value: config.with_settings(**{name: int(value)}),
        read=lambda config: getattr(config.of(settings), name),
    )


def check_terms(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` (``{"ce": 0.1, "kd": 0.9}``) when each names a registered term; else a
    one-line error."""
    for name in weights:
        if name not in TERMS:
            raise WorkbenchError(f"unknown loss term {name!r}: known terms {sorted(TERMS)}")
    return weights


def preset_weights(config: ObjectiveConfig) -> dict[str, float]:
    """The term weights a config asks for: its explicit ``weights``, else its preset's for its
    parity; zero weights dropped."""
    if config.preset not in PRESETS:
        raise WorkbenchError(
            f"unknown method preset {config.preset!r}: use one of {sorted(PRESETS)}"
        )
    preset = PRESETS[config.preset]
    table = preset.official if config.parity == "official" else preset.paper
    weights = {name: w for name, w in (check_terms(config.weights) or table).items() if w != 0}
    if not weights:
        raise WorkbenchError("the objective has no term with a non-zero weight")
    return weights


def display_name(preset: str) -> str:
    """A preset's display name (``"adkd"`` → ``"AD-KD"``); the key itself when it has none."""
    return PRESETS[preset].name if preset in PRESETS and PRESETS[preset].name else preset


def ablated(config: ObjectiveConfig, ablation: Ablation) -> ObjectiveConfig:
    """``config`` (a preset's) changed as ``ablation`` says: its settings replaced, and the
    weights it resolves to (:func:`preset_weights`) with the ablation's weights set in them,
    zero weights dropped, written out explicitly."""
    config = config.with_settings(**ablation.settings)
    if not ablation.weights:
        return config
    weights = preset_weights(config) | ablation.weights
    return replace(config, weights={n: w for n, w in weights.items() if w != 0})


def _title(key: str, preset: Preset, dash: str) -> str:
    """``adkd: AD-KD (Wu et al. 2023)`` with ``dash=": "``."""
    reference = f" ({preset.reference})" if preset.reference else ""
    return key + (dash + preset.name if preset.name else "") + reference


def _temperatures() -> str:
    default = Preset.temperature
    others = {k: p.temperature for k, p in PRESETS.items() if p.temperature != default}
    return ", ".join([f"{default:g}", *(f"{display_name(k)} {t:g}" for k, t in others.items())])


def _ablation_list() -> str:
    def names(preset: Preset) -> str:
        return ", ".join(a.label if isinstance(a, Sweep) else a.name for a in preset.ablations)

    return "; ".join(
        f"{display_name(key)}: {names(p)}" for key, p in PRESETS.items() if p.ablations
    )


def describe_presets() -> str:
    """Every registered preset as its module declares it, then the terms (``kdw methods``)."""

    def variant(entry: Ablation | Sweep) -> str:
        if isinstance(entry, Sweep):
            return f"{entry.label} (a sweep of {entry.setting})"
        changes = [spell_weights(entry.weights)] if entry.weights else []
        changes += [f"{n}={spell(ObjectiveConfig, n, v)}" for n, v in entry.settings.items()]
        return f"{entry.name} ({', '.join(changes)})"

    def claim(entry: Claim) -> str:
        if entry.relation == "lowest":
            return f"{entry.metric} the lowest of all students"
        return f"{entry.metric} {entry.relation} {display_name(entry.than)}'s"

    lines = []
    for key, p in PRESETS.items():
        lines.append(_title(key, p, " — "))
        lines.append(
            f"  weights: paper {spell_weights(p.paper)}; official {spell_weights(p.official)}; "
            f"τ {p.temperature:g}" + (f"; own terms {', '.join(p.own)}" if p.own else "")
        )
        if p.space:
            lines.append(
                "  kdw tune space: "
                + " ".join(f"{name}={spec}" for name, spec in p.space.items())
                + (f" (β weighs {p.beta})" if p.beta else "")
                + (f"; chosen on dev by kdw reproduce: {', '.join(p.tuned)}" if p.tuned else "")
            )
        if p.ablations:
            lines.append("  ablations: " + "; ".join(variant(a) for a in p.ablations))
        if p.claims:
            lines.append("  claims: " + "; ".join(claim(c) for c in p.claims))
    lines.append(f"terms: {', '.join(TERMS)}")
    lines.append(f"across tokenizers, on the words both share: {_word_forms()}")
    return "\n".join(lines)


def _word_forms() -> str:
    """How each per-token term compares on words across tokenizers (its ``on_words``)."""
    return "; ".join(f"{name}: {t.on_words}" for name, t in TERMS.items() if t.on_words)


# the lists that help texts name ({presets}, {terms}, …), read when a help text is shown
HELP_LISTS.update(
    presets=lambda: "; ".join(_title(key, p, ": ") for key, p in PRESETS.items()),
    terms=lambda: ", ".join(TERMS),
    temperatures=_temperatures,
    ablations=_ablation_list,
    words=_word_forms,
    parameters=lambda: ", ".join(PARAMETERS),
)

PARAMETERS.add(  # every preset's: the weight of its own term
    "beta",
    Parameter(
        "weight β of the method's own term (the one its preset names: AD-KD's attr, GKD's grad)",
        0.0,
        apply=lambda config, value: replace(
            config, weights=config.weights | {PRESETS[config.preset].beta: value}
        ),
        read=lambda config: preset_weights(config).get(PRESETS[config.preset].beta or ""),
    ),
)


def teacher_terms(weights: Mapping[str, float]) -> list[str]:
    """The terms of ``weights`` that read a teacher field."""
    return [name for name in weights if TERMS[name].teacher_fields]


def control(config: ObjectiveConfig) -> ObjectiveConfig:
    """The control of a method's objective: the same config (other weights, τ, KD form, each
    :class:`StudentSetup` pinned) with its own terms (:attr:`Preset.own`) at weight 0; vanilla KD,
    without own terms, is its own control."""
    own = set(PRESETS[config.preset].own) if config.preset in PRESETS else set()
    weights = preset_weights(config)
    if not own & set(weights):
        return config
    for setup in STUDENT_SETUPS.values():
        config = setup.pin(config, weights)
    return replace(
        config, weights={name: 0.0 if name in own else weight for name, weight in weights.items()}
    )


@dataclass
class Objective:
    """A resolved objective: the weights, the logit-KD settings every method shares, the
    settings of the methods in use as resolved (``resolved``, by settings dataclass: read them
    with :meth:`of`) and the trainable modules their terms own (``modules``).
    ``words``: teacher and student read the text through different tokenizers, and the
    per-token terms compare on the words they share."""

    config: ObjectiveConfig
    weights: dict[str, float]
    teacher_layers: int
    student_layers: int
    num_labels: int = 2
    teacher_width: int | None = None
    student_width: int | None = None
    words: bool = False
    temperature: float = 4.0
    kd_form: str = "kl"
    resolved: dict[type, Any] = field(default_factory=dict)
    modules: torch.nn.ModuleDict = field(default_factory=lambda: torch.nn.ModuleDict())

    @classmethod
    def resolve(
        cls,
        config: ObjectiveConfig,
        teacher_layers: int,
        student_layers: int,
        num_labels: int = 2,
        teacher_width: int | None = None,
        *,
        student_width: int | None = None,
        words: bool = False,
    ) -> Objective:
        """The objective ``config`` asks for between a teacher and a student of these layer
        counts and hidden sizes (the student's defaults to the teacher's), for ``num_labels``
        classes, across tokenizers when ``words``. Each method checks the models here (before a
        command writes) and builds its modules (from the global random state)."""
        weights = preset_weights(config)
        preset = PRESETS[config.preset]
        official = config.parity == "official"
        unset = {name: value for name, value in preset.defaults.items() if config.get(name) is None}
        config = config.with_settings(**unset, **preset.settings)
        objective = cls(
            config=config,
            weights=weights,
            teacher_layers=teacher_layers,
            student_layers=student_layers,
            num_labels=num_labels,
            teacher_width=teacher_width,
            student_width=student_width or teacher_width,
            words=words,
            temperature=config.temperature or preset.temperature,
            kd_form=config.kd_form or (preset.official_kd_form if official else "kl"),
        )
        for entry in objective.methods():
            if (settings := entry.resolve(objective)) is not None:
                objective.resolved[type(settings)] = settings
            if entry.modules is not None:
                objective.modules.update(entry.modules(objective))
        return objective

    def of(self, cls: type[T]) -> T:
        """The settings of the method whose settings dataclass is ``cls``: as its ``resolve``
        gave them where the method is in use, else as the config holds them."""
        return self.resolved.get(cls) or self.config.of(cls)

    def methods(self) -> list[Method]:
        """The registered methods with a weighted term."""
        return [entry for entry in METHODS.values() if entry.terms & set(self.weights)]

    def record(self) -> dict:
        """What the configs resolved to, as plain data for ``run.json``: every weight, τ, the
        KD form, and the settings of the methods in use (layer pairs, views, reductions)."""
        record: dict = {
            "weights": self.weights,
            "temperature": self.temperature,
            "kd_form": self.kd_form,
            "parity": self.config.parity,
        }
        for part in (*self.student_setups(), *self.methods()):
            record.update(part.record(self))
        return json.loads(json.dumps(record))  # tuples as lists, as run.json reads back

    def student_setups(self) -> list[StudentSetup]:
        """The registered set-ups of the student this objective asks for."""
        return [setup for setup in STUDENT_SETUPS.values() if setup.active(self)]

    def prepare_student(self, teacher: PreTrainedModel, student: PreTrainedModel) -> None:
        """Set the student up as the methods in use ask, before training (:class:`StudentSetup`)."""
        for setup in self.student_setups():
            setup.prepare(self, teacher, student)

    def term_units(self) -> dict[str, str]:
        """What each weighted term's value is a mean over (a :class:`Term`'s ``unit``)."""
        units = {name: TERMS[name].unit for name in self.weights}
        return {name: unit if isinstance(unit, str) else unit(self) for name, unit in units.items()}

    def teacher_terms(self) -> list[str]:
        """The weighted terms that read a teacher field (none: the student learns alone)."""
        return teacher_terms(self.weights)

    def _labels(self) -> dict[str, str]:
        uses = {name: TERMS[name].labels for name in self.weights}
        uses = {n: use if isinstance(use, str) else use(self) for n, use in uses.items()}
        return {name: use for name, use in uses.items() if use}

    def label_terms(self) -> list[str]:
        """The weighted terms that average over the labelled examples only (:class:`Term`)."""
        return [name for name, use in self._labels().items() if use == LABELLED]

    def label_refusals(self) -> dict[str, str]:
        """The weighted terms that need every example's gold label, each with why."""
        return {name: use for name, use in self._labels().items() if use != LABELLED}

    def teacher_fields(self) -> list[str]:
        """Teacher fields the active terms read, ``logits`` always (loyalty uses them)."""
        fields = [f for name in self.weights for f in TERMS[name].teacher_fields]
        return list(dict.fromkeys(["logits", *fields]))

    def cached_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if TEACHER_FIELDS[n].cacheable]

    def live_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if not TEACHER_FIELDS[n].cacheable]

    def per_token_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if TEACHER_FIELDS[n].per_token]

    def per_token_terms(self) -> list[str]:
        """The weighted terms that read a per-token teacher field (compare token by token)."""
        return [
            name
            for name in self.weights
            if any(TEACHER_FIELDS[f].per_token for f in TERMS[name].teacher_fields)
        ]

    def token_only_terms(self) -> list[str]:
        """The per-token terms that cannot compare on words (they need the same tokens)."""
        return [name for name in self.per_token_terms() if not TERMS[name].on_words]

    def word_aggregation(self) -> dict[str, str]:
        """How each per-token term compares on words across tokenizers (the run records it)."""
        return {name: TERMS[name].on_words for name in self.per_token_terms()}

    def teacher_gradients(self, fields: list[str]) -> bool:
        """Whether any of the given teacher fields takes gradients through the teacher."""
        return any(TEACHER_FIELDS[name].gradients for name in fields)

    def teacher_settings(self, fields: list[str]) -> dict:
        """Every setting that changes the given teacher fields (part of the cache key)."""
        settings: dict = {"fields": fields}
        for name in fields:
            if TEACHER_FIELDS[name].key is not None:
                settings.update(TEACHER_FIELDS[name].key(self))
        return settings

    def teacher_batch(
        self, teacher: PreTrainedModel, batch: dict[str, Tensor], fields: list[str] | None = None
    ) -> dict[str, Tensor]:
        """Teacher fields of a batch (all the objective reads by default)."""
        return {
            name: TEACHER_FIELDS[name].compute(self, teacher, batch)
            for name in fields or self.teacher_fields()
        }

    def __call__(
        self, model: PreTrainedModel, batch: dict[str, Tensor], teacher: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Each weighted term's value and their sum under ``"loss"``."""
        inputs = StepInputs(
            model, batch, teacher, any(TERMS[n].hidden_states for n in self.weights)
        )
        first = sorted(self.weights, key=lambda name: not TERMS[name].runs_student)
        values = {name: TERMS[name].compute(self, inputs) for name in first}
        values = {name: values[name] for name in self.weights}
        values["loss"] = torch.stack([self.weights[n] * v for n, v in values.items()]).sum()
        return values

"""The suite's record, ``<out>/results.json``, declared as typed models
(:mod:`workbench.core.records`) and checked when it is read (:func:`read_results`): written by
the runner and the merge, read by them and by the report, by attribute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from workbench.core.records import Record, read_record_file

Number = int | float  # a JSON number as written: an integer stays an integer
Metrics = dict[str, Number | None]  # metric name → value (None: undefined)


class Setup(Record):
    """The sizes of a task's plan that the report states."""

    teacher: str
    max_train_examples: int | None
    student_train_examples: int | None = None
    max_eval_examples: int | None
    max_length: int
    teacher_epochs: Number
    student_layers: int
    student_epochs: Number
    seeds: list[int]
    explained_examples: int | None = None


class Truncation(Record):
    """How much of a task's test split ``max_length`` cuts."""

    max_length: int
    examples: int
    truncated_examples: int
    kept_tokens: Number
    median_tokens: Number


class ShardRecord(Record):
    index: int
    count: int


class TeacherRecord(Record):
    """A task's teacher: its identity (``key``), run folder, test metrics and weights' digest
    (none for a given classifier)."""

    key: str = ""
    run: str
    test: Metrics
    weights: str = ""


class Trial(Record):
    """A trial of a search: its dev score (None: pruned before one) and (other keys) its state
    and settings."""

    dev: Number | None


class Search(Record):
    """A method's weights chosen on dev: the search, its choice and its trials."""

    key: str = ""
    searched: list[str]
    space: dict[str, str]
    metric: str
    chosen: dict[str, Number]
    dev: Number
    objective: dict[str, Any]
    trials: list[Trial]


class Sample(Record):
    """A test set's example ids and labels (class ids as a string of digits)."""

    uids: list[Any]
    labels: str | list[Any]


class Examples(Record):
    """A student's per-example values: its test sample, its predictions and (other keys) each
    measure's values by metric name."""

    test_set: str
    predictions: str | list[Any]


class StudentRow(Record):
    """A finished student: its identity (``key``), experiment, run folder, its teacher's
    weights (null: a given classifier; absent: not recorded), test metrics, per-example values
    and seconds."""

    key: str = ""
    task: str
    name: str
    group: str
    seed: int
    run: str
    teacher: str | None = None
    test: Metrics
    examples: Examples | None = None
    seconds: Number = 0


class SpeedSettings(Record):
    examples: int
    batch_sizes: list[int]
    warmup: int
    repeats: int
    threads: int


class Machine(Record):
    """Where a timing ran (:func:`~workbench.core.machine.machine`): the processor, its
    instruction sets, cores, threads, load and library versions; ``cuda``, the GPU's name."""

    processor: str
    versions: dict[str, str]
    instructions: list[str] = Field(default_factory=list)
    cuda: str | None = None


class SpeedRow(Record):
    """A model timed: its size and speed, and (other keys) each one's ratio to the teacher's."""

    name: str
    parameters: Number | None = None
    disk_mb: Number | None = None
    latency_ms_median: Number | None = None
    throughput_b32: Number | None = None


class Speed(Record):
    """A task's first-seed students timed beside their teacher."""

    key: str
    settings: SpeedSettings
    machine: Machine
    load_before: Number
    seed: int | None = None
    rows: list[SpeedRow]


class Call(Record):
    """A call's wall clock and what it trained."""

    started: str
    seconds: Number
    searches: int
    teachers: int
    students: int
    jobs: int
    load_before: Number


class SuiteRecord(Record):
    """``results.json``: the suite, what it cut, each task's setup and truncation, what ties the
    record to its suite, the teachers, the weights chosen on dev, the test samples, every
    student, the timings and every call's wall clock."""

    record_format: int
    suite: str
    cuts: str | None = None
    ablation_data: str | None = None
    setup: dict[str, Setup] = Field(default_factory=dict)
    truncation: dict[str, Truncation | None] = Field(default_factory=dict)
    tuned: bool = False  # absent: whether any weights were chosen
    suite_key: str = ""
    shard: ShardRecord | None = None
    teachers: dict[str, TeacherRecord]
    tuning: dict[str, Search] = Field(default_factory=dict)
    planned_students: int | None = None
    test_sets: dict[str, Sample] = Field(default_factory=dict)
    students: list[StudentRow]
    speed: dict[str, Speed] = Field(default_factory=dict)
    calls: list[Call] = Field(default_factory=list)


RESULTS_REMEDY = (
    "restore it (the run folders beside it are kept), or delete it to train the suite's "
    "missing rows again (finished run folders are reused)"
)


def read_results(out: Path) -> SuiteRecord | None:
    """``<out>/results.json``, checked (:class:`SuiteRecord`), or None where there is none yet;
    a file that is not JSON or not of the record's shape is a one-line error naming it."""
    path = out / "results.json"
    if not path.exists():
        return None
    what, again = "the record of a suite", "run the suite again in a new --out"
    return read_record_file(path, SuiteRecord, what, RESULTS_REMEDY, "the suite's results", again)

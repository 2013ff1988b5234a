"""``kdw reproduce --merge``: the records of a suite's shards (``--shard I/N``, one folder each)
joined into one ``results.json``.

Each shard's record must be of the suite the call's options name (its ``suite_key``). Records are
joined by their keys: the same key recorded alike twice is kept once, recorded differently it is a
conflict that refuses the merge. Run folders are not copied: the merged paths point into the shards'
folders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kd.experiments.reproduce.record import SuiteRecord, read_results
from kd.experiments.reproduce.runner import relative, suite_fields
from kd.experiments.reproduce.suite import Suite, experiments, identity, suite_key
from kd.methods.config import ObjectiveConfig
from workbench.core.config import from_dict
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_json
from workbench.core.records import Record

_SHOWN_MISSING = 10  # missing students named one by one; the rest counted


def _rebased(record: Record, folder: Path, out: Path) -> Record:
    """A record with its run path (relative to its shard ``folder``) relative to the merged
    ``out``; an absolute one (a given teacher) as it is."""
    if Path(record.run).is_absolute():
        return record
    return record.model_copy(update={"run": relative(folder / record.run, out)})


class _Joined:
    """Records of one kind (teachers, searches, test sets, students) joined by key: the first
    kept, a later one that differs in other fields than ``ignored`` a conflict."""

    def __init__(self, kind: str, *ignored: str) -> None:
        self.kind, self.ignored = kind, set(ignored)
        self.records: dict[str, Record] = {}
        self.sources: dict[str, Path] = {}

    def _compared(self, record: Record) -> dict:
        return record.model_dump(exclude_unset=True, exclude=self.ignored)

    def add(self, records: Iterable[tuple[str, Record]], folder: Path) -> None:
        for key, record in records:
            if key not in self.records:
                self.records[key], self.sources[key] = record, folder
            elif self._compared(self.records[key]) != self._compared(record):
                raise WorkbenchError(
                    f"conflict: {self.kind} {key} differs between {self.sources[key]} and "
                    f"{folder}, nothing merged (shards train alike with the same options, "
                    "software and hardware)"
                )


def merge_results(
    out: Path, folders: Sequence[Path], suite: Suite, announce: Callable[[str], None] = print
) -> SuiteRecord:
    """Join the records in ``folders`` (shards of ``suite``) into ``<out>/results.json``, announcing
    the experiments no shard recorded. A folder without a record, a record of another suite, a
    conflict are one-line errors, before anything is written."""
    folders = list(dict.fromkeys(Path(f).resolve() for f in folders))
    out = Path(out).resolve()
    if out in folders:
        raise WorkbenchError(f"--out {out} is one of the merged folders: merge into another")
    key = suite_key(suite)
    records = {}
    for folder in folders:
        record = read_results(folder)
        if record is None:
            raise WorkbenchError(f"{folder / 'results.json'} does not exist: nothing to merge")
        if record.suite_key != key:
            raise WorkbenchError(
                f"{folder / 'results.json'} is the record of another suite (suite key "
                f"{record.suite_key or 'none'}, these options' is {key}): merge the shards "
                "of one suite with the options they ran with"
            )
        records[folder] = record

    teachers = _Joined("the teacher of", "run")
    tuning = _Joined("the weights chosen on dev for", "trials")
    test_sets = _Joined("the test set")
    students = _Joined("the student", "run", "seconds")
    truncation: dict = {}
    speed: dict = {}  # a task's students timed by a shard that trained them all
    calls: list = []
    for folder, record in records.items():
        teachers.add(((t, _rebased(r, folder, out)) for t, r in record.teachers.items()), folder)
        tuning.add(record.tuning.items(), folder)
        test_sets.add(record.test_sets.items(), folder)
        students.add(((r.key or r.run, _rebased(r, folder, out)) for r in record.students), folder)
        truncation = record.truncation | truncation  # the first shard's, by task
        speed = record.speed | speed
        calls += record.calls

    chosen = {m: from_dict(ObjectiveConfig, r.objective) for m, r in tuning.records.items()}
    planned = [
        (identity(e, suite.plan_of(e), suite.plans[e.task]), e) for e in experiments(suite, chosen)
    ]
    rows = [students.records[k] for k, _ in planned if k in students.records]
    rows += [r for k, r in students.records.items() if k not in dict(planned)]  # --ablations
    missing = [e for k, e in planned if k not in students.records]
    if missing:
        named = [f"{e.task}/{e.group}/{e.name}/seed{e.seed}" for e in missing[:_SHOWN_MISSING]]
        more = len(missing) - len(named)
        announce(
            f"missing {len(missing)} of the {len(planned)} students (train their shards): "
            + ", ".join(named)
            + (f" and {more} more" if more else "")
        )
    merged = SuiteRecord(
        **suite_fields(suite, truncation, None),
        teachers={t: teachers.records[t] for t in suite.plans if t in teachers.records},
        tuning={m: tuning.records[m] for m in suite.tuned if m in tuning.records},
        planned_students=len(planned),
        test_sets=test_sets.records,
        speed={task: speed[task] for task in suite.plans if task in speed},
        students=rows,
        calls=calls,  # every shard's calls: their sum is the suite's machine time
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", merged.plain())
    announce(f"merged {len(rows)} students from {len(records)} folders into {out / 'results.json'}")
    return merged

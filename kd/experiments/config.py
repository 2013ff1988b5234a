"""The settings of ``kdw tune``'s search (:class:`TuneConfig`, read by
:mod:`kd.experiments.tune`), apart from it because the search loads torch and ``kdw``'s parser
must not."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.config import Checked, Domain, option, positive


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

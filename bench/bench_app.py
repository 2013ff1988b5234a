"""The app's case-study refresh: a 30-token sentence explained by the teacher and two students
(IG with m = 1 over all views, Grad saliency, agreement with the teacher) and rendered as the
heatmap table — what ``workbench/app/case_study.py`` computes once models are loaded.

    python -m bench.bench_app            # demo runs if built (runs/demo), 7 rounds, 1 thread
    python -m bench.bench_app --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.common import setup, write_results
from workbench.analysis.attribution import ExplainerChoice
from workbench.analysis.examples import Example
from workbench.analysis.explanation_agreement import agreement
from workbench.analysis.explanations import HeatmapSettings, explain
from workbench.analysis.heatmap_export import explained_settings, to_heatmap
from workbench.app.heatmap_view import heatmap_html
from workbench.core.models import load_run

SENTENCE = (
    "honestly the new self driving cars look amazing but i would never trust one "
    "with my kids on a rainy night in the old city center downtown today"
)
DEMO = Path("runs/demo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app uses 1)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    setup(args.threads)
    students = sorted(p for p in DEMO.glob("student-*") if (p / "model").exists())[:2]
    if not (DEMO / "teacher" / "model").exists() or len(students) < 2:
        raise SystemExit("build the demo first (kdw demo, or launch the app once)")
    models = [load_run(path) for path in (DEMO / "teacher", *students)]
    example = Example(SENTENCE)
    settings, ig = HeatmapSettings(view="all"), ExplainerChoice("ig", {"steps": 1})
    tokens = len(models[0].tokenizer(SENTENCE)["input_ids"])

    def refresh() -> str:
        explanations = [explain(m, [example], m.run.name, ig)[0] for m in models]
        teacher, *rest = explanations
        notes = {s.name: str(agreement(teacher, s, settings.view)) for s in rest}
        explained = explained_settings(ig, None)
        return heatmap_html(to_heatmap(explanations, example, settings, explained=explained), notes)

    refresh()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        refresh()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"{tokens} tokens, teacher + {', '.join(p.name for p in students)}, "
        f"{args.threads} thread(s): median {median * 1000:.0f} ms, "
        f"max {max(times) * 1000:.0f} ms over {args.repeats} refreshes"
    )
    write_results(
        "app",
        {
            "tokens": tokens,
            "threads": args.threads,
            "median_s": median,
            "max_s": max(times),
            "models": [m.run.name for m in models],
        },
    )


if __name__ == "__main__":
    main()

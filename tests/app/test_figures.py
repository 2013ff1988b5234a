"""The app's Plotly figure builders (workbench/app/figures.py), checked for their data: values
against independent computations, hover labels naming the exact values, one colour scale for
teacher and student, escaped text, and what a click on the loyalty scatter returns."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.analysis.relation_geometry import (
    dense_angles,
    pairwise_distance_relation,
    windowed_angle_relation,
)
from workbench.app.figures import (
    curves,
    layer_mapping_figure,
    loyalty_histograms,
    loyalty_scatter,
    number,
    relation_heatmaps,
    trials_figure,
)

HOSTILE = "<b>x</b>"


def test_distance_heatmaps_show_the_values_on_one_scale():
    torch.manual_seed(0)
    teacher, student = torch.randn(5, 8), 3 * torch.randn(5, 4)
    labels = ["0:[CLS]", "1:good", f"2:{HOSTILE}", "3:film", "4:[SEP]"]
    matrices = [
        (pairwise_distance_relation(h[None], kind="l2")[0][0], labels, title)
        for h, title in ((teacher, "teacher layer 4"), (student, "student layer 2"))
    ]
    fig = relation_heatmaps(matrices, "token", "Oranges")
    heatmaps = [trace for trace in fig.data if trace.type == "heatmap"]
    assert len(heatmaps) == 2
    for trace, h in zip(heatmaps, (teacher, student), strict=True):
        expected = torch.cdist(h.double(), h.double()).fill_diagonal_(0)
        np.testing.assert_allclose(np.array(trace.z), expected.numpy(), atol=1e-4)
        assert trace.coloraxis == "coloraxis"  # one scale, one colour bar
        i, j = 1, 3
        assert trace.hovertext[i][j] == f"token 1:good × token 3:film: {number(trace.z[i][j])}"
        assert "&lt;b&gt;" in trace.hovertext[2][0] and "<b>" not in trace.hovertext[2][0]
        assert "<b>" not in "".join(trace.x)
    both = torch.cat([m.flatten() for m, _, _ in matrices])
    assert fig.layout.coloraxis.cmin == pytest.approx(float(both.min()))
    assert fig.layout.coloraxis.cmax == pytest.approx(float(both.max()))
    assert float(both.max()) == pytest.approx(float(torch.cdist(student, student).max()), 1e-4)


def test_angle_heatmaps_keep_the_given_range_and_name_blank_cells():
    torch.manual_seed(1)
    h = torch.randn(1, 7, 6)
    banded, valid = windowed_angle_relation(h)
    angles = dense_angles(banded[0], valid[0], 2)
    labels = [str(i) for i in range(7)]
    fig = relation_heatmaps(
        [(angles, labels, "teacher"), (angles, labels, "student")],
        "token",
        "PuOr_r",
        zrange=(-1.0, 1.0),
        blank="(outside the window)",
    )
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (-1.0, 1.0)
    trace = fig.data[0]
    blank = [(i, j) for i in range(7) for j in range(7) if math.isnan(angles[i, j])]
    shown = [(i, j) for i in range(7) for j in range(7) if not math.isnan(angles[i, j])]
    assert blank and shown
    for i, j in blank:
        assert trace.z[i][j] is None or math.isnan(trace.z[i][j])
        assert trace.hovertext[i][j].endswith("— (outside the window)")
    for i, j in shown:
        assert trace.hovertext[i][j].endswith(number(float(angles[i, j])))


def test_layer_mapping_draws_a_line_per_pair_and_the_chosen_one_bold():
    pairs = [(0, 0), (1, 2), (2, 4)]
    fig = layer_mapping_figure(pairs, teacher_layers=4, student_layers=2, chosen=(1, 2))
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [(list(t.x), list(t.y)) for t in lines] == [
        ([0, 1], [0, 0.0]),
        ([0, 1], [2, 2.0]),
        ([0, 1], [4, 4.0]),
    ]
    assert [t.line.width for t in lines] == [1, 3, 1]
    teacher, student = (t for t in fig.data if t.mode == "markers+text")
    assert list(teacher.text) == ["T0", "T1", "T2", "T3", "T4"]
    assert list(student.text) == ["S0", "S1", "S2"] and list(student.y) == [0, 2, 4]


@pytest.fixture
def loyalty_frame() -> pd.DataFrame:
    """A per-example loyalty table as :func:`workbench.analysis.loyalty.loyalty_tables` makes it,
    indexed by split positions."""
    return pd.DataFrame(
        {
            "text": ["good film", f"{HOSTILE} awful " + "very " * 60, "fine"],
            "gold": ["positive", "negative", "positive"],
            "teacher": ["positive", "negative", "negative"],
            "teacher ✓": [True, True, False],
            "kd": ["positive", "positive", "negative"],
            "kd ✓": [True, False, False],
            "kd PL": [0.9, 0.2, 0.55],
            "kd SL": [0.8, -0.1, float("nan")],
        },
        index=[7, 12, 40],
    )


def test_loyalty_scatter_points_carry_their_example(loyalty_frame):
    fig = loyalty_scatter(loyalty_frame, ["kd"])
    right, wrong = fig.data
    assert (right.name, wrong.name) == ("student right", "wrong")
    assert [c[0] for c in right.customdata] == [7] and list(right.x) == [0.9]
    assert [c[0] for c in wrong.customdata] == [12, 40] and list(wrong.x) == [0.2, 0.55]
    hover = wrong.hovertext[0]
    assert "&lt;b&gt;x&lt;/b&gt; awful" in hover and "<b>" not in hover
    assert "gold: negative" in hover and "teacher: negative" in hover and "kd: positive" in hover
    assert "PL 0.2 · SL -0.1" in hover
    assert "…" in hover and len(hover) < 400  # a long text is cut
    assert "SL —" in wrong.hovertext[1]  # NaN saliency loyalty


def test_loyalty_histograms_count_every_value(loyalty_frame):
    fig = loyalty_histograms(loyalty_frame, ["kd"])
    pl, sl = fig.data
    assert list(pl.x) == [0.9, 0.2, 0.55] and list(sl.x) == [0.8, -0.1]  # NaN left out
    assert pl.marker.color == sl.marker.color  # one colour per student
    assert fig.layout.barmode == "overlay"


def test_curves_and_trials():
    frame = pd.DataFrame(
        {"ce": [1.5, 1.0, 0.5], "kd": [0.3, float("nan"), 0.1]},
        index=pd.Index([10, 20, 30], name="step"),
    )
    fig = curves(frame, "step", "loss")
    ce, kd = fig.data
    assert list(ce.x) == [10, 20, 30] and list(ce.y) == [1.5, 1.0, 0.5]
    assert list(kd.x) == [10, 30] and kd.hovertext[1] == "step 30: kd 0.1"
    assert ce.yaxis == "y" and "yaxis2" not in fig.layout.to_plotly_json()
    frame["grad_norm"] = [40.0, 20.0, 10.0]  # tens against losses below 2: its own axis
    fig = curves(frame, "step", "loss", ("grad_norm",), "gradient norm")
    assert [trace.yaxis for trace in fig.data] == ["y", "y", "y2"]
    assert fig.layout.yaxis2.title.text == "gradient norm" and fig.layout.yaxis2.side == "right"

    trials = pd.DataFrame(
        {
            "trial": [0, 1, 2, 3],
            "state": ["complete", "pruned", "complete", "running"],
            "alpha": [0.5, 0.9, 0.7, 0.6],
            "dev": [0.61, 0.55, 0.72, float("nan")],
            "steps": [10, 4, 10, 2],
        }
    )
    fig = trials_figure(trials)
    complete, pruned, best = fig.data
    assert list(complete.x) == [0, 2] and list(pruned.x) == [1]
    assert "alpha = 0.7" in complete.hovertext[1] and "dev 0.72" in complete.hovertext[1]
    assert list(best.y) == [0.61, 0.61, 0.72]  # best so far, running trial left out


def test_a_student_above_its_teacher_is_said_once():
    import pandas as pd

    from workbench.app.loyalty import above_the_teacher

    table = pd.DataFrame({"accuracy": [0.52, 0.70, 0.40]}, index=["teacher", "alone", "kd"])
    (line,) = above_the_teacher(table, "teacher")
    assert line.startswith("alone scores 0.700 accuracy, above its teacher's 0.520")
    assert above_the_teacher(table.assign(accuracy=[0.8, 0.7, 0.4]), "teacher") == []

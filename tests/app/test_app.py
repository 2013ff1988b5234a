"""The Streamlit app, driven page by page with ``AppTest`` on tiny runs (a 4-layer teacher and two
2-layer students on a small local task); its first run is tested in ``test_first_run.py``."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from kd.experiments.config import TuneConfig
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PRESETS
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from tests.conftest import make_sentences, tiny_model, tiny_tokenizer
from workbench.analysis.attribution.registry import EXPLAINERS, ExplainerChoice
from workbench.analysis.examples import Example, split_examples
from workbench.analysis.explanations import explain
from workbench.analysis.faithfulness_report import explainer_faithfulness
from workbench.analysis.loyalty import loyalty_tables, saliency_loyalties, split_outputs
from workbench.analysis.settings import FaithfulnessSettings
from workbench.app import jobs
from workbench.app.catalog import discover_runs
from workbench.app.common import CASE_EXAMPLE
from workbench.app.heatmap_view import heatmap_html
from workbench.app.launch import ENTRY
from workbench.app.train import ALONE
from workbench.core.config import DataConfig, to_dict
from workbench.core.data import load_task, sample_split
from workbench.core.models import load_model
from workbench.export import Heatmap, HeatmapRow, color_scale, score_to_rgb

ROOT = Path(__file__).resolve().parents[2]
APP = str(ENTRY)
HOSTILE = r"<script>alert(1)</script> $\textbf{x}$ good"
STUDENTS = ("student-kd", "student-pkd")


def tiny_optim(epochs: float = 1) -> OptimConfig:
    return OptimConfig(epochs=epochs, batch_size=8, threads=1, learning_rate=1e-3)


def build_tiny_runs(root: Path, work: Path) -> Path:
    """A tiny teacher, KD and PKD students, a corrupt and a partial run folder under ``root``;
    returns the task folder."""
    model_dir, task_dir = work / "tiny-bert", work / "task"
    tiny_tokenizer(model_dir)
    tiny_model().bert.save_pretrained(model_dir)
    task_dir.mkdir(parents=True)
    frame = make_sentences(400)
    for name, part in (
        ("train", frame.iloc[:300]),
        ("dev", frame.iloc[300:350]),
        ("test", frame.iloc[350:]),
    ):
        part.to_csv(task_dir / f"{name}.csv", index=False)
    data = DataConfig(task=str(task_dir), max_length=16)
    teacher = train_teacher(
        data, TeacherConfig(model=str(model_dir)), tiny_optim(2), root / "teacher"
    )
    for name, preset in zip(STUDENTS, ("kd", "pkd-skip"), strict=True):
        distill(
            data,
            StudentConfig(teacher=str(teacher.path), num_layers=2),
            ObjectiveConfig(preset=preset),
            tiny_optim(),
            root / name,
        )
    (root / "corrupt").mkdir()
    (root / "corrupt" / "run.json").write_text("{ not json")
    partial = root / "partial"
    partial.mkdir()
    (partial / "run.json").write_text((root / "teacher" / "run.json").read_text())
    (partial / "status.json").write_text('{"state": "running", "step": 3}')
    return task_dir


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("app")
    build_tiny_runs(work / "runs", work)
    return work / "runs"


def app_on(root: Path, monkeypatch) -> AppTest:
    """The app on the runs root ``root``, without the demo build."""
    monkeypatch.setenv("KDW_RUNS", str(root))
    monkeypatch.setenv("KDW_DEMO", "off")
    return AppTest.from_file(APP, default_timeout=300)


@pytest.fixture
def app(tiny_runs, monkeypatch) -> AppTest:
    return app_on(tiny_runs, monkeypatch)


def _html(at: AppTest) -> str:
    return "".join(element.proto.body for element in at.get("html"))


def _charts(at: AppTest) -> dict[str, dict]:
    """The page's Plotly figures (as JSON) by their element key."""
    charts = {}
    for element in at.get("plotly_chart"):  # its id: $$ID-<hash>-<key>
        charts[element.proto.id.split("-", 2)[2]] = json.loads(element.proto.spec)
    return charts


def decoded(values: list | dict) -> np.ndarray:
    """A Plotly figure's array as JSON gives it: a list, or NumPy data in base64."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values)


def _ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_broken_run_folders_are_listed_with_their_problem(tiny_runs):
    entries = {e.name: e for e in discover_runs(tiny_runs)}
    assert {"teacher", *STUDENTS, "corrupt", "partial"} <= set(entries)
    assert "corrupt" in entries["corrupt"].problem
    assert "no trained model yet" in entries["partial"].problem
    assert all(entries[name].usable for name in ("teacher", *STUDENTS))


def test_a_problem_with_a_run_ends_the_page_with_its_message():
    def page() -> None:
        from workbench.app import common
        from workbench.core.errors import WorkbenchError

        def render() -> None:
            raise WorkbenchError(r"runs/x: task.csv does not exist $\textbf{x}$")

        common.run_page(render)

    at = AppTest.from_function(page).run()
    assert not at.exception
    assert at.error[0].value == r"runs/x\: task\.csv does not exist \$\\textbf\{x\}\$"


# --------------------------------------------------------------------------- pages


def test_case_study_shows_every_model_on_one_scale(app):
    at = _ok(app.run())
    assert at.selectbox(key="case.teacher").value == "teacher"
    assert set(at.multiselect(key="case.students").value) == set(STUDENTS)
    html = _html(at)
    assert html.count('class="kdw-row"') == 3
    assert "SL " in html and "ρ " in html
    assert at.number_input(key="case.settings.ig.steps").value == 50  # IG for people: 50 steps
    assert html.count("gap ") == 3  # each model's completeness gap beside its row
    assert any("IG's completeness gap" in c.value for c in at.caption)
    probabilities = at.dataframe[0].value
    assert list(probabilities.index) == ["teacher", *STUDENTS]

    at.selectbox(key="case.settings.view").set_value("all")
    at.selectbox(key="case.settings.explainer").set_value("grad")
    _ok(at.run())
    assert _html(at).count('class="kdw-row"') == 9  # 3 models × 3 classes

    at.selectbox(key="case.settings.explainer").set_value("ig")
    _ok(at.run())  # ig's own settings shown again, as they were left
    assert at.number_input(key="case.settings.ig.steps").value == 50
    at.text_area(key="case.text").set_value(HOSTILE)
    at.number_input(key="case.settings.ig.steps").set_value(4)
    html = _html(_ok(at.run()))
    assert "<script>" not in html and "[UNK]" in html  # the tiny vocabulary has no "<"

    at.text_area(key="case.text").set_value("good " * 5000)  # 5,000 words
    warnings = [w.value.replace("\\", "") for w in _ok(at.run()).warning]  # Markdown escapes
    assert any(
        "teacher (WordPiece tokenizer) read the first" in w and "of the text's 5002 tokens" in w
        for w in warnings
    )


def test_an_example_handed_to_the_case_study_keeps_its_gold_label(app):
    at = _ok(app.run())
    at.session_state[CASE_EXAMPLE] = Example("good film", None, "positive", "test-7")
    _ok(at.run())
    assert "gold label: positive" in [t.value for t in at.text]
    at.text_area(key="case.text").set_value("good film, bad end")
    _ok(at.run())  # an edited text is the user's own: no gold label
    assert not any(t.value.startswith("gold label") for t in at.text)


def test_case_study_explains_with_any_registered_explainer_per_word(app, tiny_runs):
    at = _ok(app.run())
    options = at.selectbox(key="case.settings.explainer").options  # "Title (name)"
    assert [option.rsplit(" (", 1)[1][:-1] for option in options] == list(EXPLAINERS)
    at.selectbox(key="case.settings.explainer").set_value("occlusion")
    at.selectbox(key="case.settings.words").set_value("sum")
    at.text_area(key="case.text").set_value("good film bad end")
    _ok(at.run())
    at.number_input(key="case.settings.occlusion.window").set_value(2)
    html = _html(_ok(at.run()))
    teacher_row = html.split("<tr>")[1]  # the models' words in columns: a table row each
    shown = [float(v) for v in re.findall(r'data-score="([^"]+)"', teacher_row)]
    direct = explain(
        load_model(str(tiny_runs / "teacher")),
        [Example("good film bad end")],
        explainer=ExplainerChoice("occlusion", {"window": 2, "stride": 1}),
        words="sum",
    )[0]  # the same explainer called apart: the teacher's row holds its word scores
    assert shown == pytest.approx(direct.maps[direct.predicted], abs=1e-6)
    assert len(shown) == len(direct.tokens) == 6  # [CLS], four words, [SEP]


def test_heatmap_view_escapes_tokens_and_labels():
    rows = [
        HeatmapRow(
            "<b>teacher</b>", ["[CLS]", "<script>", "$x$"], [0.1, -0.5, 0.9], "positive 0.9"
        ),
        HeatmapRow("student", ["[CLS]", "<script>", "$x$"], [0.0, 0.2, 0.4]),
    ]
    html = heatmap_html(Heatmap(rows), {"student": "SL 0.50 · ρ 0.10"})
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>" not in html
    assert html.count('class="kdw-row"') == 2 and "SL 0.50" in html
    scale = color_scale([0.1, -0.5, 0.9, 0.0, 0.2, 0.4])
    assert "#{:02x}{:02x}{:02x}".format(*score_to_rgb(0.9, scale)) in html
    assert 'title="&lt;script&gt;: -0.5"' in html and 'title="[CLS]: 0.1"' in html


def test_heatmap_view_scales_each_row_on_its_own_when_asked():
    rows = [
        HeatmapRow("teacher", ["[CLS]", "good", "[SEP]"], [0.0, 0.01, 0.002]),
        HeatmapRow("student", ["[CLS]", "good", "[SEP]"], [0.0, 0.9, 0.3]),
    ]

    def fill(scores, scale):
        return "#{:02x}{:02x}{:02x}".format(*score_to_rgb(max(scores), scale))

    shared = heatmap_html(Heatmap(rows))
    assert fill([0.01], color_scale([0.0, 0.01, 0.002, 0.0, 0.9, 0.3])) in shared
    own = heatmap_html(Heatmap(rows), per_row=True)
    for row in rows:  # each row's largest score in the darkest colour of its own scale
        assert fill(row.scores, color_scale(row.scores)) in own
    assert fill([0.01], color_scale(rows[0].scores)) == fill([0.9], color_scale(rows[1].scores))
    assert "scale 0 to 0.01" in own and "each row on its own scale" in own


def test_case_study_filters_examples_of_a_split(app):
    at = _ok(app.run())
    at.radio(key="case.source").set_value("Pick from a split")
    _ok(at.run())
    at.selectbox(key="case.filter").set_value("low saliency loyalty")
    _ok(at.run())
    table = at.dataframe[0].value
    assert "lowest SL" in table.columns
    assert (table["lowest SL"] < at.slider(key="case.threshold").value).all()
    at.selectbox(key="case.filter").set_value("teacher and a student disagree")
    table = _ok(at.run()).dataframe[0].value
    assert (
        (table["student-kd"] != table["teacher"]) | (table["student-pkd"] != table["teacher"])
    ).all()


def test_geometry_page(app):
    at = _ok(app.run())
    at.switch_page("geometry.py")
    _ok(at.run())
    pairs = at.selectbox(key="geometry.pair")
    assert "S1 ← T2" in pairs.options  # PKD-Skip 4 → 2 layers
    charts = _charts(at)
    assert set(charts) == {f"geometry.{n}" for n in ("mapping", "distances", "angles", "layers")}
    teacher, student = charts["geometry.distances"]["data"]
    scale = charts["geometry.distances"]["layout"]["coloraxis"]
    values = [v for trace in (teacher, student) for row in trace["z"] for v in row]
    assert (scale["cmin"], scale["cmax"]) == (min(values), max(values))
    assert teacher["coloraxis"] == student["coloraxis"] == "coloraxis"
    assert teacher["x"][0] == "0:[CLS]" and teacher["hovertext"][0][1].startswith(
        "token 0:[CLS] × token 1:"
    )
    layers = charts["geometry.layers"]["data"]
    assert [len(trace["z"]) for trace in layers] == [5, 3]  # teacher and student layers + 1
    token = next(box for box in at.selectbox if box.label.startswith("Token"))
    token.set_value(3)
    _ok(at.run())
    at.text_area(key="geometry.text").set_value("good and bad")
    _ok(at.run())  # a new text's tokens, its second one chosen (not the old text's fourth)
    token = next(box for box in at.selectbox if box.label.startswith("Token"))
    assert (len(token.options), token.value) == (5, 1)
    assert "angles around token 1\\:good" in " ".join(h.value for h in at.subheader)
    at.selectbox(key="geometry.student").set_value("student-kd")
    at.selectbox(key="geometry.kind").set_value("Euclidean distance")
    _ok(at.run())
    assert "S0 ← T0" in at.selectbox(key="geometry.pair").options


def test_loyalty_page(app):
    at = _ok(app.run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    limit = next(field for field in at.number_input if field.key.startswith("loyalty.examples"))
    assert (limit.value, limit.max) == (50, 50)  # the 50-example test split, not 500
    assert at.subheader[0].value == "Scores on test (50 examples: the whole split)"
    summary = at.dataframe[0].value
    assert list(summary.index) == ["teacher", *STUDENTS]
    for column in ("accuracy", "macro_f1", "LL", "PL", "SL×100", "SL over"):
        assert summary[column].notna().all(), column  # the teacher's row too: against itself
    assert summary.loc["teacher", "SL over"] == "itself"
    assert 0 <= float(summary.loc["student-kd", "LL"]) <= 1
    above = [n for n in STUDENTS if summary.loc[n, "accuracy"] > summary.loc["teacher", "accuracy"]]
    warned = " ".join(w.value for w in at.warning)
    assert [n for n in STUDENTS if f"{n} scores" in warned] == above
    departures = at.dataframe[1].value
    assert departures["student-kd PL"].is_monotonic_increasing
    charts = _charts(at)
    assert set(charts) == {"loyalty.distributions", "loyalty.scatter"}
    points = charts["loyalty.scatter"]["data"]
    assert len(points) == 2 * len(STUDENTS)  # right and wrong, per student
    assert sum(len(trace["customdata"]) for trace in points[:2]) == len(departures)


def test_loyalty_rows_are_split_positions_on_a_sample(app, tiny_runs):
    """On a sample of a split, a row's index is the example's position in the split (what the
    Case study is handed)."""
    at = _ok(app.run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    limit = next(field for field in at.number_input if field.key.startswith("loyalty.examples"))
    limit.set_value(10)
    departures = _ok(at.run()).dataframe[1].value
    assert len(departures) == 10
    task = json.loads((tiny_runs / "teacher" / "run.json").read_text())["configs"]["data"]
    split = load_task(DataConfig(task=task["task"], max_length=16)).splits["test"]
    assert sorted(departures.index) != list(range(10))  # a sample, not the first ten
    for index, text in departures["text"].items():
        assert split.texts[index] == text
    scatter = _charts(at)["loyalty.scatter"]["data"]
    assert {c[0] for trace in scatter[:2] for c in trace["customdata"]} == set(departures.index)


def _loyalty_page_on_ten(app) -> AppTest:
    """The Loyalty page scored on a sample of 10 test examples."""
    at = _ok(app.run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    limit = next(field for field in at.number_input if field.key.startswith("loyalty.examples"))
    limit.set_value(10)
    return _ok(at.run())


def test_loyalty_page_scores_saliency_loyalty_per_word(app, tiny_runs):
    at = _loyalty_page_on_ten(app)
    at.selectbox(key="loyalty.settings.words").set_value("max-abs").run()
    _ok(at)
    caption = at.caption[0].value.replace("\\", "")  # Markdown escapes
    assert "by Grad saliency per word (max-abs of its sub-tokens)" in caption
    shown = at.dataframe[1].value
    teacher = load_model(str(tiny_runs / "teacher"))
    part = sample_split(load_task(teacher.data).splits["test"], 10, seed=0)
    student = load_model(str(tiny_runs / "student-kd"))
    direct = saliency_loyalties(
        split_outputs(teacher, part, words="max-abs"),
        split_outputs(student, part, words="max-abs"),
    )
    position = {uid: i for i, uid in enumerate(load_task(teacher.data).splits["test"].uids)}
    by_position = dict(zip([position[uid] for uid in part.uids], direct.tolist(), strict=True))
    np.testing.assert_allclose(
        shown["student-kd SL"], [by_position[i] for i in shown.index], atol=1e-6
    )


def test_loyalty_page_scores_saliency_loyalty_with_the_chosen_explainer(app, tiny_runs):
    at = _loyalty_page_on_ten(app)
    by_grad = at.dataframe[1].value
    at.selectbox(key="loyalty.settings.explainer").set_value("gxi").run()
    _ok(at)
    assert r"by Gradient × Input \(×100\)" in at.caption[0].value  # Markdown-escaped
    charts = _charts(at)
    for key in ("loyalty.distributions", "loyalty.scatter"):
        assert "SL by Gradient × Input" in charts[key]["layout"]["title"]["text"]
    shown = at.dataframe[1].value
    teacher = load_model(str(tiny_runs / "teacher"))
    part = sample_split(load_task(teacher.data).splits["test"], 10, seed=0)
    choice = ExplainerChoice("gxi")
    outputs = {
        name: split_outputs(load_model(str(tiny_runs / name)), part, explainer=choice)
        for name in STUDENTS
    }
    summary, direct = loyalty_tables(
        teacher.spec,
        split_examples(part, teacher.spec),
        split_outputs(teacher, part, explainer=choice),
        outputs,
    )
    position = {uid: i for i, uid in enumerate(load_task(teacher.data).splits["test"].uids)}
    direct.index = [position[uid] for uid in part.uids]
    column = "student-kd SL"  # the departures of the student chosen
    np.testing.assert_allclose(shown[column], direct.loc[shown.index, column], atol=1e-6)
    assert not np.allclose(shown[column], by_grad.loc[shown.index, column])
    for name in STUDENTS:  # the summary, rounded to 3 decimals
        assert float(at.dataframe[0].value.loc[name, "SL×100"]) == pytest.approx(
            summary.loc[name, "SL×100"], abs=1e-3
        )


def _expected_ranks(rows: list[dict], measure: str, higher: bool) -> list[int]:
    """1 + how many rows' intervals lie wholly on the better side of each row's."""
    low, high = f"{measure}_low", f"{measure}_high"
    if higher:
        return [1 + sum(o[low] > r[high] for o in rows) for r in rows]
    return [1 + sum(o[high] < r[low] for o in rows) for r in rows]


def test_explainer_ranking_from_a_report_file_with_ties(app, tiny_runs, tmp_path):
    settings = FaithfulnessSettings(examples=8, resamples=500)
    choices = [ExplainerChoice(n) for n in ("grad", "gxi", "ablation")]
    report = explainer_faithfulness([tiny_runs / "teacher"], settings, choices)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    at = _ok(app.run())
    at.switch_page("explainers.py")
    _ok(at.run())
    at.radio(key="explainers.source").set_value("a kdw faithfulness JSON file").run()
    at.text_input(key="explainers.path").set_value(str(tmp_path / "missing.json"))
    _ok(at.run())
    assert "no such file" in at.error[0].value
    at.text_input(key="explainers.path").set_value(str(path))
    _ok(at.run())
    table = at.dataframe[0].value.set_index("explainer")
    rows = report["rows"]
    for measure, higher in (("comprehensiveness", True), ("sufficiency", False)):
        expected = _expected_ranks(rows, measure, higher)
        ranks = dict(zip([r["explainer"] for r in rows], expected, strict=True))
        for row in rows:
            shown = table.loc[row["explainer"]]
            assert shown[measure] == pytest.approx(row[measure])
            assert shown[f"{measure} low"] == pytest.approx(row[f"{measure}_low"])
            assert shown[f"{measure} rank"] == ranks[row["explainer"]]
            tied = {  # overlapping intervals
                o["explainer"]
                for o in rows
                if o is not row
                and o[f"{measure}_low"] <= row[f"{measure}_high"]
                and row[f"{measure}_low"] <= o[f"{measure}_high"]
            }
            assert set(filter(None, shown[f"{measure} ties"].split(", "))) == tied
    assert list(table["comprehensiveness rank"]) == sorted(table["comprehensiveness rank"])
    figure = _charts(at)["explainers.chart"]
    bars = figure["data"][0]
    assert bars["x"] == list(table.index)
    assert decoded(bars["y"]) == pytest.approx(list(table["comprehensiveness"]))
    assert bars["error_y"]["arrayminus"] == pytest.approx(
        list(table["comprehensiveness"] - table["comprehensiveness low"])
    )
    assert "overlapping intervals tie" in figure["layout"]["title"]["text"]


# slow: a spawned job process ranks two explainers, then the library ranks grad here to compare
@pytest.mark.slow
def test_explainer_ranking_computed_in_the_background(app, tiny_runs):
    at = _ok(app.run())
    at.switch_page("explainers.py")
    _ok(at.run())
    assert "No ranking computed for this run yet" in at.info[0].value
    at.text_input(key="explainers.compute.explainers").set_value("grad,shap")
    at.button(key="explainers.launch").click()
    _ok(at.run())
    assert "unknown explainer 'shap'" in at.error[0].value
    at.text_input(key="explainers.compute.explainers").set_value("grad,occlusion")
    at.number_input(key="explainers.compute.examples").set_value(4)
    at.number_input(key="explainers.compute.resamples").set_value(100)
    at.button(key="explainers.launch").click()
    _ok(at.run())
    job = next(j for j in jobs.read_jobs(tiny_runs) if j.kind == "faithfulness")
    deadline = time.time() + 240
    while job.alive and time.time() < deadline:
        time.sleep(0.5)
    _ok(at.run())
    written = json.loads((job.folder / "report.json").read_text())
    assert [r["explainer"] for r in written["rows"]] == ["grad", "occlusion"], job.log_tail()
    table = at.dataframe[0].value.set_index("explainer")
    for row in written["rows"]:
        assert table.loc[row["explainer"], "comprehensiveness"] == pytest.approx(
            row["comprehensiveness"]
        )
    direct = explainer_faithfulness(
        [tiny_runs / "teacher"],
        FaithfulnessSettings(explainers="grad", examples=4, resamples=100),
        [ExplainerChoice("grad")],
    )  # the job's values are the library's
    assert written["rows"][0]["sufficiency"] == pytest.approx(
        direct["rows"][0]["sufficiency"], abs=1e-4
    )  # another process: float rounding differs


def test_the_app_draws_no_static_images():
    sources = [*(ROOT / "workbench" / "app").glob("*.py"), ROOT / "app.py"]
    for source in sources:
        text = source.read_text()
        assert "st.pyplot" not in text and "line_chart" not in text, source
        assert "matplotlib" not in text, source


@pytest.mark.parametrize("page", ["loyalty", "geometry", "train", "case_study"])
def test_a_run_folder_that_disappears_is_a_message(page, tiny_runs, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    shutil.copytree(tiny_runs, runs, ignore=shutil.ignore_patterns("ui-*", "stop-*", "search"))
    monkeypatch.setenv("KDW_RUNS", str(runs))
    monkeypatch.setenv("KDW_DEMO", "off")
    at = _ok(AppTest.from_file(APP, default_timeout=120).run())
    at.switch_page(f"{page}.py")
    _ok(at.run())
    if page == "train":
        at.selectbox(key="train.details").set_value("student-kd")
        _ok(at.run())
    shutil.rmtree(runs / "student-kd")
    _ok(at.run())
    shutil.rmtree(runs / "teacher")
    at = _ok(at.run())
    assert at.info or at.error


def test_export_page_writes_every_format_with_metadata(app):
    at = _ok(app.run())
    at.switch_page("exports.py")
    _ok(at.run())
    at.multiselect(key="export.models").set_value(["teacher", "student-kd"])
    at.text_area(key="export.text").set_value(f"good movie\n{HOSTILE}")
    at.number_input(key="export.files.dpi").set_value(100.0)
    _ok(at.run())
    at.button(key="export.go").click()
    _ok(at.run())
    archive = at.get("download_button")
    assert archive, "no download after Export"
    data = at.session_state["export.archive"][0]
    with zipfile.ZipFile(io.BytesIO(data)) as files:
        names = sorted(files.namelist())
        assert len(names) == 10  # 2 examples × 5 formats
        svg = files.read("heatmap-001.svg").decode()
        assert "student-kd" in svg and "settings.explainer" in svg
        assert "<script>" not in svg and "&lt;script&gt;" in svg
        latex = files.read("heatmap-001.tex").decode().splitlines()
        assert all(line.startswith("%") for line in latex if "textbf" in line)  # comments only


def test_export_page_anonymous_checkbox_names_roles_and_no_run(app, tiny_runs):
    at = _ok(app.run())
    at.switch_page("exports.py")
    _ok(at.run())
    at.multiselect(key="export.models").set_value(["teacher", "student-kd"])
    at.text_area(key="export.text").set_value("good movie")
    at.number_input(key="export.files.dpi").set_value(40.0)
    at.checkbox(key="export.files.anonymous").check()
    _ok(at.run())
    at.button(key="export.go").click()
    _ok(at.run())
    with zipfile.ZipFile(io.BytesIO(at.session_state["export.archive"][0])) as files:
        contents = {name: files.read(name) for name in files.namelist()}
    assert len(contents) == 5
    for name, data in contents.items():
        assert b"student-kd" not in data and str(tiny_runs).encode() not in data, name
    assert "student 1" in contents["heatmap-000.svg"].decode()


# slow: the app launches a real kdw training process and the test waits for it to finish
@pytest.mark.slow
def test_train_page_launches_a_training_and_lists_runs(app, tiny_runs):
    at = _ok(app.run())
    at.switch_page("train.py")
    _ok(at.run())
    table = at.dataframe[0].value
    problems = dict(zip(table["run"], table["problem"], strict=True))
    assert "corrupt" in problems["corrupt"] and "no trained model" in problems["partial"]
    objectives = dict(zip(table["run"], table["objective"], strict=True))
    assert objectives["student-kd"] == "ce 0.5 · kd 0.5, τ 4"  # from run.json's record

    task = json.loads((tiny_runs / "teacher" / "run.json").read_text())["configs"]["data"]["task"]
    model = json.loads((tiny_runs / "teacher" / "run.json").read_text())["configs"]["teacher"]
    assert at.text_input(key="train.name.teacher").value.startswith("teacher-")
    at.radio(key="train.kind").set_value("student")
    _ok(at.run())  # a student's run is named for one, not the teacher's form's name
    assert at.text_input(key="train.name.student").value.startswith("student-")
    at.radio(key="train.kind").set_value("teacher")
    _ok(at.run())
    at.text_input(key="train.name.teacher").set_value("ui-teacher")
    at.text_input(key="train.teacher.data.task").set_value(task)
    at.number_input(key="train.teacher.data.max_length").set_value(16)
    at.text_input(key="train.teacher.teacher.model").set_value(model["model"])
    at.number_input(key="train.teacher.optim.epochs").set_value(1.0)
    at.number_input(key="train.teacher.optim.batch_size").set_value(8)
    at.number_input(key="train.teacher.optim.threads").set_value(1)
    at.button(key="train.launch").click()
    _ok(at.run())
    run_dir = tiny_runs / "ui-teacher"
    job = jobs.job_for(tiny_runs, run_dir)
    assert job is not None
    state = at.dataframe[-1].value.set_index("run").loc["ui-teacher", "state"]
    assert state in ("preparing", "training")  # listed from its launch on
    deadline = time.time() + 180
    while job.alive and time.time() < deadline:
        time.sleep(1)
    assert not job.alive, job.log_tail()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished", job.log_tail()
    assert jobs.step_records(jobs.read_progress(run_dir))[-1]["step"] == 38
    _ok(at.run())
    table = at.dataframe[0].value
    assert table.set_index("run").loc["ui-teacher", "state"] == "finished"


# slow: the app launches a real training process, stops it and resumes it to the end
@pytest.mark.slow
def test_a_training_stops_and_resumes(tiny_runs):
    info = json.loads((tiny_runs / "teacher" / "run.json").read_text())
    optim = {**info["configs"]["optim"], "epochs": 3.0, "threads": 1}
    configs = info["configs"] | {"optim": optim}
    run_dir = tiny_runs / "stop-resume"
    job = jobs.launch_training(tiny_runs, run_dir, "teacher", configs)
    deadline = time.time() + 120
    while not jobs.read_progress(run_dir) and time.time() < deadline:
        time.sleep(0.2)
    jobs.request_stop(job)
    while job.alive and time.time() < deadline:
        time.sleep(0.2)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped", job.log_tail()
    assert status["step"] < status["total"]
    resumed = jobs.launch_training(tiny_runs, run_dir, "teacher", configs)
    assert not (run_dir / "STOP").exists()
    deadline = time.time() + 240
    while resumed.alive and time.time() < deadline:
        time.sleep(0.5)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished", (
        resumed.log_tail()
    )


def test_train_page_student_form_comes_from_the_configs(app, tiny_runs):
    at = _ok(app.run())
    at.switch_page("train.py")
    _ok(at.run())
    at.radio(key="train.kind").set_value("student")
    _ok(at.run())
    at.selectbox(key="train.teacher").set_value("teacher")
    _ok(at.run())
    assert set(PRESETS) <= set(at.selectbox(key="train.student.objective.preset").options)
    assert at.text_input(key="train.student.objective.weights").value == ""
    assert at.selectbox(key="train.student.student.teacher").value == str(tiny_runs / "teacher")
    task = json.loads((tiny_runs / "teacher" / "run.json").read_text())["configs"]["data"]
    assert at.text_input(key="train.student.data.teacher.task").value == task["task"]
    assert at.number_input(key="train.student.data.teacher.max_length").value == 16
    help_text = at.selectbox(key="train.student.student.init").help
    assert help_text == StudentConfig.__dataclass_fields__["init"].metadata["help"]
    assert at.text_input(key="train.student.student.transfer").value == ""  # a transfer set

    at.selectbox(key="train.teacher").set_value(ALONE)  # the student trained alone
    _ok(at.run())
    keys = {widget.key for widget in at.text_input} | {widget.key for widget in at.selectbox}
    fixed = ("objective.preset", "student.teacher", "student.init")  # finetune, none, pretrained
    assert not {f"train.student.{name}" for name in fixed} & keys
    assert "train.student.student.pretrained" in keys


# slow: a real kdw tune process trains two students of the tiny teacher
@pytest.mark.slow
def test_a_search_runs_in_the_background_and_shows_its_trials(app, tiny_runs):
    info = json.loads((tiny_runs / "teacher" / "run.json").read_text())
    configs = {
        "data": info["configs"]["data"],
        "student": to_dict(StudentConfig(teacher=str(tiny_runs / "teacher"), num_layers=2)),
        "objective": to_dict(ObjectiveConfig(preset="kd")),
        "optim": to_dict(OptimConfig(epochs=1, batch_size=8, threads=1, log_every=0)),
        "tune": to_dict(TuneConfig(trials=2, space=("alpha=0.5,0.9", "tau=1,2"))),
    }
    out = tiny_runs / "search"
    job = jobs.launch_training(tiny_runs, out, "tune", configs)
    deadline = time.time() + 300
    while job.alive and time.time() < deadline:
        time.sleep(1)
    assert (out / "best.json").exists(), job.log_tail()
    at = _ok(app.run())
    at.switch_page("train.py")
    _ok(at.run())
    trials = next(frame.value for frame in at.dataframe if "trial" in frame.value.columns)
    assert len(trials) == 2 and set(trials["state"]) == {"complete"}
    assert {"alpha", "tau", "dev"} <= set(trials.columns)
    runs = at.dataframe[-1].value
    assert "search" not in set(runs["run"])  # a study is not a broken run folder
    assert any("best configuration" in caption.value for caption in at.caption)
    figure = _charts(at)["train.trials"]["data"]
    assert [point for trace in figure[:-1] for point in trace["x"]] == [0, 1]
    assert sorted(y for trace in figure[:-1] for y in trace["y"]) == sorted(trials["dev"])


def test_train_page_draws_a_runs_objective_diagnostics(app):
    at = _ok(app.run())
    at.switch_page("train.py")
    _ok(at.run())
    at.selectbox(key="train.details").set_value("student-kd")
    _ok(at.run())
    captions = [caption.value for caption in at.caption]
    assert any(
        c.startswith("each term's share of the gradient: all at the first") for c in captions
    )
    assert "each term's weighted value (what dominates the loss)" in captions
    charts = _charts(at)
    assert {f"train.details.{n}" for n in ("dev", "value", "share")} <= set(charts)
    shares = charts["train.details.share"]["data"]
    by_term = {trace["name"]: dict(zip(trace["x"], trace["y"], strict=True)) for trace in shares}
    assert set(by_term) == {"ce", "kd"}
    both = set(by_term["ce"]) & set(by_term["kd"])  # the first and the last logged step
    assert len(both) >= 2
    for step in both:  # the two shares of the gradient
        assert by_term["ce"][step] + by_term["kd"][step] == pytest.approx(1.0, abs=1e-5)


def test_loyalty_on_a_split_of_one_example(tmp_path, monkeypatch):
    """A test split of one example: the loyalty page shows its one row, never a traceback."""
    model_dir, task_dir, root = tmp_path / "tiny-bert", tmp_path / "task", tmp_path / "runs"
    tiny_tokenizer(model_dir)
    tiny_model().bert.save_pretrained(model_dir)
    task_dir.mkdir()
    frame = make_sentences(40)
    for name, part in (
        ("train", frame.iloc[:36]),
        ("dev", frame.iloc[36:39]),
        ("test", frame[39:]),
    ):
        part.to_csv(task_dir / f"{name}.csv", index=False)
    data = DataConfig(task=str(task_dir), max_length=16)
    teacher = train_teacher(data, TeacherConfig(model=str(model_dir)), tiny_optim(), root / "t")
    distill(
        data,
        StudentConfig(teacher=str(teacher.path), num_layers=2),
        ObjectiveConfig(preset="kd"),
        tiny_optim(),
        root / "s",
    )
    monkeypatch.setenv("KDW_RUNS", str(root))
    monkeypatch.setenv("KDW_DEMO", "off")
    at = _ok(AppTest.from_file(APP, default_timeout=120).run())
    at.switch_page("loyalty.py")
    at = _ok(at.run())
    assert len(at.dataframe[1].value) == 1
    scatter = _charts(at)["loyalty.scatter"]["data"]
    assert [c for trace in scatter for c in trace["customdata"]] == [[0]]


def test_the_students_chosen_on_one_page_open_the_next(app, tmp_path, monkeypatch):
    """A page opens with the students another page chose for the teacher; an added folder that
    no longer exists is forgotten, with a note, instead of listed as a problem."""
    from workbench.app.catalog import ADDED_FILE, added_sources
    from workbench.core.files import atomic_write_json, user_cache

    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    atomic_write_json(user_cache() / ADDED_FILE, [str(tmp_path / "gone" / "student")])
    at = _ok(app.run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    assert at.multiselect(key="loyalty.students").value == list(STUDENTS)  # its own, by default
    at.multiselect(key="loyalty.students").set_value([STUDENTS[1]])
    _ok(at.run())
    at.switch_page("divergence.py")
    _ok(at.run())
    assert at.multiselect(key="divergence.students").value == [STUDENTS[1]]
    assert added_sources() == []
    note = " ".join(c.value for c in at.sidebar.caption).replace("\\", "")
    assert f"no longer there, removed from Added: {tmp_path / 'gone' / 'student'}" in note

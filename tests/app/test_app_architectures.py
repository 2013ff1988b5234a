"""A ModernBERT classifier and a Qwen2 decoder classifier (its own byte-level BPE tokenizer) as
teachers of the bundled MiniLM (`--init pretrained --pretrained minilm-l6`) with AD-KD: each
student trains, `kdw evaluate` scores it against its teacher folder, and the app lists and
compares them — the Qwen2 pair on the words both tokenisations share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kd.cli import main
from tests.app.test_app import APP, _html, _ok
from tests.conftest import make_sentences
from tests.tiny_families import save_family_model

LABELS = ["negative", "neutral", "positive"]
TEACHERS = {"modernbert": "modernbert-classifier", "qwen2": "qwen2-classifier"}
SMALL = ["--max-length", "16", "--epochs", "1", "--batch-size", "16", "--eval-batch-size", "32"]


# slow (once a module): the bundled MiniLM is the student of each teacher
@pytest.fixture(scope="module")
def architecture_runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("architectures")
    root, task = work / "runs", work / "task"
    task.mkdir()
    frame = make_sentences(160)
    for name, part in (("train", frame[:48]), ("dev", frame[96:128]), ("test", frame[128:])):
        part.to_csv(task / f"{name}.csv", index=False)
    for kind, name in TEACHERS.items():
        teacher = save_family_model(kind, root / name, LABELS)
        run = root / f"adkd-from-{kind}"
        command = ["distill", "--teacher", str(teacher), "--task", str(task), "--run-dir", str(run)]
        command += ["--preset", "adkd", "--init", "pretrained", "--pretrained", "minilm-l6"]
        assert main([*command, *SMALL]) == 0, kind
        table = work / f"{kind}.json"
        assert (
            main(["evaluate", str(teacher), str(run), "--task", str(task), "--json", str(table)])
            == 0
        )
        rows = json.loads(table.read_text())
        assert [row["kind"] for row in rows] == ["model", "student"]
        assert 0 <= rows[1]["label_loyalty"] <= 1
    return root


# slow: a teacher and a student of each architecture trained once (the module's fixture)
@pytest.mark.slow
@pytest.mark.parametrize("kind", TEACHERS)
def test_a_minilm_student_of_another_architecture_opens_in_the_app(
    kind, architecture_runs, monkeypatch
):
    monkeypatch.setenv("KDW_RUNS", str(architecture_runs))
    monkeypatch.setenv("KDW_DEMO", "off")
    at = _ok(AppTest.from_file(APP, default_timeout=300).run())
    teacher = at.selectbox(key="case.teacher")
    teacher.set_value(TEACHERS[kind])
    _ok(at.run())
    assert at.multiselect(key="case.students").value == [f"adkd-from-{kind}"]
    assert _html(at).count('class="kdw-row"') == 2  # the teacher folder and its student
    at.switch_page("loyalty.py")
    _ok(at.run())
    at.selectbox(key="loyalty.teacher").set_value(TEACHERS[kind])
    _ok(at.run())
    assert not at.error, [e.value for e in at.error]
    summary = at.dataframe[0].value
    assert list(summary.index) == ["teacher", f"adkd-from-{kind}"]
    # saliency loyalty is defined for the Qwen2 pair too: compared on shared words
    assert -100 <= float(summary.loc[f"adkd-from-{kind}", "SL×100"]) <= 100

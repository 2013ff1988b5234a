"""``kdw``: every bad input ends in one line on stderr, exit status 2, and nothing lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kd.cli import build_parser, main, reproduce_suite
from kd.experiments.reproduce import DEFAULT, FULL, experiments, identity
from tests.conftest import write_run_record

ROOT = Path(__file__).resolve().parents[2]


def _teacher_arguments(run_dir, task_dir, model_dir) -> list[str]:
    """``kdw train-teacher`` of a tiny teacher for a tenth of an epoch."""
    return [
        "train-teacher",
        "--run-dir",
        str(run_dir),
        "--task",
        str(task_dir),
        "--model",
        str(model_dir),
        "--epochs",
        "0.1",
        "--threads",
        "1",
    ]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("kdw: error: ")
    return err[0]


@pytest.mark.parametrize("command", ["train-teacher", "distill", "evaluate", "baseline", "demo"])
def test_every_command_explains_its_options(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: kdw " + command in out
    if command == "distill":
        for option in ("--teacher", "--preset", "--temperature", "--layers", "--parity"):
            assert option in out


def test_methods_lists_the_registry_and_help_texts_name_its_lists(monkeypatch, capsys):
    from dataclasses import replace

    from kd.methods.config import ObjectiveConfig
    from kd.methods.objective import PRESETS, TERMS, Claim
    from kd.training.config import StudentConfig
    from workbench.core.config import fill_help

    # a preset registered like any method's: kdw methods and the help texts list it at once
    extra = replace(PRESETS["gkd"], name="GKD-slow", temperature=7.0, claims=(Claim("accuracy"),))
    monkeypatch.setitem(PRESETS, "gkd-slow", extra)
    main(["methods"])
    out = capsys.readouterr().out
    for key, preset in PRESETS.items():
        assert f"{key} — {preset.name}" in out
    space = "beta=1,10,50,100 alpha=0.8,0.9,1.0 tau=1,2,3,4 lr=5e-5,1e-4,2e-4"
    assert f"kdw tune space: {space} (β weighs attr)" in out
    assert "w/o ce (ce=0); w/o kd (kd=0)" in out
    assert "claims: accuracy > vanilla KD's" in out
    assert out.splitlines()[-2] == "terms: " + ", ".join(TERMS)
    words = out.splitlines()[-1]
    assert words.startswith("across tokenizers, on the words both share: wr: ")
    assert "grad: each token's gradient norm summed over the word's tokens" in words
    assert "cls_grad" not in words and "pkd:" not in words  # whole-example terms

    fields = ObjectiveConfig.__dataclass_fields__
    preset_help = fill_help(fields["preset"].metadata["help"])
    assert "adkd: AD-KD (Wu et al. 2023)" in preset_help and "gkd-slow: GKD-slow" in preset_help
    assert fill_help(fields["weights"].metadata["help"]).endswith("terms: " + ", ".join(TERMS))
    assert "GKD-slow 7" in fill_help(fields["temperature"].metadata["help"])
    pretrained = fill_help(StudentConfig.__dataclass_fields__["pretrained"].metadata["help"])
    assert "(beyond the paper)" in pretrained


HEAVY = (
    "torch",
    "transformers",
    "captum",
    "pandas",
    "streamlit",
    "optuna",
    "onnxruntime",
    "mlflow",
    "tensorboard",
    "sqlalchemy",
)


def test_the_help_of_every_command_loads_no_heavy_library():
    """``kdw --help`` and each command's help load in a fraction of a second: the parser is
    built from the config dataclasses alone, and a command's libraries are imported when it
    runs (checked in a fresh interpreter, since this one has them all)."""
    script = (
        "import json, sys\n"
        "from kd.cli import build_parser\n"
        "parser = build_parser()\n"
        "commands = next(a for a in parser._actions if a.dest == 'command').choices\n"
        "texts = [parser.format_help()] + [c.format_help() for c in commands.values()]\n"
        f"print(json.dumps([sorted(set({HEAVY!r}) & set(sys.modules)), len(texts)]))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    loaded, helps = json.loads(result.stdout)
    assert loaded == [] and helps > 10


def test_reproduce_options_name_the_suite():
    def suite(*options: str):
        return reproduce_suite(build_parser().parse_args(["reproduce", *options]))

    assert suite() == DEFAULT and suite("--full") == FULL
    assert {e.group for e in experiments(DEFAULT)} == {"main"}  # the default: no ablation
    ablated = suite("--ablations", "--fixed")
    assert ablated.tuned == {} and ablated == DEFAULT.fixed().with_ablations()
    groups = {e.group for e in experiments(ablated)}
    assert {"reference", "adkd-k", "adkd-m", "adkd-terms", "ckd-terms"} <= groups
    five = suite("--seeds", "5")
    assert {e.seed for e in experiments(five)} == {1, 2, 3, 4, 5}
    keys = {identity(e, five.plan_of(e), five.plans[e.task]) for e in experiments(five)}
    assert {
        identity(e, DEFAULT.plan_of(e), DEFAULT.plans[e.task]) for e in experiments(DEFAULT)
    } < keys


def test_unknown_task_model_and_missing_column(tmp_path, tiny_model_dir, capsys):
    run_dir = str(tmp_path / "run")
    assert main(["train-teacher", "--run-dir", run_dir, "--task", "sst-3"]) == 2
    assert "cannot load hub data set 'sst-3': the hub is unreachable" in _error_line(capsys)
    assert main(["train-teacher", "--run-dir", run_dir, "--model", "./nowhere/model"]) == 2
    assert "no such file or folder: ./nowhere/model" in _error_line(capsys)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"text": ["a", "b"], "gold": [0, 1]}).to_csv(bad, index=False)
    assert (
        main(
            [
                "train-teacher",
                "--run-dir",
                run_dir,
                "--task",
                str(bad),
                "--model",
                str(tiny_model_dir),
            ]
        )
        == 2
    )
    assert "missing column(s) ['label']" in _error_line(capsys)
    assert not Path(run_dir).exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--model", "./nowhere/model"),
        ("--model", "org/model/v1"),
        ("--model", "bert.safetensors"),
        ("--task", "data/missing.csv"),
        ("--task", "missing.csv"),
        ("--task", "~/no-such-kdw-task"),
        ("--glue-dir", "./no-glue"),
    ],
)
def test_a_missing_path_fails_at_once(
    option, value, tmp_path, tiny_model_dir, tiny_task_dir, capsys
):
    run_dir = tmp_path / "run"
    given = {"--model": str(tiny_model_dir), "--task": str(tiny_task_dir)}
    given |= {option: value} | ({"--task": "sst2"} if option == "--glue-dir" else {})
    start = time.monotonic()
    arguments = [part for pair in given.items() for part in pair]
    assert main(["train-teacher", "--run-dir", str(run_dir), *arguments]) == 2
    assert time.monotonic() - start < 10
    assert _error_line(capsys) == f"kdw: error: no such file or folder: {value}"
    assert not run_dir.exists()


def test_corrupt_and_partial_runs(tmp_path, capsys):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "run.json").write_text("{ not json")
    assert main(["evaluate", str(corrupt)]) == 2
    assert "corrupt" in _error_line(capsys)
    partial = tmp_path / "partial"
    partial.mkdir()
    write_run_record(partial)
    (partial / "status.json").write_text(json.dumps({"state": "running"}))
    assert main(["evaluate", str(partial)]) == 2
    assert "no trained model yet (status: running)" in _error_line(capsys)
    assert main(["distill", "--run-dir", str(tmp_path / "s")]) == 2
    assert "needs --teacher" in _error_line(capsys)
    assert main(["evaluate", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in _error_line(capsys)


def test_existing_run_with_other_settings_is_kept(tmp_path, tiny_task_dir, tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    common = _teacher_arguments(run_dir, tiny_task_dir, tiny_model_dir)
    assert main(common) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert main([*common, "--learning-rate", "1e-3"]) == 2
    assert "other settings (--learning-rate 5e-05 → 0.001)" in _error_line(capsys)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_a_teacher_run_of_another_task_is_refused_with_the_task_to_pass(
    tmp_path, tiny_task_dir, tiny_model_dir, capsys
):
    teacher = tmp_path / "teacher"
    assert main(_teacher_arguments(teacher, tiny_task_dir, tiny_model_dir)) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "distill",
                "--run-dir",
                str(tmp_path / "student2"),
                "--task",
                "tweets",
                "--teacher",
                str(teacher),
            ]
        )
        == 2
    )
    assert "pass --task" in _error_line(capsys)


# slow: a real kdw process imports the datasets library and asks the hub whether it answers
@pytest.mark.slow
def test_no_traceback_from_the_installed_entry_point(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kd.cli",
            "train-teacher",
            "--run-dir",
            str(tmp_path / "r"),
            "--task",
            "no-such-task",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("kdw: error: cannot load hub data set 'no-such-task'")
    )


def test_attribute_writes_reloadable_records(tmp_path, tiny_task_dir, tiny_model_dir, capsys):
    from workbench.analysis.attribution import load_attributions

    teacher = tmp_path / "teacher"
    assert main(_teacher_arguments(teacher, tiny_task_dir, tiny_model_dir)) == 0
    capsys.readouterr()
    out = tmp_path / "attributions"
    awkward = "good\u2028movie\u0085plot\u2029\r nice"  # str.splitlines splits at each
    assert (
        main(
            [
                "attribute",
                str(teacher),
                "--out",
                str(out),
                "--text",
                "good movie",
                "--text",
                awkward,
                "--split",
                "test",
                "--examples",
                "0-2",
                "--views",
                "all",
                "--steps",
                "2",
            ]
        )
        == 0
    )
    records = load_attributions(out / "teacher.jsonl")
    assert len(records) == 5 and records[0].text == "good movie"
    assert records[1].text == awkward
    assert records[0].tokens == ["[CLS]", "good", "movie", "[SEP]"]
    assert len(records[0].maps) == 3 and all(len(m) == 4 for m in records[0].maps)
    assert records[0].settings["explainer_settings"]["steps"] == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["attribute", str(teacher), "--out", str(out), "--text", "x", "--baseline", "mean"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'mean'" in capsys.readouterr().err
    assert main(["attribute", str(teacher), "--out", str(out), "--text", "x", "--top-k", "99"]) == 2
    assert "top_k" in _error_line(capsys)


# slow: two real kdw processes, each importing torch, one training
@pytest.mark.slow
def test_a_second_writer_of_a_run_is_refused(tmp_path, tiny_task_dir, tiny_model_dir):
    """Two real processes on one --run-dir: the second is refused, naming the first, which
    trains on undisturbed (it is paused while the second tries, so the timing is fixed)."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "kd.cli",
        "train-teacher",
        "--run-dir",
        str(run_dir),
        "--task",
        str(tiny_task_dir),
        "--model",
        str(tiny_model_dir),
        "--epochs",
        "2",
        "--threads",
        "1",
        "--log-every",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "first.log"
    with open(log, "w") as output:
        first = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoint.pt").exists() and first.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=300, check=False
        )
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, log.read_text()
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"kdw: error: run folder {run_dir} is in use by process {first.pid}: wait for it to end, "
        "or stop it and run the command again"
    ]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines)) > 2
    steps = [(r["split"], r["step"]) for r in map(json.loads, lines)]
    assert len(steps) == len(set(steps))
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"

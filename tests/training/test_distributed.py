"""Data parallelism on real processes (gloo, CPU): N processes train to the weights of one
process with the same global batch, a killed torchrun job resumes to the uninterrupted run's
weights, a batch the processes cannot share is refused; accumulation and bf16 autocast."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from kd.cli import main
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from tests.conftest import assert_same_weights, make_sentences, tiny_model, tiny_tokenizer
from tests.tolerances import float32_floor
from workbench.core.config import DataConfig, option_name
from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ("kd", "adkd", "gkd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_dir(folder: Path, dropout: float) -> Path:
    """A tiny random BERT (dropout ``dropout``) with its tokenizer."""
    tokenizer = tiny_tokenizer(folder)
    model = tiny_model()
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = dropout
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _task_dir(folder: Path, train: int = 40) -> Path:
    folder.mkdir(parents=True)
    frame = make_sentences(train + 40, seed=3)
    frame.iloc[:train].to_csv(folder / "train.csv", index=False)
    frame.iloc[train : train + 20].to_csv(folder / "dev.csv", index=False)
    frame.iloc[train + 20 :].to_csv(folder / "test.csv", index=False)
    return folder


def _optim(**changes) -> OptimConfig:
    """A few steps; the last batch of each epoch (40 = 2·16 + 8) is a partial one."""
    values = dict(
        epochs=1.0,
        batch_size=16,
        learning_rate=1e-3,
        threads=1,
        log_every=2,
        checkpoint_every=1000,
        warmup_ratio=0.0,
    )
    return OptimConfig(**(values | changes))


def _data(task: Path) -> DataConfig:
    return DataConfig(task=str(task), max_length=16)


def _final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


# the settings of the killed job's command, :func:`_torchrun`
KILLED_JOB = dict(
    epochs=12.0,
    batch_size=8,
    checkpoint_every=2,
    eval_every=1000,
    threads=1,
    learning_rate=1e-3,
    log_every=0,
)


def _jobs(folder: Path, suffix: str) -> None:
    """Fine-tune a teacher, then distil ``kd``, ``adkd`` and ``gkd`` students from the
    one-process teacher ``folder/teacher-1``, into ``folder/<name>-<suffix>``. On two
    processes, also the uninterrupted run of the killed job's test (``folder/dropout-2``)."""
    data = _data(folder / "task")
    if suffix == "2":
        train_teacher(
            data,
            TeacherConfig(model=str(folder / "model-dropout")),
            OptimConfig(**KILLED_JOB),
            folder / "dropout-2",
        )
    train_teacher(
        data,
        TeacherConfig(model=str(folder / "model")),
        _optim(epochs=2.0),
        folder / f"teacher-{suffix}",
    )
    for preset in PRESETS:
        distill(
            data,
            StudentConfig(teacher=str(folder / "teacher-1"), num_layers=2),
            ObjectiveConfig(preset=preset),
            _optim(),
            folder / f"{preset}-{suffix}",
        )


def _join(rank: int, size: int, port: int) -> None:
    """The environment torchrun gives process ``rank`` of ``size``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )


def _worker(rank: int, size: int, port: int, folder: Path) -> None:
    """One process of a job launched as ``torchrun`` would: its rank in the environment."""
    _join(rank, size, port)
    try:
        _jobs(folder, str(size))
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The same jobs on one process (this one) and on two spawned processes; dropout off, so
    that the dropout streams of one and two processes cannot differ."""
    folder = tmp_path_factory.mktemp("distributed")
    _model_dir(folder / "model", dropout=0.0)
    _model_dir(folder / "model-dropout", dropout=0.1)
    _task_dir(folder / "task")
    _jobs(folder, "1")
    mp.spawn(_worker, args=(2, _free_port(), folder), nprocs=2, join=True)
    return folder


# slow: the module's fixture trains every job on one process and on two spawned ones
@pytest.mark.parametrize("name", ["teacher", *PRESETS])
@pytest.mark.slow
def test_two_processes_train_the_weights_of_one(trained, name):
    one, two = _final_weights(trained / f"{name}-1"), _final_weights(trained / f"{name}-2")
    start = tiny_model().state_dict()
    assert_same_weights(one, two)
    moved = sum(
        not torch.equal(value, start[key])
        for key, value in one.items()
        if key in start and value.shape == start[key].shape
    )
    assert moved > 0  # the weights trained
    # rank 0 alone wrote the run: one record per step and evaluation, the same losses
    records = [json.loads(line) for line in (trained / f"{name}-2" / "metrics.jsonl").open()]
    reference = [json.loads(line) for line in (trained / f"{name}-1" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [r["step"] for r in reference]
    for mine, theirs in zip(records, reference, strict=True):
        for key in ("loss", "value/kd", "grad_norm/total", "grad_share/ce"):
            if key in theirs:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    status = json.loads((trained / f"{name}-2" / "status.json").read_text())
    assert status["state"] == "finished"
    # the teacher cache, computed in halves by the two processes and gathered, is the one
    # process's (padded in other batches: equal to rounding)
    for one_file in sorted((trained / f"{name}-1" / "teacher_cache").glob("*.safetensors")):
        mine = load_file(str(trained / f"{name}-2" / "teacher_cache" / one_file.name))
        theirs = load_file(str(one_file))
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            atol = float32_floor(value)
            torch.testing.assert_close(mine[key], value, rtol=0, atol=atol, msg=key)


def _torchrun(run_dir: Path, model: Path, task: Path) -> list[str]:
    """``kdw train-teacher`` on two processes with the settings :data:`KILLED_JOB`."""
    options = [
        f"{option_name(name)}={value}" for name, value in KILLED_JOB.items() if name != "epochs"
    ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "-m",
        "kd.cli",
        "train-teacher",
        "--run-dir",
        str(run_dir),
        "--task",
        str(task),
        "--model",
        str(model),
        "--epochs",
        str(KILLED_JOB["epochs"]),
        "--max-length",
        "16",
        *options,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


# slow: torchrun started twice, each time a launcher and two workers importing torch
@pytest.mark.slow
def test_killed_torchrun_job_resumes_to_the_same_weights(trained):
    """A real SIGKILL of the whole torchrun job (launcher and both workers) mid-run, then the
    same command; dropout on, so each process's RNG must come back from the checkpoint. The
    uninterrupted run is the fixture's two-process ``dropout-2``."""
    model, task, killed = trained / "model-dropout", trained / "task", trained / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        _torchrun(killed, model, task),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline, state = time.time() + 120, {}
    while time.time() < deadline:
        try:
            state = json.loads((killed / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            state = {}
        if state.get("state") == "running" and state.get("step", 0) >= 20:
            break
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert state.get("state") == "running" and 20 <= state["step"] < state["total"], state
    saved = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert 0 < saved["state"]["step"] < state["total"] and len(saved["rng"]) == 2

    done = subprocess.run(_torchrun(killed, model, task), capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed, uninterrupted = _final_weights(killed), _final_weights(trained / "dropout-2")
    for key, value in uninterrupted.items():
        assert torch.equal(resumed[key], value), key
    assert json.loads((killed / "status.json").read_text())["state"] == "finished"


def test_a_batch_the_processes_cannot_share_is_refused(tmp_path, monkeypatch, capsys):
    """The environment torchrun gives two processes, and a batch of 7: a one-line error before
    anything is loaded or written."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(
        [
            "train-teacher",
            "--run-dir",
            str(tmp_path / "run"),
            "--model",
            "absent",
            "--batch-size",
            "7",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "kdw: error: --batch-size 7 does not split into 2 process(es) × 1 accumulation step(s): "
        "choose a batch size divisible by 2\n"
    )
    assert not (tmp_path / "run").exists()


def _unsaved_worker(rank: int, size: int, port: int, folder: Path) -> None:
    """Train a teacher on two processes whose model fails to save (``save_pretrained``
    raises); each process writes the line it stopped with to ``folder/said-<rank>``; then the
    same job again, with saving restored and a training step refused."""
    _join(rank, size, port)
    from transformers import PreTrainedModel

    from kd.training.trainer import TrainingLoop

    def refuse(*_args, **_kwargs):
        raise ValueError("no space left on device")

    def no_step(*_args):
        raise AssertionError("a training step on rerun")

    job = (_data(folder / "task"), TeacherConfig(model=str(folder / "model")), _optim())
    saving = PreTrainedModel.save_pretrained
    try:
        PreTrainedModel.save_pretrained = refuse
        try:
            train_teacher(*job, folder / "run")
        except WorkbenchError as error:
            (folder / f"said-{rank}").write_text(str(error))
        PreTrainedModel.save_pretrained, TrainingLoop.step = saving, no_step
        train_teacher(*job, folder / "run")
    finally:
        torch.distributed.destroy_process_group()


# slow: two spawned processes importing torch, each training twice
@pytest.mark.slow
def test_a_model_that_fails_to_save_stops_every_process_and_a_rerun_saves_it(tmp_path):
    """Rank 0 alone saves: when its save fails, both processes stop at that step (none waits
    for the other), the checkpoint holds the model, and the same job on two processes saves it
    without training again."""
    _model_dir(tmp_path / "model", dropout=0.0)
    _task_dir(tmp_path / "task")
    context = mp.start_processes(
        _unsaved_worker, args=(2, _free_port(), tmp_path), nprocs=2, join=False
    )
    deadline = time.time() + 120
    while not context.join(timeout=1):
        if time.time() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("a process waited for the other after the failed save")
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    total = 3  # 40 examples in batches of 16
    assert (tmp_path / "said-0").read_text() == (
        f"the model of step {total} could not be saved (ValueError: no space left on device): "
        f"training finished; the trained weights are in {checkpoint}; rerun the same command "
        "to save them"
    )
    assert (tmp_path / "said-1").read_text() == (
        f"training stopped at step {total}: rank 0 could not save the model; the trained "
        f"weights are in {checkpoint}"
    )
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    trained = _final_weights(tmp_path / "run")
    assert saved and all(torch.equal(value, trained[key]) for key, value in saved.items())
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"

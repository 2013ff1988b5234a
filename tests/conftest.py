"""Shared fixtures: a tiny random BERT saved as a real Hugging Face model directory, with a real
WordPiece tokenizer, and a small local text-classification data set."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import pytest
import torch
from filelock import FileLock
from hypothesis import settings
from transformers import AutoModelForSequenceClassification, BertConfig, BertTokenizerFast

from kd.cli import main
from workbench.app.catalog import ADDED_FILE

# No test starts the app's real demo build: on an empty runs root the app launches it in a
# background process that outlives the test run. Set for the whole session, not per test, so
# that nothing started by a test (a Streamlit script thread still running after its test, a
# child process) sees the variable unset; tests that need another value set it with monkeypatch.
os.environ["KDW_DEMO"] = "off"

# The test command runs two pytest-xdist workers on the machine's two cores: one torch thread
# each (and for the processes they start), rather than two threads per worker contending for
# the same cores (which makes a tiny model's step several times slower).
WORKER = "PYTEST_XDIST_WORKER" in os.environ
if WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Every Hypothesis test: no wall-clock deadline (its examples write files and run commands, whose
# time is the machine's load, not the code's) and the same examples on every run (derandomize:
# drawn from a hash of the test, which also leaves the example database out).
settings.register_profile("workbench", deadline=None, derandomize=True)
settings.load_profile("workbench")

# the workbench's user cache (analyses of models it did not train, the app's added folders) in a
# folder of the test session, never the user's; what a test added in the app is gone after it
os.environ["KDW_CACHE"] = tempfile.mkdtemp(prefix="kdw-cache-")


@pytest.fixture(autouse=True)
def _nothing_added_in_the_app() -> Iterator[None]:
    yield
    (Path(os.environ["KDW_CACHE"]) / ADDED_FILE).unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _main_module_kept() -> Iterator[None]:
    """A Streamlit script a test runs (``AppTest``) is left as ``__main__``, which the workers of
    a process pool that a later test spawns would run again: each test leaves ``__main__`` as
    it found it."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(autouse=True)
def _one_torch_thread_per_worker() -> Iterator[None]:
    """A test that sets torch's thread count (a run's ``threads``, a suite's teacher trained on
    every core) leaves the worker on one thread again."""
    yield
    if WORKER and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


WORDS = [
    "good",
    "great",
    "fine",
    "love",
    "happy",
    "nice",
    "bad",
    "awful",
    "hate",
    "sad",
    "poor",
    "terrible",
    "movie",
    "film",
    "plot",
    "actor",
    "scene",
    "music",
    "story",
    "long",
    "short",
    "very",
    "not",
    "really",
    "quite",
    "the",
    "a",
    "an",
    "is",
    "was",
    "it",
    "this",
    "that",
    "and",
    "but",
]
POSITIVE, NEGATIVE = set(WORDS[:6]), set(WORDS[6:12])


def pytest_itemcollected(item: pytest.Item) -> None:
    """The test command's two workers share the tests out one by one (``--dist loadgroup``),
    except those of a module that use a fixture of the module's or the session's (tiny runs
    trained, a server started): they form one group, run by one worker, which builds the
    fixture once. Marked as each test is collected, before any hook reorders or renames the
    tests (pytest-xdist reads the groups in its own ``pytest_collection_modifyitems``)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None or item.get_closest_marker("xdist_group"):
        return
    shared = any(
        definition.scope != "function" and definition.baseid  # pytest's own: baseid ""
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )
    if shared:
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


COST = {"e2e": 20, "slow": 10}  # a test's weight in the order of the work (1: unmarked)


@pytest.hookimpl(trylast=True)  # after pytest-xdist has named each test of a group for it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run when the groups are lost (a pytest that pytest-xdist cannot rename a
    test's id in): every module's shared set-up would be built once per worker, silently.
    Then order the work units (a group, or a test of none) heaviest first, by their tests'
    markers (:data:`COST`): the workers take units in this order (``--no-loadscope-reorder``),
    so the long ones start early and the run ends on short tests on both workers."""
    if not getattr(config.option, "loadgroup", False):  # not a worker of --dist loadgroup
        return
    grouped = [i.nodeid for i in items if i.get_closest_marker("xdist_group")]
    lost = [nodeid for nodeid in grouped if "@" not in nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): use the "
            "pytest the dev extra pins"
        )
    weight: dict[str, int] = {}
    for item in items:
        marks = [COST[m.name] for m in item.iter_markers() if m.name in COST]
        weight[_unit(item)] = weight.get(_unit(item), 0) + max(marks, default=1)
    items.sort(key=lambda item: -weight[_unit(item)])


def _unit(item: pytest.Item) -> str:
    """What a worker takes at once: the test's group (named after its ``@``), or the test."""
    return item.nodeid.rpartition("@")[2]


class DebianNeed(NamedTuple):
    """Debian packages a fixture needs: whether those they recommend come too (False: a smaller
    install), and how the fixture finds what it uses (installed by other means, it is used as
    it is)."""

    packages: tuple[str, ...]
    recommends: bool
    present: Callable[[], bool]


def _kpsewhich(name: str) -> bool:
    if shutil.which("kpsewhich") is None:
        return False
    found = subprocess.run(["kpsewhich", name], capture_output=True, text=True, check=False)
    return bool(found.stdout.strip())


CHROMIUM = Path("/usr/bin/chromium")
# The Debian packages the tests need, by the fixture that needs them: installed with apt-get
# where missing and possible (as the CI machine's root can), in the background from the start of
# the run (:func:`pytest_collection_finish`), else the fixture's test is skipped.
DEBIAN = {
    "chromium": DebianNeed(("chromium",), True, CHROMIUM.exists),
    "postgres": DebianNeed(
        ("postgresql",), True, lambda: any(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    ),
    "pdflatex": DebianNeed(
        ("texlive-latex-base", "lmodern"),
        False,
        lambda: bool(shutil.which("pdflatex") and _kpsewhich("lmodern.sty")),
    ),
    "poppler": DebianNeed(
        ("poppler-utils",),
        False,
        lambda: bool(shutil.which("pdftoppm") and shutil.which("pdftotext")),
    ),
}
APT_LOCK = Path(tempfile.gettempdir()) / "kdw-tests-apt-get.lock"
_installing: list[threading.Thread] = []


def _apt_get(fixture: str) -> bool:
    """Install the packages of ``fixture`` (:data:`DEBIAN`) unless dpkg has them all, one
    apt-get at a time on this machine (dpkg refuses a second one: the other test worker, or
    another test run, waits for the first to finish); whether they are installed."""
    packages, recommends, _ = DEBIAN[fixture]
    install = ["apt-get", "install", "-y", "-q", *packages]
    if not recommends:
        install.insert(2, "--no-install-recommends")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with FileLock(APT_LOCK):
        if _dpkg_status(packages) == ["ii"] * len(packages):
            return True
        if subprocess.run(install, capture_output=True, env=env, check=False).returncode == 0:
            return True
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, check=False)
        return subprocess.run(install, capture_output=True, env=env, check=False).returncode == 0


def _dpkg_status(packages: tuple[str, ...]) -> list[str]:
    """dpkg's two-letter status of each of ``packages`` it knows (``ii``: installed); none on a
    machine without dpkg."""
    if shutil.which("dpkg-query") is None:
        return []
    status = ["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\n", *packages]
    return subprocess.run(status, capture_output=True, text=True, check=False).stdout.split()


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def pytest_collection_finish(session: pytest.Session) -> None:
    """One process of the run (the first worker) installs the Debian packages that its selected
    tests need and that are missing, in a background thread, in the order the tests come: the
    tests run meanwhile (apt-get and the test run share the cores, rather than a test waiting
    on apt-get), and a test that needs a package still installing waits for it in
    :func:`debian_package`."""
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0" or not _can_install():
        return
    selected = session.items
    needed = [name for item in selected for name in item.fixturenames if name in DEBIAN]
    if needed:
        fixtures = [name for name in dict.fromkeys(needed) if not DEBIAN[name].present()]
        thread = threading.Thread(target=lambda: [_apt_get(f) for f in fixtures], daemon=True)
        thread.start()
        _installing.append(thread)


def pytest_sessionfinish() -> None:
    """A run that ends first waits for the background apt-get: dpkg is never cut off mid-install."""
    for thread in _installing:
        thread.join()


def debian_package(fixture: str) -> None:
    """Make the Debian packages of ``fixture`` (:data:`DEBIAN`) ready: there if they are
    present and dpkg is not installing one of them (a package's files appear before dpkg has
    configured it, as pdflatex before its formats: the run's apt-get may be under way), else
    installed once any apt-get under way has ended, or the test skipped where that is
    impossible."""
    packages, _, present = DEBIAN[fixture]
    installing = any(status[0] == "i" != status[1] for status in _dpkg_status(packages))
    if present() and not installing:
        return
    named = " ".join(packages)
    if not _can_install():
        pytest.skip(f"Debian's {named} is missing and apt-get cannot install it here (not root)")
    if not _apt_get(fixture):
        pytest.skip(f"apt-get install {named} failed")


@contextmanager
def served(command: list[str], ready: str, what: str, log: Path, **options) -> Iterator[None]:
    """Run the server ``command`` (output to ``log``) until the URL ``ready`` answers (within
    90 s; a server that exits first, or never answers, fails the test with its log), then
    stop it. A failure while it serves carries the end of its log."""
    with open(log, "w") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, **options)
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                pytest.fail(f"{what} did not start:\n{log.read_text()}")
            time.sleep(0.5)
        try:
            yield
        except BaseException as failure:  # what the server said goes with the test's failure
            failure.add_note(f"{what}'s output:\n{log.read_text()[-6000:]}")
            raise
    finally:
        server.terminate()
        server.wait(timeout=30)


# what a run's least record resolved to: a fine-tuning objective, no split fingerprints
LEAST_RESOLVED = {"resolved": {"objective": {"weights": {"ce": 1.0}}, "split_fingerprint": {}}}


def write_run_record(folder: Path, **fields: Any) -> None:
    """A run.json written by hand: a teacher's least record (no configs,
    :data:`LEAST_RESOLVED`), ``fields`` added or replaced."""
    from workbench.core.files import with_format

    record = {"kind": "teacher", "configs": {}, **LEAST_RESOLVED}
    (folder / "run.json").write_text(json.dumps(with_format(record | fields)))


def tiny_config(num_labels: int = 3, layers: int = 4, hidden: int = 16) -> BertConfig:
    return BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        num_labels=num_labels,
    )


def tiny_tokenizer(folder: Path) -> BertTokenizerFast:
    """A real WordPiece tokenizer over :data:`WORDS`, saved in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(tokens)})
    tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_model(num_labels: int = 3, layers: int = 4, hidden: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    config = tiny_config(num_labels, layers, hidden)
    return AutoModelForSequenceClassification.from_config(
        config, attn_implementation="eager"
    ).eval()


def id_batch(rows: list[list[int]], pad: int = 0) -> dict[str, torch.Tensor]:
    """A batch of token id ``rows``, padded with ``pad`` to the longest: ``[B, L]`` each."""
    length = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A 4-layer, 16-wide random BERT encoder + tokenizer, saved like a pretrained hub
    checkpoint (no classification head: ``train-teacher --model`` gives it the task's)."""
    folder = tmp_path / "tiny-bert"
    tokenizer = tiny_tokenizer(folder)
    tiny_model().bert.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_sentences(count: int, seed: int = 0) -> pd.DataFrame:
    """Short sentences whose label (negative / neutral / positive) follows their words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = rng.choices(WORDS, k=rng.randint(3, 12))
        score = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
        label = "positive" if score > 0 else "negative" if score < 0 else "neutral"
        rows.append({"text": " ".join(words), "label": label})
    return pd.DataFrame(rows).drop_duplicates("text")


@pytest.fixture
def tiny_task_dir(tmp_path: Path) -> Path:
    """train/dev/test CSV files of :func:`make_sentences`."""
    folder = tmp_path / "task"
    folder.mkdir()
    frame = make_sentences(400)
    frame.iloc[:300].to_csv(folder / "train.csv", index=False)
    frame.iloc[300:350].to_csv(folder / "dev.csv", index=False)
    frame.iloc[350:].to_csv(folder / "test.csv", index=False)
    return folder


def write_tiny_workspace(work: Path) -> None:
    """``work/tiny-bert`` (a tiny random BERT encoder and its tokenizer) and ``work/task``
    (train/dev/test CSV files of 120/30/about 50 :func:`make_sentences`)."""
    tiny_tokenizer(work / "tiny-bert")
    tiny_model().bert.save_pretrained(work / "tiny-bert")
    (work / "task").mkdir()
    frame = make_sentences(200)
    for name, part in (("train", frame[:120]), ("dev", frame[120:150]), ("test", frame[150:])):
        part.to_csv(work / "task" / f"{name}.csv", index=False)


def write_tiny_runs(work: Path) -> None:
    """:func:`write_tiny_workspace`, then ``work/teacher`` (a run trained on ``work/task`` at
    max length 16) and ``work/student`` (2 layers distilled from it with vanilla KD), recorded
    with absolute paths."""
    from kd.methods.config import ObjectiveConfig
    from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
    from kd.training.pipeline import distill, train_teacher
    from workbench.core.config import DataConfig

    write_tiny_workspace(work)
    data = DataConfig(task=str(work / "task"), max_length=16)
    fast = OptimConfig(epochs=0.1, batch_size=16, threads=1)
    train_teacher(data, TeacherConfig(model=str(work / "tiny-bert")), fast, work / "teacher")
    student = StudentConfig(teacher=str(work / "teacher"), num_layers=2)
    distill(data, student, ObjectiveConfig(preset="kd"), fast, work / "student")


def assert_same_weights(one: dict, other: dict, atol: float = 1e-6) -> None:
    """State dicts equal to ``atol``, except attention key biases: softmax over keys is
    invariant to a constant per query, so their gradient is zero in exact arithmetic and only
    rounding noise in floating point, which Adam scales to steps of ±lr. Two ways of summing one
    gradient (shards, micro-batches) cannot agree on that noise."""
    assert one.keys() == other.keys()
    for key, value in one.items():
        if not key.endswith("attention.self.key.bias"):
            torch.testing.assert_close(other[key], value, rtol=0, atol=atol, msg=key)


ROOT = Path(__file__).resolve().parents[1]


def kill_at_step(command: list[str], run_dir: Path, step: int) -> dict:
    """Run ``kdw`` with the arguments ``command`` (a full command line whose first items may be
    the Python interpreter and ``-m kd.cli``) in a process of its own, kill it (SIGKILL) once
    its run folder's status says it is training at ``step`` or later, and return that status."""
    if command[0] != sys.executable:
        command = [sys.executable, "-m", "kd.cli", *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    status = run_dir / "status.json"
    deadline = time.time() + 300
    state: dict = {}
    while time.time() < deadline and process.poll() is None:
        try:
            state = json.loads(status.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            state = {}
        if state.get("state") == "running" and state.get("step", 0) >= step:
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the process ended before it was killed"
    return state


def kdw_here(arguments: list[str], cwd: Path) -> tuple[int, str]:
    """``kdw`` run in this process from ``cwd``: its exit status and stderr. An exception that
    escapes (a traceback) fails the test."""
    here, err = Path.cwd(), io.StringIO()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(arguments)
            except SystemExit as stop:  # argparse's refusals
                status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        os.chdir(here)
    return status, err.getvalue()


def kdw_fresh(commands: list[list[str]]) -> list[tuple[int, str, list[str]]]:
    """Each of ``commands`` run by ``kdw`` in one fresh interpreter, one after the other: its
    exit status, its stderr and which of torch and transformers were imported by then."""
    script = (
        "import contextlib, io, json, sys\n"
        "from kd.cli import main\n"
        "out = []\n"
        "for command in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        status = main(command)\n"
        "    loaded = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "    out.append([status, err.getvalue(), loaded])\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(commands)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [tuple(result) for result in json.loads(done.stdout)]


TEXTS_WITHOUT_PUNCTUATION = [
    "the crew was great but the flight was late",
    "never again with this airline ok",
]


@pytest.fixture(scope="session")
def two_tokenizers(tmp_path_factory) -> tuple:
    """A tiny RoBERTa classifier (byte-level BPE) and a tiny BERT one (MiniLM's WordPiece)."""
    from tests.tiny_families import save_family_model
    from workbench.core.models import load_model

    root = tmp_path_factory.mktemp("two-tokenizers")
    labels = ["negative", "neutral", "positive"]
    teacher = load_model(str(save_family_model("roberta", root / "roberta", labels, seed=1)))
    student = load_model(str(save_family_model("bert", root / "bert", labels, seed=2)))
    return teacher, student


def word_batches(teacher, student, texts: list[str], max_length: int = 32) -> tuple[dict, dict]:
    """``texts`` encoded by a teacher and a student of different tokenizers (loaded models)
    with the words they share, and as one padded batch each: ``(encoded, batches)``, keyed
    ``"teacher"`` and ``"student"``."""
    from workbench.core.data import Split, collate, encode, share_words

    split = Split(texts=texts, labels=[len(t) % 3 for t in texts], uids=list(texts))
    sides = {"teacher": teacher, "student": student}
    encoded = {name: encode(split, m.tokenizer, max_length) for name, m in sides.items()}
    share_words(split, *((encoded[name], m.tokenizer) for name, m in sides.items()), max_length)
    batches = {
        name: collate([encoded[name][i] for i in range(len(texts))], m.tokenizer.pad_token_id)
        for name, m in sides.items()
    }
    return encoded, batches


def whitespace_words(loaded, text: str) -> list[int]:
    """Each token's whitespace word in ``text``, from its offsets (−1 for special tokens): the
    words two tokenisations share where the text has no punctuation."""
    starts = [m.start() for m in re.finditer(r"\S+", text)]
    encoding = loaded.tokenizer(text, return_offsets_mapping=True)
    ids = []
    for start, end in encoding["offset_mapping"]:
        while start < end and text[start] == " ":
            start += 1
        ids.append(-1 if end <= start else max(i for i, s in enumerate(starts) if s <= start))
    return ids

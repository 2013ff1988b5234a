"""End to end: a run trained with ``--report-to tensorboard`` opened in TensorBoard's own UI
(``tensorboard --logdir`` on a loopback port) in Debian's headless Chromium through Playwright:
its time-series page draws our scalars. With ``$KDW_SCREENSHOTS`` set, the page is saved there
as ``tracking-tensorboard.png`` (the picture in ``assets/``)."""

from __future__ import annotations

import os
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kd.training.config import OptimConfig, TeacherConfig
from kd.training.pipeline import train_teacher
from kd.training.tracking import TrackingConfig
from tests.app.test_app_e2e import _free_port, chromium, page  # noqa: F401 (fixtures)
from tests.conftest import make_sentences, served, tiny_model, tiny_tokenizer
from workbench.core.config import DataConfig

pytestmark = pytest.mark.e2e
pytest.importorskip("tensorboard", reason="needs the tracking extra")

SHOWN = ("dev/accuracy", "dev/macro_f1", "train/value/ce", "train/grad_norm/ce")


# slow: a teacher trained 8 epochs (so its dev curve rises), then TensorBoard started on it
@pytest.fixture(scope="module")
def tensorboard_url(tmp_path_factory) -> Iterator[str]:
    """TensorBoard on a free loopback port over a runs root holding one tiny teacher trained
    with ``--report-to tensorboard`` (long enough for its dev accuracy to rise)."""
    work = tmp_path_factory.mktemp("tracking-e2e")
    tiny_tokenizer(work / "tiny-bert")
    tiny_model().bert.save_pretrained(work / "tiny-bert")
    (work / "task").mkdir()
    frame = make_sentences(400)
    for name, part in (("train", frame[:300]), ("dev", frame[300:350]), ("test", frame[350:])):
        part.to_csv(work / "task" / f"{name}.csv", index=False)
    train_teacher(
        DataConfig(task=str(work / "task"), max_length=16),
        TeacherConfig(model=str(work / "tiny-bert")),
        OptimConfig(
            epochs=8, batch_size=8, learning_rate=2e-3, threads=1, log_every=4, eval_every=19
        ),
        work / "runs" / "teacher",
        tracking_config=TrackingConfig(report_to=("tensorboard",)),
    )
    port = _free_port()
    log = work / "tensorboard.log"
    command = [
        *(sys.executable, "-m", "tensorboard.main", "--logdir", str(work / "runs")),
        *("--port", str(port), "--host", "127.0.0.1"),
    ]
    url = f"http://127.0.0.1:{port}"
    with served(command, f"{url}/data/runs", "TensorBoard", log):
        yield url


def test_tensorboard_draws_a_tracked_run_s_scalars(tensorboard_url, page, tmp_path):  # noqa: F811
    tags = urllib.parse.quote("|".join(f"^{tag}$" for tag in SHOWN))
    page.goto(f"{tensorboard_url}/?tagFilter={tags}#timeseries")
    cards = page.locator("scalar-card")
    cards.first.wait_for(timeout=60_000)
    page.locator("scalar-card line-chart").first.wait_for(timeout=60_000)
    count = f"() => document.querySelectorAll('scalar-card').length === {len(SHOWN)}"
    page.wait_for_function(count)
    for tag in SHOWN:
        assert cards.filter(has_text=tag).count() == 1, tag
    page.get_by_role("button", name="Settings").first.click()  # the side panel closed
    page.wait_for_timeout(1500)  # the charts' last frame drawn
    folder = Path(os.environ.get("KDW_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "tracking-tensorboard.png"))

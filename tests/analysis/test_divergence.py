"""The divergence view's analysis (workbench.analysis.explanation_divergence) on tiny random models
with a real WordPiece tokenizer: its numbers against a direct computation, example by example;
the cache hit on a second call; the bad inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertTokenizerFast

from tests.conftest import WORDS, tiny_config, write_run_record
from workbench.analysis.agreement import attribution_gap
from workbench.analysis.attribution import AttributionSettings, compute_maps
from workbench.analysis.explanation_divergence import divergence, word_table
from workbench.analysis.faithfulness import aopc
from workbench.analysis.settings import DivergenceSettings
from workbench.core.config import DataConfig
from workbench.core.data import Split, TaskSpec
from workbench.core.errors import WorkbenchError
from workbench.core.models import LoadedModel, forward
from workbench.core.runs import Run

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s"]
TEXTS = ["the movies was good", "the plot was bad", "movies good good", "bad plot and movies"]
SPEC = TaskSpec("tiny", ("negative", "positive"), ("accuracy",), False)


def _run(folder: Path, seed: int, vocab: list[str] = VOCAB, layers: int = 2) -> LoadedModel:
    """A run folder holding a tiny random 2-class model and its tokenizer, loaded."""
    folder.mkdir(parents=True)
    write_run_record(folder)
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)})
    torch.manual_seed(seed)
    config = tiny_config(num_labels=2, layers=layers)
    config.vocab_size = len(vocab)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    data = DataConfig(max_length=16)
    return LoadedModel(
        model.eval(), tokenizer, SPEC, data, folder.name, str(folder), "run", Run(folder)
    )


def _split(texts: list[str] = TEXTS) -> Split:
    labels = [1, 0, 1, 0][: len(texts)]
    return Split(list(texts), labels, [f"u{i}" for i in range(len(texts))])


@pytest.fixture
def runs(tmp_path) -> tuple[LoadedModel, LoadedModel, LoadedModel]:
    return (
        _run(tmp_path / "teacher", 0, layers=3),
        _run(tmp_path / "alpha", 1),
        _run(tmp_path / "beta", 2),
    )


def _direct(loaded: LoadedModel, text: str) -> tuple[list[str], torch.Tensor, dict]:
    """One text alone: its tokens, its maps of every class ``[C, L]`` and its batch."""
    batch = dict(loaded.tokenizer([text], return_tensors="pt"))
    maps, _ = compute_maps(loaded.model, batch, AttributionSettings(views="all"))
    tokens = loaded.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    return tokens, maps[0], batch


def test_divergence_against_a_direct_computation(runs):
    teacher, alpha, _ = runs
    result = divergence(teacher, [alpha], _split(), DivergenceSettings(min_count=1))
    assert result.students == ["alpha"] and result.computed == ["teacher", "alpha"]
    assert result.truncated == 0
    occurrences: dict[str, list[tuple[float, float]]] = {}
    for i, text in enumerate(TEXTS):
        tokens, teacher_maps, batch = _direct(teacher, text)
        _, alpha_maps, _ = _direct(alpha, text)
        with torch.no_grad():
            predicted = int(forward(teacher.model, batch).logits.argmax(-1))
        # words: "movies" is movie + ##s, its score the sum of the two pieces'
        words, t_scores, a_scores = [], [], []
        for position, token in enumerate(tokens[1:-1], start=1):
            t, a = float(teacher_maps[predicted, position]), float(alpha_maps[predicted, position])
            if token.startswith("##"):
                words[-1] += token[2:]
                t_scores[-1] += t
                a_scores[-1] += a
            else:
                words.append(token)
                t_scores.append(t)
                a_scores.append(a)
        assert result.occurrences[result.occurrences.example == i].word.tolist() == words
        for word, t, a in zip(words, t_scores, a_scores, strict=True):
            occurrences.setdefault(word, []).append((t, a))
        mask = batch["attention_mask"]
        gap = attribution_gap(teacher_maps[None], alpha_maps[None], mask)
        row = result.examples.iloc[i]
        assert row["alpha gap"] == pytest.approx(float(gap[0]), abs=1e-5)
        with torch.no_grad():
            own_class = int(forward(alpha.model, batch).logits.argmax(-1))
        own = aopc(alpha.model, batch["input_ids"], mask, scores=alpha_maps[None, own_class])
        assert row["alpha comprehensiveness"] == pytest.approx(
            float(own.comprehensiveness[0]), abs=1e-5
        )
        assert row["alpha sufficiency"] == pytest.approx(float(own.sufficiency[0]), abs=1e-5)
    assert "movies" in occurrences and "##s" not in result.occurrences.word.tolist()
    table = word_table(result, "alpha").set_index("word")
    for word, pairs in occurrences.items():
        teacher_mean = sum(t for t, _ in pairs) / len(pairs)
        alpha_mean = sum(a for _, a in pairs) / len(pairs)
        assert table.loc[word, "count"] == len(pairs)
        assert table.loc[word, "teacher"] == pytest.approx(teacher_mean, abs=1e-5)
        assert table.loc[word, "alpha"] == pytest.approx(alpha_mean, abs=1e-5)
        assert table.loc[word, "difference"] == pytest.approx(alpha_mean - teacher_mean, abs=1e-5)
    assert table["difference"].is_monotonic_decreasing
    # the example named for a word is where the two models differ most on it
    good = result.occurrences[result.occurrences.word == "good"]
    widest = (good["alpha"] - good["teacher"]).abs().idxmax()
    assert table.loc["good", "example"] == good.loc[widest, "example"]
    per_class = word_table(result, "alpha", by_class=True)
    assert per_class.groupby("word")["count"].sum().to_dict() == table["count"].to_dict()
    assert set(word_table(result, "alpha", min_count=3)["word"]) == {"movies", "good"}


def test_a_second_call_reads_the_cache(runs):
    teacher, alpha, beta = runs
    reports: list[tuple[float, str]] = []
    first = divergence(teacher, [alpha], _split(), progress=lambda f, t: reports.append((f, t)))
    assert reports[-1][0] == 1.0 and any("alpha" in text for _, text in reports)
    files = sorted(teacher.run.analysis_dir.iterdir())
    stamps = [f.stat().st_mtime_ns for f in files]
    again = divergence(teacher, [alpha, beta], _split())
    assert again.computed == ["beta"]  # the teacher and alpha come from their caches
    assert [f.stat().st_mtime_ns for f in sorted(teacher.run.analysis_dir.iterdir())] == stamps
    assert again.examples["alpha gap"].tolist() == first.examples["alpha gap"].tolist()
    ferret = divergence(teacher, [alpha], _split(), DivergenceSettings(rules="ferret"))
    assert ferret.computed == ["teacher", "alpha"]  # other settings: other cache files


def test_examples_past_the_teachers_length_are_counted(runs):
    teacher, alpha, _ = runs
    long = " ".join(["the plot was bad"] * 5)  # 20 words: past the teacher's 16 tokens
    result = divergence(teacher, [alpha], _split([long, *TEXTS[1:]]))
    assert result.truncated == 1


def test_bad_inputs_are_one_line_errors(runs, tmp_path):
    teacher, alpha, beta = runs
    with pytest.raises(WorkbenchError, match="1 example"):
        divergence(teacher, [alpha], _split(TEXTS[:1]))
    with pytest.raises(WorkbenchError, match="at least one student"):
        divergence(teacher, [], _split())
    shutil.rmtree(beta.run.path)
    with pytest.raises(WorkbenchError, match="beta does not exist"):
        divergence(teacher, [beta], _split())
    with pytest.raises(WorkbenchError, match="examples"):
        DivergenceSettings(examples=1)


def test_a_student_of_another_tokenizer_is_compared_on_words(runs, tmp_path):
    """A student whose vocabulary numbers the same tokens otherwise reads other ids: every
    model is then compared on the words the tokenisations share, which here are the teacher's
    own words, so that each word and each model's attribution of it equal those of the
    comparison token by token."""
    teacher, alpha, _ = runs
    other = _run(tmp_path / "other", 3, vocab=[*VOCAB[:5], *reversed(VOCAB[5:])])
    by_tokens = divergence(teacher, [alpha], _split())
    by_words = divergence(teacher, [alpha, other], _split())
    assert list(by_words.occurrences["word"]) == list(by_tokens.occurrences["word"])
    for column in ("example", "teacher", "alpha"):
        assert by_words.occurrences[column].tolist() == pytest.approx(
            by_tokens.occurrences[column].tolist(), abs=1e-6
        )
    assert by_words.occurrences["other"].notna().all()
    assert (by_words.examples["other gap"] >= 0).all()

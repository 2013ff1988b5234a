"""Every loss term, in every form and both parities, against stored reference values.

The values in ``tests/fixtures/golden_terms.json`` come from ``tests/reference_terms.py``, a
separate reimplementation of the papers' equations and the authors' released formulas, on fixed
seeded float64 inputs. A change in the value of any term fails here; so does a change of the
reimplementation (it must still reproduce the stored numbers), so neither side drifts alone.
The project's functions are reached only through their public names in ``kd``.

CKD's official pair term divides its KL sum by ``Σ_seq (#real)²``: the released ``loss.py``
(``WR_Dist``, ``LTR_Dist``) divides ``kl_div(reduction="sum")`` by the sum of the outer product of
the attention mask, i.e. real pairs *including* ``i = j``. Dividing by the pairs with ``i ≠ j``
would give 0.01778 instead of the stored 0.01456 (word relation) and 0.01864 instead
of 0.01243 (layer relation).
"""

from __future__ import annotations

import json

import pytest
import torch

import kd
from tests.reference_terms import (
    FIXTURE,
    REFERENCE,
    SEED,
    SHAPES,
    case_arguments,
    case_name,
    golden_cases,
    golden_inputs,
    golden_values,
    input_checksums,
)

STORED = json.loads(FIXTURE.read_text())
CASES = golden_cases()

PROJECT = {
    "task": kd.task_loss,
    "logit_kd": kd.logit_kd_loss,
    "patient": kd.patient_loss,
    "word_relation": kd.word_relation_loss,
    "layer_relation": kd.layer_relation_loss,
    "attribution": kd.attribution_loss,
    "gradient_alignment": kd.gradient_alignment_loss,
}

# Both sides compute in float64 along different paths (Gram matrices and bands against loops):
# they agree to rounding (4e-16 relative at worst when written), far inside any change of formula.
TOLERANCE = {"rel": 1e-12, "abs": 1e-15}


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    return golden_inputs()


def test_the_fixture_describes_the_inputs_it_was_made_from(inputs):
    assert (STORED["seed"], STORED["shapes"], STORED["dtype"]) == (SEED, SHAPES, "float64")
    # A different random stream (another torch version) would change every value below: name it.
    checksums = input_checksums(inputs)
    assert checksums.keys() == STORED["inputs"].keys()
    for name, stored in STORED["inputs"].items():
        assert checksums[name] == pytest.approx(stored, rel=1e-12), f"input {name} changed"
    assert sorted(STORED["values"]) == sorted(case_name(case) for case in CASES)


def test_every_term_and_form_has_a_stored_value():
    assert {case["term"] for case in CASES} == set(PROJECT) == set(REFERENCE)
    forms = {
        (case["term"], option)
        for case in CASES
        for key, option in case["options"].items()
        if key in ("form", "reduction", "variant", "pair_kind")
    }
    expected = {("logit_kd", form) for form in ("kl", "soft-ce", "kl-mean")}
    expected |= {("patient", "paper"), ("patient", "official")}
    expected |= {("attribution", r) for r in ("paper", "squared", "official")}
    for term in ("word_relation", "layer_relation"):
        expected |= {(term, option) for option in ("paper", "official", "cosine", "l2", "l2_mean")}
    assert forms == expected


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_project_term_matches_the_stored_reference(case, inputs):
    value = PROJECT[case["term"]](*case_arguments(case, inputs), **case["options"])
    assert value.dtype == torch.float64
    assert float(value) == pytest.approx(STORED["values"][case_name(case)], **TOLERANCE)


def test_reimplementation_still_reproduces_the_stored_values():
    fresh = golden_values()
    assert fresh["values"].keys() == STORED["values"].keys()
    for name, value in fresh["values"].items():
        assert value == pytest.approx(STORED["values"][name], rel=1e-12, abs=1e-15), name


def _case(term: str, **options) -> dict:
    return next(c for c in CASES if c["term"] == term and options.items() <= c["options"].items())


def test_the_tolerance_tells_forms_and_small_changes_apart(inputs):
    """The other KD forms, and a 1e-6 relative change of the student's states, each move the
    value far outside the tolerance: the comparison above can fail."""
    case = _case("logit_kd", form="kl")
    student, teacher, tau = case_arguments(case, inputs)
    for form in ("soft-ce", "kl-mean"):
        other = float(kd.logit_kd_loss(student, teacher, tau, form=form))
        assert other != pytest.approx(STORED["values"][case_name(case)], **TOLERANCE)
    case = _case("word_relation", pair_kind="cosine", variant="paper", triple_weight=0.0)
    student, teacher, mask = case_arguments(case, inputs)
    scaled = student * (1 + 1e-6 * torch.arange(SHAPES["width"], dtype=torch.float64))
    moved = float(kd.word_relation_loss(scaled, teacher, mask, **case["options"]))
    assert moved != pytest.approx(STORED["values"][case_name(case)], **TOLERANCE)

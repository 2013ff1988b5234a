"""Controls: each method's objective with its own terms at weight 0 and everything else — the
other weights, τ, the KD form, the student set-up — kept, generated from its registration."""

from __future__ import annotations

import json

import pytest

from kd.methods.config import ObjectiveConfig
from kd.methods.gkd import gradient_kd
from kd.methods.objective import METHODS, PRESETS, TERMS, Objective, control
from workbench.core.config import to_dict

OWN = {  # what each method's control goes without: its preset's own terms, as registered
    name: set(preset.own) for name, preset in PRESETS.items() if preset.own
}


def _resolve(config: ObjectiveConfig) -> Objective:
    return Objective.resolve(config, teacher_layers=6, student_layers=3, num_labels=3)


@pytest.mark.parametrize("parity", ["paper", "official"])
@pytest.mark.parametrize("preset", sorted(OWN))
def test_a_controls_record_differs_from_its_methods_in_the_own_weights_alone(preset, parity):
    method = ObjectiveConfig(preset=preset, parity=parity, temperature=3.0)
    ours = control(method)
    changed = {k for k, v in to_dict(ours).items() if to_dict(method).get(k) != v}
    assert changed <= {"weights", "gradient_regime"}
    full, controlled = _resolve(method), _resolve(ours)
    assert set(full.weights) - set(controlled.weights) == OWN[preset]
    assert {k: w for k, w in full.weights.items() if k not in OWN[preset]} == controlled.weights
    assert gradient_kd(controlled) == gradient_kd(full)  # GKD's set-up stays without its term
    then, now = full.record(), controlled.record()
    own_settings = {  # the settings only the own terms' methods record
        key
        for entry in METHODS.values()
        if entry.terms & OWN[preset] and not entry.terms & set(controlled.weights)
        for key in entry.record(full)
    }
    assert set(now) <= set(then) and set(then) - set(now) <= own_settings
    for key in set(now) - {"weights"}:
        assert json.dumps(now[key]) == json.dumps(then[key]), key


def test_vanilla_kd_is_its_own_control_and_every_other_method_declares_its_own_terms():
    kd = ObjectiveConfig(preset="kd")
    assert control(kd) == kd
    for name, preset in PRESETS.items():
        weighted = {term for term, weight in preset.paper.items() if weight}
        if weighted - {"ce", "kd"}:  # a method beyond vanilla KD: its control goes without
            assert preset.own and set(preset.own) <= weighted & set(TERMS), name


def test_the_gradient_regime_is_a_setting_of_its_own():
    gkd = _resolve(ObjectiveConfig(preset="gkd"))
    plain = _resolve(ObjectiveConfig(preset="gkd", weights={"ce": 0.5, "kd": 0.5}))
    pinned = _resolve(
        ObjectiveConfig(preset="gkd", weights={"ce": 0.5, "kd": 0.5}).with_settings(
            gradient_regime=True
        )
    )
    off = _resolve(ObjectiveConfig(preset="gkd").with_settings(gradient_regime=False))
    assert (gradient_kd(gkd), gradient_kd(plain), gradient_kd(pinned), gradient_kd(off)) == (
        True,
        False,
        True,
        False,
    )
    assert pinned.record()["student_dropout"] is False and "student_dropout" not in plain.record()
    assert control(ObjectiveConfig(preset="gkd")).weights == {"ce": 0.5, "kd": 0.5, "grad": 0.0}

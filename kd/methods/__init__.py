"""The distillation methods, one module each, reading top to bottom like its paper: the loss
functions (pure functions of tensors), the settings the method resolves, the teacher fields,
the terms, and the presets (with all the workbench says or does about the method: its
name, paper, tune space, ablations and the claims the reproduction report checks).

- :mod:`~kd.methods.vanilla` — CE and logit KD (Hinton et al. 2015); presets ``finetune``, ``kd``;
- :mod:`~kd.methods.pkd` — Patient KD (Sun et al. 2019); ``pkd-skip``, ``pkd-last``;
- :mod:`~kd.methods.ckd` — Contextual KD (Park et al. 2021); ``ckd``;
- :mod:`~kd.methods.adkd` — Attribution-Driven KD (Wu et al. 2023); ``adkd``;
- :mod:`~kd.methods.gkd` — Gradient KD (Wang et al. 2022); ``gkd``, ``gkd-cls``.

Adding a method is one new module registered here: see ``docs/adding-a-method.md``.
"""

# isort: off
# the order of registration is the order of the report's tables and of the lists in help texts
from kd.methods import vanilla, pkd, ckd, adkd, gkd
# isort: on

__all__ = ["adkd", "ckd", "gkd", "pkd", "vanilla"]

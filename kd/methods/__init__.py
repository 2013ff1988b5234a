"""The distillation methods, one module each, reading top to bottom like its paper: its settings
(a dataclass whose fields are the objective's options on the command line, in the app, in
``--config`` files and in run records), the loss functions (pure functions of tensors), how the
method resolves its settings, the teacher fields, the terms, its set-up of the student, and the
presets (with all the workbench says or does about the method: its name, paper, tune space,
ablations and the claims the reproduction report checks), all registered by the module's one
:func:`~kd.methods.objective.register_method` call.
A method module binds torch and the modules built on it lazily
(:func:`~workbench.core.lazy.lazy_module`): importing the methods registers their settings, and
``kdw``'s parser its options, without loading torch.

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

"""Loss terms for distillation: pure functions of tensors, one module per term."""

"""Training students and teachers: the trainer and its diagnostics, tracking, data
parallelism, the pipeline that runs a training from its configs, evaluation of run folders and
the demo. It imports neither the experiments nor the front ends."""

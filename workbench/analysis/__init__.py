"""Analysis: attribution (attribution/), loyalty over a split (loyalty), agreement, faithfulness
and its report, layer geometry, metrics, evaluation, paired statistics, heatmaps of runs (the
examples they explain, explanations, explanation_agreement, heatmap_export), the baseline,
divergence, the benchmark and deployment. It imports neither distillation (kd) nor the front
ends."""

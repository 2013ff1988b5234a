"""Attribution: Integrated Gradients, Grad saliency and GKD input gradients (own batched,
differentiable engine; Captum for the analysis paths), maps, caches and saved records."""

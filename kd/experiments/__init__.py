"""Experiments over many trainings: the hyper-parameter search (tune) and the papers'
reproduction suite (reproduce/). It imports neither the CLI nor the app."""

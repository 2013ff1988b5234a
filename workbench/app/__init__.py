"""The Streamlit app (``streamlit run app.py``): one module per page — Case study, Layer geometry,
Loyalty, Train, Export — with what they share in :mod:`workbench.app.common`, the first-run demo
build in :mod:`workbench.app.first_run` and background trainings in :mod:`workbench.app.jobs`."""

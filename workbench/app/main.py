"""The workbench's entry script: the page set-up, the sidebar and the navigation, which each
browser session runs. The server that runs it is an ``st.App`` (:mod:`workbench.app.server` for
``kdw app``, the repository's ``app.py`` for ``streamlit run app.py``), which starts the demo
build at launch (:mod:`workbench.app.launch`). The pages are found beside this file, wherever
it is installed."""

from pathlib import Path

import streamlit as st

from workbench.app.common import runs_sidebar
from workbench.app.first_run import first_run_panel

HERE = Path(__file__).resolve().parent
PAGES = (  # file, title, URL path (the first is the default page)
    ("case_study.py", "Case study", None),
    ("geometry.py", "Layer geometry", "geometry"),
    ("loyalty.py", "Loyalty", "loyalty"),
    ("compression.py", "Compression", "compression"),
    ("divergence.py", "Where explanations diverge", "divergence"),
    ("explainers.py", "Which explainer to trust", "explainers"),
    ("train.py", "Train", "train"),
    ("exports.py", "Export", "export"),
)


def main() -> None:
    """Draw the app's frame and run the page the user is on."""
    st.set_page_config(page_title="kd-workbench", page_icon="🔎", layout="wide")
    first_run_panel()
    runs_sidebar()
    pages = [
        st.Page(HERE / name, title=title, url_path=path, default=path is None)
        for name, title, path in PAGES
    ]
    st.navigation(pages).run()


if __name__ == "__main__":
    main()

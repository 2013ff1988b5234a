"""kd-workbench's app: `streamlit run app.py`. The pages live in workbench/app/, one module each."""

import streamlit as st

from workbench.app.common import runs_sidebar
from workbench.app.first_run import first_run_panel

st.set_page_config(page_title="kd-workbench", page_icon="🔎", layout="wide")
first_run_panel()
runs_sidebar()
st.navigation(
    [
        st.Page("workbench/app/case_study.py", title="Case study", default=True),
        st.Page("workbench/app/geometry.py", title="Layer geometry", url_path="geometry"),
        st.Page("workbench/app/loyalty.py", title="Loyalty", url_path="loyalty"),
        st.Page(
            "workbench/app/divergence.py",
            title="Where explanations diverge",
            url_path="divergence",
        ),
        st.Page("workbench/app/train.py", title="Train", url_path="train"),
        st.Page("workbench/app/exports.py", title="Export", url_path="export"),
    ]
).run()

"""kd-workbench's app for `streamlit run app.py` in a clone (installed: `kdw app`): the pages of
workbench/app/main.py, with the demo build started at launch."""

import streamlit as st

from workbench.app.launch import ENTRY, at_launch

app = st.App(ENTRY, lifespan=at_launch)

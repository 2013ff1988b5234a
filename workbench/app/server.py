"""The workbench's server as ``kdw app`` runs it from the installed package (``streamlit run``
on this file): the pages of :mod:`workbench.app.main`, with the demo build started at launch.
The repository's ``app.py`` is the same for ``streamlit run app.py``."""

import streamlit as st

from workbench.app.launch import ENTRY, at_launch

app = st.App(ENTRY, lifespan=at_launch)

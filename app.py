"""kd-workbench's app for `streamlit run app.py` in a clone (installed: `kdw app`)."""

from workbench.app.main import main

main()

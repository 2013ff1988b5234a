"""The workbench's analysis side, one subpackage per layer: the foundation (:mod:`workbench.core`:
settings, models, data, run folders), heatmap files (:mod:`workbench.export`), the analysis
(:mod:`workbench.analysis`: attribution, loyalty, faithfulness, geometry, metrics, deployment)
and the Streamlit app (:mod:`workbench.app`). docs/architecture.md draws the layers."""

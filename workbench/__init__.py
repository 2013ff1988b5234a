"""Analysis side of the workbench: models, data, attribution, geometry, metrics, exports, runs."""

"""Export: token heatmaps of one or many examples under one or many models, as SVG, PDF, PNG (at
a chosen DPI), LaTeX and standalone HTML, through :mod:`workbench.analysis.heatmap_export` — the
same code as ``kdw export``. Every file embeds the settings, model names and run ids; the default
colour maps are colour-blind safe and every file has a legend."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import streamlit as st
import streamlit.components.v1 as components

from workbench.analysis.heatmap_export import (
    FORMAT_CHOICES,
    ExportSettings,
    build_heatmaps,
    export_notes,
    write_heatmaps,
)
from workbench.app import common
from workbench.app.catalog import CACHE, same_folder
from workbench.app.forms import config_widgets
from workbench.core.errors import WorkbenchError
from workbench.export import to_html

KEY = "export"
SOURCES = ("Type texts", "Pick from a split", "Upload a file")


def _formats(label: str, default: Any, help_text: str, key: str) -> str:
    chosen = st.multiselect(
        label, FORMAT_CHOICES, default=default.split(","), help=help_text, key=key
    )
    return ",".join(chosen)


def _examples(teacher, pair: bool):
    source = st.radio("Examples", SOURCES, horizontal=True, key=f"{KEY}.source")
    if source == SOURCES[0]:
        return common.typed_examples(KEY, pair, many=True)
    if source == SOURCES[2]:
        return common.uploaded_examples(KEY)
    frame = common.split_frame(teacher, common.split_choice(KEY))
    rows = common.selected_rows(frame[["text", "label"]], f"{KEY}.table", "multi-row", height=220)
    return common.frame_examples(frame.iloc[rows])


def zipped(paths: list[Path]) -> bytes:
    """The files in one zip archive, by name."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            archive.write(path, path.name)
    return buffer.getvalue()


def render() -> None:
    st.title("Export")
    entries = common.runs()
    usable = {e.name: e for e in entries if e.usable and e.kind != CACHE}  # caches: no weights
    if not usable:
        st.info("No trained runs yet.")
        return
    teacher = next((e for e in usable.values() if e.kind == "teacher"), None)
    default = [teacher.name] if teacher else []
    for name, entry in usable.items():  # with its own students
        if teacher and entry.kind == "student" and same_folder(entry.teacher, teacher.path):
            default.append(name)
    chosen = st.multiselect(
        "Models (one heatmap row each)", list(usable), default=default, key=f"{KEY}.models"
    )
    if not chosen:
        return
    loaded = common.load_models([usable[name] for name in chosen])
    if loaded is None:
        return
    spec = loaded[0].spec
    if any(run.spec.label_names != spec.label_names for run in loaded):
        st.error("Choose models of one task: their classes differ.")
        return
    examples = _examples(loaded[0], spec.pair)
    explaining = common.heatmap_settings(f"{KEY}.settings", spec.label_names)
    export_settings = config_widgets(
        ExportSettings, f"{KEY}.files", overrides={"formats": _formats}, columns=2
    )
    if not examples:
        st.caption("No examples yet.")
        return
    try:
        heatmaps = build_heatmaps(
            loaded,
            examples,
            explaining.settings,
            chosen,
            explainer=explaining.explainer,
            words=explaining.words,
            anonymous=export_settings.anonymous,
        )
        for note in export_notes(heatmaps, export_settings):
            st.warning(common.plain(note))
        options = export_settings.options()
        st.caption(f"Preview of 1 of {len(heatmaps)} heatmap(s), as the HTML export:")
        height = 220 + 55 * len(heatmaps[0].rows) + 26 * (len(heatmaps[0].metadata) + 7)
        components.html(to_html(heatmaps[0], options), height=min(height, 1000), scrolling=True)
        if st.button("Export", type="primary", key=f"{KEY}.go"):
            with tempfile.TemporaryDirectory() as folder:
                paths = write_heatmaps(heatmaps, folder, export_settings)
                st.session_state[f"{KEY}.archive"] = (zipped(paths), [p.name for p in paths])
    except (WorkbenchError, ValueError) as error:
        st.error(common.plain(error))
        return
    if f"{KEY}.archive" in st.session_state:
        archive, names = st.session_state[f"{KEY}.archive"]
        st.download_button(
            f"Download {len(names)} files (zip)",
            archive,
            "heatmaps.zip",
            "application/zip",
            key=f"{KEY}.download",
        )
        st.text(", ".join(names))


if __name__ == "__main__":
    common.run_page(render)

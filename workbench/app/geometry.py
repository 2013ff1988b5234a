"""Layer geometry: for one input, the word-relation matrices (pairwise distances, windowed
angles) of a student layer and of the teacher layer it learns from, side by side; the
layer-transforming relation of one token across layers; and the layer mapping as a diagram. A
teacher that is only a cache has no states to show: the student's are shown alone."""

from __future__ import annotations

import json
import zlib

import streamlit as st
from torch import Tensor

from kd.methods.layer_map import select_layers
from kd.methods.objective import METHODS
from workbench.analysis.loyalty import hidden_states
from workbench.analysis.relation_geometry import (
    dense_angles,
    pairwise_distance_relation,
    windowed_angle_relation,
)
from workbench.app import common
from workbench.app.figures import layer_mapping_figure, relation_heatmaps
from workbench.core.errors import WorkbenchError
from workbench.core.models import LoadedModel, layer_count

KEY = "geometry"
PAIR_KINDS = {
    "cosine distance": "cosine",
    "Euclidean distance": "l2",
    "Euclidean / mean": "l2_mean",
}


def layer_mapping(teacher: LoadedModel, student: LoadedModel) -> tuple[list[tuple[int, int]], str]:
    """``(student layer, teacher layer)`` pairs, as ``hidden_states`` indices (0 = embeddings),
    that the student's method matches, and how they were chosen: from the run's resolved
    record."""
    n, m = layer_count(teacher.model), layer_count(student.model)
    info = student.run.info()
    configs, record = info.configs, info.resolved.objective
    for entry in METHODS.values():  # the methods that match layers name their pairs' key
        pairs = getattr(record, entry.layer_pairs, None) if entry.layer_pairs else None
        if pairs:
            return [tuple(p) for p in pairs], entry.mapping.format(method=info.method)
    student_config = configs["student"]
    if student_config.get("init") == "cut":
        kept = select_layers(n, m, student_config.get("layers", "skip"))
        return (
            [(0, 0)] + [(j + 1, t + 1) for j, t in enumerate(kept)],
            f"no layer term: the teacher layers the student was cut from "
            f"({student_config.get('layers')})",
        )
    step = n / m
    return (
        [(j, round(j * step)) for j in range(m + 1)],
        "no layer term: proportional positions shown",
    )


def _relations(
    model_states: dict[str, Tensor],
    chosen: tuple[int, int],
    kind: str,
    token: int,
    labels: list[str],
) -> None:
    """The word relations (pairwise distances of ``kind``, angles around ``token``) of the
    layer pair ``chosen`` (student, teacher), and the layer-transforming relation of ``token``,
    from each model's hidden states ``[layers + 1, tokens, hidden]``."""
    layer = dict(zip(("student", "teacher"), chosen, strict=True))
    states = [(f"{n} layer {layer[n]}", h[layer[n]]) for n, h in model_states.items()]

    def distances(h: Tensor) -> Tensor:  # [n, hidden] -> [n, n]
        return pairwise_distance_relation(h[None], kind=kind)[0][0]

    def angles(h: Tensor) -> Tensor:  # [tokens, hidden] -> [tokens, tokens] around the token
        banded, valid = windowed_angle_relation(h[None])
        return dense_angles(banded[0], valid[0], token)

    st.subheader("Word relation: pairwise distances")
    st.plotly_chart(
        relation_heatmaps([(distances(h), labels, t) for t, h in states], "token", "Oranges"),
        key=f"{KEY}.distances",
    )
    st.subheader(f"Word relation: angles around token {common.plain(labels[token])}")
    st.caption(
        "cos∠(r_j − r_i, r_k − r_i) for tokens j, k in the window around i; blank outside "
        "the window."
    )
    st.plotly_chart(
        relation_heatmaps(
            [(angles(h), labels, t) for t, h in states],
            "token",
            "PuOr_r",
            zrange=(-1.0, 1.0),
            blank="(outside the window)",
        ),
        key=f"{KEY}.angles",
    )
    st.subheader(f"Layer-transforming relation of token {common.plain(labels[token])}")
    st.plotly_chart(
        relation_heatmaps(
            [
                (distances(h[:, token]), [f"L{i}" for i in range(len(h))], f"{n}, across layers")
                for n, h in model_states.items()
            ],
            "layer",
            "Oranges",
        ),
        key=f"{KEY}.layers",
    )


def render() -> None:
    st.title("Layer geometry")
    picked = common.pick_models(common.runs(), KEY, single_student=True)
    if picked is None or not picked[1]:
        return
    loaded = common.load_models([picked[0], picked[1][0]])
    if loaded is None:
        return
    teacher, student = loaded
    weightless = common.weightless(
        picked[0], "its hidden states need them: the student's relations are shown alone"
    )
    examples = common.typed_examples(KEY, teacher.spec.pair)
    if not examples:
        return
    try:
        pairs, how = layer_mapping(teacher, student)
    except WorkbenchError as error:
        st.error(common.plain(f"{picked[1][0].name}: {error}"))
        return
    shown = {"student": student} if weightless else {"teacher": teacher, "student": student}
    read = {name: hidden_states(model, examples[0]) for name, model in shown.items()}
    tokens = next(iter(read.values()))[0]
    model_states = {name: states for name, (_, states) in read.items()}
    names = [f"S{s} ← T{t}" for s, t in pairs]
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    diagram, choices = st.columns([1, 3])
    with choices:
        chosen = pairs[
            names.index(st.selectbox("Layer pair", names, index=len(names) - 1, key=f"{KEY}.pair"))
        ]
        kind = st.selectbox("Pair relation", list(PAIR_KINDS), key=f"{KEY}.kind")
        token = st.selectbox(
            "Token (angles, across layers)",
            range(len(tokens)),
            format_func=labels.__getitem__,
            index=min(1, len(tokens) - 1),
            key=f"{KEY}.token.{zlib.crc32(json.dumps(tokens).encode())}",  # anew for a new text
        )
        st.caption(common.plain(f"Layer mapping: {how}. Layer 0 is the embedding output."))
    with diagram:
        st.plotly_chart(
            layer_mapping_figure(
                pairs, layer_count(teacher.model), layer_count(student.model), chosen
            ),
            key=f"{KEY}.mapping",
        )

    _relations(model_states, chosen, PAIR_KINDS[kind], token, labels)


if __name__ == "__main__":
    common.run_page(render)

"""Reliability diagrams per block position: is predicted survival the observed survival?

One panel per position j: the 15 ECE bins' mean predicted survival (x) against
the observed rate of "the first j+1 drafts accepted" (y), for the survival the
scheduler used and, where the run recorded raw logits, for the raw confidence
before STS. Points on the diagonal (drawn, y = x) are calibrated; marker area
follows the bin's share of the position's rows, with a key of sizes beside the
legend. The axes run a little past 0 and 1, so the bins at the corners, often
the largest, show whole.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D

from ...calibration import CalibrationAccumulator
from ...numbers import number, percent
from ...palette import INK, MUTED
from ...plotting import legend_outside, new_figure

STAGE_LABELS = {"survival": "as used (after STS)", "raw": "raw (before STS)"}

#: Stages are not workloads: they draw in neutral tones (`palette`).
STAGE_COLOURS = {"survival": INK, "raw": MUTED}

#: A bin's marker area (points²): `BASE_AREA` plus `AREA` times its share of the rows.
BASE_AREA, AREA = 8, 200

#: The shares of rows the size key shows.
SIZE_KEY = (0.01, 0.1, 0.5)

#: How far past [0, 1] the axes run, so markers at the corners are not cut.
MARGIN = 0.05

PERFECT = "perfect calibration (y = x)"
SIZE_TITLE = "marker area: share of\nthe position's rows"


def _area(share):
    return BASE_AREA + AREA * share


def reliability_figure(label: str, stages: dict[str, CalibrationAccumulator]):
    """Grid of per-position reliability diagrams; `stages` maps stage name to pooled histograms."""
    gamma = next(iter(stages.values())).gamma
    cols = min(4, gamma)
    rows = math.ceil(gamma / cols)
    fig = new_figure(3.2 * cols + 0.6, 3.1 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    metrics = {stage: acc.compute() for stage, acc in stages.items()}
    curves = {stage: acc.reliability() for stage, acc in stages.items()}
    for j, ax in enumerate(axes):
        if j >= gamma:
            ax.set_visible(False)
            continue
        ax.plot([0, 1], [0, 1], color="black", lw=0.9, ls=":", label=PERFECT)
        eces = []
        for stage in stages:
            c = curves[stage][j]
            total = max(1, int(c["count"].sum()))
            keep = c["count"] > 0
            ax.plot(
                c["pred_mean"][keep],
                c["target_mean"][keep],
                color=STAGE_COLOURS.get(stage, INK),
                ls="-" if stage == "survival" else "--",
                lw=1.2,
                label=STAGE_LABELS.get(stage, stage),
            )
            ax.scatter(
                c["pred_mean"][keep],
                c["target_mean"][keep],
                s=_area(c["count"][keep] / total),
                color=STAGE_COLOURS.get(stage, INK),
                alpha=0.6,
            )
            eces.append(number(metrics[stage][j]["ece"], 3))
        ax.set_xlim(-MARGIN, 1 + MARGIN)
        ax.set_ylim(-MARGIN, 1 + MARGIN)
        ax.set_title(f"position {j}: ECE {' / '.join(eces)}", fontsize=9)
        ax.set_xlabel("predicted survival", fontsize=8)
        ax.set_ylabel("observed survival", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    legend_outside(fig, *axes[0].get_legend_handles_labels(), title="predicted survival")
    sizes = [
        Line2D([], [], ls="", marker="o", color=MUTED, alpha=0.6, markersize=math.sqrt(_area(s)))
        for s in SIZE_KEY
    ]
    legend_outside(fig, sizes, [percent(s, 0) for s in SIZE_KEY], title=SIZE_TITLE, where="lower")
    order = " / ".join(STAGE_LABELS.get(s, s) for s in stages)
    fig.suptitle(f"{label}: reliability per block position (ECE {order})", fontsize=11)
    return fig


def ece_figure(label: str, stages: dict[str, CalibrationAccumulator]):
    """ECE per position for each stage, side by side."""
    fig = new_figure(7.0, 4.0)
    ax = fig.add_subplot()
    gamma = next(iter(stages.values())).gamma
    width = 0.8 / len(stages)
    x = np.arange(gamma)
    for k, (stage, acc) in enumerate(stages.items()):
        ece = [m["ece"] for m in acc.compute()]
        ax.bar(
            x + (k - (len(stages) - 1) / 2) * width,
            ece,
            width,
            color=STAGE_COLOURS.get(stage, INK),
            label=STAGE_LABELS.get(stage, stage),
        )
    ax.set_xticks(x)
    ax.set_xlabel("block position")
    ax.set_ylabel("ECE (15 bins)")
    ax.set_title(f"{label}: calibration error per position")
    legend_outside(ax, title="predicted survival")
    ax.grid(axis="y", alpha=0.3)
    return fig

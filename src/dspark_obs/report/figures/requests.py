"""Per-request drill-down: who lost the most to trimming, and how their windows moved.

Each request draws in its workload's `palette` colour. A trace shows one bar per
decode step, so no quantity hides another: the light bar is the window, the solid
bar inside it what was accepted. Where the window was trimmed (fully accepted and
shorter than gamma) a black dash as wide as the bar marks the ceiling; a dash above
the light bar is a block trimming cut short. Elsewhere the ceiling is what was
accepted, so it gets no dash. The legend says where the dashes come from: what full
verification accepts (observed, or a cap-accept shadow's) or, without either, the
tail walk's estimate.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ...palette import INK, bar_style, legend_style, workload_name
from ...plotting import legend_outside, new_figure

_WINDOW, _ACCEPTED = "window (verified)", "accepted"
_CEILING = {
    True: "ceiling where trimmed (what full verification accepts)",
    False: "ceiling where trimmed (the tail walk's estimate)",
}
#: A dash spans this share of its step, as the window bar does.
_DASH_WIDTH = 0.9
_DASH = {"colors": INK, "lw": 2.0, "zorder": 3}


def top_requests_figure(label: str, top: pl.DataFrame, palette: dict):
    """Horizontal bars: trim loss (tokens) of the top requests, coloured by workload."""
    fig = new_figure(9.0, 1.2 + 0.32 * max(1, top.height))
    ax = fig.add_subplot()
    y = np.arange(top.height)[::-1]
    loss = top["trim_loss"].to_numpy()
    for yi, value, name in zip(y, loss, top["workload"].to_list(), strict=True):
        ax.barh(yi, value, color=palette[name], label=workload_name(name), gid=f"workload={name}")
    ax.set_yticks(y, top["rid"].to_list(), fontsize=8)
    ax.set_xlabel("trim loss (drafted tokens full verification would have accepted)")
    ax.set_ylabel("request id")
    ax.set_title(f"{label}: requests with the largest trim loss")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    legend_outside(ax, list(seen.values()), list(seen), title="workload")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _bars(ax, x: np.ndarray, heights: np.ndarray, width: float, **style) -> PolyCollection:
    """`Axes.bar` as one collection of rectangles: `bar` makes a patch per bar, which on a
    request of a hundred steps made this the report's slowest figure to draw."""
    left, right, zero = x - width / 2, x + width / 2, np.zeros(len(x))
    corners = [(left, zero), (left, heights), (right, heights), (right, zero)]
    bars = PolyCollection(np.stack([np.column_stack(c) for c in corners], axis=1), **style)
    ax.add_collection(bars)
    return bars


def traces_figure(
    label: str, traces: pl.DataFrame, rids: list[str], palette: dict, gamma: int, observed: bool
):
    """Per request, one panel: window, accepted and (where trimmed) ceiling at every step.

    `observed`: the run's ceilings are observed or a shadow's, not the walk's estimates.
    """
    fig = new_figure(11.0, 2.5 * len(rids) + 0.6)
    axes = fig.subplots(len(rids), 1, squeeze=False)[:, 0]
    ceiling_label, dashed = _CEILING[observed], False
    for ax, rid in zip(axes, rids, strict=True):
        part = traces.filter(pl.col("rid") == rid)
        name = part["workload"][0] if part.height else None
        colour = palette[name]
        step = np.arange(part.height)
        window = part["window"].to_numpy()
        tag = f"workload={name}"
        _bars(ax, step, window, 0.9, label=_WINDOW, gid=tag, **bar_style("window", colour))
        accepted = part["correct_drafts"].to_numpy()
        _bars(ax, step, accepted, 0.5, label=_ACCEPTED, gid=tag, **bar_style("accepted", colour))
        ceiling = part["ceiling_best"].to_numpy().astype(float)
        trimmed = (accepted == window) & (window < gamma) & ~np.isnan(ceiling)
        if trimmed.any():
            dashed = True
            half = _DASH_WIDTH / 2
            at = step[trimmed]
            ax.hlines(ceiling[trimmed], at - half, at + half, label=ceiling_label, **_DASH)
        ax.set_xlim(-0.6, max(part.height, 1) - 0.4)
        ax.set_ylim(0, gamma + 0.6)
        ax.set_title(f"{rid} ({workload_name(name)})", fontsize=9, color=colour, loc="left")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("decode step of the request")
        ax.set_ylabel("drafted tokens")
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(**legend_style("window")), Patch(**legend_style("accepted"))]
    labels = [_WINDOW, _ACCEPTED]
    if dashed:
        handles.append(Line2D([], [], color=INK, lw=_DASH["lw"]))
        labels.append(ceiling_label)
    legend_outside(fig, handles, labels, title="per step (colour: workload)")
    fig.suptitle(f"{label}: windows of the {len(rids)} requests that lost the most", fontsize=11)
    return fig

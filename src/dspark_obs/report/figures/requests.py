"""Per-request drill-down: who lost the most to trimming, and how their windows moved.

Each request draws in its workload's `palette` colour. A trace shows one bar per
decode step, so no quantity hides another: the light bar is the window, the solid
bar inside it what was accepted, and a black tick the ceiling; a tick above the
light bar is a block trimming cut short.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ...palette import INK, bar_style, legend_style, workload_name
from ...plotting import legend_outside, new_figure

_WINDOW, _ACCEPTED = "window (verified)", "accepted"
_CEILING = "ceiling (what full verification accepts)"
_TICK = {"marker": "_", "color": INK, "ms": 7, "mew": 2}


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


def traces_figure(label: str, traces: pl.DataFrame, rids: list[str], palette: dict):
    """Per request, one panel: window, accepted and ceiling at every step, in decode order."""
    fig = new_figure(11.0, 2.5 * len(rids) + 0.6)
    axes = fig.subplots(len(rids), 1, squeeze=False)[:, 0]
    gamma, any_ceiling = 0, False
    for ax, rid in zip(axes, rids, strict=True):
        part = traces.filter(pl.col("rid") == rid)
        name = part["workload"][0] if part.height else None
        colour = palette[name]
        step = np.arange(part.height)
        window = part["window"].to_numpy()
        gamma = max(gamma, int(np.nanmax(window, initial=0)))
        tag = f"workload={name}"
        ax.bar(step, window, 0.9, label=_WINDOW, gid=tag, **bar_style("window", colour))
        accepted = part["correct_drafts"].to_numpy()
        ax.bar(step, accepted, 0.5, label=_ACCEPTED, gid=tag, **bar_style("accepted", colour))
        ceiling = part["ceiling_best"].to_numpy().astype(float)
        known = ~np.isnan(ceiling)
        if known.any():
            any_ceiling = True
            ax.plot(step[known], ceiling[known], ls="", label=_CEILING, zorder=3, **_TICK)
        ax.set_xlim(-0.6, max(part.height, 1) - 0.4)
        ax.set_title(f"{rid} ({workload_name(name)})", fontsize=9, color=colour, loc="left")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("decode step of the request")
        ax.set_ylabel("drafted tokens")
        ax.grid(axis="y", alpha=0.3)
    for ax in axes:
        ax.set_ylim(0, gamma + 0.6)
    handles = [Patch(**legend_style("window")), Patch(**legend_style("accepted"))]
    labels = [_WINDOW, _ACCEPTED]
    if any_ceiling:
        handles.append(Line2D([], [], ls="", **_TICK))
        labels.append(_CEILING)
    legend_outside(fig, handles, labels, title="per step (colour: workload)")
    fig.suptitle(f"{label}: windows of the requests that lost the most", fontsize=11)
    return fig

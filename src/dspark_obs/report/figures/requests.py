"""Per-request drill-down: who lost the most to trimming, and how their windows moved."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ...plotting import colour, new_figure


def top_requests_figure(label: str, top: pl.DataFrame):
    """Horizontal bars: trim loss (tokens) of the top requests, coloured by workload."""
    fig = new_figure(8.0, 1.2 + 0.32 * max(1, top.height))
    ax = fig.add_subplot()
    names = top["workload"].unique(maintain_order=True).to_list()
    y = np.arange(top.height)[::-1]
    colours = [colour(names.index(w)) for w in top["workload"].to_list()]
    ax.barh(y, top["trim_loss"].to_numpy(), color=colours)
    ax.set_yticks(y, top["rid"].to_list(), fontsize=8)
    for k, name in enumerate(names):
        ax.bar(0, 0, color=colour(k), label=name or "(none)")
    ax.set_xlabel("trim loss (drafted tokens full verification would have accepted)")
    ax.set_title(f"{label}: requests with the largest trim loss")
    ax.legend(title="workload", fontsize=8, title_fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def traces_figure(label: str, traces: pl.DataFrame, rids: list[str]):
    """Per request: window, accepted and ceiling at every step, in decode order."""
    cols = 2 if len(rids) > 1 else 1
    rows = math.ceil(len(rids) / cols)
    fig = new_figure(6.0 * cols, 3.0 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, rid in zip(axes, rids, strict=False):
        part = traces.filter(pl.col("rid") == rid)
        step = np.arange(part.height)
        ax.step(step, part["window"].to_numpy(), where="mid", color=colour(0), label="window")
        ax.step(
            step, part["correct_drafts"].to_numpy(), where="mid", color=colour(2), label="accepted"
        )
        ax.plot(step, part["ceiling_best"].to_numpy(), ".", color=colour(1), ms=4, label="ceiling")
        workload = part["workload"][0] if part.height else None
        ax.set_title(f"{rid} ({workload})", fontsize=9)
        ax.set_xlabel("decode step of the request")
        ax.set_ylabel("drafted tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncols=3)
    for ax in axes[len(rids) :]:
        ax.set_visible(False)
    fig.suptitle(f"{label}: windows of the requests that lost the most", fontsize=11)
    return fig

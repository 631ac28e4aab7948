"""Ceiling-estimator figures: estimates against the shadow twin's truth, and survival curves.

Built from the `dspark-obs estimate` object (`estimator.evaluate.evaluate`).
Where the run has no truth (no shadow, compact mode) only the estimates are
drawn and the titles say so. Each workload draws in its `palette` colour; the
estimate is told by the bar's fill or the line's style, shown in grey in the legend.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ...palette import MUTED, bar_style, legend_style, workload_name
from ...plotting import legend_outside, new_figure

#: (palette bar style, legend label) of the estimates figure, in bar order.
_ESTIMATES = (
    ("ceiling", "truth (shadow)"),
    ("estimate", "walk estimate and [lo, hi]"),
    ("population", "population model"),
)

#: (survival key, legend label, line style) of the survival figure.
_CURVES = (
    ("truth_survival", "truth (shadow)", {"ls": "-", "marker": "o"}),
    ("survival", "population model", {"ls": "--", "marker": "s"}),
    ("naive_km", "naive Kaplan-Meier", {"ls": ":", "marker": "^"}),
)


def _entry_values(entry: dict) -> dict[str, tuple[float | None, float | None, float | None]]:
    walk = entry.get("all_steps") or {}
    return {
        "ceiling": (entry.get("truth"), None, None),
        "estimate": (walk.get("point"), walk.get("lo"), walk.get("hi")),
        "population": ((entry.get("population") or {}).get("mean"), None, None),
    }


def estimates_figure(label: str, report: dict, palette: dict):
    """Mean ceiling per workload: truth, the walk's point and bracket, the population model."""
    names = list(report["workloads"])
    values = [_entry_values(report["workloads"][n]) for n in names]
    shown = [
        (style, legend)
        for style, legend in _ESTIMATES
        if any(v[style][0] is not None or v[style][1] is not None for v in values)
    ]
    fig = new_figure(9.0, 4.6)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(shown))
    for i, (name, v) in enumerate(zip(names, values, strict=True)):
        for k, (style, legend) in enumerate(shown):
            point, lo, hi = v[style]
            if point is None and lo is None:
                continue
            at = i + (k - (len(shown) - 1) / 2) * width
            ax.bar(
                at,
                0.0 if point is None else point,
                width,
                label=legend,
                gid=f"workload={name}",
                **bar_style(style, palette[name]),
            )
            if lo is not None and hi is not None:
                centre = (lo + hi) / 2 if point is None else point
                ax.errorbar(
                    at, centre, yerr=[[centre - lo], [hi - centre]], fmt="none", ecolor="black"
                )
    ax.set_xticks(np.arange(len(names)), [workload_name(n) for n in names])
    ax.set_xlabel("workload")
    ax.set_ylabel("mean ceiling (accepted drafts per request-step)")
    truth = any(v["ceiling"][0] is not None for v in values)
    # without a shadow there is nothing to hold the estimate against: the title says so
    what = "estimated vs true ceiling" if truth else "estimated ceiling (no shadow truth)"
    ax.set_title(f"{label}: {what} per workload")
    legend_outside(
        ax,
        [Patch(**legend_style(style)) for style, _ in shown],
        [legend for _, legend in shown],
        title="bar (colour: workload)",
    )
    ax.grid(axis="y", alpha=0.3)
    return fig


def survival_figure(label: str, report: dict, palette: dict):
    """P(ceiling > j) per workload: truth, population model and naive Kaplan-Meier."""
    names = list(report["workloads"])
    cols = min(3, max(1, len(names)))
    rows = math.ceil(len(names) / cols)
    fig = new_figure(max(7.0, 4.0 * cols + 2.0), 3.4 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    gamma = report["gamma"]
    j = np.arange(gamma)
    drawn = []
    for ax, name in zip(axes, names, strict=False):
        pop = report["workloads"][name].get("population") or {}
        for key, legend, style in _CURVES:
            if key in pop:
                ax.plot(
                    j, pop[key], color=palette[name], label=legend, gid=f"workload={name}", **style
                )
                drawn.append(key)
        ax.set_ylim(0, 1.02)
        ax.set_xticks(j)
        ax.set_xlabel("block position j")
        ax.set_ylabel("P(ceiling > j)")
        ax.set_title(workload_name(name), fontsize=10, color=palette[name], fontweight="bold")
        ax.grid(alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    shown = [c for c in _CURVES if c[0] in drawn]
    legend_outside(
        fig,
        [Line2D([], [], color=MUTED, **style) for _, _, style in shown],
        [legend for _, legend, _ in shown],
        title="line (colour: workload)",
    )
    fig.suptitle(f"{label}: survival of the full-verification ceiling", fontsize=11)
    return fig

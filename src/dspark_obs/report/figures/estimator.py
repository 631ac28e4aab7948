"""Ceiling-estimator figures: estimates against the shadow twin's truth, and survival curves.

Built from the `dspark-obs estimate` object (`estimator.evaluate.evaluate`).
Where the run has no truth (no shadow, compact mode) only the estimates are
drawn and the titles say so.
"""

from __future__ import annotations

import math

import numpy as np

from ...plotting import colour, new_figure


def estimates_figure(label: str, report: dict):
    """Mean ceiling per workload: truth, the walk's point and bracket, the population model."""
    names = list(report["workloads"])
    entries = [report["workloads"][n] for n in names]
    fig = new_figure(8.0, 4.6)
    ax = fig.add_subplot()
    x = np.arange(len(names))
    width = 0.26
    truth = np.array([np.nan if e.get("truth") is None else e["truth"] for e in entries])
    walk = [e.get("all_steps") or {} for e in entries]
    point = np.array([np.nan if w.get("point") is None else w["point"] for w in walk])
    lo = np.array([w.get("lo", np.nan) for w in walk], float)
    hi = np.array([w.get("hi", np.nan) for w in walk], float)
    pop = np.array([(e.get("population") or {}).get("mean", np.nan) for e in entries], float)
    if not np.isnan(truth).all():
        ax.bar(x - width, np.nan_to_num(truth), width, color=colour(0), label="truth (shadow)")
    centre = np.where(np.isnan(point), (lo + hi) / 2, point)
    ax.bar(x, np.nan_to_num(point), width, color=colour(1), label="walk estimate")
    ax.errorbar(
        x,
        centre,
        yerr=np.nan_to_num(np.vstack([centre - lo, hi - centre])),
        fmt="none",
        ecolor="black",
        capsize=4,
        label="walk bracket [lo, hi]",
    )
    ax.bar(x + width, np.nan_to_num(pop), width, color=colour(2), label="population model")
    ax.set_xticks(x, [n or "(none)" for n in names])
    ax.set_ylabel("mean ceiling (accepted drafts per request-step)")
    suffix = "" if not np.isnan(truth).all() else " (no shadow truth in this run)"
    ax.set_title(f"{label}: estimated vs true ceiling per workload{suffix}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    return fig


def survival_figure(label: str, report: dict):
    """P(ceiling > j) per workload: truth, population model and naive Kaplan-Meier."""
    names = list(report["workloads"])
    cols = min(3, max(1, len(names)))
    rows = math.ceil(len(names) / cols)
    fig = new_figure(max(6.0, 4.2 * cols), 3.4 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    gamma = report["gamma"]
    j = np.arange(gamma)
    for ax, name in zip(axes, names, strict=False):
        pop = report["workloads"][name].get("population") or {}
        if "truth_survival" in pop:
            ax.plot(j, pop["truth_survival"], color=colour(0), marker="o", label="truth (shadow)")
        if "survival" in pop:
            ax.plot(j, pop["survival"], color=colour(1), marker="s", label="population model")
            ax.plot(j, pop["naive_km"], color=colour(3), ls="--", label="naive Kaplan-Meier")
        ax.set_ylim(0, 1.02)
        ax.set_xticks(j)
        ax.set_xlabel("block position j")
        ax.set_ylabel("P(ceiling > j)")
        ax.set_title(name or "(none)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"{label}: survival of the full-verification ceiling", fontsize=11)
    return fig

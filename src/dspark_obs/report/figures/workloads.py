"""Per-workload figures (the article's figure 4): what each workload's windows held and could have.

`arms` is a list of `(label, entries)` where entries come from the report's
per-workload rows; several arms (runs) stack as rows of subplots so that one
workload's bars line up across runs.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ...plotting import colour, new_figure

_BARS = (
    ("mean_window", "window"),
    ("mean_accepted", "accepted"),
    ("mean_ceiling", "ceiling (observed)"),
    ("estimated_ceiling", "ceiling (estimated)"),
)


def workload_figure(arms: list[tuple[str, list[dict]]], gamma: int):
    """Grouped bars per workload: mean window, accepted, observed and estimated ceiling."""
    fig = new_figure(9.0, 3.6 * len(arms) + 0.6)
    axes = fig.subplots(len(arms), 1, squeeze=False)[:, 0]
    width = 0.8 / len(_BARS)
    for ax, (label, rows) in zip(axes, arms, strict=True):
        names = [r["workload"] or "(none)" for r in rows]
        x = np.arange(len(rows))
        for k, (key, legend) in enumerate(_BARS):
            values = np.array([np.nan if r.get(key) is None else r[key] for r in rows], float)
            offset = x + (k - (len(_BARS) - 1) / 2) * width
            if key == "estimated_ceiling":
                lo = np.array(
                    [np.nan if r.get("estimated_lo") is None else r["estimated_lo"] for r in rows]
                )
                hi = np.array(
                    [np.nan if r.get("estimated_hi") is None else r["estimated_hi"] for r in rows]
                )
                # a point-less estimate (unwalked trimmed blocks) still shows its bracket
                centre = np.where(np.isnan(values), (lo + hi) / 2, values)
                err = np.vstack([centre - lo, hi - centre])
                ax.bar(
                    offset,
                    np.nan_to_num(values),
                    width,
                    color=colour(k),
                    label=legend + " [lo, hi]",
                )
                ax.errorbar(
                    offset, centre, yerr=np.nan_to_num(err), fmt="none", ecolor="black", capsize=3
                )
            else:
                ax.bar(offset, np.nan_to_num(values), width, color=colour(k), label=legend)
        for i, r in enumerate(rows):
            if r.get("utilisation") is not None:
                ax.annotate(
                    f"util {r['utilisation']:.3f}",
                    (x[i], gamma + 0.15),
                    ha="center",
                    fontsize=8,
                )
        ax.set_xticks(x, names)
        ax.set_ylim(0, gamma + 0.8)
        ax.set_ylabel("drafted tokens per request-step")
        ax.set_title(f"{label}: window, accepted and ceiling per workload")
        ax.legend(fontsize=8, ncols=4, loc="upper right", bbox_to_anchor=(1.0, -0.08))
        ax.grid(axis="y", alpha=0.3)
    return fig


def window_share_figure(arms: list[tuple[str, pl.DataFrame]], gamma: int):
    """Share of request-steps at each window length, bars per workload, one subplot per arm."""
    fig = new_figure(9.0, 3.4 * len(arms) + 0.4)
    axes = fig.subplots(len(arms), 1, squeeze=False)[:, 0]
    for ax, (label, shares) in zip(axes, arms, strict=True):
        names = shares["workload"].unique(maintain_order=True).to_list()
        width = 0.8 / max(1, len(names))
        x = np.arange(gamma + 1)
        for k, name in enumerate(names):
            part = shares.filter(pl.col("workload").eq_missing(name)).sort("window")
            ax.bar(
                x + (k - (len(names) - 1) / 2) * width,
                part["share"].to_numpy(),
                width,
                color=colour(k),
                label=name or "(none)",
            )
        ax.set_xticks(x)
        ax.set_xlabel("verify window (drafted tokens verified)")
        ax.set_ylabel("share of request-steps")
        ax.set_title(f"{label}: distribution of verify windows per workload")
        ax.legend(fontsize=8, title="workload", title_fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return fig

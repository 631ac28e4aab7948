"""Per-workload figures (the article's figure 4): what each workload's windows held and could have.

`arms` is a list of `(label, entries)` where entries come from the report's
per-workload rows; several arms (runs) stack as rows of subplots so that one
workload's bars line up across runs. Every bar is its workload's colour
(`palette`); the quantity is told by its fill, which the legend shows in grey.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.patches import Patch

from ...numbers import number
from ...palette import bar_style, legend_style, workload_name
from ...plotting import legend_outside, new_figure

#: (row key, palette style, legend label) in bar order.
_BARS = (
    ("mean_window", "window", "window"),
    ("mean_accepted", "accepted", "accepted"),
    ("mean_ceiling", "ceiling", "ceiling (observed)"),
    ("estimated_ceiling", "estimate", "ceiling (walk estimate) and [lo, hi]"),
)


def _values(rows: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r[key] for r in rows], float)


def _drawn(arms: list[tuple[str, list[dict]]]) -> list[tuple[str, str, str]]:
    """The bars some arm has a value for: a quantity no run measured gets no bar and no entry."""
    out = []
    for key, style, legend in _BARS:
        lo = [_values(rows, "estimated_lo") for _, rows in arms] if style == "estimate" else []
        if any(not np.isnan(_values(rows, key)).all() for _, rows in arms) or any(
            not np.isnan(v).all() for v in lo
        ):
            out.append((key, style, legend))
    return out


def workload_figure(arms: list[tuple[str, list[dict]]], gamma: int, palette: dict):
    """Grouped bars per workload: mean window, accepted, observed and estimated ceiling."""
    fig = new_figure(10.0, 3.6 * len(arms) + 0.6)
    axes = fig.subplots(len(arms), 1, squeeze=False)[:, 0]
    bars = _drawn(arms)
    width = 0.8 / len(bars)
    for ax, (label, rows) in zip(axes, arms, strict=True):
        x = np.arange(len(rows))
        for i, r in enumerate(rows):
            colour = palette[r["workload"]]
            for k, (key, style, legend) in enumerate(bars):
                value = r.get(key)
                at = x[i] + (k - (len(bars) - 1) / 2) * width
                lo, hi = r.get("estimated_lo"), r.get("estimated_hi")
                if value is None and not (style == "estimate" and lo is not None):
                    continue
                ax.bar(
                    at,
                    0.0 if value is None else value,
                    width,
                    label=legend,
                    gid=f"workload={r['workload']}",
                    **bar_style(style, colour),
                )
                if style == "estimate" and lo is not None and hi is not None:
                    # a point-less estimate (unwalked trimmed blocks) still shows its bracket
                    centre = (lo + hi) / 2 if value is None else value
                    ax.errorbar(
                        at,
                        centre,
                        yerr=[[centre - lo], [hi - centre]],
                        fmt="none",
                        ecolor="black",
                        capsize=3,
                    )
            if r.get("utilisation") is not None:
                ax.annotate(
                    f"utilisation {number(r['utilisation'], 3)}",
                    (x[i], gamma + 0.15),
                    ha="center",
                    fontsize=8,
                )
        ax.set_xticks(x, [workload_name(r["workload"]) for r in rows])
        ax.set_xlabel("workload")
        ax.set_ylim(0, gamma + 0.8)
        ax.set_ylabel("drafted tokens per request-step")
        ax.set_title(f"{label}: window, accepted and ceiling per workload")
        ax.grid(axis="y", alpha=0.3)
    legend_outside(
        fig,
        [Patch(**legend_style(style)) for _, style, _ in bars],
        [legend for _, _, legend in bars],
        title="bar (colour: workload)",
    )
    return fig


def window_share_figure(arms: list[tuple[str, pl.DataFrame]], gamma: int, palette: dict):
    """Share of request-steps at each window length, bars per workload, one subplot per arm."""
    fig = new_figure(10.0, 3.4 * len(arms) + 0.4)
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
                color=palette[name],
                label=workload_name(name),
                gid=f"workload={name}",
            )
        ax.set_xticks(x)
        ax.set_xlabel("verify window (drafted tokens verified)")
        ax.set_ylabel("share of request-steps")
        ax.set_title(f"{label}: distribution of verify windows per workload")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    legend_outside(fig, list(seen.values()), list(seen), title="workload")
    return fig

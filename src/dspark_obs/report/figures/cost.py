"""Figures of a step-cost fit: does the additive table describe what the run measured?

Three views of one `CostFit` (from `dspark_obs.analysis.cost_fit.fit_cost_table`):

- `surface_figure`: measured cell means against the fitted table, step time
  over verify tokens M, one line per batch-size level; where the table is wrong
  the dots leave their line;
- `scatter_figure`: predicted against measured per step, for the fitted table
  and for the table the run itself used, with y = x;
- `residual_figure`: measured minus fitted per step over M, with the mean per
  M, so structure the additive form misses (a knee, a capture tier) shows.

Each `draw_*` draws into an axes (for composite figures); each `*_figure`
returns a standalone figure from `plotting.new_figure`. Per-step views plot at
most `SAMPLE_LIMIT` points, every n-th step in store order (deterministic), and
say so in the title.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import polars as pl

from ...analysis.cost_fit import CostFit
from ...domain.step_cost import M_BIN
from ...numbers import number
from ...outputs import prepare_dir
from ...palette import INK, MUTED, tones
from ...plotting import legend_outside, new_figure, save_png

#: Most per-step points a figure draws.
SAMPLE_LIMIT = 20_000

#: Why the residuals of a good fit need not centre on zero (shown under the residual plot).
BIAS_NOTE = (
    "Why the mean residual is not zero: the table is fitted to (bs, M/64) cell means with M "
    "at the middle of its 64-token bin (SGLang's binning), where the residuals do average "
    "zero; here each step is scored at its own M. Where the table rises with M, steps low in "
    "their bin read above zero and steps high in it below, so the mean is that offset, "
    "not a drift of the fit."
)

#: Characters of `BIAS_NOTE` per line for each inch of figure width: the small font's
#: average character is about a twelfth of an inch, so the note stays inside the figure.
NOTE_CHARS_PER_INCH = 12

#: Up to this many distinct batch sizes get a line each; beyond, cells group by bs probe.
MAX_BS_LINES = 8


def sample_steps(fit: CostFit, limit: int = SAMPLE_LIMIT) -> tuple[pl.DataFrame, int]:
    """Every `stride`-th step of the fit's per-step frame, at most `limit` rows, and the stride."""
    stride = max(1, math.ceil(fit.steps / max(limit, 1)))
    frame = fit.per_step
    if stride > 1:
        frame = frame.with_row_index("_i").filter(pl.col("_i") % stride == 0).drop("_i")
    return frame.collect(), stride


def _sampled(title: str, fit: CostFit, stride: int) -> str:
    if stride == 1:
        return f"{title} ({number(fit.steps)} steps)"
    return f"{title} (1 step in {number(stride)} of {number(fit.steps)} shown)"


def _levels(fit: CostFit) -> list[tuple[float, str, np.ndarray]]:
    """(bs the line is drawn at, legend label, mask of the cells it stands for)."""
    bs = fit.cell_frame["bs"].to_numpy()
    distinct = np.unique(bs)
    if len(distinct) <= MAX_BS_LINES:
        return [(float(b), f"bs {number(int(b))}", bs == b) for b in distinct]
    probes = np.asarray(fit.table.bs_probes, dtype=np.float64)
    nearest = np.abs(np.log(bs[:, None]) - np.log(probes[None, :])).argmin(axis=1)
    out = []
    for k in np.unique(nearest):
        mask = nearest == k
        lo, hi = bs[mask].min(), bs[mask].max()
        lo, hi = int(lo), int(hi)
        label = (
            f"bs {number(lo)}"
            if lo == hi
            else f"bs ≈ {number(int(probes[k]))} (cells bs {number(lo)}–{number(hi)})"
        )
        out.append((float(probes[k]) if lo != hi else float(lo), label, mask))
    return out


def draw_surface(ax, fit: CostFit) -> None:
    cells = fit.cell_frame
    m, mean_ms, n = cells["m"].to_numpy(), cells["mean_ms"].to_numpy(), cells["n"].to_numpy()
    lo_all = cells["m_bin"].to_numpy() * M_BIN  # lines span whole bins, so one cell shows
    hi_all = lo_all + M_BIN
    size = 15 + 85 * np.sqrt(n / n.max())
    table = fit.table
    lines = _levels(fit)
    colours = tones(len(lines))[::-1]  # darker means larger
    for i, (level, label, mask) in enumerate(lines):
        lo, hi = lo_all[mask].min(), hi_all[mask].max()
        probes = [p for p in table.m_probes if lo < p < hi]
        grid = np.unique(np.concatenate([np.linspace(lo, hi, 200), probes]))
        ax.plot(grid, table.step_seconds(level, grid - level) * 1e3, color=colours[i], lw=1.8)
        ax.scatter(
            m[mask],
            mean_ms[mask],
            s=size[mask],
            color=colours[i],
            edgecolor="black",
            linewidth=0.5,
            label=label,
            zorder=3,
        )
    ax.set_title(
        f"Step time vs verify tokens: {number(fit.cells)} (bs, M/64) cell means "
        "and the fitted table"
    )
    ax.set_xlabel("verify tokens per step, M (tokens; cells at the middle of their 64-token bin)")
    ax.set_ylabel("step time (ms)")
    ax.grid(alpha=0.3)
    legend_outside(ax, title="batch size\n(dot: cell mean, area ~ steps;\nline: fitted table)")


def draw_scatter(ax, fit: CostFit, limit: int = SAMPLE_LIMIT) -> None:
    df, stride = sample_steps(fit, limit)
    measured = df["measured_ms"].to_numpy()
    shown = [measured]
    ax.scatter(
        measured,
        df["fitted_ms"].to_numpy(),
        s=8,
        alpha=0.4,
        color=INK,
        label=f"fitted table (R² {number(fit.fitted.r2, 3)})",
    )
    shown.append(df["fitted_ms"].to_numpy())
    own = df.filter(pl.col("predicted_ms").is_not_null())
    if fit.own is not None and own.height:
        ax.scatter(
            own["measured_ms"].to_numpy(),
            own["predicted_ms"].to_numpy(),
            s=8,
            alpha=0.4,
            color=MUTED,
            marker="x",
            label=f"run's own table (R² {number(fit.own.r2, 3)})",
        )
        shown.append(own["predicted_ms"].to_numpy())
    values = np.concatenate(shown)
    lo, hi = float(values.min()), float(values.max())
    pad = 0.02 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", ls="--", lw=1, label="y = x")
    ax.set_title(_sampled("Predicted vs measured step time", fit, stride))
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.grid(alpha=0.3)
    legend_outside(ax)


def draw_residuals(ax, fit: CostFit, limit: int = SAMPLE_LIMIT) -> None:
    df, stride = sample_steps(fit, limit)
    ax.scatter(
        df["m"].to_numpy(),
        df["residual_ms"].to_numpy(),
        s=8,
        alpha=0.3,
        color=MUTED,
        label="step" if stride == 1 else f"step (1 in {stride})",
    )
    per_m = (
        fit.per_step.group_by("m")
        .agg(pl.col("residual_ms").mean().alias("mean"))
        .sort("m")
        .collect()
    )
    ax.plot(
        per_m["m"].to_numpy(),
        per_m["mean"].to_numpy(),
        color=INK,
        marker="D",
        ms=6,
        ls="",
        label="mean per M (all steps)",
    )
    ax.axhline(0.0, color="black", lw=1, ls="--", label="zero")
    bias = fit.fitted.bias_seconds * 1e3
    ax.axhline(
        bias, color=INK, lw=1.2, ls="-", label=f"mean residual {number(bias, 3, signed=True)} ms"
    )
    ax.set_title(_sampled("Residuals of the fitted table, measured − fitted", fit, stride))
    ax.set_xlabel("verify tokens per step, M (tokens)")
    ax.set_ylabel("measured − fitted step time (ms)")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    ax.annotate(
        textwrap.fill(BIAS_NOTE, int(NOTE_CHARS_PER_INCH * ax.figure.get_figwidth())),
        (0.0, -0.2),
        xycoords="axes fraction",
        va="top",
        fontsize="small",
        color=INK,
    )


def surface_figure(fit: CostFit):
    fig = new_figure()
    draw_surface(fig.add_subplot(), fit)
    return fig


def scatter_figure(fit: CostFit, limit: int = SAMPLE_LIMIT):
    fig = new_figure()
    draw_scatter(fig.add_subplot(), fit, limit)
    return fig


def residual_figure(fit: CostFit, limit: int = SAMPLE_LIMIT):
    fig = new_figure()
    draw_residuals(fig.add_subplot(), fit, limit)
    return fig


def cost_figures(fit: CostFit, limit: int = SAMPLE_LIMIT) -> dict:
    """The three figures by file stem: cost_surface, cost_scatter, cost_residuals."""
    return {
        "cost_surface": surface_figure(fit),
        "cost_scatter": scatter_figure(fit, limit),
        "cost_residuals": residual_figure(fit, limit),
    }


def combined_figure(fit: CostFit, limit: int = SAMPLE_LIMIT):
    """The three views stacked in one figure (what `cost fit --plot FILE` writes)."""
    fig = new_figure(9.0, 14.0)
    draw_surface(fig.add_subplot(3, 1, 1), fit)
    draw_scatter(fig.add_subplot(3, 1, 2), fit, limit)
    draw_residuals(fig.add_subplot(3, 1, 3), fit, limit)
    return fig


def write_cost_plots(fit: CostFit, plot: Path | None, plot_dir: Path | None) -> list[str]:
    """`plot`: one PNG with all three views; `plot_dir`: one PNG per view. Paths written."""
    written = []
    if plot is not None:
        written.append(str(save_png(combined_figure(fit), plot)))
    if plot_dir is not None:
        prepare_dir(plot_dir, "--plot-dir")
        for stem, fig in cost_figures(fit).items():
            written.append(str(save_png(fig, plot_dir / f"{stem}.png")))
    return written

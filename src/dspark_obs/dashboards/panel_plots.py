"""One dashboard panel drawn with matplotlib the way Grafana shows it, from fetched series.

Timeseries become lines; a stat panel its last value per series as a big number in the
colour of its threshold, over a sparkline; bar-gauge panels bars of their last values in
their threshold colours; heatmaps an image over the buckets that hold data. A panel without
data says so in place. It draws what `querying` fetched and knows
nothing of Prometheus, so a panel's look can be checked from made-up series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from ..palette import run_style, workload_palette
from ..plotting import new_figure, save_png
from .querying import PanelData, Series
from .values import defaults, format_value, threshold_colour, unit_of


def _no_data(ax, data: PanelData) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_facecolor("#f4f4f4")
    ax.text(
        0.5,
        0.5,
        "no data\n(the queries returned no series)",
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=11,
        color="#b00020",
    )


def draw_panel(
    ax, data: PanelData, *, compact: bool = False, palette: Mapping[str, str] | None = None
) -> None:
    """Draw one panel into a matplotlib Axes; `palette` colours series by their workload."""
    panel = data.panel
    unit, scale = unit_of(panel)
    ax.set_title(panel.get("title", ""), fontsize=10 if compact else 12, fontweight="bold")
    if not data.has_data:
        _no_data(ax, data)
        return
    kind = panel.get("type")
    limits = defaults(panel)
    if kind == "heatmap":
        _heatmap(ax, data, unit, compact)
    elif kind == "stat":
        _stat(ax, data, compact)
    elif kind == "bargauge":
        _bars(ax, data, unit, scale, compact)
        if limits.get("min") is not None and limits.get("max") is not None:
            ax.set_ylim(limits["min"] * scale, limits["max"] * scale)
    else:
        _lines(ax, data, unit, scale, compact, palette or panel_palette([data]))
        lo, hi = limits.get("min"), limits.get("max")
        if lo is not None or hi is not None:
            ax.set_ylim(
                bottom=None if lo is None else lo * scale, top=None if hi is None else hi * scale
            )


def _times(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in ts]


def _time_axis(ax, compact: bool) -> None:
    from matplotlib import dates

    locator = dates.AutoDateLocator(maxticks=5 if compact else 7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))
    ax.set_xlabel("time", fontsize=8 if compact else 10)


def panel_palette(datas: list[PanelData]) -> dict[str, str]:
    """One colour per workload over every panel drawn together, as the report's figures do."""
    return workload_palette(s.workload for d in datas for s in d.series if s.workload is not None)


def _line_styles(shown: list[Series], palette: Mapping[str, str]) -> list[dict]:
    """A workload's series share its hue and differ by line style (mode, rank, instance);
    series without a workload label draw in the neutral tones of `run_style`."""
    seen: dict[str | None, int] = {}
    out = []
    for s in shown:
        k = seen[s.workload] = seen.get(s.workload, -1) + 1
        style = run_style(k)
        colour = palette.get(s.workload) if s.workload is not None else None
        out.append({"color": colour or style["color"], "ls": style["ls"]})
    return out


def _lines(
    ax, data: PanelData, unit: str, scale: float, compact: bool, palette: Mapping[str, str]
) -> None:
    shown = [s for s in data.series if s.last is not None]
    from matplotlib import dates

    for s, style in zip(shown, _line_styles(shown, palette), strict=True):
        xs = dates.date2num(_times(s.times))
        # markers keep a series of one or two points (a fresh Prometheus) visible
        marker = "o" if len(s.times) < 20 else None
        ys = [v * scale for v in s.values]
        ax.plot(xs, ys, label=s.label, linewidth=1.4, marker=marker, markersize=3, **style)
    ax.xaxis_date()
    first = min(min(s.times) for s in shown)
    last = max(max(s.times) for s in shown)
    if data.span:  # the whole queried range, as Grafana shows it
        first, last = min(first, data.span[0]), max(last, data.span[1])
    if last > first:
        ax.set_xlim(dates.date2num(_times([first, last])))
    _time_axis(ax, compact)
    ax.set_ylabel(unit, fontsize=8 if compact else 10)
    ax.grid(True, alpha=0.3)
    limit = 8 if compact else 16
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > limit:
        labels = labels[:limit]
        handles = handles[:limit]
        labels[-1] = f"… {len(shown) - limit + 1} more"
    ax.legend(
        handles,
        labels,
        fontsize=6 if compact else 8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 if compact else -0.15),
        ncol=_legend_columns(ax, labels, 6 if compact else 8),
        frameon=False,
    )


def _legend_columns(ax, labels: list[str], fontsize: float) -> int:
    """As many columns as fit the axes' width, so a long legend never squeezes the plot away."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    entry_pt = max(len(label) for label in labels) * fontsize * 0.6 + 3 * fontsize
    return max(1, min(len(labels), 4, int(width_pt // entry_pt)))


def _stat(ax, data: PanelData, compact: bool) -> None:
    """One big number per series, coloured by its threshold, its name above, a sparkline below."""
    shown = [s for s in data.series if s.last is not None]
    ax.set_axis_off()
    n = len(shown)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    size = (22 if compact else 34) / max(1, rows) ** 0.5 / max(1.0, cols / 2)
    for i, s in enumerate(shown):
        r, c = divmod(i, cols)
        x0, width = c / cols, 1 / cols
        y0, height = 1 - (r + 1) / rows, 1 / rows
        colour = threshold_colour(s.last, data.panel)
        _sparkline(ax, s, (x0 + 0.04 * width, y0, 0.92 * width, 0.3 * height), colour)
        ax.text(
            x0 + width / 2,
            y0 + 0.58 * height,
            format_value(s.last, data.panel),
            ha="center",
            va="center",
            fontsize=size,
            fontweight="bold",
            color=colour,
            transform=ax.transAxes,
            gid="stat-value",
        )
        if n > 1:  # as Grafana: a lone value goes unnamed
            ax.text(
                x0 + width / 2,
                y0 + 0.9 * height,
                s.label,
                ha="center",
                va="center",
                fontsize=7 if compact else 9,
                color="#444444",
                transform=ax.transAxes,
            )


def _sparkline(ax, s: Series, bounds: tuple[float, float, float, float], colour: str) -> None:
    points = [(t, v) for t, v in zip(s.times, s.values, strict=True) if not math.isnan(v)]
    if len(points) < 2:
        return
    inset = ax.inset_axes(bounds)
    ts, vs = zip(*points, strict=True)
    inset.fill_between(ts, vs, min(vs), color=colour, alpha=0.25, lw=0)
    inset.plot(ts, vs, color=colour, lw=1)
    inset.set_axis_off()


def _bars(ax, data: PanelData, unit: str, scale: float, compact: bool) -> None:
    shown = [s for s in data.series if s.last is not None]
    labels = [s.label or "value" for s in shown]
    values = [s.last * scale for s in shown]
    colours = [threshold_colour(s.last, data.panel) for s in shown]
    bars = ax.bar(range(len(values)), values, color=colours)
    ax.set_xticks(range(len(values)))
    rotate = len(values) > 4 or max(len(label) for label in labels) > 12
    ax.set_xticklabels(
        labels, rotation=45 if rotate else 0, ha="right" if rotate else "center", fontsize=7
    )
    ax.set_ylabel(f"{unit} (last value)", fontsize=8 if compact else 10)
    ax.grid(True, axis="y", alpha=0.3)
    if len(values) <= 16:
        ax.bar_label(bars, labels=[format_value(s.last, data.panel) for s in shown], fontsize=7)


def _heatmap(ax, data: PanelData, unit: str, compact: bool) -> None:
    from matplotlib import dates

    rows = [s for s in data.series if s.last is not None]
    if all(s.le is not None for s in rows):
        rows.sort(key=lambda s: s.le)
        rows = _occupied(rows)
    grid = sorted({t for s in rows for t in s.times})
    matrix = []
    for s in rows:
        at = dict(zip(s.times, s.values, strict=True))
        matrix.append([at.get(t, math.nan) for t in grid])
    cmap = (data.panel.get("options") or {}).get("color", {}).get("scheme", "Oranges") or "Oranges"
    x0 = dates.date2num(datetime.fromtimestamp(grid[0]))
    x1 = dates.date2num(datetime.fromtimestamp(grid[-1])) if len(grid) > 1 else x0 + 1e-3
    image = ax.imshow(
        matrix,
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap=cmap,
        extent=(x0, x1, -0.5, len(rows) - 0.5),
    )
    ax.xaxis_date()
    _time_axis(ax, compact)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(_bucket_labels(rows), fontsize=7)
    ax.set_ylabel(f"{unit} (bucket le)", fontsize=8 if compact else 10)
    bar = ax.figure.colorbar(image, ax=ax)
    bar.ax.tick_params(labelsize=7)
    bar.set_label("per second", fontsize=8)


def _occupied(buckets: list[Series]) -> list[Series]:
    """The buckets from the lowest to the highest that ever counted something.

    Grafana's heatmap spends a row on every bucket up to +Inf; most of them stay
    empty, squeezing the rows that hold the data into a strip.
    """
    full = [i for i, s in enumerate(buckets) if any(v > 0 for v in s.values if not math.isnan(v))]
    if not full:
        return buckets
    return buckets[full[0] : full[-1] + 1]


def _bucket_labels(buckets: list[Series]) -> list[str]:
    """`≤ le` per bucket; the +Inf bucket is everything above the previous bound."""
    out = []
    for i, s in enumerate(buckets):
        if s.le is None:
            out.append(s.label)
        elif math.isinf(s.le):
            out.append(f"> {buckets[i - 1].le:g}" if i else "all")
        else:
            out.append(f"≤ {s.le:g}")
    return out


def panel_png(data: PanelData, path: Path, palette: Mapping[str, str] | None = None) -> None:
    grid = data.panel.get("gridPos") or {}
    width = max(5.0, min(14.0, grid.get("w", 12) * 0.6))
    height = 4.5 if data.panel.get("type") == "timeseries" else 4.0
    fig = new_figure(width, height)
    draw_panel(fig.add_subplot(), data, palette=palette)
    save_png(fig, path)


def overview_png(
    datas: list[PanelData],
    path: Path,
    title: str,
    cols: int = 4,
    palette: Mapping[str, str] | None = None,
) -> None:
    rows = math.ceil(len(datas) / cols)
    fig = new_figure(cols * 5.5, rows * 4.2)
    fig.suptitle(title, fontsize=16, fontweight="bold")
    for i, data in enumerate(datas):
        draw_panel(fig.add_subplot(rows, cols, i + 1), data, compact=True, palette=palette)
    save_png(fig, path, dpi=70)

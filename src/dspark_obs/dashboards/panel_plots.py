"""One dashboard panel drawn with matplotlib the way Grafana shows it, from fetched series.

Timeseries become lines, stat and bar-gauge panels bars of their last values, heatmaps an
image; a panel without data says so in place. It draws what `querying` fetched and knows
nothing of Prometheus, so a panel's look can be checked from made-up series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ..plotting import new_figure, save_png
from .querying import PanelData

UNITS = {
    "percentunit": ("%", 100.0),
    "s": ("seconds", 1.0),
    "ops": ("ops/s", 1.0),
    "short": ("count", 1.0),
    "none": ("value", 1.0),
}


def unit_of(panel: Mapping[str, Any]) -> tuple[str, float]:
    unit = (panel.get("fieldConfig") or {}).get("defaults", {}).get("unit") or "none"
    if unit.startswith("suffix:"):
        return unit.split(":", 1)[1].strip(), 1.0
    return UNITS.get(unit, (unit, 1.0))


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


def draw_panel(ax, data: PanelData, *, compact: bool = False) -> None:
    """Draw one panel into a matplotlib Axes."""
    panel = data.panel
    unit, scale = unit_of(panel)
    ax.set_title(panel.get("title", ""), fontsize=10 if compact else 12, fontweight="bold")
    if not data.has_data:
        _no_data(ax, data)
        return
    kind = panel.get("type")
    defaults = (panel.get("fieldConfig") or {}).get("defaults", {})
    if kind == "heatmap":
        _heatmap(ax, data, unit, compact)
    elif kind in ("stat", "bargauge"):
        _bars(ax, data, unit, scale, compact)
        if defaults.get("min") is not None and defaults.get("max") is not None:
            ax.set_ylim(defaults["min"] * scale, defaults["max"] * scale)
    else:
        _lines(ax, data, unit, scale, compact)
        lo, hi = defaults.get("min"), defaults.get("max")
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


def _lines(ax, data: PanelData, unit: str, scale: float, compact: bool) -> None:
    shown = [s for s in data.series if s.last is not None]
    from matplotlib import dates

    for s in shown:
        xs = dates.date2num(_times(s.times))
        # markers keep a series of one or two points (a fresh Prometheus) visible
        marker = "o" if len(s.times) < 20 else None
        ys = [v * scale for v in s.values]
        ax.plot(xs, ys, label=s.label, linewidth=1.4, marker=marker, markersize=3)
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


def _bars(ax, data: PanelData, unit: str, scale: float, compact: bool) -> None:
    shown = [s for s in data.series if s.last is not None]
    labels = [s.label or "value" for s in shown]
    values = [s.last * scale for s in shown]
    bars = ax.bar(range(len(values)), values, color="#3274d9")
    ax.set_xticks(range(len(values)))
    rotate = len(values) > 4 or max(len(label) for label in labels) > 12
    ax.set_xticklabels(
        labels, rotation=45 if rotate else 0, ha="right" if rotate else "center", fontsize=7
    )
    ax.set_ylabel(f"{unit} (last value)", fontsize=8 if compact else 10)
    ax.grid(True, axis="y", alpha=0.3)
    if len(values) <= 16:
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)


def _heatmap(ax, data: PanelData, unit: str, compact: bool) -> None:
    from matplotlib import dates

    rows = [s for s in data.series if s.last is not None]
    if all(s.le is not None for s in rows):
        rows.sort(key=lambda s: s.le)
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
    ax.set_yticklabels([s.label for s in rows], fontsize=7)
    ax.set_ylabel(f"{unit} (bucket le)", fontsize=8 if compact else 10)
    bar = ax.figure.colorbar(image, ax=ax)
    bar.ax.tick_params(labelsize=7)
    bar.set_label("per second", fontsize=8)


def panel_png(data: PanelData, path: Path) -> None:
    grid = data.panel.get("gridPos") or {}
    width = max(5.0, min(14.0, grid.get("w", 12) * 0.6))
    height = 4.5 if data.panel.get("type") == "timeseries" else 4.0
    fig = new_figure(width, height)
    draw_panel(fig.add_subplot(), data)
    save_png(fig, path)


def overview_png(datas: list[PanelData], path: Path, title: str, cols: int = 4) -> None:
    rows = math.ceil(len(datas) / cols)
    fig = new_figure(cols * 5.5, rows * 4.2)
    fig.suptitle(title, fontsize=16, fontweight="bold")
    for i, data in enumerate(datas):
        draw_panel(fig.add_subplot(rows, cols, i + 1), data, compact=True)
    save_png(fig, path, dpi=70)

"""One dashboard panel drawn with matplotlib the way Grafana shows it, from fetched series.

Timeseries become lines, each series told apart by `palette`'s rule (a workload's hue, or
a tone of the series map, with a line style and marker of its own) and ordered by the
numbers in their names (`context 128+` before `context 1024+`); a stat panel its last value
per series as a big number in the colour of its threshold, over a sparkline; bar-gauge
panels bars of their last values in their threshold colours (a reliability panel, bars of
predicted-survival bins, with the perfect-calibration line over them); heatmaps an image
over the buckets that hold data. Seconds are drawn in ms or µs, whichever reads. A panel
without data says so in place. It draws what `querying` fetched and knows nothing of
Prometheus, so a panel's look can be checked from made-up series.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from ..palette import INK, line_style, series_style, workload_palette
from ..plotting import NumberTicks, new_figure, save_png
from .querying import PanelData, Series
from .values import defaults, format_value, threshold_colour, unit_of

#: A time unit per magnitude of the largest value in seconds: the axis reads `12.4 ms`.
_SECONDS = ((1e-3, "µs", 1e6), (1.0, "ms", 1e3))

#: About this many markers on a line, so styles read without a dot per sample.
_MARKERS_PER_LINE = 8

#: Room above a bar gauge's maximum, as a share of its range, for the value over a full bar.
_LABEL_ROOM = 0.08

#: A bar label of predicted-survival bins: `0.07-0.13`.
_BIN = re.compile(r"(\d*\.?\d+)-(\d*\.?\d+)")


def _no_data(ax, data: PanelData, compact: bool) -> None:
    """The panel's own reason (its noValue, as Grafana shows it), wrapped to the panel."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_facecolor("#f4f4f4")
    size = 9 if compact else 11
    text = defaults(data.panel).get("noValue") or "No data: the queries returned no series"
    ax.text(
        0.5,
        0.5,
        _wrapped(text, ax, 0.9, size),
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=size,
        color="#b00020",
    )


def _wrapped(text: str, ax, share: float, size: float) -> str:
    """`text` in lines as wide as `share` of the axes at font `size`, whose characters are
    about 0.6 of it wide: a long name or note stays in its panel (or its column)."""
    width_pt = share * ax.get_position().width * ax.figure.get_figwidth() * 72
    return textwrap.fill(text, max(8, int(width_pt / (0.6 * size))))


def draw_panel(
    ax, data: PanelData, *, compact: bool = False, palette: Mapping[str, str] | None = None
) -> None:
    """Draw one panel into a matplotlib Axes; `palette` colours series by their workload."""
    panel = data.panel
    unit, scale = _readable_unit(data)
    title = panel.get("title", "")
    # as large as fits over the panel: a bold character is about 0.62 of the font size wide
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    size = min(10 if compact else 12, width_pt / (0.62 * max(1, len(title))))
    ax.set_title(title, fontsize=size, fontweight="bold")
    if not data.has_data:
        _no_data(ax, data, compact)
        return
    kind = panel.get("type")
    limits = defaults(panel)
    if kind == "heatmap":
        _heatmap(ax, data, unit, compact)
    elif kind == "stat":
        _stat(ax, data, compact)
    elif kind == "bargauge":
        _bars(ax, data, unit, scale, compact)
        lo, hi = limits.get("min"), limits.get("max")
        if lo is not None and hi is not None:  # room above the full bar for its value
            ax.set_ylim(lo * scale, (hi + _LABEL_ROOM * (hi - lo)) * scale)
    else:
        _lines(ax, data, unit, scale, compact, palette or panel_palette([data]))
        lo, hi = limits.get("min"), limits.get("max")
        if lo is not None or hi is not None:
            ax.set_ylim(
                bottom=None if lo is None else lo * scale, top=None if hi is None else hi * scale
            )


def _readable_unit(data: PanelData) -> tuple[str, float]:
    """The panel's unit and factor for an axis, seconds in ms or µs when all values are small."""
    unit, scale = unit_of(data.panel)
    if defaults(data.panel).get("unit") != "s":
        return unit, scale
    largest = max((abs(v) for s in data.series for v in s.values if not math.isnan(v)), default=0)
    return next(((name, f) for below, name, f in _SECONDS if largest < below), (unit, scale))


def _times(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in ts]


def _time_axis(ax, compact: bool) -> None:
    from matplotlib import dates

    # minticks 2: with the default 5, a span of 2.5-5 minutes fits no interval of whole
    # minutes nor of seconds (30 s at most) within maxticks, and matplotlib warns
    locator = dates.AutoDateLocator(minticks=2, maxticks=5 if compact else 7)
    ax.xaxis.set_major_locator(locator)
    # every tick a clock time (`21:15:30`, not a bare `30` beside `21:15`)
    clock = ["%Y", "%b", "%d", "%H:%M", "%H:%M", "%H:%M:%S"]
    ax.xaxis.set_major_formatter(
        dates.ConciseDateFormatter(locator, formats=clock, zero_formats=["", *clock[:-1]])
    )
    ax.set_xlabel("time", fontsize=8 if compact else 10)


def panel_palette(datas: list[PanelData]) -> dict[str, str]:
    """One colour per workload over every panel drawn together, as the report's figures do."""
    return workload_palette(s.workload for d in datas for s in d.series if s.workload is not None)


def _line_styles(shown: list[Series], palette: Mapping[str, str]) -> list[dict]:
    """A workload's series share its hue and differ by line style and marker (mode, rank,
    instance); series without a workload label take `series_style`, one each."""
    others = [s for s in shown if s.workload is None]
    seen: dict[str | None, int] = {}
    out = []
    for s in shown:
        k = seen[s.workload] = seen.get(s.workload, -1) + 1
        if s.workload is None:
            out.append(series_style(k, len(others)))
        else:
            out.append({"color": palette.get(s.workload), **line_style(k)})
    return out


def _numeric_order(series: list[Series]) -> list[Series]:
    """Series whose names differ only in their numbers, in the order of those numbers.

    Prometheus answers a query's series sorted as text (`1024+` before `128+`); series of
    other names keep the panel's order, each group where its first member was.
    """
    numbers = [re.findall(r"\d+(?:\.\d+)?", s.label) for s in series]
    shapes = [re.sub(r"\d+(?:\.\d+)?", "#", s.label) for s in series]
    first = {shape: i for i, shape in reversed(list(enumerate(shapes)))}
    order = sorted(
        range(len(series)),
        key=lambda i: (first[shapes[i]], [float(n) for n in numbers[i]]),
    )
    return [series[i] for i in order]


def _lines(
    ax, data: PanelData, unit: str, scale: float, compact: bool, palette: Mapping[str, str]
) -> None:
    shown = _numeric_order([s for s in data.series if s.last is not None])
    from matplotlib import dates

    for i, (s, style) in enumerate(zip(shown, _line_styles(shown, palette), strict=True)):
        xs = dates.date2num(_times(s.times))
        ys = [v * scale for v in s.values]
        # a few markers a line, staggered so that lines on top of each other show theirs;
        # a series of one or two points (a fresh Prometheus) keeps all of them
        every = max(1, len(xs) // _MARKERS_PER_LINE)
        ax.plot(
            xs,
            ys,
            label=s.label,
            linewidth=1.4,
            markersize=4,
            markevery=(i % every, every),
            **style,
        )
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
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=_under_x_axis(ax, 8 if compact else 10),
        ncol=_legend_columns(ax, labels, 6 if compact else 8),
        frameon=False,
    )


def _under_x_axis(ax, label_size: float):
    """The axes' coordinates moved down by what sits under the axes (ticks, their labels and
    the axis label, in points): a legend anchored there clears them however short the layout
    makes the axes, where a fixed share of its height runs into them."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.transforms import ScaledTranslation

    ticks = FontProperties(size=rcParams["xtick.labelsize"]).get_size_in_points()
    gap = (
        rcParams["xtick.major.size"]
        + rcParams["xtick.major.pad"]
        + 1.3 * ticks
        + rcParams["axes.labelpad"]
        + 1.3 * label_size
    )
    return ax.transAxes + ScaledTranslation(0, -gap / 72, ax.figure.dpi_scale_trans)


def _legend_columns(ax, labels: list[str], fontsize: float) -> int:
    """As many columns as fit the panel's cell of the figure, so a long legend never squeezes
    the plot away."""
    width_pt = ax.figure.get_figwidth() * 72 / ax.get_subplotspec().get_gridspec().ncols
    entry_pt = max(len(label) for label in labels) * fontsize * 0.6 + 3 * fontsize
    return max(1, min(len(labels), 4, int(width_pt // entry_pt)))


def _stat(ax, data: PanelData, compact: bool) -> None:
    """One big number per series, coloured by its threshold, its name above (wrapped to its
    column), a sparkline below."""
    shown = [s for s in data.series if s.last is not None]
    ax.set_axis_off()
    n = len(shown)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    size = (22 if compact else 34) / max(1, rows) ** 0.5 / max(1.0, cols / 2)
    # as Grafana: a lone value goes unnamed unless the panel asks for its name
    named = n > 1 or (data.panel.get("options") or {}).get("textMode") == "value_and_name"
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
        if named:
            ax.text(
                x0 + width / 2,
                y0 + 0.9 * height,
                _wrapped(s.label, ax, 0.95 * width, 7 if compact else 9),
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
    if all(s.le is not None for s in shown):  # a histogram's buckets, as the heatmap's rows
        shown = _occupied(sorted(shown, key=lambda s: s.le))
        labels = [s.label for s in shown]
        if math.isinf(shown[-1].le) and len(shown) > 1:
            labels[-1] = f"> {labels[-2]}"
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
        ax.bar_label(
            bars,
            labels=[format_value(s.last, data.panel) for s in shown],
            fontsize=7,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},  # over a line
        )
    _perfect_calibration(ax, data, labels, scale, compact)


def _perfect_calibration(ax, data: PanelData, labels: list[str], scale: float, compact: bool):
    """Over bars of predicted-survival bins (`0.07-0.13`, values shares of 1), the line a
    calibrated drafter's bars would reach: each bin's middle, y = x in bin coordinates."""
    bins = [_BIN.fullmatch(label) for label in labels]
    if defaults(data.panel).get("unit") != "percentunit" or not all(bins):
        return
    middles = [(float(b.group(1)) + float(b.group(2))) / 2 for b in bins]
    if not all(0 <= m <= 1 for m in middles):
        return
    ax.plot(
        range(len(middles)),
        [m * scale for m in middles],
        color=INK,
        ls="--",
        lw=1.0,
        label="perfect calibration (bin middle)",
    )
    ax.set_xlabel("predicted survival (bin)", fontsize=8 if compact else 10)
    ax.legend(loc="upper left", fontsize=6 if compact else 8, frameon=False)


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
    ax.set_ylabel(_bucket_quantity(data.panel), fontsize=8 if compact else 10)
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
    bounds = [s.le for s in buckets if s.le is not None and not math.isinf(s.le)]
    text = dict(zip(bounds, NumberTicks().format_ticks(bounds), strict=True))
    out = []
    for i, s in enumerate(buckets):
        if s.le is None:
            out.append(s.label)
        elif math.isinf(s.le):
            out.append(f"> {text[buckets[i - 1].le]}" if i else "all")
        else:
            out.append(f"≤ {text[s.le]}")
    return out


def _bucket_quantity(panel: Mapping) -> str:
    """What a heatmap's rows are buckets of: the quantity its title names ("Batch size
    distribution": batch size), the rows' bounds being that quantity's, not counts."""
    quantity = re.sub(r"\s*distribution$", "", panel.get("title", ""), flags=re.IGNORECASE)
    return f"{quantity[:1].lower()}{quantity[1:]} (bucket)" if quantity else "bucket"


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

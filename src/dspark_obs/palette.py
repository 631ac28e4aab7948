"""Colours and styles every figure draws with, so a workload reads the same everywhere.

A reader who has learnt that poetry is green in one figure must find it green in
the next; so workloads own the qualitative hues and nothing else uses them. Which
workload gets which hue depends only on the set of workload names of a report
(sorted, the unnamed workload last), not on the subset a figure happens to show.

Everything else is told apart by one rule that scales to any number of series:

- series that are not workloads (runs of a report or compare, verify policies,
  block positions, sources, ranks, batch-size levels) take `series_style(i, n)`:
  the i-th of n evenly spaced tones of one sequential map (`SERIES_MAP`, dark to
  light, none of them a workload hue), each with its own line style and marker.
  The tones alone part any two series; the line styles (4) and markers (7),
  cycling at co-prime periods, part neighbours whose tones are close, and no two
  of the first 28 series share both. The run itself among predicted policies is
  a black star (`OWN_POINT`);
- several series of one workload (its modes, ranks, quantities) keep the
  workload's hue and differ by `line_style(k)`, the same cycle;
- quantities of one workload in bars (window, accepted, ceiling, estimates) are
  the workload's hue at different fills and hatches (`BAR_STYLES`);
- two fixed roles (calibration before/after STS, fitted vs the run's table,
  reference lines) are `INK` and `MUTED`, told apart by line style or marker.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Hues for workloads only (tab10 without its grey and olive, which read as "neutral").
WORKLOAD_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
)

#: Requests with no workload label, which no named workload may be mistaken for.
UNNAMED_COLOUR = "#7f7f7f"

#: Neutral tones for what is not a workload.
INK, MUTED, FAINT = "#222222", "#8c8c8c", "#c8c8c8"

#: The sequential map of every series that is not a workload, and the span of it used:
#: its lightest end (yellow) would vanish on white.
SERIES_MAP, SERIES_SPAN = "viridis", (0.0, 0.85)

#: Line styles and markers cycled together; 4 and 7 are co-prime, so the pair repeats
#: only after 28 series. No star: that is `OWN_POINT`'s.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")

#: How each per-workload quantity fills a bar of the workload's hue.
BAR_STYLES: dict[str, dict] = {
    "window": {"alpha": 0.3},
    "accepted": {"alpha": 1.0},
    "ceiling": {"alpha": 1.0, "fill": False, "hatch": "////"},
    "estimate": {"alpha": 0.6, "hatch": ".."},
    "population": {"alpha": 1.0, "fill": False, "hatch": "xx"},
}

#: `Axes.plot` keyword arguments of a run's own measured points among predicted policies.
OWN_POINT = {"color": INK, "ls": "none", "marker": "*", "markersize": 11, "zorder": 5}


def workload_name(name: str | None) -> str:
    return name or "(none)"


def workload_palette(names: Iterable[str | None]) -> dict[str | None, str]:
    """One colour per workload: the named ones sorted, in `WORKLOAD_COLOURS` order."""
    distinct = set(names)
    named = sorted(n for n in distinct if n)
    out: dict[str | None, str] = {
        n: WORKLOAD_COLOURS[i % len(WORKLOAD_COLOURS)] for i, n in enumerate(named)
    }
    for n in distinct - set(named):
        out[n] = UNNAMED_COLOUR
    return out


def bar_style(quantity: str, colour: str) -> dict:
    """`Axes.bar` keyword arguments drawing `quantity` in a workload's `colour`."""
    style = dict(BAR_STYLES[quantity])
    alpha = style.pop("alpha")
    if style.pop("fill", True):
        return {"facecolor": colour, "alpha": alpha, "edgecolor": colour, "linewidth": 0.8, **style}
    return {"facecolor": "white", "edgecolor": colour, "linewidth": 1.0, **style}


def legend_style(quantity: str) -> dict:
    """The same fill in a neutral tone, for a legend entry that stands for every workload."""
    return bar_style(quantity, MUTED)


def tones(n: int) -> list[str]:
    """`n` evenly spaced colours of `SERIES_MAP`, darkest first: distinct for any `n`."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[SERIES_MAP]
    lo, hi = SERIES_SPAN
    return [to_hex(cmap(lo + (hi - lo) * k / max(1, n - 1))) for k in range(n)]


def line_style(k: int) -> dict:
    """The k-th line style and marker of the cycle, for series that share a colour."""
    return {"ls": LINE_STYLES[k % len(LINE_STYLES)], "marker": MARKERS[k % len(MARKERS)]}


def series_style(i: int, n: int) -> dict:
    """`Axes.plot` keyword arguments of the i-th of `n` series that are not workloads."""
    return {"color": tones(n)[i], **line_style(i)}

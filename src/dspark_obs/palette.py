"""Colours and styles every figure draws with, so a workload reads the same everywhere.

A reader who has learnt that poetry is green in one figure must find it green in
the next; so workloads own the qualitative hues and nothing else uses them. Which
workload gets which hue depends only on the set of workload names of a report
(sorted, the unnamed workload last), not on the subset a figure happens to show.
Everything that is not a workload draws in neutral tones, told apart by style:

- quantities of one workload (window, accepted, ceiling, estimates) are the
  workload's hue at different fills and hatches (`BAR_STYLES`);
- runs (arms of a report or compare) are black and greys with their own line
  style and marker (`run_style`); verify policies predicted on one run likewise
  (`policy_style`), the run itself a black star;
- stages and fit lines (calibration before/after STS, fitted vs run's table)
  are `INK` and `MUTED`; batch-size levels of the cost figures a sequential map.
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

#: How each per-workload quantity fills a bar of the workload's hue.
BAR_STYLES: dict[str, dict] = {
    "window": {"alpha": 0.3},
    "accepted": {"alpha": 1.0},
    "ceiling": {"alpha": 1.0, "fill": False, "hatch": "////"},
    "estimate": {"alpha": 0.6, "hatch": ".."},
    "population": {"alpha": 1.0, "fill": False, "hatch": "xx"},
}

_RUN_STYLES = (
    (INK, "-", "o"),
    (MUTED, "--", "s"),
    (INK, ":", "^"),
    (MUTED, "-.", "D"),
)


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


def run_style(i: int) -> dict:
    """`Axes.plot` keyword arguments of the i-th run (arm) of a report or compare."""
    colour, ls, marker = _RUN_STYLES[i % len(_RUN_STYLES)]
    return {"color": colour, "ls": ls, "marker": marker}


_POLICY_STYLES = (
    (INK, "-", "o"),
    (MUTED, "--", "s"),
    (INK, ":", "^"),
    (MUTED, "-.", "D"),
    (INK, "--", "v"),
    (MUTED, ":", "P"),
)

#: `Axes.plot` keyword arguments of a run's own measured points among predicted policies.
OWN_POINT = {"color": INK, "ls": "none", "marker": "*", "markersize": 11, "zorder": 5}


def policy_style(i: int) -> dict:
    """`Axes.plot` keyword arguments of the i-th verify policy of a what-if figure."""
    colour, ls, marker = _POLICY_STYLES[i % len(_POLICY_STYLES)]
    return {"color": colour, "ls": ls, "marker": marker, "markersize": 4}


def levels(n: int) -> list[str]:
    """`n` colours of a sequential map (batch-size levels): darker means larger."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["viridis"]
    return [to_hex(cmap(0.85 - 0.75 * k / max(1, n - 1))) for k in range(n)]

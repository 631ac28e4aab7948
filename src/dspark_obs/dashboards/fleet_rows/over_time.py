"""The fleet's figures over time, grouped by any labels: the panels the per-node, per-rank
and per-workload rows share, each a sum over a sum over the rate interval (`fleet_promql`).

A row passes its level of series, its grouping, the legend naming a group, and the title
and description it gives the panel; the queries, units and thresholds are written here once.
"""

from __future__ import annotations

from typing import NamedTuple

from ..fleet_promql import (
    Level,
    auroc,
    brier,
    ceiling_estimate,
    ece,
    total,
    utilisation,
    utilisation_estimate,
)
from ..panels import calibration_timeseries, timeseries, utilisation_timeseries
from ..promql import CEILING_LEGEND, RI, known_or_estimated

#: the rate interval, as fleet_promql's window
RATE = RI.strip("[]")

#: each calibration figure's query
CALIBRATION_QUERIES = {"ECE": ece, "Brier": brier, "AUROC": auroc}


class Grouping(NamedTuple):
    """Which series a row reads, the labels it groups them by, and the legend of a group."""

    level: Level
    by: tuple[str, ...]
    legend: str


def committed_rate(title: str, description: str, group: Grouping, **look):
    return timeseries(
        title,
        description,
        "suffix: tok/s",
        [(total(group.level, "committed", group.by, RATE), group.legend)],
        w=8,
        min_val=0,
        **look,
    )


def utilisation_over_time(title: str, description: str, group: Grouping, **look):
    """Exact where the ceiling is known, else over the estimated mean ceiling; the legend
    says which."""
    level, by, legend = group
    known = utilisation(level, by, RATE)
    estimated = utilisation_estimate(level, by, RATE)
    return utilisation_timeseries(
        title,
        description,
        [(known_or_estimated(known, estimated), f"{legend}, {CEILING_LEGEND}")],
        w=8,
        **look,
    )


def ceiling_bounds(group: Grouping) -> list[tuple[str, str]]:
    """The estimated mean ceiling's lower bound, point and upper bound, each a query."""
    level, by, legend = group
    return [
        (ceiling_estimate(level, bound, by, RATE), f"{bound} {legend}")
        for bound in ("lower", "point", "upper")
    ]


def calibration_over_time(figure: str, title: str, description: str, group: Grouping, **look):
    """ECE, Brier or AUROC per group, from the group's summed counters."""
    query = CALIBRATION_QUERIES[figure](group.level, group.by, RATE)
    return calibration_timeseries(figure, title, description, [(query, group.legend)], **look)

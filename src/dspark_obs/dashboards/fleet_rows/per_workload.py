"""The fleet-by-workload row: each figure per (workload, mode) over time, fleet-wide.

The same counters as the fleet row, summed by workload and mode over the rate interval (the
form of fleet.yml's `:ratio_rate5m` rules), and the reliability diagram since start.
"""

from __future__ import annotations

from dataclasses import replace

from ..fleet_promql import NODE, ceiling_mean, per_request_step, reliability
from ..panels import NO_CONFIDENCE, NO_NODE_SUMS, reliability_bars, timeseries
from ..promql import CEILING_SOURCE
from .over_time import (
    RATE,
    Grouping,
    calibration_over_time,
    ceiling_bounds,
    committed_rate,
    utilisation_over_time,
)

BY = ("workload", "mode")
WL = "{{workload}} {{mode}}"


def _reliability(k: int) -> str:
    """Observed share of accepted prefixes in ECE bin k, fleet-wide."""
    return reliability(replace(NODE, selector=f'{NODE.selector}, bin="{k}"'), ())


def panels() -> list:
    empty = (NO_NODE_SUMS,)
    calibration = (NO_CONFIDENCE, NO_NODE_SUMS)
    group = Grouping(NODE, BY, WL)
    return [
        committed_rate(
            "Committed tokens/s by workload",
            "Tokens committed per second, fleet-wide, by workload and mode.",
            group,
            empty=empty,
        ),
        timeseries(
            "Accepted, window and known ceiling by workload",
            "Per request-step over the rate interval: drafts accepted, drafts verified, and "
            "the ceiling where known (observed or shadow), each a sum over a sum.",
            "suffix: tok",
            [
                (per_request_step(NODE, "accepted", BY, RATE), f"accepted {WL}"),
                (per_request_step(NODE, "window", BY, RATE), f"window {WL}"),
                (ceiling_mean(NODE, BY, RATE), f"ceiling {WL}"),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        utilisation_over_time(
            "Utilisation by workload",
            "(ceiling - trim loss) / ceiling over the rate interval, fleet-wide, where the "
            "ceiling is known; else accepted per request-step / the estimated mean ceiling. "
            + CEILING_SOURCE,
            group,
            empty=empty,
        ),
        timeseries(
            "Ceiling estimate with bounds by workload",
            "The estimated mean ceiling (observed blocks and ended walks) with its lower and "
            "upper bounds, over the rate interval.",
            "suffix: tok",
            ceiling_bounds(group),
            empty=empty,
            w=8,
            min_val=0,
        ),
        calibration_over_time(
            "ECE",
            "ECE by workload",
            "Expected calibration error per workload and mode, every position's predictions "
            "together, from the summed bins over the rate interval.",
            group,
            empty=calibration,
            w=8,
        ),
        calibration_over_time(
            "ECE",
            "ECE by position",
            "Expected calibration error at each draft position, every selected workload's "
            "predictions together, from the summed bins over the rate interval.",
            Grouping(NODE, ("position",), "position {{position}}"),
            empty=calibration,
            w=8,
        ),
        calibration_over_time(
            "Brier",
            "Brier by workload",
            "Brier score per workload and mode over the rate interval, every position together.",
            group,
            empty=calibration,
            w=6,
        ),
        calibration_over_time(
            "AUROC",
            "AUROC by workload",
            "AUROC per workload and mode over the rate interval, from the summed AUROC bins; "
            "0.5 is chance.",
            group,
            empty=calibration,
            w=6,
        ),
        reliability_bars(
            "Observed share of accepted prefixes per predicted-survival bin since start, over "
            "every selected node, workload and position: positives / rows of the bin. A "
            "calibrated predictor reads close to the bin's centre.",
            _reliability,
            empty=calibration,
            w=12,
        ),
    ]

"""The fleet-by-workload row: each figure per (workload, mode) over time, fleet-wide.

The same counters as the fleet row, summed by workload and mode over the rate interval (the
form of fleet.yml's `:ratio_rate5m` rules), and the reliability diagram since start.
"""

from __future__ import annotations

from dataclasses import replace

from ...aggregates.confidence import ECE_BINS
from ..fleet_promql import (
    NODE,
    auroc,
    brier,
    ceiling_estimate,
    ceiling_mean,
    ece,
    per_request_step,
    reliability,
    total,
    utilisation,
    utilisation_estimate,
)
from ..panels import (
    AUROC,
    BLUE,
    BRIER,
    ECE,
    NO_CONFIDENCE,
    NO_NODE_SUMS,
    UTILISATION,
    bar_gauge,
    threshold_steps,
    timeseries,
)
from ..promql import CEILING_LEGEND, CEILING_SOURCE, RI, known_or_estimated

BY = ("workload", "mode")
WL = "{{workload}} {{mode}}"


def _reliability() -> list[tuple[str, str]]:
    """Observed share of accepted prefixes in each ECE bin, one query per bin (in bin order)."""
    return [
        (
            reliability(replace(NODE, selector=f'{NODE.selector}, bin="{k}"'), ()),
            f"{k / ECE_BINS:.2f}-{(k + 1) / ECE_BINS:.2f}",
        )
        for k in range(ECE_BINS)
    ]


def panels() -> list:
    w = RI.strip("[]")
    empty = (NO_NODE_SUMS,)
    calibration = (NO_CONFIDENCE, NO_NODE_SUMS)
    return [
        timeseries(
            "Committed tokens/s by workload",
            "Tokens committed per second, fleet-wide, by workload and mode.",
            "suffix: tok/s",
            [(total(NODE, "committed", BY, w), WL)],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Accepted, window and known ceiling by workload",
            "Per request-step over the rate interval: drafts accepted, drafts verified, and "
            "the ceiling where known (observed or shadow), each a sum over a sum.",
            "suffix: tok",
            [
                (per_request_step(NODE, "accepted", BY, w), f"accepted {WL}"),
                (per_request_step(NODE, "window", BY, w), f"window {WL}"),
                (ceiling_mean(NODE, BY, w), f"ceiling {WL}"),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Utilisation by workload",
            "(ceiling - trim loss) / ceiling over the rate interval, fleet-wide, where the "
            "ceiling is known; else accepted per request-step / the estimated mean ceiling. "
            + CEILING_SOURCE,
            "percentunit",
            [
                (
                    known_or_estimated(utilisation(NODE, BY, w), utilisation_estimate(NODE, BY, w)),
                    f"{WL}, {CEILING_LEGEND}",
                )
            ],
            empty=empty,
            thresholds=UTILISATION,
            w=8,
            max_val=1,
        ),
        timeseries(
            "Ceiling estimate with bounds by workload",
            "The estimated mean ceiling (observed blocks and ended walks) with its lower and "
            "upper bounds, over the rate interval.",
            "suffix: tok",
            [
                (ceiling_estimate(NODE, bound, BY, w), f"{bound} {WL}")
                for bound in ("lower", "point", "upper")
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            "ECE by workload",
            "Expected calibration error per workload and mode, every position's predictions "
            "together, from the summed bins over the rate interval.",
            "percentunit",
            [(ece(NODE, BY, w), WL)],
            empty=calibration,
            thresholds=ECE,
            w=8,
            min_val=0,
        ),
        timeseries(
            "ECE by position",
            "Expected calibration error at each draft position, every selected workload's "
            "predictions together, from the summed bins over the rate interval.",
            "percentunit",
            [(ece(NODE, ("position",), w), "position {{position}}")],
            empty=calibration,
            thresholds=ECE,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Brier by workload",
            "Brier score per workload and mode over the rate interval, every position together.",
            "none",
            [(brier(NODE, BY, w), WL)],
            empty=calibration,
            thresholds=BRIER,
            w=6,
            min_val=0,
        ),
        timeseries(
            "AUROC by workload",
            "AUROC per workload and mode over the rate interval, from the summed AUROC bins; "
            "0.5 is chance.",
            "none",
            [(auroc(NODE, BY, w), WL)],
            empty=calibration,
            thresholds=AUROC,
            w=6,
            min_val=0,
            max_val=1,
        ),
        bar_gauge(
            "Reliability by bin",
            "Observed share of accepted prefixes per predicted-survival bin since start, over "
            "every selected node, workload and position: positives / rows of the bin. A "
            "calibrated predictor reads close to the bin's centre.",
            "percentunit",
            _reliability(),
            empty=calibration,
            thresholds=threshold_steps((None, BLUE)),
            w=12,
            max_val=1,
        ),
    ]

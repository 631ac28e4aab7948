"""The fleet row: each figure as one big number over every selected cluster, node and rank.

The figures are since each exporter started (the counters as they stand, what fleet.yml's
`:ratio` rules record), so they equal the same figures computed from the union of the nodes'
run directories; only the two throughput stats are rates.
"""

from __future__ import annotations

from ..fleet_promql import (
    NODE,
    ceiling_estimate,
    ceiling_mean,
    per_request_step,
    total,
    utilisation_estimate,
)
from ..fleet_promql import utilisation as utilisation_q
from ..panels import (
    CALIBRATION_FIGURES,
    NO_CONFIDENCE,
    NO_NODE_SUMS,
    UTILISATION,
    stat_panel,
)
from ..promql import CEILING_LEGEND, CEILING_SOURCE, known_or_estimated
from .over_time import CALIBRATION_QUERIES, RATE

SINCE = " Since each exporter started, over the selected clusters, nodes, workloads and modes."


def _calibration_stat(figure: str, description: str, decimals: int = 2):
    """ECE, Brier or AUROC since start over every selected series' summed counters."""
    unit, thresholds, _ = CALIBRATION_FIGURES[figure]
    return stat_panel(
        figure,
        description + SINCE,
        unit,
        [(CALIBRATION_QUERIES[figure](NODE, ()), figure)],
        empty=(NO_CONFIDENCE, NO_NODE_SUMS),
        thresholds=thresholds,
        w=8,
        decimals=decimals,
    )


def panels() -> list:
    empty = (NO_NODE_SUMS,)
    return [
        stat_panel(
            "Committed tokens/s",
            "Tokens committed per second (accepted drafts plus the bonus token), summed over "
            "the selected clusters, nodes, workloads and modes.",
            "locale",
            [(total(NODE, "committed", (), RATE), "committed")],
            empty=empty,
            w=3,
            decimals=0,
        ),
        stat_panel(
            "Request-steps/s",
            "Requests verified per second (one request in one verify step), fleet-wide.",
            "locale",
            [(total(NODE, "request_steps", (), RATE), "request-steps")],
            empty=empty,
            w=3,
            decimals=0,
        ),
        stat_panel(
            "Mean accepted",
            "Drafts the target accepted per request-step: accepted tokens / request-steps." + SINCE,
            "suffix: tok",
            [(per_request_step(NODE, "accepted", ()), "accepted")],
            empty=empty,
            w=3,
        ),
        stat_panel(
            "Mean window",
            "Drafts verified per request-step: window tokens / request-steps." + SINCE,
            "suffix: tok",
            [(per_request_step(NODE, "window", ()), "window")],
            empty=empty,
            w=3,
        ),
        stat_panel(
            "Utilisation",
            "Accepted / ceiling: (ceiling - trim loss) / ceiling over request-steps whose "
            "ceiling is known, else accepted per request-step / the estimated mean ceiling, "
            "from the summed counters." + SINCE + " " + CEILING_SOURCE,
            "percentunit",
            [
                (
                    known_or_estimated(utilisation_q(NODE, ()), utilisation_estimate(NODE, ())),
                    CEILING_LEGEND,
                )
            ],
            empty=empty,
            thresholds=UTILISATION,
            w=3,
            named=True,
        ),
        stat_panel(
            "Mean ceiling",
            "Drafts full-block verification accepts per request-step: ceiling sum / count "
            "where known (observed or shadow), else the estimate's point."
            + SINCE
            + " "
            + CEILING_SOURCE,
            "suffix: tok",
            [
                (
                    known_or_estimated(ceiling_mean(NODE, ()), ceiling_estimate(NODE, "point", ())),
                    CEILING_LEGEND,
                )
            ],
            empty=empty,
            w=3,
            named=True,
        ),
        stat_panel(
            "Ceiling estimate",
            "The estimated mean ceiling and its bounds: (observed ceilings + the ended walks' "
            "lower / point / upper sums) / (observed blocks + ended walks)." + SINCE,
            "suffix: tok",
            [(ceiling_estimate(NODE, bound, ()), bound) for bound in ("lower", "point", "upper")],
            empty=empty,
            w=6,
        ),
        _calibration_stat(
            "ECE",
            "Expected calibration error of predicted survival, every draft position's "
            "predictions together: sum over the 15 bins of |predicted - accepted| / rows, "
            "bins summed before the difference (ECE cannot be averaged).",
        ),
        _calibration_stat(
            "Brier",
            "Brier score of predicted survival against the prefix label, every position "
            "together: (sum p² - 2 sum of accepted p + accepted) / rows.",
            decimals=3,
        ),
        _calibration_stat(
            "AUROC",
            "How well predicted survival ranks accepted above rejected prefixes, from the 30 "
            "summed AUROC bins (exact for those bins); 0.5 is chance.",
            decimals=3,
        ),
    ]

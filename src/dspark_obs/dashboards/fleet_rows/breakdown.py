"""The per-node and per-rank rows: every figure broken down by exporter, or by its ranks.

Per node reads fleet.yml's `instance:` sums (what a global Prometheus federates); per rank
reads the exporters' own counters, which only the node's Prometheus holds unless they are
federated or remote-written whole (docs/dashboards.md). Both rows are the same panels with
another grouping; a rank's legend names its exporter, since two nodes both have a rank 0.
ECE and AUROC come from the calibration bins, which an exporter sums over its ranks (the
series budget, docs/metrics.md): the per-rank row shows Brier, whose counters are per rank,
and leaves them to the per-node and per-workload rows.
"""

from __future__ import annotations

from ..fleet_promql import (
    NODE,
    RANK,
    Level,
    auroc,
    brier,
    ceiling_estimate,
    ceiling_mean,
    ece,
    per_request_step,
    total,
    utilisation,
    utilisation_estimate,
)
from ..panels import (
    AUROC,
    BRIER,
    ECE,
    NO_CONFIDENCE,
    NO_NODE_SUMS,
    NO_RANK_COUNTERS,
    UTILISATION,
    timeseries,
)
from ..promql import CEILING_LEGEND, CEILING_SOURCE, RI, known_or_estimated


def _panels(level: Level, by: tuple[str, ...], legend: str, noun: str) -> list:
    w = RI.strip("[]")
    binned = "rank" not in by  # the calibration bins are summed over ranks
    empty = (NO_RANK_COUNTERS if level.rank else NO_NODE_SUMS,)
    calibration = (NO_CONFIDENCE, *empty)
    panels = [
        timeseries(
            f"Committed tokens/s by {noun}",
            f"Tokens committed per second per {noun}, over the selected workloads and modes.",
            "suffix: tok/s",
            [(total(level, "committed", by, w), legend)],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            f"Accepted and window by {noun}",
            f"Drafts accepted and drafts verified per request-step, per {noun}, over the rate "
            "interval.",
            "suffix: tok",
            [
                (per_request_step(level, "accepted", by, w), f"accepted {legend}"),
                (per_request_step(level, "window", by, w), f"window {legend}"),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            f"Utilisation by {noun}",
            f"(ceiling - trim loss) / ceiling per {noun} over the rate interval, on "
            "request-steps whose ceiling is known; else accepted per request-step / the "
            "estimated mean ceiling. " + CEILING_SOURCE,
            "percentunit",
            [
                (
                    known_or_estimated(
                        utilisation(level, by, w), utilisation_estimate(level, by, w)
                    ),
                    f"{legend}, {CEILING_LEGEND}",
                )
            ],
            empty=empty,
            thresholds=UTILISATION,
            w=8,
            max_val=1,
        ),
        timeseries(
            f"Ceiling by {noun}: known mean and estimate with bounds",
            f"Per {noun} over the rate interval: the mean ceiling where known (observed or "
            "shadow) and the estimated mean ceiling with its lower and upper bounds.",
            "suffix: tok",
            [
                (ceiling_mean(level, by, w), f"known {legend}"),
                *(
                    (ceiling_estimate(level, bound, by, w), f"{bound} {legend}")
                    for bound in ("lower", "point", "upper")
                ),
            ],
            empty=empty,
            w=12,
            min_val=0,
        ),
        binned
        and timeseries(
            f"ECE by {noun}",
            f"Expected calibration error per {noun}, every position together, from its "
            "summed bins over the rate interval.",
            "percentunit",
            [(ece(level, by, w), legend)],
            empty=calibration,
            thresholds=ECE,
            w=4,
            min_val=0,
        ),
        timeseries(
            f"Brier by {noun}",
            f"Brier score per {noun} over the rate interval, every position together.",
            "none",
            [(brier(level, by, w), legend)],
            empty=calibration,
            thresholds=BRIER,
            w=4 if binned else 12,
            min_val=0,
        ),
        binned
        and timeseries(
            f"AUROC by {noun}",
            f"AUROC per {noun} from its summed ECE bins over the rate interval (ties within "
            "a bin counted half).",
            "none",
            [(auroc(level, by, w), legend)],
            empty=calibration,
            thresholds=AUROC,
            w=4,
            min_val=0,
            max_val=1,
        ),
    ]
    return [p for p in panels if p]


def per_node() -> list:
    return _panels(NODE, ("cluster", "instance"), "{{instance}} {{cluster}}", "node")


def per_rank() -> list:
    return _panels(
        RANK, ("cluster", "instance", "rank"), "r{{rank}} @{{instance}} {{cluster}}", "rank"
    )

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

from ..fleet_promql import NODE, RANK, Level, ceiling_mean, per_request_step
from ..panels import NO_CONFIDENCE, NO_NODE_SUMS, NO_RANK_COUNTERS, timeseries
from ..promql import CEILING_SOURCE
from .over_time import (
    RATE,
    Grouping,
    calibration_over_time,
    ceiling_bounds,
    committed_rate,
    utilisation_over_time,
)


def _panels(level: Level, by: tuple[str, ...], legend: str, noun: str) -> list:
    binned = "rank" not in by  # the calibration bins are summed over ranks
    empty = (NO_RANK_COUNTERS if level.rank else NO_NODE_SUMS,)
    calibration = (NO_CONFIDENCE, *empty)
    group = Grouping(level, by, legend)
    panels = [
        committed_rate(
            f"Committed tokens/s by {noun}",
            f"Tokens committed per second per {noun}, over the selected workloads and modes.",
            group,
            empty=empty,
        ),
        timeseries(
            f"Accepted and window by {noun}",
            f"Drafts accepted and drafts verified per request-step, per {noun}, over the rate "
            "interval.",
            "suffix: tok",
            [
                (per_request_step(level, "accepted", by, RATE), f"accepted {legend}"),
                (per_request_step(level, "window", by, RATE), f"window {legend}"),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        utilisation_over_time(
            f"Utilisation by {noun}",
            f"(ceiling - trim loss) / ceiling per {noun} over the rate interval, on "
            "request-steps whose ceiling is known; else accepted per request-step / the "
            "estimated mean ceiling. " + CEILING_SOURCE,
            group,
            empty=empty,
        ),
        timeseries(
            f"Ceiling by {noun}: known mean and estimate with bounds",
            f"Per {noun} over the rate interval: the mean ceiling where known (observed or "
            "shadow) and the estimated mean ceiling with its lower and upper bounds.",
            "suffix: tok",
            [(ceiling_mean(level, by, RATE), f"known {legend}"), *ceiling_bounds(group)],
            empty=empty,
            w=12,
            min_val=0,
        ),
        binned
        and calibration_over_time(
            "ECE",
            f"ECE by {noun}",
            f"Expected calibration error per {noun}, every position together, from its "
            "summed bins over the rate interval.",
            group,
            empty=calibration,
            w=4,
        ),
        calibration_over_time(
            "Brier",
            f"Brier by {noun}",
            f"Brier score per {noun} over the rate interval, every position together.",
            group,
            empty=calibration,
            w=4 if binned else 12,
        ),
        binned
        and calibration_over_time(
            "AUROC",
            f"AUROC by {noun}",
            f"AUROC per {noun} from its summed ECE bins over the rate interval (ties within "
            "a bin counted half).",
            group,
            empty=calibration,
            w=4,
        ),
    ]
    return [p for p in panels if p]


def per_node() -> list:
    return _panels(NODE, ("cluster", "instance"), "{{instance}} {{cluster}}", "node")


def per_rank() -> list:
    return _panels(
        RANK, ("cluster", "instance", "rank"), "r{{rank}} @{{instance}} {{cluster}}", "rank"
    )

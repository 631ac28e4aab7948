"""The estimator-health row: are the ceiling walks resolving, and how sure are they?

The estimated ceiling is only as good as the walks behind it; this row shows their flow
(trimmed, resolved, censored, skipped), the backlog and the width of the interval.
"""

from __future__ import annotations

from ..panels import GREEN, NO_SERIES, RED, YELLOW, threshold_steps, timeseries
from ..promql import REQ, RI


def panels() -> list:
    empty = (NO_SERIES,)
    return [
        timeseries(
            "Ceiling walks",
            "Per second: trimmed request-steps whose tail is walked, walks resolved (greedy "
            "exact, sampled with an interval), censored (request ended first: lower bounds), "
            "and skipped (no walk possible: population estimate only).",
            "ops",
            [
                (f"sum(rate(dspark_estimator_trimmed_blocks_total{{{REQ}}}{RI}))", "trimmed"),
                (
                    f"sum by (source) (rate(dspark_estimator_resolved_blocks_total{{{REQ}}}{RI}))",
                    "resolved {{source}}",
                ),
                (
                    f"sum by (source) (rate(dspark_estimator_censored_blocks_total{{{REQ}}}{RI}))",
                    "censored {{source}}",
                ),
                (f"sum(rate(dspark_estimator_skipped_blocks_total{{{REQ}}}{RI}))", "skipped"),
            ],
            empty=empty,
            w=10,
            min_val=0,
        ),
        timeseries(
            "Pending walks",
            "Walks open now (their request has not mismatched or ended yet).",
            "short",
            [(f"sum(dspark_estimator_pending_blocks{{{REQ}}})", "pending")],
            empty=empty,
            w=6,
            min_val=0,
        ),
        timeseries(
            "Ceiling estimate interval width",
            "Upper - lower bound of the walk estimate of the mean ceiling over the last N steps; "
            "wide means sampled walks leave the ceiling uncertain.",
            "suffix: tok",
            [
                (
                    f"dspark_ceiling_estimate_upper_tokens{{{REQ}}} - "
                    f"dspark_ceiling_estimate_lower_tokens{{{REQ}}}",
                    "{{workload}} {{mode}} r{{rank}} @{{instance}}",
                )
            ],
            empty=empty,
            thresholds=threshold_steps((None, GREEN), (0.25, YELLOW), (1, RED)),
            w=8,
            min_val=0,
        ),
    ]

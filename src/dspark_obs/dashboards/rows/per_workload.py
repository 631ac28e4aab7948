"""The per-workload row: where trimming saves verify tokens and where it costs acceptance.

Workloads differ most in how long an accepted run is, so the window, the ceiling and the
verify-length distribution are shown per workload.
"""

from __future__ import annotations

from ..panels import NO_SERIES, bar_gauge, timeseries, utilisation_timeseries
from ..promql import CEILING_LEGEND, CEILING_SOURCE, REQ, rate_mean, utilisation


def panels() -> list:
    empty = (NO_SERIES,)
    window_dist = [
        (
            f"sum by (le) (increase(dspark_window_tokens_bucket{{{REQ}}}[$__range]))",
            "{{le}}",
        )
    ]
    return [
        timeseries(
            "Window vs ceiling by workload",
            "Mean verified window and mean ceiling (observed or shadow; else the walk estimate) "
            "per request-step, by workload. The gap between the two lines is what trimming "
            "saves in verify tokens; the gap between accepted and ceiling is what it costs.",
            "suffix: tok",
            [
                (rate_mean("dspark_window_tokens", REQ, "workload"), "window {{workload}}"),
                (rate_mean("dspark_accepted_tokens", REQ, "workload"), "accepted {{workload}}"),
                (rate_mean("dspark_ceiling_tokens", REQ, "workload"), "ceiling {{workload}}"),
                (
                    f'avg by (workload) (dspark_ceiling_estimate_tokens{{{REQ}, source="walk"}})',
                    "estimated ceiling {{workload}}",
                ),
            ],
            empty=empty,
            w=12,
            min_val=0,
        ),
        bar_gauge(
            "Verify-length distribution",
            "Request-steps by drafts verified (window, 0..gamma) over the dashboard's time "
            "range, from dspark_window_tokens_bucket (cumulative buckets turned into counts "
            "per length by the heatmap format).",
            "short",
            window_dist,
            empty=empty,
            fmt="heatmap",
            w=6,
        ),
        utilisation_timeseries(
            "Utilisation by workload",
            "Accepted / ceiling over the rate window by workload: 1 - trim loss / ceiling "
            "where the ceiling is known, else mean accepted / the estimated mean ceiling. "
            + CEILING_SOURCE,
            [(utilisation(REQ, "workload"), "{{workload}}, " + CEILING_LEGEND)],
            empty=empty,
            w=6,
        ),
    ]

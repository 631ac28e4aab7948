"""The load row: what the scheduler gives each request as the batch grows.

Budget, verify tokens and batch size come from the per-step histograms, so they filter on
the step label set (no workload).
"""

from __future__ import annotations

from ..panels import NO_SERIES, heatmap_panel, timeseries
from ..promql import STEP, rate_mean, rate_sum, ratio


def panels() -> list:
    empty = (NO_SERIES,)
    return [
        timeseries(
            "Budget and verify tokens per step",
            "Per verify step: the scheduler budget K (extra verify tokens beyond one anchor per "
            "request; compact and cap-accept only), the verify tokens after rounding up to the "
            "graph tier, and the batch size, from the step histograms.",
            "short",
            [
                (rate_mean("dspark_budget_tokens", STEP), "budget K"),
                (rate_mean("dspark_verify_tokens", STEP), "verify tokens"),
                (rate_mean("dspark_graph_tier_tokens", STEP), "graph tier"),
                (rate_mean("dspark_batch_size", STEP), "batch size"),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Tokens per request vs batch size",
            "Budget and verify tokens per request (÷ mean batch size): as the batch grows the "
            "scheduler gives each request a smaller window.",
            "short",
            [
                (
                    ratio(
                        rate_sum("dspark_budget_tokens_sum", STEP),
                        rate_sum("dspark_batch_size_sum", STEP),
                    ),
                    "budget per request",
                ),
                (
                    ratio(
                        rate_sum("dspark_verify_tokens_sum", STEP),
                        rate_sum("dspark_batch_size_sum", STEP),
                    ),
                    "verify tokens per request",
                ),
            ],
            empty=empty,
            w=8,
            min_val=0,
        ),
        heatmap_panel(
            "Batch size distribution",
            "Verify steps by requests per step (power-of-two buckets) over time.",
            "short",
            rate_sum("dspark_batch_size_bucket", STEP, "le"),
            empty=empty,
            w=8,
        ),
    ]

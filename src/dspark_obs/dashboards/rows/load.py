"""The load row: what the scheduler gives each request as the batch grows.

Budget, verify tokens and batch size come from the per-step histograms, so they filter on
the step label set (no workload).
"""

from __future__ import annotations

from ..panels import heatmap_panel, timeseries
from ..promql import RI, STEP, rate_mean


def panels() -> list:
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
                    f"sum(rate(dspark_budget_tokens_sum{{{STEP}}}{RI})) / "
                    f"sum(rate(dspark_batch_size_sum{{{STEP}}}{RI}))",
                    "budget per request",
                ),
                (
                    f"sum(rate(dspark_verify_tokens_sum{{{STEP}}}{RI})) / "
                    f"sum(rate(dspark_batch_size_sum{{{STEP}}}{RI}))",
                    "verify tokens per request",
                ),
            ],
            w=8,
            min_val=0,
        ),
        heatmap_panel(
            "Batch size distribution",
            "Verify steps by requests per step (power-of-two buckets) over time.",
            "short",
            f"sum by (le) (rate(dspark_batch_size_bucket{{{STEP}}}{RI}))",
            w=8,
        ),
    ]

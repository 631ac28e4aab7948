"""How the scheduler spent the block: the share of request-steps at each window length.

The article's figure 4 (right): a workload the drafter predicts well fills the
whole block most steps, a hard one rarely verifies more than a few drafts.
Shares are of request-steps per workload, so they sum to 1 per workload.
"""

from __future__ import annotations

import polars as pl


def window_shares(requests: pl.LazyFrame, gamma: int) -> pl.DataFrame:
    """`workload, window, request_steps, share` for every window 0..gamma of every workload."""
    counts = requests.group_by("workload", "window").agg(pl.len().alias("request_steps")).collect()
    workloads = counts.select("workload").unique()
    grid = workloads.join(
        pl.DataFrame({"window": list(range(gamma + 1))}, schema={"window": pl.Int64}),
        how="cross",
    )
    return (
        grid.join(counts, on=["workload", "window"], how="left", nulls_equal=True)
        .with_columns(pl.col("request_steps").fill_null(0))
        .with_columns(
            (pl.col("request_steps") / pl.col("request_steps").sum().over("workload")).alias(
                "share"
            )
        )
        .sort("workload", "window", nulls_last=True)
    )

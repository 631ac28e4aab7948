"""How the scheduler spent the block: the share of request-steps at each window length.

The article's figure 4 (right): a workload the drafter predicts well fills the
whole block most steps, a hard one rarely verifies more than a few drafts.
Shares are of request-steps per workload, so they sum to 1 per workload. The counts
add across runs, so a fleet's shares are its runs' counts added (`fleet_window_shares`).
"""

from __future__ import annotations

import polars as pl


def window_counts(requests: pl.LazyFrame) -> pl.DataFrame:
    """`workload, window, request_steps`: the sums a window share is a ratio of."""
    return (
        requests.group_by("workload", "window")
        .agg(pl.len().alias("request_steps"))
        .collect(engine="streaming")
    )


def shares_from_counts(counts: pl.DataFrame, gamma: int) -> pl.DataFrame:
    """`workload, window, request_steps, share` for every window 0..gamma of every workload."""
    workloads = counts.select("workload").unique()
    grid = workloads.join(
        pl.DataFrame({"window": list(range(gamma + 1))}, schema={"window": pl.Int64}),
        how="cross",
    )
    return (
        grid.join(
            counts.with_columns(pl.col("window").cast(pl.Int64)),
            on=["workload", "window"],
            how="left",
            nulls_equal=True,
        )
        .with_columns(pl.col("request_steps").fill_null(0))
        .with_columns(
            (pl.col("request_steps") / pl.col("request_steps").sum().over("workload")).alias(
                "share"
            )
        )
        .sort("workload", "window", nulls_last=True)
    )


def window_shares(requests: pl.LazyFrame, gamma: int) -> pl.DataFrame:
    """The window shares of one run's request-steps."""
    return shares_from_counts(window_counts(requests), gamma)


def fleet_window_shares(counts: list[pl.DataFrame], gamma: int) -> pl.DataFrame:
    """The window shares of many runs from each run's `window_counts` (the map), added."""
    added = (
        pl.concat(counts, how="vertical_relaxed")
        .group_by("workload", "window")
        .agg(pl.col("request_steps").sum())
    )
    return shares_from_counts(added, gamma)

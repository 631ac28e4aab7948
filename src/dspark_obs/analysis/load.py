"""Throughput against per-user speed as load grows: the article's figures 1 and 3.

Each verify step of batch size bs commits `sum(acc_len)` tokens in its step
time. A rank's throughput at a load is its committed tokens over its step
time; data-parallel ranks run side by side, so the server's throughput is the
sum over ranks. A request experiences every step it is in, so per-user speed
is committed tokens over the step time summed per request-step.

The reference runtime sweeps a few fixed concurrency levels; a real server's
batch size drifts step to step, so when a run has many distinct batch sizes
they are pooled into power-of-two bands labelled by their mean batch size.
"""

from __future__ import annotations

import polars as pl

from ..store import Run
from .step_time import measured_step_ms

#: More distinct batch sizes than this and the load curve uses power-of-two bands.
MAX_EXACT_LEVELS = 16


def step_tokens(run: Run) -> pl.LazyFrame:
    """The steps table with `committed` (tokens committed in the step) and `seconds` added."""
    committed = (
        run.requests()
        .group_by("rank", "forward_ct")
        .agg(pl.col("acc_len").sum().alias("committed"))
    )
    return (
        run.steps()
        .join(committed, on=["rank", "forward_ct"], how="left")
        .with_columns(
            pl.col("committed").fill_null(0),
            (measured_step_ms() / 1e3).alias("seconds"),
        )
    )


def load_level(steps: pl.LazyFrame) -> pl.Expr:
    """The load level of a step: its batch size, or its power-of-two band when `steps`
    has more than `MAX_EXACT_LEVELS` distinct batch sizes."""
    levels = steps.select(pl.col("bs").n_unique()).collect().item()
    if levels > MAX_EXACT_LEVELS:
        return (2 ** pl.col("bs").cast(pl.Float64).log(2).floor()).cast(pl.Int64)
    return pl.col("bs")


def load_curve(run: Run) -> pl.DataFrame:
    """One row per load level: steps, batch size, budget per request, throughput, per-user speed.

    `throughput_tokens_per_s` and `per_user_tokens_per_s` are null when the run
    has no step times.
    """
    steps = step_tokens(run).filter(pl.col("bs") > 0)
    level = load_level(steps)
    timed = pl.col("seconds").is_not_null() & (pl.col("seconds") > 0)
    per_rank = (
        steps.with_columns(level.alias("level"))
        .group_by("level", "rank")
        .agg(
            pl.len().alias("steps"),
            pl.col("bs").sum().alias("request_steps"),
            pl.col("committed").sum().alias("committed"),
            pl.col("committed").filter(timed).sum().alias("timed_committed"),
            pl.col("seconds").filter(timed).sum().alias("seconds"),
            (pl.col("seconds") * pl.col("bs")).filter(timed).sum().alias("user_seconds"),
            timed.sum().alias("timed_steps"),
            pl.col("budget").sum().alias("budget"),
            pl.col("budget").is_not_null().sum().alias("budget_steps"),
            pl.col("bs").filter(pl.col("budget").is_not_null()).sum().alias("budget_bs"),
            pl.col("num_verify_tokens").sum().alias("verify_tokens"),
        )
    )
    rank_rate = pl.col("timed_committed") / pl.col("seconds")
    return (
        per_rank.group_by("level")
        .agg(
            pl.col("steps").sum(),
            pl.col("rank").n_unique().alias("ranks"),
            (pl.col("request_steps").sum() / pl.col("steps").sum()).alias("mean_bs"),
            pl.col("committed").sum(),
            pl.when(pl.col("timed_steps").sum() > 0)
            .then(rank_rate.filter(pl.col("seconds") > 0).sum())
            .alias("throughput_tokens_per_s"),
            pl.when(pl.col("timed_steps").sum() > 0)
            .then(pl.col("timed_committed").sum() / pl.col("user_seconds").sum())
            .alias("per_user_tokens_per_s"),
            pl.when(pl.col("budget_steps").sum() > 0)
            .then(pl.col("budget").sum() / pl.col("budget_bs").sum())
            .alias("budget_per_request"),
            (pl.col("verify_tokens").sum() / pl.col("steps").sum()).alias("verify_tokens_per_step"),
            pl.when(pl.col("timed_steps").sum() > 0)
            .then(pl.col("seconds").sum() * 1e3 / pl.col("timed_steps").sum())
            .alias("mean_step_ms"),
        )
        .rename({"level": "bs"})
        .sort("bs")
        .collect()
    )

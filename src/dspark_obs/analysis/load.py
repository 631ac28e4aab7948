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

import numpy as np
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


def _level(distinct_bs: int) -> pl.Expr:
    if distinct_bs > MAX_EXACT_LEVELS:
        return (2 ** pl.col("bs").cast(pl.Float64).log(2).floor()).cast(pl.Int64)
    return pl.col("bs")


def load_level(steps: pl.LazyFrame) -> pl.Expr:
    """The load level of a step: its batch size, or its power-of-two band when `steps`
    has more than `MAX_EXACT_LEVELS` distinct batch sizes."""
    return _level(steps.select(pl.col("bs").n_unique()).collect().item())


def sweep_level(run: Run) -> pl.Expr | None:
    """Each step's configured concurrency where the run is the reference runtime's sweep
    (`forward_ct` through `config.concurrency`'s levels in order, repeated), else None.

    Where the server retracts requests, a step's batch size is the concurrency less the
    requests parked at that moment, and which steps dip into a lower band depends on the
    verify policy (it moves requests through the stream points where they are retracted
    at another pace): bands of batch size then compare different steps of two runs. The
    configured concurrency is the load an operator set, the same steps under every policy.
    """
    if run.manifest.get("source") != "runtime":
        return None
    config = run.manifest.get("config") or {}
    levels = config.get("concurrency")
    steps = config.get("level_steps") or [config.get("steps_per_level")] * len(levels or [])
    if not levels or not all(isinstance(v, int) and v > 0 for v in [*levels, *steps]):
        return None
    ends = np.cumsum(steps)
    at = pl.col("forward_ct") % int(ends[-1])
    expr = pl.lit(int(levels[-1]), pl.Int64)
    for end, level in zip(ends[-2::-1].tolist(), levels[-2::-1], strict=True):
        expr = pl.when(at < end).then(pl.lit(int(level), pl.Int64)).otherwise(expr)
    return expr


def run_load_level(run: Run, steps: pl.LazyFrame) -> pl.Expr:
    """The load level of a step of `run` as `whatif` reads it: the configured concurrency
    where the run records its sweep (`sweep_level`), else `load_level`."""
    level = sweep_level(run)
    return load_level(steps) if level is None else level


def _busy_steps(run: Run) -> pl.LazyFrame:
    return step_tokens(run).filter(pl.col("bs") > 0)


def _per_rank(steps: pl.LazyFrame, level: pl.Expr) -> pl.LazyFrame:
    """Sums per (level, rank): what every figure of the curve is a ratio or a sum of."""
    timed = pl.col("seconds").is_not_null() & (pl.col("seconds") > 0)
    return (
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


def _curve(per_rank: pl.LazyFrame) -> pl.DataFrame:
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


def load_curve(run: Run) -> pl.DataFrame:
    """One row per load level: steps, batch size, budget per request, throughput, per-user speed.

    `throughput_tokens_per_s` and `per_user_tokens_per_s` are null when the run
    has no step times.
    """
    steps = _busy_steps(run)
    return _curve(_per_rank(steps, load_level(steps)))


def fleet_load_sums(run: Run, node: str) -> pl.DataFrame:
    """One run's sums per (batch size, rank), its ranks named `node/rank`: the fleet load
    curve's map. The bands follow the distinct batch sizes of all runs together, known only
    once every run is read, so a run's sums stay per exact batch size."""
    return (
        _per_rank(_busy_steps(run), pl.col("bs"))
        .collect(engine="streaming")
        .with_columns(pl.format("{}/{}", pl.lit(node), pl.col("rank")).alias("rank"))
    )


def fleet_load_of_sums(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """`load_curve` of many runs from their `fleet_load_sums`: the map's reduce. A (node,
    rank) is a rank of the fleet, so throughput sums over every node's ranks; each run's
    batch sizes are pooled into the fleet's levels before the runs are put together."""
    sums = [c for c in parts[0].columns if c not in ("level", "rank")]
    distinct = pl.concat([p.select("level") for p in parts])["level"].n_unique()
    level = _level(distinct)
    leveled = [
        p.rename({"level": "bs"})
        .with_columns(level.alias("level"))
        .group_by("level", "rank")
        .agg(pl.col(sums).sum())
        for p in parts
    ]
    return _curve(pl.concat(leveled, how="vertical_relaxed").lazy())

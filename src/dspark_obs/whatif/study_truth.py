"""What a real run measured per cell: the truth the what-if study holds predictions to.

Computed from the run's tables alone (polars group-bys), not by `whatif`, so that a
prediction is held to an independent computation of the same definitions.
"""

from __future__ import annotations

import polars as pl


def measured_cells(run) -> dict:
    """`{(level, workload): figures}` of a run as measured, from its tables alone.

    tokens/s is the cell's committed tokens over its request-steps' share of step time
    (`T / bs` each; for `all` the level's throughput), per-request tokens/s committed
    tokens over the step time its requests sat through: the definitions `whatif` predicts.
    """
    from ..analysis.load import run_load_level, step_tokens

    steps = step_tokens(run).filter(pl.col("bs") > 0)
    level = run_load_level(run, steps).alias("level")
    steps = steps.select("rank", "forward_ct", "bs", "seconds", level)
    rows = run.requests().join(steps, on=["rank", "forward_ct"]).collect()
    rows = rows.select(
        "level",
        "workload",
        "rid",
        pl.col("acc_len").cast(pl.Float64),
        pl.col("correct_drafts").cast(pl.Float64),
        "seconds",
        (pl.col("seconds") / pl.col("bs")).alias("share"),
    )
    figures = [
        (pl.col("acc_len").sum() / pl.col("share").sum()).alias("tokens_per_s"),
        (pl.col("acc_len").sum() / pl.col("seconds").sum()).alias("per_request_tokens_per_s"),
        pl.col("correct_drafts").mean().alias("mean_accepted"),
        pl.len().alias("request_steps"),
        (pl.col("seconds").mean() * 1e3).alias("step_ms"),
    ]
    whole = (
        rows.group_by("level")
        .agg(*figures[:4])
        .join(
            steps.group_by("level")
            .agg((pl.col("seconds").mean() * 1e3).alias("step_ms"))
            .collect(),
            on="level",
        )
        .join(_standard_errors(rows, ["level"]), on="level")
    )
    out = {(r["level"], "all"): r for r in whole.iter_rows(named=True)}
    parts = rows.group_by("level", "workload").agg(*figures)
    parts = parts.join(_standard_errors(rows, ["level", "workload"]), on=["level", "workload"])
    for r in parts.iter_rows(named=True):
        out[(r["level"], r["workload"])] = r
    return out


def _standard_errors(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per cell, the standard error of its measured tokens/s (committed over share of step
    time), clustered by request: the sampling noise of one real run's figure, which no
    prediction can be held to more closely."""
    per_request = rows.group_by(*keys, "rid").agg(pl.col("acc_len").sum(), pl.col("share").sum())
    rate = (pl.col("acc_len").sum() / pl.col("share").sum()).over(keys)
    resid = (pl.col("acc_len") - rate * pl.col("share")) ** 2
    return per_request.group_by(keys).agg(
        (resid.sum().sqrt() / pl.col("share").sum()).alias("tokens_per_s_se")
    )

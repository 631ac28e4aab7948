"""How the ceiling estimates hold across worlds and seeds: the all-step mean against truth.

The figure an operator reads is a workload's mean ceiling over every request-step
(exact where the step was not trimmed, the walk's estimate where it was), for sampled
and greedy requests apart. Here it is computed from a reference-runtime run, whose
cap-accept shadow twin gives every request-step's true ceiling, on both paths: the
run's own walks (in band) and the walk over the block-accept JSONL the run wrote as
SGLang's recorder writes it. `recording/study.py` makes the runs, for each world the
runtime has (`runtime/worlds.py`) and many seeds; the figures are the error of the
mean and whether its interval covers the truth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from dspark_obs.store import Run

from .evaluate import bound_aggs, walked_blocks
from .interval import aggregate_interval


def all_step_means(run: Run) -> dict[tuple[str, str], dict]:
    """Per (workload, method): the all-step mean ceiling's estimate, interval and truth."""
    gamma = int(run.manifest["gamma"])
    keys = ["rank", "forward_ct", "rid"]
    req = (
        run.requests()
        .select(
            *keys,
            "workload",
            "greedy",
            "window",
            "correct_drafts",
            pl.coalesce("ceiling", "shadow_ceiling").alias("truth"),
        )
        .collect()
    )
    blocks = walked_blocks(run).select(*keys, "lo", "point", "hi", "var", "var_hi").collect()
    rows = req.join(blocks, on=keys, how="left")
    trimmed = (pl.col("correct_drafts") == pl.col("window")) & (pl.col("window") < gamma)
    exact = pl.col("correct_drafts").cast(pl.Float64)
    rows = rows.with_columns(
        pl.when(pl.col("greedy") == 1).then(pl.lit("greedy")).otherwise(pl.lit("sampled"))
        .alias("method"),
        # a trimmed step no walk covered is only known to lie in [window, gamma]
        pl.when(trimmed).then(pl.coalesce("lo", "window")).otherwise(exact).alias("lo"),
        pl.when(trimmed).then(pl.col("point")).otherwise(exact).alias("point"),
        pl.when(trimmed).then(pl.coalesce("hi", pl.lit(float(gamma)))).otherwise(exact).alias("hi"),
        pl.when(trimmed).then(pl.col("var").fill_null(0.0)).otherwise(0.0).alias("var"),
        pl.when(trimmed).then(pl.col("var_hi").fill_null(0.0)).otherwise(0.0).alias("var_hi"),
        # the most a step's ceiling could be: gamma where trimmed, else the exact one
        pl.when(trimmed).then(pl.lit(float(gamma))).otherwise(exact).alias("most"),
        pl.when(trimmed).then(pl.col("window").cast(pl.Float64)).otherwise(exact).alias("least"),
    )  # fmt: skip
    out = {}
    for (workload, method), part in rows.group_by("workload", "method"):
        n = part.height
        truth = float(part["truth"].mean())
        point = None if part["point"].null_count() else float(part["point"].mean())
        sums = part.select(
            *(pl.col(c).sum() for c in ("lo", "hi", "var", "var_hi", "least", "most")),
            *bound_aggs("var_hi", gamma),
        ).row(0, named=True)
        lo, hi = aggregate_interval(n, **sums)
        out[(workload, method)] = {
            "steps": n,
            "truth": truth,
            "point": point,
            "interval": [lo, hi],
            "error": None if point is None or truth == 0 else point / truth - 1.0,
            "covered": lo <= truth <= hi,
        }
    return out


def jsonl_all_step_means(path: Path, run: Run) -> dict[tuple[str, str], dict]:
    """Per workload, the sampled all-step mean from the block-accept JSONL the run wrote
    (`run --sglang-jsonl`), walked and extrapolated as `estimate --sglang-jsonl` does."""
    from dspark_obs.telemetry.block_accept_log import default_workload_of, read_block_accept_jsonl

    from .block_accept_truth import row_truth
    from .block_accept_walk import summarize_by_workload, walk_blocks

    gamma = int(run.manifest["gamma"])
    log = read_block_accept_jsonl(path)
    summary = summarize_by_workload(walk_blocks(log, gamma), log=log)
    truth = row_truth(log, run)
    row_workload = np.array([default_workload_of(str(r)) for r in log.row_rid])
    out = {}
    for workload, entry in summary.items():
        steps = entry["all_steps"]
        t = float(np.mean(truth[row_workload == workload]))
        lo, hi = steps["ci_lo"], steps["ci_hi"]
        out[(workload, "sampled")] = {
            "steps": steps["steps"],
            "truth": t,
            "point": steps["mean_point"],
            "interval": [lo, hi],
            "error": steps["mean_point"] / t - 1.0 if t else None,
            "covered": lo <= t <= hi,
        }
    return out


def summarize_study(records: list[dict]) -> list[dict]:
    """Per (world, path, workload, method) over its seeds: the mean and the largest error
    of the all-step mean, and the share of seeds whose interval covers the truth."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["world"], r["path"], r["workload"], r["method"]), []).append(r)
    out = []
    for (world, path, workload, method), rs in sorted(groups.items()):
        errors = np.array([np.nan if r["error"] is None else r["error"] for r in rs])
        out.append({
            "world": world, "path": path, "workload": workload, "method": method,
            "seeds": len(rs),
            "mean_error": float(np.mean(errors)),
            "max_abs_error": float(np.max(np.abs(errors))),
            "coverage": float(np.mean([r["covered"] for r in rs])),
        })  # fmt: skip
    return out

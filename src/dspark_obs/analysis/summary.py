"""The run summary: per workload and overall, the handful of numbers a run is judged by.

Computed with polars over the run store's tables, so it scales with the data
and not with a Python loop. Ceiling-based numbers use only request-steps whose
ceiling is known: observed (static, cap-accept) or reported by a cap-accept
shadow twin; utilisation is a ratio of sums over those rows, so long and short
requests weigh by the tokens they had at stake.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..store import Run, open_run
from ..store.errors import READ_ERRORS, unreadable

#: Keys of every entry in `workloads` and of `overall`; documented in docs/cli.md.
ENTRY_KEYS = (
    "steps",
    "request_steps",
    "mean_window",
    "mean_accepted",
    "mean_committed",
    "mean_ceiling",
    "ceiling_source",
    "ceiling_rows",
    "utilisation",
    "trimmed_tokens",
    "mean_verify_tokens",
    "committed_tokens",
    "throughput_tokens_per_s",
)


def _known_ceiling() -> pl.Expr:
    return pl.coalesce(pl.col("ceiling"), pl.col("shadow_ceiling")).alias("known_ceiling")


def _entry_aggs() -> list[pl.Expr]:
    known = pl.col("known_ceiling").is_not_null()
    return [
        # one integer per (rank, forward_ct): counting distinct ints beats distinct structs
        ((pl.col("rank") * (1 << 40)) + pl.col("forward_ct")).n_unique().alias("steps"),
        pl.len().alias("request_steps"),
        pl.col("window").mean().alias("mean_window"),
        pl.col("correct_drafts").mean().alias("mean_accepted"),
        pl.col("acc_len").mean().alias("mean_committed"),
        pl.col("known_ceiling").mean().alias("mean_ceiling"),
        known.sum().alias("ceiling_rows"),
        pl.col("correct_drafts").filter(known).sum().alias("_acc_known"),
        pl.col("known_ceiling").sum().alias("_ceiling_sum"),
        (pl.col("known_ceiling") - pl.col("correct_drafts"))
        .clip(lower_bound=0)
        .sum()
        .alias("trimmed_tokens"),
        pl.col("verify_len").mean().alias("mean_verify_tokens"),
        pl.col("acc_len").sum().alias("committed_tokens"),
        pl.col("ceiling").is_not_null().any().alias("_observed"),
        pl.col("shadow_ceiling").is_not_null().any().alias("_shadow"),
    ]


def _finish(row: dict, seconds: float | None) -> dict:
    ceiling_sum = row.pop("_ceiling_sum")
    acc_known = row.pop("_acc_known")
    observed, shadow = row.pop("_observed"), row.pop("_shadow")
    row["utilisation"] = acc_known / ceiling_sum if row["ceiling_rows"] and ceiling_sum else None
    row["ceiling_source"] = "observed" if observed else ("shadow" if shadow else None)
    if not row["ceiling_rows"]:
        row["trimmed_tokens"] = None
    row["throughput_tokens_per_s"] = row["committed_tokens"] / seconds if seconds else None
    return {k: row[k] for k in ENTRY_KEYS}


def summarize(run: Run) -> dict:
    """The summary object `dspark-obs summary --json` prints.

    A part damaged inside its data pages passes `Run.scan`'s footer check and
    only fails when read: that surfaces as the store's RunStoreError too.
    """
    try:
        return _summarize(run)
    except READ_ERRORS as exc:
        raise unreadable(run.path, exc) from exc


def _summarize(run: Run) -> dict:
    req = run.requests().with_columns(_known_ceiling())
    steps = run.steps()
    step_stats = (
        steps.select(
            pl.len().alias("steps"),
            pl.col("step_gpu_ms").sum().alias("gpu_ms"),
            pl.col("step_gpu_ms").is_not_null().sum().alias("timed"),
            pl.col("num_verify_tokens").mean().alias("verify_tokens_per_step"),
            pl.col("budget").mean().alias("mean_budget"),
            pl.col("bs").mean().alias("mean_bs"),
        )
        .collect()
        .row(0, named=True)
    )
    seconds = step_stats["gpu_ms"] / 1e3 if step_stats["timed"] else None

    per_workload = req.group_by("workload").agg(_entry_aggs()).sort("workload").collect().to_dicts()
    overall = req.select(_entry_aggs()).collect().row(0, named=True)
    overall_entry = _finish(overall, seconds)
    overall_entry["steps"] = step_stats["steps"]
    overall_entry["verify_tokens_per_step"] = step_stats["verify_tokens_per_step"]
    overall_entry["mean_batch_size"] = step_stats["mean_bs"]
    overall_entry["mean_budget"] = step_stats["mean_budget"]

    load = (
        steps.filter(pl.col("bs") > 0)
        .group_by("bs")
        .agg(
            pl.len().alias("steps"),
            (pl.col("budget") / pl.col("bs")).mean().alias("budget_per_request"),
            pl.col("num_verify_tokens").mean().alias("verify_tokens_per_step"),
            pl.col("step_gpu_ms").mean().alias("mean_step_ms"),
        )
        .sort("bs")
        .collect()
        .to_dicts()
    )
    m = run.manifest
    return {
        "run": str(run.path),
        "mode": m.get("mode"),
        "shadow": m.get("shadow"),
        "gamma": m.get("gamma"),
        "timing": m.get("timing"),
        "overall": overall_entry,
        "workloads": {row.pop("workload"): _finish(row, seconds) for row in per_workload},
        "load": load,
    }


def summarize_run_dir(run_dir: Path) -> dict:
    """`summarize` of the run in `run_dir`, which must hold request-steps."""
    run = open_run(run_dir)
    if "requests" not in run.tables():
        raise ValueError(
            f"{run_dir} holds no request-steps (an ingested block-accept JSONL has only "
            f"ceilings); see `dspark-obs estimate {run_dir}`"
        )
    return summarize(run)

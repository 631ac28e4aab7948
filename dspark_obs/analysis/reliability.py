"""Per-position calibration histograms of a stored run, binned in polars.

The live aggregates and `CalibrationAccumulator` bin in numpy, a step at a
time. A stored run of tens of millions of request-steps is better binned where
it lies: one lazy query per block position reads only the columns it needs,
labels each row with SGLang's prefix rule, and groups by (workload, ECE bin,
AUROC bin). The result fills the same accumulators, so the report, the
`calibration` command and the live exporter share one reduction (ECE, Brier,
AUROC) and agree bit for bit on counts.

Two predictions can be binned: the recorded survival (what the scheduler used,
after STS when the run had one) and `raw`, the survival of the raw confidence
logits at temperature 1, which is what STS starts from.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..calibration import CalibrationAccumulator
from ..calibration.metrics import EPS_PROB
from ..store import Run

RECORDED = "survival"
RAW = "raw"


def _survival_columns(stage: str, gamma: int) -> list[pl.Expr]:
    """`s0..s{gamma-1}`: recorded survival, or the running product of sigmoid(raw logit)."""
    if stage == RECORDED:
        return [pl.col(RECORDED).arr.get(j).alias(f"s{j}") for j in range(gamma)]
    logit = pl.col("confidence_logits")
    out, running = [], None
    for j in range(gamma):
        p = 1.0 / (1.0 + (-logit.arr.get(j)).exp())
        running = p if running is None else running * p
        out.append(running.alias(f"s{j}"))
    return out


def has_stage(run: Run, stage: str) -> bool:
    """Whether any row of the run records what `stage` needs."""
    column = RECORDED if stage == RECORDED else "confidence_logits"
    return bool(run.requests().select(pl.col(column).is_not_null().any()).collect().item())


def calibration_histograms(
    run: Run, stage: str = RECORDED, bins: int = 15, auroc_bins: int = 1024
) -> dict[str | None, CalibrationAccumulator]:
    """One accumulator per workload for the `stage` prediction; empty dict if none recorded."""
    gamma = int(run.manifest["gamma"])
    column = RECORDED if stage == RECORDED else "confidence_logits"
    # one scan turns the array column into gamma plain columns; the per-position
    # queries then run on memory instead of decoding the Parquet gamma times
    rows = (
        run.requests()
        .filter(pl.col(column).is_not_null())
        .select(
            "workload",
            "correct_drafts",
            "window",
            pl.coalesce("ceiling", "shadow_ceiling").alias("known"),
            *_survival_columns(stage, gamma),
        )
        .collect()
        .lazy()
    )
    reach = pl.coalesce("known", "correct_drafts")
    settled = pl.col("known").is_not_null() | (pl.col("correct_drafts") < pl.col("window"))
    frames = []
    for j in range(gamma):
        p = pl.col(f"s{j}").clip(EPS_PROB, 1.0 - EPS_PROB)
        labelled = settled | (pl.col("correct_drafts") > j)
        frames.append(
            rows.filter(labelled)
            .select(
                "workload",
                pl.lit(j, pl.Int32).alias("position"),
                p.alias("p"),
                (reach > j).alias("y"),
            )
            .with_columns(
                (pl.col("p") * bins).cast(pl.Int32).clip(upper_bound=bins - 1).alias("coarse"),
                (pl.col("p") * auroc_bins)
                .cast(pl.Int32)
                .clip(upper_bound=auroc_bins - 1)
                .alias("fine"),
            )
            .group_by("workload", "position", "coarse", "fine")
            .agg(
                pl.len().alias("n"),
                pl.col("y").sum().alias("positives"),
                pl.col("p").sum().alias("pred_sum"),
                ((pl.col("p") - pl.col("y").cast(pl.Float64)) ** 2).sum().alias("sq_err"),
            )
        )
    cells = pl.concat(frames).collect()
    out: dict[str | None, CalibrationAccumulator] = {}
    for (name,), part in cells.group_by("workload", maintain_order=True):
        acc = CalibrationAccumulator(gamma, num_bins=bins, auroc_bins=auroc_bins)
        pos = part["position"].to_numpy()
        coarse = pos * bins + part["coarse"].to_numpy()
        fine = pos * auroc_bins + part["fine"].to_numpy()
        n = part["n"].to_numpy().astype(np.int64)
        positives = part["positives"].to_numpy().astype(np.int64)
        nc, nf = gamma * bins, gamma * auroc_bins
        acc.add_histograms(
            count=np.bincount(coarse, weights=n, minlength=nc),
            pred_sum=np.bincount(coarse, weights=part["pred_sum"].to_numpy(), minlength=nc),
            target_sum=np.bincount(coarse, weights=positives, minlength=nc),
            fine_pos=np.bincount(fine, weights=positives, minlength=nf),
            fine_neg=np.bincount(fine, weights=n - positives, minlength=nf),
            sq_err_sum=np.bincount(pos, weights=part["sq_err"].to_numpy(), minlength=gamma),
        )
        out[name] = acc
    return dict(sorted(out.items(), key=lambda kv: (kv[0] is None, kv[0] or "")))


def pooled(accumulators: dict[str | None, CalibrationAccumulator]) -> CalibrationAccumulator:
    """Every workload's histograms in one accumulator."""
    first = next(iter(accumulators.values()))
    total = CalibrationAccumulator(first.gamma, first.num_bins, first.auroc_bins)
    for acc in accumulators.values():
        total.merge(acc)
    return total

"""Request-steps with a confidence column and their prefix labels, from a stored run.

STS fitting and the calibration report need the same rows: those that carry the
confidence column, with the ceiling where it is known (observed, else the
shadow twin's, else censored) so that `prefix_labels` can tell which positions
the target settled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from ..calibration import StsCalibration, fit_sts, prefix_labels
from ..store import Run, open_run


def confidence_rows(run: Run, column: str) -> pl.DataFrame:
    """Rows with `column` recorded: workload, the column, correct_drafts, window, known ceiling."""
    return (
        run.requests()
        .filter(pl.col(column).is_not_null())
        .select(
            "workload",
            column,
            "correct_drafts",
            "window",
            pl.coalesce("ceiling", "shadow_ceiling", pl.lit(-1)).alias("known_ceiling"),
        )
        .collect()
    )


def matrix_and_labels(
    rows: pl.DataFrame, column: str, gamma: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`[n, gamma]` values of `column`, labels, labelled)."""
    labels, labelled = prefix_labels(
        rows["correct_drafts"].to_numpy(),
        rows["window"].to_numpy(),
        rows["known_ceiling"].to_numpy(),
        gamma,
    )
    return rows[column].to_numpy().reshape(-1, gamma), labels, labelled


def fit_sts_from_run(run_dir: Path, bins: int = 15) -> StsCalibration:
    """STS temperatures from the raw confidence logits a run recorded, with their labels."""
    run = open_run(run_dir)
    gamma = run.gamma
    df = confidence_rows(run, "confidence_logits")
    if df.height == 0:
        raise ValueError(f"{run_dir}: no raw confidence logits recorded; cannot fit STS")
    logits, labels, labelled = matrix_and_labels(df, "confidence_logits", gamma)
    return fit_sts(logits, labels, labelled, num_bins=bins, dataset=str(run_dir))

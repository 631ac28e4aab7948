"""The rates' intervals: the unknown ceilings' bracket widened by two runs' sampling spread."""

from __future__ import annotations

import numpy as np

from ..estimator.evaluate import Z95
from .frame import RunFrame


def rate_interval(
    sums: dict, pair_scope: np.ndarray, pair_sums: dict, parts: dict, den: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`com/den` per cell with its interval: the bracket of the unknown ceilings, widened by
    the spread between two runs of one policy on the same traffic (the prediction's and a
    real run's sampling errors: `sqrt(2)` standard errors of the ratio, each the larger of
    the cluster-robust one by request and the one treating request-steps as independent,
    so that a cell of one request still has a spread).

    The request-steps' squared residuals `(com - rate * den)^2` are summed by part (`parts`,
    `spread_parts`): a part's rows share `den`, so theirs are the squares about the part's
    mean plus its rows times `(mean - rate * den)^2`."""
    n = len(sums["count"])
    total = sums[den]
    scope = parts["scope"]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (sums["acc"] + sums["count"]) / total
        resid = pair_sums["com"] - rate[pair_scope] * pair_sums[den]
        clusters = np.bincount(pair_scope, resid**2, minlength=n)
        gap = parts["mean"] - rate[scope] * parts[den]
        squares = parts["weight2"] * (parts["within"] + parts["rows"] * gap**2)
        spread = np.bincount(scope, squares, minlength=n)
        half = Z95 * np.sqrt(2.0) * np.sqrt(np.maximum(clusters, spread)) / total
        lo = (sums["lo"] + sums["count"]) / total - half
        hi = (sums["hi"] + sums["count"]) / total + half
    return rate, lo, hi


def part_seconds(frame: RunFrame, seconds: np.ndarray) -> dict:
    """Each part's step time (`t`) and its request-steps' share of it (`share`)."""
    c = frame.cells
    t = seconds[c.part_step]
    return {"t": t, "share": t / frame.step_bs[c.part_step]}


def spread_parts(frame: RunFrame, com: np.ndarray, part_den: dict) -> dict:
    """Per part, what the spread of a cell's request-steps reads: its rows, the mean of
    their committed tokens and the sum of their squares about it, and the part's `t` and
    `share` (`part_seconds`)."""
    c = frame.cells
    n_parts = len(c.part_cell)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.bincount(c.part, com, minlength=n_parts) / c.part_rows
    dev = mean[c.part]
    np.subtract(com, dev, out=dev)
    within = np.bincount(c.part, np.square(dev, out=dev), minlength=n_parts)
    return {"rows": c.part_rows, "mean": mean, "within": within, **part_den}

"""Cluster bootstrap of a difference of ratio-of-sums statistics, and Holm's correction.

Every number `compare` reports is a ratio of sums (a mean is sum / count,
utilisation is accepted / ceiling, throughput is tokens / seconds), and rows
of one request (or one step) are correlated, so the unit resampled is the
cluster: its numerator and denominator sums travel together.

The two arms are matched by cluster key (request id, step counter). Runs made
with one seed replay the same traffic, so request `arena-7` in run A and in
run B is the same request; resampling keys and taking both arms' sums for
each drawn key keeps that pairing, so shared randomness cancels out of the
difference instead of widening its interval. A key present in one arm only
contributes zeros to the other, so unmatched or disjoint keys still give a
valid bootstrap of each arm's ratio. Identical arms give a delta of exactly 0
in every replicate: CI [0, 0] and p = 1.

Replicates are drawn as index matrices in chunks (bounded memory); nothing
loops per cluster or per replicate. Replicate r uses the r-th row of draws
from the generator, so chunking does not change the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Elements of one chunk of gathered sums (replicates x clusters x 4 columns).
_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class BootResult:
    """The observed statistics, their difference and its bootstrap interval."""

    a: float | None
    b: float | None
    delta: float | None
    rel_delta: float | None
    ci: tuple[float, float] | None
    p: float | None
    reps: int  # replicates with a finite difference
    #: the finite replicate differences, sorted (for `holm_intervals`)
    deltas: np.ndarray | None = field(default=None, repr=False, compare=False)


def ratio(num: np.ndarray, den: np.ndarray) -> float | None:
    """sum(num) / sum(den), or None when the denominator sums to zero."""
    d = float(np.sum(den))
    return float(np.sum(num)) / d if d else None


def replicate_deltas(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    reps: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """B - A ratio of sums for `reps` resamples of the (shared) cluster keys.

    Clusters are rows of the four aligned arrays. Each replicate draws
    `n` keys with replacement (`rng.integers(0, n, size=n)`, one row per
    replicate, in order). Replicates where either denominator sums to zero
    come back as NaN.
    """
    cols = np.column_stack([num_a, den_a, num_b, den_b]).astype(np.float64, copy=False)
    n = cols.shape[0]
    if n == 0:
        raise ValueError("bootstrap needs at least one cluster")
    if reps < 1:
        raise ValueError("bootstrap needs at least one replicate")
    chunk = max(1, _CHUNK_ELEMENTS // (4 * n))
    out = np.empty(reps, dtype=np.float64)
    for start in range(0, reps, chunk):
        stop = min(reps, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        sums = cols[idx].sum(axis=1)  # (chunk, 4)
        with np.errstate(divide="ignore", invalid="ignore"):
            ra = np.where(sums[:, 1] != 0, sums[:, 0] / sums[:, 1], np.nan)
            rb = np.where(sums[:, 3] != 0, sums[:, 2] / sums[:, 3], np.nan)
        out[start:stop] = rb - ra
    return out


def p_value(deltas: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "no difference": twice the smaller tail at zero.

    It is the smallest level at which the percentile interval would exclude
    zero, so it agrees with the interval; it resolves no finer than 1 / reps.
    Replicates at exactly zero count in both tails (identical arms: p = 1).
    """
    le = float(np.mean(deltas <= 0))
    ge = float(np.mean(deltas >= 0))
    return min(1.0, 2.0 * min(le, ge))


def bootstrap_delta(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    reps: int = 1000,
    rng: np.random.Generator,
    confidence: float = 0.95,
) -> BootResult:
    """Delta (B - A) of two ratio-of-sums statistics with a percentile CI and p-value."""
    a, b = ratio(num_a, den_a), ratio(num_b, den_b)
    if a is None or b is None:
        return BootResult(a, b, None, None, None, None, 0)
    delta = b - a
    rel = delta / a if a else None
    deltas = replicate_deltas(num_a, den_a, num_b, den_b, reps=reps, rng=rng)
    deltas = deltas[np.isfinite(deltas)]
    if not deltas.size:
        return BootResult(a, b, delta, rel, None, None, 0)
    tail = 100.0 * (1.0 - confidence) / 2.0
    lo, hi = np.percentile(deltas, [tail, 100.0 - tail])
    return BootResult(
        a, b, delta, rel, (float(lo), float(hi)), p_value(deltas), deltas.size, np.sort(deltas)
    )


def interval_at(sorted_deltas: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval that excludes zero exactly when `p_value` < `level`.

    Order statistics, not interpolated quantiles: with c replicates at or below zero,
    the lower end is above zero iff c < n * level / 2, which is `p_value`'s tail test.
    """
    n = sorted_deltas.size
    k = max(1, math.ceil(n * level / 2 - 1e-9))
    return float(sorted_deltas[k - 1]), float(sorted_deltas[n - k])


def holm_intervals(
    sorted_deltas: list[np.ndarray], p: np.ndarray, alpha: float
) -> tuple[list[tuple[float, float]], np.ndarray]:
    """Intervals that agree with Holm's step-down test at `alpha`, and their levels.

    A row Holm rejects, the i-th smallest p of m, was tested at alpha / (m - i + 1): its
    interval has that level and excludes zero. Once a row is kept, every later one is
    tested at the level of the first kept row: their intervals have that level and hold
    zero. So "significant" and "the interval excludes zero" never disagree. Rows with the
    same p share the level of the first of them (Holm adjusts them alike), so two metrics
    that move together get one interval, not two that differ only by their place in a tie.
    """
    m = len(p)
    order = np.argsort(p, kind="stable")
    significant = holm(p) < alpha
    levels = np.empty(m, dtype=np.float64)
    kept_level = None
    tie_level, tie_p = None, None
    for i, row in enumerate(order):
        if tie_p is None or p[row] != tie_p:
            tie_level, tie_p = alpha / (m - i), p[row]
        if kept_level is None and not significant[row]:
            kept_level = tie_level
        levels[row] = tie_level if kept_level is None else kept_level
    intervals = [interval_at(d, a) for d, a in zip(sorted_deltas, levels, strict=True)]
    return intervals, levels


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control), same order as `p`.

    The i-th smallest p is multiplied by (m - i + 1), then a running maximum
    keeps the adjusted values monotone in the raw ones; capped at 1.
    """
    p = np.asarray(p, dtype=np.float64)
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adjusted = np.minimum(1.0, np.maximum.accumulate(scaled))
    out = np.empty(m, dtype=np.float64)
    out[order] = adjusted
    return out

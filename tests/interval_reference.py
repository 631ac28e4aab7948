"""The aggregate interval (`interval.aggregate_interval`) computed another way, to hold the
estimator's to: Bennett's bound is the Chernoff bound inf_s exp(-s t) prod E exp(s X_i) with
each term's exp(s X_i) bounded by that of the two-point law at its range, so its margin is
min over s of (log(1 / alpha) + var / b^2 (e^(s b) - 1 - s b)) / s, minimised here over a
grid and then by ternary search, where the estimator solves the dual equation by Newton."""

from __future__ import annotations

import math

import numpy as np


def _objective(s: np.ndarray, var: float, bound: float, log_inv: float) -> np.ndarray:
    sb = s * bound
    with np.errstate(over="ignore", invalid="ignore"):  # e^(s b) past floats: inf, never least
        return (log_inv + var / bound**2 * (np.expm1(sb) - sb)) / s


def chernoff_margin(var: float, bound: float, level: float = 0.95) -> float:
    if var <= 0:
        return 0.0
    log_inv = math.log(2 / (1 - level))
    if bound <= 0:
        return math.sqrt(2 * var * log_inv)
    s = np.geomspace(1e-9, 1e3, 40_001) / bound
    i = int(np.argmin(_objective(s, var, bound, log_inv)))
    a, b = s[max(i - 1, 0)], s[min(i + 1, len(s) - 1)]
    for _ in range(200):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        f1, f2 = _objective(np.array([m1, m2]), var, bound, log_inv)
        a, b = (a, m2) if f1 < f2 else (m1, b)
    return float(_objective(np.array([(a + b) / 2]), var, bound, log_inv)[0])


def reference_interval(lo, hi, var, var_hi, least, most, level: float = 0.95) -> tuple:
    """Per-step arrays in, the interval for their mean out: each end's range is the most
    one step's outcome passes its mean (`lo - least`, `most - hi`) among steps with spread."""
    lo, hi, var, var_hi, least, most = (
        np.asarray(x, dtype=np.float64) for x in (lo, hi, var, var_hi, least, most)
    )
    n = len(lo)
    b_lo = float(np.max((lo - least)[var > 0], initial=0.0))
    b_hi = float(np.max((most - hi)[var_hi > 0], initial=0.0))
    ci_lo = (lo.sum() - chernoff_margin(var.sum(), b_lo, level)) / n
    ci_hi = (hi.sum() + chernoff_margin(var_hi.sum(), b_hi, level)) / n
    return max(ci_lo, least.mean()), min(ci_hi, most.mean())

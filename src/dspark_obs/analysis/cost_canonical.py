"""The canonical table among the least-squares solutions of the additive cost model.

The least-squares coefficients are not a table yet: the additive model is identified only
up to constants moved between bias, alpha and theta, and a probe few or no cells reach is
pinned loosely or not at all. `canonical_table` fixes one documented choice (the steps are
in `analysis.cost_fit`'s docstring), shared by the additive table `cost fit` writes and the
additive part of its context-extended table (`analysis.cost_context`).

A loosely pinned probe can make every least-squares solution invalid: on an H200 run of the
real world, 12 steps at M = 1024 (a cell standing at M 1056) pinned theta(2048) with a
weight of 0.03, and the solve sent it to -35 ms to fit a 1 ms dip. No shift between the
parts makes such a table valid; lifting bias instead would add the 35 ms to every
prediction (R^2 -19 on that run). The table written then is the valid one nearest to the
data in squared error (`nonnegative_lstsq` under the table's bounds): R^2 0.9342 at the
cell middles there against the least squares' 0.9343 (0.9326 per step, at each step's M).
"""

from __future__ import annotations

import numpy as np

from ..domain.cost_table import AdditiveCostTable

#: Smallest bias a written table gets, seconds (the table format requires bias > 0).
BIAS_FLOOR = 1e-6

#: Relative weight of flatness against the fit in `_bounded`.
FLATNESS = 1e-8

#: Curve values below this many seconds (rounding dust of the solve) are written as 0.
SNAP_SECONDS = 1e-15


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`argmin |a x - b|` subject to `x >= 0` (Lawson and Hanson's active set).

    The designs here have a few dozen columns, so each pass re-solves the free columns'
    least squares outright. Columns that no row touches stay at 0.
    """
    rows, cols = a.shape
    x = np.zeros(cols)
    free = np.zeros(cols, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * max(rows, cols) * max(np.abs(a).sum(axis=0).max(), 1.0)
    for _ in range(3 * cols + 3):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(free, -np.inf, gradient)
        j = int(np.argmax(candidates))
        if candidates[j] <= tol:
            break
        free[j] = True
        while True:
            z = np.zeros(cols)
            z[free], *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            blocked = free & (z <= 0)
            if not blocked.any():
                x = z
                break
            step = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + step * (z - x)
            free &= x > tol
            x[~free] = 0.0
    return x


def neighbour_differences(columns: int, n_bs: int) -> np.ndarray:
    """Rows `x[k + 1] - x[k]` over neighbouring alpha probes and neighbouring theta probes."""
    pairs = [(k, k + 1) for k in range(1, n_bs)] + [
        (k, k + 1) for k in range(n_bs + 1, columns - 1)
    ]
    diff = np.zeros((len(pairs), columns))
    for i, (a, b) in enumerate(pairs):
        diff[i, a], diff[i, b] = -1.0, 1.0
    return diff


def flattest(coef: np.ndarray, weighted_design: np.ndarray, n_bs: int) -> np.ndarray:
    """The least-squares solution whose alpha and theta vary least from probe to probe.

    `coef` is any solution (the minimum-norm one); the others differ from it by
    the null space of the (count-weighted) design, so predictions at the cells
    are the same for all of them.
    """
    _, sv, vt = np.linalg.svd(weighted_design)
    tol = sv.max(initial=0.0) * max(weighted_design.shape) * np.finfo(np.float64).eps
    null = vt[int((sv > tol).sum()) :].T
    if null.shape[1] == 0:
        return coef
    diff = neighbour_differences(weighted_design.shape[1], n_bs)
    # Directions `diff` cannot see (constants moved between bias, alpha and
    # theta) have singular values at rounding level here; they are left to
    # `canonical_table`, not inverted. `diff` has unit entries and `null` is
    # orthonormal, so an absolute cut is scale-free.
    u, s, wt = np.linalg.svd(diff @ null, full_matrices=False)
    keep = s > 1e-9
    z = wt[keep].T @ ((u[:, keep].T @ -(diff @ coef)) / s[keep])
    return coef + null @ z


def _snap(values: np.ndarray) -> list[float]:
    """Floats for JSON, with rounding dust below `SNAP_SECONDS` written as 0."""
    return [0.0 if v < SNAP_SECONDS else float(v) for v in values]


def _shifted(coef: np.ndarray, nb: int) -> tuple[float, np.ndarray, np.ndarray]:
    """bias, alpha, theta with min(alpha) and min(theta) moved into bias."""
    alpha, theta = coef[1 : 1 + nb], coef[1 + nb :]
    a0, t0 = float(alpha.min()), float(theta.min())
    return float(coef[0]) + a0 + t0, alpha - a0, theta - t0


def _bounded(coef: np.ndarray, weighted_design: np.ndarray, nb: int) -> np.ndarray:
    """The valid table (bias >= BIAS_FLOOR, alpha and theta >= 0) nearest in squared error
    to the cells `coef` predicts, the flattest among the near-nearest.

    Flatness enters as a penalty on neighbouring differences, `FLATNESS` times the
    design's largest squared singular value: too small to move the fit at the cells, large
    enough to pick among tables the cells cannot tell apart (free probes, and alpha traded
    against theta where each batch size ran at one M).
    """
    floor = np.zeros_like(coef)
    floor[0] = BIAS_FLOOR
    diff = neighbour_differences(len(coef), nb)
    weight = np.sqrt(FLATNESS) * np.linalg.norm(weighted_design, 2)
    # coef's residual is orthogonal to the design's columns, so its fitted values stand in
    # for the cell means: the same minimiser
    a = np.vstack([weighted_design, weight * diff])
    b = np.concatenate([weighted_design @ (coef - floor), np.zeros(len(diff))])
    return nonnegative_lstsq(a, b) + floor


def canonical_table(
    coef: np.ndarray,
    bs_probes,
    m_probes,
    weighted_design: np.ndarray,
) -> tuple[AdditiveCostTable, bool]:
    """The module docstring's choice of table among the least-squares solutions.

    `coef` is `[bias, alpha at bs probes..., theta at M probes...]`, any
    least-squares solution over `weighted_design` (rows of `cost_design`
    times sqrt(count)). Returns the table and whether it had to leave the
    least-squares solutions to be valid (then it is the nearest valid table).
    """
    nb = len(bs_probes)
    coef = flattest(np.asarray(coef, dtype=np.float64), weighted_design, nb)
    bias, alpha, theta = _shifted(coef, nb)
    constrained = not bias > BIAS_FLOOR
    if constrained:
        bias, alpha, theta = _shifted(_bounded(coef, weighted_design, nb), nb)
        bias = max(bias, BIAS_FLOOR)
    table = AdditiveCostTable(
        bias_seconds=bias,
        bs_probes=[int(p) for p in bs_probes],
        alpha_seconds=_snap(alpha),
        m_probes=[int(p) for p in m_probes],
        theta_seconds=_snap(theta),
    )
    return table, constrained

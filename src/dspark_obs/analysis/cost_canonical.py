"""The canonical table among the least-squares solutions of the additive cost model.

The least-squares coefficients are not a table yet: the additive model is identified only
up to constants moved between bias, alpha and theta, and a probe few or no cells reach is
pinned loosely or not at all. `canonical_table` fixes one documented choice (the steps are
in `analysis.cost_fit`'s docstring), shared by the additive table `cost fit` writes and the
additive part of its context-extended table (`analysis.cost_context`).
"""

from __future__ import annotations

import numpy as np

from ..runtime.cost_table import AdditiveCostTable

#: Smallest bias a written table gets, seconds (the table format requires bias > 0).
BIAS_FLOOR = 1e-6

#: Curve values below this many seconds (rounding dust of the solve) are written as 0.
SNAP_SECONDS = 1e-15


def flattest(coef: np.ndarray, weighted_design: np.ndarray, n_bs: int) -> np.ndarray:
    """The least-squares solution whose alpha and theta vary least from probe to probe.

    `coef` is any solution (the minimum-norm one); the others differ from it by
    the null space of the (count-weighted) design, so predictions at the cells
    are the same for all of them.
    """
    p = weighted_design.shape[1]
    _, sv, vt = np.linalg.svd(weighted_design)
    tol = sv.max(initial=0.0) * max(weighted_design.shape) * np.finfo(np.float64).eps
    null = vt[int((sv > tol).sum()) :].T
    if null.shape[1] == 0:
        return coef
    rows = [(k, k + 1) for k in range(1, n_bs)] + [(k, k + 1) for k in range(n_bs + 1, p - 1)]
    diff = np.zeros((len(rows), p))
    for i, (a, b) in enumerate(rows):
        diff[i, a], diff[i, b] = -1.0, 1.0
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


def canonical_table(
    coef: np.ndarray,
    bs_probes,
    m_probes,
    weighted_design: np.ndarray,
) -> tuple[AdditiveCostTable, float]:
    """The module docstring's choice of table among the least-squares solutions.

    `coef` is `[bias, alpha at bs probes..., theta at M probes...]`, any
    least-squares solution over `weighted_design` (rows of `cost_design`
    times sqrt(count)). Returns the table and how far bias had to be raised to
    `BIAS_FLOOR` (0.0 normally).
    """
    nb = len(bs_probes)
    coef = flattest(np.asarray(coef, dtype=np.float64), weighted_design, nb)
    alpha, theta = coef[1 : 1 + nb], coef[1 + nb :]
    a0, t0 = float(alpha.min()), float(theta.min())
    bias = float(coef[0]) + a0 + t0
    raised = 0.0
    if not bias > BIAS_FLOOR:
        raised, bias = BIAS_FLOOR - bias, BIAS_FLOOR
    table = AdditiveCostTable(
        bias_seconds=bias,
        bs_probes=[int(p) for p in bs_probes],
        alpha_seconds=_snap(alpha - a0),
        m_probes=[int(p) for p in m_probes],
        theta_seconds=_snap(theta - t0),
    )
    return table, raised

"""What a step's time is made of and how it is fitted: one definition for the live cost
model, the estimator's cost of trimming, the post-hoc `cost fit` and the report's figures.

A step falls in a (batch size, M-bin) cell, M being its verify tokens binned by 64 as
SGLang bins them; its context in a context-length bucket; its measured time is real
between a nanosecond and a day. The fit is SGLang's: ordinary least squares of the
additive model `T = bias + alpha(bs) + theta(M)` over cells of measured step times,
alpha and theta piecewise linear between probes. Cells keep count, sum and sum of
squares, so R^2 and RMS are exact per step, not per cell, and memory grows with
distinct cells, not with steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

M_BIN = 64
#: Step times (seconds) taken as real: a measured step lasts at least a nanosecond, and no
#: step, measured or predicted, lasts a day. Step times arrive unchecked from JSON; outside
#: these bounds a value is a recording or unit error, and left in it would overflow the
#: relative error (a subnormal measured time) or the squared error (a huge one).
MIN_STEP_S = 1e-9
MAX_STEP_S = 86_400.0

#: Context-length buckets, by the step's mean context tokens per request: lower bounds,
#: each bucket up to the next (the last open). Powers of two, as conversations grow by
#: factors; the exporter's `context` label and `cost fit`'s residual view share them.
CONTEXT_BUCKETS = (0, *(2**k for k in range(6, 18)))


def context_bucket(mean_context: np.ndarray) -> np.ndarray:
    """Index into `CONTEXT_BUCKETS` of each mean context (tokens per request, >= 0)."""
    return np.searchsorted(CONTEXT_BUCKETS, mean_context, side="right") - 1


DEFAULT_BS_PROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEFAULT_M_PROBES = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


def hat_basis(x: np.ndarray, probes: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation weights of each x over the probes (clamped at the ends)."""
    eye = np.eye(len(probes))
    return np.stack([np.interp(x, probes, eye[k]) for k in range(len(probes))], axis=1)


@dataclass
class Refit:
    r2: float
    rms_seconds: float
    steps: int
    cells: int
    coef: np.ndarray  # [bias, alpha at bs probes..., theta at M probes...] (min-norm split)


@dataclass(frozen=True)
class RefitTable:
    """A refit read as a step-cost table (`step_seconds(bs, extra_tokens)`), so that what
    prices steps with a configured table prices them with the online refit alike. Its
    least-squares predictions are floored at `MIN_STEP_S`: a ratio of two of them must
    stay a ratio of step times."""

    refit: Refit
    bs_probes: np.ndarray
    m_probes: np.ndarray

    def step_seconds(self, bs, extra_tokens) -> np.ndarray:
        bs = np.atleast_1d(np.asarray(bs, dtype=np.float64))
        m = bs + np.asarray(extra_tokens, dtype=np.float64)
        design = cost_design(bs, m, self.bs_probes, self.m_probes)
        return np.maximum(design @ self.refit.coef, MIN_STEP_S)


def cell_m(m_bin: np.ndarray) -> np.ndarray:
    """The M a cell stands for in the design: the middle of its 64-token bin, as SGLang."""
    return (np.asarray(m_bin, dtype=np.float64) + 0.5) * M_BIN


def cost_design(bs: np.ndarray, m: np.ndarray, bs_probes, m_probes) -> np.ndarray:
    """Design rows `[1, hat(bs), hat(M)]` of the additive model, one per cell."""
    bs_probes = np.asarray(bs_probes, dtype=np.float64)
    m_probes = np.asarray(m_probes, dtype=np.float64)
    return np.hstack([np.ones((len(bs), 1)), hat_basis(bs, bs_probes), hat_basis(m, m_probes)])


def fit_cells(
    bs: np.ndarray,
    m: np.ndarray,
    n: np.ndarray,
    s: np.ndarray,
    ss: np.ndarray,
    bs_probes,
    m_probes,
) -> Refit:
    """SGLang's least-squares fit of `T = bias + alpha(bs) + theta(M)` from cell sums.

    One row per cell: batch size, the cell's M (`cell_m`), step count, sum and
    sum of squares of the measured seconds. Weighting each cell mean by its
    count is the per-step OLS exactly (every step of a cell shares its design
    row), so R^2 and RMS are per step. The model is rank-deficient (constants
    move freely between bias, alpha and theta; probes no cell touches are free),
    and `lstsq` returns the minimum-norm coefficients; the predictions at the
    cells do not depend on that choice. Both the online aggregate and the
    post-hoc `dspark-obs cost fit` use this one function.
    """
    n = np.asarray(n, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    ss = np.asarray(ss, dtype=np.float64)
    if len(n) < 2:
        raise ValueError(f"cost refit needs at least 2 (bs, M-bin) cells, got {len(n)}")
    design = cost_design(np.asarray(bs, np.float64), np.asarray(m, np.float64), bs_probes, m_probes)
    w = np.sqrt(n)[:, None]
    coef, *_ = np.linalg.lstsq(design * w, (s / n) * w[:, 0], rcond=None)
    pred = design @ coef
    sse = float((ss - 2 * pred * s + n * pred**2).sum())
    total = n.sum()
    sst = float(ss.sum() - s.sum() ** 2 / total)
    r2 = 1.0 - sse / sst if sst > 0 else float("nan")
    return Refit(r2, float(np.sqrt(max(sse, 0.0) / total)), int(total), len(n), coef)


def fit_cell_map(
    cells: Mapping[tuple[int, int], Sequence[float]], bs_probes, m_probes
) -> Refit | None:
    """`fit_cells` over cells kept as `{(bs, M-bin): [count, sum, sum of squares]}`.

    Live accumulators keep cells in a mapping because a step touches only a few;
    both the live aggregate and the SGLang-style baseline refit from one, so the
    mapping-to-columns step lives here once. Fewer than 2 cells: no fit yet.
    """
    if len(cells) < 2:
        return None
    keys = np.array(list(cells), dtype=np.float64)
    stats = np.array(list(cells.values()), dtype=np.float64)
    return fit_cells(
        keys[:, 0],
        cell_m(keys[:, 1]),
        stats[:, 0],
        stats[:, 1],
        stats[:, 2],
        bs_probes,
        m_probes,
    )

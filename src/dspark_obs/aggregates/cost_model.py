"""Does the step-cost table predict reality? Errors live, and a refit from what was measured.

Each step that carries both the scheduler's prediction and a measured step time
adds to error sums (absolute, signed, relative). The relative error also goes
into a log-spaced histogram so a median is available without keeping steps.

The refit is SGLang's: ordinary least squares of the additive model
`T = bias + alpha(bs) + theta(M)` over (bs, M-bin) cells of measured step
times, M binned by 64, alpha and theta piecewise linear between probes. Cells
keep count, sum and sum of squares, so R^2 and RMS are exact per step, not per
cell, and memory grows with distinct cells, not with steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .window import WindowedSums

M_BIN = 64
#: Timed steps between refits of a group: a refit is a least-squares solve over the cells,
#: too costly to redo every few steps, and the table moves slowly.
REFIT_EVERY = 1024
REL_BUCKETS = np.logspace(-4, 1, 81)  # relative-error bucket upper bounds, 15% apart
#: Step times (seconds) taken as real: a measured step lasts at least a nanosecond, and no
#: step, measured or predicted, lasts a day. Step times arrive unchecked from JSON; outside
#: these bounds a value is a recording or unit error, and left in it would overflow the
#: relative error (a subnormal measured time) or the squared error (a huge one).
MIN_STEP_S = 1e-9
MAX_STEP_S = 86_400.0
_ERR_COLUMNS = ("n", "predicted", "measured", "abs_error", "error", "sq_error", "rel_error")
#: Sums per (step group, context bucket), since start: steps, predicted and measured
#: seconds, squared error, relative error, and mean context tokens per request.
CONTEXT_COLUMNS = ("n", "predicted", "measured", "sq_error", "rel_error", "context")

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


class CostModelAggregate:
    def __init__(
        self,
        window_steps: int,
        blocks: int,
        bs_probes=DEFAULT_BS_PROBES,
        m_probes=DEFAULT_M_PROBES,
        refit_every: int | None = None,
    ) -> None:
        self.errors = WindowedSums(len(_ERR_COLUMNS) + len(REL_BUCKETS) + 1, window_steps, blocks)
        self.bs_probes = np.asarray(bs_probes, dtype=np.float64)
        self.m_probes = np.asarray(m_probes, dtype=np.float64)
        self.refit_every = REFIT_EVERY if refit_every is None else refit_every
        self.by_context = np.zeros((0, len(CONTEXT_BUCKETS), len(CONTEXT_COLUMNS)))
        self.cells: list[dict[tuple[int, int], np.ndarray]] = []
        self.refits: list[Refit | None] = []
        self._since_refit: list[int] = []

    def ensure_groups(self, n: int) -> None:
        self.errors.ensure_groups(n)
        if len(self.by_context) < n:
            grown = np.zeros((n, *self.by_context.shape[1:]))
            grown[: len(self.by_context)] = self.by_context
            self.by_context = grown
        while len(self.cells) < n:
            self.cells.append({})
            self.refits.append(None)
            self._since_refit.append(0)

    def update(
        self,
        group: np.ndarray,
        bs: np.ndarray,
        tokens: np.ndarray,
        predicted_s: np.ndarray,
        measured_s: np.ndarray,
        mean_context: np.ndarray | None = None,
    ) -> None:
        """Per step: group, batch size, verify tokens, predicted, measured seconds and mean
        context tokens per request (NaN: absent)."""
        measured_ok = (measured_s >= MIN_STEP_S) & (measured_s <= MAX_STEP_S)
        both = measured_ok & (np.abs(predicted_s) <= MAX_STEP_S)
        if mean_context is not None:
            self._fold_context(group, predicted_s, measured_s, mean_context, both)
        if both.any():
            g, p, m = group[both], predicted_s[both], measured_s[both]
            err = m - p
            rel = np.abs(err) / m
            width = self.errors.width
            cols = np.arange(len(_ERR_COLUMNS))
            index = (g[:, None] * width + cols[None, :]).ravel()
            values = np.stack([np.ones_like(p), p, m, np.abs(err), err, err**2, rel], axis=1)
            bucket = len(_ERR_COLUMNS) + np.searchsorted(REL_BUCKETS, rel, side="left")
            self.errors.add_flat(
                np.concatenate([index, g * width + bucket]),
                np.concatenate([values.ravel(), np.ones(len(g))]),
            )
        timed = measured_ok & (tokens > 0) & (bs > 0)
        if not timed.any():
            return
        # a fold's steps fall in a handful of (group, bs, M-bin) cells: sum them per cell
        # vectorised, then touch each cell's dict entry once
        y = measured_s[timed]
        keys = np.stack([group[timed], bs[timed].astype(np.int64), tokens[timed] // M_BIN], axis=1)
        cells, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        sums = np.stack(
            [
                np.bincount(inverse).astype(np.float64),
                np.bincount(inverse, weights=y),
                np.bincount(inverse, weights=y * y),
            ],
            axis=1,
        )
        for (gi, b, m_bin), add in zip(cells.tolist(), sums, strict=True):
            cell = self.cells[gi].get((b, m_bin))
            if cell is None:
                cell = self.cells[gi][(b, m_bin)] = np.zeros(3)
            cell += add
            self._since_refit[gi] += int(add[0])
        for gi in np.unique(cells[:, 0]).tolist():
            if self._since_refit[gi] >= self.refit_every or self.refits[gi] is None:
                self.refits[gi] = self.refit(gi)
                self._since_refit[gi] = 0

    def _fold_context(self, group, predicted_s, measured_s, mean_context, both) -> None:
        """The table's errors by context bucket: as conversations grow, attention costs more
        at the same (bs, K), and an additive table drifts; these sums show where."""
        keep = both & (mean_context >= 0)
        if not keep.any():
            return
        p, m, ctx = predicted_s[keep], measured_s[keep], mean_context[keep]
        nb, nc = self.by_context.shape[1:]
        cell = group[keep] * nb + context_bucket(ctx)
        err = m - p
        values = (np.ones_like(p), p, m, err * err, np.abs(err) / m, ctx)
        size = len(self.by_context) * nb
        sums = np.stack([np.bincount(cell, weights=v, minlength=size) for v in values], axis=1)
        self.by_context += sums.reshape(-1, nb, nc)

    def refit(self, gi: int) -> Refit | None:
        return fit_cell_map(self.cells[gi], self.bs_probes, self.m_probes)

    def table(self, gi: int) -> RefitTable | None:
        """Group `gi`'s latest refit as a cost table; None before its first."""
        refit = self.refits[gi] if gi < len(self.refits) else None
        return None if refit is None else RefitTable(refit, self.bs_probes, self.m_probes)

    def error_metrics(self, table: np.ndarray) -> dict[str, np.ndarray]:
        """Mean predicted and measured, MAE, bias, mean and median relative error per group."""
        k = {name: table[:, i] for i, name in enumerate(_ERR_COLUMNS)}
        n = k["n"]
        hist = table[:, len(_ERR_COLUMNS) :]
        cum = np.cumsum(hist, axis=1)
        median_idx = np.argmax(cum >= (n / 2)[:, None], axis=1)
        edges = np.concatenate([REL_BUCKETS, [np.inf]])
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "steps": n,
                "predicted_mean": k["predicted"] / n,
                "measured_mean": k["measured"] / n,
                "abs_error_mean": k["abs_error"] / n,
                "bias": k["error"] / n,
                "rms_error": np.sqrt(k["sq_error"] / n),
                "rel_error_mean": k["rel_error"] / n,
                "rel_error_median": np.where(n > 0, edges[median_idx], np.nan),
            }

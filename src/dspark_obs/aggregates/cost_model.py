"""Does the step-cost table predict reality? Errors live, and a refit from what was measured.

Each step that carries both the scheduler's prediction and a measured step time
adds to error sums (absolute, signed, relative). The relative error also goes
into a log-spaced histogram so a median is available without keeping steps.
Timed steps also fill (bs, M-bin) cells per group, refitted now and then with
SGLang's least-squares fit (`domain.step_cost.fit_cell_map`).
"""

from __future__ import annotations

import numpy as np

from ..domain.step_cost import (
    CONTEXT_BUCKETS,
    DEFAULT_BS_PROBES,
    DEFAULT_M_PROBES,
    M_BIN,
    MAX_STEP_S,
    MIN_STEP_S,
    Refit,
    RefitTable,
    context_bucket,
    fit_cell_map,
)
from .window import WindowedSums

#: Timed steps between refits of a group: a refit is a least-squares solve over the cells,
#: too costly to redo every few steps, and the table moves slowly.
REFIT_EVERY = 1024
REL_BUCKETS = np.logspace(-4, 1, 81)  # relative-error bucket upper bounds, 15% apart
_ERR_COLUMNS = ("n", "predicted", "measured", "abs_error", "error", "sq_error", "rel_error")
#: Sums per (step group, context bucket), since start: steps, predicted and measured
#: seconds, squared error, relative error, and mean context tokens per request.
CONTEXT_COLUMNS = ("n", "predicted", "measured", "sq_error", "rel_error", "context")


class CostModelAggregate:
    def __init__(
        self,
        window_steps: int,
        segments: int,
        bs_probes=DEFAULT_BS_PROBES,
        m_probes=DEFAULT_M_PROBES,
        refit_every: int | None = None,
    ) -> None:
        self.errors = WindowedSums(len(_ERR_COLUMNS) + len(REL_BUCKETS) + 1, window_steps, segments)
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

"""Live confidence calibration per group and block position.

The prediction at position j is the survival S_j the scheduler used; the label
is "the first j+1 drafts were accepted". Rows whose ceiling is known (static,
cap-accept, a shadow twin) label every position. Compact rows alone label the
positions they reveal: accepted ones, and every position from the first
rejection on; when the whole window was accepted, positions beyond it are
unknown and left out, never counted as failures.

Two histograms per position: 15 equal-width ECE bins split by label, with
prediction sums (ECE, reliability, means and, with the sum of squared
predictions, Brier), and 1,020 fine bins split by label for AUROC. A fine bin
is 1/68 of an ECE bin and the coarse bin is derived from it, so the two always
agree; SGLang uses 1,024 AUROC bins, and both are within one fine bin's
resolution of the exact value.
"""

from __future__ import annotations

import numpy as np

from ..calibration.metrics import EPS_PROB, auroc_from_hist, ece_from_bins
from .window import WindowedSums

ECE_BINS = 15
FINE_PER_ECE_BIN = 68
FINE_BINS = ECE_BINS * FINE_PER_ECE_BIN


class ConfidenceAggregate:
    def __init__(self, gamma: int, window_steps: int, blocks: int) -> None:
        self.gamma = gamma
        # per position: FINE_BINS x {label 0, label 1} counts (AUROC)
        self.fine_stride = 2 * FINE_BINS
        self.fine = WindowedSums(gamma * self.fine_stride, window_steps, blocks, np.int64)
        # per position: ECE_BINS x {rows y=0, rows y=1, pred sum y=0, pred sum y=1}, then the
        # sum of squared predictions (Brier); counts are exact integers in float64
        self.coarse_stride = 4 * ECE_BINS + 1
        self.coarse = WindowedSums(gamma * self.coarse_stride, window_steps, blocks)

    def ensure_groups(self, n: int) -> None:
        self.fine.ensure_groups(n)
        self.coarse.ensure_groups(n)

    def advance(self, steps: int) -> None:
        self.fine.advance(steps)
        self.coarse.advance(steps)

    def update(
        self,
        group: np.ndarray,
        survival: np.ndarray,
        accepted: np.ndarray,
        window: np.ndarray,
        ceiling: np.ndarray,
    ) -> None:
        """Rows `[n]` with `survival [n, gamma]`; `ceiling` -1 where unknown.

        Rows come from validated batches, so the label rule is applied inline
        (the same rule as `calibration.prefix_labels`, without its checks).
        """
        g = self.gamma
        j = np.arange(g)
        observed = ceiling >= 0
        labels = j < np.where(observed, ceiling, accepted)[:, None]
        settled = observed | (accepted < window)
        probs = survival
        slot = (group * g)[:, None] + j
        if not settled.all():
            labelled = settled[:, None] | (j < accepted[:, None])
            sel = np.flatnonzero(labelled)
            probs, labels, slot = probs.ravel()[sel], labels.ravel()[sel], slot.ravel()[sel]
        finite = np.isfinite(probs)
        if not finite.all():
            probs, labels, slot = probs[finite], labels[finite], slot[finite]
        probs = np.clip(probs.ravel(), EPS_PROB, 1.0 - EPS_PROB)
        y = labels.ravel()
        slot = slot.ravel()
        fine = (probs * FINE_BINS).astype(np.int64)
        self.fine.add_flat(slot * self.fine_stride + 2 * fine + y)
        base = slot * self.coarse_stride
        cell = base + 4 * (fine // FINE_PER_ECE_BIN) + y
        self.coarse.add_flat(
            np.concatenate([cell, cell + 2, base + 4 * ECE_BINS]),
            np.concatenate([np.ones(len(probs)), probs, probs * probs]),
        )

    def _coarse(self, coarse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = coarse.reshape(coarse.shape[0], self.gamma, self.coarse_stride)
        return c[..., : 4 * ECE_BINS].reshape(*c.shape[:2], ECE_BINS, 4), c[..., 4 * ECE_BINS]

    def metrics(self, fine: np.ndarray | None, coarse: np.ndarray) -> dict[str, np.ndarray]:
        """ECE, Brier, AUROC (when `fine` is given), mean predicted and observed, count:
        each `[groups, gamma]`."""
        bins, pred_sq = self._coarse(coarse)
        rows = bins[..., 0] + bins[..., 1]
        positives = bins[..., 1]
        pred_sum = bins[..., 2] + bins[..., 3]
        total = rows.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            # sum (p - y)^2 = sum p^2 - 2 sum_{y=1} p + sum y
            brier = (pred_sq - 2 * bins[..., 3].sum(axis=-1) + positives.sum(axis=-1)) / total
            pred_mean = pred_sum.sum(axis=-1) / total
            observed = positives.sum(axis=-1) / total
        return {
            "ece": ece_from_bins(rows, pred_sum, positives),
            "brier": brier,
            "auroc": self._auroc(fine) if fine is not None else np.full(total.shape, np.nan),
            "pred_mean": pred_mean,
            "target_mean": observed,
            "count": total.astype(np.int64),
        }

    def _auroc(self, fine: np.ndarray) -> np.ndarray:
        f = fine.reshape(fine.shape[0], self.gamma, FINE_BINS, 2)
        return auroc_from_hist(f[..., 1], f[..., 0])

    def reliability(self, coarse: np.ndarray) -> dict[str, np.ndarray]:
        """Per group, position and ECE bin (`[groups, gamma, 15]`): rows, positives and
        prediction sums of all rows and of positive rows."""
        bins, _ = self._coarse(coarse)
        return {
            "rows": (bins[..., 0] + bins[..., 1]).astype(np.int64),
            "positives": bins[..., 1].astype(np.int64),
            "pred_sum": bins[..., 2] + bins[..., 3],
            "positive_pred_sum": bins[..., 3],
        }

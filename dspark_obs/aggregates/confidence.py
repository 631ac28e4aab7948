"""Live confidence calibration per group and block position.

The prediction at position j is the survival S_j the scheduler used; the label
is "the first j+1 drafts were accepted". Rows whose ceiling is known (static,
cap-accept, a shadow twin) label every position. Compact rows alone label the
positions they reveal: accepted ones, and every position from the first
rejection on; when the whole window was accepted, positions beyond it are
unknown and left out, never counted as failures.

One fine histogram serves every metric: 1,020 equal-width bins (68 per ECE
bin), split by label, with prediction sums per bin. The 15 ECE bins are exact
unions of fine bins, so ECE, reliability and mean prediction are those of
SGLang's 15-bin table; AUROC comes from the fine bins (SGLang uses 1,024; both
are within one fine bin's resolution of the exact value). Brier needs the sum
of squared predictions, kept per position.
"""

from __future__ import annotations

import numpy as np

from ..calibration import prefix_labels
from ..calibration.metrics import EPS_PROB, auroc_from_hist, ece_from_bins
from .window import WindowedSums

ECE_BINS = 15
FINE_PER_ECE_BIN = 68
FINE_BINS = ECE_BINS * FINE_PER_ECE_BIN


class ConfidenceAggregate:
    def __init__(self, gamma: int, window_steps: int, blocks: int) -> None:
        self.gamma = gamma
        # per position: FINE_BINS x {label 0, label 1} of counts, then of prediction sums
        self.stride = 2 * FINE_BINS
        self.counts = WindowedSums(gamma * self.stride, window_steps, blocks, np.int64)
        self.pred = WindowedSums(gamma * self.stride, window_steps, blocks)
        self.pred_sq = WindowedSums(gamma, window_steps, blocks)

    def _sums(self) -> tuple[WindowedSums, ...]:
        return self.counts, self.pred, self.pred_sq

    def ensure_groups(self, n: int) -> None:
        for s in self._sums():
            s.ensure_groups(n)

    def advance(self, steps: int) -> None:
        for s in self._sums():
            s.advance(steps)

    def update(
        self,
        group: np.ndarray,
        survival: np.ndarray,
        accepted: np.ndarray,
        window: np.ndarray,
        ceiling: np.ndarray,
    ) -> None:
        """Rows `[n]` with `survival [n, gamma]`; `ceiling` -1 where unknown."""
        g = self.gamma
        labels, labelled = prefix_labels(accepted, window, ceiling, g)
        finite = np.isfinite(survival)
        if not finite.all():
            labelled &= finite
            survival = np.where(finite, survival, 0.5)
        sel = np.flatnonzero(labelled)
        probs = np.clip(survival.ravel()[sel], EPS_PROB, 1.0 - EPS_PROB)
        slot = ((group * g)[:, None] + np.arange(g)).ravel()[sel]
        fine = (probs * FINE_BINS).astype(np.int64)
        index = slot * self.stride + 2 * fine + labels.ravel()[sel]
        self.counts.add_flat(index)
        self.pred.add_flat(index, probs)
        self.pred_sq.add_flat(slot, probs * probs)

    def _split(self, counts: np.ndarray, pred: np.ndarray):
        shape = (counts.shape[0], self.gamma, FINE_BINS, 2)
        return counts.reshape(shape), pred.reshape(shape)

    def metrics(
        self, counts: np.ndarray, pred: np.ndarray, pred_sq: np.ndarray
    ) -> dict[str, np.ndarray]:
        """ECE, Brier, AUROC, mean predicted and observed, count: each `[groups, gamma]`."""
        c, p = self._split(counts, pred)
        coarse = (counts.shape[0], self.gamma, ECE_BINS, FINE_PER_ECE_BIN, 2)
        c15 = c.reshape(coarse).sum(axis=3)
        p15 = p.reshape(coarse).sum(axis=(3, 4))
        rows = c15.sum(axis=-1)
        positives = c15[..., 1]
        total = rows.sum(axis=-1)
        pos_pred = p[..., 1].sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            # sum (p - y)^2 = sum p^2 - 2 sum_{y=1} p + sum y
            brier = (pred_sq - 2 * pos_pred + positives.sum(axis=-1)) / total
            pred_mean = p15.sum(axis=-1) / total
            observed = positives.sum(axis=-1) / total
        return {
            "ece": ece_from_bins(rows, p15, positives),
            "brier": brier,
            "auroc": auroc_from_hist(c[..., 1], c[..., 0]),
            "pred_mean": pred_mean,
            "target_mean": observed,
            "count": total,
        }

    def reliability(self, counts: np.ndarray, pred: np.ndarray) -> dict[str, np.ndarray]:
        """Per group, position and ECE bin (`[groups, gamma, 15]`): rows, positives and
        prediction sums of all rows and of positive rows."""
        c, p = self._split(counts, pred)
        coarse = (counts.shape[0], self.gamma, ECE_BINS, FINE_PER_ECE_BIN, 2)
        c15 = c.reshape(coarse).sum(axis=3)
        p15 = p.reshape(coarse).sum(axis=3)
        return {
            "rows": c15.sum(axis=-1),
            "positives": c15[..., 1],
            "pred_sum": p15.sum(axis=-1),
            "positive_pred_sum": p15[..., 1],
        }

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
from .rows import RequestRows, compiled_fold
from .window import WindowedSums

ECE_BINS = 15
FINE_PER_ECE_BIN = 68
FINE_BINS = ECE_BINS * FINE_PER_ECE_BIN
#: Bins of the finer AUROC counters the exporter publishes with `--detail-metrics` (two to
#: each ECE bin, 34 fine bins each); by default a merged AUROC comes from the ECE bins,
#: within half their tied pairs of the exact value (docs/metrics.md).
AUROC_EXPORT_BINS = 2 * ECE_BINS


class ConfidenceAggregate:
    def __init__(
        self, gamma: int, window_steps: int, segments: int, compiled: bool | None = None
    ) -> None:
        self.gamma = gamma
        self._fold = compiled_fold(compiled)
        # per position: {label 0, label 1} x FINE_BINS counts (AUROC)
        self.fine = WindowedSums(
            gamma * 2 * FINE_BINS, window_steps, segments, np.int64, running_window=True
        )
        # per position: {label 0, label 1} x ECE_BINS rows, the same of prediction sums, then
        # the sum of squared predictions (Brier); counts are exact integers in float64
        self.coarse_stride = 4 * ECE_BINS + 1
        self.coarse = WindowedSums(gamma * self.coarse_stride, window_steps, segments)
        j = np.arange(gamma)
        # per (group, reach) row: 2 * slot + label of each position, the label being
        # j < reach; grown with the groups (one take instead of a broadcast add per row)
        self._offsets = 2 * j[None, :] + (j[None, :] < np.arange(gamma + 1)[:, None])
        self._slot_labels = np.zeros((0, gamma), np.int32)

    def ensure_groups(self, n: int) -> None:
        self.fine.ensure_groups(n)
        self.coarse.ensure_groups(n)
        g = self.gamma
        if self._fold is None and len(self._slot_labels) < n * (g + 1):  # numpy fold's table
            shift = (np.arange(n) * (2 * g))[:, None, None]
            # int32 like the fine bins added to it: numpy mixes int32 and int64 slowly
            self._slot_labels = (
                (self._offsets[None] + shift).reshape(n * (g + 1), g).astype(np.int32)
            )

    def advance(self, steps: int) -> None:
        self.fine.advance(steps)
        self.coarse.advance(steps)

    def update(self, rows: RequestRows) -> None:
        """The positions of validated rows (survival within [0, 1]) with their labels.

        The label rule is `calibration.prefix_labels`, applied inline without its
        checks because the rows come from validated batches. A row's ceiling is its
        mode's where known, else its shadow twin's.
        """
        g = self.gamma
        if self._fold is not None:
            self._fold.confidence(
                self.fine.current,
                self.fine.win,
                self.coarse.current,
                g,
                EPS_PROB,
                rows.batches,
                rows.modes,
                rows.group,
            )
            return
        if rows.survival is None:
            return
        keep = rows.scored
        group, survival, accepted, window = (
            rows.group[keep],
            rows.survival,
            rows.accepted[keep],
            rows.window[keep],
        )
        ceiling = np.where(rows.ceiling >= 0, rows.ceiling, rows.shadow)[keep]
        j = np.arange(g)
        observed = ceiling >= 0
        reach = np.where(observed, ceiling, accepted)
        settled = observed | (accepted < window)
        # 2 * slot + label, the label of position j being j < reach (a table row per reach)
        slot_label = self._slot_labels.take(group * (g + 1) + reach, axis=0)
        probs = survival
        if not settled.all():
            sel = np.flatnonzero(settled[:, None] | (j < accepted[:, None]))
            probs, slot_label = probs.ravel()[sel], slot_label.ravel()[sel]
        probs = np.clip(probs.ravel(), EPS_PROB, 1.0 - EPS_PROB)
        slot_label = slot_label.ravel()
        fine = slot_label * FINE_BINS + (probs * FINE_BINS).astype(np.int32)
        self.fine.add_flat(fine)
        cell = fine // FINE_PER_ECE_BIN  # = slot_label * ECE_BINS + ECE bin, as 1020 = 15 * 68
        slots = self.coarse.groups * g
        size = 2 * ECE_BINS * slots
        squares = np.bincount(slot_label, weights=probs * probs, minlength=2 * slots)
        delta = np.concatenate(
            [
                np.bincount(cell, minlength=size).reshape(slots, 2 * ECE_BINS),
                np.bincount(cell, weights=probs, minlength=size).reshape(slots, 2 * ECE_BINS),
                squares.reshape(slots, 2).sum(axis=1)[:, None],
            ],
            axis=1,
        )
        self.coarse.add(delta.reshape(self.coarse.groups, -1))

    def _coarse(self, coarse: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows and prediction sums `[groups, gamma, 2 labels, ECE_BINS]`, squared sums."""
        c = coarse.reshape(coarse.shape[0], self.gamma, self.coarse_stride)
        k = 2 * ECE_BINS
        shape = (*c.shape[:2], 2, ECE_BINS)
        return c[..., :k].reshape(shape), c[..., k : 2 * k].reshape(shape), c[..., 2 * k]

    def metrics(self, fine: np.ndarray | None, coarse: np.ndarray) -> dict[str, np.ndarray]:
        """ECE, Brier, AUROC (when `fine` is given), mean predicted and observed, count:
        each `[groups, gamma]`."""
        counts, preds, pred_sq = self._coarse(coarse)
        rows = counts.sum(axis=2)
        positives = counts[:, :, 1]
        pred_sum = preds.sum(axis=2)
        total = rows.sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            # sum (p - y)^2 = sum p^2 - 2 sum_{y=1} p + sum y
            brier = (pred_sq - 2 * preds[:, :, 1].sum(axis=-1) + positives.sum(axis=-1)) / total
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
        f = fine.reshape(fine.shape[0], self.gamma, 2, FINE_BINS)
        return auroc_from_hist(f[:, :, 1], f[:, :, 0])

    def reliability(self, coarse: np.ndarray, fine: np.ndarray) -> dict[str, np.ndarray]:
        """The sufficient statistics of every calibration figure, since start, per group
        and position: per ECE bin (`[groups, gamma, 15]`) rows, positives and prediction
        sums of all rows and of positive rows; the sum of squared predictions
        (`[groups, gamma]`); per AUROC export bin (`[groups, gamma, 30]`) positives,
        negatives and negatives in lower bins. Sums of these over any set of groups give
        that set's ECE, Brier and AUROC exactly (AUROC to the resolution of its bins)."""
        counts, preds, pred_sq = self._coarse(coarse)
        per = FINE_BINS // AUROC_EXPORT_BINS  # explicit: no group yet is an empty array
        f = fine.reshape(fine.shape[0], self.gamma, 2, AUROC_EXPORT_BINS, per).sum(axis=-1)
        negatives = f[:, :, 0]
        return {
            "rows": counts.sum(axis=2).astype(np.int64),
            "positives": counts[:, :, 1].astype(np.int64),
            "pred_sum": preds.sum(axis=2),
            "positive_pred_sum": preds[:, :, 1],
            "pred_squared_sum": pred_sq,
            "auroc_positives": f[:, :, 1],
            "auroc_negatives": negatives,
            "auroc_negatives_below": np.cumsum(negatives, axis=-1) - negatives,
        }

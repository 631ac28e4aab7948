"""Per-position calibration metrics, computed the way SGLang's debug table computes them.

The numbers must be comparable with what `SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS`
logs, so the binning is SGLang's: probabilities clamped to [1e-8, 1 - 1e-8],
15 equal-width bins for ECE and reliability, 1,024 for AUROC. Everything lives
in fixed-size histograms so a long run is summarised incrementally (and shards
merge) without keeping rows.

AUROC from the fine histogram, with `P_b`, `N_b` the positives and negatives in
bin `b` and `P`, `N` their totals:

    AUROC = (sum_b P_b * sum_{b' < b} N_b'  +  0.5 * sum_b P_b * N_b) / (P * N)

This is the trapezoid area under the ROC curve traced by thresholds at the bin
edges; a positive and a negative sharing a bin count as half a correctly ordered
pair. It equals the exact Mann-Whitney AUROC whenever equal scores are exactly
the ones sharing a bin, and differs from it by at most `0.5 * sum_b P_b N_b / (P N)`
otherwise. NaN when either class is absent.
"""

from __future__ import annotations

import numpy as np

EPS_PROB = 1e-8


def _clamp(pred: np.ndarray) -> np.ndarray:
    return np.clip(np.asarray(pred, dtype=np.float64), EPS_PROB, 1.0 - EPS_PROB)


def _bin_index(probs: np.ndarray, num_bins: int) -> np.ndarray:
    # probs are already clamped to (0, 1): truncation equals floor.
    return np.minimum((probs * num_bins).astype(np.int64), num_bins - 1)


def _coarse_bins(
    flat_index: np.ndarray, probs: np.ndarray, targets: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = np.bincount(flat_index, minlength=size)
    pred_sum = np.bincount(flat_index, weights=probs, minlength=size)
    target_sum = np.bincount(flat_index, weights=targets, minlength=size)
    return count, pred_sum, target_sum


def ece_from_bins(count: np.ndarray, pred_sum: np.ndarray, target_sum: np.ndarray) -> np.ndarray:
    """SGLang's reduction, kept in one place so every ECE here agrees bit for bit."""
    denom = np.maximum(count, 1)
    err = np.abs(pred_sum / denom - target_sum / denom) * count
    total = count.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return err.sum(axis=-1) / total


def ece_rows(probs: np.ndarray, targets: np.ndarray, num_bins: int = 15) -> np.ndarray:
    """ECE of each row of `probs [k, m]` against one shared `targets [m]`.

    STS scores all grid temperatures of a position in one pass with this.
    """
    probs = _clamp(probs)
    k, m = probs.shape
    targets = np.broadcast_to(np.asarray(targets, dtype=np.float64), (k, m))
    flat = (np.arange(k, dtype=np.int64)[:, None] * num_bins + _bin_index(probs, num_bins)).ravel()
    count, pred_sum, target_sum = _coarse_bins(flat, probs.ravel(), targets.ravel(), k * num_bins)
    shape = (k, num_bins)
    return ece_from_bins(count.reshape(shape), pred_sum.reshape(shape), target_sum.reshape(shape))


def expected_calibration_error(pred: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> float:
    """ECE of 1-D predictions; NaN when empty."""
    pred = np.asarray(pred, dtype=np.float64).reshape(1, -1)
    return float(ece_rows(pred, np.asarray(labels).reshape(-1), num_bins)[0])


def brier_score(pred: np.ndarray, labels: np.ndarray) -> float:
    """Mean squared error of clamped predictions (SGLang clamps before squaring)."""
    pred = _clamp(pred).reshape(-1)
    if pred.size == 0:
        return float("nan")
    return float(np.mean((pred - np.asarray(labels, dtype=np.float64).reshape(-1)) ** 2))


def auroc_from_hist(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """AUROC along the last axis of integer histograms (see the module docstring)."""
    total = pos.sum(axis=-1) * neg.sum(axis=-1)
    if total.size and total.max() < 2**60:
        # doubled pair counts fit int64 exactly here: sum_b P_b (2 N_<b + N_b) <= 2 P N
        below = 2 * np.cumsum(neg, axis=-1) - neg
        pairs = np.einsum("...i,...i->...", pos, below) / 2.0
    else:
        below = np.cumsum(neg, axis=-1, dtype=np.float64) - 0.5 * neg
        pairs = np.einsum("...i,...i->...", pos.astype(np.float64), below)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, pairs / np.where(total > 0, total, 1), np.nan)


def histogram_auroc(pred: np.ndarray, labels: np.ndarray, num_bins: int = 1024) -> float:
    """AUROC of 1-D predictions from a `num_bins` histogram (see the module docstring)."""
    probs = _clamp(pred).reshape(-1)
    labels = np.asarray(labels).reshape(-1).astype(bool)
    idx = _bin_index(probs, num_bins)
    pos = np.bincount(idx[labels], minlength=num_bins)
    neg = np.bincount(idx[~labels], minlength=num_bins)
    return float(auroc_from_hist(pos, neg))


def position_metrics(
    pred: np.ndarray,
    labels: np.ndarray,
    labelled: np.ndarray | None = None,
    num_bins: int = 15,
    auroc_bins: int = 1024,
) -> list[dict]:
    """One-shot `CalibrationAccumulator(...).update(...).compute()`."""
    acc = CalibrationAccumulator(np.shape(pred)[1], num_bins=num_bins, auroc_bins=auroc_bins)
    return acc.update(pred, labels, labelled).compute()


class CalibrationAccumulator:
    """Fixed-size per-position histograms: cheap to update per step, exact to merge.

    Counts and label sums are integers (exact across any split of the data);
    prediction and squared-error sums are float64 sums.
    """

    def __init__(self, gamma: int, num_bins: int = 15, auroc_bins: int = 1024) -> None:
        if gamma < 1 or num_bins < 1 or auroc_bins < 1:
            raise ValueError("gamma, num_bins and auroc_bins must be >= 1")
        self.gamma, self.num_bins, self.auroc_bins = int(gamma), int(num_bins), int(auroc_bins)
        self.count = np.zeros((self.gamma, self.num_bins), np.int64)
        self.pred_sum = np.zeros((self.gamma, self.num_bins), np.float64)
        self.target_sum = np.zeros((self.gamma, self.num_bins), np.int64)
        self.fine_pos = np.zeros((self.gamma, self.auroc_bins), np.int64)
        self.fine_neg = np.zeros((self.gamma, self.auroc_bins), np.int64)
        self.sq_err_sum = np.zeros(self.gamma, np.float64)

    def update(
        self, pred: np.ndarray, labels: np.ndarray, labelled: np.ndarray | None = None
    ) -> CalibrationAccumulator:
        """Add `[n, gamma]` predictions; entries with `labelled` False are skipped."""
        pred, labels, labelled = self._checked(pred, labels, labelled)
        position = np.broadcast_to(np.arange(self.gamma, dtype=np.int64), pred.shape)[labelled]
        probs = _clamp(pred[labelled])
        targets = labels[labelled]
        targets_f = targets.astype(np.float64)

        g, nb, fb = self.gamma, self.num_bins, self.auroc_bins
        coarse = position * nb + _bin_index(probs, nb)
        count, pred_sum, target_sum = _coarse_bins(coarse, probs, targets_f, g * nb)
        self.count += count.reshape(g, nb)
        self.pred_sum += pred_sum.reshape(g, nb)
        self.target_sum += target_sum.astype(np.int64).reshape(g, nb)

        fine = position * fb + _bin_index(probs, fb)
        self.fine_pos += np.bincount(fine[targets], minlength=g * fb).reshape(g, fb)
        self.fine_neg += np.bincount(fine[~targets], minlength=g * fb).reshape(g, fb)
        self.sq_err_sum += np.bincount(position, weights=(probs - targets_f) ** 2, minlength=g)
        return self

    def _checked(
        self, pred: np.ndarray, labels: np.ndarray, labelled: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pred = np.asarray(pred, dtype=np.float64)
        if pred.ndim != 2 or pred.shape[1] != self.gamma:
            raise ValueError(f"pred must be [n, {self.gamma}], got {pred.shape}")
        labels = np.asarray(labels)
        if labels.shape != pred.shape:
            raise ValueError(f"labels shape {labels.shape} != pred shape {pred.shape}")
        if labels.dtype != np.bool_:
            if not np.isin(labels, (0, 1)).all():
                raise ValueError("labels must be 0/1")
            labels = labels.astype(bool)
        if labelled is None:
            labelled = np.ones(pred.shape, dtype=bool)
        labelled = np.asarray(labelled, dtype=bool)
        if labelled.shape != pred.shape:
            raise ValueError(f"labelled shape {labelled.shape} != pred shape {pred.shape}")
        if not np.isfinite(pred[labelled]).all():
            raise ValueError("pred has non-finite values at labelled positions")
        return pred, labels, labelled

    def add_histograms(self, **flat: np.ndarray) -> CalibrationAccumulator:
        """Add histograms binned elsewhere (flat, position-major), e.g. by a polars group_by.

        Integer histograms arrive as float bincount weights; they are rounded
        back to integers, which is exact below 2**53 rows.
        """
        for name, values in flat.items():
            mine = getattr(self, name)
            values = np.asarray(values).reshape(mine.shape)
            mine += np.rint(values).astype(np.int64) if mine.dtype == np.int64 else values
        return self

    def merge(self, other: CalibrationAccumulator) -> CalibrationAccumulator:
        """Add another accumulator's histograms into this one (e.g. per-rank shards)."""
        if (other.gamma, other.num_bins, other.auroc_bins) != (
            self.gamma,
            self.num_bins,
            self.auroc_bins,
        ):
            raise ValueError("cannot merge accumulators of different gamma or bin counts")
        for name in ("count", "pred_sum", "target_sum", "fine_pos", "fine_neg", "sq_err_sum"):
            mine = getattr(self, name)
            mine += getattr(other, name)
        return self

    def compute(self) -> list[dict]:
        """Per position: position, ece, brier, auroc, pred_mean, target_mean, count."""
        total = self.count.sum(axis=1)
        ece = ece_from_bins(self.count, self.pred_sum, self.target_sum)
        auroc = auroc_from_hist(self.fine_pos, self.fine_neg)
        with np.errstate(invalid="ignore", divide="ignore"):
            brier = self.sq_err_sum / total
            pred_mean = self.pred_sum.sum(axis=1) / total
            target_mean = self.target_sum.sum(axis=1) / total
        return [
            {
                "position": j,
                "ece": float(ece[j]),
                "brier": float(brier[j]),
                "auroc": float(auroc[j]),
                "pred_mean": float(pred_mean[j]),
                "target_mean": float(target_mean[j]),
                "count": int(total[j]),
            }
            for j in range(self.gamma)
        ]

    def reliability(self) -> list[dict]:
        """Per position, arrays over the ECE bins: lo, hi, count, pred_mean, target_mean.

        Empty bins keep count 0 and NaN means, so every position has the same shape.
        """
        edges = np.arange(self.num_bins + 1, dtype=np.float64) / self.num_bins
        with np.errstate(invalid="ignore", divide="ignore"):
            pred_mean = self.pred_sum / self.count
            target_mean = self.target_sum / self.count
        return [
            {
                "position": j,
                "lo": edges[:-1].copy(),
                "hi": edges[1:].copy(),
                "count": self.count[j].copy(),
                "pred_mean": pred_mean[j],
                "target_mean": target_mean[j],
            }
            for j in range(self.gamma)
        ]

"""Load per (mode, rank): batch size, budget, verify tokens and graph tier per step.

These are the article's figure-3 quantities: as batch size rises the scheduler
should shrink the budget per request, and the packed verify tokens should drop
to smaller captured tiers.
"""

from __future__ import annotations

import numpy as np

from .window import WindowedSums

#: Upper bounds of the histogram buckets (token or request counts), `+Inf` implied.
COUNT_BUCKETS = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])

#: Step quantities kept as histograms, in column order.
QUANTITIES = ("batch_size", "budget", "verify_tokens", "graph_tier")


class StepAggregate:
    def __init__(self, window_steps: int, segments: int) -> None:
        self.nb = len(COUNT_BUCKETS) + 1
        self.stride = self.nb + 1  # bucket counts, then the sum
        # one leading column: steps seen
        self.sums = WindowedSums(1 + len(QUANTITIES) * self.stride, window_steps, segments)

    def update(self, group: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Per step: its (mode, rank) group and each quantity (NaN where not recorded)."""
        base = group * self.sums.width
        index = [base]
        weights = [np.ones(len(group))]
        for q, name in enumerate(QUANTITIES):
            v = values[name]
            ok = np.isfinite(v)
            col = base[ok] + 1 + q * self.stride
            bucket = np.searchsorted(COUNT_BUCKETS, v[ok], side="left")
            index += [col + bucket, col + self.nb]
            weights += [np.ones(int(ok.sum())), v[ok]]
        self.sums.add_flat(np.concatenate(index), np.concatenate(weights))


def quantity_histogram(table: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(`[groups, buckets + 1]` counts incl. +Inf, `[groups]` sums) of one quantity."""
    nb = len(COUNT_BUCKETS) + 1
    start = 1 + QUANTITIES.index(name) * (nb + 1)
    return table[:, start : start + nb].astype(np.int64), table[:, start + nb]

"""Sums kept two ways at once: since start, and over the last N steps.

Prometheus derives rates from counters itself, but ratios such as ECE or
utilisation cannot be recovered from rates of their parts, so they are also
published over a sliding window. The window is a ring of blocks: adding goes to
the current block and to a running window sum; when a block fills, the oldest
block is subtracted from the running sum and cleared. Reading the window is
then a copy, not a reduction over the ring. Memory is
blocks x groups x width, whatever the run length.
"""

from __future__ import annotations

import numpy as np

#: Below this share of touched cells an update adds at the touched cells only.
_SPARSE_SHARE = 0.125


class WindowedSums:
    def __init__(
        self, width: int, window_steps: int = 1024, blocks: int = 8, dtype: type = np.float64
    ) -> None:
        if width < 1 or window_steps < 1 or blocks < 1:
            raise ValueError("width, window_steps and blocks must be >= 1")
        self.width = width
        self.blocks = blocks
        self.block_steps = max(1, -(-window_steps // blocks))
        self.window_steps = self.block_steps * blocks
        self.total = np.zeros((0, width), dtype=dtype)
        self.win = np.zeros((0, width), dtype=dtype)
        self.ring = np.zeros((blocks, 0, width), dtype=dtype)
        self._current = 0
        self._steps_in_block = 0

    @property
    def groups(self) -> int:
        return self.total.shape[0]

    def ensure_groups(self, n: int) -> None:
        grow = n - self.groups
        if grow > 0:
            pad = np.zeros((grow, self.width), self.total.dtype)
            self.total = np.concatenate([self.total, pad])
            self.win = np.concatenate([self.win, pad])
            self.ring = np.concatenate(
                [self.ring, np.broadcast_to(pad, (self.blocks, *pad.shape))], axis=1
            )

    def add(self, delta: np.ndarray) -> None:
        """Add a dense `[groups, width]` array."""
        delta = delta.astype(self.total.dtype, copy=False)
        self.total += delta
        self.win += delta
        self.ring[self._current] += delta

    def add_flat(self, index: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add weights (or ones) at flat positions `group * width + column`."""
        size = self.groups * self.width
        flats = (self.total.reshape(-1), self.win.reshape(-1), self.ring[self._current].reshape(-1))
        if len(index) < _SPARSE_SHARE * size:
            cells, inverse = np.unique(index, return_inverse=True)
            delta = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(cells))
            delta = delta.astype(self.total.dtype, copy=False)
            for flat in flats:
                flat[cells] += delta
        else:
            delta = np.bincount(index, weights=weights, minlength=size)
            delta = delta.astype(self.total.dtype, copy=False)
            for flat in flats:
                flat += delta

    @property
    def room(self) -> int:
        """Steps the current block still takes before the ring turns."""
        return self.block_steps - self._steps_in_block

    def advance(self, steps: int) -> None:
        """Account for `steps` more steps; rotate blocks as they fill."""
        self._steps_in_block += steps
        while self._steps_in_block >= self.block_steps:
            self._steps_in_block -= self.block_steps
            self._current = (self._current + 1) % self.blocks
            self.win -= self.ring[self._current]
            self.ring[self._current] = 0

    def window(self) -> np.ndarray:
        return self.win.copy()

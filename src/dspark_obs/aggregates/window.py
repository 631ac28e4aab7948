"""Sums kept two ways at once: since start, and over the last N steps.

Prometheus derives rates from counters itself, but ratios such as ECE or
utilisation cannot be recovered from rates of their parts, so they are also
published over a sliding window. The window is a ring of segments (a segment: a
run of consecutive steps; not a draft block). Adding writes to the current
segment only, the one write per cell the hot path pays; the sums of the closed
segments (since start, and those still in the window) are kept apart and move on
when a segment fills, once per segment rather than once per update. Reading
either sum is then one addition, not a reduction over the ring. Memory is
segments x groups x width, whatever the run length.
"""

from __future__ import annotations

import numpy as np

#: Below this share of touched cells an update adds at the touched cells only.
_SPARSE_SHARE = 0.125


class WindowedSums:
    def __init__(
        self,
        width: int,
        window_steps: int = 1024,
        segments: int = 8,
        dtype: type = np.float64,
        running_window: bool = False,
    ) -> None:
        """`running_window`: also keep `win`, the window's sums, up to date at every add,
        for a large table read at every scrape (a second write per cell on the hot path
        instead of a pass over the whole table per read)."""
        if width < 1 or window_steps < 1 or segments < 1:
            raise ValueError("width, window_steps and segments must be >= 1")
        self.width = width
        self.segments = segments
        self.segment_steps = max(1, -(-window_steps // segments))
        self.window_steps = self.segment_steps * segments
        # the closed segments' sums: all of them, and those still in the window (which a
        # running window already holds, with the current segment)
        self._closed_total = np.zeros((0, width), dtype=dtype)
        self._closed_win = None if running_window else np.zeros((0, width), dtype=dtype)
        self.ring = np.zeros((segments, 0, width), dtype=dtype)
        self.win = np.zeros((0, width), dtype=dtype) if running_window else None
        self._current = 0
        self._steps_in_segment = 0

    @property
    def groups(self) -> int:
        return self._closed_total.shape[0]

    @property
    def current(self) -> np.ndarray:
        """The segment being filled, `[groups, width]`: where updates add."""
        return self.ring[self._current]

    @property
    def total(self) -> np.ndarray:
        """Sums since start, `[groups, width]` (a new array)."""
        return self._closed_total + self.current

    def ensure_groups(self, n: int) -> None:
        grow = n - self.groups
        if grow > 0:
            pad = np.zeros((grow, self.width), self._closed_total.dtype)
            self._closed_total = np.concatenate([self._closed_total, pad])
            if self.win is None:
                self._closed_win = np.concatenate([self._closed_win, pad])
            else:
                self.win = np.concatenate([self.win, pad])
            self.ring = np.concatenate(
                [self.ring, np.broadcast_to(pad, (self.segments, *pad.shape))], axis=1
            )

    def add(self, delta: np.ndarray) -> None:
        """Add a dense `[groups, width]` array."""
        delta = delta.astype(self.ring.dtype, copy=False)
        for sums in self._written():
            sums += delta

    def add_flat(self, index: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add weights (or ones) at flat positions `group * width + column`."""
        size = self.current.size
        if len(index) < _SPARSE_SHARE * size:
            cells, inverse = np.unique(index, return_inverse=True)
            delta = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(cells))
            delta = delta.astype(self.ring.dtype, copy=False)
            for sums in self._written():
                sums.reshape(-1)[cells] += delta
        else:
            delta = np.bincount(index, weights=weights, minlength=size)
            delta = delta.astype(self.ring.dtype, copy=False)
            for sums in self._written():
                sums.reshape(-1)[...] += delta

    def _written(self) -> list[np.ndarray]:
        """What an update adds to: the current segment, and the running window if kept."""
        return [self.current] if self.win is None else [self.current, self.win]

    @property
    def room(self) -> int:
        """Steps the current segment still takes before the ring turns."""
        return self.segment_steps - self._steps_in_segment

    def advance(self, steps: int) -> None:
        """Account for `steps` more steps; rotate segments as they fill."""
        self._steps_in_segment += steps
        while self._steps_in_segment >= self.segment_steps:
            self._steps_in_segment -= self.segment_steps
            self._closed_total += self.current
            window = self.win  # the window's sums, the current segment included
            if window is None:
                self._closed_win += self.current
                window = self._closed_win
            self._current = (self._current + 1) % self.segments
            window -= self.current  # the segment leaving the window
            self.current[...] = 0

    def window(self) -> np.ndarray:
        """Sums over the window, `[groups, width]` (a new array)."""
        return self._closed_win + self.current if self.win is None else self.win.copy()

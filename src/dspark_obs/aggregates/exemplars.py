"""Recent observations behind the token histograms' buckets: the exemplars of OpenMetrics.

A bucket that looks wrong on a dashboard is a question about requests: which one, at which
step? So for each request group and bucket of the window, accepted and committed
histograms, the last request-step seen there is kept (its request id and step), and the
exposition attaches it to the bucket where Prometheus takes exemplars. Taken from the last
step of each fold of request rows (every few steps): recent, and a few microseconds a step.
"""

from __future__ import annotations

import time

import numpy as np

from ..telemetry import StepBatch

#: The histograms whose buckets get exemplars, and the rows' values they bucket.
HISTOGRAMS = ("window", "accepted", "committed")
#: Characters of a request id an exemplar carries (OpenMetrics allows 128 for its labels).
RID_CHARS = 64


def _label(rid) -> str:
    """A request id as an exemplar's label value: bounded, and UTF-8 whatever a client sent."""
    return str(rid)[:RID_CHARS].encode("utf-8", "replace").decode("utf-8")


class RecentObservations:
    """Per (histogram, group, bucket): the request id, step and time of the last row seen."""

    def __init__(self, gamma: int) -> None:
        self.buckets = gamma + 3  # 0..gamma+1, and +Inf (never observed: a value is bounded)
        self.rid = {h: np.empty((0, self.buckets), dtype=object) for h in HISTOGRAMS}
        self.step = {h: np.empty((0, self.buckets), dtype=np.int64) for h in HISTOGRAMS}
        self.time = {h: np.empty((0, self.buckets), dtype=np.float64) for h in HISTOGRAMS}

    def _grow(self, groups: int) -> None:
        have = len(self.step[HISTOGRAMS[0]])
        if groups <= have:
            return
        extra = groups - have
        for h in HISTOGRAMS:
            self.rid[h] = np.vstack([self.rid[h], np.full((extra, self.buckets), None, object)])
            self.step[h] = np.vstack([self.step[h], np.full((extra, self.buckets), -1)])
            self.time[h] = np.vstack([self.time[h], np.full((extra, self.buckets), np.nan)])

    def observe(self, batch: StepBatch, group: np.ndarray, groups: int) -> None:
        """The rows of one step, `group` the group of each."""
        self._grow(groups)
        now = time.time()
        for h in HISTOGRAMS:
            value = np.asarray(getattr(batch, h), dtype=np.int64)
            key = group * self.buckets + np.clip(value, 0, self.buckets - 1)
            last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]
            g, b = np.divmod(key[last], self.buckets)
            self.rid[h][g, b] = [_label(r) for r in batch.rid[last]]
            self.step[h][g, b] = batch.forward_ct
            self.time[h][g, b] = now

    def copy(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per histogram (rid, step, time), `[groups, buckets]`, for a snapshot."""
        return {h: (self.rid[h].copy(), self.step[h].copy(), self.time[h].copy())
                for h in HISTOGRAMS}  # fmt: skip

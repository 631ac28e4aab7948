"""Ingest counters per source: steps taken, steps rejected by reason, and whether it is up.

Sources (the SGLang poller counts what it could not decode) and the pipeline (which
counts what breaks the telemetry model) write here; publishers read a snapshot of them
(`IngestSnapshot.sections()`). A rejection is logged once per (source, reason), then only counted.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..series import Labels, Samples

log = logging.getLogger(__name__)


class IngestSnapshot(NamedTuple):
    """The counters at one moment: steps taken per source, rejected per (source, reason),
    up (1) or down (0) per source, and steps dropped unseen per reason."""

    records: dict[str, int]
    errors: dict[tuple[str, str], int]
    up: dict[str, int]
    dropped: dict[str, int]

    def sections(self) -> dict[str, IngestSeries]:
        return {"ingest": IngestSeries(self)}


@dataclass(eq=False)
class IngestSeries:
    """The ingest counters as published series, per source (and reason)."""

    snap: IngestSnapshot

    @staticmethod
    def _per_source(counts: dict[str, int]) -> Samples:
        labels = Labels(("source",), [(s,) for s in counts])
        return Samples(labels, np.array(list(counts.values()), dtype=np.int64))

    @property
    def records(self) -> Samples:
        return self._per_source(self.snap.records)

    @property
    def errors(self) -> Samples:
        errors = self.snap.errors
        labels = Labels(("source", "reason"), errors)
        return Samples(labels, np.array(list(errors.values()), dtype=np.int64))

    @property
    def up(self) -> Samples:
        return self._per_source(self.snap.up)

    @property
    def dropped(self) -> Samples:
        dropped = self.snap.dropped
        labels = Labels(("reason",), [(r,) for r in dropped])
        return Samples(labels, np.array(list(dropped.values()), dtype=np.int64))


class IngestStats:
    """Per-source counters, shared by the pipeline and whoever renders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: dict[str, int] = defaultdict(int)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.up: dict[str, int] = {}
        self.dropped: dict[str, int] = {}

    def record(self, source: str, n: int = 1) -> None:
        with self._lock:
            self.records[source] += n

    def error(self, source: str, reason: str, message: str, count: int = 1) -> None:
        with self._lock:
            first = (source, reason) not in self.errors
            self.errors[(source, reason)] += count
        if first:
            log.warning(
                # not "rejected a step": a failed poll or steps the server dropped count
                # here too (the reason says which)
                "source %s: %s: %s; further ones are only counted (dspark_ingest_errors_total)",
                source,
                reason,
                message,
            )

    def set_up(self, source: str, up: bool) -> None:
        with self._lock:
            self.up[source] = int(up)

    def set_dropped(self, reason: str, total: int) -> None:
        """Steps a producer dropped before we saw them, as the producer counts them (a
        total, not an increment); a reason appears once its first step is dropped."""
        if total:
            with self._lock:
                self.dropped[reason] = total

    def snapshot(self) -> IngestSnapshot:
        with self._lock:
            return IngestSnapshot(
                dict(self.records), dict(self.errors), dict(self.up), dict(self.dropped)
            )

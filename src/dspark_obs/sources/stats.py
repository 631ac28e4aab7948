"""Ingest counters per source: steps taken, steps rejected by reason, and whether it is up.

Sources (the SGLang poller counts what it could not decode) and the pipeline (which
counts what breaks the telemetry model) write here; the exporter publishes a snapshot.
A rejection is logged once per (source, reason), then only counted.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

log = logging.getLogger(__name__)


class IngestStats:
    """Per-source counters, shared by the pipeline and whoever renders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: dict[str, int] = defaultdict(int)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.up: dict[str, int] = {}

    def record(self, source: str, n: int = 1) -> None:
        with self._lock:
            self.records[source] += n

    def error(self, source: str, reason: str, message: str, count: int = 1) -> None:
        with self._lock:
            first = (source, reason) not in self.errors
            self.errors[(source, reason)] += count
        if first:
            log.warning(
                "source %s: rejected a step (%s): %s; further ones are only counted",
                source,
                reason,
                message,
            )

    def set_up(self, source: str, up: bool) -> None:
        with self._lock:
            self.up[source] = int(up)

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[str, int]]:
        with self._lock:
            return dict(self.records), dict(self.errors), dict(self.up)

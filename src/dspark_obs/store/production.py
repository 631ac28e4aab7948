"""The production record: what a live service sees, kept on disk within bounds.

A run directory grows without end; a service that runs for weeks needs its steps kept in
pieces it can read by time and drop by age. A production store is a directory of run
directories, one per node, rank and UTC hour:

    STORE/store.json
    STORE/node=<node>/rank=<rank>/hour=<YYYYMMDDTHH>/   (a run directory, run.json and all)

so a time range of one node, one rank or the whole fleet is a set of directories
(`store/time_range.py` reads it as runs). Each step is stored in the hour it is stored in,
with that time in the steps table (`time`), so a range that cuts an hour selects its steps
exactly. An hour's writer is closed when its rank's first step of the next hour comes, or
once it holds an eighth of the size bound: the hour goes on in a segment of its own
(`hour=...T07.1`), so that retention by size can act within an hour too. A service that
restarts within an hour starts a new segment of it.

Retention is always on: hours older than `max_age_hours` are deleted, then the oldest
closed hours until the store is within `max_bytes` (the hours being written are never
deleted). What it deletes is counted (`dspark_store_deleted_steps_total`), never silent.
`sample_requests` keeps that share of requests, whole: a request is kept or not by its id
alone, so a kept request has every one of its steps; steps keep their step-level figures
either way.
"""

from __future__ import annotations

import calendar
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..series import Labels, Samples
from ..telemetry.batch import StepBatch
from .errors import RunStoreError
from .inventory import MANIFEST
from .manifest import read_manifest
from .writer import RunWriter

log = logging.getLogger(__name__)

#: The file that makes a directory a production store.
STORE_MARKER = "store.json"
STORE_FORMAT = "dspark-obs-store"
#: Seconds in a partition: an hour.
PARTITION_SECONDS = 3600
#: A store's flush interval: a part every this many steps or seconds (a crash loses at most
#: that), small enough that a segment of an hour can close at a fraction of the size bound.
STORE_FLUSH_STEPS = 256
STORE_FLUSH_SECONDS = 30.0
#: How often retention looks at the disk, in seconds of stored time.
RETENTION_EVERY = 60.0
_NODE_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_HOUR_RE = re.compile(r"^hour=(\d{8}T\d{2})(?:\.(\d{1,6}))?$")
#: An hour is split into segments once one holds this share of the size bound.
SEGMENTS_PER_BOUND = 8


def node_dir(node: str) -> str:
    """`node=<node>`, the node's name made a safe, bounded directory name."""
    safe = _NODE_SAFE.sub("_", node)[:100].strip(".") or "node"
    return f"node={safe}"


def hour_name(hour: int, segment: int = 0) -> str:
    """`hour=YYYYMMDDTHH` of the partition that starts at `hour * 3600` (UTC), `.N` for its
    segment N after the first."""
    name = "hour=" + time.strftime("%Y%m%dT%H", time.gmtime(hour * PARTITION_SECONDS))
    return f"{name}.{segment}" if segment else name


def hour_of(name: str) -> int | None:
    """The partition index of a directory named `hour=...`, or None."""
    key = segment_of(name)
    return None if key is None else key[0]


def segment_of(name: str) -> tuple[int, int] | None:
    """(hour, segment) of a directory named `hour=...[.N]`, or None: the store's order."""
    m = _HOUR_RE.match(name)
    if m is None:
        return None
    try:
        hour = calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H")) // PARTITION_SECONDS
    except (ValueError, OverflowError):
        return None
    return hour, int(m.group(2) or 0)


def is_store(path: Path) -> bool:
    return (path / STORE_MARKER).is_file()


@dataclass(frozen=True)
class Retention:
    """How much a store keeps: hours of age and bytes on disk (each None: unbounded)."""

    max_age_hours: float | None = 72.0
    max_bytes: int | None = 20 << 30

    def __post_init__(self) -> None:
        if self.max_age_hours is not None and not self.max_age_hours > 0:
            raise ValueError(f"retention age must be > 0 hours, not {self.max_age_hours}")
        if self.max_bytes is not None and not self.max_bytes > 0:
            raise ValueError(f"retention size must be > 0 bytes, not {self.max_bytes}")


@dataclass
class _Partition:
    path: Path
    hour: int
    steps: int = 0
    bytes: int = 0


@dataclass(eq=False)
class StoreSeries:
    """The store's own figures as published series."""

    bytes_on_disk: int
    deleted_steps: int
    deleted_hours: int

    @property
    def bytes(self) -> Samples:
        return Samples(Labels((), [()]), np.array([self.bytes_on_disk], dtype=np.int64))

    @property
    def deleted(self) -> Samples:
        return Samples(Labels((), [()]), np.array([self.deleted_steps], dtype=np.int64))

    @property
    def deleted_partitions(self) -> Samples:
        return Samples(Labels((), [()]), np.array([self.deleted_hours], dtype=np.int64))


@dataclass(frozen=True)
class StoreSnapshot:
    series: StoreSeries

    def sections(self) -> dict[str, StoreSeries]:
        return {"store": self.series}


@dataclass
class ProductionStore:
    """The pipeline's writer for a production store (the `RunWriter` methods it calls)."""

    root: Path
    manifest: Mapping[str, Any]
    node: str = field(default_factory=lambda: os.uname().nodename)
    retention: Retention = field(default_factory=Retention)
    sample_requests: float = 1.0
    flush_steps: int = STORE_FLUSH_STEPS
    flush_seconds: float = STORE_FLUSH_SECONDS
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not 0.0 < self.sample_requests <= 1.0:
            raise ValueError(f"--sample-requests must be in (0, 1], not {self.sample_requests}")
        self.root = Path(self.root)
        _open_root(self.root)
        self._node = self.root / node_dir(self.node)
        self._writers: dict[int, tuple[int, RunWriter]] = {}  # rank -> (hour, writer)
        self._segments: dict[tuple[int, int], int] = {}  # (rank, hour) -> last segment made
        self._modes: dict[int, str] = {}  # rank -> its steps' verify mode
        self._closed_parts: dict[Path, _Partition] = {}
        self._deleted_steps = 0
        self._deleted_hours = 0
        self._next_retention = -math.inf
        self._bytes_closed = 0
        self._now = self.clock()  # the last step's time
        self._lock = threading.Lock()  # the exporter's scrapes read what the writer changes
        self._scan_existing()

    # -- writing ---------------------------------------------------------------------

    def append(self, batch: StepBatch, at: float | None = None) -> None:
        at = self.clock() if at is None else at
        self._now = at
        self._modes.setdefault(int(batch.rank), batch.mode)
        writer = self._writer(int(batch.rank), int(at // PARTITION_SECONDS))
        if self.sample_requests < 1.0 and batch.num_reqs:
            batch = self._sampled(batch)
        writer.append(batch, at=at)
        if at >= self._next_retention:  # by age: at least a minute apart
            self._next_retention = at + RETENTION_EVERY
            self.apply_retention(now=at)

    def write_rows(self, table: str, df) -> None:
        """Rows of an extra table (the estimator's `ceilings`), to their rank's open hour."""
        if df.height == 0:
            return
        now = self._now = self.clock()
        for (rank,), part in df.partition_by("rank", as_dict=True).items():
            if self.sample_requests < 1.0 and "rid" in part.columns:
                keep = _kept(part["rid"].to_numpy(), self.sample_requests)
                part = part.filter(keep)
            if part.height:
                self._writer(int(rank), int(now // PARTITION_SECONDS)).write_rows(table, part)

    def flush(self) -> None:
        for _, writer in self._writers.values():
            writer.flush()

    def close(self, extra_manifest: Mapping[str, Any] | None = None) -> None:
        with self._lock:
            for rank in list(self._writers):
                self._close(rank, extra_manifest)

    def _writer(self, rank: int, hour: int) -> RunWriter:
        open_ = self._writers.get(rank)
        if open_ is not None and open_[0] == hour and open_[1].bytes_written < self._roll:
            return open_[1]
        with self._lock:
            return self._open(rank, hour, open_ is not None)

    @property
    def _roll(self) -> float:
        bound = self.retention.max_bytes
        return math.inf if bound is None else bound / SEGMENTS_PER_BOUND

    def _open(self, rank: int, hour: int, rolling: bool) -> RunWriter:
        if rolling:
            self._close(rank)
        rank_dir = self._node / f"rank={rank}"
        segment = self._segments.get((rank, hour))
        if segment is None:  # the first this service makes: after any an earlier one made
            made = [k[1] for p in _subdirs(rank_dir, "hour=")
                    if (k := segment_of(p.name)) is not None and k[0] == hour]  # fmt: skip
            segment = max(made) + 1 if made else 0
        else:
            segment += 1
        self._segments[(rank, hour)] = segment
        path = rank_dir / hour_name(hour, segment)
        manifest = {**self.manifest, "rank": rank, "hour": hour_name(hour).split("=")[1],
                    "node": self.node}  # fmt: skip
        if rank in self._modes:
            manifest.setdefault("mode", self._modes[rank])
        writer = RunWriter(path, manifest, flush_steps=self.flush_steps,
                           flush_seconds=self.flush_seconds)  # fmt: skip
        self._closed_parts.pop(path, None)
        self._writers[rank] = (hour, writer)
        return writer

    def _close(self, rank: int, extra: Mapping[str, Any] | None = None) -> None:
        hour, writer = self._writers.pop(rank)
        writer.close(extra)
        part = _Partition(writer.path, hour, writer.counts["steps"], _disk_bytes(writer.path))
        self._closed_parts[writer.path] = part
        self._bytes_closed += part.bytes
        self._retain(self._now)  # what can go has grown by one partition

    def _sampled(self, batch: StepBatch) -> StepBatch:
        keep = _kept(batch.rid, self.sample_requests)
        return batch if keep.all() else batch.take_rows(np.flatnonzero(keep))

    # -- retention -------------------------------------------------------------------

    @property
    def bytes_on_disk(self) -> int:
        return self._bytes_closed + sum(w.bytes_written for _, w in self._writers.values())

    def apply_retention(self, now: float | None = None) -> None:
        """Delete the closed hours past the age bound, then the oldest closed hours while
        the store is over its size bound; each deletion counted."""
        now = self.clock() if now is None else now
        with self._lock:
            self._retain(now)

    def _retain(self, now: float) -> None:
        r = self.retention
        oldest_first = sorted(
            self._closed_parts.values(), key=lambda p: (p.hour, segment_of(p.path.name) or ())
        )
        for part in oldest_first:
            too_old = (
                r.max_age_hours is not None
                and (part.hour + 1) * PARTITION_SECONDS < now - r.max_age_hours * 3600
            )
            too_big = r.max_bytes is not None and self.bytes_on_disk > r.max_bytes
            if not (too_old or too_big):
                continue
            shutil.rmtree(part.path, ignore_errors=True)
            del self._closed_parts[part.path]
            self._bytes_closed -= part.bytes
            self._deleted_steps += part.steps
            self._deleted_hours += 1
            log.info("store: retention deleted %s (%d steps)", part.path, part.steps)

    def _scan_existing(self) -> None:
        """What an earlier service left here: its closed hours count towards the bounds."""
        for node in _subdirs(self.root, "node="):
            for rank in _subdirs(node, "rank="):
                for hour_dir in _subdirs(rank, "hour="):
                    hour = hour_of(hour_dir.name)
                    if hour is None or not (hour_dir / MANIFEST).exists():
                        continue
                    try:
                        steps = int(read_manifest(hour_dir / MANIFEST).get("steps") or 0)
                    except RunStoreError:
                        steps = 0
                    part = _Partition(hour_dir, hour, steps, _disk_bytes(hour_dir))
                    self._closed_parts[hour_dir] = part
                    self._bytes_closed += part.bytes

    def snapshot(self) -> StoreSnapshot:
        with self._lock:
            series = StoreSeries(self.bytes_on_disk, self._deleted_steps, self._deleted_hours)
        return StoreSnapshot(series)


def _kept(rids: np.ndarray, share: float) -> np.ndarray:
    """Which requests a sample of `share` keeps: by a hash of the id alone, so every step of
    a request is kept or none."""
    limit = int(share * 2**32)
    return np.array([zlib.crc32(str(r).encode()) < limit for r in rids], dtype=bool)


def check_store_dir(root: Path) -> bool:
    """Whether `root` is a store already (False: it can be made one, being new or empty); a
    RunStoreError where it is something else, since retention deletes directories in it."""
    root = Path(root)
    marker = root / STORE_MARKER
    if marker.is_file():
        try:
            fmt = json.loads(marker.read_text()).get("format")
        except (OSError, ValueError, AttributeError) as exc:
            raise RunStoreError(f"{marker}: not a dspark-obs store marker ({exc})") from None
        if fmt != STORE_FORMAT:
            raise RunStoreError(f"{marker}: not a dspark-obs store marker")
        return True
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise RunStoreError(
            f"{root}: exists and is not a dspark-obs store (retention deletes directories "
            "in a store, so it is made only in a new or empty directory)"
        )
    return False


def _open_root(root: Path) -> None:
    """Make `root` a store, or check that it is one."""
    if check_store_dir(root):
        return
    root.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": STORE_FORMAT, "version": 1, "partition": "hour"}) + "\n"
    (root / STORE_MARKER).write_text(text)


def _subdirs(path: Path, prefix: str) -> list[Path]:
    try:
        return sorted(
            p for p in path.iterdir()
            if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()
        )  # fmt: skip
    except OSError:
        return []


def _disk_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total

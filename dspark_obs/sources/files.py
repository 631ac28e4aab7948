"""Reading SGLang's DSpark output from files: `/server_info` dumps and growing JSONL.

SGLang never clears its step records by itself, so every `/server_info`
snapshot repeats what the previous one held, and the 200,000-record cap drops
the oldest ones silently. Whoever reads snapshots (a `curl` loop's file, a
poller) must therefore de-duplicate by `(rank, forward_ct)` and count the
holes; `ServerInfoReader` does both, incrementally, so the file ingester and a
live poller share one implementation.

`JsonlFollower` exists because the files we read are written while we read
them: the recorder flushes mid-line, and operators rotate logs. It hands out
complete lines only and follows the path (not the descriptor) across
replacement or truncation.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..telemetry import StepBatch
from ..telemetry.batch import MODES
from ..telemetry.sglang import (
    DecodeStepRecord,
    SGLangFormatError,
    WorkloadOf,
    record_to_batch,
    server_info_ranks,
)

__all__ = [
    "BLOCK_ACCEPT",
    "SERVER_INFO",
    "JsonlFollower",
    "RecordDedup",
    "ServerInfoReader",
    "detect_kind",
    "read_json_objects",
]

SERVER_INFO = "server_info"
BLOCK_ACCEPT = "block_accept"
_BLOCK_KEYS = ("fct", "w", "cl")


def detect_kind(obj: Any) -> str | None:
    """Which SGLang output a decoded JSON value belongs to, judged by its keys only.

    By content, not by file name, because operators name these files freely.
    """
    if not isinstance(obj, dict):
        return None
    if "internal_states" in obj:
        return SERVER_INFO
    if "eos_end" in obj or all(k in obj for k in _BLOCK_KEYS):
        return BLOCK_ACCEPT
    return None


def read_json_objects(path: Path) -> tuple[list[Any], int]:
    """A file as a list of JSON values: one whole document, or one per line.

    A `curl` loop's output may be a single pretty-printed document or JSONL;
    trying the whole file first handles both. Returns (values, undecodable
    lines); a line that does not decode (a poller killed mid-write) is only
    counted, since the rest of the file is still good.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OSError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return [msgspec.json.decode(data)], 0
    except msgspec.DecodeError:
        pass
    values: list[Any] = []
    bad = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            values.append(msgspec.json.decode(line))
        except msgspec.DecodeError:
            bad += 1
    return values, bad


class RecordDedup:
    """Which `(rank, forward_ct)` were seen, and how many are missing in between.

    A set, not a high-water mark, so files may be given in any order (an older
    dump after a newer one still fills holes instead of being dropped).
    """

    def __init__(self) -> None:
        self.seen: dict[int, set[int]] = {}
        self.duplicates = 0

    def offer(self, rank: int, forward_ct: int) -> bool:
        """True the first time a step is offered; later offers count as duplicates."""
        seen = self.seen.setdefault(rank, set())
        if forward_ct in seen:
            self.duplicates += 1
            return False
        seen.add(forward_ct)
        return True

    def dropped(self) -> dict[int, int]:
        """Per rank: forward_ct values missing between the lowest and highest seen."""
        return {rank: (max(s) - min(s) + 1 - len(s)) if s else 0 for rank, s in self.seen.items()}

    def ranges(self) -> dict[int, tuple[int, int]]:
        return {rank: (min(s), max(s)) for rank, s in self.seen.items() if s}


class ServerInfoReader:
    """Turns `/server_info` snapshots into new, ordered StepBatches, skipping bad records.

    Records are decoded one by one (not the rank's envelope as a whole) so one
    corrupted record costs that record only; each skip is counted in `bad` by
    reason. Batches come out of `take_batches` ordered by forward_ct (ranks
    interleaved), which is the order the estimator needs per rank.
    """

    def __init__(self, workload_of: WorkloadOf) -> None:
        self.workload_of = workload_of
        self.dedup = RecordDedup()
        self.bad: Counter[str] = Counter()
        self.snapshots = 0
        self.ranks_with_records: set[int] = set()
        self.gamma: int | None = None
        self.mode: str | None = None
        self.components: set[str] = set()
        self._pending: list[tuple[int, int, DecodeStepRecord, int, str]] = []

    def add_snapshot(self, payload: Any) -> int:
        """Fold in one decoded `/server_info` answer; returns how many steps were new.

        Raises `SGLangFormatError` when the payload is not a server_info at all,
        so a caller can refuse a wrong file before writing anything.
        """
        ranks = server_info_ranks(payload)
        self.snapshots += 1
        new = 0
        for rank, env in enumerate(ranks):
            if env is None:
                continue
            new += self._add_rank(rank, env)
        return new

    def _add_rank(self, rank: int, env: Any) -> int:
        records = env.get("records") if isinstance(env, dict) else None
        gamma, mode = (env.get("gamma"), env.get("mode")) if isinstance(env, dict) else (None, None)
        if not isinstance(records, list) or not isinstance(gamma, int) or gamma < 1:
            self.bad["bad_envelope"] += 1
            return 0
        if mode not in MODES:
            self.bad["bad_envelope"] += 1
            return 0
        self.ranks_with_records.add(rank)
        if self.gamma is None:
            self.gamma, self.mode = gamma, mode
        comps = env.get("components")
        if isinstance(comps, list):
            self.components.update(str(c) for c in comps)
        new = 0
        for raw in records:
            try:
                rec = msgspec.convert(raw, DecodeStepRecord)
            except msgspec.ValidationError:
                self.bad["bad_record"] += 1
                continue
            if not self.dedup.offer(rank, rec.forward_ct):
                continue
            self._pending.append((rec.forward_ct, rank, rec, gamma, mode))
            new += 1
        return new

    def take_batches(self) -> Iterator[StepBatch]:
        """The new steps since the last call, converted; records that fail are counted."""
        pending, self._pending = self._pending, []
        pending.sort(key=lambda p: (p[0], p[1]))
        for _, rank, rec, gamma, mode in pending:
            try:
                yield record_to_batch(
                    rec, gamma=gamma, mode=mode, rank=rank, workload_of=self.workload_of
                )
            except SGLangFormatError:
                self.bad["bad_record"] += 1

    @property
    def dropped(self) -> dict[int, int]:
        return self.dedup.dropped()


class JsonlFollower:
    """`tail -F` for a JSONL file: complete lines only, across rotation and truncation.

    A rotation (the path now names another inode) is handled by draining the
    old descriptor first, so nothing written before the rename is lost, then
    reading the new file from its start. A partial line left at the end of a
    rotated-away file can never be completed and is counted in
    `lost_partial_lines`. A file truncated in place (size below our offset)
    is re-read from the start.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.rotations = 0
        self.lost_partial_lines = 0
        self._fh = None
        self._ino: int | None = None
        self._buf = b""
        self._open()

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return False
        self._fh = fh
        self._ino = os.fstat(fh.fileno()).st_ino
        self._buf = b""
        return True

    def _drain(self) -> list[bytes]:
        if self._fh is None:
            return []
        chunk = self._fh.read()
        if not chunk:
            return []
        data = self._buf + chunk
        *lines, self._buf = data.split(b"\n")
        return [line for line in lines if line.strip()]

    def read_lines(self) -> list[bytes]:
        """Every complete line written since the last call (possibly none)."""
        if self._fh is None:
            self._open()
            return self._drain()
        lines = self._drain()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return lines  # mid-rotation: the new file is not there yet
        if st.st_ino != self._ino:
            lines += self._drain()
            if self._buf:
                self.lost_partial_lines += 1
            self._fh.close()
            self._fh = None
            self.rotations += 1
            if self._open():
                lines += self._drain()
        elif st.st_size < self._fh.tell():
            self._fh.seek(0)
            self._buf = b""
            self.rotations += 1
            lines += self._drain()
        return lines

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def has_timing(batch: StepBatch) -> bool:
    """Whether a step carries a measured time (SGLang's timing components)."""
    return any(
        getattr(batch, name, None) is not None and not np.isnan(getattr(batch, name))
        for name in ("step_cpu_ms", "step_gpu_ms")
    )

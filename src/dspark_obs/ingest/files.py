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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from ..telemetry import StepBatch
from ..telemetry.batch import MAX_GAMMA, MODES
from ..telemetry.server_info import (
    DecodeStepRecord,
    SGLangFormatError,
    WorkloadOf,
    decode_step_record,
    record_to_batch,
    server_info_ranks,
)

__all__ = [
    "BLOCK_ACCEPT",
    "DEFAULT_MAX_RECORD_BYTES",
    "SERVER_INFO",
    "JsonlFollower",
    "RecordDedup",
    "ServerInfoReader",
    "detect_kind",
    "iter_lines",
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


#: Default cap on one record (a line, or a whole single-document file): far above a drained
#: `/server_info` answer, far below what would exhaust the memory of the machine reading it.
DEFAULT_MAX_RECORD_BYTES = 256 << 20
_CHUNK = 1 << 20


def iter_lines(fh: BinaryIO, max_bytes: int) -> Iterator[bytes | None]:
    """The lines of a binary file without their newlines; None for each line over `max_bytes`.

    Read in chunks, and a line past the limit is dropped as it is read, so a
    file holding one enormous line (a dump that lost its newlines, a binary
    file given by mistake) costs at most `max_bytes` of memory, not its size.
    """
    pending = bytearray()
    oversized = False
    while chunk := fh.read(_CHUNK):
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not oversized:
                if len(pending) + len(piece) > max_bytes:
                    oversized = True
                    pending.clear()
                else:
                    pending += piece
            if nl < 0:
                break
            yield None if oversized else bytes(pending)
            pending.clear()
            oversized = False
            start = nl + 1
    if oversized:
        yield None
    elif pending:
        yield bytes(pending)


def read_json_objects(
    path: Path, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> tuple[list[Any], int, int]:
    """A file as a list of JSON values: one whole document, or one per line.

    A `curl` loop's output may be a single pretty-printed document or JSONL;
    trying the whole file first handles both (when the file is within
    `max_record_bytes`). Returns (values, undecodable lines, lines over the
    limit); a line that does not decode (a poller killed mid-write) or is too
    large is only counted, since the rest of the file is still good.
    """
    values: list[Any] = []
    bad = oversized = 0
    try:
        if path.stat().st_size <= max_record_bytes:
            data = path.read_bytes()
            try:
                return [msgspec.json.decode(data)], 0, 0
            except msgspec.DecodeError:
                pass
            lines: Iterable[bytes | None] = data.splitlines()
            for line in lines:
                bad += _decode_into(values, line)
            return values, bad, 0
        with path.open("rb") as fh:
            for line in iter_lines(fh, max_record_bytes):
                if line is None:
                    oversized += 1
                else:
                    bad += _decode_into(values, line)
    except OSError as exc:
        raise OSError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return values, bad, oversized


def _decode_into(values: list[Any], line: bytes) -> int:
    """Append the line's JSON value; 1 if it does not decode, else 0 (blank lines: 0)."""
    if not line.strip():
        return 0
    try:
        values.append(msgspec.json.decode(line))
    except msgspec.DecodeError:
        return 1
    return 0


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
        if not isinstance(records, list) or not isinstance(gamma, int) or isinstance(gamma, bool):
            self.bad["bad_envelope"] += 1
            return 0
        if not 1 <= gamma <= MAX_GAMMA:  # the run's aggregates are sized by it
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
                rec = decode_step_record(raw)
            except SGLangFormatError as exc:
                self.bad[exc.reason] += 1
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
            except SGLangFormatError as exc:
                self.bad[exc.reason] += 1

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

    def __init__(
        self, path: str | os.PathLike, max_line_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> None:
        self.path = Path(path)
        self.max_line_bytes = max_line_bytes
        self.rotations = 0
        self.lost_partial_lines = 0
        self.oversized_lines = 0
        self._fh = None
        self._ino: int | None = None
        self._buf = b""
        self._skipping = False  # inside a line already counted as oversized
        self._open()

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return False
        self._fh = fh
        self._ino = os.fstat(fh.fileno()).st_ino
        self._buf = b""
        self._skipping = False
        return True

    def _drain(self) -> list[bytes]:
        """Complete lines appended since the last read, in bounded chunks.

        A line longer than `max_line_bytes` is counted in `oversized_lines` and
        dropped as it arrives (its head is discarded, then everything up to its
        newline), so one runaway line never has to fit in memory.
        """
        if self._fh is None:
            return []
        out: list[bytes] = []
        while chunk := self._fh.read(_CHUNK):
            *lines, tail = (self._buf + chunk).split(b"\n")
            for line in lines:
                if self._skipping:
                    self._skipping = False  # the rest of a line already counted
                elif len(line) > self.max_line_bytes:
                    self.oversized_lines += 1
                elif line.strip():
                    out.append(line)
            self._buf = tail
            if len(self._buf) > self.max_line_bytes:
                if not self._skipping:
                    self.oversized_lines += 1
                self._skipping = True
                self._buf = b""
        return out

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
            self._skipping = False
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

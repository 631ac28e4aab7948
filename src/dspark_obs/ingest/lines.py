"""Reading SGLang's output files line by line, bounded, and following them as they grow.

The files we read are written while we read them: the recorder flushes mid-line,
pollers die mid-write, and operators rotate logs. Everything here hands out complete
lines only, holds at most one line's limit in memory whatever the file holds, and
`JsonlFollower` follows the path (not the descriptor) across replacement or truncation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

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


def read_json_documents(
    path: Path, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> tuple[list[bytes], int]:
    """A file's JSON documents as text: the whole file where it is one document, else one
    per non-blank line. Returns (documents, lines over the limit).

    A `curl` loop's output may be a single pretty-printed document or JSONL. Nothing
    is decoded here beyond telling the two apart, and a line over `max_record_bytes` is
    only counted (the rest of the file is still good), never held.
    """
    documents: list[bytes] = []
    oversized = 0
    try:
        if path.stat().st_size <= max_record_bytes:
            data = path.read_bytes()
            if _one_document(data):
                return [data], 0
            return [line for line in data.splitlines() if line.strip()], 0
        with path.open("rb") as fh:
            for line in iter_lines(fh, max_record_bytes):
                if line is None:
                    oversized += 1
                elif line.strip():
                    documents.append(line)
    except OSError as exc:
        raise OSError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return documents, oversized


def _one_document(data: bytes) -> bool:
    """Whether a file is one JSON document rather than JSONL: valid JSON as a whole, one
    line, or a first line that is no JSON value by itself (a pretty-printed `{`)."""
    try:
        msgspec.json.decode(data, type=msgspec.Raw)
        return True
    except (msgspec.DecodeError, RecursionError):
        pass
    first, _, rest = data.strip().partition(b"\n")
    if not rest.strip():
        return True
    try:
        msgspec.json.decode(first, type=msgspec.Raw)
        return False
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        json.loads(first.decode("utf-8", "surrogateescape"), parse_constant=str)
        return False
    except (ValueError, RecursionError):
        return True


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

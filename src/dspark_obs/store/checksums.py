"""Part checksums: damage is caught before polars decodes a part, not by polars.

polars trusts a Parquet file's page headers: one flipped bit can turn a page
size into exabytes, and the allocation that follows aborts the process, which
no `except` catches. So every part is published with its size and CRC-32 (as
`zlib.crc32` computes it) in a small JSON record, and readers compare the file
against it before handing the file to polars.

The records live outside the table directories, in
`RUN_DIR/_checksums/<table>/part-NNNNNN.parquet.json`, because polars refuses
to scan a directory holding anything but Parquet files, and a table directory
stays readable by any tool as a plain Parquet dataset. The writer publishes a
record before the part it describes, so a published part always has its
record; a record without its part is debris of an interrupted flush and is
ignored. A part without a record is refused in a run whose manifest says every
part has one (`store_version` 2 and later, `inventory.py`); only runs written
before parts had checksums are read unverified.

CRC-32 runs at about 4 GB/s in `zlib` and releases the GIL on large buffers,
so a run's parts are verified on a thread pool, each once a process until the file changes (see
`Run.check_parts`). Where the optional `isal` package is installed (the `fast`
extra), its CRC-32 is used instead: the same polynomial and the same values as
`zlib.crc32`, about four times faster, which matters when a report verifies a
run of several gigabytes before reading it.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..json_files import decode_json
from .errors import RunStoreError, unreadable
from .files import check_regular, open_regular, read_regular

try:  # ISA-L's CRC-32 equals zlib's (tests/test_store.py checks it), only faster
    from isal.isal_zlib import crc32
except ImportError:  # optional: zlib is always there
    crc32 = zlib.crc32

#: Directory of the checksum records, beside the tables; never a table name.
CHECKSUMS = "_checksums"
#: A record is a few dozen bytes; anything much larger is not one, so it is not read whole.
_MAX_RECORD_BYTES = 4096
#: Read size: large enough that `zlib.crc32` releases the GIL, small enough to stay in cache.
_CHUNK = 1 << 20
#: Parts verified at once: CRC-32 is CPU-bound, so more threads than cores only add overhead.
_MAX_THREADS = 8

_buffers = threading.local()


def checksum_path(part: Path) -> Path:
    """Where the record of `part` (`RUN_DIR/<table>/<name>`) lives."""
    table_dir = part.parent
    return table_dir.parent / CHECKSUMS / table_dir.name / f"{part.name}.json"


def _record(size: int, crc: int) -> bytes:
    return json.dumps({"size": size, "crc32": crc}).encode("ascii") + b"\n"


def checksum_record(data: bytes | memoryview) -> bytes:
    """The record published with a part whose bytes are `data`."""
    return _record(len(data), crc32(data))


def file_record(part: Path) -> bytes:
    """The record of the part file `part` as it is now (a resumed older run's parts)."""
    return _record(check_regular(part).st_size, _crc32_file(part))


def _read_record(path: Path) -> tuple[int, int] | None:
    """(size, crc32) recorded for a part, or None when the part has no record."""
    try:
        raw = read_regular(path, _MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unreadable(path, exc) from exc
    try:
        record = decode_json(raw) if len(raw) <= _MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    size = record.get("size") if isinstance(record, dict) else None
    crc = record.get("crc32") if isinstance(record, dict) else None
    valid = all(type(v) is int for v in (size, crc)) and size >= 0 and 0 <= crc < 2**32
    if not valid:
        raise RunStoreError(f"{path}: damaged checksum record (expected size and crc32)")
    return size, crc


def _crc32_file(path: Path) -> int:
    """CRC-32 of a regular file, read through one buffer per thread rather than whole."""
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = memoryview(bytearray(_CHUNK))
    crc = 0
    with open(open_regular(path), "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = crc32(buf[:n], crc)
    return crc


def verify_part(part: Path) -> None:
    """RunStoreError, naming the part, unless it matches its record (or has none)."""
    record = _read_record(checksum_path(part))
    if record is None:
        return
    size, crc = record
    try:
        actual_size = check_regular(part).st_size
        actual_crc = _crc32_file(part) if actual_size == size else None
    except OSError as exc:
        raise unreadable(part, exc) from exc
    if actual_size != size:
        raise RunStoreError(
            f"{part}: damaged: {actual_size} bytes, its checksum record says {size} "
            "(truncated or replaced)"
        )
    if actual_crc != crc:
        raise RunStoreError(
            f"{part}: damaged: CRC-32 {actual_crc:08x}, its checksum record says {crc:08x} "
            "(changed since it was written)"
        )


def verify_parts(parts: Sequence[Path]) -> None:
    """`verify_part` for each part, in parallel; the error reported is the first part's in order."""
    workers = min(len(parts), os.cpu_count() or 1, _MAX_THREADS)
    if workers <= 1:
        for part in parts:
            verify_part(part)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="verify-part") as pool:
        try:
            for _ in pool.map(verify_part, parts):
                pass
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the run is unusable: skip the parts left
            raise

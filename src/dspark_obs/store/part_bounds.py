"""What a Parquet part would cost to decode, read from its own metadata before polars decodes it.

A part whose checksum is valid can still be hostile: a footer that declares billions of
rows (polars allocates for them before a value is read), or a page of a few kilobytes that
inflates to gigabytes (a dictionary of one ten-megabyte string referenced by every row).
The checksum proves only that the file is the one its record describes. So, before a part
is decoded, its footer and every page header are read here (Parquet's Thrift compact
encoding, a few hundred bytes a column) and the part is refused, by name, unless

- it declares at most `MAX_PART_ROWS` rows, and its row groups add up to them;
- no page inflates past `MAX_PAGE_BYTES`, and a dictionary page holds no more bytes than
  its entries at `MAX_STRING_BYTES` each;
- what decoding it takes (each column's values at their width in memory, and the pages'
  inflated bytes) stays within `max(MIN_DECODED_BYTES, MAX_INFLATION * its size)`.

The writer's parts stay far inside every bound (a part is one flush, a few thousand steps;
LZ4 and zstd inflate our columns a few times, not a hundred), so no honest run meets them.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from .. import extensions
from .errors import RunStoreError
from .files import open_regular

#: The compiled twin of `_Thrift.struct` (same dicts, same errors), or None.
_compiled = extensions.load("dspark_obs.store._thrift_compact")

#: Rows a part may declare: a flush holds a few thousand steps of at most a few thousand
#: requests each; this is a thousand times that.
MAX_PART_ROWS = 1 << 26
#: Longest string value (a rid, a workload): the gate bounds names from clients far below it.
MAX_STRING_BYTES = 4096
#: Largest page once inflated (polars writes pages of about a megabyte).
MAX_PAGE_BYTES = 256 << 20
#: What decoding a part may take in memory, at least and per byte of the part: LZ4 (zstd in
#: runs before `store_version` 3) makes our columns a few times smaller; constant columns
#: (rank, mode, gamma) much more, which the floor covers for small parts.
MIN_DECODED_BYTES = 256 << 20
MAX_INFLATION = 64
#: The footer of a part of a few thousand steps is a few tens of kilobytes.
MAX_FOOTER_BYTES = 16 << 20
_MAX_NESTING = 16
#: A page header is tens of bytes; with statistics of strings at `MAX_STRING_BYTES`, a few KiB.
_MAX_PAGE_HEADER = 64 << 10
_FIRST_READ = 512
#: Bytes a value takes once decoded, by Parquet physical type (BYTE_ARRAY: a view).
_WIDTH = {0: 1, 1: 4, 2: 8, 3: 12, 4: 4, 5: 8, 6: 16}
_BYTE_ARRAY, _FIXED_LEN = 6, 7
_DICTIONARY_PAGE = 2


class _Malformed(ValueError):
    pass


class _Thrift:
    """Thrift's compact protocol, read into `{field id: value}` dicts, bounded by its bytes:
    a varint of at most 64 bits, field ids in i16, strings, lists and maps no longer than
    the bytes left, containers nested at most `_MAX_NESTING` deep."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def _byte(self) -> int:
        pos = self.pos
        if pos >= len(self.data):
            raise _Malformed("metadata ends early")
        self.pos = pos + 1
        return self.data[pos]

    def _varint(self) -> int:
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80:  # most are one byte
            self.pos = pos + 1
            return data[pos]
        value = shift = 0
        while True:
            b = self._byte()
            bits = b & 0x7F
            if shift == 63 and bits > 1:
                raise _Malformed("varint too long")
            value |= bits << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise _Malformed("varint too long")

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _value(self, kind: int, depth: int):
        if 4 <= kind <= 6:  # integers, most of what metadata holds
            return self._zigzag()
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            return self._byte()
        if kind == 7:
            self.pos += 8
            return None
        if kind == 8:
            n = self._varint()
            if n > len(self.data) - self.pos:
                raise _Malformed("string longer than the metadata")
            self.pos += n
            return self.data[self.pos - n : self.pos]
        if kind in (9, 10, 11) and depth > _MAX_NESTING:  # a list of lists never meets a struct
            raise _Malformed("metadata nested too deeply")
        if kind in (9, 10):
            head = self._byte()
            n, inner = head >> 4, head & 0x0F
            if n == 15:
                n = self._varint()
            if n > len(self.data) - self.pos:  # every element takes a byte at least
                raise _Malformed("list longer than the metadata")
            return [self._value(inner, depth + 1) for _ in range(n)]
        if kind == 11:
            n = self._varint()
            if n > len(self.data) - self.pos:
                raise _Malformed("map longer than the metadata")
            types = self._byte() if n else 0
            return [
                (self._value(types >> 4, depth + 1), self._value(types & 15, depth + 1))
                for _ in range(n)
            ]
        if kind == 12:
            return self.read_struct(depth + 1)
        raise _Malformed(f"unknown field type {kind}")

    def struct(self, depth: int = 0) -> dict:
        if depth == 0 and _compiled is not None:
            try:
                out, self.pos = _compiled.read_struct(self.data, self.pos)
            except ValueError as exc:
                raise _Malformed(str(exc)) from None
            return out
        return self.read_struct(depth)

    def read_struct(self, depth: int = 0) -> dict:
        """`struct` in Python (where the compiled form is not built, and to test it)."""
        if depth > _MAX_NESTING:
            raise _Malformed("metadata nested too deeply")
        out: dict = {}
        last = 0
        data = self.data
        while True:
            pos = self.pos
            if pos >= len(data):
                raise _Malformed("metadata ends early")
            head = data[pos]
            self.pos = pos + 1
            kind = head & 0x0F
            if kind == 0:
                return out
            delta = head >> 4
            last = last + delta if delta else self._zigzag()
            if not -(1 << 15) <= last < 1 << 15:
                raise _Malformed("field id out of range")
            out[last] = self._value(kind, depth)


def _int(d: dict, key: int, what: str) -> int:
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Malformed(f"{what} is {value!r}")
    return value


def _read_at(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise _Malformed("file shorter than its metadata says")
    return data


def _footer(fd: int, size: int) -> tuple[dict, int]:
    """The file's metadata and where it starts."""
    if size < 12 or _read_at(fd, 0, 4) != b"PAR1":
        raise _Malformed("not a Parquet file")
    tail = _read_at(fd, size - 8, 8)
    if tail[4:] != b"PAR1":
        raise _Malformed("not a Parquet file")
    length = struct.unpack("<I", tail[:4])[0]
    if length > min(size - 12, MAX_FOOTER_BYTES):
        raise _Malformed(f"footer of {length} bytes")
    start = size - 8 - length
    return _Thrift(_read_at(fd, start, length)).struct(), start


def _pages(fd: int, start: int, end: int) -> list[dict]:
    """The page headers of the column chunk in bytes `start..end`."""
    pages = []
    pos = start
    while pos < end:
        window = os.pread(fd, min(end - pos, _FIRST_READ), pos)
        if len(window) == _FIRST_READ:  # a header with statistics may be longer
            try:
                head = _Thrift(window)
                header = head.struct()
            except _Malformed:
                window = os.pread(fd, min(end - pos, _MAX_PAGE_HEADER), pos)
            else:
                pos += head.pos + _int(header, 3, "a page's compressed size")
                pages.append(header)
                continue
        head = _Thrift(window)
        try:
            header = head.struct()
        except _Malformed:
            if len(window) == _MAX_PAGE_HEADER:
                raise _Malformed(f"a page header longer than {_MAX_PAGE_HEADER} bytes") from None
            raise
        compressed = _int(header, 3, "a page's compressed size")
        pos += head.pos + compressed
        pages.append(header)
    if pos != end:
        raise _Malformed("pages overrun their column chunk")
    return pages


def _column_cost(fd: int, chunk: dict, rows: int, data_end: int, type_lengths: dict) -> int:
    """Bytes decoding one column chunk takes: its values at their width, its inflated pages."""
    meta = chunk.get(3)
    if not isinstance(meta, dict):
        raise _Malformed("a column chunk without its metadata")
    kind = _int(meta, 1, "a column's type")
    values = _int(meta, 5, "a column's value count")
    first = min(_int(meta, k, "a page offset") for k in (9, 11) if k in meta)
    end = first + _int(meta, 7, "a column's compressed size")
    if not 4 <= first <= end <= data_end:
        raise _Malformed("a column chunk outside the file's data")
    inflated = page_values = 0
    for page in _pages(fd, first, end):
        size = _int(page, 2, "a page's inflated size")
        if size > MAX_PAGE_BYTES:
            raise _Malformed(f"a page inflating to {size} bytes")
        inflated += size
        header = next((page[k] for k in (5, 7, 8) if isinstance(page.get(k), dict)), {})
        count = _int(header, 1, "a page's value count") if header else 0
        if page.get(1) == _DICTIONARY_PAGE:
            if kind == _BYTE_ARRAY and size > count * (4 + MAX_STRING_BYTES):
                raise _Malformed(
                    f"a dictionary of {count} strings inflating to {size} bytes, more than "
                    f"{MAX_STRING_BYTES} bytes a string"
                )
        else:
            page_values += count
    name = bytes((meta.get(3) or [b""])[-1])
    width = type_lengths.get(name, 0) if kind == _FIXED_LEN else _WIDTH.get(kind, 8)
    return max(values, page_values, rows) * width + inflated


def check_part_bounds(path: Path) -> None:
    """RunStoreError, naming the part, unless decoding it stays within the bounds above."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise RunStoreError(f"{path}: unreadable: {exc.strerror or exc}") from exc
    try:
        size = os.fstat(fd).st_size
        meta, data_end = _footer(fd, size)
        rows = _int(meta, 3, "the row count")
        if rows > MAX_PART_ROWS:
            raise RunStoreError(
                f"{path}: declares {rows} rows, more than the {MAX_PART_ROWS} a part may hold"
            )
        groups = meta.get(4) or []
        if sum(_int(g, 3, "a row group's row count") for g in groups) != rows:
            raise _Malformed("row groups do not add up to the row count")
        type_lengths = {
            bytes(e.get(4) or b""): e.get(2) or 0 for e in meta.get(2) or [] if e.get(1) == 7
        }
        cost = 0
        for group in groups:
            group_rows = _int(group, 3, "a row group's row count")
            for chunk in group.get(1) or []:
                cost += _column_cost(fd, chunk, group_rows, data_end, type_lengths)
        limit = max(MIN_DECODED_BYTES, MAX_INFLATION * size)
        if cost > limit:
            raise RunStoreError(
                f"{path}: would take {cost} bytes to decode from {size} bytes, more than the "
                f"{limit} a part may (at most {MAX_INFLATION} times its size)"
            )
    except (_Malformed, OSError, OverflowError) as exc:
        raise RunStoreError(f"{path}: malformed Parquet metadata: {exc}") from exc
    finally:
        os.close(fd)

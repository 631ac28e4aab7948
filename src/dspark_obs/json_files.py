"""Loading user-supplied JSON: every problem told in one line that names the file and what it is.

JSON decoders recurse once per nesting level, so a file of 100,000 `[` ends in a
RecursionError (a traceback) rather than a decode error. Files we read are a few
levels deep; `check_nesting` refuses anything deeper than `MAX_DEPTH` before a
decoder sees it, in one vectorised pass (strings blanked by a regular expression,
then the running count of brackets), so the limit costs a few bytes per input byte.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TypeVar

import msgspec
import numpy as np

T = TypeVar("T")

#: Deepest nesting accepted in a user-supplied JSON document; ours are under ten levels deep.
MAX_DEPTH = 64
#: A JSON string (escapes included), unrolled so that matching never backtracks.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", np.uint8)
_CLOSE = np.frombuffer(b"]}", np.uint8)


def nesting_depth(data: bytes) -> int:
    """The deepest bracket nesting of `data` read as JSON (0 for a scalar)."""
    if b"[" not in data and b"{" not in data:
        return 0
    raw = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
    step = np.isin(raw, _OPEN).astype(np.int32) - np.isin(raw, _CLOSE).astype(np.int32)
    return int(np.cumsum(step, dtype=np.int32).max(initial=0))


def check_nesting(data: bytes, limit: int = MAX_DEPTH) -> None:
    """ValueError unless `data` nests at most `limit` levels deep."""
    depth = nesting_depth(data)
    if depth > limit:
        raise ValueError(f"JSON nested {depth} levels deep, more than the {limit} allowed")


def decode_json(data: bytes, type_: type[T] = object, limit: int = MAX_DEPTH) -> T:  # type: ignore[assignment]
    """`type_` decoded from `data` (msgspec); ValueError, one line, for anything wrong."""
    check_nesting(data, limit)
    try:
        return msgspec.json.decode(data, type=type_)
    except RecursionError as exc:  # the stack was already deep when we were called
        raise ValueError("JSON nested too deeply to decode") from exc
    except (msgspec.DecodeError, ValueError) as exc:  # ValidationError is a DecodeError
        raise ValueError(str(exc)) from exc


#: Largest input file read whole (a workload table, a cost table, a config): megabytes at
#: most; `/dev/zero` or a runaway file must not be read to exhaustion.
MAX_INPUT_BYTES = 64 << 20


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {key!r} given twice in one object")
    return out


def check_duplicate_keys(data: bytes | str) -> None:
    """ValueError naming the first key an object of `data` (JSON) gives twice.

    JSON decoders keep the last value of a repeated key without a word, so a document may
    say one thing to us and another to any other reader of it; we refuse it instead. Call
    after `check_nesting` (Python's decoder recurses per level)."""
    try:
        json.loads(data, object_pairs_hook=_refuse_duplicates)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply to decode") from exc
    except json.JSONDecodeError:
        return  # not JSON: the decoder that follows says where


def decode_document(data: bytes, type_: type[T] = object) -> T:  # type: ignore[assignment]
    """`decode_json` for a document from a user or a client (a file, a request body):
    also refused when an object gives a key twice."""
    check_nesting(data)
    check_duplicate_keys(data)
    return decode_json(data, type_)


def read_input_file(path: str | Path, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `limit`; ValueError, naming `what` and
    the path, for anything else: a FIFO (which would block), a device (`/dev/zero` never
    ends), a directory, a file over the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ValueError(f"{what} {path}: no such file") from exc
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # before fdopen, which refuses a directory with a bare errno
        os.close(fd)
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
        raise ValueError(f"{what} {path}: is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise ValueError(f"{what} {path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise ValueError(f"{what} {path}: larger than {limit:,} bytes")
    return data


def load_json_file(path: str | Path, type_: type[T], what: str) -> T:
    """`type_` decoded from the JSON file at `path` (msgspec, so the struct's own checks run).

    Any problem is a ValueError reading `"{what} {path}: {reason}"`: a missing file, one
    that cannot be read (a directory, a FIFO, a device, no permission, over
    `MAX_INPUT_BYTES`), text that is not JSON, nesting deeper than `MAX_DEPTH`, a key given
    twice, or a value that is not a valid `type_` (a wrong type, or what its
    `__post_init__` refuses).
    """
    data = read_input_file(path, what)
    try:
        return decode_document(data, type_)
    except ValueError as exc:
        raise ValueError(f"{what} {path}: {exc}") from exc

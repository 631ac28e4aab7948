"""Loading user-supplied JSON: every problem told in one line that names the file and what it is.

JSON decoders recurse once per nesting level, so a file of 100,000 `[` ends in a
RecursionError (a traceback) rather than a decode error. Files we read are a few
levels deep; `check_nesting` refuses anything deeper than `MAX_DEPTH` before a
decoder sees it, in one vectorised pass (strings blanked by a regular expression,
then the running count of brackets), so the limit costs a few bytes per input byte.
"""

from __future__ import annotations

import re
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


def load_json_file(path: str | Path, type_: type[T], what: str) -> T:
    """`type_` decoded from the JSON file at `path` (msgspec, so the struct's own checks run).

    Any problem is a ValueError reading `"{what} {path}: {reason}"`: a missing file, one
    that cannot be read (a directory, no permission), text that is not JSON, nesting
    deeper than `MAX_DEPTH`, or a value that is not a valid `type_` (a wrong type, or what
    its `__post_init__` refuses).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise ValueError(f"{what} {path}: no such file") from exc
    except OSError as exc:  # a directory, no permission: still one clear line
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from exc
    try:
        return decode_json(data, type_)
    except ValueError as exc:
        raise ValueError(f"{what} {path}: {exc}") from exc

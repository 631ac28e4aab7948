"""A `/server_info` file that strict JSON refuses, read so that only its bad records are lost.

SGLang writes its answers with msgspec, which never writes NaN or Infinity and only
valid UTF-8; a file holding either was damaged or written by something else (a
Python `json.dumps` in a collection script, a bit flip). One such value makes the
whole document invalid JSON, and refusing the file for it would throw away every good
record beside it. Such a document is read as Python's `json` module reads it instead,
with the non-finite numbers marked and invalid bytes kept as lone surrogates, so that
the records holding them are refused one by one, by name (`flaw`), and the rest kept.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..telemetry.server_info import SGLangFormatError


class NonFinite(str):
    """NaN, Infinity or -Infinity where a number was: JSON has no such value."""


def decode_lenient(text: bytes | bytearray) -> Any:
    """The document as Python objects, NaN and invalid UTF-8 marked (see `flaw`).

    Raises SGLangFormatError: `bad_snapshot_line` when it is not JSON even so, `too_deep`
    when it nests deeper than Python's recursion limit.
    """
    try:
        return json.loads(bytes(text).decode("utf-8", "surrogateescape"), parse_constant=NonFinite)
    except RecursionError:
        raise SGLangFormatError(
            f"JSON nested deeper than {sys.getrecursionlimit():,} levels", "too_deep"
        ) from None
    except ValueError as exc:
        raise SGLangFormatError(f"not JSON ({exc})", "bad_snapshot_line") from None


def flaw(value: Any) -> tuple[str, str] | None:
    """(reason, what) for the first value in `value` strict JSON could not hold, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, NonFinite):
            return "non_finite_number", f"{item}, which JSON does not have"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "invalid_utf8", "a string that is not valid UTF-8"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None

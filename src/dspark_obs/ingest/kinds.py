"""Which SGLang output a file holds, told by content, and what every ingested run records.

Operators name these files freely, so the kind comes from the keys of the first JSON
value, never from the file name; everything that makes an input unusable is found
before a run directory is created, so a typo never leaves a half-made run behind.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw

from ..store.provenance import versions
from ..telemetry.server_info import SGLangFormatError, decode_json
from .lenient import decode_lenient
from .lines import iter_lines

SOURCE = "ingest"
SERVER_INFO = "server_info"
BLOCK_ACCEPT = "block_accept"
_BLOCK_KEYS = ("fct", "w", "cl")


class IngestError(ValueError):
    """An input that cannot be ingested at all; the message names the file and why."""


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


def kind_of(text: bytes) -> str | None:
    """The kind of one JSON document or line, from its top-level keys only: its values are
    not decoded, so a 100 MB answer costs no Python object per number here.

    A document strict JSON refuses (a NaN, invalid UTF-8) is read leniently, so that one
    bad value does not hide what the file is; SGLangFormatError (`too_deep`) for nesting
    beyond the decoders' limit.
    """
    try:
        return detect_kind(decode_json(text, dict[str, Raw]))
    except msgspec.ValidationError:  # JSON, but not an object
        return None
    except msgspec.DecodeError:
        pass
    try:
        return detect_kind(decode_lenient(text))
    except SGLangFormatError as exc:
        if exc.reason == "too_deep":
            raise
        return None


def sniff(path: Path, max_bytes: int) -> str | None:
    """The file's kind from its first line, or from the whole file if that is one document.

    Lines over `max_bytes` are skipped unread, and the whole file is only
    decoded when it fits the limit: sniffing never holds more than that.
    """
    first = b""
    oversized = False
    try:
        with path.open("rb") as fh:
            for line in iter_lines(fh, max_bytes):
                if line is None:
                    oversized = True
                elif line.strip():
                    first = line
                    break
        size = path.stat().st_size
    except OSError as exc:
        raise IngestError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not first:
        if oversized:
            raise IngestError(f"{path}: every line is over --max-record-bytes ({max_bytes:,})")
        raise IngestError(f"{path}: empty file")
    try:
        kind = kind_of(first)
        if kind is not None or size > max_bytes:
            return kind
        return kind_of(path.read_bytes())
    except SGLangFormatError as exc:
        raise IngestError(f"{path}: {exc}") from None
    except OSError:
        return None


def not_ours(path: Path) -> IngestError:
    return IngestError(
        f"{path}: neither a SGLang /server_info dump (a JSON object with 'internal_states', "
        "or JSONL of them) nor a block-accept JSONL (objects with fct/w/cl or eos_end)"
    )


def base_manifest(files: list[Path], kind: str, assume: str | None) -> dict:
    """The part of `run.json` every ingested run has, whatever its kind."""
    return {
        "format": 1,
        "source": SOURCE,
        "input_kind": kind,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "files": [str(f) for f in files],
        "assume": assume,
        "shadow": None,
    }

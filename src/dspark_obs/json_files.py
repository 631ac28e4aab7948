"""Loading a typed JSON file, every problem told in one line that names the file and what it is."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")


def load_json_file(path: str | Path, type_: type[T], what: str) -> T:
    """`type_` decoded from the JSON file at `path` (msgspec, so the struct's own checks run).

    Any problem is a ValueError reading `"{what} {path}: {reason}"`: a missing file, one
    that cannot be read (a directory, no permission), text that is not JSON, or a value
    that is not a valid `type_` (a wrong type, or what its `__post_init__` refuses).
    """
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=type_)
    except FileNotFoundError as exc:
        raise ValueError(f"{what} {path}: no such file") from exc
    except OSError as exc:  # a directory, no permission: still one clear line
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:  # ValidationError is a DecodeError
        raise ValueError(f"{what} {path}: {exc}") from exc

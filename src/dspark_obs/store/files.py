"""Opening a run directory's files without following links or blocking on special files.

A run directory may come from anyone (a copy, an archive, a shared disk). A part
replaced by a FIFO would block a reader forever, one linked to `/dev/zero` would
never end, and one linked outside the run would read someone else's file. So every
file of a run is opened with `O_NOFOLLOW | O_NONBLOCK` and checked to be a regular
file before a byte is read, and directory entries are typed with `lstat`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import RunStoreError

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: Path, mode: int) -> RunStoreError:
    return RunStoreError(
        f"{path}: is {kind(mode)}; a run holds only regular files, and readers follow "
        "no link (copy the file itself into the run)"
    )


def check_regular(path: Path) -> os.stat_result:
    """The `lstat` of `path`, or a RunStoreError naming what it is instead of a file."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RunStoreError(f"{path}: unreadable: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)
    return st


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file `path`, opened without following a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise not_regular(path, stat.S_IFLNK) from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise not_regular(path, st.st_mode)
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """Up to `limit + 1` bytes of the regular file `path` (one more says it is too large)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(limit + 1)

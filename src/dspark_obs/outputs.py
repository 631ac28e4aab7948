"""The one way a command writes what `--out` names: through no link, over nothing of a user's.

`--out` is often a shared or long-lived directory, so three things can go wrong there:
a symbolic link planted at the name (or at a file inside it) would carry our bytes
wherever it points; tidying away an earlier output by pattern would delete a user's own
file that happens to match; and two writers into one directory that shared a fixed
temporary name (`run.json.tmp`) would publish each other's half-written bytes. So:

- `prepare_dir` and `write_file` refuse a symbolic link at the directory or at the file
  (`OutputRefused`, one line naming it; the CLI exits 2). A link further up the path is
  the user's own layout and is followed.
- `write_file` writes a temporary file of a fresh name (`tempfile.mkstemp`: created with
  `O_EXCL`, so never through a link) in the same directory, fsyncs it and renames it over
  the name, so a reader sees the old file or the new one, whole.
- `open_append` opens a file that a command adds lines to (a study's JSON Lines) with
  `O_NOFOLLOW`, and refuses anything but a regular file there.
- `OwnedFiles` records what a command wrote in a directory (`.dspark-obs-written.json`:
  each file's name and SHA-256). A later run of the command deletes an earlier output's
  file only when the record names it and it still holds the recorded bytes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

#: The record of what a command wrote into a directory (see `OwnedFiles`).
WRITTEN = ".dspark-obs-written.json"


class OutputRefused(OSError):
    """An output path that would write through a symbolic link or over a non-directory.

    An OSError, as the filesystem's own refusals are: a command prints it in one line and
    exits 2, and a service's store that meets one fails as on a full disk."""


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _refuse_link(path: Path, what: str) -> os.stat_result | None:
    st = _lstat(path)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OutputRefused(
            f"{what} {path}: is a symbolic link; refusing to write through it (give the real path)"
        )
    return st


def prepare_dir(path: str | Path, what: str = "--out") -> Path:
    """`path` as a directory of ours to write into: created (with its parents) if absent;
    OutputRefused if it is a symbolic link or exists and is not a directory."""
    path = Path(path)
    st = _refuse_link(path, what)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputRefused(f"{what} {path}: exists and is not a directory")
    if st is None:
        path.mkdir(parents=True, exist_ok=True)
        st = _refuse_link(path, what)  # planted between the check and the mkdir
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise OutputRefused(f"{what} {path}: is not a directory")
    return path


def open_append(path: str | Path, what: str = "--out") -> TextIO:
    """`path` opened to add text at its end (created if absent), never through a link.

    OutputRefused where `path` is a symbolic link (`O_NOFOLLOW`: no race between a check
    and the open) or not a regular file: a FIFO without a reader would block the command
    for good, a device would swallow what it writes.
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_link(path, what)
        if exc.errno == errno.ENXIO:  # a FIFO that nothing reads
            raise OutputRefused(f"{what} {path}: is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputRefused(f"{what} {path}: is not a regular file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "a", encoding="utf-8")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory
    finally:
        os.close(fd)


def check_target(path: str | Path, what: str = "--out") -> Path:
    """`path` as a file `write_file` may publish: OutputRefused where it is a symbolic link
    or a directory. A command that writes several files checks them all first, so that a
    refusal leaves the directory as it was."""
    path = Path(path)
    st = _refuse_link(path, what)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputRefused(f"{what} {path}: is a directory")
    return path


def write_file(
    path: str | Path,
    data: bytes | str | Callable[[BinaryIO], object],
    what: str = "--out",
    *,
    durable: bool = True,
) -> Path:
    """Publish `data` (bytes, text as UTF-8, or a function writing to a binary file) at
    `path` atomically, through a temporary file of a fresh name in its directory.

    OutputRefused where `path` is a symbolic link or a directory. `durable` fsyncs the
    file and the directory (a run's parts must survive a crash; a report's figures can
    simply be made again).
    """
    path = check_target(path, what)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as exc:
            if exc.filename is not None or exc.errno is None:
                raise
            # a full disk (ENOSPC, EDQUOT) or an I/O error says no file: name the one
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)
    return path


def _sha256(path: Path) -> str | None:
    """The SHA-256 of a regular file at `path` (a link is never read); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return hashlib.file_digest(f, "sha256").hexdigest()


class OwnedFiles:
    """What one command wrote into one directory, kept across its runs in `WRITTEN`.

    `stale(names)` deletes the files an earlier run recorded that this run does not write
    again (figures of sections a new run lacks), each only while it holds the recorded
    bytes: a user's file of the same name, or one the user changed, stays.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.before: dict[str, str] = {}
        try:
            record = json.loads((directory / WRITTEN).read_text(encoding="utf-8"))
            if isinstance(record, dict):
                self.before = {
                    k: v
                    for k, v in record.items()
                    if isinstance(k, str) and isinstance(v, str) and Path(k).name == k
                }
        except (OSError, ValueError):
            pass  # none yet, or not ours: nothing is deleted

    def remove_stale(self, written: set[str]) -> list[str]:
        """Delete the earlier run's files that `written` does not name; which were deleted."""
        removed = []
        for name, digest in self.before.items():
            if name in written or name == WRITTEN:
                continue
            path = self.directory / name
            if _sha256(path) == digest:
                path.unlink()
                removed.append(name)
        return removed

    def record(self, written: set[str]) -> None:
        """Record the files of this run (their bytes as they are now)."""
        digests = {n: _sha256(self.directory / n) for n in sorted(written)}
        text = json.dumps({n: d for n, d in digests.items() if d is not None}, indent=1)
        write_file(self.directory / WRITTEN, text + "\n", durable=False)

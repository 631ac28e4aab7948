"""What parts a run holds, held to what its checksum records and manifest say it should.

Listing a table directory is not enough: a deleted part leaves a hole nobody would
see, a stray part (a copy, a leftover of another run) adds steps twice, and either
one changes every number read from the run without an error. The writer leaves
evidence to check against: parts are numbered per flush across tables with no gap
(`part-000000`, `part-000001`, ...), each part is published just after its checksum
record (`checksums.py`), and a closed run's `run.json` says how many parts, steps
and request rows it holds. So `take_inventory` refuses, naming the file:

- an entry named like a part that is not a regular file (a link, a FIFO, a device):
  nothing is followed or opened;
- in a run written with a record for every part (`store_version` 2 and later), a
  part without its record: an extra part;
- a record without its part, a `requests` part without its `steps` part, or a part
  number missing from every table, anywhere but at the end of a run still being
  written (where they are what an interrupted flush leaves): a missing part;
- in a closed run, a number of parts other than the manifest's.

The rows are compared with the manifest's counts where they are read (`reader.py`).
"""

from __future__ import annotations

import os
import re
import stat
from functools import lru_cache
from pathlib import Path
from typing import Any

from .checksums import CHECKSUMS
from .errors import RunStoreError
from .files import not_regular
from .tables import REQUESTS, STEPS

MANIFEST = "run.json"
#: The first store version whose writer publishes a checksum record for every part.
RECORDS_REQUIRED = 2
_PART_RE = re.compile(r"^part-(\d{6,})\.parquet$")
_RECORD_RE = re.compile(r"^part-(\d{6,})\.parquet\.json$")
TABLE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def part_name(number: int) -> str:
    """File name of part `number` (zero-padded so names also sort in shell globs)."""
    return f"part-{number:06d}.parquet"


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """Entries of `directory` named by `pattern`, by number; each must be a regular file."""
    return [(n, _child(directory, name)) for n, name in _numbered_names(directory, pattern)]


@lru_cache(maxsize=1 << 16)
def _child(directory: Path, name: str) -> Path:
    """`directory / name`, made once: a path is immutable, and making one costs more than
    listing its directory entry."""
    return directory / name


def _numbered_names(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """`_numbered`'s entries by name: a run holds thousands of parts and records, and
    readers take its inventory again for each table they open, so the paths are made
    only where they are returned."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        raise (
            not_regular(directory, st.st_mode)
            if stat.S_ISLNK(st.st_mode)
            else RunStoreError(f"{directory}: not a directory")
        )
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            m = pattern.match(entry.name)
            if not m:
                continue
            if not entry.is_file(follow_symlinks=False):
                raise not_regular(Path(entry.path), entry.stat(follow_symlinks=False).st_mode)
            found.append((int(m.group(1)), entry.name))
    found.sort()
    return found


def list_parts(table_dir: Path) -> list[tuple[int, Path]]:
    """Published parts of one table, by part number; `.tmp` leftovers excluded."""
    return _numbered(table_dir, _PART_RE)


def table_dirs(run_dir: Path) -> list[Path]:
    """The run's table directories; a link where one would be is refused, not followed."""
    found = []
    with os.scandir(run_dir) as entries:
        for entry in entries:
            if entry.name == CHECKSUMS or not TABLE_RE.match(entry.name):
                continue
            if entry.is_symlink() and os.path.isdir(entry.path):
                raise not_regular(Path(entry.path), stat.S_IFLNK)
            if entry.is_dir(follow_symlinks=False):
                found.append(Path(entry.path))
    return sorted(found)


def take_inventory(run_dir: Path, manifest: dict[str, Any]) -> dict[str, list[tuple[int, Path]]]:
    """Each table's parts, by number, after the checks in the module docstring."""
    tables = {d.name: parts for d in table_dirs(run_dir) if (parts := list_parts(d))}
    records = {}
    if os.path.lexists(run_dir / CHECKSUMS):
        if not os.path.isdir(run_dir / CHECKSUMS) or os.path.islink(run_dir / CHECKSUMS):
            raise not_regular(run_dir / CHECKSUMS, os.lstat(run_dir / CHECKSUMS).st_mode)
        records = {
            d.name: {n for n, _ in _numbered_names(d, _RECORD_RE)}
            for d in table_dirs(run_dir / CHECKSUMS)
        }
    required = manifest.get("store_version", 1) >= RECORDS_REQUIRED
    complete = manifest.get("complete") is True
    published = sorted({n for parts in tables.values() for n, _ in parts})
    last = published[-1] if published else -1

    def missing(table: str, n: int, evidence: str) -> None:
        if complete or n < last:
            raise RunStoreError(
                f"{run_dir / table / part_name(n)}: missing part: {evidence} "
                "(deleted, moved or unreadable)"
            )

    for table in sorted(set(tables) | set(records)):
        numbers = {n for n, _ in tables.get(table, [])}
        have = records.get(table, set())
        for n, part in tables.get(table, []):
            if required and n not in have:
                raise RunStoreError(
                    f"{part}: extra part: it has no checksum record, so this run's writer "
                    "did not publish it (a stray or copied-in file); move it out of the run"
                )
        for n in sorted(have - numbers):
            missing(table, n, "its checksum record exists")
    steps = {n for n, _ in tables.get(STEPS, [])}
    for n, _ in tables.get(REQUESTS, []):
        if n not in steps:
            missing(STEPS, n, f"its {REQUESTS} part exists")
    gaps = sorted(set(range(last + 1)) - set(published))
    if gaps:
        raise RunStoreError(
            f"{run_dir}: missing part: {part_name(gaps[0])} is in no table, "
            f"though parts run to {part_name(last)}"
        )
    expected = manifest.get("parts")
    if complete and isinstance(expected, int) and expected != len(published):
        raise RunStoreError(
            f"{run_dir}: {len(published)} parts on disk, but {MANIFEST} says the run "
            f"has {expected}: parts {'missing' if expected > len(published) else 'added'}"
        )
    return tables

"""Open a run directory and read its tables lazily, or as `StepBatch`es again.

Readers only ever see finished parts: the writer publishes a part by atomic
rename, and everything here matches `part-NNNNNN.parquet` exactly, so the
`.tmp` file of a flush in progress (or of a writer that crashed mid-flush) is
never read. A run may be read while it is still being written; `complete`
in the manifest says whether the writer finished.

The writer publishes a flush's `requests` part before its `steps` part, so a
`steps` row never exists without its request rows. A `requests` part without
its `steps` part is what an interrupted flush leaves behind; it is ignored here
(and removed when the writer resumes), so `steps()` and `requests()` always
describe the same steps.

Every part is checked against its checksum record (`checksums.py`) before
polars reads anything of it, because polars aborts the process on some damaged
page headers instead of raising.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..telemetry.batch import StepBatch
from .checksums import CHECKSUMS, verify_parts
from .errors import READ_ERRORS, RunStoreError, unreadable
from .tables import REQUESTS, STEPS, frames_to_batches, requests_schema, steps_schema

MANIFEST = "run.json"
_PART_RE = re.compile(r"^part-(\d{6,})\.parquet$")
_TABLE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def part_name(number: int) -> str:
    """File name of part `number` (zero-padded so names also sort in shell globs)."""
    return f"part-{number:06d}.parquet"


def check_table_name(table: str) -> str:
    """Table names become directory names: none may leave the run or be `_checksums`."""
    if not isinstance(table, str) or not _TABLE_RE.match(table) or table == CHECKSUMS:
        raise RunStoreError(f"invalid table name {table!r}")
    return table


def list_parts(table_dir: Path) -> list[tuple[int, Path]]:
    """Published parts of one table, by part number; `.tmp` leftovers excluded."""
    if not table_dir.is_dir():
        return []
    found = []
    for entry in table_dir.iterdir():
        m = _PART_RE.match(entry.name)
        if m and entry.is_file():
            found.append((int(m.group(1)), entry))
    found.sort()
    return found


def read_manifest(path: Path) -> dict[str, Any]:
    """The parsed `run.json`, or a RunStoreError naming the file."""
    if not path.is_file():
        raise RunStoreError(f"{path}: missing run manifest (not a run directory?)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunStoreError(f"{path}: corrupt run manifest: {exc}") from exc
    if not isinstance(manifest, dict):
        raise RunStoreError(f"{path}: run manifest is not a JSON object")
    return manifest


@dataclass(frozen=True, eq=False)
class Run:
    """A run directory opened for reading; cheap to create, reads nothing until asked."""

    path: Path
    manifest: dict[str, Any]
    #: parts whose checksum, footer and schema were checked, by (path, inode, size, mtime):
    #: checked once, so a report's many queries over one table pay for one verification
    _checked: dict[tuple[str, int, int, int], pl.Schema] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def complete(self) -> bool:
        """Whether the writer closed cleanly (False while writing or after a crash)."""
        return bool(self.manifest.get("complete", False))

    def tables(self) -> list[str]:
        """Tables that have at least one published part."""
        return sorted(
            d.name
            for d in self.path.iterdir()
            if d.is_dir() and d.name != CHECKSUMS and self._part_list(d.name)
        )

    def _part_list(self, table: str) -> list[tuple[int, Path]]:
        parts = list_parts(self.path / check_table_name(table))
        if table == REQUESTS:
            committed = {n for n, _ in list_parts(self.path / STEPS)}
            parts = [(n, p) for n, p in parts if n in committed]
        return parts

    def parts(self, table: str) -> list[Path]:
        """Published part files of `table`, in part order."""
        return [p for _, p in self._part_list(table)]

    def scan(self, table: str) -> pl.LazyFrame:
        """All parts of `table` as one lazy frame, so queries push down into Parquet.

        Every part's checksum, footer and schema are checked first (once per
        part), so a damaged, foreign or mismatched part is a RunStoreError naming
        it here rather than a polars error (or abort) deep inside someone's
        query. Only a part without a checksum record (written before parts had
        them) can still hide damage inside a data page until the page is read.
        """
        files = self.parts(table)
        if not files:
            raise RunStoreError(f"{self.path / table}: table {table!r} has no parts")
        self.check_parts(table, files)
        return pl.scan_parquet([str(f) for f in files], glob=False)

    def _expected_schema(self, table: str) -> dict[str, pl.DataType]:
        if table == STEPS:
            return dict(steps_schema())
        if table == REQUESTS:
            gamma = self.manifest.get("gamma")
            schema = dict(requests_schema(gamma if isinstance(gamma, int) and gamma > 0 else 1))
            if not (isinstance(gamma, int) and gamma > 0):  # matrix width unknown: names only
                schema = {k: v for k, v in schema.items() if not isinstance(v, pl.Array)}
            return schema
        return {}

    def check_parts(self, table: str, files: list[Path]) -> None:
        """RunStoreError unless each part matches its checksum and has the table's schema."""
        expected = self._expected_schema(table)
        keys = []
        for f in files:
            try:
                st = f.stat()
            except OSError as exc:
                raise unreadable(f, exc) from exc
            keys.append((str(f), st.st_ino, st.st_size, st.st_mtime_ns))
        verify_parts([f for f, key in zip(files, keys, strict=True) if key not in self._checked])
        first: pl.Schema | None = None
        for f, key in zip(files, keys, strict=True):
            schema = self._checked.get(key)
            if schema is None:
                try:
                    schema = pl.read_parquet_schema(f)
                except READ_ERRORS as exc:
                    raise unreadable(f, exc) from exc
            for name, dtype in expected.items():
                if name in schema and schema[name] != dtype:
                    raise RunStoreError(f"{f}: column {name} is {schema[name]}, expected {dtype}")
            missing = [name for name in expected if name not in schema]
            if missing:
                raise RunStoreError(f"{f}: not a {table!r} part, lacks columns {missing[:5]}")
            if first is None:
                first = schema
            elif schema != first:
                raise RunStoreError(f"{f}: schema differs from {files[0].name}")
            self._checked[key] = schema

    def steps(self) -> pl.LazyFrame:
        return self.scan(STEPS)

    def requests(self) -> pl.LazyFrame:
        return self.scan(REQUESTS)

    def batches(self) -> Iterator[StepBatch]:
        """Every step as a `StepBatch`, in write order, holding one part in memory at a time."""
        steps = self._part_list(STEPS)
        if not steps:
            raise RunStoreError(f"{self.path / STEPS}: table 'steps' has no parts")
        for number, steps_path in steps:
            req_path = self.path / REQUESTS / part_name(number)
            self.check_parts(STEPS, [steps_path])
            if req_path.is_file():
                self.check_parts(REQUESTS, [req_path])
            try:
                steps_df = pl.read_parquet(steps_path)
                requests_df = pl.read_parquet(req_path) if req_path.is_file() else None
            except READ_ERRORS as exc:
                raise unreadable(steps_path, exc) from exc
            if requests_df is None and steps_df["has_reqs"].any():
                raise RunStoreError(f"{req_path}: missing, but its steps part has request rows")
            try:
                batches = frames_to_batches(steps_df, requests_df)
            except RunStoreError as exc:
                raise RunStoreError(f"{steps_path}: {exc}") from exc
            except (*READ_ERRORS, ValueError) as exc:  # values no writer writes
                raise unreadable(steps_path, exc) from exc
            yield from batches


def open_run(run_dir: str | Path) -> Run:
    """Open `run_dir` for reading; fails early, naming the path, when it is not a run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunStoreError(f"{path}: run directory does not exist")
    return Run(path=path, manifest=read_manifest(path / MANIFEST))


def check_new_run_dir(out: str | Path) -> None:
    """Refuse, before any work starts, a directory that already holds a run.

    A run directory is written once, never appended to by a new command. After a crash
    (SIGKILL) the directory holds an incomplete run whose published parts stay readable;
    a restart must not mix a second run into it, so that is refused too, and said.
    """
    manifest = Path(out) / MANIFEST
    if not manifest.exists():
        return
    try:
        complete = json.loads(manifest.read_text(encoding="utf-8")).get("complete") is True
    except (OSError, ValueError, AttributeError):
        complete = True  # unreadable: say no more than that a run is there
    state = "" if complete else " (incomplete: its writer was stopped before closing it)"
    raise RunStoreError(f"{out} already holds a run{state}; choose another --out")

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
page headers instead of raising; the parts found are held to the records and the
manifest first (`inventory.py`), and a closed run's rows to the manifest's counts,
so a missing, extra or unreadable part is an error naming it, never a hole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..telemetry.batch import StepBatch
from .checksums import CHECKSUMS, verify_parts
from .errors import READ_ERRORS, RunStoreError, unreadable
from .inventory import (
    MANIFEST,
    REQUESTS,
    STEPS,
    TABLE_RE,
    list_parts,
    part_name,
    take_inventory,
)
from .layout import in_memory, in_memory_schema
from .manifest import read_manifest
from .part_bounds import check_part_bounds
from .tables import (
    OPTIONAL_STEP_COLUMNS,
    frames_to_batches,
    requests_schema,
    steps_schema,
)
from .validate import (
    Rejections,
    clean,
    flush_rejections,
    report,
    tally,
    within_probabilities,
)

__all__ = ["MANIFEST", "Run", "check_table_name", "list_parts", "open_run", "part_name"]

#: A part as it is on disk: (path, device, inode, size, mtime, ctime). A verdict on a part
#: holds while its key does: a write to the file moves its ctime, a replacement its inode.
PartKey = tuple[str, int, int, int, int, int]

#: A part's schema on disk and in memory (`layout.py`), one pair for all parts alike.
Schemas = tuple[pl.Schema, pl.Schema]
#: Parts whose checksum, bounds and footer were checked, with their schemas: kept for the
#: process, not per `Run`, since a command opens one run more than once (`summary` reads
#: the table and then the trim cost, `report` each section) and each would pay again.
_VERIFIED: dict[PartKey, Schemas] = {}
#: The schemas found so far, each once: the parts of a table share one pair, so checking
#: a table's parts against each other and against the table's columns is a comparison of
#: identities once the first part is checked (hundreds of parts on a large run, checked at
#: every read of the table).
_SCHEMAS: dict[tuple[tuple[str, str], ...], Schemas] = {}
#: Rows of a table's parts (held to the manifest), and the steps every reader leaves out
#: (`validate.py`), by the keys of the parts they were counted or found in.
_ROWS: dict[tuple[PartKey, ...], int] = {}
_REJECTED: dict[tuple, Rejections] = {}
#: Entries kept at most: a reader of a fleet of runs opens many parts, each entry is small.
_MAX_VERIFIED = 1 << 17
_MAX_RUNS = 256


def _remember(cache: dict, key, value, most: int) -> None:
    """`cache[key] = value`, the oldest entry dropped past `most` (one pass over a fleet
    must not keep every part it ever read)."""
    if len(cache) >= most:
        del cache[next(iter(cache))]
    cache[key] = value


def part_key(f: Path) -> PartKey:
    """The key a verdict on part `f` is kept under (`unreadable` when it cannot be stat'ed)."""
    try:
        st = f.stat()
    except OSError as exc:
        raise unreadable(f, exc) from exc
    return (str(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_table_name(table: str) -> str:
    """Table names become directory names: none may leave the run or be `_checksums`."""
    if not isinstance(table, str) or not TABLE_RE.match(table) or table == CHECKSUMS:
        raise RunStoreError(f"invalid table name {table!r}")
    return table


@dataclass(frozen=True, eq=False)
class Run:
    """A run directory opened for reading; cheap to create, reads nothing until asked."""

    path: Path
    manifest: dict[str, Any]

    @property
    def complete(self) -> bool:
        """Whether the writer closed cleanly (False while writing or after a crash)."""
        return bool(self.manifest.get("complete", False))

    @property
    def gamma(self) -> int:
        """Drafted tokens per block, from the manifest (validated when it was read)."""
        gamma = self.manifest.get("gamma")
        if gamma is None:
            raise RunStoreError(f"{self.path / MANIFEST}: no gamma (the run holds no steps?)")
        return gamma

    def tables(self) -> list[str]:
        """Tables that have at least one published part."""
        inventory = take_inventory(self.path, self.manifest)
        return sorted(t for t in inventory if self._part_list(t, inventory))

    def _part_list(
        self, table: str, inventory: dict[str, list[tuple[int, Path]]] | None = None
    ) -> list[tuple[int, Path]]:
        if inventory is None:
            inventory = take_inventory(self.path, self.manifest)
        parts = inventory.get(check_table_name(table), [])
        if table == REQUESTS:
            committed = {n for n, _ in inventory.get(STEPS, [])}
            parts = [(n, p) for n, p in parts if n in committed]
        return parts

    def _check_rows(self, table: str, rows: int) -> None:
        """RunStoreError unless a closed run's `table` holds the rows its manifest counts."""
        key = {STEPS: "steps", REQUESTS: "request_steps"}.get(table)
        expected = self.manifest.get(key) if key else None
        if self.complete and expected is not None and rows != expected:
            raise RunStoreError(
                f"{self.path / table}: {rows} rows, but {MANIFEST} says the run stored "
                f"{expected}: parts changed, missing or added"
            )

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
        files, schemas, rejected = self._checked(table)
        if rejected:
            frame = _scan_without(files, schemas, rejected)
        else:
            frame = _scan_together(files, schemas)
        return frame.with_columns(_screens(table, frame))

    def scan_parts(self, table: str) -> list[pl.LazyFrame]:
        """Each part of `table` on its own, in part order, as `scan` reads it (checked, the
        rejected steps left out, the probabilities screened). For a reader that takes the
        run a range of parts at a time: a query over `scan` with a filter makes polars read
        every part's footer again for each range, hundreds of parts on a large run."""
        files, schemas, rejected = self._checked(table)
        frames = [
            rejected.without(f, _scan_together([f], [schema]))
            for f, schema in zip(files, schemas, strict=True)
        ]
        screens = _screens(table, frames[0])  # the parts' schemas are one (`check_parts`)
        return [frame.with_columns(screens) for frame in frames]

    def scan_windows(self, table: str, rows: int) -> list[pl.LazyFrame]:
        """The rows of `table` in part order, as frames of at most `rows` rows each: parts
        taken whole and together while they fit, a larger part in slices, an empty one
        left out. For a reader that holds a window at a time: slices of one `scan` cost
        polars half as much CPU again on a large run, since each slice finds its parts
        anew and decodes the parts its ends cut twice."""
        parts = self.scan_parts(table)
        sizes = [frame.item() for frame in pl.collect_all([p.select(pl.len()) for p in parts])]
        windows: list[pl.LazyFrame] = []
        together: list[pl.LazyFrame] = []
        held = 0
        for part, n in zip(parts, sizes, strict=True):
            if n == 0:
                continue
            if together and held + n > rows:
                windows.append(pl.concat(together))
                together, held = [], 0
            if n > rows:
                windows += [part.slice(lo, rows) for lo in range(0, n, rows)]
            else:
                together.append(part)
                held += n
        if together:
            windows.append(pl.concat(together))
        return windows

    def _checked(self, table: str) -> tuple[list[Path], list[pl.Schema], Rejections]:
        """The parts of `table`, checked (`check_parts`, and a closed run's rows against its
        manifest), their schemas on disk, and the steps every reader leaves out of them
        (none for other tables)."""
        files = self.parts(table)
        if not files:
            raise RunStoreError(f"{self.path / table}: table {table!r} has no parts")
        schemas = self.check_parts(table, files)
        if table not in (STEPS, REQUESTS):
            return files, schemas, Rejections()
        if self.complete:
            key = tuple(map(part_key, files))
            if key not in _ROWS:
                try:
                    rows = _scan_together(files, schemas).select(pl.len()).collect().item()
                except READ_ERRORS as exc:
                    raise unreadable(self.path / table, exc) from exc
                _remember(_ROWS, key, rows, _MAX_RUNS)
            self._check_rows(table, _ROWS[key])
        return files, schemas, self.rejections()

    def rejections(self) -> Rejections:
        """The stored steps every reader leaves out, as the pipeline's gate would reject
        them (`validate.py`): checked once per set of parts, logged once."""
        steps = self.parts(STEPS)
        requests = {p.name: p for p in self.parts(REQUESTS)}
        gamma = self.manifest.get("gamma")
        key = (gamma, *map(part_key, [*steps, *requests.values()]))
        if key in _REJECTED:
            return _REJECTED[key]
        step_schemas = dict(zip(steps, self.check_parts(STEPS, steps), strict=True))
        request_schemas = dict(
            zip(requests.values(), self.check_parts(REQUESTS, list(requests.values())), strict=True)
        )

        def scan(parts: list[Path], schemas: dict[Path, pl.Schema]) -> pl.LazyFrame:
            return _scan_together(parts, [schemas[p] for p in parts])

        try:
            screen = clean(
                scan(steps, step_schemas),
                scan(list(requests.values()), request_schemas) if requests else None,
                gamma,
            )
            if all(f.item() for f in pl.collect_all(screen)):
                found = []
            else:
                found = pl.collect_all(
                    flush_rejections(
                        scan([f], step_schemas),
                        scan([requests[f.name]], request_schemas) if f.name in requests else None,
                        gamma,
                        matrices=False,
                    )
                    for f in steps
                )
        except READ_ERRORS as exc:
            raise unreadable(self.path, exc) from exc
        rejected = tally({f.name: frame for f, frame in zip(steps, found, strict=False)})
        _remember(_REJECTED, key, rejected, _MAX_RUNS)
        report(self.path, rejected)
        return rejected

    def _expected_schema(self, table: str) -> dict[str, pl.DataType]:
        if table == STEPS:
            return dict(steps_schema())
        if table == REQUESTS:
            gamma = self.manifest.get("gamma")
            schema = dict(requests_schema(gamma or 1))
            if gamma is None:  # matrix width unknown: names only
                schema = {k: v for k, v in schema.items() if not isinstance(v, pl.Array)}
            return schema
        return {}

    def check_parts(self, table: str, files: list[Path]) -> list[pl.Schema]:
        """RunStoreError unless each part matches its checksum and has the table's schema
        (in memory: `layout.py`); the parts' schemas on disk."""
        expected = self._expected_schema(table)
        keys = list(map(part_key, files))
        verify_parts([f for f, key in zip(files, keys, strict=True) if key not in _VERIFIED])
        first: pl.Schema | None = None
        fitting: list[pl.Schema] = []  # schemas that have the table's columns
        stored = []
        for f, key in zip(files, keys, strict=True):
            schemas = _VERIFIED.get(key)
            if schemas is None:
                check_part_bounds(f)  # what decoding it takes, before polars reads a byte
                try:
                    schemas = _interned(pl.read_parquet_schema(f))
                except READ_ERRORS as exc:
                    raise unreadable(f, exc) from exc
            on_disk, schema = schemas
            stored.append(on_disk)
            if not any(schema is s for s in fitting):
                _check_columns(f, table, schema, expected)
                fitting.append(schema)
            if first is None:
                first = schema
            elif schema is not first and schema != first:
                raise RunStoreError(f"{f}: schema differs from {files[0].name}")
            if key not in _VERIFIED:
                _remember(_VERIFIED, key, schemas, _MAX_VERIFIED)
        return stored

    def steps(self) -> pl.LazyFrame:
        return self.scan(STEPS)

    def requests(self) -> pl.LazyFrame:
        return self.scan(REQUESTS)

    def batches(self) -> Iterator[StepBatch]:
        """Every step as a `StepBatch`, in write order, holding one part in memory at a time."""
        steps = self._part_list(STEPS)
        if not steps:
            raise RunStoreError(f"{self.path / STEPS}: table 'steps' has no parts")
        rows = {STEPS: 0, REQUESTS: 0}
        found: dict[str, pl.DataFrame] = {}
        gamma = self.manifest.get("gamma")
        for number, steps_path in steps:
            req_path = self.path / REQUESTS / part_name(number)
            self.check_parts(STEPS, [steps_path])
            if req_path.is_file():
                self.check_parts(REQUESTS, [req_path])
            try:
                steps_df = pl.read_parquet(steps_path)
                requests_df = in_memory(pl.read_parquet(req_path)) if req_path.is_file() else None
            except READ_ERRORS as exc:
                raise unreadable(steps_path, exc) from exc
            if requests_df is None and steps_df["has_reqs"].any():
                raise RunStoreError(f"{req_path}: missing, but its steps part has request rows")
            rows[STEPS] += steps_df.height
            rows[REQUESTS] += 0 if requests_df is None else requests_df.height
            # every invariant, the matrices' too: they are in memory already
            found[steps_path.name] = flush_rejections(
                steps_df.lazy(), None if requests_df is None else requests_df.lazy(), gamma
            ).collect()
            rejected = tally({steps_path.name: found[steps_path.name]})
            if rejected:
                steps_df = rejected.without(steps_path, steps_df.lazy()).collect()
                if requests_df is not None:
                    requests_df = rejected.without(req_path, requests_df.lazy()).collect()
            try:
                batches = frames_to_batches(steps_df, requests_df)
            except RunStoreError as exc:
                raise RunStoreError(f"{steps_path}: {exc}") from exc
            except (*READ_ERRORS, ValueError) as exc:  # values no writer writes
                raise unreadable(steps_path, exc) from exc
            yield from batches
        report(self.path, tally(found))
        for table, n in rows.items():
            self._check_rows(table, n)


def _screens(table: str, frame: pl.LazyFrame) -> list[pl.Expr]:
    """What every read of `table` (as `frame`) puts over its columns: the probability
    matrices of `requests` screened (`within_probabilities`)."""
    if table != REQUESTS:
        return []
    return within_probabilities(frame.collect_schema().names())


def _interned(on_disk: pl.Schema) -> Schemas:
    """The one pair of schemas (`_SCHEMAS`) of a part whose schema on disk is `on_disk`."""
    key = tuple((name, repr(dtype)) for name, dtype in on_disk.items())
    if key not in _SCHEMAS:
        _remember(_SCHEMAS, key, (on_disk, in_memory_schema(on_disk)), _MAX_RUNS)
    return _SCHEMAS[key]


def _check_columns(
    f: Path, table: str, schema: pl.Schema, expected: dict[str, pl.DataType]
) -> None:
    """RunStoreError unless part `f`, of schema `schema` in memory, has `table`'s columns."""
    for name, dtype in expected.items():
        if name in schema and schema[name] != dtype:
            raise RunStoreError(f"{f}: column {name} is {schema[name]}, expected {dtype}")
    missing = [n for n in expected if n not in schema and n not in OPTIONAL_STEP_COLUMNS]
    if missing:
        raise RunStoreError(f"{f}: not a {table!r} part, lacks columns {missing[:5]}")


def _scan_together(files: list[Path], schemas: list[pl.Schema]) -> pl.LazyFrame:
    """The parts `files` (checked, their schemas on disk `schemas`) as one frame in part
    order, in memory's layout: the parts of one layout in one scan, those of another
    (an older run's, resumed) in another."""
    frames: list[pl.LazyFrame] = []
    start = 0
    for end in range(1, len(files) + 1):
        if end == len(files) or (
            schemas[end] is not schemas[start] and schemas[end].names() != schemas[start].names()
        ):
            scan = pl.scan_parquet([str(f) for f in files[start:end]], glob=False)
            frames.append(in_memory(scan, schemas[start].names()))
            start = end
    return frames[0] if len(frames) == 1 else pl.concat(frames)


def _scan_without(
    files: list[Path], schemas: list[pl.Schema], rejected: Rejections
) -> pl.LazyFrame:
    """The parts `files` as one frame in part order, less the steps `rejected` in each
    flush; the parts with none are scanned together, as `Run.scan` scans a clean table."""
    frames: list[pl.LazyFrame] = []
    clean: list[int] = []

    def scan(at: list[int]) -> pl.LazyFrame:
        return _scan_together([files[i] for i in at], [schemas[i] for i in at])

    for i, f in enumerate(files):
        if f.name in rejected.keys:
            if clean:
                frames.append(scan(clean))
                clean = []
            frames.append(rejected.without(f, scan([i])))
        else:
            clean.append(i)
    if clean:
        frames.append(scan(clean))
    return pl.concat(frames)


def not_a_run_dir(path: Path) -> RunStoreError:
    """Why `path`, which is no directory, cannot be read as a run: it is a file, or nothing."""
    if path.exists():
        return RunStoreError(
            f"{path}: is a file, not a run directory (give the directory `run` or `serve "
            "--out` wrote, one holding run.json)"
        )
    return RunStoreError(f"{path}: no such run directory")


def open_run(run_dir: str | Path) -> Run:
    """Open `run_dir` for reading; fails early, naming the path, when it is not a run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise not_a_run_dir(path)
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
        complete = read_manifest(manifest).get("complete") is True
    except RunStoreError:
        complete = True  # unreadable: say no more than that a run is there
    state = "" if complete else " (incomplete: its writer was stopped before closing it)"
    raise RunStoreError(f"{out} already holds a run{state}; choose another --out")

"""`RunWriter`: stream `StepBatch`es into a run directory without ever exposing half a file.

Producers (`run`, `serve`, `ingest`) may be killed at any moment, and readers
(`summary`, `report`, a notebook) may open the run while it is being written.
So data is published in parts: each flush writes `part-NNNNNN.parquet.tmp`,
fsyncs it, renames it over the final name (atomic on POSIX) and fsyncs the
directory. A reader sees a part whole or not at all, and after a crash at most
the last unflushed buffer is lost. `run.json` is replaced the same way; its
`complete` flag tells a reader whether the writer finished. Each part's
checksum record (`checksums.py`) is published the same way just before the
part, so that a part is never visible without the means to verify it.

Appending is cheap on purpose: `append` checks shapes and keeps a reference to
the batch; the one copy of the per-request data happens at flush, when the
buffered batches are concatenated into columns. The batch therefore belongs to
the writer once appended and must not be mutated afterwards.

Bad input never costs what was already accepted: a batch with inconsistent
shapes is refused at `append` (nothing buffered is touched), and a batch that
still fails to convert at flush is dropped alone, counted in `dropped_steps`,
and logged once per reason, while the rest of the buffer is written.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import polars as pl

from ..outputs import prepare_dir, write_file
from ..telemetry.batch import MATRIX_COLUMNS, REQUEST_COLUMNS, StepBatch
from .checksums import CHECKSUMS, checksum_path, checksum_record, file_record, verify_parts
from .errors import RunStoreError
from .inventory import MANIFEST, list_parts, part_name
from .layout import COMPRESSION, on_disk
from .manifest import read_manifest
from .reader import check_table_name
from .tables import REQUESTS, STEPS, batches_to_frames

log = logging.getLogger(__name__)

#: Version of the on-disk layout, recorded in run.json for future readers. From 2 on,
#: every part has a checksum record (a resumed older run gets records for its parts); from
#: 3 on, parts are written with a column a matrix position (`layout.py`; readers tell a
#: part's layout from its columns, so a resumed older run may hold both).
STORE_VERSION = 3
#: Default flush interval: a part per this many steps, or once the oldest buffered step is
#: this many seconds old. A crash loses at most what was buffered since the last part.
FLUSH_STEPS = 2000
FLUSH_SECONDS = 5.0


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and Windows) cannot fsync a directory
    finally:
        os.close(fd)


def _write_atomic(final: Path, write) -> None:
    """Write a temporary file of a fresh name, fsync, rename over `final`, fsync the
    directory (`outputs.write_file`: never through a link, never a name two writers share)."""
    write_file(final, write)


#: A temporary file a flush or a manifest update leaves if killed (`outputs.write_file`'s
#: names; `NAME.tmp`: this writer's names before those).
_TMP_GLOBS = ("part-*.parquet.tmp", ".part-*.parquet.*.tmp")


def publish_part(final: Path, df: pl.DataFrame) -> int:
    """Publish `df` as the part `final` (`RUN_DIR/<table>/part-NNNNNN.parquet`); its bytes.

    The record goes first, so that a published part always has one. A retried flush
    rewrites both with the same bytes (the same rows encode the same), so a reader
    never pairs a part with a record of other bytes.
    """
    record = checksum_path(final)
    for d in (final.parent, record.parent.parent, record.parent):
        if not os.path.isdir(d) or os.path.islink(d):
            prepare_dir(d, "run directory's")  # a planted link is refused, not followed
            _fsync_dir(d.parent)
    buf = io.BytesIO()
    on_disk(df).write_parquet(buf, compression=COMPRESSION)
    data = buf.getbuffer()
    _write_atomic(record, lambda f: f.write(checksum_record(data)))
    _write_atomic(final, lambda f: f.write(data))
    return len(data)


class RunWriter:
    """Writes one run directory: a manifest plus `steps`, `requests` and extra tables.

    Parts are numbered per flush across all tables, so `steps/part-000003` and
    `requests/part-000003` hold the same steps. Flushes happen when
    `flush_steps` batches are buffered or the oldest buffered data is
    `flush_seconds` old (checked on `append` / `write_rows`; call `flush()`
    from an idle producer), and on `close`. Not thread-safe: one producer.
    """

    def __init__(
        self,
        run_dir: str | Path,
        manifest: Mapping[str, Any],
        *,
        flush_steps: int = FLUSH_STEPS,
        flush_seconds: float = FLUSH_SECONDS,
        resume: bool = False,
    ) -> None:
        if flush_steps < 1:
            raise ValueError(f"flush_steps must be >= 1, got {flush_steps}")
        if flush_seconds < 0:
            raise ValueError(f"flush_seconds must be >= 0, got {flush_seconds}")
        self._path = Path(run_dir)
        self._flush_steps = int(flush_steps)
        self._flush_seconds = float(flush_seconds)
        if self._path.exists() and not self._path.is_dir():
            raise RunStoreError(f"{self._path}: exists and is not a directory")
        prepare_dir(self._path, "run directory")
        manifest_path = self._path / MANIFEST
        existing = self._existing_parts()
        if not resume and manifest_path.exists():
            raise RunStoreError(
                f"{self._path}: already holds a run ({MANIFEST}); "
                "choose a new directory or pass resume=True to append to it"
            )
        if not resume and existing:
            raise RunStoreError(
                f"{self._path}: holds table parts but no {MANIFEST}; refusing to mix runs"
            )
        base = read_manifest(manifest_path) if resume and manifest_path.exists() else {}

        self._manifest: dict[str, Any] = {**base, **manifest}
        self._manifest["store_version"] = STORE_VERSION
        self._manifest["complete"] = False
        self._steps = 0
        self._request_steps = 0
        self._parts = 0
        self._dropped = 0
        self._next_part = 0
        self._gamma: int | None = None
        self._schemas: dict[str, pl.Schema] = {}
        self._warned: set[str] = set()
        if isinstance(self._manifest.get("gamma"), int):
            self._gamma = self._manifest["gamma"]
        if resume:
            self._recover()

        self._batches: list[StepBatch] = []
        self._times: list[float | None] = []
        self._batch_keys: set[tuple[int, int]] = set()
        self.bytes_written = 0
        self._rows: dict[str, list[pl.DataFrame]] = {}
        self._oldest: float | None = None
        self._closed = False
        self._write_manifest()

    # -- state ---------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def manifest(self) -> dict[str, Any]:
        """A copy of the manifest as it will be written next."""
        return {**self._manifest, **self.counts}

    @property
    def counts(self) -> dict[str, int]:
        """What has been published so far (a resumed run counts its earlier parts too)."""
        return {
            "steps": self._steps,
            "request_steps": self._request_steps,
            "parts": self._parts,
            "dropped_steps": self._dropped,
        }

    @property
    def buffered_steps(self) -> int:
        return len(self._batches)

    def _existing_parts(self) -> dict[str, list[tuple[int, Path]]]:
        out = {}
        for d in self._path.iterdir():
            if d.is_dir():
                parts = list_parts(d)
                if parts:
                    out[d.name] = parts
        return out

    def _recover(self) -> None:
        """Pick up an earlier writer's parts: clean its debris, count what it published.

        The parts are verified before polars reads them, so that resuming a
        damaged run is refused with the damaged part's name instead of aborting.
        """
        for d in self._path.iterdir():
            if d.is_dir():
                for pattern in _TMP_GLOBS:
                    for tmp in d.glob(pattern):
                        tmp.unlink()
        for pattern in ("*/part-*.parquet.json.tmp", "*/.part-*.parquet.json.*.tmp"):
            for tmp in (self._path / CHECKSUMS).glob(pattern):
                tmp.unlink()
        steps_numbers = {n for n, _ in list_parts(self._path / STEPS)}
        for n, p in list_parts(self._path / REQUESTS):
            if n not in steps_numbers:  # its flush died before the steps part was published
                p.unlink()
        for record in (self._path / CHECKSUMS).glob("*/part-*.parquet.json"):
            if not (self._path / record.parent.name / record.name.removesuffix(".json")).is_file():
                record.unlink()  # its flush died before the part was published
        existing = self._existing_parts()
        if not existing:
            return
        verify_parts([p for parts in existing.values() for _, p in parts])
        for parts in existing.values():
            for _, part in parts:  # written before parts had records: adopted as they are
                if not checksum_path(part).exists():
                    self._adopt(part)
        numbers = {n for parts in existing.values() for n, _ in parts}
        self._next_part = max(numbers) + 1
        self._parts = len(numbers)

        def rows(table: str) -> int:
            files = [str(p) for _, p in existing.get(table, [])]
            if not files:
                return 0
            return int(pl.scan_parquet(files, glob=False).select(pl.len()).collect().item())

        self._steps = rows(STEPS)
        self._request_steps = rows(REQUESTS)
        if self._gamma is None and STEPS in existing:
            first = pl.read_parquet(existing[STEPS][0][1], columns=["gamma"], n_rows=1)
            if first.height:
                self._gamma = int(first["gamma"][0])
        for table, parts in existing.items():
            self._schemas[table] = pl.read_parquet_schema(parts[-1][1])

    @staticmethod
    def _adopt(part: Path) -> None:
        """Publish a checksum record for a part of an older run this writer resumes."""
        record, text = checksum_path(part), file_record(part)
        record.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(record, lambda f: f.write(text))

    def _write_manifest(self) -> None:
        manifest = {**self._manifest, **self.counts}
        try:
            text = json.dumps(manifest, indent=2) + "\n"
        except (TypeError, ValueError) as exc:
            raise RunStoreError(f"{self._path / MANIFEST}: manifest is not JSON: {exc}") from exc
        _write_atomic(self._path / MANIFEST, lambda f: f.write(text.encode("utf-8")))

    def _check_open(self) -> None:
        if self._closed:
            raise RunStoreError(f"{self._path}: writer is closed")

    def _due(self) -> bool:
        if len(self._batches) >= self._flush_steps:
            return True
        return self._oldest is not None and (time.monotonic() - self._oldest >= self._flush_seconds)

    # -- input ---------------------------------------------------------------------

    def append(self, batch: StepBatch, at: float | None = None) -> None:
        """Buffer one step (stored at Unix time `at`, where known: the steps table's `time`);
        refuses (buffer untouched) a batch whose columns disagree."""
        self._check_open()
        if not isinstance(batch, StepBatch):
            raise TypeError(f"expected StepBatch, got {type(batch).__name__}")
        where = f"step rank={batch.rank} forward_ct={batch.forward_ct}"
        if self._gamma is None:
            self._gamma = int(batch.gamma)
        elif batch.gamma != self._gamma:
            raise RunStoreError(f"{where}: gamma {batch.gamma} != run gamma {self._gamma}")
        n = batch.num_reqs
        if n and not batch.has_reqs:
            raise RunStoreError(f"{where}: has_reqs=False but {n} request rows")
        for name in REQUEST_COLUMNS:
            col = getattr(batch, name)
            if not isinstance(col, np.ndarray) or col.shape != (n,):
                raise RunStoreError(f"{where}: column {name} is not an array of shape ({n},)")
        for name in MATRIX_COLUMNS:
            mat = getattr(batch, name)
            shape = (n, batch.gamma)
            if mat is not None and (not isinstance(mat, np.ndarray) or mat.shape != shape):
                raise RunStoreError(f"{where}: column {name} is not None nor ({n}, {batch.gamma})")
        key = (int(batch.rank), int(batch.forward_ct))
        if key in self._batch_keys:
            # A part's steps must be unique by key to be regrouped on read; a repeat
            # (a re-sent record) goes to the next part instead of being refused.
            self.flush()
        self._batches.append(batch)
        self._times.append(at)
        self._batch_keys.add(key)
        if self._oldest is None:
            self._oldest = time.monotonic()
        if self._due():
            self.flush()

    def write_rows(self, table: str, df: pl.DataFrame) -> None:
        """Buffer rows for an extra table (e.g. `estimates`); published with the next flush."""
        self._check_open()
        check_table_name(table)
        if table in (STEPS, REQUESTS):
            raise RunStoreError(f"table {table!r} is written from StepBatches via append()")
        if not isinstance(df, pl.DataFrame):
            raise TypeError(f"expected polars DataFrame, got {type(df).__name__}")
        known = self._schemas.get(table)
        if known is None and self._rows.get(table):
            known = self._rows[table][0].schema
        if known is not None and df.schema != known:
            raise RunStoreError(
                f"{self._path / table}: rows do not match the table's schema {dict(known)}"
            )
        if df.height == 0:
            return
        self._rows.setdefault(table, []).append(df)
        if self._oldest is None:
            self._oldest = time.monotonic()
        if self._due():
            self.flush()

    # -- output --------------------------------------------------------------------

    def _convert(self) -> tuple[pl.DataFrame, pl.DataFrame, list[StepBatch]]:
        try:
            steps, reqs = batches_to_frames(self._batches, self._gamma, self._times)
            return steps, reqs, self._batches
        # not swallowed: the slow path below converts batch by batch to find, count and log
        # the culprits; converting the rest raises if anything still fails
        except Exception:  # nosec B110
            pass
        good: list[StepBatch] = []
        times: list[float | None] = []
        for b, at in zip(self._batches, self._times, strict=True):  # slow path: the culprits
            try:
                batches_to_frames([b], self._gamma)
            except Exception as exc:
                self._dropped += 1
                reason = f"{type(exc).__name__}: {exc}"
                if reason not in self._warned:
                    self._warned.add(reason)
                    log.warning(
                        "%s: dropping step rank=%s forward_ct=%s: %s",
                        self._path,
                        b.rank,
                        b.forward_ct,
                        reason,
                    )
            else:
                good.append(b)
                times.append(at)
        self._batches = good  # a retried flush must not count the culprits twice
        self._times = times
        steps, reqs = batches_to_frames(good, self._gamma, times)
        return steps, reqs, good

    def _write_part(self, table: str, number: int, df: pl.DataFrame) -> None:
        self.bytes_written += publish_part(self._path / table / part_name(number), df)

    def flush(self) -> None:
        """Publish everything buffered as one part per table.

        Order is what a crash mid-flush leaves: `requests`, then `steps` (the
        commit: a reader ignores a requests part without its steps part), then
        the extra tables. Extra rows (the estimator's `ceilings`) describe steps
        up to this flush, so published after the steps they never refer to a
        step a crash took; a crash after the steps part costs them alone.
        """
        if self._closed or (not self._batches and not self._rows):
            return
        number = self._next_part
        frames: list[tuple[str, pl.DataFrame]] = []
        written: list[StepBatch] = []
        if self._batches:
            steps, reqs, written = self._convert()
            if written:
                frames += [(REQUESTS, reqs), (STEPS, steps)]
        frames += [(table, pl.concat(dfs, how="vertical")) for table, dfs in self._rows.items()]
        # Buffers are cleared only once every table is published: a failed flush
        # (disk full) is retried whole, under the same part number.
        for table, df in frames:
            self._write_part(table, number, df)
            self._schemas.setdefault(table, df.schema)
        self._steps += len(written)
        self._request_steps += sum(b.num_reqs for b in written)
        if frames:
            self._parts += 1
            self._next_part += 1
        self._batches = []
        self._times = []
        self._batch_keys = set()
        self._rows = {}
        self._oldest = None

    def close(self, extra_manifest: Mapping[str, Any] | None = None) -> None:
        """Flush, then mark the run complete in run.json with its counts and `extra_manifest`."""
        if self._closed:
            return
        self.flush()
        if extra_manifest:
            self._manifest.update(extra_manifest)
        self._manifest["complete"] = True
        self._write_manifest()
        self._closed = True

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # Keep what was accepted, but do not claim the run is complete.
        try:
            self.flush()
        except Exception as flush_exc:
            exc.add_note(f"RunWriter could not flush {self._path}: {flush_exc!r}")
        try:
            self._write_manifest()
        except Exception as manifest_exc:
            exc.add_note(f"RunWriter could not update {self._path / MANIFEST}: {manifest_exc!r}")
        self._closed = True

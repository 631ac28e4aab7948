"""SGLang's own output files (`/server_info` dumps, the block-accept JSONL) into run directories.

Real deployments already produce these files; ingested, every consumer (`summary`,
`estimate`, `report`, notebooks) works on production data exactly as on a reference run.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from ..store.checksums import CHECKSUMS
from ..store.inventory import MANIFEST
from ..store.tables import REQUESTS, STEPS
from ..telemetry.server_info import WorkloadOf
from .block_accept import ingest_block_accept
from .follow import follow_file
from .kinds import BLOCK_ACCEPT, IngestError, not_ours, sniff
from .lines import DEFAULT_MAX_RECORD_BYTES
from .server_info import ingest_server_info

#: Tables an ingest writes besides steps and requests.
_EXTRA_TABLES = ("ceilings",)

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "IngestError", "follow_file", "ingest_files"]


def ingest_files(
    files: list[Path],
    out: Path,
    workload_of: WorkloadOf,
    *,
    assume: str | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> tuple[str, dict]:
    """Whole files of one kind into the new run `out`: (kind, the run's summary statistics).

    Every file's kind is told first, so that a wrong file refuses the whole command
    before anything is written.
    """
    if max_record_bytes < 1:
        raise IngestError("--max-record-bytes must be >= 1")
    kinds = {}
    for path in files:
        kind = sniff(path, max_record_bytes)
        if kind is None:
            raise not_ours(path)
        kinds[path] = kind
    if len(set(kinds.values())) > 1:
        raise IngestError("FILEs mix /server_info dumps and block-accept JSONL; ingest them apart")
    kind = next(iter(kinds.values()))
    ingest = ingest_block_accept if kind == BLOCK_ACCEPT else ingest_server_info
    stats = ingest(files, out, workload_of, assume, max_record_bytes)
    require_ingested(kind, stats, files, out)
    return kind, stats


def require_ingested(kind: str, stats: dict, files: list[Path], out: Path) -> None:
    """IngestError, and the run `out` removed, where `stats` says nothing was ingested: a
    run of no steps would read as a quiet server, not as input that was all refused."""
    if not stats.get("blocks" if kind == BLOCK_ACCEPT else "ingested_steps"):
        discard_run(out)
        bad = stats.get("bad_records") or stats.get("jsonl_counts") or {}
        raise IngestError(
            f"every record of {', '.join(map(str, files))} was rejected ({bad}); no run written"
        )


def discard_run(out: Path) -> None:
    """Remove the run `out` holds, and `out` if that leaves it empty; nothing else in it."""
    for name in (STEPS, REQUESTS, CHECKSUMS, *_EXTRA_TABLES):
        table = out / name
        if table.is_dir() and not table.is_symlink():
            shutil.rmtree(table)
    (out / MANIFEST).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out.rmdir()

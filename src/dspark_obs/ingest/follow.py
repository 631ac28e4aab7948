"""A file still being written, ingested as it grows until the caller says stop.

The kind is told from the first line; a `/server_info` file's run is created once its
first record names gamma. The run is flushed every few seconds, so a crash loses at
most that much, and closed cleanly when `stop` is set.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..telemetry.server_info import SGLangFormatError, WorkloadOf
from .block_accept import BlockAcceptIngest, str_workload_of
from .kinds import BLOCK_ACCEPT, IngestError, base_manifest, kind_of, not_ours
from .lines import JsonlFollower
from .server_info import ServerInfoIngest
from .server_info_reader import ServerInfoReader

POLL_SECONDS = 0.1
FLUSH_SECONDS = 2.0


def follow_file(
    path: Path,
    out: Path,
    workload_of: WorkloadOf,
    assume: str | None,
    max_bytes: int,
    stop: threading.Event,
) -> tuple[str, dict] | None:
    """Ingest `path` as it grows until `stop` is set: (kind, the run's summary statistics),
    or None when nothing was ingested and no run was written."""
    follower = JsonlFollower(path, max_bytes)
    ingest: ServerInfoIngest | BlockAcceptIngest | None = None
    reader: ServerInfoReader | None = None
    kind = None
    last_flush = time.monotonic()
    try:
        while not stop.is_set():
            lines = follower.read_lines()
            for line in lines:
                if kind is None:
                    try:
                        kind = kind_of(line)
                    except SGLangFormatError as exc:
                        raise IngestError(f"{path}: {exc}") from None
                    if kind is None:
                        raise not_ours(path)
                    if kind == BLOCK_ACCEPT:
                        ingest = BlockAcceptIngest(
                            out, base_manifest([path], kind, assume), str_workload_of(workload_of)
                        )
                    else:
                        reader = ServerInfoReader(workload_of)
                if kind == BLOCK_ACCEPT:
                    ingest.lines.append(line)
                    continue
                if not reader.add_document(line):
                    continue
                if ingest is None and reader.gamma is not None:
                    ingest = ServerInfoIngest(
                        out, base_manifest([path], kind, assume), reader, assume
                    )
                if ingest is not None:
                    ingest.drain()
            if ingest is not None and time.monotonic() - last_flush >= FLUSH_SECONDS:
                ingest.flush()
                last_flush = time.monotonic()
            if not lines:
                stop.wait(POLL_SECONDS)
    finally:
        follower.close()
    if ingest is None:
        return None
    extra = {"rotations": follower.rotations, "lost_partial_lines": follower.lost_partial_lines}
    if isinstance(ingest, BlockAcceptIngest):
        ingest.oversized += follower.oversized_lines
    elif follower.oversized_lines:
        reader.bad["oversized"] += follower.oversized_lines
    return kind, ingest.close(extra)

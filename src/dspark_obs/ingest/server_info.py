"""`/server_info` dumps into a run directory: every new step through one pipeline.

Damage inside a good file (a record that does not decode, a step that breaks the
telemetry model) is counted by reason and skipped; only a file with nothing usable
in it is refused, before the run directory exists.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..pipeline import build_pipeline
from ..store import RunWriter
from ..telemetry.server_info import WorkloadOf
from .kinds import SERVER_INFO, SOURCE, IngestError, base_manifest, not_ours
from .lines import read_json_documents
from .server_info_reader import ServerInfoReader, has_timing


class ServerInfoIngest:
    """The pipeline side of a server_info ingest, shared by whole files and a followed one."""

    def __init__(self, out: Path, manifest: dict, reader: ServerInfoReader, assume: str | None):
        self.reader = reader
        gamma = reader.gamma
        self.manifest = {
            **manifest,
            "gamma": gamma,
            "mode": reader.mode,
            "components": sorted(reader.components),
        }
        self.pipeline = build_pipeline(
            gamma,
            writer=RunWriter(out, self.manifest),
            assume_greedy=None if assume is None else assume == "greedy",
            publish=False,
        )
        self.timing = False
        self.workloads: set[str] = set()
        self.steps = 0
        self.request_steps = 0

    def drain(self) -> None:
        for batch in self.reader.take_batches():
            if self.pipeline.ingest(batch, SOURCE):
                self.steps += 1
                self.request_steps += batch.num_reqs
                self.timing = self.timing or has_timing(batch)
                if batch.num_reqs:
                    self.workloads.update(batch.workload.tolist())

    def flush(self) -> None:
        if self.pipeline.writer is not None:
            self.pipeline.writer.flush()

    def bad_records(self) -> dict[str, int]:
        bad = Counter(self.reader.bad)
        errors = self.pipeline.stats.snapshot().errors
        for (_, reason), n in errors.items():
            bad[reason] += n
        return dict(sorted(bad.items()))

    def close(self, extra: dict | None = None) -> dict:
        """Close the run; what it holds and what was skipped, as recorded in its manifest."""
        dropped = self.reader.dropped
        stats = {
            **(extra or {}),
            "timing": "measured" if self.timing else None,
            "workloads": sorted(self.workloads),
            "snapshots": self.reader.snapshots,
            "ranks": sorted(self.reader.ranks_with_records),
            "missing_steps": sum(dropped.values()),
            "missing_steps_by_rank": {str(r): n for r, n in sorted(dropped.items())},
            "duplicates_skipped": self.reader.dedup.duplicates,
            "forward_ct_jumps": self.reader.dedup.jumps(),
            "bad_records": self.bad_records(),
            "ingested_steps": self.steps,
            "ingested_request_steps": self.request_steps,
        }
        self.pipeline.close(stats)
        return stats


def ingest_server_info(
    files: list[Path], out: Path, workload_of: WorkloadOf, assume: str | None, max_bytes: int
) -> dict:
    """Every file read and checked first, then the run written; its summary statistics."""
    reader = ServerInfoReader(workload_of)
    for path in files:
        documents, oversized = read_json_documents(path, max_bytes)
        reader.bad["oversized"] += oversized
        before = dict(reader.problems)
        good = sum(reader.add_document(document) for document in documents)
        del documents
        if not good:
            if oversized:
                raise IngestError(
                    f"{path}: every record is over --max-record-bytes ({max_bytes:,})"
                )
            found = {r: m for r, m in reader.problems.items() if r not in before}
            if set(found) <= _NOT_OURS:
                raise not_ours(path)
            raise IngestError(f"{path}: no usable /server_info snapshot: {_say(found)}")
    reader.bad = +reader.bad
    if reader.gamma is None:
        found = {r: m for r, m in reader.problems.items() if r not in _NOT_OURS}
        raise IngestError(
            "no rank in the given files holds a usable dspark_info_record"
            + (f": {_say(found)}" if found else " (is SGLANG_DSPARK_DEBUG_DUMP set on the server?)")
        )
    ingest = ServerInfoIngest(out, base_manifest(files, SERVER_INFO, assume), reader, assume)
    ingest.drain()
    return ingest.close()


#: What a file that holds no `/server_info` snapshot at all is refused for (`not_ours`).
_NOT_OURS = frozenset(("bad_snapshot_line", "not_a_snapshot"))


def _say(problems: dict[str, str]) -> str:
    return "; ".join(f"{message} ({reason})" for reason, message in problems.items())

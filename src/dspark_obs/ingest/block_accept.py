"""SGLang's block-accept JSONL into a run directory of walked ceilings.

The file carries no per-step telemetry, only the sampled walk's evidence: each
trimmed block and the target's log-probabilities of its tail as later rows revealed
them. The run holds one `ceilings` row per block, in the online estimator's columns
and vocabulary, so `estimate` and `report` read it like any other run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from ..estimator.block_accept_walk import summarize_by_workload, walk_blocks
from ..store import RunWriter
from ..telemetry.block_accept_log import read_block_accept_jsonl
from ..telemetry.server_info import WorkloadOf
from .kinds import BLOCK_ACCEPT, IngestError, base_manifest
from .lines import iter_lines

CEILING_SCHEMA = {
    "rank": pl.Int64,
    "forward_ct": pl.Int64,
    "rid": pl.String,
    "workload": pl.String,
    "mode": pl.String,
    "method": pl.String,
    "status": pl.String,
    "window": pl.Int64,
    "lo": pl.Float64,
    "point": pl.Float64,
    "hi": pl.Float64,
    "var": pl.Float64,
    "resolved_at": pl.Int64,
}
#: The walk's statuses in the online estimator's vocabulary (an open block is censored).
_STATUS = {"resolved": "resolved", "eos": "eos", "open": "censored"}


def _ceiling_rows(blocks: dict, log, keep: np.ndarray) -> pl.DataFrame:
    """Walked blocks as `ceilings` rows, the online estimator's columns and vocabulary."""
    n = len(blocks["block_fct"])
    resolved_at = np.full(n, -1, dtype=np.int64)
    if len(log.entry_block):
        b = log.entry_block
        walked = log.entry_offset <= log.block_window[b] + blocks["walked"][b]
        np.maximum.at(resolved_at, b[walked], log.entry_fct[walked])
    status = blocks["status"]
    resolved_at = np.where(status == "resolved", resolved_at, -1)
    df = pl.DataFrame(
        {
            "rank": np.zeros(n, dtype=np.int64),
            "forward_ct": blocks["block_fct"].astype(np.int64),
            "rid": blocks["rid"].astype(str),
            "workload": blocks["workload"].astype(str),
            "mode": np.full(n, "compact"),
            "method": np.full(n, "sampled"),
            "status": np.array([_STATUS[s] for s in status.tolist()], dtype=str),
            "window": blocks["window"].astype(np.int64),
            "lo": blocks["lo"],
            "point": blocks["point"],
            "hi": blocks["hi"],
            "var": blocks["var"],
            "resolved_at": resolved_at,
        },
        schema=CEILING_SCHEMA,
    ).with_columns(pl.when(pl.col("resolved_at") >= 0).then(pl.col("resolved_at")))
    return df.filter(pl.Series(keep))


def str_workload_of(rule: WorkloadOf) -> Callable[[str], str]:
    """A rid-array workload rule as the walk takes it: one rid at a time."""
    return lambda rid: str(rule(np.array([rid], dtype=object))[0])


class BlockAcceptIngest:
    """Blocks resolve lines after they open, so the walk is redone over all lines so far.

    While following, only blocks whose outcome can no longer change (resolved,
    or closed by eos) are written; the rest wait for the end, where the walk
    censors them as SGLang does when it drains. Each block is written once.
    """

    def __init__(self, out: Path, manifest: dict, str_workload_of: Callable[[str], str]) -> None:
        self.out = out
        self.manifest = {**manifest, "mode": "compact"}
        self.workload_of = str_workload_of
        self.lines: list[bytes] = []
        self.oversized = 0  # lines over --max-record-bytes, skipped unread
        self.written: set[tuple[str, int]] = set()
        self.writer: RunWriter | None = None

    def walk(self):
        """The walk over every line so far; contradictory gammas are an IngestError."""
        log = read_block_accept_jsonl(self.lines)
        try:
            blocks = walk_blocks(log, workload_of=self.workload_of)
        except ValueError as exc:
            raise IngestError(str(exc)) from None
        return log, blocks

    def _gamma(self, log) -> int | None:
        implied = np.unique(log.block_window + np.diff(log.tail_indptr))
        return int(implied[0]) if len(implied) else None

    def _write(self, log, blocks, final: bool) -> None:
        keys = list(zip(blocks["rid"].tolist(), blocks["block_fct"].tolist(), strict=True))
        new = np.array([k not in self.written for k in keys], dtype=bool)
        if not final:
            new &= blocks["status"] != "open"
        if not new.any():
            return
        if self.writer is None:
            self.writer = RunWriter(self.out, {**self.manifest, "gamma": self._gamma(log)})
        self.writer.write_rows("ceilings", _ceiling_rows(blocks, log, new))
        self.written.update(k for k, keep in zip(keys, new.tolist(), strict=True) if keep)

    def flush(self) -> None:
        if self.lines:
            log, blocks = self.walk()
            self._write(log, blocks, final=False)
        if self.writer is not None:
            self.writer.flush()

    def close(self, extra: dict | None = None) -> dict:
        """Write what is left and close the run; its summary, as recorded in its manifest."""
        log, blocks = self.walk()
        self._write(log, blocks, final=True)
        summary = summarize_by_workload(blocks, log=log) if len(blocks["block_fct"]) else {}
        stats = {
            **(extra or {}),
            "gamma": self._gamma(log),
            "timing": None,
            "workloads": sorted(summary),
            "blocks": len(blocks["block_fct"]),
            "block_status": dict(Counter(_STATUS[s] for s in blocks["status"].tolist())),
            "jsonl_counts": log.counts,
            "bad_records": {
                k: v for k, v in (("bad_lines", log.bad_lines), ("oversized", self.oversized)) if v
            },
            "duplicates_skipped": log.duplicate_rows,
            "ceiling_summary": {
                wl: {k: s.get(k) for k in ("blocks", "mean_lo", "mean_point", "mean_hi")}
                for wl, s in summary.items()
            },
        }
        if self.writer is None:
            self.writer = RunWriter(self.out, {**self.manifest, "gamma": stats["gamma"]})
        self.writer.close(stats)
        return stats


def ingest_block_accept(
    files: list[Path], out: Path, workload_of: WorkloadOf, assume: str | None, max_bytes: int
) -> dict:
    """Every line read (over-long ones counted), the gammas checked, then the run written."""
    ingest = BlockAcceptIngest(
        out, base_manifest(files, BLOCK_ACCEPT, assume), str_workload_of(workload_of)
    )
    for path in files:
        try:
            with path.open("rb") as fh:
                for line in iter_lines(fh, max_bytes):
                    if line is None:
                        ingest.oversized += 1
                    else:
                        ingest.lines.append(line)
        except OSError as exc:
            raise IngestError(f"{path}: cannot read: {exc.strerror or exc}") from None
    ingest.walk()  # refuse contradictory gammas before creating the run
    return ingest.close()

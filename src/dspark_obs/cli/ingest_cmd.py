"""`dspark-obs ingest FILE...`: turn SGLang's own output files into a run directory.

Real deployments already produce two kinds of files: `/server_info` dumps (one
answer, or a polling loop's JSONL of answers) and the block-accept estimator's
JSONL. Ingesting them into the run store lets every consumer (`summary`,
`estimate`, notebooks) work on production data exactly as on a reference run.
Everything that can make the whole input unusable is checked before the run
directory is created, so a typo never leaves a half-made run behind; damage
inside a good file is counted and skipped instead.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import numpy as np
import polars as pl

from ..aggregates import Aggregates
from ..estimator.block_accept_walk import summarize_by_workload, walk_blocks
from ..estimator.online import CeilingEstimator
from ..ingest.files import (
    BLOCK_ACCEPT,
    DEFAULT_MAX_RECORD_BYTES,
    SERVER_INFO,
    JsonlFollower,
    ServerInfoReader,
    detect_kind,
    has_timing,
    iter_lines,
    read_json_objects,
)
from ..pipeline import Pipeline
from ..sources.workloads import workload_rule
from ..store import RunWriter
from ..store.provenance import versions
from ..telemetry.block_accept_log import read_block_accept_jsonl
from ..telemetry.server_info import SGLangFormatError
from .errors import CliError

SOURCE = "ingest"
FOLLOW_POLL_SECONDS = 0.1
FOLLOW_FLUSH_SECONDS = 2.0

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


def _sniff(path: Path, max_bytes: int) -> str | None:
    """The file's kind from its first line, or from the whole file if that is one document.

    Lines over `max_bytes` are skipped unread, and the whole file is only
    decoded when it fits the limit: sniffing never holds more than that.
    """
    first = b""
    oversized = False
    try:
        with path.open("rb") as fh:
            for line in iter_lines(fh, max_bytes):
                if line is None:
                    oversized = True
                elif line.strip():
                    first = line
                    break
        size = path.stat().st_size
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not first:
        if oversized:
            raise CliError(f"{path}: every line is over --max-record-bytes ({max_bytes:,})")
        raise CliError(f"{path}: empty file")
    try:
        return detect_kind(msgspec.json.decode(first))
    except msgspec.DecodeError:
        pass
    if size > max_bytes:
        return None
    try:
        return detect_kind(msgspec.json.decode(path.read_bytes()))
    except (msgspec.DecodeError, OSError):
        return None


def _not_ours(path: Path) -> CliError:
    return CliError(
        f"{path}: neither a SGLang /server_info dump (a JSON object with 'internal_states', "
        "or JSONL of them) nor a block-accept JSONL (objects with fct/w/cl or eos_end)"
    )


def _base_manifest(files: list[Path], kind: str, assume: str | None) -> dict:
    return {
        "format": 1,
        "source": SOURCE,
        "input_kind": kind,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "files": [str(f) for f in files],
        "assume": assume,
        "shadow": None,
    }


# -- /server_info dumps --------------------------------------------------------------


class _ServerInfoIngest:
    """The pipeline side of a server_info ingest, shared by the batch and follow paths."""

    def __init__(self, out: Path, manifest: dict, reader: ServerInfoReader, assume: str | None):
        self.reader = reader
        gamma = reader.gamma
        self.manifest = {
            **manifest,
            "gamma": gamma,
            "mode": reader.mode,
            "components": sorted(reader.components),
        }
        assume_greedy = None if assume is None else assume == "greedy"
        self.pipeline = Pipeline(
            Aggregates(gamma),
            RunWriter(out, self.manifest),
            estimator=CeilingEstimator(gamma, assume_greedy=assume_greedy),
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
        _, errors, _ = self.pipeline.stats.snapshot()
        for (_, reason), n in errors.items():
            bad[reason] += n
        return dict(sorted(bad.items()))

    def close(self, extra: dict | None = None) -> dict:
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
            "bad_records": self.bad_records(),
            "ingested_steps": self.steps,
            "ingested_request_steps": self.request_steps,
        }
        self.pipeline.close(stats)
        return stats


def _print_server_info(out: Path, stats: dict) -> None:
    bad = stats["bad_records"]
    print(f"ingested {out}")
    print(
        f"  steps {stats['ingested_steps']:,}  request-steps {stats['ingested_request_steps']:,}"
        f"  ranks {len(stats['ranks'])}  snapshots {stats['snapshots']:,}"
    )
    print(
        f"  duplicates skipped {stats['duplicates_skipped']:,}"
        f"  missing steps (gaps) {stats['missing_steps']:,}"
        f"  bad records {sum(bad.values()):,}"
        + (f" ({', '.join(f'{k} {v}' for k, v in bad.items())})" if bad else "")
    )
    print(f"  workloads {', '.join(stats['workloads']) or '-'}  timing {stats['timing']}")


def _ingest_server_info(args, files: list[Path], workload_of) -> int:
    reader = ServerInfoReader(workload_of)
    # Everything is read and checked first: a wrong file must not leave a run behind.
    for path in files:
        values, bad_lines, oversized = read_json_objects(path, args.max_record_bytes)
        reader.bad["bad_snapshot_line"] += bad_lines
        reader.bad["oversized"] += oversized
        good = 0
        for value in values:
            if detect_kind(value) != SERVER_INFO:
                reader.bad["not_a_snapshot"] += 1
                continue
            try:
                reader.add_snapshot(value)
            except SGLangFormatError:
                reader.bad["not_a_snapshot"] += 1
                continue
            good += 1
        if not good:
            if oversized and not values:
                raise CliError(
                    f"{path}: every record is over --max-record-bytes ({args.max_record_bytes:,})"
                )
            raise _not_ours(path)
    reader.bad = +reader.bad
    if reader.gamma is None:
        raise CliError(
            "no rank in the given files holds a dspark_info_record "
            "(is SGLANG_DSPARK_DEBUG_DUMP set on the server?)"
        )
    ingest = _ServerInfoIngest(
        args.out, _base_manifest(files, SERVER_INFO, args.assume), reader, args.assume
    )
    ingest.drain()
    _print_server_info(args.out, ingest.close())
    return 0


# -- block-accept JSONL --------------------------------------------------------------


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


class _BlockAcceptIngest:
    """Blocks resolve lines after they open, so the walk is redone over all lines so far.

    While following, only blocks whose outcome can no longer change (resolved,
    or closed by eos) are written; the rest wait for the end, where the walk
    censors them as SGLang does when it drains. Each block is written once.
    """

    def __init__(self, out: Path, manifest: dict, str_workload_of) -> None:
        self.out = out
        self.manifest = {**manifest, "mode": "compact"}
        self.workload_of = str_workload_of
        self.lines: list[bytes] = []
        self.oversized = 0  # lines over --max-record-bytes, skipped unread
        self.written: set[tuple[str, int]] = set()
        self.writer: RunWriter | None = None

    def _walk(self):
        log = read_block_accept_jsonl(self.lines)
        try:
            blocks = walk_blocks(log, workload_of=self.workload_of)
        except ValueError as exc:
            raise CliError(str(exc)) from None
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
            log, blocks = self._walk()
            self._write(log, blocks, final=False)
        if self.writer is not None:
            self.writer.flush()

    def close(self, extra: dict | None = None) -> dict:
        log, blocks = self._walk()
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


def _print_block_accept(out: Path, stats: dict) -> None:
    c = stats["jsonl_counts"]
    print(f"ingested {out}")
    print(
        f"  blocks {stats['blocks']:,}  rows {c['rows']:,}  duplicates skipped "
        f"{stats['duplicates_skipped']:,}  bad lines {c['bad_lines']:,}  gamma {stats['gamma']}"
    )
    for wl, s in stats["ceiling_summary"].items():
        if s["blocks"]:
            print(
                f"  {wl}: blocks {s['blocks']:,}  lo {s['mean_lo']:.3f}  "
                f"point {s['mean_point']:.3f}  hi {s['mean_hi']:.3f}"
            )


def _str_workload_of(rule):
    return lambda rid: str(rule(np.array([rid], dtype=object))[0])


def _ingest_block_accept(args, files: list[Path], workload_of) -> int:
    ingest = _BlockAcceptIngest(
        args.out, _base_manifest(files, BLOCK_ACCEPT, args.assume), _str_workload_of(workload_of)
    )
    for path in files:
        try:
            with path.open("rb") as fh:
                for line in iter_lines(fh, args.max_record_bytes):
                    if line is None:
                        ingest.oversized += 1
                    else:
                        ingest.lines.append(line)
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    ingest._walk()  # refuse contradictory gammas before creating the run
    _print_block_accept(args.out, ingest.close())
    return 0


# -- follow ------------------------------------------------------------------------


def _follow(args, path: Path, workload_of) -> int:
    """Read `path` as it grows until SIGINT/SIGTERM, then close the run cleanly."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())
    follower = JsonlFollower(path, args.max_record_bytes)
    ingest: _ServerInfoIngest | _BlockAcceptIngest | None = None
    reader: ServerInfoReader | None = None
    kind = None
    last_flush = time.monotonic()
    try:
        while not stop.is_set():
            lines = follower.read_lines()
            for line in lines:
                if kind is None:
                    try:
                        kind = detect_kind(msgspec.json.decode(line))
                    except msgspec.DecodeError:
                        kind = None
                    if kind is None:
                        raise _not_ours(path)
                    if kind == BLOCK_ACCEPT:
                        ingest = _BlockAcceptIngest(
                            args.out,
                            _base_manifest([path], kind, args.assume),
                            _str_workload_of(workload_of),
                        )
                    else:
                        reader = ServerInfoReader(workload_of)
                if kind == BLOCK_ACCEPT:
                    ingest.lines.append(line)
                    continue
                try:
                    reader.add_snapshot(msgspec.json.decode(line))
                except (msgspec.DecodeError, SGLangFormatError):
                    reader.bad["bad_snapshot_line"] += 1
                    continue
                if ingest is None and reader.gamma is not None:
                    ingest = _ServerInfoIngest(
                        args.out, _base_manifest([path], kind, args.assume), reader, args.assume
                    )
                if ingest is not None:
                    ingest.drain()
            if ingest is not None and time.monotonic() - last_flush >= FOLLOW_FLUSH_SECONDS:
                ingest.flush()
                last_flush = time.monotonic()
            if not lines:
                stop.wait(FOLLOW_POLL_SECONDS)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        follower.close()
    if ingest is None:
        print(f"nothing ingested from {path}; no run written")
        return 0
    extra = {"rotations": follower.rotations, "lost_partial_lines": follower.lost_partial_lines}
    if isinstance(ingest, _BlockAcceptIngest):
        ingest.oversized += follower.oversized_lines
    elif follower.oversized_lines:
        reader.bad["oversized"] += follower.oversized_lines
    if isinstance(ingest, _BlockAcceptIngest):
        _print_block_accept(args.out, ingest.close(extra))
    else:
        _print_server_info(args.out, ingest.close(extra))
    return 0


# -- entry -------------------------------------------------------------------------


def handle(args: argparse.Namespace) -> int:
    if args.max_record_bytes < 1:
        raise CliError("--max-record-bytes must be >= 1")
    if (args.out / "run.json").exists():
        raise CliError(f"{args.out} already holds a run; choose another --out")
    if args.workload_from_rid is not None or args.workload_file is not None:
        workload_of = workload_rule(args.workload_from_rid, args.workload_file)
    else:
        workload_of = workload_rule()
    files: list[Path] = args.files
    if args.follow:
        if len(files) != 1:
            raise CliError("--follow reads exactly one FILE")
        if not files[0].exists():
            raise CliError(f"{files[0]}: no such file")
        return _follow(args, files[0], workload_of)
    kinds = {}
    for path in files:
        kind = _sniff(path, args.max_record_bytes)
        if kind is None:
            raise _not_ours(path)
        kinds[path] = kind
    if len(set(kinds.values())) > 1:
        raise CliError("FILEs mix /server_info dumps and block-accept JSONL; ingest them apart")
    if next(iter(kinds.values())) == BLOCK_ACCEPT:
        return _ingest_block_accept(args, files, workload_of)
    return _ingest_server_info(args, files, workload_of)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="ingest SGLang /server_info dumps or block-accept JSONL into a run directory",
        description="Read SGLang DSpark output files (GET /server_info answers, one per "
        "file or one per line; or the block-accept estimator's JSONL), de-duplicate, "
        "and write a run directory (Parquet + run.json).",
    )
    p.add_argument("files", type=Path, nargs="+", metavar="FILE")
    p.add_argument("--out", type=Path, required=True, help="run directory to create")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--workload-from-rid",
        metavar="REGEX",
        default=None,
        help="workload from the rid: a regex with a named group (?P<workload>...)",
    )
    g.add_argument(
        "--workload-file",
        type=Path,
        metavar="F",
        default=None,
        help='JSONL side file of {"rid": ..., "workload": ...} lines',
    )
    p.add_argument(
        "--assume",
        choices=("greedy", "sampled"),
        default=None,
        help="how the requests sampled (SGLang dumps do not say); greedy lets the "
        "estimator walk trimmed tails exactly (default: unknown, tails are skipped)",
    )
    p.add_argument(
        "--max-record-bytes",
        type=int,
        default=DEFAULT_MAX_RECORD_BYTES,
        metavar="N",
        help="skip (and count as 'oversized') any line, or single-document file, over N bytes "
        f"(default {DEFAULT_MAX_RECORD_BYTES:,} = 256 MiB)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep reading the one FILE as it grows (rotation-safe) until Ctrl-C/SIGTERM",
    )
    p.set_defaults(handler=handle)

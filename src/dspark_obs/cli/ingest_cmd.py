"""`dspark-obs ingest FILE...`: turn SGLang's own output files into a run directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..ingest import DEFAULT_MAX_RECORD_BYTES, follow_file, ingest_files, require_ingested
from ..ingest.kinds import BLOCK_ACCEPT
from ..sources.workloads import workload_rule
from ..store import check_new_run_dir
from .errors import CliError
from .signals import stop_on_signals
from .views import timing_text


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
        + (
            f" (and {stats['forward_ct_jumps']:,} step-counter jumps, not counted as gaps)"
            if stats.get("forward_ct_jumps")
            else ""
        )
        + f"  bad records {sum(bad.values()):,}"
        + (f" ({', '.join(f'{k} {v}' for k, v in bad.items())})" if bad else "")
    )
    print(
        f"  workloads {', '.join(stats['workloads']) or '-'}  timing {timing_text(stats['timing'])}"
    )


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


def handle(args: argparse.Namespace) -> int:
    if args.max_record_bytes < 1:
        raise CliError("--max-record-bytes must be >= 1")
    check_new_run_dir(args.out)
    workload_of = workload_rule(args.workload_from_rid, args.workload_file)
    files: list[Path] = args.files
    if args.follow:
        if len(files) != 1:
            raise CliError("--follow reads exactly one FILE")
        if not files[0].exists():
            raise CliError(f"{files[0]}: no such file")
        stop = stop_on_signals()
        done = follow_file(
            files[0], args.out, workload_of, args.assume, args.max_record_bytes, stop
        )
        if done is None:  # as a file in which nothing is usable: exit 2
            raise CliError(f"nothing ingested from {files[0]} before the stop; no run written")
        kind, stats = done
        require_ingested(kind, stats, files, args.out)
    else:
        kind, stats = ingest_files(
            files,
            args.out,
            workload_of,
            assume=args.assume,
            max_record_bytes=args.max_record_bytes,
        )
    (_print_block_accept if kind == BLOCK_ACCEPT else _print_server_info)(args.out, stats)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Read SGLang DSpark output files (GET /server_info answers, one per file or one per "
        "line; or the block-accept estimator's JSONL), de-duplicate, and write a run "
        "directory (Parquet + run.json)."
    )
    p.add_argument("files", type=Path, nargs="+", metavar="FILE")
    p.add_argument("--out", type=Path, required=True, help="run directory to create")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--workload-from-rid",
        metavar="REGEX",
        default=None,
        help="workload from the rid: a regex with a named group (?P<workload>...) "
        "(default: NAME-N rids, e.g. gsm8k-17, name it; other rids count as other)",
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

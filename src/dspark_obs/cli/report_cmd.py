"""`dspark-obs report RUN_DIR... --out DIR`: the article's figures and tables from any run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from ..report import build_report
from ..report.document import print_sections
from ..store.fleet import FleetMismatchError, parse_group_keys
from ..terminal import make_console
from .engine_args import add_engine_arguments, name_unread, on_ray, ray_engine
from .errors import CliError
from .fleet_args import add_group_argument
from .store_args import add_time_range_arguments, run_dirs_of


def handle(args: argparse.Namespace) -> int:
    with run_dirs_of(args.run_dirs, args) as args.run_dirs:
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise CliError("--top must be >= 1")
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out}: exists and is not a directory")
    by = parse_group_keys(args.by)
    if by and args.arms:
        raise CliError("--by breaks a fleet down; --arms keeps the runs apart: give one of them")
    start = time.perf_counter()
    status = Console(stderr=True)
    options = {"top": args.top, "arms": args.arms, "by": by}
    if on_ray(args):
        if args.arms:
            raise CliError("--arms compares runs side by side in this process; drop --engine ray")
        options.update(engine=ray_engine(args), strict=args.strict)
    try:
        if args.quiet:
            report = build_report(args.run_dirs, args.out, **options)
        else:
            with status.status("reading runs") as spinner:
                report = build_report(args.run_dirs, args.out, progress=spinner.update, **options)
    except FleetMismatchError as exc:
        raise CliError(f"{exc}; --arms compares the runs side by side instead") from exc
    for arm in report.arms:
        name_unread(args, arm.unread, len(arm.unread) + len(arm.fleet.paths if arm.fleet else []))
    console = make_console()
    print_sections(console, report.sections, every_table=args.tables)
    figures = sum(len(s.figures) for s in report.sections)
    tables = sum(len(s.tables) for s in report.sections)
    console.print(
        f"[bold]wrote[/bold] {report.html} (self-contained), {report.markdown} ({tables} "
        f"tables{'' if args.tables else '; --tables prints them here'}), {report.json} and "
        f"{figures} PNGs in {time.perf_counter() - start:.1f} s"
    )
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Analyse run directories (from run, serve or ingest) and write a "
        "self-contained report.html (images embedded), one PNG per figure, summary.md and "
        "report.json: per-workload windows and ceilings, verify-window distributions, load "
        "curves, calibration, the step-cost model, the ceiling estimator and the requests "
        "that lost most to trimming. Several RUN_DIRs (or a directory of run directories) are "
        "one fleet, merged as summary, calibration and estimate merge them (same gamma and "
        "verify mode, else refused); --arms instead compares the runs side by side."
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", type=Path, required=True, help="output directory (created)")
    p.add_argument("--top", type=int, default=10, help="requests in the drill-down (default 10)")
    add_group_argument(
        p,
        help="a fleet's figures also per group of node, rank and/or mode, comma-separated "
        "(e.g. node,rank); mode lets runs of different verify modes be merged",
    )
    p.add_argument(
        "--arms",
        action="store_true",
        help="each run its own arm, overlaid where the axes are shared (a comparison of "
        "runs of any mode or gamma), instead of one fleet",
    )
    p.add_argument("--quiet", action="store_true", help="no progress spinner")
    p.add_argument(
        "--tables",
        action="store_true",
        help="print every table of summary.md to the terminal (default: the cost of "
        "trimming, the per-workload table and what is missing)",
    )
    add_time_range_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(handler=handle)

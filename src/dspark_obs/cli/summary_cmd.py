"""`dspark-obs summary RUN_DIR...`: the per-workload table of a stored run, or of a fleet."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.summary import summarize_fleet, summarize_run_dir
from ..store import Run, open_run
from ..store.fleet import expand_run_dirs, open_fleet, parse_group_keys, single_run
from ..store.production import is_store
from ..store.sql_script import duckdb_summary_script
from ..whatif.trim_cost import trim_cost_or_none
from .engine_args import add_engine_arguments, on_ray, ray_result
from .errors import CliError
from .fleet_args import add_group_argument
from .output import add_output_arguments
from .store_args import add_time_range_arguments, run_dirs_of
from .views import print_summary


def with_trim_cost(summary: dict, run: Run) -> dict:
    """The summary `summary` and `run` print alike: the table and the cost of trimming."""
    summary["trim_cost"] = trim_cost_or_none(run)
    return summary


def handle(args: argparse.Namespace) -> int:
    if args.sql and any(map(is_store, args.run_dirs)):
        raise CliError("--sql reads run directories' Parquet parts, not a store's range")
    with run_dirs_of(args.run_dirs, args) as args.run_dirs:
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    by = parse_group_keys(args.by)
    if args.sql:
        print(duckdb_summary_script(expand_run_dirs(args.run_dirs)), end="")
        return 0
    if on_ray(args):
        from ..engine.jobs import summary_job

        summary = ray_result(args, summary_job, args.run_dirs, by)
        print_summary(summary, as_json=args.json, as_csv=args.csv)
        return 0
    if single_run(args.run_dirs, by):
        run_dir = args.run_dirs[0]
        summary = summarize_run_dir(run_dir)  # refuses a run with no request-steps
        print_summary(
            with_trim_cost(summary, open_run(run_dir)), as_json=args.json, as_csv=args.csv
        )
        return 0
    print_summary(
        summarize_fleet(open_fleet(args.run_dirs, by), by), as_json=args.json, as_csv=args.csv
    )
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Per workload and overall: steps, request-steps, mean window, accepted, committed and "
        "ceiling, utilisation, verify tokens, throughput. Several RUN_DIRs (or a directory "
        "of run directories) are summarised as one fleet."
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    add_output_arguments(
        p,
        "one JSON object with a 'workloads' map",
        "one CSV row per workload, overall and group (the JSON entries' keys as columns)",
    )
    add_group_argument(p)
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the per-workload summary as a DuckDB script over the runs' Parquet "
        "parts instead of computing it",
    )
    add_time_range_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(handler=handle)

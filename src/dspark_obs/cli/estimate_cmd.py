"""`dspark-obs estimate`: the ceiling estimators against the truth, per workload."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import strict_json
from ..estimator.evaluate import evaluate
from ..estimator.file_estimates import block_accept_estimates
from ..estimator.fleet import fleet_evaluate
from ..store import open_run
from ..store.fleet import open_fleet, parse_group_keys, single_run
from ..strict_json import clean_json
from .engine_args import add_engine_arguments, on_ray, ray_result
from .errors import CliError
from .fleet_args import add_group_argument
from .output import add_output_arguments, print_csv
from .store_args import add_time_range_arguments, run_dirs_of
from .views import estimate_records, print_block_accept_estimates, print_estimates


def handle(args: argparse.Namespace) -> int:
    with run_dirs_of(args.run_dirs, args) as args.run_dirs:
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    if args.sglang_jsonl is not None:
        report = clean_json(block_accept_estimates(args.sglang_jsonl, args.gamma))
        if args.csv:
            raise CliError("--csv gives a run's estimates; for --sglang-jsonl use --json")
        if args.json:
            print(strict_json.dumps(report, indent=2))
        else:
            print_block_accept_estimates(report)
        return 0
    if not args.run_dirs:
        raise CliError("give a RUN_DIR or --sglang-jsonl FILE")
    by = parse_group_keys(args.by)
    if on_ray(args):
        from ..engine.jobs import estimate_job

        report = clean_json(ray_result(args, estimate_job, args.run_dirs, by))
    elif single_run(args.run_dirs, by):
        report = clean_json(evaluate(open_run(args.run_dirs[0])))
    else:
        report = clean_json(fleet_evaluate(open_fleet(args.run_dirs, by), by))
    if args.json:
        print(strict_json.dumps(report, indent=2))
    elif args.csv:
        print_csv(estimate_records(report))
    else:
        print_estimates(report)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Per workload: the true mean ceiling where a cap-accept shadow exists, each "
        "estimator's mean with its interval, error, interval coverage and block counts. "
        "Several RUN_DIRs (or a directory of run directories) are read as one fleet."
    )
    p.add_argument("run_dirs", type=Path, nargs="*", metavar="RUN_DIR")
    add_group_argument(p)
    add_output_arguments(
        p,
        "one JSON object with a 'workloads' map",
        "one CSV row per workload (and group) and method (RUN_DIRs only)",
    )
    p.add_argument(
        "--sglang-jsonl",
        type=Path,
        default=None,
        help="run the sampled walk on SGLang's block-accept estimator JSONL instead",
    )
    p.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="block size of that JSONL (default: implied by its blocks, as ingest does); "
        "lines that contradict it are counted as bad lines",
    )
    add_time_range_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(handler=handle)

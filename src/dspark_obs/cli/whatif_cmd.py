"""`dspark-obs whatif RUN_DIR`: what other verify policies would have given on a run's traffic."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import strict_json
from ..store import open_run
from ..strict_json import clean_json
from ..terminal import make_console
from ..whatif.predict import DEFAULT_POLICIES, whatif
from .engine_args import add_engine_arguments, on_ray, ray_result
from .output import add_output_arguments, print_csv
from .store_args import add_time_range_arguments, one_run, run_dirs_of
from .whatif_views import render_whatif


def handle(args: argparse.Namespace) -> int:
    with run_dirs_of([args.run_dir], args) as run_dirs:
        args.run_dir = one_run(run_dirs)
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    if on_ray(args):
        from ..engine.jobs import whatif_job

        report = ray_result(args, whatif_job, args.run_dir, args.policy, not args.no_shadow)
    else:
        report = whatif(open_run(args.run_dir), args.policy, use_shadow=not args.no_shadow)
    if args.json:
        print(strict_json.dumps(clean_json(report), indent=2))
    elif args.csv:
        print_csv(clean_json(report)["cells"])
    else:
        render_whatif(report, make_console(), workloads=args.workloads)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Predict, per load level and workload, what other verify policies would have given on "
        "a recorded run's traffic: window, accepted drafts, step time, tokens/s with intervals."
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="own, static, window=K, sps, sps:scale=F, sps:per-request=N, sps:table=FILE, "
        f"sps:sts=none|FILE, topk (vLLM's admission) (repeatable; default: "
        f"{' '.join(DEFAULT_POLICIES)})",
    )
    p.add_argument(
        "--no-shadow",
        action="store_true",
        help="ignore a cap-accept shadow twin's ceilings: rest on the ceiling estimator alone",
    )
    p.add_argument("--workloads", action="store_true", help="a row per workload too")
    add_output_arguments(
        p,
        "one JSON object with a 'cells' list",
        "one CSV row per cell (policy, level, workload)",
    )
    add_time_range_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(handler=handle)

"""`dspark-obs shadow`: replay a sample of requests on production and a cap-accept twin."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..aggregates import Aggregates
from ..estimator.evaluate import evaluate
from ..estimator.online import CeilingEstimator
from ..pipeline import Pipeline
from ..shadow import Server, load_requests, run_shadow
from ..sources.sglang_poller import read_api_key
from ..sources.workloads import workload_rule
from ..store import RunWriter, open_run
from ..strict_json import clean_json
from .errors import CliError
from .estimate_cmd import render_run


def handle(args: argparse.Namespace) -> int:
    if not 0 < args.sample <= 1:
        raise CliError("--sample must be within (0, 1]")
    if (args.out / "run.json").exists():
        raise CliError(f"{args.out} already holds a run; choose another --out")
    requests = load_requests(args.requests)
    if not requests:
        raise CliError(f"{args.requests}: no requests")
    key = read_api_key(args.sglang_api_key_file)
    workload_of = workload_rule(args.workload_from_rid, args.workload_file)
    try:
        batches, stats = run_shadow(
            Server(args.production, key, timeout=600),
            Server(args.shadow, key, timeout=600),
            requests,
            sample=args.sample,
            seed=args.seed,
            keep_sampling=args.keep_sampling,
            concurrency=args.concurrency,
            workload_of=workload_of,
        )
    except OSError as exc:
        raise CliError(f"server unreachable: {exc}") from None
    if not batches:
        raise CliError("production returned no step records (is SGLANG_DSPARK_DEBUG_DUMP set?)")
    gamma = batches[0].gamma
    manifest = {
        "source": "shadow",
        "production": args.production,
        "shadow": args.shadow,
        "gamma": gamma,
        "mode": batches[0].mode,
        "shadow_mode": "cap-accept",
        "sample": args.sample,
        "greedy": not args.keep_sampling,
        "timing": "measured",
    }
    pipeline = Pipeline(
        Aggregates(gamma),
        RunWriter(args.out, manifest),
        estimator=CeilingEstimator(gamma, assume_greedy=not args.keep_sampling),
    )
    for b in batches:
        pipeline.ingest(b, "shadow")
    pipeline.close(
        {
            "requests_replayed": stats.requests,
            "joined_rows": stats.joined_rows,
            "production_rows": stats.production_rows,
        }
    )
    print(
        f"replayed {stats.requests:,} requests; joined {stats.joined_rows:,} of "
        f"{stats.production_rows:,} production request-steps to the shadow's ceilings "
        f"({stats.shadow_rows:,} shadow rows)"
    )
    render_run(clean_json(evaluate(open_run(args.out))))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "shadow",
        help="true ceilings for sampled traffic from a cap-accept twin server",
        description="Replay a sample of requests on production and on a cap-accept server "
        "(greedy by default, so the join by request and position is exact), join the twin's "
        "ceilings to production's request-steps, store the run and evaluate the estimators.",
    )
    p.add_argument("--production", required=True, help="production server URL")
    p.add_argument("--shadow", required=True, help="cap-accept server URL")
    p.add_argument(
        "--requests", type=Path, required=True, help="JSONL of /generate requests, each with a rid"
    )
    p.add_argument("--sample", type=float, default=0.05, help="share replayed (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--keep-sampling",
        action="store_true",
        help="keep the requests' temperatures (the join is then only distributional)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument(
        "--sglang-api-key-file",
        type=Path,
        default=None,
        help="file with the servers' API key (else env DSPARK_SGLANG_API_KEY)",
    )
    p.add_argument(
        "--workload-from-rid",
        default=None,
        metavar="REGEX",
        help="workload from the rid by a named group",
    )
    p.add_argument(
        "--workload-file", type=Path, default=None, help='JSONL of {"rid": ..., "workload": ...}'
    )
    p.set_defaults(handler=handle)

"""`dspark-obs shadow`: replay a sample of requests on production and a cap-accept twin."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..estimator.evaluate import evaluate
from ..shadow import record_shadow_run
from ..sources.sglang_poller import read_api_key
from ..sources.workloads import workload_rule
from ..store import check_new_run_dir, open_run
from ..strict_json import clean_json
from .views import print_estimates

#: Fewer replayed requests than this earn a note suggesting a larger --sample: per workload
#: they leave a handful of requests, and the estimators' intervals are about requests.
FEW_REQUESTS = 50


def handle(args: argparse.Namespace) -> int:
    check_new_run_dir(args.out)
    stats = record_shadow_run(
        args.production,
        args.shadow,
        args.requests,
        args.out,
        api_key=read_api_key(args.sglang_api_key_file),
        sample=args.sample,
        seed=args.seed,
        keep_sampling=args.keep_sampling,
        concurrency=args.concurrency,
        workload_of=workload_rule(args.workload_from_rid, args.workload_file),
    )
    print(
        f"replayed {stats.requests:,} of {stats.offered:,} requests (--sample {args.sample:g}); "
        f"joined {stats.joined_rows:,} of {stats.production_rows:,} production request-steps "
        f"to the shadow's ceilings ({stats.shadow_rows:,} shadow rows)"
    )
    if stats.requests < FEW_REQUESTS and stats.requests < stats.offered:
        print(
            f"note: {stats.requests:,} requests give loose per-workload estimates; replay more "
            f"with a larger --sample (--sample 1 replays all {stats.offered:,})"
        )
    print_estimates(clean_json(evaluate(open_run(args.out))))
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Replay a sample of requests on production and on a cap-accept server (greedy by "
        "default, so the join by request and position is exact), join the twin's ceilings to "
        "production's request-steps, store the run and evaluate the estimators."
    )
    p.add_argument("--production", required=True, help="production server URL")
    p.add_argument("--shadow", required=True, help="cap-accept server URL")
    p.add_argument(
        "--requests", type=Path, required=True, help="JSONL of /generate requests, each with a rid"
    )
    p.add_argument(
        "--sample",
        type=float,
        default=0.05,
        help="share of the requests replayed (default 0.05; 1 replays all)",
    )
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
        help="workload from the rid by a named group (default: NAME-N rids, e.g. gsm8k-17, "
        "name it; other rids count as other)",
    )
    p.add_argument(
        "--workload-file", type=Path, default=None, help='JSONL of {"rid": ..., "workload": ...}'
    )
    p.set_defaults(handler=handle)

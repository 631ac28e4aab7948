"""`dspark-obs demo`: the whole story in under a minute, with nothing else running.

A mixed-workload compact run with a cap-accept shadow twin on the embedded
runtime, STS fitted on a warm-up run first, then the summary: windows shrink
with difficulty, utilisation against the shadow ceiling, budget per request
falling with load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..store import open_run
from .errors import CliError
from .run_cmd import add_runtime_arguments, config_from_args, default_run_dir, execute, resolve_sts
from .summary_cmd import print_summary


def handle(args: argparse.Namespace) -> int:
    args.shadow = args.shadow or "cap-accept"
    config = config_from_args(args)
    out = args.out or default_run_dir("demo")
    if (out / "run.json").exists():
        raise CliError(f"{out} already holds a run; choose another --out")
    sts = resolve_sts(args, config)
    execute(config, out, sts, show_progress=not args.quiet)
    print_summary(open_run(out), as_json=args.json)
    if not args.json:
        print(f"\nrun directory: {out}  (inspect with `dspark-obs summary {out}`)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="mixed-workload compact run with a cap-accept shadow, then its summary",
        description="Run the embedded runtime in compact mode with a cap-accept "
        "shadow over a mixed workload and a concurrency sweep, then print the "
        "summary. Needs no GPU and no SGLang.",
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/TIME-demo)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_runtime_arguments(p, steps_per_level=120, concurrency="1,8,32,64,128")
    p.set_defaults(handler=handle)

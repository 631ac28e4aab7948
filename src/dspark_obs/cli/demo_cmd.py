"""`dspark-obs demo`: the whole story in under a minute, with nothing else running.

A mixed-workload compact run with a cap-accept shadow twin on the embedded
runtime, STS fitted on a warm-up run first, `/metrics` served while it runs,
then the summary (windows shrink with difficulty, utilisation against the
shadow ceiling, budget per request falling with load) and the ceiling
estimates beside the shadow's truth.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.summary import summarize
from ..estimator.evaluate import evaluate
from ..recording import default_run_dir
from ..service import check_can_listen, record_while_serving
from ..store import check_new_run_dir, open_run
from ..strict_json import clean_json
from .output import add_output_arguments
from .progress import step_progress
from .runtime_args import add_runtime_arguments, calibration_from_args, config_from_args
from .signals import stop_on_signals
from .views import print_estimates, print_summary

DEFAULT_LISTEN = "127.0.0.1:9464"


def handle(args: argparse.Namespace) -> int:
    args.shadow = args.shadow or "cap-accept"
    config = config_from_args(args)
    out = args.out or default_run_dir("demo")
    check_new_run_dir(out)
    # a port the user chose is kept to (refused before the warm-up, not after); the default
    # one moves to a free port when taken, and the demo says so
    chosen = args.listen is not None
    listen = None if args.no_serve else (args.listen or DEFAULT_LISTEN)
    if listen is not None and chosen:
        check_can_listen(listen)
    sts = calibration_from_args(
        args, config, lambda warm: step_progress(warm, "STS warm-up", not args.quiet)
    )
    with step_progress(config, f"{config.mode} run", not args.quiet) as advance:
        exporter = record_while_serving(
            config,
            out,
            sts,
            listen=listen,
            move_if_taken=not chosen,
            on_step=advance,
            say=lambda line: print(line, flush=True),
        )
    try:
        run = open_run(out)
        print_summary(summarize(run), as_json=args.json, as_csv=args.csv)
        if not args.json:
            print_estimates(clean_json(evaluate(run)))
            print(f"\nrun directory: {out}  (inspect with `dspark-obs summary {out}`)")
        if exporter is not None and args.hold:
            print(f"still serving {exporter.server.url}/metrics; Ctrl-C to stop", flush=True)
            stop_on_signals().wait()
    finally:
        if exporter is not None:
            exporter.stop()
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run the embedded runtime in compact mode with a cap-accept shadow over a mixed "
        "workload and a concurrency sweep, serving /metrics while it runs, then print the "
        "summary. Needs no GPU and no SGLang."
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/TIME-demo)")
    add_output_arguments(
        p, "print the summary as JSON", "print the summary as CSV (a row per workload)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--listen",
        default=None,
        help=f"HOST:PORT for live /metrics (default {DEFAULT_LISTEN}, or a free port if that "
        "is taken; a port given here is used or the demo stops with an error)",
    )
    p.add_argument("--no-serve", action="store_true", help="do not serve /metrics")
    p.add_argument(
        "--hold", action="store_true", help="keep serving /metrics after the run until Ctrl-C"
    )
    add_runtime_arguments(p, steps_per_level=120, concurrency="1,8,32,64,128")
    p.set_defaults(handler=handle)

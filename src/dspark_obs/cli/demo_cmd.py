"""`dspark-obs demo`: the whole story in under a minute, with nothing else running.

A mixed-workload compact run with a cap-accept shadow twin on the embedded
runtime, STS fitted on a warm-up run first, `/metrics` served while it runs,
then the summary (windows shrink with difficulty, utilisation against the
shadow ceiling, budget per request falling with load) and the ceiling
estimates beside the shadow's truth.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

from ..estimator.evaluate import evaluate
from ..exporters.endpoint import Exporter, parse_listen
from ..pipeline import Pipeline
from ..store import open_run
from ..strict_json import clean_json
from .errors import CliError
from .estimate_cmd import render_run
from .run_cmd import add_runtime_arguments, config_from_args, default_run_dir, execute, resolve_sts
from .serve_cmd import install_stop_handlers
from .summary_cmd import print_summary


def _start_exporter(pipeline: Pipeline, listen: str) -> tuple[Exporter, str]:
    """Serve on `listen`; if that port is taken, on a free one (the demo must not fail on it)."""
    host, port = parse_listen(listen)
    exporter = Exporter(pipeline, host, port)
    try:
        return exporter, exporter.start()
    except OSError:
        exporter = Exporter(pipeline, host, 0)
        return exporter, exporter.start()


def handle(args: argparse.Namespace) -> int:
    args.shadow = args.shadow or "cap-accept"
    config = config_from_args(args)
    out = args.out or default_run_dir("demo")
    if (out / "run.json").exists():
        raise CliError(f"{out} already holds a run; choose another --out")
    sts = resolve_sts(args, config)
    try:
        parse_listen(args.listen)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    exporter = None

    def serve(pipeline: Pipeline) -> None:
        nonlocal exporter
        if args.no_serve:
            return
        exporter, url = _start_exporter(pipeline, args.listen)
        print(f"serving live metrics at {url} while the demo runs", flush=True)

    try:
        execute(config, out, sts, show_progress=not args.quiet, on_pipeline=serve)
        run = open_run(out)
        print_summary(run, as_json=args.json)
        if not args.json:
            render_run(clean_json(evaluate(run)))
            print(f"\nrun directory: {out}  (inspect with `dspark-obs summary {out}`)")
        if exporter is not None and args.hold:
            print(f"still serving {exporter.server.url}/metrics; Ctrl-C to stop", flush=True)
            stop = threading.Event()
            install_stop_handlers(stop)
            stop.wait()
    finally:
        if exporter is not None:
            exporter.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="mixed-workload compact run with a cap-accept shadow, then its summary",
        description="Run the embedded runtime in compact mode with a cap-accept shadow over a "
        "mixed workload and a concurrency sweep, serving /metrics while it runs, then print "
        "the summary. Needs no GPU and no SGLang.",
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/TIME-demo)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--listen",
        default="127.0.0.1:9464",
        help="HOST:PORT for live /metrics (default 127.0.0.1:9464; a free port if taken)",
    )
    p.add_argument("--no-serve", action="store_true", help="do not serve /metrics")
    p.add_argument(
        "--hold", action="store_true", help="keep serving /metrics after the run until Ctrl-C"
    )
    add_runtime_arguments(p, steps_per_level=120, concurrency="1,8,32,64,128")
    p.set_defaults(handler=handle)

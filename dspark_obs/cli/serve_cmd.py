"""`dspark-obs serve`: a source into the pipeline, `/metrics` served until stopped."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from ..aggregates import Aggregates
from ..estimator.online import CeilingEstimator
from ..pipeline import Pipeline
from ..service import Exporter, parse_listen, run_source
from ..sources import parse_source
from ..sources.replay import ReplaySource
from ..sources.runtime_source import RuntimeSource
from ..store import RunStoreError, RunWriter
from .errors import CliError
from .run_cmd import add_runtime_arguments, build_manifest, config_from_args, resolve_sts


def add_exporter_arguments(p: argparse.ArgumentParser, listen: str = "127.0.0.1:9464") -> None:
    g = p.add_argument_group("exporter")
    g.add_argument(
        "--listen", default=listen, help=f"HOST:PORT for /metrics (default {listen}: loopback only)"
    )
    g.add_argument(
        "--web-config",
        type=Path,
        default=None,
        help="TLS, mTLS and basic-auth settings (exporter-toolkit style; docs/security.md)",
    )
    g.add_argument(
        "--workload-cap",
        type=int,
        default=16,
        help="distinct workload label values before the rest count as 'other' (default 16)",
    )
    g.add_argument(
        "--window-steps",
        type=int,
        default=1024,
        help="steps in the sliding window of ratio metrics (default 1024)",
    )


def install_stop_handlers(stop: threading.Event) -> None:
    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def handle(args: argparse.Namespace) -> int:
    try:
        kind, arg = parse_source(args.source)
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.workload_cap < 1 or args.window_steps < 8:
        raise CliError("--workload-cap must be >= 1 and --window-steps >= 8")
    if args.speed < 0:
        raise CliError("--speed must be >= 0")
    if kind == "runtime":
        config = config_from_args(args)
        sts = resolve_sts(args, config)
        if sts is not None:
            config.sts_temperatures = list(sts.temperatures)
        source = RuntimeSource(config, speed=args.speed)
        out = args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S-serve", time.gmtime())
        manifest = build_manifest(config, sts) | {"source": "serve:runtime"}
    else:
        try:
            source = ReplaySource(arg, speed=args.speed)
        except RunStoreError as exc:
            raise CliError(str(exc)) from None
        out = args.out
        manifest = dict(source.run.manifest) | {"source": f"serve:{args.source}"}
    if out is not None and (Path(out) / "run.json").exists():
        raise CliError(f"{out} already holds a run; choose another --out")
    pipeline = Pipeline(
        Aggregates(source.gamma, workload_cap=args.workload_cap, window_steps=args.window_steps),
        estimator=CeilingEstimator(
            source.gamma, workload_cap=args.workload_cap, window_steps=args.window_steps
        ),
    )
    exporter = Exporter(pipeline, host, port, args.web_config)
    stop = threading.Event()
    install_stop_handlers(stop)
    try:
        url = exporter.start()
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
    if out is not None:
        # Created only once serving works: a refused port or web config must not leave an
        # incomplete run in --out that then blocks the corrected command ("already holds a run").
        try:
            writer = RunWriter(out, {k: v for k, v in manifest.items() if k != "complete"})
        except BaseException:
            exporter.stop()
            raise
        pipeline.writer = writer
    print(f"serving {url}  (source {source.name}; Ctrl-C to stop)", flush=True)
    try:
        fed = run_source(source, pipeline, stop)
        if not stop.is_set():
            print(f"source {source.name} ended after {fed:,} steps", flush=True)
            if not args.exit_when_done:
                print("still serving the final values; Ctrl-C to stop", flush=True)
                stop.wait()
    finally:
        pipeline.close()
        exporter.stop()
    records, errors, _ = pipeline.stats.snapshot()
    print(
        f"stopped: {sum(records.values()):,} steps ingested, "
        f"{sum(errors.values()):,} rejected" + (f"; run stored in {out}" if out else ""),
        file=sys.stderr,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run a source into the pipeline and serve /metrics",
        description="Feed a source into the live aggregates and serve Prometheus "
        "metrics until stopped (Ctrl-C or SIGTERM flush the run store and exit 0).",
    )
    p.add_argument(
        "--source",
        default="runtime",
        help="'runtime' (the embedded runtime, continuously; default) or "
        "'run:RUN_DIR' (replay a stored run)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="pace steps at their recorded step time / SPEED; 0: as fast as possible (default 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory to store what is served (runtime source: default "
        "runs/TIME-serve; replay: none)",
    )
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit when a finite source (replay) ends instead of serving on",
    )
    add_exporter_arguments(p)
    add_runtime_arguments(p, steps_per_level=200, concurrency="1,8,32,64,128,256")
    p.set_defaults(handler=handle)

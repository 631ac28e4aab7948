"""`dspark-obs serve`: a source into the pipeline, `/metrics` served until stopped."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from ..aggregates import Aggregates
from ..estimator.online import CeilingEstimator
from ..exporters.endpoint import Exporter, parse_listen
from ..pipeline import Pipeline, run_sources
from ..sources import parse_source
from ..sources.replay import ReplaySource
from ..sources.runtime_source import RuntimeSource
from ..sources.sglang_http import DEFAULT_MAX_BYTES
from ..sources.sglang_poller import SGLangPoller, read_api_key
from ..sources.stats import IngestStats
from ..sources.workloads import workload_rule
from ..store import RunStoreError, RunWriter
from .errors import CliError
from .run_cmd import (
    add_runtime_arguments,
    add_store_arguments,
    build_manifest,
    config_from_args,
    install_stop_handlers,
    refuse_existing_run,
    resolve_sts,
    store_options,
)


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


def _sglang_sources(urls: list[str], args: argparse.Namespace, stats: IngestStats) -> list:
    try:
        workload_of = workload_rule(args.workload_from_rid, args.workload_file)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    api_key = read_api_key(args.sglang_api_key_file)
    return [
        SGLangPoller(
            url,
            stats=stats,
            index=i,
            interval=args.poll_interval,
            timeout=args.poll_timeout,
            retries=args.poll_retries,
            api_key=api_key,
            clear=not args.no_clear,
            gamma=args.gamma,
            workload_of=workload_of,
            max_bytes=args.sglang_max_bytes,
        )
        for i, url in enumerate(urls)
    ]


def handle(args: argparse.Namespace) -> int:
    specs = args.source or ["runtime"]
    try:
        parsed = [parse_source(s) for s in specs]
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    kinds = {k for k, _ in parsed}
    if len(parsed) > 1 and kinds != {"sglang"}:
        raise CliError("several --source options are only for sglang:URL servers")
    if args.workload_cap < 1 or args.window_steps < 8:
        raise CliError("--workload-cap must be >= 1 and --window-steps >= 8")
    if args.speed < 0 or args.poll_interval <= 0 or args.poll_timeout <= 0:
        raise CliError("--speed must be >= 0, --poll-interval and --poll-timeout > 0")
    if args.sglang_max_bytes < 1:
        raise CliError("--sglang-max-bytes must be >= 1")
    stats = IngestStats()
    kind, arg = parsed[0]
    if kind == "runtime":
        config = config_from_args(args)
        sts = resolve_sts(args, config)
        if sts is not None:
            config.sts_temperatures = list(sts.temperatures)
        sources = [RuntimeSource(config, speed=args.speed)]
        out = args.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S-serve", time.gmtime())
        manifest = build_manifest(config, sts) | {"source": "serve:runtime"}
    elif kind == "run":
        try:
            sources = [ReplaySource(arg, speed=args.speed)]
        except RunStoreError as exc:
            raise CliError(str(exc)) from None
        out = args.out
        manifest = dict(sources[0].run.manifest) | {"source": f"serve:run:{arg}"}
    else:
        sources = _sglang_sources([a for _, a in parsed], args, stats)
        out = args.out
        manifest = {
            "source": "serve:sglang",
            "servers": [s.url for s in sources],
            "gamma": args.gamma,
        }
    gamma = sources[0].gamma
    if out is not None:
        refuse_existing_run(out)
    store = store_options(args)
    assume = {"greedy": True, "sampled": False, None: None}[args.assume]
    pipeline = Pipeline(
        Aggregates(gamma, workload_cap=args.workload_cap, window_steps=args.window_steps),
        stats=stats,
        estimator=CeilingEstimator(
            gamma,
            workload_cap=args.workload_cap,
            window_steps=args.window_steps,
            assume_greedy=assume,
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
            writer = RunWriter(out, {k: v for k, v in manifest.items() if k != "complete"}, **store)
        except BaseException:
            exporter.stop()
            raise
        pipeline.writer = writer
    names = ", ".join(s.name for s in sources)
    print(f"serving {url}  (source {names}; Ctrl-C to stop)", flush=True)
    try:
        fed = run_sources(sources, pipeline, stop)
        if not stop.is_set():
            print(f"source {names} ended after {fed:,} steps", flush=True)
            if not args.exit_when_done:
                print("still serving the final values; Ctrl-C to stop", flush=True)
                stop.wait()
    finally:
        stop.set()
        pollers = [s for s in sources if isinstance(s, SGLangPoller)]
        extra = None
        if pollers:
            extra = {
                "mode": next((p.mode for p in pollers if p.mode), None),
                "timing": "measured" if any(p.timed for p in pollers) else None,
            }
        elif isinstance(sources[0], RuntimeSource):
            runtime = sources[0].runtime  # as `run` records them
            extra = {"requests_arrived": runtime.arrived, "requests_finished": runtime.finished}
        pipeline.close(extra)
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
        action="append",
        default=None,
        help="'runtime' (the embedded runtime, continuously; default), 'run:RUN_DIR' (replay "
        "a stored run) or 'sglang:http://HOST:PORT' (poll a DSpark SGLang server; repeat for "
        "several)",
    )
    g = p.add_argument_group("sglang sources")
    g.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between /server_info reads (default 1)",
    )
    g.add_argument(
        "--poll-timeout",
        type=float,
        default=5.0,
        help="seconds before a read counts as failed (default 5)",
    )
    g.add_argument(
        "--poll-retries",
        type=int,
        default=3,
        help="failed reads retried at the interval before backing off (default 3)",
    )
    g.add_argument(
        "--sglang-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help="refuse /server_info answers over N bytes, counted as reason 'oversized' "
        f"(default {DEFAULT_MAX_BYTES:,} = 256 MiB)",
    )
    g.add_argument(
        "--no-clear",
        action="store_true",
        help="do not drain records after reading (when others read the buffer too)",
    )
    g.add_argument(
        "--sglang-api-key-file",
        type=Path,
        default=None,
        help="file holding SGLang's --api-key (else env DSPARK_SGLANG_API_KEY)",
    )
    g.add_argument(
        "--workload-from-rid",
        default=None,
        metavar="REGEX",
        help="workload from the rid by a named group, e.g. '^(?P<workload>[a-z]+)-'",
    )
    g.add_argument(
        "--workload-file",
        type=Path,
        default=None,
        help='JSONL of {"rid": ..., "workload": ...} lines',
    )
    g.add_argument(
        "--assume",
        choices=("greedy", "sampled"),
        default=None,
        help="how requests sample, for the ceiling walk (SGLang dumps do not say)",
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
    add_store_arguments(p)
    add_runtime_arguments(p, steps_per_level=200, concurrency="1,8,32,64,128,256")
    p.set_defaults(handler=handle)

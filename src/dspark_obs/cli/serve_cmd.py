"""`dspark-obs serve`: a source into the pipeline, `/metrics` served until stopped."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..service import PollOptions, ServeFailed, ServeOptions, serve
from ..service.serving import DEFAULT_SERVE_STORE
from ..sources.sglang_http import DEFAULT_MAX_BYTES
from ..sources.sglang_poller import read_api_key
from ..sources.workloads import workload_rule
from .main import one_line
from .runtime_args import (
    add_production_store_arguments,
    add_runtime_arguments,
    add_store_arguments,
    calibration_from_args,
    config_from_args,
    production_store_options,
    store_options,
)
from .signals import stop_on_signals
from .views import ingest_outcome


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
        "--model-name",
        default=None,
        metavar="NAME",
        help="model_name label on every series (default: the run's or runtime world's; "
        "'unknown' for SGLang servers)",
    )
    g.add_argument(
        "--detail-metrics",
        action="store_true",
        help="also publish the families of fine detail (per-rank AUROC bins, survival "
        "histograms): outside the series budget of docs/metrics.md",
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


def _runtime(args: argparse.Namespace):
    config = config_from_args(args)
    return config, calibration_from_args(args, config)


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    sglang = any(s.startswith("sglang:") for s in args.source or [])
    return ServeOptions(
        sources=args.source or ["runtime"],
        listen=args.listen,
        web_config=args.web_config,
        workload_cap=args.workload_cap,
        model_name=args.model_name,
        detail_metrics=args.detail_metrics,
        window_steps=args.window_steps,
        speed=args.speed,
        out=args.out,
        store_dir=args.store,
        no_store=args.no_store,
        production=production_store_options(args),
        exit_when_done=args.exit_when_done,
        store=store_options(args),
        assume=args.assume,
        poll=PollOptions(
            interval=args.poll_interval,
            timeout=args.poll_timeout,
            retries=args.poll_retries,
            max_bytes=args.sglang_max_bytes,
            clear=not args.no_clear,
            api_key=read_api_key(args.sglang_api_key_file) if sglang else None,
            gamma=args.gamma,
            workload_of=workload_rule(args.workload_from_rid, args.workload_file)
            if sglang
            else None,
        ),
        runtime=lambda: _runtime(args),
    )


def handle(args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    try:
        result = serve(options_from_args(args), stop, say=lambda line: print(line, flush=True))
    except ServeFailed as exc:
        # not a usage error (2): the service ran and then could not go on
        print(f"dspark-obs serve: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    print(
        f"stopped: {ingest_outcome(result.steps_ingested, result.errors, result.dropped)}"
        + (f"; run stored in {result.out}" if result.out else ""),
        file=sys.stderr,
    )
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Feed a source into the live aggregates and serve Prometheus metrics until stopped "
        "(Ctrl-C or SIGTERM flush the run store and exit 0)."
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
        help="workload from the rid by a named group, e.g. '^(?P<workload>[a-z]+)-' "
        "(default: NAME-N rids, e.g. gsm8k-17, name it; other rids count as other)",
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
        help="one run directory to store what is served, unbounded (in place of a "
        "production store)",
    )
    p.add_argument(
        "--no-store",
        action="store_true",
        help="store nothing (the runtime source's default is a bounded production store)",
    )
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit when a finite source (replay) ends instead of serving on",
    )
    add_exporter_arguments(p)
    add_store_arguments(p)
    add_production_store_arguments(p, f"{DEFAULT_SERVE_STORE} for the runtime source")
    add_runtime_arguments(p, steps_per_level=200, concurrency="1,8,32,64,128,256")
    p.set_defaults(handler=handle)

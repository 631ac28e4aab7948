"""`dspark-obs runtime-server`: the reference runtime behind SGLang's HTTP protocol.

So that the poller and the dashboards can be run end to end against something
that answers like a DSpark SGLang server, on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import threading

from ..frontend import MAX_RECORDS, RuntimeFrontend
from .errors import CliError
from .run_cmd import add_runtime_arguments, config_from_args, resolve_sts
from .serve_cmd import install_stop_handlers


def handle(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be within 0..65535")
    if args.dp_size < 1:
        raise CliError("--dp-size must be >= 1")
    if args.speed < 0:
        raise CliError("--speed must be >= 0")
    if args.max_records < 1:
        raise CliError("--max-records must be >= 1")
    config = config_from_args(args)
    sts = resolve_sts(args, config)
    if sts is not None:
        config.sts_temperatures = list(sts.temperatures)
    try:
        front = RuntimeFrontend(
            config,
            host=args.host,
            port=args.port,
            dp_size=args.dp_size,
            speed=args.speed,
            api_key=args.api_key,
            max_records=args.max_records,
        )
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    install_stop_handlers(stop)
    url = front.start()
    print(
        f"serving {url}  (SGLang protocol, mode {config.mode}, dp {args.dp_size}; Ctrl-C to stop)",
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        front.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runtime-server",
        help="serve the reference runtime over SGLang's HTTP protocol",
        description="Serve the reference DSpark runtime behind SGLang's /generate, "
        "/server_info, /set_internal_state and /health, with one engine per simulated "
        "DP rank. The largest --concurrency level is each rank's running-request cap.",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port, 0 for any (default 30000)")
    p.add_argument("--dp-size", type=int, default=1, help="simulated DP ranks (default 1)")
    p.add_argument(
        "--speed",
        type=float,
        default=0.0,
        help="sleep each step's simulated time / X; 0 steps as fast as possible (default 0)",
    )
    p.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (not on /health)"
    )
    p.add_argument(
        "--max-records",
        type=int,
        default=MAX_RECORDS,
        help=f"step records kept per rank, oldest dropped (default {MAX_RECORDS:,}, as SGLang)",
    )
    add_runtime_arguments(p, steps_per_level=1, concurrency="256")
    p.set_defaults(handler=handle)

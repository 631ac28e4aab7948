"""`dspark-obs runtime-server`: the reference runtime behind SGLang's HTTP protocol.

So that the poller and the dashboards can be run end to end against something
that answers like a DSpark SGLang server, on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..runtime_server import DEFAULT_RATE_LIMIT, MAX_RECORDS, RuntimeFrontend
from ..secret_text import check_secret
from ..telemetry.server_info import MAX_DP_RANKS
from .errors import CliError
from .runtime_args import add_runtime_arguments, calibration_from_args, config_from_args
from .signals import stop_on_signals

#: Where the server's own API key may come from besides --api-key-file.
API_KEY_ENV = "DSPARK_RUNTIME_API_KEY"


def api_key(args: argparse.Namespace) -> str | None:
    """The key clients must send: --api-key-file, else --api-key, else $DSPARK_RUNTIME_API_KEY.

    A file or the environment keep the key out of argv, which any local user
    can read with `ps`; --api-key stays for quick local tries. Messages name
    the file, never its content.
    """
    if args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise CliError(f"--api-key-file {args.api_key_file}: {reason}") from None
        if not key:
            raise CliError(f"--api-key-file {args.api_key_file}: empty")
        where, key = f"--api-key-file {args.api_key_file}", key
    elif args.api_key:
        where, key = "--api-key", args.api_key
    else:
        where, key = f"${API_KEY_ENV}", os.environ.get(API_KEY_ENV)
    if not key:
        return None
    try:
        return check_secret(key, where)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def handle(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError("--port must be within 0..65535")
    if not 1 <= args.dp_size <= MAX_DP_RANKS:
        raise CliError(f"--dp-size must be within 1..{MAX_DP_RANKS}")
    if not math.isfinite(args.rate_limit) or args.rate_limit < 0:
        raise CliError("--rate-limit must be a number >= 0 (0 disables it)")
    if args.speed < 0:
        raise CliError("--speed must be >= 0")
    if args.max_records < 1:
        raise CliError("--max-records must be >= 1")
    config = config_from_args(args)
    sts = calibration_from_args(args, config)
    if sts is not None:
        config.sts_temperatures = list(sts.temperatures)
    try:
        front = RuntimeFrontend(
            config,
            host=args.host,
            port=args.port,
            dp_size=args.dp_size,
            speed=args.speed,
            api_key=api_key(args),
            max_records=args.max_records,
            rate_limit=args.rate_limit,
        )
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = stop_on_signals()
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


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve the reference DSpark runtime behind SGLang's /generate, "
        "/server_info, /set_internal_state and /health, with one engine per simulated "
        "DP rank. The largest --concurrency level is each rank's running-request cap."
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
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' (not on /health), KEY read from FILE; "
        f"else from env {API_KEY_ENV}",
    )
    keys.add_argument(
        "--api-key",
        default=None,
        help="the same, KEY on the command line (visible to other users in ps: prefer "
        "--api-key-file)",
    )
    p.add_argument(
        "--rate-limit",
        type=float,
        default=DEFAULT_RATE_LIMIT,
        metavar="REQ_PER_S",
        help="requests per second per client address before '429 Too Many Requests' "
        f"(bursts up to one second's worth; default {DEFAULT_RATE_LIMIT:g}; 0 disables)",
    )
    p.add_argument(
        "--max-records",
        type=int,
        default=MAX_RECORDS,
        help=f"step records kept per rank, oldest dropped (default {MAX_RECORDS:,}, as SGLang)",
    )
    add_runtime_arguments(p, steps_per_level=1, concurrency="256")
    p.set_defaults(handler=handle)

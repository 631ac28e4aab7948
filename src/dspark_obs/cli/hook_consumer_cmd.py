"""`dspark-obs hook-consumer`: the process behind the in-process SGLang hook.

`hooks.sglang_worker.attach` starts it with the name of the shared ring it
created; it feeds the ring's steps into a pipeline and serves `/metrics`.
"""

from __future__ import annotations

import argparse

from ..telemetry.batch import MODES
from .errors import CliError


def handle(args: argparse.Namespace) -> int:
    from ..exporters.endpoint import parse_listen
    from ..hooks.consumer import run_consumer
    from .signals import stop_on_signals

    try:
        listen = None if args.listen is None else parse_listen(args.listen)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        run_consumer(
            args.ring,
            mode=args.mode,
            rank=args.rank,
            listen=listen,
            stop=stop_on_signals(),
            parent=args.parent,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(f"hook ring {args.ring!r}: {exc}") from None
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Consume the steps an attached SGLang hook writes to its shared-memory ring: "
        "aggregate them, estimate ceilings and serve /metrics. attach() starts it."
    )
    p.add_argument("--ring", required=True, help="the ring's shared-memory name")
    p.add_argument("--mode", choices=MODES, default="compact", help="the server's verify mode")
    p.add_argument("--rank", type=int, default=0, help="the rank the hook observes")
    p.add_argument("--listen", default=None, help="HOST:PORT for /metrics (default: none)")
    p.add_argument("--parent", type=int, default=None, help="exit when this process is gone")
    p.set_defaults(handler=handle)

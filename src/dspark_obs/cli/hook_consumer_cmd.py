"""`dspark-obs hook-consumer`: the node's process behind the in-process hooks.

Every hook of a node starts it when none runs for its `--listen` port; it feeds the
rings of every rank of the node into one pipeline and serves them on one `/metrics`.
"""

from __future__ import annotations

import argparse

from .errors import CliError
from .runtime_args import add_production_store_arguments, production_store_options


def handle(args: argparse.Namespace) -> int:
    from ..hooks.node_consumer import run_node_consumer
    from ..listen import parse_listen
    from .signals import stop_on_signals

    try:
        listen = parse_listen(args.listen)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.idle_exit <= 0:
        raise CliError("--idle-exit must be > 0")
    try:
        options = production_store_options(args)
        store = None if args.store is None else {"root": args.store, **options}
    except ValueError as exc:
        raise CliError(str(exc)) from None
    run_node_consumer(
        listen, stop=stop_on_signals(), idle_exit=args.idle_exit, detail=args.detail_metrics,
        store=store,
    )  # fmt: skip
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Consume the steps the in-process hooks of this node write to their shared-memory "
        "rings (every rank, found by the port), aggregate them, estimate ceilings and serve "
        "/metrics on that port. A hook starts it when none runs; a second one leaves at once."
    )
    p.add_argument("--listen", required=True, help="HOST:PORT for /metrics; names the rings too")
    p.add_argument(
        "--idle-exit",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="stop once no ring has been left for this long (default: 60)",
    )
    p.add_argument(
        "--detail-metrics",
        action="store_true",
        help="also publish the families of fine detail (outside the series budget)",
    )
    add_production_store_arguments(p, None)
    p.set_defaults(handler=handle)

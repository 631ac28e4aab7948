"""`dspark-obs sglang-flag`: the value of SGLang's `--forward-hooks` that turns the hook on."""

from __future__ import annotations

import argparse
import json
import shlex

from .errors import CliError

#: the longest model name a ring carries (its label on every series)
MAX_MODEL_NAME = 200


def handle(args: argparse.Namespace) -> int:
    from ..hooks.sglang_plugin import settings, spec

    config: dict = {"listen": args.listen}
    if args.model is not None:
        if not args.model or len(args.model.encode()) > MAX_MODEL_NAME:
            raise CliError(f"--model must be 1 to {MAX_MODEL_NAME} bytes")
        if not args.model.isprintable():
            raise CliError("--model must be printable text")
        config["model_name"] = args.model
    if args.ring_slots is not None:
        config["ring_slots"] = args.ring_slots
    if args.pool_slots is not None:
        config["pool_slots"] = args.pool_slots
    if args.detail_metrics:
        config["detail_metrics"] = True
    if args.store is not None:
        config["store"] = str(args.store)
    for key in ("retention_hours", "retention_gb", "sample_requests"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    try:
        settings(config)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    value = json.dumps(spec(config), separators=(",", ":"))
    print(value if args.json else shlex.quote(value))
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Print the value to pass to SGLang's --forward-hooks: with it, every scheduler "
        "process of `python -m sglang.launch_server` attaches the dspark-obs hook to its "
        "DSpark worker (one per DP rank), and the ranks of a node share one consumer that "
        "serves /metrics on --listen. Example: python -m sglang.launch_server ... "
        '--forward-hooks "$(dspark-obs sglang-flag --json)"'
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:9464",
        help="HOST:PORT of the node's /metrics (default: 127.0.0.1:9464)",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="model_name on every series (default: SGLang's served model name)",
    )
    p.add_argument(
        "--ring-slots",
        type=int,
        default=None,
        metavar="N",
        help="steps a rank may be ahead of the consumer before it drops one (default: 16)",
    )
    p.add_argument(
        "--pool-slots",
        type=int,
        default=None,
        metavar="N",
        help="request slots to keep open tails for (default: SGLang's request pool)",
    )
    p.add_argument(
        "--detail-metrics",
        action="store_true",
        help="the node's /metrics also publishes the families of fine detail",
    )
    g = p.add_argument_group("the node consumer's production store")
    g.add_argument(
        "--store", default=None, metavar="DIR",
        help="keep every step of the node's ranks in a production store at DIR",
    )  # fmt: skip
    g.add_argument("--retention-hours", type=float, default=None, metavar="H",
                   help="delete hours older than H (default 72)")  # fmt: skip
    g.add_argument("--retention-gb", type=float, default=None, metavar="G",
                   help="then the oldest hours while over G GiB (default 10)")  # fmt: skip
    g.add_argument("--sample-requests", type=float, default=None, metavar="F",
                   help="keep this share of requests, each whole (default 1)")  # fmt: skip
    p.add_argument(
        "--json", action="store_true", help="print the JSON list alone, not shell-quoted"
    )
    p.set_defaults(handler=handle)

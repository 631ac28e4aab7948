"""`dspark-obs`: one entry point, one subcommand per job.

Every subcommand registers its own arguments and handler; this module only
dispatches and turns failures into a one-line message and exit status 2
(with the traceback only under `--debug`).
"""

from __future__ import annotations

import argparse
import sys

from ..allocator import keep_freed_memory
from . import (
    calibration_cmd,
    compare_cmd,
    cost_cmd,
    dashboards_cmd,
    demo_cmd,
    estimate_cmd,
    hash_password_cmd,
    ingest_cmd,
    report_cmd,
    run_cmd,
    runtime_server_cmd,
    serve_cmd,
    shadow_cmd,
    sts_cmd,
    summary_cmd,
)
from .errors import CliError

COMMANDS = (
    run_cmd,
    summary_cmd,
    demo_cmd,
    serve_cmd,
    calibration_cmd,
    estimate_cmd,
    report_cmd,
    compare_cmd,
    sts_cmd,
    cost_cmd,
    hash_password_cmd,
    runtime_server_cmd,
    ingest_cmd,
    shadow_cmd,
    dashboards_cmd,
)


#: Optional packages and the extra that installs each.
OPTIONAL_EXTRAS = {
    "grafana_foundation_sdk": "dashboards",
    "grafana_client": "dashboards",
    "torch": "torch",
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="dspark-obs",
        description="Observability and acceptance-ceiling analytics for DSpark speculative "
        "decoding on SGLang.",
    )
    parser.add_argument("--version", action="version", version=f"dspark-obs {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # this is a dspark-obs process: see allocator.py
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ModuleNotFoundError as exc:
        if args.debug:
            raise
        top = (exc.name or "").split(".")[0]
        extra = OPTIONAL_EXTRAS.get(top)
        hint = f": pip install 'dspark-obs[{extra}]'" if extra else ""
        print(f"dspark-obs {args.command}: error: needs the package {top!r}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dspark-obs: interrupted", file=sys.stderr)
        return 130
    except (CliError, ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"dspark-obs {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2


def one_line(text: str) -> str:
    """`text` as one terminal line: control characters are shown escaped, not acted on.

    Messages quote file names and values from the command line or from files,
    which may hold a newline or a terminal escape sequence; printed raw they
    would split the one-line error or drive the terminal.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


if __name__ == "__main__":
    sys.exit(main())

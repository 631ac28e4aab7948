"""`dspark-obs`: one entry point, one subcommand per job.

Only the chosen subcommand's module is imported: each pulls in the libraries its job
needs (numpy, polars, matplotlib), which `--version`, `--help` and every other command
should not pay for. Failures become a one-line message and exit status 2 (with the
traceback only under `--debug`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from importlib import import_module

from ..allocator import keep_freed_memory
from .errors import CliError

#: Each subcommand: the module that configures and handles it, and its one-line help.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run_cmd", "run the reference DSpark runtime and write a run directory"),
    "summary": ("summary_cmd", "per-workload summary of a run directory"),
    "demo": ("demo_cmd", "mixed-workload compact run with a cap-accept shadow, then its summary"),
    "serve": ("serve_cmd", "run a source into the pipeline and serve /metrics"),
    "calibration": ("calibration_cmd", "per-position confidence calibration of a run"),
    "estimate": (
        "estimate_cmd",
        "ceiling estimates (greedy walk, sampled walk, population) against the truth",
    ),
    "report": ("report_cmd", "post-hoc report of one or more runs: HTML, PNGs, summary.md"),
    "compare": (
        "compare_cmd",
        "A/B two run directories: deltas with bootstrap intervals and verdicts",
    ),
    "whatif": (
        "whatif_cmd",
        "predict other verify policies on a run's traffic: tokens/s with intervals",
    ),
    "sts": ("sts_cmd", "confidence calibration (STS) tools"),
    "cost": ("cost_cmd", "step-cost table tools"),
    "hash-password": (
        "hash_password_cmd",
        "bcrypt-hash a password for the web-config's basic_auth_users",
    ),
    "runtime-server": (
        "runtime_server_cmd",
        "serve the reference runtime over SGLang's HTTP protocol",
    ),
    "ingest": (
        "ingest_cmd",
        "ingest SGLang /server_info dumps or block-accept JSONL into a run directory",
    ),
    "shadow": ("shadow_cmd", "true ceilings for sampled traffic from a cap-accept twin server"),
    "dashboards": ("dashboards_cmd", "export, push or render the Grafana dashboard"),
    "sglang-flag": (
        "sglang_flag_cmd",
        "print SGLang's --forward-hooks value that turns the in-process hook on",
    ),
    "hook-consumer": (
        "hook_consumer_cmd",
        "consume the in-process hooks' rings of this node and serve /metrics",
    ),
}

#: Optional packages and the extra that installs each.
OPTIONAL_EXTRAS = {
    "grafana_foundation_sdk": "dashboards",
    "grafana_client": "dashboards",
    "torch": "torch",
}


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" names the nearest choice (a mistyped
    command or option value), as `git` does: `did you mean 'summary'?`."""

    def error(self, message: str):
        found = _INVALID_CHOICE.search(message)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(2))
            near = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
            if near:
                message = f"{message}; did you mean '{near[0]}'?"
        super().error(message)


def _chosen(argv: list[str]) -> str | None:
    """The subcommand `argv` names: its first word (the top-level options take no value)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the subcommand it names is configured in full (the
    others are listed with their help), without, every subcommand is."""
    from .. import __version__

    parser = Parser(
        prog="dspark-obs",
        description="Observability and acceptance-ceiling analytics for DSpark speculative "
        "decoding on SGLang.",
    )
    parser.add_argument("--version", action="version", version=f"dspark-obs {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks on errors (the exit status stays)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else _chosen(argv)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if argv is None or name == chosen:
            import_module(f"{__package__}.{module}").configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # this is a dspark-obs process: see allocator.py
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ModuleNotFoundError as exc:
        _traceback(args)
        top = (exc.name or "").split(".")[0]
        extra = OPTIONAL_EXTRAS.get(top)
        hint = f": pip install 'dspark-obs[{extra}]'" if extra else ""
        print(f"dspark-obs {args.command}: error: needs the package {top!r}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dspark-obs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): nothing to say, and nothing more to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (CliError, ValueError, OSError) as exc:
        _traceback(args)
        print(f"dspark-obs {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BaseException as exc:
        if not _is_data_error(exc):
            raise
        _traceback(args)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(
            f"dspark-obs {args.command}: error: unreadable data: {one_line(first)}", file=sys.stderr
        )
        return 2


def _traceback(args: argparse.Namespace) -> None:
    """Under `--debug`, the traceback of the error being handled, above its one-line message
    (which, and whose exit status, stay as without it: scripts test the status)."""
    if args.debug:
        traceback.print_exc()


def _is_data_error(exc: BaseException) -> bool:
    """Whether `exc` is polars failing on bad data (a damaged part nothing verified).

    Libraries name the run they read where they can (`store.errors.reading`); this is
    the last line, so that no command prints a traceback for a damaged file. polars is
    only looked at when the command already imported it.
    """
    pl = sys.modules.get("polars")
    if pl is None:
        return False
    return isinstance(exc, (pl.exceptions.PolarsError, pl.exceptions.PanicException))


def one_line(text: str) -> str:
    """`text` as one terminal line: control characters are shown escaped, not acted on.

    Messages quote file names and values from the command line or from files,
    which may hold a newline or a terminal escape sequence; printed raw they
    would split the one-line error or drive the terminal.
    """
    from ..names import printable

    return printable(text)


if __name__ == "__main__":
    sys.exit(main())

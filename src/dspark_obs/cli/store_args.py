"""A production store in place of run directories, with a time range: the options and how
the post-hoc commands read it.

`summary`, `calibration`, `estimate`, `whatif` and `report` take a store (`serve --store`,
`hook-consumer --store`) wherever they take a run directory; its range (`--since`,
`--between`) and streams (`--node`, `--rank`) become one run directory per (node, rank)
for as long as the command runs (`store.time_range.store_views`).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from .errors import CliError


def add_time_range_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a production store (STORE in place of RUN_DIR)")
    g.add_argument("--since", default=None, metavar="DURATION",
                   help="the last DURATION up to now (e.g. 6h, 30m, 2d)")  # fmt: skip
    g.add_argument(
        "--between", nargs=2, default=None, metavar=("START", "END"),
        help="from START to END (ISO 8601, UTC unless an offset is given, or Unix seconds)",
    )  # fmt: skip
    g.add_argument("--node", action="append", default=None, metavar="NAME",
                   help="only this node's ranks (repeatable)")  # fmt: skip
    g.add_argument("--rank", action="append", type=int, default=None, metavar="N",
                   help="only this rank (repeatable)")  # fmt: skip


@contextlib.contextmanager
def run_dirs_of(paths: list[Path], args: argparse.Namespace) -> Iterator[list[Path]]:
    """`paths` with every store among them replaced by its range's runs (one per node and
    rank); the range options without a store are an error."""
    from ..store.production import is_store
    from ..store.time_range import store_views, time_range

    ranged = args.since is not None or args.between is not None or args.node or args.rank
    stores = [p for p in paths if is_store(p)]
    if ranged and not stores:
        raise CliError("--since, --between, --node and --rank select from a store: none given")
    try:
        rng = time_range(args.since, tuple(args.between) if args.between else None)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    with contextlib.ExitStack() as stack:
        out: list[Path] = []
        for path in paths:
            if path in stores:
                out += stack.enter_context(
                    store_views(path, rng, tuple(args.node or ()), tuple(args.rank or ()))
                )
            else:
                out.append(path)
        yield out


def one_run(paths: list[Path]) -> Path:
    """The one run a single-run command reads; a store range of several streams is refused."""
    if len(paths) != 1:
        raise CliError(
            f"the store's range holds {len(paths)} streams (node, rank); this command reads one: "
            "choose it with --node and --rank"
        )
    return paths[0]

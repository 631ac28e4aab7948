"""`--engine`, `--ray-address` and `--strict`: where the fleet commands read their runs.

`summary`, `calibration`, `estimate`, `whatif` and `report` read in this process unless
`--engine ray` sends each run (partition) to a Ray task (`dspark_obs.engine`); the
partitions a task could not read are named on stderr and in the JSON's `unread` list, or
with `--strict` make the command fail.
"""

from __future__ import annotations

import argparse
import sys

from .errors import CliError

ENGINES = ("local", "ray")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the runs are read")
    g.add_argument(
        "--engine", choices=ENGINES, default="local",
        help="local: in this process; ray: one Ray task per run, on the node holding it "
        "(needs dspark-obs[ray]; docs/ray.md)",
    )  # fmt: skip
    g.add_argument(
        "--ray-address", default=None, metavar="ADDRESS",
        help="the Ray cluster to join (HOST:PORT, ray://HOST:PORT or auto; default: the "
        "one RAY_ADDRESS or `ray start` names, else a new local one)",
    )  # fmt: skip
    g.add_argument(
        "--strict", action="store_true",
        help="with --engine ray: a run that cannot be read is an error, not a named gap",
    )  # fmt: skip


def on_ray(args: argparse.Namespace) -> bool:
    return args.engine == "ray"


def ray_engine(args: argparse.Namespace):
    """The Ray engine `--ray-address` names; a one-line error without the extra."""
    from ..engine import make_engine

    try:
        return make_engine("ray", args.ray_address)
    except ModuleNotFoundError as exc:
        if exc.name != "ray" and not (exc.name or "").startswith("ray."):
            raise
        raise CliError("--engine ray needs Ray: pip install 'dspark-obs[ray]'") from None


def name_unread(args: argparse.Namespace, unread: list, total: int) -> None:
    """The runs a command left out, on stderr (`unread`: paths and errors)."""
    if unread:
        listed = "; ".join(f"{u['path']}: {u['error']}" for u in unread)
        print(
            f"dspark-obs {args.command}: {len(unread)} of {total} runs unreadable, "
            f"left out of every figure: {listed}",
            file=sys.stderr,
        )


def ray_result(args: argparse.Namespace, job, *job_args) -> dict:
    """`job(engine, *job_args)` on the Ray engine; its unread partitions named on stderr
    (and in the result), or an error under `--strict`."""
    from ..engine.jobs import unread_line

    result, fleet = job(ray_engine(args), *job_args)
    if fleet.unread:
        if args.strict:
            raise CliError(f"{unread_line(fleet)} (--strict)")
        total = len(fleet.unread) + len(fleet.partials)
        name_unread(args, result["unread"], total)
    return result

"""`dspark-obs summary RUN_DIR`: the per-workload table of a stored run."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.summary import summarize_run_dir
from ..store import Run, open_run
from ..whatif.trim_cost import trim_cost_or_none
from .views import print_summary


def with_trim_cost(summary: dict, run: Run) -> dict:
    """The summary `summary` and `run` print alike: the table and the cost of trimming."""
    summary["trim_cost"] = trim_cost_or_none(run)
    return summary


def handle(args: argparse.Namespace) -> int:
    summary = summarize_run_dir(args.run_dir)  # refuses a run with no request-steps
    print_summary(with_trim_cost(summary, open_run(args.run_dir)), as_json=args.json)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Per workload and overall: steps, request-steps, mean window, accepted, committed and "
        "ceiling, utilisation, verify tokens, throughput."
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object with a 'workloads' map")
    p.set_defaults(handler=handle)

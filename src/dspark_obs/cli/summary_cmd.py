"""`dspark-obs summary RUN_DIR`: the per-workload table of a stored run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..analysis.summary import summarize
from ..store import Run, open_run
from .console import make_console
from .errors import CliError


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def render(summary: dict, console: Console) -> None:
    title = f"{summary['run']}  mode={summary['mode']}"
    if summary["shadow"]:
        title += f" (+{summary['shadow']} shadow)"
    title += f"  gamma={summary['gamma']}  timing={summary['timing']}"
    table = Table(title=title, title_justify="left")
    for col in (
        "workload",
        "steps",
        "req-steps",
        "window",
        "accepted",
        "committed",
        "ceiling",
        "util",
        "verify tok",
        "tokens/s",
    ):
        table.add_column(col, justify="left" if col == "workload" else "right")
    rows = [*summary["workloads"].items(), ("overall", summary["overall"])]
    for name, e in rows:
        table.add_row(
            name,
            _fmt(e["steps"]),
            _fmt(e["request_steps"]),
            _fmt(e["mean_window"]),
            _fmt(e["mean_accepted"]),
            _fmt(e["mean_committed"]),
            _fmt(e["mean_ceiling"]),
            _fmt(e["utilisation"], 3),
            _fmt(e["mean_verify_tokens"]),
            _fmt(e["throughput_tokens_per_s"], 0),
            end_section=name == rows[-2][0],
        )
    console.print(table)
    if summary["load"] and any(r["budget_per_request"] is not None for r in summary["load"]):
        load = Table(title="load: budget per request by batch size", title_justify="left")
        for col in ("bs", "steps", "budget/req", "verify tok/step", "step ms"):
            load.add_column(col, justify="right")
        for r in summary["load"]:
            load.add_row(
                _fmt(r["bs"]),
                _fmt(r["steps"]),
                _fmt(r["budget_per_request"]),
                _fmt(r["verify_tokens_per_step"], 1),
                _fmt(r["mean_step_ms"]),
            )
        console.print(load)
    ceiling = summary["overall"]["ceiling_source"]
    note = {
        "observed": "ceiling observed (full-block verification)",
        "shadow": "ceiling from the cap-accept shadow twin",
        None: "ceiling not observed in this run (compact without shadow)",
    }[ceiling]
    console.print(
        f"[dim]{note}; utilisation = accepted / ceiling over rows with a known "
        "ceiling; tokens/s is simulated when timing=simulated[/dim]"
    )


def print_summary(run: Run, *, as_json: bool) -> None:
    summary = summarize(run)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        render(summary, make_console())


def handle(args: argparse.Namespace) -> int:
    run = open_run(args.run_dir)
    if "requests" not in run.tables():
        raise CliError(
            f"{args.run_dir} holds no request-steps (an ingested block-accept JSONL has only "
            f"ceilings); see `dspark-obs estimate {args.run_dir}`"
        )
    print_summary(run, as_json=args.json)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summary",
        help="per-workload summary of a run directory",
        description="Per workload and overall: steps, request-steps, mean window, "
        "accepted, committed and ceiling, utilisation, verify tokens, throughput.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object with a 'workloads' map")
    p.set_defaults(handler=handle)

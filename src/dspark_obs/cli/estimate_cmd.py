"""`dspark-obs estimate`: the ceiling estimators against the truth, per workload."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from ..estimator.block_accept_walk import summarize_by_workload, walk_blocks
from ..estimator.evaluate import evaluate
from ..store import open_run
from ..strict_json import clean_json
from ..telemetry.block_accept_log import read_block_accept_jsonl
from .console import make_console
from .errors import CliError


def _f(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def render_run(report: dict) -> None:
    console = make_console()
    table = Table(
        title=f"{report['run']}: ceiling estimates vs truth (accepted drafts per request-step)",
        title_justify="left",
    )
    for col in (
        "workload",
        "method",
        "blocks",
        "truth",
        "lo",
        "point",
        "hi",
        "error",
        "covered",
        "exact/censored",
    ):
        table.add_column(col, justify="left" if col in ("workload", "method") else "right")
    for name, e in report["workloads"].items():
        for method in ("greedy", "sampled"):
            m = e[method]
            if not m.get("blocks"):
                continue
            err = m.get("error")
            rates = (
                f"{m['exact_rate']:.3f}/{m['censored_rate']:.3f}"
                if method == "greedy"
                else f"—/{m['censored_rate']:.3f}"
            )
            table.add_row(
                name,
                f"{method} walk",
                f"{m['blocks']:,}",
                _f(m.get("truth")),
                _f(m["lo"]),
                _f(m["point"]),
                _f(m["hi"]),
                "—" if err is None else f"{100 * err:+.2f}%",
                {True: "yes", False: "NO", None: "—"}[m.get("covered")],
                rates,
            )
        pop = e.get("population")
        truth = e["truth"]
        if pop is None:
            continue
        table.add_row(
            name,
            "population",
            f"{e['counts']['blocks']:,}",
            _f(truth),
            "",
            _f(pop["mean"]),
            "",
            "—" if truth in (None, 0) else f"{100 * (pop['mean'] / truth - 1):+.2f}%",
            "",
            "",
            end_section=True,
        )
    console.print(table)
    console.print(
        "[dim]walk rows: trimmed blocks only (truth = shadow ceiling of the same blocks); "
        "population: all request-steps; covered: the truth mean lies in the aggregate "
        "interval (mean lo, mean hi widened by 1.96 standard errors)[/dim]"
    )


def handle(args: argparse.Namespace) -> int:
    if args.sglang_jsonl is not None:
        if args.gamma is None:
            raise CliError("--sglang-jsonl needs --gamma")
        log = read_block_accept_jsonl(args.sglang_jsonl)
        blocks = walk_blocks(log, args.gamma)
        report = {
            "source": str(args.sglang_jsonl),
            "gamma": args.gamma,
            "bad_lines": log.bad_lines,
            "workloads": {
                k: {"sampled": v} for k, v in summarize_by_workload(blocks, log=log).items()
            },
        }
        print(json.dumps(clean_json(report), indent=2))
        return 0
    if args.run_dir is None:
        raise CliError("give a RUN_DIR or --sglang-jsonl FILE --gamma N")
    report = evaluate(open_run(args.run_dir))
    if args.json:
        print(json.dumps(clean_json(report), indent=2))
    else:
        render_run(clean_json(report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="ceiling estimates (greedy walk, sampled walk, population) against the truth",
        description="Per workload: the true mean ceiling where a cap-accept shadow exists, each "
        "estimator's mean with its interval, error, interval coverage and block counts.",
    )
    p.add_argument("run_dir", type=Path, nargs="?", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="one JSON object with a 'workloads' map")
    p.add_argument(
        "--sglang-jsonl",
        type=Path,
        default=None,
        help="run the sampled walk on SGLang's block-accept estimator JSONL instead",
    )
    p.add_argument("--gamma", type=int, default=None, help="block size of that JSONL")
    p.set_defaults(handler=handle)

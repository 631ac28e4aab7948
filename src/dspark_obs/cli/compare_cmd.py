"""`dspark-obs compare RUN_A RUN_B`: an A/B of two runs with bootstrap intervals and verdicts.

The comparison is built by `analysis.compare.compare_runs`; this module only
renders it (tables, or `--json`), so other outputs (plots) can reuse it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import strict_json
from ..analysis.compare import compare_runs
from ..numbers import DASH, bracket, number, p_value, significant
from ..report import overlay_figures
from ..report.arms import too_large_for_whatif
from ..store import open_run
from ..terminal import make_console, print_table
from ..whatif.trim_cost import trim_cost_or_why
from .errors import CliError
from .output import add_output_arguments, print_csv
from .views import timing_text
from .whatif_views import render_trim_cost_pair


def _value(text: Any, limit: int = 48) -> str:
    s = json.dumps(text) if not isinstance(text, str) else text
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _style(row: dict) -> str:
    if not row["significant"]:
        return "dim"
    up = row["delta"] > 0
    if row["better"] is None:
        return "yellow"
    return "green" if up == (row["better"] == "higher") else "red"


def _short_verdict(row: dict) -> str:
    """The table's verdict: the full one without the interval the CI column already shows."""
    if not row["significant"]:
        return row["verdict"].split(" (")[0]
    rel = row["rel_delta"]
    rel_text = f" ({number(100 * rel, 1, signed=True)}%)" if rel is not None else ""
    return f"B {'higher' if row['delta'] > 0 else 'lower'}{rel_text}"


def _table(title: str, first: str, rows: list[tuple[str, dict]]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in (first, "metric", "A", "B", "delta", "Holm 95% CI", "p adj", "verdict"):
        table.add_column(col, justify="left" if col in (first, "metric", "verdict") else "right")
    for i, (group, r) in enumerate(rows):
        last = i + 1 == len(rows) or rows[i + 1][0] != group
        unit = f" ({r['unit']})" if r["unit"] in ("ms", "tokens/s") else ""
        table.add_row(
            group,
            r["label"] + unit,
            significant(r["a"], 4),
            significant(r["b"], 4),
            significant(r["delta"], 3, signed=True),
            bracket(*r["ci_holm"]) if r["ci_holm"] else DASH,
            p_value(r["p_adjusted"]),
            f"[{_style(r)}]{_short_verdict(r)}[/]",
            end_section=last,
        )
    return table


def render(result: dict, console: Console) -> None:
    for name in ("a", "b"):
        d = result[name]
        seed = "" if d["seed"] is None else f"  seed={d['seed']}"
        console.print(
            f"[bold]{name.upper()}[/]: {escape(d['run'])}  mode={d['mode']}  "
            f"gamma={d['gamma']}{seed}  timing={timing_text(d['timing'])}"
        )
    diff = result["config_diff"]
    if diff:
        console.print("configuration A -> B:")
        for d in diff:
            console.print(f"  {d['key']}: {_value(d['a'])} -> {_value(d['b'])}", markup=False)
    elif result["config_compared"]:
        console.print("configuration: no key differs")
    for note in result["notes"]:
        console.print(f"[yellow]note:[/] {note}")

    rows = result["rows"]
    per_workload = [(r["workload"], r) for r in rows if r["section"] == "workload"]
    print_table(console, _table("per workload (clusters: requests)", "workload", per_workload))
    steps = [
        ("all" if r["bs"] is None else str(r["bs"]), r) for r in rows if r["section"] == "steps"
    ]
    print_table(console, _table("steps by batch size (clusters: steps)", "bs", steps))

    render_trim_cost_pair(result["trim_cost"], result["trim_cost_missing"], console)

    tested = result["tested"]
    if result["findings"]:
        console.print(
            f"[bold]significant[/] (Holm-adjusted p < {result['alpha']} over {tested} rows):"
        )
        for line in result["findings"]:
            console.print(f"  • {line}", markup=False)
    else:
        console.print(
            f"no significant difference (Holm-adjusted p < {result['alpha']}, {tested} rows)"
        )
    console.print(
        f"[dim]delta = B - A from {result['reps']:,} bootstrap resamples of requests or steps, "
        f"matched by id across the runs (seed {result['seed']}); p adj: Holm over all rows; "
        f"Holm {round(100 * result['confidence'])}% CI: each row's percentile interval at the "
        "level Holm tested it at, so it excludes 0 exactly when the row is significant "
        "(--json also gives each row's own 95% interval, ci)[/dim]"
    )


def trim_costs(paths: dict[str, Path]) -> dict:
    """Each run's cost of trimming (its policy against static on its own traffic: a
    prediction per run, not a bootstrap of the difference), or why it has none."""
    pairs = {}
    for name, path in paths.items():
        run = open_run(path)
        why = too_large_for_whatif(run)
        pairs[name] = (None, why) if why else trim_cost_or_why(run)
    return {
        "trim_cost": {name: entries for name, (entries, _) in pairs.items()},
        "trim_cost_missing": {name: why for name, (_, why) in pairs.items()},
    }


def handle(args: argparse.Namespace) -> int:
    result = compare_runs(
        args.run_a,
        args.run_b,
        allow_mismatch=args.allow_mismatch,
        reps=args.reps,
        seed=args.seed,
        batch_sizes=args.bs,
    )
    result.update(trim_costs({"a": args.run_a, "b": args.run_b}))
    if args.json:
        print(strict_json.dumps(result, indent=2))
    elif args.csv:
        print_csv(result["rows"])
    else:
        render(result, make_console())
    if args.out is not None:
        if args.out.exists() and not args.out.is_dir():
            raise CliError(f"--out {args.out}: exists and is not a directory")
        figures = overlay_figures([args.run_a, args.run_b], args.out)
        if not (args.json or args.csv):
            make_console().print(f"wrote {len(figures)} overlaid figures to {args.out}")
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Per workload (window, accepted, committed, ceiling, utilisation) and per "
        "batch size (step time, verify tokens, throughput): B - A with a 95% cluster-bootstrap "
        "interval, a Holm-adjusted p-value and a verdict. Refuses runs whose gamma or workload "
        "sets differ unless --allow-mismatch."
    )
    p.add_argument("run_a", type=Path, metavar="RUN_A", help="baseline run directory")
    p.add_argument("run_b", type=Path, metavar="RUN_B", help="run compared against it")
    add_output_arguments(
        p,
        "one JSON object with every row",
        "one CSV row per compared metric and group (the JSON rows' keys as columns)",
    )
    p.add_argument("--reps", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="compare runs of different gamma or workload sets (common workloads only)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write the two runs' per-workload, window and load figures overlaid (PNG)",
    )
    p.add_argument(
        "--bs",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="only these batch sizes in the per-batch-size rows",
    )
    p.set_defaults(handler=handle)

"""`dspark-obs cost fit RUN_DIR --out table.json`: refit the step-cost table from a run.

The scheduler sizes every verify batch with its additive cost table; when the
table is off, budgets are off. This fits the table again from the step times
the run measured (SGLang's own least squares, see `analysis.cost_fit`), writes
it in SGLang's JSON form so it can go straight back to the server or to
`dspark-obs run --cost-table`, and shows whether it predicts the run better
than the table the run used. Where the steps record their context, it also fits
the table with a context term and writes it to a file of its own (SGLang's file
stays exactly SGLang's form), and shows both tables' errors by context length.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import strict_json
from ..analysis.cost_fit import TIME_COLUMNS, CostFit, CostFitError, check_probes, fit_cost_table
from ..outputs import write_file
from ..report import context_tables, cost_quality_table
from ..report.document import print_report_table
from ..report.figures.cost import write_cost_plots
from ..store import open_run
from ..terminal import make_console
from .errors import CliError


def parse_probes(text: str | None, option: str, name: str) -> tuple[int, ...] | None:
    """`1,8,32` as probes; a CliError naming the option for anything else."""
    if text is None:
        return None
    try:
        return check_probes(name, [int(p) for p in text.split(",") if p.strip()])
    except ValueError as exc:
        if isinstance(exc, CostFitError):
            raise CliError(f"{option}: {exc}") from exc
        raise CliError(f"{option}: expected comma-separated integers, got {text!r}") from exc


def context_out(args: argparse.Namespace) -> Path:
    """Where the context-extended table goes: `--context-out`, else beside `--out`."""
    if args.context_out is not None:
        return args.context_out
    return args.out.with_name(f"{args.out.stem}.context.json")


def render(fit: CostFit, out: Path, context_path: Path | None, plots: list[str]) -> None:
    console = make_console()
    print_report_table(
        console, cost_quality_table(fit, f"Cost table fit over {fit.steps:,} timed steps -> {out}")
    )
    for table in context_tables(fit, f"context table -> {context_path}"):
        print_report_table(console, table)
    t = fit.table
    console.print(f"bias {1e3 * t.bias_seconds:.4f} ms")
    for name, probes, values in (
        ("alpha(bs)", t.bs_probes, t.alpha_seconds),
        ("theta(M)", t.m_probes, t.theta_seconds),
    ):
        pairs = ", ".join(f"{p}: {1e3 * v:.4f}" for p, v in zip(probes, values, strict=True))
        console.print(f"{name} ms at {pairs}")
    if fit.constrained:
        console.print(
            "[yellow]no least-squares solution is a valid table (bias > 0, alpha and theta "
            f">= 0); written: the valid table nearest to the data, R² {fit.fitted.r2:.4f} "
            "per step (the least squares' below)[/yellow]"
        )
    console.print(
        f"[dim]errors per step at each step's own (bs, M); SGLang's fit at cell middles: "
        f"R² {fit.ols.r2:.4f}, RMS {1e3 * fit.ols.rms_seconds:.4f} ms; probes: bs from "
        f"{fit.bs_probes_source}, M from {fit.m_probes_source}; times: {fit.time_column}; "
        f"rel. error = |measured - predicted| / measured[/dim]"
    )
    if fit.context is None:
        console.print(f"[dim]no context term: {fit.context_missing}[/dim]")
    for path in plots:
        console.print(f"[dim]wrote {path}[/dim]")


def handle_fit(args: argparse.Namespace) -> int:
    bs_probes = parse_probes(args.bs_probes, "--bs-probes", "bs")
    m_probes = parse_probes(args.m_probes, "--m-probes", "M")
    try:
        fit = fit_cost_table(
            open_run(args.run_dir),
            bs_probes=bs_probes,
            m_probes=m_probes,
            time_column=args.time_column,
        )
    except CostFitError as exc:
        raise CliError(f"{args.run_dir}: {exc}") from exc
    write_file(args.out, fit.table.to_json())
    context_path = None
    if fit.context is not None:
        context_path = context_out(args)
        write_file(context_path, fit.context.table.to_json(), "--context-out")
    plots = write_cost_plots(fit, args.plot, args.plot_dir)
    if args.json:
        report = {
            "run": str(args.run_dir),
            "out": str(args.out),
            "table": json.loads(fit.table.to_json()),
            "context_out": None if context_path is None else str(context_path),
            "context_table": None
            if fit.context is None
            else json.loads(fit.context.table.to_json()),
            "fit": fit.to_dict(),
            "plots": plots,
        }
        print(strict_json.dumps(report, indent=2))
    else:
        render(fit, args.out, context_path, plots)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    cost_sub = p.add_subparsers(dest="cost_command", required=True, metavar="SUBCOMMAND")
    fit = cost_sub.add_parser(
        "fit",
        help="fit SGLang's additive step-cost table from a run's measured step times",
        description="Least squares of T = bias + alpha(bs) + theta(M) over (bs, M/64) cells "
        "of measured step times, as SGLang fits it; writes SGLang's JSON table and compares "
        "it with the table the run used. Where the steps record their context tokens, also "
        "fits T + c * context tokens, compares the two on held-out steps and shows both by "
        "context length.",
    )
    fit.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    fit.add_argument("--out", type=Path, required=True, help="cost table JSON to write")
    fit.add_argument(
        "--context-out",
        type=Path,
        default=None,
        help="the table with a context term, T(bs, K) + c * context tokens, written where the "
        "steps record their context (default: beside --out, NAME.context.json)",
    )
    plots = fit.add_mutually_exclusive_group()
    plots.add_argument("--plot", type=Path, default=None, help="one PNG with all three views")
    plots.add_argument(
        "--plot-dir",
        type=Path,
        default=None,
        help="directory for cost_surface.png, cost_scatter.png, cost_residuals.png",
    )
    fit.add_argument("--json", action="store_true", help="one JSON object (table, fit figures)")
    fit.add_argument(
        "--bs-probes",
        default=None,
        metavar="LIST",
        help="batch-size probes, e.g. 1,8,32 (default: the run's table's, else 1,2,4,... "
        "trimmed to the observed range)",
    )
    fit.add_argument(
        "--m-probes",
        default=None,
        metavar="LIST",
        help="verify-token probes, e.g. 64,128,256 (default: the run's table's, else "
        "64,128,...,8192 trimmed to the observed range)",
    )
    fit.add_argument(
        "--time-column",
        choices=TIME_COLUMNS,
        default="auto",
        help="measured time per step: auto = step_gpu_ms, else step_cpu_ms (as the online "
        "refit); default auto",
    )
    fit.set_defaults(handler=handle_fit)

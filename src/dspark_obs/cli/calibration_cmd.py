"""`dspark-obs calibration RUN_DIR...`: per-position confidence calibration of runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.table import Table

from .. import strict_json
from ..analysis.reliability import calibration_report, fleet_calibration_report
from ..store.fleet import open_fleet, parse_group_keys, single_run
from ..terminal import make_console, print_table
from .engine_args import add_engine_arguments, on_ray, ray_result
from .fleet_args import add_group_argument
from .output import add_output_arguments, print_csv
from .store_args import add_time_range_arguments, run_dirs_of


def handle(args: argparse.Namespace) -> int:
    with run_dirs_of(args.run_dirs, args) as args.run_dirs:
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    by = parse_group_keys(args.by)
    if on_ray(args):
        from ..engine.jobs import calibration_job

        report = ray_result(args, calibration_job, args.run_dirs, args.bins, by)
    elif single_run(args.run_dirs, by):
        report = calibration_report(args.run_dirs[0], args.bins)
    else:
        report = fleet_calibration_report(open_fleet(args.run_dirs, by), args.bins, by)
    if args.json:
        print(strict_json.dumps(report, indent=2))
        return 0
    if args.csv:
        print_csv(calibration_records(report))
        return 0
    console = make_console()
    sections = [*report["workloads"].items(), ("overall", report["overall"])]
    for group in report.get("groups", []):
        where = " ".join(f"{k}={group[k]}" for k in report["by"])
        sections.append((f"{where} {group['workload']}", group))
    for name, entry in sections:
        table = Table(
            title=f"{name}: calibration of survival ({report['bins']}-bin ECE)",
            title_justify="left",
        )
        for col in ("position", "rows", "ECE", "Brier", "AUROC", "predicted", "observed"):
            table.add_column(col, justify="right")
        for p in entry["positions"]:
            table.add_row(
                str(p["position"]),
                f"{p['count']:,}",
                *(
                    "—" if not np.isfinite(p[k]) else f"{p[k]:.4f}"
                    for k in ("ece", "brier", "auroc", "pred_mean", "target_mean")
                ),
            )
        print_table(console, table)
    console.print(
        "[dim]label at position j: the first j+1 drafts were accepted; compact rows "
        "without a known ceiling leave positions past a fully accepted window "
        "unlabelled[/dim]"
    )
    return 0


def calibration_records(report: dict) -> list[dict]:
    """`--csv`'s rows: each workload's positions, overall's, then each group's."""
    by = report.get("by") or []
    none = {k: None for k in by}
    entries = [(none, name, e) for name, e in report["workloads"].items()]
    entries.append((none, "overall", report["overall"]))
    entries += [({k: g[k] for k in by}, g["workload"], g) for g in report.get("groups") or ()]
    return [{**keys, "workload": name, **p} for keys, name, e in entries for p in e["positions"]]


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "ECE, Brier, AUROC, mean predicted and observed survival per block position, per "
        "workload and overall, from a run directory; several RUN_DIRs (or a directory of run "
        "directories) as one fleet."
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    add_group_argument(p)
    add_output_arguments(
        p,
        "one JSON object (workloads, overall)",
        "one CSV row per workload (and group) and position",
    )
    p.add_argument("--bins", type=int, default=15, help="equal-width ECE bins (default 15)")
    add_time_range_arguments(p)
    add_engine_arguments(p)
    p.set_defaults(handler=handle)

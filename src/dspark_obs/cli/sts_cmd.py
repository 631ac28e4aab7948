"""`dspark-obs sts fit RUN_DIR --out sts.json`: fit STS temperatures from a stored run.

Labels come from full verification where the run has it (static, cap-accept,
or a shadow twin); compact rows contribute only the positions they reveal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from ..analysis.confidence_rows import fit_sts_from_run
from ..calibration import save_sts
from ..terminal import make_console, print_table


def handle_fit(args: argparse.Namespace) -> int:
    cal = fit_sts_from_run(args.run_dir, args.bins)
    save_sts(cal, args.out)
    table = Table(
        title=f"STS fit over {cal.num_samples:,} request-steps -> {args.out}", title_justify="left"
    )
    for col in ("position", "temperature", "ECE before", "ECE after"):
        table.add_column(col, justify="right")
    for j, (t, before, after) in enumerate(
        zip(cal.temperatures, cal.ece_before, cal.ece_after, strict=True)
    ):
        table.add_row(str(j), f"{t:.4f}", f"{before:.4f}", f"{after:.4f}")
    print_table(make_console(), table)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    sts_sub = p.add_subparsers(dest="sts_command", required=True, metavar="SUBCOMMAND")
    fit = sts_sub.add_parser(
        "fit",
        help="fit per-position STS temperatures from a run directory",
        description="Fit one temperature per block position (grid 0.1..10, 41 log-spaced "
        "points) minimising the ECE of the running survival; writes SGLang's STS JSON.",
    )
    fit.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    fit.add_argument("--out", type=Path, required=True, help="STS JSON to write")
    fit.add_argument("--bins", type=int, default=15, help="equal-width ECE bins (default 15)")
    fit.set_defaults(handler=handle_fit)

"""`dspark-obs run`: drive the reference runtime and write a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..analysis.summary import summarize
from ..recording import default_run_dir, record_reference_run
from ..store import check_new_run_dir, open_run
from .errors import CliError
from .output import add_output_arguments
from .progress import step_progress
from .runtime_args import (
    add_runtime_arguments,
    add_store_arguments,
    calibration_from_args,
    config_from_args,
    store_options,
)
from .signals import stop_on_signals
from .summary_cmd import with_trim_cost
from .views import print_summary


def handle(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    out = args.out or default_run_dir(config.mode)
    check_new_run_dir(out)
    if args.sglang_jsonl is not None and args.sglang_jsonl.exists():
        raise CliError(f"{args.sglang_jsonl} exists; the JSONL is written to a new file")
    store = store_options(args)
    # SIGTERM and Ctrl-C end the run between steps; what ran is flushed and closed.
    stop = stop_on_signals()
    sts = calibration_from_args(
        args, config, lambda warm: step_progress(warm, "STS warm-up", not args.quiet)
    )
    if stop.is_set():
        print("interrupted before the first step; nothing stored", file=sys.stderr)
        return 0
    with step_progress(config, f"{config.mode} run", not args.quiet) as advance:
        record_reference_run(
            config,
            out,
            sts,
            on_step=advance,
            stop=stop,
            store=store,
            sglang_jsonl=args.sglang_jsonl,
        )
    run = open_run(out)
    if run.manifest.get("interrupted"):
        steps = run.manifest.get("steps", 0)
        print(f"interrupted: {steps:,} steps stored in {out}", file=sys.stderr)
    if run.manifest.get("steps"):
        print_summary(with_trim_cost(summarize(run), run), as_json=args.json, as_csv=args.csv)
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run the embedded reference DSpark runtime (no GPU, no SGLang) over a concurrency "
        "sweep and write a run directory (Parquet + run.json)."
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/TIME-MODE)")
    add_output_arguments(
        p, "print the summary as JSON", "print the summary as CSV (a row per workload)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--sglang-jsonl",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the run as SGLang's block-accept estimator JSONL (what "
        "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH gives), for `estimate --sglang-jsonl`",
    )
    add_runtime_arguments(p, steps_per_level=200, concurrency="1,8,32,64,128,256")
    add_store_arguments(p)
    p.set_defaults(handler=handle)

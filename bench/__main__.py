"""`python -m bench [--json] [--quick] [NAME...]`.

Fails only on crashes, never on timings: machines are noisy; targets are
reported (`meets_target`) for people to read.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import aggregate_update, estimator_update, render_scrape, report_large

BENCHMARKS = {
    "aggregate_update": aggregate_update,
    "estimator_update": estimator_update,
    "render_scrape": render_scrape,
    "report_large": report_large,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        choices=[*BENCHMARKS, []],
        metavar="NAME",
        help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (CI)")
    args = parser.parse_args()
    for name in args.names or BENCHMARKS:
        for rec in BENCHMARKS[name].run(args.quick):
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                target = f" (target {rec['target']})" if "target" in rec else ""
                print(
                    f"{rec['name']} {rec['parameters']}: median {rec['median']:.2f} "
                    f"{rec['unit']} [p25 {rec['p25']:.2f}, p75 {rec['p75']:.2f}]{target}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

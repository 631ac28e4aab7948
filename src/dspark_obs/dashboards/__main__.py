"""`python -m dspark_obs.dashboards [--write DIR]`: print the dashboard JSON, or write the tree."""

from __future__ import annotations

import argparse
import sys

from .definition import render_json
from .provisioning import write_tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_obs.dashboards")
    parser.add_argument(
        "--write",
        metavar="DIR",
        help="write DIR/dspark.json and DIR/provisioning/*.yml instead of printing the JSON",
    )
    args = parser.parse_args(argv)
    if args.write:
        for path in write_tree(args.write):
            print(path)
    else:
        sys.stdout.write(render_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

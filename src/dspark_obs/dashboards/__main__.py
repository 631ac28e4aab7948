"""`python -m dspark_obs.dashboards [--write DIR]`: print the generated dashboard JSON, or
write the tree from it and refresh the copy shipped in the package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .definition import render_json
from .provisioning import write_tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_obs.dashboards")
    parser.add_argument(
        "--write",
        metavar="DIR",
        help="write DIR/dspark.json and DIR/provisioning/*.yml, and the package's dspark.json "
        "(the copy `dspark-obs dashboards export` writes), instead of printing the JSON",
    )
    args = parser.parse_args(argv)
    text = render_json()
    if args.write:
        shipped = Path(__file__).with_name("dspark.json")
        shipped.write_text(text, encoding="utf-8")
        for path in [*write_tree(args.write, text), shipped]:
            print(path)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

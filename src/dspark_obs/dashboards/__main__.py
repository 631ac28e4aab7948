"""`python -m dspark_obs.dashboards [--fleet] [--write DIR]`: print a generated dashboard's
JSON, or write the tree from both and refresh the copies shipped in the package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import definition, fleet_definition
from .provisioning import DASHBOARDS, write_tree
from .selectors import RULES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspark_obs.dashboards")
    parser.add_argument(
        "--write",
        metavar="DIR",
        help="write DIR/dspark.json, DIR/dspark-fleet.json and DIR/provisioning/*.yml, and the "
        "package's copies (what `dspark-obs dashboards export` writes), instead of printing",
    )
    parser.add_argument(
        "--fleet", action="store_true", help="print the fleet dashboard rather than the main one"
    )
    args = parser.parse_args(argv)
    texts = {"main": definition.render_json(), "fleet": fleet_definition.render_json()}
    if args.write:
        shipped = []
        for name, text in texts.items():
            path = Path(__file__).with_name(DASHBOARDS[name])
            path.write_text(text, encoding="utf-8")
            shipped.append(path)
        # the rules ship beside the dashboards (deploy/rules is where they are edited)
        deploy = Path(args.write).resolve().parent / "deploy" / "rules"
        for name in RULES:
            if (deploy / name).is_file():
                path = Path(__file__).with_name("rules") / name
                path.write_text((deploy / name).read_text(encoding="utf-8"), encoding="utf-8")
                shipped.append(path)
        # the repository keeps its rules in deploy/, not beside the dashboards' JSON
        for path in [*write_tree(args.write, texts, rules=False), *shipped]:
            print(path)
    else:
        sys.stdout.write(texts["fleet" if args.fleet else "main"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

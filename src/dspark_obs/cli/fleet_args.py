"""`--by`, shared by the commands that read many runs as one fleet.

`summary`, `calibration`, `estimate` and `report` take the same grouping keys; one
definition keeps the option's name and form alike (`store.fleet.parse_group_keys` parses
it).
"""

from __future__ import annotations

import argparse

#: `--by`'s help where a command's figures gain per-group views.
GROUP_HELP = "also per group of node, rank and/or mode, comma-separated (e.g. node,rank)"


def add_group_argument(p: argparse.ArgumentParser, help: str = GROUP_HELP) -> None:
    p.add_argument("--by", default=None, metavar="KEYS", help=help)

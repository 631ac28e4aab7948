"""How a command prints its result: tables for people, `--json` for programs, `--csv` for
spreadsheets and data frames.

A CSV holds one kind of record per row, so each command names its records (a summary's
workload entries, a comparison's rows, a prediction's cells); a record's nested figures
become dotted columns (`greedy.point`) and its short lists numbered ones (`ci.0`,
`ci.1`), so the same names address a figure in the JSON and in the CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable


def add_output_arguments(p: argparse.ArgumentParser, json_help: str, csv_help: str) -> None:
    """`--json` and `--csv`, which exclude each other."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help=json_help)
    group.add_argument("--csv", action="store_true", help=csv_help)


def _flat(value, prefix: str, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list | tuple) and all(not isinstance(v, dict | list) for v in value):
        for i, v in enumerate(value):
            out[f"{prefix}.{i}"] = v
    elif isinstance(value, list | tuple):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value


def flatten(record: dict) -> dict:
    """One CSV row's cells: nested keys dotted, lists of scalars numbered."""
    out: dict = {}
    _flat(record, "", out)
    return out


def print_csv(records: Iterable[dict]) -> None:
    """The records as CSV on stdout, with every column any of them has (empty where a
    record lacks one), in the order they first appear."""
    rows = [flatten(r) for r in records]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)

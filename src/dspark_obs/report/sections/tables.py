"""Tables of one row per record, with each column's header beside the cell that fills it.

Shared by the sections whose tables list records (workloads, load levels, requests), so
that they format cells the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...numbers import fmt
from ..document import Table

Cell = Callable[[dict], str]


def num_cell(key: str, digits: int = 3) -> Cell:
    return lambda r: fmt(r[key], digits)


def name_cell(key: str) -> Cell:
    return lambda r: r[key] or "(none)"


def rows_table(
    title: str,
    columns: dict[str, Cell],
    rows: Iterable[dict],
    note: str = "",
    *,
    headline: bool = False,
) -> Table:
    """A table of one row per record, from `{header: cell}`.

    Each header sits beside the cell that fills it, so a column added or moved
    cannot drift out of line with its values.
    """
    cells = [[cell(r) for cell in columns.values()] for r in rows]
    return Table(title, list(columns), cells, note, headline)

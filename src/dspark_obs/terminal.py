"""Tables in a terminal of any width: too wide, a table is split by columns, never cut.

Rich fits a wide table to the console by shrinking its columns, which turns headers into
`cover…` and numbers into `1,0…`, and breaks interval cells over two lines: the figures a
user came for become unreadable. So every command prints its tables through
`print_table`, which measures each column's natural width and, where the whole does not
fit, prints the table as several, each with the row-naming columns (the leading
left-aligned ones) and as many of the others as fit.

The width is the terminal's, or `COLUMNS` when it is set (piped output too, so
`COLUMNS=200 dspark-obs estimate RUN | less` is wide), else 120 columns when piped. Piped
lines of text are never broken: a path or a header line must stay whole for whoever
greps it.

Cells are text, never markup: names from clients reach tables (a workload `[/bold]`, a rid
holding a terminal escape), so `print_table` shows every string cell, header and title as
typed and with its unprintable characters escaped (`names.printable`). Styles come from
columns and rows.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .names import printable

PIPED_WIDTH = 120


def _columns_env() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def make_console(*, stderr: bool = False) -> Console:
    """The console of a command's output (or its status lines, `stderr`)."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=_columns_env() or PIPED_WIDTH, soft_wrap=True)


def _natural(console: Console, table: Table) -> list[int]:
    """Each column's width with no cell wrapped or cut."""
    options = console.options.update(width=10_000)
    widths = []
    for column in table.columns:
        cells = [column.header, *column.cells]
        widths.append(max(Measurement.get(console, options, c).maximum for c in cells))
    return widths


def _width(widths: list[int]) -> int:
    """A table's width from its columns': one space of padding each side, and the rules."""
    return sum(widths) + 3 * len(widths) + 1


def _keys(table: Table) -> int:
    """How many leading columns name a row (left-aligned ones, at least one)."""
    n = 0
    for column in table.columns:
        if column.justify not in ("left", "default"):
            break
        n += 1
    return max(1, min(n, len(table.columns) - 1))


def _part(table: Table, indices: list[int], title: str | None, last: bool) -> Table:
    part = Table(
        title=title,
        title_justify=table.title_justify,
        caption=table.caption if last else None,
        caption_justify=table.caption_justify,
    )
    columns = [table.columns[i] for i in indices]
    for c in columns:
        part.add_column(c.header, justify=c.justify, style=c.style, no_wrap=True)
    cells = [list(c.cells) for c in columns]
    for r, row in enumerate(table.rows):
        part.add_row(*(col[r] for col in cells), style=row.style, end_section=row.end_section)
    return part


def split(console: Console, table: Table, width: int) -> list[Table]:
    """`table` as tables each at most `width` wide (where one column and the row names fit)."""
    widths = _natural(console, table)
    if _width(widths) <= width:
        for column in table.columns:
            column.no_wrap = True
        return [table]
    keys = list(range(_keys(table)))
    groups: list[list[int]] = []
    for i in range(len(keys), len(widths)):
        if groups and _width([widths[k] for k in (*keys, *groups[-1], i)]) <= width:
            groups[-1].append(i)
        else:
            groups.append([i])
    title = str(table.title) if table.title is not None else ""
    return [
        _part(
            table,
            keys + group,
            f"{title} ({n}/{len(groups)})".lstrip(),
            n == len(groups),
        )
        for n, group in enumerate(groups, 1)
    ]


def _literal(table: Table) -> None:
    """Every string of `table` as a `Text` of itself (rich would read it as markup)."""
    for column in table.columns:
        if isinstance(column.header, str):
            column.header = Text(printable(column.header))
        column._cells = [Text(printable(c)) if isinstance(c, str) else c for c in column._cells]
    if isinstance(table.title, str):
        table.title = Text(printable(table.title), style="table.title")


def print_table(console: Console, table: Table) -> None:
    """`table` on `console`, its strings as typed, split by columns where it is wider than
    the console."""
    _literal(table)
    for part in split(console, table, console.width):
        console.print(part)

"""How the `requests` table's gamma-wide matrices lie in a Parquet part, both ways.

In memory (polars, `tables.py`) a matrix is one `Array(dtype, gamma)` column. On disk it
is one plain column a position, `NAME_0` to `NAME_{gamma-1}`: Parquet stores a fixed-size
list as a list, with a repetition and a definition level for each of its values, and
decoding those levels made the matrices most of what reading a large run costs, about
twice the time the same values take as plain columns. A row with no matrix (a source that
does not record it) is null in every position's column; a row's matrix is null where its
position 0 is.

Runs written before this layout hold the matrices as list columns; a part is read in
whichever form it has (`in_memory`), so one table may hold both. Parts are compressed
with LZ4, whose decoding costs a third of zstd's, for about a tenth more bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import polars as pl

from ..telemetry.batch import MATRIX_COLUMNS

#: The parts' codec (see above).
COMPRESSION = "lz4"

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def position_column(name: str, j: int) -> str:
    """The on-disk column of matrix `name`'s position `j` (from 0)."""
    return f"{name}_{j}"


def split_matrices(names: Iterable[str]) -> dict[str, int]:
    """The matrices a part stores a column a position, and their width, from the part's
    column names: `NAME_0` present and `NAME` absent, the width the run of
    `NAME_0, NAME_1, ...` present."""
    present = set(names)
    widths = {}
    for name in MATRIX_COLUMNS:
        if name in present or position_column(name, 0) not in present:
            continue
        width = 1
        while position_column(name, width) in present:
            width += 1
        widths[name] = width
    return widths


def on_disk(df: pl.DataFrame) -> pl.DataFrame:
    """`df` as a part stores it: each matrix column in `MATRIX_COLUMNS` a column a
    position, in the matrix's place; other columns as they are."""
    matrices = [c for c in df.columns if c in MATRIX_COLUMNS and isinstance(df.schema[c], pl.Array)]
    if not matrices:
        return df
    columns: list[pl.Expr] = []
    for c in df.columns:
        if c in matrices:
            width = df.schema[c].size  # type: ignore[attr-defined]
            columns += [pl.col(c).arr.get(j).alias(position_column(c, j)) for j in range(width)]
        else:
            columns.append(pl.col(c))
    return df.select(columns)


def in_memory(frame: Frame, names: Iterable[str] | None = None) -> Frame:
    """A part's frame (or several parts of one layout) with its matrices as `Array`
    columns, after the other columns in `MATRIX_COLUMNS`' order, as `requests_schema`
    orders them. `names`: the part's column names where known (a reader that checked
    its footer), else the frame's own."""
    widths = split_matrices(frame.collect_schema().names() if names is None else names)
    if not widths:
        return frame
    flat = [position_column(m, j) for m, w in widths.items() for j in range(w)]
    return frame.with_columns(
        pl.when(pl.col(position_column(m, 0)).is_null())
        .then(None)
        .otherwise(pl.concat_arr([position_column(m, j) for j in range(w)]))
        .alias(m)
        for m, w in widths.items()
    ).drop(flat)


def in_memory_schema(schema: pl.Schema) -> pl.Schema:
    """The schema `in_memory` gives a part of this on-disk schema. A matrix whose positions'
    columns differ in type has none: it is given as the struct of its columns, which no
    table's schema expects, so a reader refuses the part naming them."""
    widths = split_matrices(schema.names())
    if not widths:
        return schema
    flat = {position_column(m, j) for m, w in widths.items() for j in range(w)}
    out = {k: v for k, v in schema.items() if k not in flat}
    for m, w in widths.items():
        columns = {position_column(m, j): schema[position_column(m, j)] for j in range(w)}
        if len(set(columns.values())) == 1:
            out[m] = pl.Array(schema[position_column(m, 0)], w)
        else:
            out[m] = pl.Struct(columns)
    return pl.Schema(out)

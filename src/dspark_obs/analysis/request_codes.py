"""Request ids as integers, shared by the tables that name a request.

The analyses that follow a request (the walks' join onto the request-steps, the
(level, request) clusters of an interval) need only which rows are the same request,
never the id's text. Joining and ranking on the strings cost most of loading a 10M
request-step run (about 7 s of `whatif`'s 23); one categorical cast of every table's
ids together takes about 1 s there, and what follows is integer work.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def request_codes(*frames: pl.LazyFrame) -> list[np.ndarray]:
    """Each frame's `rid` as int64 codes, equal across frames exactly where the ids are
    (1 and up, in the order of each id's first row; a null id is 0). The frames are cast
    as one column, so that one mapping holds for all of them."""
    lengths = [f.select(pl.len()).collect().item() for f in frames]
    codes = (
        pl.concat([f.select("rid") for f in frames])
        .select(pl.col("rid").cast(pl.Categorical).to_physical().cast(pl.Int64) + 1)
        .collect()
        .to_series()
        .fill_null(0)
        .to_numpy()
    )
    return np.split(_by_first_row(codes), np.cumsum(lengths)[:-1])


def _by_first_row(codes: np.ndarray) -> np.ndarray:
    """`codes` renumbered in the order of their first rows. The cast numbers the ids in
    the order its threads meet them, which differs from call to call on a run of several
    parts; sums taken in code order (an interval's clusters) would then round differently
    each time. Renumbering costs about 0.1 s on 8M rows, no sort of the rows."""
    if len(codes) == 0:
        return codes
    first = np.full(int(codes.max()) + 1, len(codes), np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    first[0] = -1  # a null id keeps code 0
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[codes]


def dense_codes(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Non-negative integer `keys` renumbered 0..n-1 in key order, and n: by a table of the
    keys present where the key range is small against the rows (no sort), else by a sort."""
    if len(keys) == 0:
        return keys.astype(np.int64), 0
    size = int(keys.max()) + 1
    if size > 4 * len(keys) + (1 << 20):
        uniq, inverse = np.unique(keys, return_inverse=True)
        return inverse.astype(np.int64), len(uniq)
    seen = np.zeros(size, bool)
    seen[keys] = True
    code = np.cumsum(seen) - 1
    return code[keys], int(code[-1]) + 1


def positions(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The index of each query in `sorted_keys` (ascending, unique), -1 where absent."""
    if len(sorted_keys) == 0:
        return np.full(len(queries), -1, np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == queries, pos, -1)

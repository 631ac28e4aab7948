"""Each request-step's tail walk (the ceiling estimator's), joined by integer codes."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..analysis.request_codes import positions


def walk_columns(
    walks, walk_rid: list, step_keys, step: np.ndarray, rid, rows: np.ndarray | None = None
) -> dict:
    """Each row's walk (`walk_exact`, `walk_lo`, `walk_point`, `walk_hi`; NaN and False where
    none covered it), the last of a block's walks where the table holds more than one;
    looked up for rows `rows` alone where given.

    A walk names its block by (rank, forward_ct, rid): matched here as the integer pair
    (the row's step, its request code) by a sort and a binary search, where a join on
    the string id cost most of loading the run."""
    n = len(step)
    out = {"walk_exact": np.zeros(n, bool)}
    out.update({c: np.full(n, np.nan) for c in ("walk_lo", "walk_point", "walk_hi")})
    if walks is None:
        return out
    w = walks.select(
        "rank",
        "forward_ct",
        ((pl.col("method") == "greedy") & (pl.col("status") == "exact")).alias("exact"),
        pl.col("lo", "point", "hi").cast(pl.Float64),
    ).collect()
    span = int(max(rid.max(initial=0), walk_rid[0].max(initial=0))) + 1
    walk_step = positions(step_keys, (w["rank"].to_numpy() << 40) + w["forward_ct"].to_numpy())
    walk_key = walk_step * span + walk_rid[0]
    by_key = np.flatnonzero(walk_step >= 0)
    by_key = by_key[np.argsort(walk_key[by_key], kind="stable")]
    walk_key = walk_key[by_key]
    last = np.append(walk_key[1:] != walk_key[:-1], True)  # a block's last walk
    if rows is None:
        hit = positions(walk_key[last], step * span + rid)
        rows = np.flatnonzero(hit >= 0)
    else:
        hit = positions(walk_key[last], step[rows] * span + rid[rows])
        rows = rows[hit >= 0]
    take = by_key[last][hit[hit >= 0]]
    out["walk_exact"][rows] = w["exact"].fill_null(False).to_numpy()[take]
    for c in ("lo", "point", "hi"):
        out[f"walk_{c}"][rows] = w[c].to_numpy()[take]
    return out

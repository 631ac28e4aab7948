"""The truth for SGLang's block-accept JSONL written from a reference run
(`dspark-obs run --sglang-jsonl`): what cap-accept would have accepted at each
request-step of the file.

A line's (rid, fct) is a request-step of the run (rank 0). Its truth is the run's
ceiling there: the observed one in a cap-accept run, else the cap-accept shadow's
`shadow_ceiling`, in accepted drafts as the walk over the file counts
(`block_accept_walk`), so `walk_blocks(log)["point"] - block_truth(log, run)` is a
block's error.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from dspark_obs.store import Run
from dspark_obs.telemetry.block_accept_log import BlockAcceptLog

__all__ = ["block_truth", "row_truth"]


def _truth_at(run: Run, rid: np.ndarray, fct: np.ndarray) -> np.ndarray:
    """The run's ceiling at each (rid, forward_ct); NaN where the run has none."""
    keys = pl.DataFrame(
        {"rid": rid.astype(str), "forward_ct": np.asarray(fct, dtype=np.int64)},
        schema={"rid": pl.String, "forward_ct": pl.Int64},
    )
    truth = (
        run.requests()
        .filter(pl.col("rank") == 0)
        .select("rid", "forward_ct", pl.coalesce("ceiling", "shadow_ceiling").alias("truth"))
    )
    joined = keys.lazy().join(truth, on=["rid", "forward_ct"], how="left", maintain_order="left")
    return joined.collect()["truth"].cast(pl.Float64).fill_null(np.nan).to_numpy()


def block_truth(log: BlockAcceptLog, run: Run) -> np.ndarray:
    """Per block of `log` (its order, as `walk_blocks` returns them), the true ceiling."""
    return _truth_at(run, log.block_rid, log.block_fct)


def row_truth(log: BlockAcceptLog, run: Run) -> np.ndarray:
    """Per row of `log` (every request-step line), the true ceiling: with the blocks'
    estimates and the exact `cl + ct` of rows that opened none, an all-steps mean."""
    return _truth_at(run, log.row_rid, log.row_fct)

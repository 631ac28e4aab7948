"""`evaluate.with_truth`, the walked blocks' truth found by a hash of their key, gives the
frame of the left join on the key itself, in the blocks' order: where every block finds at
most one row, and where the hash alone would mislead (a key twice among the truth's rows, a
null in a key, keys of other types), which the join then answers."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.evaluate import STEP_ROW, with_truth


def _join(blocks: pl.DataFrame, truth: pl.DataFrame) -> pl.DataFrame:
    keys = list(STEP_ROW)
    return blocks.join(truth, on=keys, how="left", maintain_order="left").drop(keys)


def _frames(seed: int, n: int = 2000) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Truth rows of many steps and requests, and blocks on a shuffled most of them and on
    keys the truth lacks (another rank, another step, another request)."""
    rng = np.random.default_rng(seed)
    step = rng.integers(0, 60, n)
    truth = pl.DataFrame(
        {
            "rank": rng.integers(0, 2, n),
            "forward_ct": step,
            "rid": [f"r{i}" for i in rng.permutation(n)],
            "truth": rng.integers(0, 8, n),
        }
    ).unique(subset=list(STEP_ROW), maintain_order=True)
    picked = truth.sample(fraction=0.8, seed=seed, shuffle=True)
    lost = picked.head(50).with_columns(
        pl.col("rank") + 5, pl.col("forward_ct") + 1000, pl.col("rid") + "x"
    )
    blocks = pl.concat([picked, lost]).sample(fraction=1.0, seed=seed + 1, shuffle=True)
    blocks = blocks.drop("truth").with_columns(
        lo=pl.Series(rng.uniform(0, 7, blocks.height)), method=pl.lit("greedy")
    )
    return blocks, truth


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_truth_is_the_join(seed):
    blocks, truth = _frames(seed)
    got = with_truth(blocks, truth)
    assert got["truth"].null_count() == 50  # the blocks whose keys the truth lacks
    assert got.equals(_join(blocks, truth))


def test_with_truth_where_the_hash_would_mislead():
    blocks, truth = _frames(3)
    twice = pl.concat([truth, truth.head(3).with_columns(pl.col("truth") + 1)])
    assert with_truth(blocks, twice).equals(_join(blocks, twice))  # some blocks two rows
    assert with_truth(blocks, twice).height > blocks.height
    nulls = pl.concat([truth, truth.head(1).with_columns(pl.lit(None, pl.String).alias("rid"))])
    null_blocks = pl.concat(
        [blocks, blocks.head(1).with_columns(pl.lit(None, pl.String).alias("rid"))]
    )
    got = with_truth(null_blocks, nulls)
    assert got.equals(_join(null_blocks, nulls))
    assert got["truth"][-1] is None  # a null key meets nothing, as in the join
    narrow = truth.with_columns(pl.col("rank").cast(pl.Int32))
    assert with_truth(blocks, narrow).equals(_join(blocks, narrow))

"""Integer request codes against the string ids and plain numpy."""

from __future__ import annotations

import numpy as np
import polars as pl

from dspark_obs.analysis.request_codes import dense_codes, positions, request_codes


def test_codes_are_equal_across_frames_exactly_where_the_ids_are():
    a = pl.LazyFrame({"rid": ["r1", "r2", None, "r1", "r9"]})
    b = pl.LazyFrame({"rid": ["r9", "r3", "r1", None]})
    ca, cb = request_codes(a, b)
    ids = ["r1", "r2", None, "r1", "r9", "r9", "r3", "r1", None]
    codes = np.concatenate([ca, cb])
    assert len(ca) == 5 and len(cb) == 4
    for i, x in enumerate(ids):
        for j, y in enumerate(ids):
            assert (codes[i] == codes[j]) == (x == y)
    assert (codes[[2, 8]] == 0).all() and (codes[[0, 1, 3, 4, 5, 6, 7]] > 0).all()


def test_dense_codes_by_table_and_by_sort():
    rng = np.random.default_rng(3)
    for high in (50, 10**12):  # a small key range (the table), a huge one (the sort)
        keys = rng.integers(0, high, 1000)
        codes, n = dense_codes(keys)
        uniq, inverse = np.unique(keys, return_inverse=True)
        assert n == len(uniq)
        np.testing.assert_array_equal(codes, inverse)
    assert dense_codes(np.array([], np.int64))[1] == 0


def test_positions_finds_present_keys_only():
    keys = np.array([2, 5, 9])
    np.testing.assert_array_equal(positions(keys, np.array([9, 1, 5, 10, 2])), [2, -1, 1, -1, 0])
    np.testing.assert_array_equal(positions(keys[:0], np.array([1])), [-1])


def test_codes_follow_first_rows_on_every_call_of_a_many_part_scan(tmp_path):
    """The categorical cast numbers ids in the order its threads meet them, which differs
    between calls on a scan of several files: the codes must not, or sums in code order
    would round differently from one call to the next."""
    rng = np.random.default_rng(5)
    for i in range(6):
        ids = [f"r{k}" if k % 97 else None for k in rng.integers(0, 20_000, 100_000)]
        pl.DataFrame({"rid": ids}).write_parquet(tmp_path / f"part{i}.parquet")
    scan = pl.scan_parquet(tmp_path / "*.parquet")
    (codes,) = request_codes(scan)
    ids = scan.collect()["rid"].to_list()
    # the expected numbering, in plain Python: 1, 2, ... as each id first appears
    seen: dict = {None: 0}
    expected = [seen.setdefault(x, len(seen)) for x in ids]
    np.testing.assert_array_equal(codes, expected)
    for _ in range(3):
        np.testing.assert_array_equal(request_codes(scan)[0], codes)

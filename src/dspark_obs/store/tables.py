"""`StepBatch` <-> the run store's two tables, `steps` and `requests`.

The in-memory form keeps SGLang's sentinels (`-1`, `None`, NaN) so a record
converts back to SGLang's JSON exactly; the on-disk form turns those sentinels
into real nulls so that polars, pandas and DuckDB users get correct counts and
means without knowing DSpark's conventions. This module is the one place that
knows both, and the two directions are exact inverses (the tests round-trip
every field).

Conversion is columnar: per-request numpy arrays are concatenated across the
batches once, and every transformation is a polars expression over the whole
column. The only Python loops run once per batch, never once per request.

A matrix column a source lacks (`None` in the batch) becomes null rows, not
NaN rows, so "not recorded" and "recorded as NaN" stay distinct on disk. On the
way back a batch whose rows are all null gets `None`; a batch with no rows at
all also gets `None`, as there is nothing on disk to tell an empty matrix from
a missing one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ..telemetry.batch import (
    MATRIX_COLUMNS,
    REQUEST_COLUMNS,
    STEP_OPTIONAL_FLOAT_FIELDS,
    STEP_OPTIONAL_INT_FIELDS,
    StepBatch,
    step_field_names,
)
from .errors import RunStoreError

STEPS = "steps"
REQUESTS = "requests"

#: What identifies a step within a run (SGLang's forward counter is per rank).
STEP_KEY = ("rank", "forward_ct")

#: Leading columns of both tables, in order.
_LEAD = ("rank", "forward_ct", "mode", "gamma")

#: Request columns whose sentinel becomes null on disk (besides greedy/matrices).
_NULL_IF_NAN = ("temperature", "bonus_logprob")
_NULL_IF_MINUS_ONE = ("shadow_ceiling",)

#: Derived step column: the context tokens the step's requests attend to (the sum of
#: their `prefix_len`), null for a step recorded without request rows. What attention
#: costs grows with it, and the cost fit reads it from the steps alone; it is dropped on
#: read, and runs written before it existed lack it (`OPTIONAL_STEP_COLUMNS`).
CONTEXT_TOKENS = "context_tokens"
#: Derived step column: when the step was stored (Unix seconds), what a production store's
#: time ranges select steps by (`store/time_range.py`); null where the writer was given no
#: time, dropped on read, and absent from runs written before it existed.
STEP_TIME = "time"
OPTIONAL_STEP_COLUMNS = (CONTEXT_TOKENS, STEP_TIME)


def _step_scalars() -> list[str]:
    """Step scalars after the lead columns, in `StepBatch` declaration order."""
    return [n for n in step_field_names() if n not in _LEAD]


def _scalar_dtype(name: str) -> pl.DataType:
    if name in STEP_OPTIONAL_FLOAT_FIELDS:
        return pl.Float64()
    return pl.Int64()


def steps_schema() -> pl.Schema:
    """Column order and types of the `steps` table."""
    cols: dict[str, pl.DataType] = {
        "rank": pl.Int64(),
        "forward_ct": pl.Int64(),
        "mode": pl.String(),
        "gamma": pl.Int64(),
        "has_reqs": pl.Boolean(),
    }
    for name in _step_scalars():
        cols[name] = _scalar_dtype(name)
    cols[CONTEXT_TOKENS] = pl.Int64()
    cols[STEP_TIME] = pl.Float64()
    return pl.Schema(cols)


def _request_dtype(name: str) -> pl.DataType:
    dtype = REQUEST_COLUMNS[name]
    if dtype is object:
        return pl.String()
    if name == "greedy":
        return pl.Boolean()
    if dtype is np.float64:
        return pl.Float64()
    return pl.Int64()


def _matrix_dtype(name: str, gamma: int) -> pl.DataType:
    inner = pl.Int64() if MATRIX_COLUMNS[name] is np.int64 else pl.Float64()
    return pl.Array(inner, gamma)


def requests_schema(gamma: int) -> pl.Schema:
    """Column order and types of the `requests` table for a run of block size `gamma`."""
    cols: dict[str, pl.DataType] = {
        "rank": pl.Int64(),
        "forward_ct": pl.Int64(),
        "mode": pl.String(),
        "gamma": pl.Int64(),
    }
    for name in REQUEST_COLUMNS:
        cols[name] = _request_dtype(name)
    cols["window"] = pl.Int64()
    cols["ceiling"] = pl.Int64()
    for name in MATRIX_COLUMNS:
        cols[name] = _matrix_dtype(name, gamma)
    return pl.Schema(cols)


def common_gamma(batches: Sequence[StepBatch]) -> int:
    """The block size shared by `batches`; the `requests` table's matrix width depends on it."""
    gammas = {int(b.gamma) for b in batches}
    if len(gammas) != 1:
        raise RunStoreError(
            f"batches disagree on gamma ({sorted(gammas)}); a run has one block size"
        )
    return gammas.pop()


def steps_frame(
    batches: Sequence[StepBatch], times: Sequence[float | None] | None = None
) -> pl.DataFrame:
    """One row per batch; optional scalars that are `None` become nulls, and so do the
    steps' `times` where not given."""
    schema = steps_schema()
    data = {
        name: [getattr(b, name) for b in batches]
        for name in schema.names()
        if name not in OPTIONAL_STEP_COLUMNS
    }
    data[CONTEXT_TOKENS] = [int(b.prefix_len.sum()) if b.has_reqs else None for b in batches]
    data[STEP_TIME] = list(times) if times is not None else [None] * len(batches)
    return pl.DataFrame(data, schema=schema)


def requests_frame(batches: Sequence[StepBatch], gamma: int | None = None) -> pl.DataFrame:
    """One row per request-step of the batches that carry request rows."""
    if gamma is None:
        gamma = common_gamma(batches) if batches else 0
    schema = requests_schema(gamma)
    rows = [b for b in batches if b.num_reqs]
    if not rows:
        return pl.DataFrame(schema=schema)
    for b in rows:
        if not b.has_reqs:
            raise RunStoreError(
                f"step rank={b.rank} forward_ct={b.forward_ct} has has_reqs=False "
                f"but {b.num_reqs} request rows"
            )
        if b.gamma != gamma:
            raise RunStoreError(f"batch gamma {b.gamma} != table gamma {gamma}")

    counts = np.fromiter((b.num_reqs for b in rows), dtype=np.int64, count=len(rows))
    n = int(counts.sum())
    step_idx = np.repeat(np.arange(len(rows)), counts)

    def lead(name: str) -> np.ndarray:
        return np.fromiter((getattr(b, name) for b in rows), dtype=np.int64, count=len(rows))

    cols: dict[str, pl.Series] = {
        "rank": pl.Series("rank", np.repeat(lead("rank"), counts), dtype=pl.Int64),
        "forward_ct": pl.Series("forward_ct", np.repeat(lead("forward_ct"), counts), pl.Int64),
        "mode": pl.Series("mode", [b.mode for b in rows], dtype=pl.String).gather(step_idx),
        "gamma": pl.Series("gamma", np.repeat(lead("gamma"), counts), dtype=pl.Int64),
    }
    for name, dtype in REQUEST_COLUMNS.items():
        arr = np.concatenate([getattr(b, name) for b in rows], dtype=dtype)
        if dtype is object:
            # polars infers an object array's type from its first element, so a
            # leading None defeats it; a list of the same references does not
            cols[name] = pl.Series(name, arr.tolist(), dtype=pl.String, strict=True)
        else:
            cols[name] = pl.Series(name, arr)
    cols["ceiling"] = pl.Series("ceiling", np.concatenate([b.ceiling for b in rows]), pl.Int64)

    matrix_null: dict[str, np.ndarray] = {}
    for name, dtype in MATRIX_COLUMNS.items():
        mats = [getattr(b, name) for b in rows]
        missing = np.fromiter((m is None for m in mats), dtype=bool, count=len(mats))
        if missing.all():
            cols[name] = pl.Series(name, dtype=_matrix_dtype(name, gamma)).extend_constant(None, n)
            continue
        filled = [
            np.zeros((c, gamma), dtype=dtype) if m is None else m
            for m, c in zip(mats, counts, strict=True)
        ]
        cols[name] = pl.Series(name, np.concatenate(filled, dtype=dtype))
        if missing.any():
            matrix_null[name] = np.repeat(missing, counts)

    null_masks = {f"__null_{k}": pl.Series(v) for k, v in matrix_null.items()}
    df = pl.DataFrame({**cols, **null_masks})
    greedy = pl.col("greedy")
    exprs = [
        pl.when(greedy < 0).then(None).otherwise(greedy != 0).alias("greedy"),
        *(pl.col(c).fill_nan(None) for c in _NULL_IF_NAN),
        *(
            pl.when(pl.col(c) == -1).then(None).otherwise(pl.col(c)).alias(c)
            for c in (*_NULL_IF_MINUS_ONE, "ceiling")
        ),
        (pl.col("verify_len") - 1).alias("window"),
        *(
            pl.when(pl.col(f"__null_{c}")).then(None).otherwise(pl.col(c)).alias(c)
            for c in matrix_null
        ),
    ]
    return df.with_columns(exprs).select(schema.names()).cast(dict(schema))


def batches_to_frames(
    batches: Sequence[StepBatch],
    gamma: int | None = None,
    times: Sequence[float | None] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`(steps, requests)` for `batches`; `gamma` fixes the matrix width when known,
    `times` (one a batch) is when each step was stored."""
    return steps_frame(batches, times), requests_frame(batches, gamma)


def _require(df: pl.DataFrame, names: Sequence[str], what: str) -> None:
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise RunStoreError(f"{what} frame lacks columns {missing}")


def _restore_request_column(s: pl.Series, name: str) -> np.ndarray:
    """Back to the in-memory form: nulls become the sentinel `StepBatch` uses."""
    dtype = REQUEST_COLUMNS[name]
    if dtype is object:
        return s.cast(pl.String).to_numpy().astype(object, copy=False)
    if name == "greedy":
        return s.cast(pl.Int8).fill_null(-1).to_numpy().astype(np.int8, copy=False)
    if dtype is np.float64:
        return s.cast(pl.Float64).fill_null(np.nan).to_numpy().astype(np.float64, copy=False)
    return s.cast(pl.Int64).fill_null(-1).to_numpy().astype(np.int64, copy=False)


def _restore_matrix(s: pl.Series, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`(values [n, gamma], row is null [n])`; null rows hold the column's sentinel."""
    null = s.is_null().to_numpy()
    if MATRIX_COLUMNS[name] is np.int64:
        inner: pl.DataType = pl.Int64()
        fill: float | int = -1
    else:
        inner = pl.Float64()
        fill = np.nan
    if isinstance(s.dtype, pl.Array):
        width = s.dtype.size
    else:  # a frame built by hand may carry lists; they must still be rectangular
        lengths = s.list.len().drop_nulls().unique()
        if len(lengths) > 1:
            raise RunStoreError(f"column {name} has rows of different lengths")
        width = int(lengths[0]) if len(lengths) else 0
    s = s.cast(pl.Array(inner, width))
    if null.any():
        s = s.fill_null(pl.lit([fill] * width, dtype=pl.Array(inner, width)))
    values = s.to_numpy()
    if values.ndim != 2:
        values = values.reshape(len(s), width)
    return values.astype(MATRIX_COLUMNS[name], copy=False), null


def frames_to_batches(
    steps_df: pl.DataFrame, requests_df: pl.DataFrame | None = None
) -> list[StepBatch]:
    """Rebuild the batches, in `steps_df` row order, with SGLang's sentinels restored.

    Request rows are matched to their step by `(rank, forward_ct)`, which must
    be unique among the steps given; rows keep their order within a step.
    """
    _require(steps_df, ["has_reqs", *step_field_names()], "steps")
    if steps_df.select(pl.struct(STEP_KEY).is_duplicated().any()).item():
        raise RunStoreError("steps frame has duplicate (rank, forward_ct) keys")
    n_steps = steps_df.height
    empty = requests_df is None or requests_df.height == 0

    req_arrays: dict[str, np.ndarray] = {}
    matrices: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    counts = np.zeros(n_steps, dtype=np.int64)
    if not empty:
        assert requests_df is not None
        _require(requests_df, [*STEP_KEY, *REQUEST_COLUMNS], "requests")
        keys = steps_df.select(pl.col(k).cast(pl.Int64) for k in STEP_KEY).with_row_index("__step")
        joined = (
            requests_df.with_columns(pl.col(k).cast(pl.Int64) for k in STEP_KEY)
            .with_row_index("__row")
            .join(keys, on=list(STEP_KEY), how="left")
        )
        orphans = joined["__step"].null_count()
        if orphans:
            raise RunStoreError(f"{orphans} request rows have no matching step")
        joined = joined.sort(["__step", "__row"])
        step_of_row = joined["__step"].to_numpy()
        counts = np.bincount(step_of_row, minlength=n_steps).astype(np.int64)
        for name in REQUEST_COLUMNS:
            req_arrays[name] = _restore_request_column(joined[name], name)
        for name in MATRIX_COLUMNS:
            if name in joined.columns:
                matrices[name] = _restore_matrix(joined[name], name)
    offsets = np.concatenate([[0], np.cumsum(counts)])

    out: list[StepBatch] = []
    optional = set(STEP_OPTIONAL_INT_FIELDS) | set(STEP_OPTIONAL_FLOAT_FIELDS)
    scalars = [n for n in step_field_names() if n != "mode"]
    for i, row in enumerate(steps_df.iter_rows(named=True)):
        kwargs: dict[str, object] = {}
        for name in scalars:
            value = row[name]
            if value is None and name not in optional:
                value = -1
            kwargs[name] = value
        kwargs["mode"] = row["mode"] or ""
        kwargs["has_reqs"] = bool(row["has_reqs"])
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        if hi > lo and not kwargs["has_reqs"]:
            raise RunStoreError(
                f"step rank={row['rank']} forward_ct={row['forward_ct']} has has_reqs=False "
                f"but {hi - lo} request rows"
            )
        if hi > lo:
            for name, arr in req_arrays.items():
                kwargs[name] = arr[lo:hi]
            for name, (values, null) in matrices.items():
                kwargs[name] = None if null[lo:hi].all() else values[lo:hi]
        out.append(StepBatch(**kwargs))  # type: ignore[arg-type]
    return out

"""The telemetry model's invariants, held again on read: a stored step the gate would refuse
is left out of every reader, counted by the gate's own reasons.

A run directory's checksums prove only that its parts are the files its records describe,
not that a writer of ours wrote them: a part may be crafted, or written by another tool.
The pipeline's gate (`StepBatch.validate`, `Pipeline.ingest`) refuses a step whose rows
break the model (accepted beyond the window, committed past gamma + 1, a probability
outside [0, 1], a time that is no time), and every number we publish assumes it did. So
each flush's pair of parts (`steps` and `requests` part N, written together) is checked
here once per `Run`, with polars expressions over whole columns, and a step that breaks
an invariant is rejected whole, its step row and all its request rows, under the reason
the gate gives (`REASONS`); request rows with no step in their flush go too. Readers then
see the same steps replay does: `Run.scan` leaves the rejected keys out of their flush's
parts with an anti-join (an honest run has none, and its scan is unchanged), `Run.batches`
drops them before building batches, and the counts are logged once per run and kept on
`Run.rejections`.

Besides the gate's checks, what only a stored table can get wrong: the derived columns
(`window`, `ceiling`, `context_tokens`) must equal their derivation, a step's request rows
number at most its `bs` (a sampled store keeps some) and belong to a step of their flush,
and a name (rid, workload, mode) must be at most `MAX_STRING_BYTES` (`part_bounds.py`
bounds what decoding may allocate before any of this runs). A step key may repeat across
flushes (the writer keeps a step whose counter came round again), so rejections are kept
by flush.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ..telemetry.batch import (
    MAX_FORWARD_CT,
    MAX_GAMMA,
    MAX_REQ_POOL_INDEX,
    MAX_STEP_MS,
    MODES,
    STEP_OPTIONAL_FLOAT_FIELDS,
)
from .part_bounds import MAX_STRING_BYTES
from .tables import CONTEXT_TOKENS, STEP_KEY, STEP_TIME

log = logging.getLogger(__name__)

#: Why a stored step is rejected, in the order its checks run (the first that fails names
#: it): the gate's reasons first, then what only a stored table can get wrong.
REASONS = (
    "gamma_mismatch",
    "gamma_out_of_range",
    "malformed",
    "time_out_of_range",
    "pool_index_out_of_range",
    "window_out_of_range",
    "accepted_out_of_range",
    "cap_trim_out_of_range",
    "committed_out_of_range",
    "ceiling_out_of_range",
    "probability_out_of_range",
    "name_too_long",
    "derived_mismatch",
    "orphan_rows",
)
_CODE = {r: i + 1 for i, r in enumerate(REASONS)}
_MODES = (*MODES, "")
_REASON = "__reason"
#: The request matrices that hold probabilities.
PROBABILITY_MATRICES = ("confidence", "survival")


def _first_failing(checks: list[tuple[str, pl.Expr]]) -> pl.Expr:
    """The code of the first reason whose `ok` expression is not true (null fails), else 0."""
    expr = pl.lit(0, pl.Int8)
    for reason, ok in reversed(checks):
        expr = (
            pl.when(ok.fill_null(False).not_()).then(pl.lit(_CODE[reason], pl.Int8)).otherwise(expr)
        )
    return expr.alias(_REASON)


def _name_ok(name: str) -> pl.Expr:
    return pl.col(name).is_null() | (pl.col(name).str.len_bytes() <= MAX_STRING_BYTES)


def _step_checks(gamma: int | None, columns: list[str]) -> list[tuple[str, pl.Expr]]:
    g = pl.col("gamma")
    times = []
    for name in STEP_OPTIONAL_FLOAT_FIELDS:
        if name not in columns:
            continue
        c = pl.col(name)
        ok = c.is_finite()
        if name.endswith("_ms"):  # SGLang's -1 is no value (validate_times)
            ok = ok & (((c >= 0) & (c <= MAX_STEP_MS)) | (c == -1))
        times.append(c.is_null() | ok)
    if STEP_TIME in columns:
        times.append(
            pl.col(STEP_TIME).is_null() | (pl.col(STEP_TIME).is_finite() & (pl.col(STEP_TIME) >= 0))
        )
    checks = [
        ("gamma_mismatch", g == gamma if gamma is not None else pl.lit(True)),
        ("gamma_out_of_range", g.is_between(1, MAX_GAMMA)),
        (
            "malformed",
            pl.col("rank").is_not_null()
            & pl.col("forward_ct").is_between(0, MAX_FORWARD_CT)
            & pl.col("has_reqs").is_not_null()
            & (pl.col("mode").is_null() | pl.col("mode").is_in(_MODES)),
        ),
        ("time_out_of_range", pl.all_horizontal(times or [pl.lit(True)])),
        ("name_too_long", _name_ok("mode")),
    ]
    return checks


def probabilities_ok(name: str) -> pl.Expr:
    """Whether a row's probability matrix `name` lies in [0, 1] (no NaN); true where null."""
    return pl.col(name).arr.eval(pl.element().is_between(0, 1)).arr.all().fill_null(True)


def within_probabilities(columns: list[str]) -> list[pl.Expr]:
    """The probability matrices of `columns`, a row outside [0, 1] read as not recorded.

    Decoding a run's matrices is most of what checking them costs, so scans do not check
    them up front: these expressions run only in a query that reads the matrix, which
    decodes it anyway (`Run.scan`). Replay (`Run.batches`) rejects such a step whole, as
    the gate does.
    """
    return [
        pl.when(probabilities_ok(name)).then(pl.col(name)).otherwise(None).alias(name)
        for name in PROBABILITY_MATRICES
        if name in columns
    ]


def _request_checks(
    gamma: int | None, columns: list[str], matrices: bool = True
) -> list[tuple[str, pl.Expr]]:
    g = pl.col("gamma")
    window = pl.col("verify_len") - 1
    accepted = pl.col("correct_drafts")
    cap_trim = pl.col("cap_trim")
    mode = pl.col("mode")
    probabilities = [
        probabilities_ok(name) for name in PROBABILITY_MATRICES if matrices and name in columns
    ]
    ceiling = (
        pl.when(mode == "static")
        .then(accepted)
        .when(mode == "cap-accept")
        .then(accepted + cap_trim)
        .otherwise(None)
    )
    derived = [pl.col("window") == window] if "window" in columns else []
    if "ceiling" in columns:
        derived.append(pl.col("ceiling").eq_missing(ceiling))
    return [
        ("gamma_mismatch", g == gamma if gamma is not None else pl.lit(True)),
        ("gamma_out_of_range", g.is_between(1, MAX_GAMMA)),
        ("malformed", mode.is_null() | mode.is_in(_MODES)),
        (
            "pool_index_out_of_range",
            pl.col("req_pool_index").is_null()
            | pl.col("req_pool_index").is_between(-1, MAX_REQ_POOL_INDEX),
        ),
        ("window_out_of_range", (window >= 0) & (window <= g)),
        ("accepted_out_of_range", (accepted >= 0) & (accepted <= window)),
        ("cap_trim_out_of_range", (cap_trim >= 0) & (cap_trim <= g - accepted)),
        ("committed_out_of_range", pl.col("acc_len").is_between(0, g + 1)),
        (
            "ceiling_out_of_range",
            pl.col("shadow_ceiling").is_null() | pl.col("shadow_ceiling").is_between(-1, g),
        ),
        (
            "probability_out_of_range",
            pl.all_horizontal(probabilities) if probabilities else pl.lit(True),
        ),
        ("name_too_long", _name_ok("rid") & _name_ok("workload") & _name_ok("mode")),
        ("derived_mismatch", pl.all_horizontal(derived or [pl.lit(True)])),
    ]


@dataclass
class Rejections:
    """The steps left out of a run on read: their keys, and how many by reason."""

    #: the keys left out, by the name of the parts (`part-NNNNNN.parquet`) holding them: a
    #: step key may come again in a later flush (a counter restarted), and that step stands
    keys: dict[str, pl.DataFrame] = field(default_factory=dict)
    steps: Counter = field(default_factory=Counter)
    request_rows: int = 0

    def __bool__(self) -> bool:
        return bool(self.keys)

    def without(self, part: Path, frame: pl.LazyFrame) -> pl.LazyFrame:
        """`frame`, read from `part`, less the rows of the steps rejected in its flush."""
        keys = self.keys.get(part.name)
        if keys is None:
            return frame
        return frame.join(keys.lazy(), on=list(STEP_KEY), how="anti")

    def describe(self) -> str:
        """One line: how many steps (step keys: `orphan_rows` counts keys of rows without
        a step) and request rows were left out, by reason."""
        by = ", ".join(f"{r} {n}" for r, n in sorted(self.steps.items(), key=lambda kv: -kv[1]))
        steps = sum(k.height for k in self.keys.values())
        return (
            f"{steps} stored steps and their {self.request_rows} request rows rejected on "
            f"read, as the pipeline rejects them ({by})"
        )


def flush_rejections(
    steps: pl.LazyFrame, requests: pl.LazyFrame | None, gamma: int | None, matrices: bool = True
) -> pl.LazyFrame:
    """The steps of one flush (its `steps` part and `requests` part) that break the model:
    their keys, the code of their reason and their request rows (`tally` counts them);
    the probability matrices checked too unless `matrices` is false."""
    step_cols = steps.collect_schema().names()
    step_rows = steps.select(
        *STEP_KEY,
        "has_reqs",
        "bs",
        *([CONTEXT_TOKENS] if CONTEXT_TOKENS in step_cols else []),
        _first_failing(_step_checks(gamma, step_cols)),
    )
    if requests is not None:
        req_cols = requests.collect_schema().names()
        per_step = (
            requests.select(
                *STEP_KEY,
                "prefix_len",
                _first_failing(_request_checks(gamma, req_cols, matrices)),
            )
            .group_by(STEP_KEY)
            .agg(
                pl.len().alias("__rows"),
                pl.col("prefix_len").sum().alias("__context"),
                pl.col(_REASON).filter(pl.col(_REASON) > 0).min().alias("__row_reason"),
            )
        )
        joined = step_rows.join(per_step, on=STEP_KEY, how="full", coalesce=True)
    else:
        joined = step_rows.with_columns(
            pl.lit(None, pl.UInt32).alias("__rows"),
            pl.lit(None, pl.Int64).alias("__context"),
            pl.lit(None, pl.Int8).alias("__row_reason"),
        )
    rows = pl.col("__rows").fill_null(0)
    count_ok = (
        pl.when(pl.col("has_reqs"))
        .then(pl.col("bs").is_null() | (pl.col("bs") == -1) | (rows <= pl.col("bs")))
        .otherwise(rows == 0)
    )
    context = pl.col(CONTEXT_TOKENS) if CONTEXT_TOKENS in step_cols else None
    context_ok = (
        pl.lit(True)
        if context is None
        else context.is_null() | (context == pl.col("__context").fill_null(0))
    )
    return (
        joined.with_columns(
            pl.when(pl.col("has_reqs").is_null() & pl.col(_REASON).is_null())
            .then(pl.lit(_CODE["orphan_rows"], pl.Int8))  # request rows of no step
            .when(pl.col(_REASON) > 0)
            .then(pl.col(_REASON))
            .when(~count_ok)
            .then(pl.lit(_CODE["malformed"], pl.Int8))
            .when(pl.col("__row_reason").is_not_null())
            .then(pl.col("__row_reason"))
            .when(~context_ok.fill_null(False))
            .then(pl.lit(_CODE["derived_mismatch"], pl.Int8))
            .otherwise(pl.lit(0, pl.Int8))
            .alias(_REASON)
        )
        .filter(pl.col(_REASON) > 0)
        .select(*(pl.col(k).cast(pl.Int64) for k in STEP_KEY), _REASON, rows.alias("__rows"))
    )


def _all_ok(checks: list[tuple[str, pl.Expr]]) -> pl.Expr:
    return pl.all_horizontal([ok.fill_null(False) for _, ok in checks])


def clean(
    steps: pl.LazyFrame, requests: pl.LazyFrame | None, gamma: int | None
) -> list[pl.LazyFrame]:
    """Queries over a whole run whose one boolean each is true where no step of it breaks the
    model (its probability matrices aside: `within_probabilities`): one pass over each table
    and one grouping of the request rows (each row's checks folded into its step's group),
    much cheaper than naming each rejected step (`flush_rejections`), which only a run they
    fail needs. A step key repeated in a later flush fails the count here, and its flushes
    are then checked one by one."""
    step_cols = steps.collect_schema().names()
    step_ok = _all_ok(_step_checks(gamma, step_cols))
    if requests is None:
        return [steps.select((step_ok & ~pl.col("has_reqs").fill_null(True)).all())]
    req_cols = requests.collect_schema().names()
    per_step = requests.group_by(STEP_KEY).agg(
        pl.len().alias("__rows"),
        pl.col("prefix_len").sum().alias("__context"),
        _all_ok(_request_checks(gamma, req_cols, matrices=False)).all().alias("__rows_ok"),
    )
    rows = pl.col("__rows").fill_null(0)
    count_ok = (
        pl.when(pl.col("has_reqs"))
        .then(pl.col("bs").is_null() | (pl.col("bs") == -1) | (rows <= pl.col("bs")))
        .otherwise(rows == 0)
    )
    if CONTEXT_TOKENS in step_cols:
        context = pl.col(CONTEXT_TOKENS)
        count_ok = count_ok & (context.is_null() | (context == pl.col("__context").fill_null(0)))
    joined = steps.select(
        *STEP_KEY,
        "has_reqs",
        "bs",
        *([CONTEXT_TOKENS] if CONTEXT_TOKENS in step_cols else []),
        step_ok.alias("__step_ok"),
    ).join(per_step, on=STEP_KEY, how="full", coalesce=True)
    ok = (  # a request row of no step has no has_reqs; a step without rows, no __rows_ok
        pl.col("has_reqs").is_not_null()
        & pl.col("__step_ok")
        & pl.col("__rows_ok").fill_null(True)
        & count_ok
    )
    return [joined.select(ok.fill_null(False).all())]


def tally(found: dict[str, pl.DataFrame]) -> Rejections:
    """The rejections `flush_rejections` found in each flush (by its parts' name), as one."""
    out = Rejections()
    for part, frame in found.items():
        if frame.height:
            out.keys[part] = frame.select(STEP_KEY)
            out.steps.update(REASONS[code - 1] for code in frame[_REASON])
            out.request_rows += int(frame["__rows"].sum())
    return out


def report(path: Path, rejections: Rejections) -> None:
    """Say once, where an operator sees it, that a run's readers left steps out."""
    if rejections:
        log.warning("%s: %s", path, rejections.describe())

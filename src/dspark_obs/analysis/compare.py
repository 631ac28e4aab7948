"""A/B comparison of two runs: per-metric deltas, bootstrap intervals, Holm-adjusted verdicts.

`compare_runs` builds the whole comparison as plain data (the CLI prints it,
`--json` dumps it, plots can overlay it); nothing here prints.

Per-cluster sums are computed in polars (one group-by per run and table):
request metrics cluster on the request id, because the steps of one request
share its prompt, workload and acceptance level; step metrics cluster on the
step (`rank`, `forward_ct`). Each metric is a ratio of sums over clusters, so
the value equals the plain mean (or rate) over rows, and the bootstrap in
`bootstrap.py` resamples whole clusters. All rows of one comparison form one
family for Holm's correction, so the chance of any false "significant" stays
at 5% however many workloads and batch sizes are listed. Each row also gets the
interval at the level Holm tested it at (`ci_holm`, `bootstrap.holm_intervals`), so that a
verdict and the interval printed beside it never disagree; `ci` stays the row's own 95%
interval.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..store import Run, open_run
from ..store.errors import reading
from .bootstrap import bootstrap_delta, holm, holm_intervals
from .compare_meta import CompareError, check_comparable, config_diff, describe
from .step_time import measured_step_ms
from .verdict import verdict

ALPHA = 0.05
CONFIDENCE = 0.95

#: Keys of every entry in `rows`; documented in docs/cli.md.
ROW_KEYS = (
    "section",
    "workload",
    "bs",
    "metric",
    "label",
    "unit",
    "better",
    "cluster",
    "a",
    "b",
    "delta",
    "rel_delta",
    "ci",
    "ci_holm",
    "ci_holm_level",
    "p",
    "p_adjusted",
    "significant",
    "verdict",
    "n_a",
    "n_b",
)

__all__ = ["ALPHA", "CONFIDENCE", "ROW_KEYS", "CompareError", "compare_runs"]


@dataclass(frozen=True)
class Metric:
    """A ratio of two per-cluster sums; `missing` names what a run without it lacks."""

    name: str
    label: str
    unit: str
    num: str
    den: str
    missing: str
    better: str | None = None  # "higher", "lower", or None where neither is better


REQUEST_METRICS = (
    Metric("mean_window", "mean window", "drafts", "window", "n", "request rows"),
    Metric("mean_accepted", "mean accepted", "drafts", "accepted", "n", "request rows", "higher"),
    Metric(
        "mean_committed", "mean committed", "tokens", "committed", "n", "request rows", "higher"
    ),
    Metric("mean_ceiling", "mean ceiling", "drafts", "ceiling", "known", "known ceiling"),
    Metric("utilisation", "utilisation", "", "acc_known", "ceiling", "known ceiling", "higher"),
)
STEP_MS = Metric("step_ms", "step time", "ms", "ms", "timed", "step times", "lower")
BS_METRICS = (
    STEP_MS,
    Metric(
        "verify_tokens_per_step",
        "verify tokens/step",
        "tokens",
        "verify",
        "verify_n",
        "verify token counts",
        "lower",
    ),
    Metric(
        "throughput_tokens_per_s",
        "throughput",
        "tokens/s",
        "committed",
        "seconds",
        "step times",
        "higher",
    ),
)

_REQ_COLS = ("n", "window", "accepted", "committed", "known", "ceiling", "acc_known")
_STEP_COLS = ("timed", "ms", "verify_n", "verify", "committed", "seconds")
_STEP_KEY = ["rank", "forward_ct"]


def _request_clusters(run: Run, workloads: Sequence[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per (workload, request) sums, and per request over all the given workloads."""
    known_ceiling = pl.coalesce(pl.col("ceiling"), pl.col("shadow_ceiling"))
    known = known_ceiling.is_not_null()
    rows = (
        run.requests()
        .filter(pl.col("workload").is_in(list(workloads)))
        .with_row_index("_row")
        # a row without a request id is its own cluster rather than one giant cluster
        .with_columns(key=pl.coalesce(pl.col("rid"), pl.format("row-{}", pl.col("_row"))))
    )
    aggs = [
        pl.len().alias("n"),
        pl.col("window").sum().alias("window"),
        pl.col("correct_drafts").sum().alias("accepted"),
        pl.col("acc_len").sum().alias("committed"),
        known.sum().alias("known"),
        known_ceiling.sum().alias("ceiling"),
        pl.col("correct_drafts").filter(known).sum().alias("acc_known"),
    ]
    cast = [pl.col(c).cast(pl.Float64) for c in _REQ_COLS]
    per_workload = rows.group_by("workload", "key").agg(aggs).with_columns(cast)
    overall = rows.group_by("key").agg(aggs).with_columns(cast)
    return per_workload.collect(), overall.collect()


def _step_clusters(run: Run) -> pl.DataFrame:
    """One row per step: its time, verify tokens and committed tokens (0 when it had none)."""
    committed = run.requests().group_by(_STEP_KEY).agg(pl.col("acc_len").sum().alias("tokens"))
    timed = pl.col("step_ms").is_not_null()
    return (
        run.steps()
        .select(*_STEP_KEY, "bs", measured_step_ms(), "num_verify_tokens")
        .join(committed, on=_STEP_KEY, how="left")
        .select(
            *_STEP_KEY,
            "bs",
            timed.cast(pl.Float64).alias("timed"),
            pl.col("step_ms").fill_null(0.0).alias("ms"),
            pl.col("num_verify_tokens").is_not_null().cast(pl.Float64).alias("verify_n"),
            pl.col("num_verify_tokens").fill_null(0).cast(pl.Float64).alias("verify"),
            # throughput counts only tokens of steps whose time is known
            pl.when(timed)
            .then(pl.col("tokens").fill_null(0))
            .otherwise(0)
            .cast(pl.Float64)
            .alias("committed"),
            (pl.col("step_ms").fill_null(0.0) / 1e3).alias("seconds"),
        )
        .collect()
    )


def _pair(a: pl.DataFrame, b: pl.DataFrame, key: list[str], cols: Sequence[str]) -> pl.DataFrame:
    """Clusters of both arms matched by key; an arm lacking a key has zeros there."""
    joined = a.select(*key, *cols).join(
        b.select(*key, *cols), on=key, how="full", coalesce=True, suffix="_b"
    )
    # sorted, so that a seed draws the same clusters whatever order group_by returned
    return joined.with_columns(pl.exclude(key).fill_null(0.0)).sort(key)


def _rng(seed: int, group_id: str) -> np.random.Generator:
    """One generator per group of rows, so a row's interval does not depend on which other
    groups exist, and the metrics of one group resample the same clusters: metrics that
    differ by a constant per cluster (accepted and committed) get the same interval."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(group_id.encode())]))


def _row(
    section: str,
    workload: str | None,
    bs: int | None,
    metric: Metric,
    pairs: pl.DataFrame,
    *,
    reps: int,
    seed: int,
) -> dict[str, Any]:
    arrays = [
        pairs[c].to_numpy() for c in (metric.num, metric.den, metric.num + "_b", metric.den + "_b")
    ]
    num_a, den_a, num_b, den_b = arrays
    used = (den_a != 0) | (den_b != 0) | (num_a != 0) | (num_b != 0)
    num_a, den_a, num_b, den_b = (x[used] for x in arrays)
    row: dict[str, Any] = {
        "section": section,
        "workload": workload,
        "bs": bs,
        "metric": metric.name,
        "label": metric.label,
        "unit": metric.unit,
        "better": metric.better,
        "cluster": "request" if section == "workload" else "step",
        "n_a": int(np.count_nonzero(den_a)),
        "n_b": int(np.count_nonzero(den_b)),
    }
    if not used.any():
        res = None
    else:
        group_id = f"{section}/{workload if bs is None else bs}"
        res = bootstrap_delta(
            num_a, den_a, num_b, den_b, reps=reps, rng=_rng(seed, group_id), confidence=CONFIDENCE
        )
    row.update(
        a=res.a if res else None,
        b=res.b if res else None,
        delta=res.delta if res else None,
        rel_delta=res.rel_delta if res else None,
        ci=list(res.ci) if res and res.ci else None,
        p=res.p if res else None,
        deltas=res.deltas if res else None,
    )
    if row["a"] is None or row["b"] is None:
        lacking = " and ".join(n for n in ("A", "B") if row[n.lower()] is None)
        row["reason"] = f"{lacking} {'has' if len(lacking) == 1 else 'have'} no {metric.missing}"
    return row


def _bs_list(sa: pl.DataFrame, sb: pl.DataFrame, wanted: Sequence[int] | None, notes: list[str]):
    in_a = set(sa.filter(pl.col("bs") > 0)["bs"].unique().to_list())
    in_b = set(sb.filter(pl.col("bs") > 0)["bs"].unique().to_list())
    common = sorted(in_a & in_b)
    one_sided = sorted(in_a ^ in_b)
    if one_sided and wanted is None:
        notes.append(f"batch sizes in one run only, not compared: {one_sided}")
    if wanted is None:
        return common
    missing = sorted(set(wanted) - set(common))
    if missing:
        notes.append(f"--bs {missing}: not present in both runs")
    return [b for b in common if b in set(wanted)]


def _finish(rows: list[dict[str, Any]]) -> None:
    """Holm across the family (rows with a p-value), then significance and verdict."""
    tested = [r for r in rows if r["p"] is not None]
    p = np.array([r["p"] for r in tested], dtype=np.float64)
    intervals, levels = holm_intervals([r["deltas"] for r in tested], p, ALPHA)
    for r, p_adj, ci, level in zip(tested, holm(p), intervals, levels, strict=True):
        r.update(p_adjusted=float(p_adj), ci_holm=list(ci), ci_holm_level=float(1 - level))
    for r in rows:
        del r["deltas"]
        r.setdefault("p_adjusted", None)
        r.setdefault("ci_holm", None)
        r.setdefault("ci_holm_level", None)
        r["significant"] = r["p_adjusted"] is not None and r["p_adjusted"] < ALPHA
        r["verdict"] = verdict(r, confidence=CONFIDENCE)


def _group_label(r: dict[str, Any]) -> str:
    if r["section"] == "workload":
        return r["workload"]
    return "all steps" if r["bs"] is None else f"bs {r['bs']}"


def compare_runs(
    run_a: Run | str | Path,
    run_b: Run | str | Path,
    *,
    allow_mismatch: bool = False,
    reps: int = 1000,
    seed: int = 0,
    batch_sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The comparison object `dspark-obs compare --json` prints (B minus A throughout).

    Returns a dict: `a`, `b` (each run's path, mode, shadow, gamma, seed,
    timing, workloads, complete), `reps`, `seed`, `confidence`, `alpha`,
    `correction`, `tested` (rows in the Holm family), `workloads` and
    `batch_sizes` compared, `config_diff` (`{key, a, b}` per differing config
    key; empty, with `config_compared` false and a note, when a run has no runtime
    configuration), `notes`, `rows` (one dict per metric and group, keys `ROW_KEYS`) and
    `findings` (one line per significant row). `batch_sizes` restricts the
    per-batch-size rows. Raises CompareError when the runs' gamma or workload
    sets differ (unless `allow_mismatch`), or when either run has no
    request-steps.
    """
    if reps < 1:
        raise CompareError("--reps must be at least 1")
    ra = run_a if isinstance(run_a, Run) else open_run(run_a)
    rb = run_b if isinstance(run_b, Run) else open_run(run_b)
    with reading(ra, rb):
        return _compare(ra, rb, allow_mismatch, reps, seed, batch_sizes)


def _compare(
    ra: Run,
    rb: Run,
    allow_mismatch: bool,
    reps: int,
    seed: int,
    batch_sizes: Sequence[int] | None,
) -> dict[str, Any]:
    for name, r in (("A", ra), ("B", rb)):
        if "requests" not in r.tables():
            raise CompareError(f"run {name} ({r.path}) holds no request-steps")
    da, db = describe(ra), describe(rb)
    workloads, notes = check_comparable(da, db, allow_mismatch=allow_mismatch)
    configs = ra.manifest.get("config"), rb.manifest.get("config")
    unconfigured = [name for name, c in zip("AB", configs, strict=True) if c is None]
    if unconfigured:
        notes.append(
            f"run {' and '.join(unconfigured)} records no runtime configuration (not a "
            "reference run): configurations not compared"
        )

    rows: list[dict[str, Any]] = []
    req_a, all_a = _request_clusters(ra, workloads)
    req_b, all_b = _request_clusters(rb, workloads)
    groups = [
        (w, req_a.filter(pl.col("workload") == w), req_b.filter(pl.col("workload") == w))
        for w in workloads
    ]
    for workload, ca, cb in [*groups, ("overall", all_a, all_b)]:
        pairs = _pair(ca, cb, ["key"], _REQ_COLS)
        rows.extend(
            _row("workload", workload, None, m, pairs, reps=reps, seed=seed)
            for m in REQUEST_METRICS
        )

    sa, sb = _step_clusters(ra), _step_clusters(rb)
    rows.append(
        _row(
            "steps", None, None, STEP_MS, _pair(sa, sb, _STEP_KEY, _STEP_COLS), reps=reps, seed=seed
        )
    )
    compared_bs = _bs_list(sa, sb, batch_sizes, notes)
    for bs in compared_bs:
        pairs = _pair(
            sa.filter(pl.col("bs") == bs), sb.filter(pl.col("bs") == bs), _STEP_KEY, _STEP_COLS
        )
        rows.extend(_row("steps", None, bs, m, pairs, reps=reps, seed=seed) for m in BS_METRICS)
    _finish(rows)
    for r in rows:
        r.pop("reason", None)

    return {
        "a": da,
        "b": db,
        "reps": reps,
        "seed": seed,
        "confidence": CONFIDENCE,
        "alpha": ALPHA,
        "correction": "holm",
        "tested": sum(r["p"] is not None for r in rows),
        "workloads": workloads,
        "batch_sizes": compared_bs,
        "config_compared": not unconfigured,
        "config_diff": [] if unconfigured else config_diff(*configs),
        "notes": notes,
        "rows": [{k: r[k] for k in ROW_KEYS} for r in rows],
        "findings": [
            f"{_group_label(r)} {r['label']}: {r['verdict']}" for r in rows if r["significant"]
        ],
    }

"""The run summary: per workload and overall, the handful of numbers a run is judged by.

Computed with polars over the run store's tables, so it scales with the data
and not with a Python loop. Ceiling-based numbers use only request-steps whose
ceiling is known: observed (static, cap-accept) or reported by a cap-accept
shadow twin; utilisation is a ratio of sums over those rows, so long and short
requests weigh by the tokens they had at stake.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..store import Run, open_run
from ..store.errors import reading
from ..store.fleet import Fleet, FleetHead

#: Keys of every entry in `workloads` and of `overall`; documented in docs/cli.md.
ENTRY_KEYS = (
    "steps",
    "request_steps",
    "mean_window",
    "mean_accepted",
    "mean_committed",
    "mean_ceiling",
    "ceiling_source",
    "ceiling_rows",
    "utilisation",
    "trimmed_tokens",
    "mean_verify_tokens",
    "committed_tokens",
    "throughput_tokens_per_s",
)


def _known_ceiling() -> pl.Expr:
    return pl.coalesce(pl.col("ceiling"), pl.col("shadow_ceiling")).alias("known_ceiling")


#: Sums per group of request-steps; every entry key is a ratio of two of them (or one).
_REQUEST_SUMS = (
    "steps",
    "request_steps",
    "_window",
    "_accepted",
    "committed_tokens",
    "ceiling_rows",
    "_acc_known",
    "_ceiling_sum",
    "_trimmed",
    "_verify",
)
_FLAGS = ("_observed", "_shadow")
#: Sums per group of steps: the overall entry's step figures and the step time.
_STEP_SUMS = (
    "steps",
    "_gpu_ms",
    "_timed",
    "_nvt",
    "_nvt_n",
    "_budget",
    "_budget_n",
    "_bs",
    "_bs_n",
)
_LOAD_SUMS = ("steps", "_bpr", "_bpr_n", "_nvt", "_nvt_n", "_gpu_ms", "_timed")


def _request_aggs() -> list[pl.Expr]:
    known = pl.col("known_ceiling").is_not_null()
    return [
        # one integer per (rank, forward_ct): counting distinct ints beats distinct structs.
        # A step lies in one run (and one part), so the counts of several runs add up.
        ((pl.col("rank") * (1 << 40)) + pl.col("forward_ct")).n_unique().alias("steps"),
        pl.len().alias("request_steps"),
        pl.col("window").sum().alias("_window"),
        pl.col("correct_drafts").sum().alias("_accepted"),
        pl.col("acc_len").sum().alias("committed_tokens"),
        known.sum().alias("ceiling_rows"),
        pl.col("correct_drafts").filter(known).sum().alias("_acc_known"),
        pl.col("known_ceiling").sum().alias("_ceiling_sum"),
        (pl.col("known_ceiling") - pl.col("correct_drafts"))
        .clip(lower_bound=0)
        .sum()
        .alias("_trimmed"),
        pl.col("verify_len").sum().alias("_verify"),
        pl.col("ceiling").is_not_null().any().alias("_observed"),
        pl.col("shadow_ceiling").is_not_null().any().alias("_shadow"),
    ]


def _sum_and_count(expr: pl.Expr, name: str) -> list[pl.Expr]:
    """A nullable column's sum and non-null count: its mean, mergeable."""
    return [expr.sum().alias(name), expr.count().alias(f"{name}_n")]


def _step_aggs() -> list[pl.Expr]:
    return [
        pl.len().alias("steps"),
        pl.col("step_gpu_ms").sum().alias("_gpu_ms"),
        pl.col("step_gpu_ms").count().alias("_timed"),
        *_sum_and_count(pl.col("num_verify_tokens"), "_nvt"),
        *_sum_and_count(pl.col("budget"), "_budget"),
        *_sum_and_count(pl.col("bs"), "_bs"),
    ]


def _load_aggs() -> list[pl.Expr]:
    return [
        pl.len().alias("steps"),
        *_sum_and_count(pl.col("budget") / pl.col("bs"), "_bpr"),
        *_sum_and_count(pl.col("num_verify_tokens"), "_nvt"),
        pl.col("step_gpu_ms").sum().alias("_gpu_ms"),
        pl.col("step_gpu_ms").count().alias("_timed"),
    ]


def _grouped(frame: pl.LazyFrame, keys: list[str], aggs: list[pl.Expr]) -> pl.LazyFrame:
    return frame.group_by(keys).agg(aggs) if keys else frame.select(aggs)


def _merge(frames: list[pl.DataFrame], keys: list[str], sums: tuple[str, ...]) -> pl.DataFrame:
    """The runs' sums added per group: the fleet's sums."""
    aggs = [pl.col(c).sum() for c in sums] + [
        pl.col(c).any() for c in _FLAGS if c in frames[0].columns
    ]
    both = pl.concat(frames, how="vertical_relaxed")
    return _grouped(both.lazy(), keys, aggs).collect()


def _ratio(num, den) -> float | None:
    return num / den if den else None


def _finish(row: dict, rate: float | None) -> dict:
    """A summary entry from a group's sums; `rate` its committed tokens per second."""
    n = row["request_steps"]
    known = row["ceiling_rows"]
    entry = {
        "steps": row["steps"],
        "request_steps": n,
        "mean_window": _ratio(row["_window"], n),
        "mean_accepted": _ratio(row["_accepted"], n),
        "mean_committed": _ratio(row["committed_tokens"], n),
        "mean_ceiling": _ratio(row["_ceiling_sum"], known),
        "ceiling_source": "observed"
        if row["_observed"]
        else ("shadow" if row["_shadow"] else None),
        "ceiling_rows": known,
        "utilisation": _ratio(row["_acc_known"], row["_ceiling_sum"]) if known else None,
        "trimmed_tokens": row["_trimmed"] if known else None,
        "mean_verify_tokens": _ratio(row["_verify"], n),
        "committed_tokens": row["committed_tokens"],
        "throughput_tokens_per_s": rate,
    }
    return {k: entry[k] for k in ENTRY_KEYS}


def _step_figures(entry: dict, steps: dict) -> dict:
    entry["steps"] = steps["steps"]
    entry["verify_tokens_per_step"] = _ratio(steps["_nvt"], steps["_nvt_n"])
    entry["mean_batch_size"] = _ratio(steps["_bs"], steps["_bs_n"])
    entry["mean_budget"] = _ratio(steps["_budget"], steps["_budget_n"])
    return entry


def _rate(row: dict | None) -> float | None:
    """Committed tokens per second of a group, where its steps were timed."""
    return row["_rate"] if row is not None and row["_rate_timed"] else None


def _stream_rates(
    req: pl.LazyFrame, steps: pl.LazyFrame, keys: list[str]
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Committed tokens per second, per (workload, keys) and per keys: the sum over the
    streams (one node's rank: they run side by side) of each stream's tokens over its own
    step time, as the load curve sums its ranks' rates."""
    stream = list(dict.fromkeys([*keys, "rank"]))
    seconds = steps.group_by(stream).agg(
        (pl.col("step_gpu_ms").sum() / 1e3).alias("_seconds"),
        pl.col("step_gpu_ms").count().alias("_timed"),
    )

    def rates(by: list[str]) -> pl.LazyFrame:
        tokens = req.group_by([*by, *stream]).agg(pl.col("acc_len").sum().alias("_tokens"))
        timed = pl.col("_timed") > 0
        return (
            tokens.join(seconds, on=stream, how="left")
            .group_by([*by, *keys])
            .agg(
                (pl.col("_tokens") / pl.col("_seconds")).filter(timed).sum().alias("_rate"),
                timed.fill_null(False).sum().alias("_rate_timed"),
            )
        )

    return rates(["workload"]), rates([])


def fold_run(run: Run, node: str, by: tuple[str, ...]) -> tuple[pl.DataFrame, ...]:
    """One run's sums per group (one streaming pass per table): the fleet fold's map.

    Only these sums leave the run (a few rows a group), so a fleet of any size is read in
    the memory of its largest run's query, wherever each run is read
    (`dspark_obs.engine`).
    """
    _require_requests(run)
    keys = list(by)
    node_col = pl.lit(node).alias("node")
    req = run.requests().with_columns(_known_ceiling(), node_col)
    steps = run.steps().with_columns(node_col)
    queries = [
        _grouped(req, ["workload", *keys], _request_aggs()),
        _grouped(req, keys, _request_aggs()),
        _grouped(steps, keys, _step_aggs()),
        steps.filter(pl.col("bs") > 0).group_by("bs").agg(_load_aggs()),
        *_stream_rates(req, steps, keys),
    ]
    with reading(run):
        return tuple(pl.collect_all(queries, engine="streaming"))


def merge_folds(folds: list[tuple[pl.DataFrame, ...]], by: tuple[str, ...]) -> tuple:
    """The runs' sums (`fold_run`) added per group: the fleet fold's reduce."""
    keys = list(by)
    rates = ("_rate", "_rate_timed")
    parts = list(zip(*folds, strict=True))
    return (
        _merge(list(parts[0]), ["workload", *keys], _REQUEST_SUMS),
        _merge(list(parts[1]), keys, _REQUEST_SUMS),
        _merge(list(parts[2]), keys, _STEP_SUMS),
        _merge(list(parts[3]), ["bs"], _LOAD_SUMS),
        _merge(list(parts[4]), ["workload", *keys], rates),
        _merge(list(parts[5]), keys, rates),
    )


def _load_rows(load: pl.DataFrame) -> list[dict]:
    return [
        {
            "bs": r["bs"],
            "steps": r["steps"],
            "budget_per_request": _ratio(r["_bpr"], r["_bpr_n"]),
            "verify_tokens_per_step": _ratio(r["_nvt"], r["_nvt_n"]),
            "mean_step_ms": _ratio(r["_gpu_ms"], r["_timed"]),
        }
        for r in load.sort("bs").iter_rows(named=True)
    ]


def _entries(merged: tuple, by: tuple[str, ...]) -> tuple[dict, dict, list[dict], list[dict]]:
    """(overall, workloads, load, groups) of the runs' merged sums (`merge_folds`)."""
    per_workload, overall, steps, load, workload_rates, rates = merged
    step_rows = {tuple(r[k] for k in by): r for r in steps.iter_rows(named=True)}
    overall_rows = {tuple(r[k] for k in by): r for r in overall.iter_rows(named=True)}
    rate_rows = {tuple(r[k] for k in by): r for r in rates.iter_rows(named=True)}
    wl_rates = {
        (r["workload"], *(r[k] for k in by)): r for r in workload_rates.iter_rows(named=True)
    }
    groups: dict[tuple, dict] = {}
    for key, row in sorted(overall_rows.items(), key=lambda kv: _sort_key(kv[0])):
        group_steps = step_rows[key]
        groups[key] = {
            **dict(zip(by, key, strict=True)),
            "overall": _step_figures(_finish(row, _rate(rate_rows.get(key))), group_steps),
            "workloads": {},
        }
    for row in per_workload.sort("workload").iter_rows(named=True):
        key = tuple(row[k] for k in by)
        name = row["workload"]
        groups[key]["workloads"][name] = _finish(row, _rate(wl_rates.get((name, *key))))
    if by:
        rate_sums = ("_rate", "_rate_timed")
        fleet_steps = _merge([steps], [], _STEP_SUMS).row(0, named=True)
        fleet_overall = _merge([overall], [], _REQUEST_SUMS).row(0, named=True)
        fleet_workloads = _merge([per_workload], ["workload"], _REQUEST_SUMS).sort("workload")
        fleet_rate = _merge([rates], [], rate_sums).row(0, named=True)
        fleet_wl_rates = {
            r["workload"]: r
            for r in _merge([workload_rates], ["workload"], rate_sums).iter_rows(named=True)
        }
        top = _step_figures(_finish(fleet_overall, _rate(fleet_rate)), fleet_steps)
        workloads = {
            r["workload"]: _finish(r, _rate(fleet_wl_rates.get(r["workload"])))
            for r in fleet_workloads.iter_rows(named=True)
        }
        return top, workloads, _load_rows(load), list(groups.values())
    (only,) = groups.values()
    return only["overall"], only["workloads"], _load_rows(load), []


def _sort_key(key: tuple) -> tuple:
    return tuple((v is None, v if v is not None else 0) for v in key)


def summarize(run: Run) -> dict:
    """The summary object `dspark-obs summary --json` prints.

    A part damaged inside its data pages passes `Run.scan`'s footer check and
    only fails when read: that surfaces as the store's RunStoreError too.
    """
    overall, workloads, load, _ = _entries(merge_folds([fold_run(run, str(run.path), ())], ()), ())
    m = run.manifest
    return {
        "run": str(run.path),
        "mode": m.get("mode"),
        "shadow": m.get("shadow"),
        "gamma": m.get("gamma"),
        "timing": m.get("timing"),
        "overall": overall,
        "workloads": workloads,
        "load": load,
    }


def summarize_fleet(fleet: Fleet, by: tuple[str, ...] = ()) -> dict:
    """`summarize` of many runs taken together, with the figures per group of `by` keys.

    Every figure is a ratio of sums, so the fleet's is the one the union of the runs'
    rows would give; `groups` holds one entry per combination of the `by` keys present
    (`node`, `rank`, `mode`), each an `overall` and a `workloads` map as the fleet's.
    """
    return summary_of_folds(
        fleet.head, [fold_run(r, n, by) for r, n in zip(fleet.runs, fleet.nodes, strict=True)], by
    )


def summary_of_folds(head: FleetHead, folds: list[tuple], by: tuple[str, ...] = ()) -> dict:
    """`summarize_fleet` from its runs' `fold_run` sums, wherever they were folded."""
    overall, workloads, load, groups = _entries(merge_folds(folds, by), by)
    return {
        "run": head.run,
        "runs": head.describe(),
        "mode": head.common("mode"),
        "shadow": head.common("shadow"),
        "gamma": head.gamma,
        "timing": head.common("timing"),
        "overall": overall,
        "workloads": workloads,
        "load": load,
        "by": list(by),
        "groups": groups,
    }


def _require_requests(run: Run) -> None:
    if "requests" not in run.tables():
        raise ValueError(
            f"{run.path} holds no request-steps (an ingested block-accept JSONL has only "
            f"ceilings); see `dspark-obs estimate {run.path}`"
        )


def summarize_run_dir(run_dir: Path) -> dict:
    """`summarize` of the run in `run_dir`, which must hold request-steps."""
    run = open_run(run_dir)
    _require_requests(run)
    return summarize(run)

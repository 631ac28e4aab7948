"""The ceiling estimators over many runs taken together, from sums folded one run at a time.

Every figure of a method's entry (`greedy`, `sampled`), of `all_steps` and of the blended
`estimate` is a ratio of sums over walked blocks and request-steps, so each run is reduced
to those sums per group and the sums are added: the fleet's figures are the ones the union
of its runs would give. The population model and the extrapolation check are models fitted
to one run's rows; they stay per run (`estimate RUN_DIR`).

`estimate` is the live `dspark_ceiling_estimate_*` figure: blocks whose ceiling a step
reveals (not fully accepted, or the whole block verified) count their accepted drafts, each
walked block its lo, point or hi, over both kinds of blocks.
"""

from __future__ import annotations

import polars as pl

from dspark_obs.store import Run
from dspark_obs.store.errors import reading
from dspark_obs.store.fleet import Fleet, FleetHead

from .evaluate import MAX_AGGS, all_steps, method_aggs, method_entry_from_sums, walked_blocks

_JOIN = ["rank", "forward_ct", "rid"]


def _trimmed(gamma: int) -> pl.Expr:
    return (pl.col("correct_drafts") == pl.col("window")) & (pl.col("window") < gamma)


def _stat_aggs(gamma: int) -> list[pl.Expr]:
    trimmed = _trimmed(gamma)
    revealed = (pl.col("correct_drafts") < pl.col("window")) | (pl.col("window") == gamma)
    return [
        pl.len().alias("n"),
        pl.col("truth").sum().alias("truth_sum"),
        pl.col("truth").count().alias("truth_n"),
        trimmed.sum().alias("trimmed"),
        pl.col("window").filter(trimmed).sum().alias("trimmed_window"),
        pl.col("correct_drafts").filter(~trimmed).sum().alias("untrimmed_accepted"),
        revealed.sum().alias("observed_blocks"),
        pl.col("correct_drafts").filter(revealed).sum().alias("observed_tokens"),
    ]


def fold_run(run: Run, node: str, gamma: int, by: tuple[str, ...]) -> tuple:
    """One run's (request-step sums, walked-block sums per method), per group: the fleet
    fold's map (either is None where the run has none)."""
    keys = ["workload", *by]
    node_col = pl.lit(node).alias("node")
    stats = truth = blocks = None
    with reading(run):
        if "requests" in run.tables():
            req = run.requests().with_columns(
                pl.coalesce("ceiling", "shadow_ceiling").alias("truth"), node_col
            )
            stats = req.group_by(keys).agg(_stat_aggs(gamma)).collect(engine="streaming")
            truth = req.filter(_trimmed(gamma)).select(*_JOIN, "truth")
        walked = walked_blocks(run)
        columns = walked.collect_schema().names()
        if columns:
            walked = walked.with_columns(node_col)
            if truth is None:
                walked = walked.with_columns(pl.lit(None, pl.Float64).alias("truth"))
            else:
                walked = walked.join(truth, on=_JOIN, how="left")
            aggs = method_aggs(columns, gamma)
            blocks = walked.group_by([*keys, "method"]).agg(aggs).collect()
    return stats, blocks


def merge_folds(folds: list[tuple], by: tuple[str, ...]) -> tuple:
    """The runs' sums (`fold_run`) added per group: the fleet fold's reduce."""
    keys = ["workload", *by]
    stats = [s for s, _ in folds if s is not None]
    blocks = [b for _, b in folds if b is not None]
    return _added(stats, keys), _added(blocks, [*keys, "method"])


def _added(frames: list[pl.DataFrame], keys: list[str]) -> pl.DataFrame | None:
    if not frames:
        return None
    both = pl.concat(frames, how="diagonal_relaxed")
    sums = [c for c in both.columns if c not in keys]
    return both.group_by(keys).agg(
        pl.col(c).max() if c in MAX_AGGS else pl.col(c).sum() for c in sums
    )


def _entry(stats: dict | None, methods: dict[str, dict], gamma: int) -> dict:
    entry: dict = {
        "truth": None,
        **{
            m: method_entry_from_sums(methods[m], m, gamma) if m in methods else {"blocks": 0}
            for m in ("greedy", "sampled")
        },
    }
    walked = {k: sum(s[k] for s in methods.values()) for k in ("blocks", "lo", "point", "hi")}
    walked["window"] = sum(s["window"] for s in methods.values())
    censored = sum(s["censored"] for s in methods.values())
    if stats is None:  # walks only (block-accept JSONL ingests)
        entry["counts"] = {"walked": walked["blocks"], "censored": censored}
        return entry
    if stats["truth_n"] == stats["n"]:
        entry["truth"] = stats["truth_sum"] / stats["n"]
    entry["all_steps"] = all_steps(stats, walked, gamma)
    blocks = stats["observed_blocks"] + walked["blocks"]
    entry["estimate"] = {
        "observed_blocks": stats["observed_blocks"],
        "walked_blocks": walked["blocks"],
        **{
            k: (stats["observed_tokens"] + walked[k]) / blocks if blocks else None
            for k in ("lo", "point", "hi")
        },
    }
    entry["counts"] = {
        "blocks": stats["n"],
        "trimmed": stats["trimmed"],
        "walked": walked["blocks"],
        "resolved": walked["blocks"] - censored,
        "censored": censored,
        "skipped": stats["trimmed"] - walked["blocks"],
    }
    return entry


def _rows(frame: pl.DataFrame | None, keys: list[str]) -> dict[tuple, dict]:
    if frame is None:
        return {}
    return {tuple(r[k] for k in keys): r for r in frame.iter_rows(named=True)}


def _sort_key(key: tuple) -> tuple:
    return tuple((v is None, v if v is not None else "") for v in key)


def _entries(stats, blocks, keys: list[str], gamma: int) -> dict[tuple, dict]:
    stat_rows = _rows(stats, keys)
    methods: dict[tuple, dict[str, dict]] = {}
    for key, row in _rows(blocks, [*keys, "method"]).items():
        methods.setdefault(key[:-1], {})[key[-1]] = row
    out = {}
    for key in sorted(set(stat_rows) | set(methods), key=_sort_key):
        out[key] = _entry(stat_rows.get(key), methods.get(key, {}), gamma)
    return out


def _regroup(frame: pl.DataFrame | None, keys: list[str], by) -> pl.DataFrame | None:
    """The sums of the `by` groups added into `keys` alone."""
    return None if frame is None else _added([frame.drop(by)], keys)


def fleet_evaluate(fleet: Fleet, by: tuple[str, ...] = ()) -> dict:
    """The `estimate --json` object of many runs: per workload, and per (workload, *by)."""
    runs = zip(fleet.runs, fleet.nodes, strict=True)
    return evaluate_folds(fleet.head, [fold_run(r, n, fleet.gamma, by) for r, n in runs], by)


def evaluate_folds(head: FleetHead, folds: list[tuple], by: tuple[str, ...] = ()) -> dict:
    """`fleet_evaluate` from its runs' `fold_run` sums, wherever they were folded."""
    gamma = head.gamma
    stats, blocks = merge_folds(folds, by)
    if stats is None and blocks is None:
        raise ValueError("no run of the fleet holds request-steps or walked blocks")
    workloads = _entries(
        _regroup(stats, ["workload"], by),
        _regroup(blocks, ["workload", "method"], by),
        ["workload"],
        gamma,
    )
    groups = _entries(stats, blocks, ["workload", *by], gamma) if by else {}
    return {
        "run": head.run,
        "runs": head.describe(),
        "gamma": gamma,
        "by": list(by),
        "workloads": {key[0]: entry for key, entry in workloads.items()},
        "groups": [
            {**dict(zip(by, key[1:], strict=True)), "workload": key[0], **entry}
            for key, entry in groups.items()
        ],
    }

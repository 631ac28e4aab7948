"""A run directory read into a `RunFrame`: its request-steps in step order, each joined to
its step, its cell, its walk and (under a relay) the row its budget was planned on.

Only the columns a prediction reads are read (on 10M request-steps each `[rows, gamma]`
column is 560 MB), and request ids are integer codes shared by the requests and the walks,
so no join runs on the strings.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..analysis.load import run_load_level
from ..analysis.request_codes import positions, request_codes
from ..analysis.step_time import measured_step_ms
from ..domain.cost_table import DEFAULT_CAPTURE_TIERS, AdditiveCostTable
from ..domain.workload_codes import workload_code
from ..estimator.evaluate import walked_blocks
from ..store import Run
from ..store.errors import READ_ERRORS, unreadable
from .cell_codes import cell_codes
from .counterfactual_accept import AcceptInputs, exact_ceiling
from .frame import RunFrame
from .policies import Policy
from .relay import relay_rows
from .walk_columns import walk_columns


def _matrix(req: pl.LazyFrame, name: str, gamma: int, order: np.ndarray | None, wanted: bool):
    """Column `name` as `[rows, gamma]` float64 in the prediction's row order (`order`: the
    requests table's row of each; None where it is the table's own), None if all NaN or
    not `wanted` (on 10M request-steps each is 560 MB: read only those a prediction uses)."""
    if not wanted or name not in req.collect_schema().names():
        return None
    column = req.select(name).collect().to_series()
    m = np.asarray(column.to_numpy().reshape(-1, gamma), dtype=np.float64)
    del column
    if order is not None:
        m = m[order]
    return None if np.isnan(m).all() else m


def _cost_table(run: Run) -> tuple[AdditiveCostTable, str]:
    """The table the run's steps cost by: run.json's own, else one fitted to its times."""
    recorded = run.manifest.get("cost_table")
    if isinstance(recorded, dict):
        return AdditiveCostTable(**recorded), "run.json"
    from ..analysis.cost_fit import CostFitError, fit_cost_table

    try:
        return fit_cost_table(run).table, "fitted"
    except CostFitError as exc:
        raise ValueError(
            f"{run.path}: no cost table to predict step times with: run.json records none "
            f"and one cannot be fitted ({exc})"
        ) from exc


def _tiers(run: Run) -> tuple[int, ...]:
    recorded = (run.manifest.get("config") or {}).get("capture_tiers")
    return tuple(int(t) for t in recorded) if recorded else DEFAULT_CAPTURE_TIERS


def load_run_frame(
    run: Run,
    *,
    use_shadow: bool = True,
    policies: list[Policy] | None = None,
    clusters: bool = True,
) -> RunFrame:
    """The run's request-steps and steps as arrays; its walks joined where it has them.

    `use_shadow=False` ignores a cap-accept shadow twin's ceilings, so the prediction
    rests on the ceiling estimator alone (how it is held to a real run). `policies`
    (default: any) decides which `[rows, gamma]` columns are read: the survivals for an
    SPS policy, the logits for one with another STS, the confidence only where some
    ceiling is unknown (the population model reads it). `clusters=False` leaves out
    what only the rates' intervals and the closed loop read (the (level, request) pairs
    and (step, workload) parts, `CellCodes`) and looks the walks up only for the
    request-steps whose ceiling is unknown, the only ones a prediction reads them for
    (`ceiling_sources` then counts those): on a run whose every ceiling is known, and
    whose requests no relay or `topk` follows, the ids and the walks are not read at all.
    """
    try:
        return _load(run, use_shadow, policies, clusters)
    except READ_ERRORS as exc:
        raise unreadable(run.path, exc) from exc


def _load(run: Run, use_shadow: bool, policies: list[Policy] | None, clusters: bool) -> RunFrame:
    gamma = run.gamma
    if "requests" not in run.tables():
        raise ValueError(
            f"{run.path} holds no request-steps (an ingested block-accept JSONL has only "
            "ceilings): a prediction needs every request-step's window and accepted drafts"
        )
    req = run.requests()
    workloads = req.select(pl.col("workload").unique()).collect()["workload"].to_list()
    named = sorted(n for n in workloads if n is not None)
    sps = policies is None or any(p.kind in ("sps", "topk") for p in policies)
    topk = policies is not None and any(p.kind == "topk" for p in policies)
    recalibrated = policies is None or any(p.sts is not None for p in policies)
    shadow = pl.col("shadow_ceiling") if use_shadow else pl.lit(None, pl.Int64)
    steps = run.steps().filter(pl.col("bs") > 0)
    lagged = "lag_steps" in steps.collect_schema().names()
    lagged = lagged and (steps.select(pl.col("lag_steps").max()).collect().item() or 0) > 0
    # the slots are read only where a relay needs them (80 MB on 10M request-steps)
    slot = (
        pl.col("req_pool_index")
        if "req_pool_index" in req.collect_schema().names()
        else pl.lit(-1, pl.Int64).alias("req_pool_index")
    )
    df = req.select(
        "rank",
        "forward_ct",
        *([slot] if lagged or topk else []),
        workload_code(named),
        "window",
        "correct_drafts",
        pl.coalesce(pl.col("ceiling"), shadow).cast(pl.Float64).alias("known_ceiling"),
    ).collect()
    needs_walk = _rows_needing_walks(df, gamma)
    walks = rid = None
    walk_rid: list = []
    if clusters or lagged or topk or needs_walk.any():
        blocks = walked_blocks(run)
        walks = blocks if blocks.collect_schema().names() else None
        rid, *walk_rid = request_codes(req, *([walks] if walks is not None else []))
    key = (df["rank"].to_numpy() << 40) + df["forward_ct"].to_numpy()
    # `order`: the requests table's row of each row kept, None where it is the table's own.
    # A run's parts in step order need no sort: checking the order costs milliseconds.
    order = np.argsort(key, kind="stable") if (np.diff(key) < 0).any() else None
    if order is not None:
        key = key[order]
    step_cols = steps.select(
        "rank",
        "forward_ct",
        run_load_level(run, steps).alias("level"),
        measured_step_ms(),
        pl.coalesce("num_verify_tokens", "verify_tokens_local").alias("tier"),
        pl.col("lag_steps").fill_null(0) if lagged else pl.lit(0).alias("lag_steps"),
    ).collect()  # fmt: skip
    table_keys = (step_cols["rank"].to_numpy() << 40) + step_cols["forward_ct"].to_numpy()
    by_key = np.argsort(table_keys, kind="stable")
    start = _starts(key)
    found = positions(table_keys[by_key], key[start])
    if (found < 0).any():  # rows of a step the steps table lacks (or holds as empty)
        kept = np.flatnonzero(np.repeat(found >= 0, np.diff(np.append(start, len(key)))))
        order = kept if order is None else order[kept]
        key, found = key[kept], found[found >= 0]
        start = _starts(key)
    if len(key) == 0:
        raise ValueError(f"{run.path} holds no request-steps of a step with requests")
    if order is not None:
        df, needs_walk = df[order], needs_walk[order]
        rid = None if rid is None else rid[order]
    bs = np.diff(np.append(start, len(key)))
    step = np.repeat(np.arange(len(start)), bs)
    step_row = by_key[found]
    levels = step_cols["level"].to_numpy()[step_row]
    looked_up = None if clusters else np.flatnonzero(needs_walk)
    walk = walk_columns(walks, walk_rid, key[start], step, rid, looked_up)
    inputs = AcceptInputs(
        gamma=gamma,
        recorded_window=df["window"].to_numpy(),
        accepted=df["correct_drafts"].to_numpy(),
        known_ceiling=df["known_ceiling"].to_numpy().astype(np.float64),
        group=df["group"].to_numpy(),
        confidence=None,
        **walk,
    )
    if np.isnan(exact_ceiling(inputs)).any():
        inputs.confidence = _matrix(req, "confidence", gamma, order, True)
    table, source = _cost_table(run)
    sources = {
        "observed_or_shadow": int(np.isfinite(inputs.known_ceiling).sum()),
        "walked": int(np.isfinite(inputs.walk_point).sum()),
    }
    relay_row = last_step_row = None
    if lagged or topk:
        lags = [
            step_cols["lag_steps"].to_numpy()[step_row] if lagged else np.zeros(len(start), int),
            np.full(len(start), int(topk)),
        ]
        slot = df["req_pool_index"].to_numpy()
        relay_row, last_step_row = relay_rows(
            key[start], _recorded_step_keys(run.steps()), step, rid, slot, lags
        )
    return RunFrame(
        gamma=gamma,
        step=step,
        cells=cell_codes(levels, inputs.group, rid if clusters else None, step, [*named, None]),
        inputs=inputs,
        survival=_matrix(req, "survival", gamma, order, sps),
        logits=_matrix(req, "confidence_logits", gamma, order, recalibrated),
        step_start=start,
        step_bs=bs,
        step_ms=step_cols["step_ms"].to_numpy()[step_row].astype(np.float64),
        step_tier=step_cols["tier"].to_numpy()[step_row].astype(np.float64),
        table=table,
        table_source=source,
        tiers=_tiers(run),
        ceiling_sources=sources,
        relay_row=relay_row,
        last_step_row=last_step_row,
    )


def _recorded_step_keys(steps: pl.LazyFrame) -> np.ndarray:
    """Every recorded step's `(rank << 40) + forward_ct`, ascending and unique."""
    keys = steps.select("rank", "forward_ct").collect()
    return np.unique((keys["rank"].to_numpy() << 40) + keys["forward_ct"].to_numpy())


def _rows_needing_walks(df: pl.DataFrame, gamma: int) -> np.ndarray:
    """`[rows]` the request-steps whose ceiling neither the run (`known_ceiling`) nor their
    own untrimmed window gives (`counterfactual_accept.exact_ceiling` before the walks):
    the rows a walk is read for."""
    window, accepted = df["window"].to_numpy(), df["correct_drafts"].to_numpy()
    trimmed = (accepted >= window) & (window < gamma)
    return df["known_ceiling"].is_null().to_numpy() & trimmed


def _starts(key: np.ndarray) -> np.ndarray:
    """The first row of each run of equal `key`s."""
    return np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))

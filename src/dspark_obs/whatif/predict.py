"""What another verify policy would have given on a recorded run's traffic.

One run holds both sides of the trade the compact scheduler makes: fewer verify tokens
make a step cheaper (the cost table), and trimming gives up accepted tokens (the
ceiling). For each policy (`policies.py`) and each request-step of the run, the window
the policy would have chosen on the recorded confidences and batch; the drafts that
window accepts (`counterfactual_accept.py`: what happened within the recorded window,
the ceiling estimator beyond it); and the step's time at the policy's packed verify
tokens, rounded up to the captured tier as the runtime and SGLang do. A measured step
time is scaled by the table's ratio between the policy's tokens and the recorded ones,
so the run's own policy reproduces its measured times and its noise stays in every
prediction; an untimed step takes the table's time.

The prediction holds the traffic and the token streams fixed: the same requests in the
same batches, step for step. A real run of another policy commits the same tokens per
request (DSpark's verification is lossless) but in a different number of steps, so its
requests finish at other steps and its batches mix other blocks; the interval's
sampling part covers that. What it does not cover is a policy that changes the load
itself (an open-loop server whose queue grows when steps slow down).

Cells are (load level, workload) and (load level, `all`): a level is the batch size
(`load.load_level`), tokens/s a cell's committed tokens over its request-steps' share
of step time (`T / bs` each; for `all` exactly the level's throughput) and per-request
tokens/s committed tokens over the step time its requests sat through.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..analysis.load import load_level
from ..analysis.step_time import measured_step_ms
from ..analysis.workload_codes import workload_code
from ..estimator.evaluate import Z95, walked_blocks
from ..runtime.cost_table import DEFAULT_CAPTURE_TIERS, AdditiveCostTable, repriced_seconds
from ..store import Run
from ..store.errors import READ_ERRORS, unreadable
from .counterfactual_accept import AcceptInputs, accepted_under, exact_ceiling, tail_shapes
from .policies import Policy, parse_policy, policy_windows

#: Policies `whatif` predicts when none are named.
DEFAULT_POLICIES = ("own", "static", "sps", "window=3", "sps:scale=0.5")

#: Keys of every cell; documented in docs/whatif.md.
CELL_KEYS = (
    "policy",
    "level",
    "workload",
    "steps",
    "request_steps",
    "mean_window",
    "verify_tokens_per_step",
    "mean_accepted",
    "mean_accepted_lo",
    "mean_accepted_hi",
    "mean_committed",
    "step_ms",
    "tokens_per_s",
    "tokens_per_s_lo",
    "tokens_per_s_hi",
    "per_request_tokens_per_s",
    "per_request_tokens_per_s_lo",
    "per_request_tokens_per_s_hi",
)


@dataclass
class RunFrame:
    """A run's request-steps, grouped by step, as the predictions read them."""

    gamma: int
    rows: pl.DataFrame  # rank, forward_ct, rid, workload, level, step
    inputs: AcceptInputs
    survival: np.ndarray | None
    logits: np.ndarray | None
    step_start: np.ndarray
    step_bs: np.ndarray
    step_ms: np.ndarray  # measured, NaN where untimed
    step_tier: np.ndarray  # the recorded verify tokens (its captured tier)
    table: AdditiveCostTable
    table_source: str
    tiers: tuple[int, ...]
    ceiling_sources: dict


def _matrix(df: pl.DataFrame, name: str, gamma: int) -> np.ndarray | None:
    if name not in df.columns:
        return None
    m = df[name].to_numpy().reshape(-1, gamma).astype(np.float64)
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


def load_run_frame(run: Run, *, use_shadow: bool = True) -> RunFrame:
    """The run's request-steps and steps as arrays; its walks joined where it has them.

    `use_shadow=False` ignores a cap-accept shadow twin's ceilings, so the prediction
    rests on the ceiling estimator alone (how it is held to a real run).
    """
    try:
        return _load(run, use_shadow)
    except READ_ERRORS as exc:
        raise unreadable(run.path, exc) from exc


def _load(run: Run, use_shadow: bool) -> RunFrame:
    gamma = run.gamma
    if "requests" not in run.tables():
        raise ValueError(
            f"{run.path} holds no request-steps (an ingested block-accept JSONL has only "
            "ceilings): a prediction needs every request-step's window and accepted drafts"
        )
    req = run.requests()
    names = req.select(pl.col("workload").unique()).collect()["workload"].to_list()
    known = sorted(n for n in names if n is not None)
    have = set(req.collect_schema().names())
    matrices = [c for c in ("confidence", "survival", "confidence_logits") if c in have]
    shadow = pl.col("shadow_ceiling") if use_shadow else pl.lit(None, pl.Int64)
    keys = ["rank", "forward_ct", "rid"]
    rows = req.select(
        *keys,
        "workload",
        workload_code(known),
        "window",
        "correct_drafts",
        pl.coalesce(pl.col("ceiling"), shadow).cast(pl.Float64).alias("known_ceiling"),
        *matrices,
    ).with_row_index("row")
    blocks = walked_blocks(run)
    if blocks.collect_schema().names():
        walk = blocks.select(
            *keys,
            ((pl.col("method") == "greedy") & (pl.col("status") == "exact")).alias("walk_exact"),
            pl.col("lo").alias("walk_lo"),
            pl.col("point").alias("walk_point"),
            pl.col("hi").alias("walk_hi"),
        ).unique(keys, keep="last")
        rows = rows.join(walk, on=keys, how="left", maintain_order="left")
    else:
        rows = rows.with_columns(
            pl.lit(False).alias("walk_exact"),
            *(pl.lit(None, pl.Float64).alias(c) for c in ("walk_lo", "walk_point", "walk_hi")),
        )
    steps = run.steps().filter(pl.col("bs") > 0)
    level = load_level(steps)
    step_cols = steps.select(
        "rank",
        "forward_ct",
        level.alias("level"),
        measured_step_ms(),
        pl.coalesce("num_verify_tokens", "verify_tokens_local").alias("tier"),
    )
    df = (
        rows.join(step_cols, on=["rank", "forward_ct"], how="inner", maintain_order="left")
        .sort("rank", "forward_ct", "row", maintain_order=True)
        .collect()
    )
    if df.height == 0:
        raise ValueError(f"{run.path} holds no request-steps of a step with requests")
    step_key = (df["rank"].to_numpy() << 40) + df["forward_ct"].to_numpy()
    start = np.flatnonzero(np.concatenate(([True], step_key[1:] != step_key[:-1])))
    bs = np.diff(np.append(start, df.height))
    df = df.with_columns(pl.Series("step", np.repeat(np.arange(len(start)), bs)))
    walk_point = df["walk_point"].to_numpy().astype(np.float64)
    inputs = AcceptInputs(
        gamma=gamma,
        window=df["window"].to_numpy(),
        accepted=df["correct_drafts"].to_numpy(),
        ceiling=df["known_ceiling"].to_numpy().astype(np.float64),
        group=df["group"].to_numpy(),
        confidence=_matrix(df, "confidence", gamma),
        walk_exact=df["walk_exact"].fill_null(False).to_numpy(),
        walk_lo=df["walk_lo"].to_numpy().astype(np.float64),
        walk_point=walk_point,
        walk_hi=df["walk_hi"].to_numpy().astype(np.float64),
    )
    table, source = _cost_table(run)
    step_ms = df["step_ms"].to_numpy()[start].astype(np.float64)
    tier = df["tier"].to_numpy()[start].astype(np.float64)
    sources = {
        "observed_or_shadow": int(np.isfinite(inputs.ceiling).sum()),
        "walked": int(np.isfinite(walk_point).sum()),
    }
    return RunFrame(
        gamma=gamma,
        rows=df.select("rank", "forward_ct", "rid", "workload", "level", "step"),
        inputs=inputs,
        survival=_matrix(df, "survival", gamma),
        logits=_matrix(df, "confidence_logits", gamma),
        step_start=start,
        step_bs=bs,
        step_ms=step_ms,
        step_tier=tier,
        table=table,
        table_source=source,
        tiers=_tiers(run),
        ceiling_sources=sources,
    )


def step_seconds(frame: RunFrame, windows: np.ndarray) -> np.ndarray:
    """`[steps]` predicted step time under `windows`: measured times scaled by the table."""
    bs = frame.step_bs.astype(np.float64)
    tokens = bs + np.add.reduceat(windows, frame.step_start)
    return repriced_seconds(
        frame.table, bs, tokens, frame.step_tier, frame.step_ms / 1e3, frame.tiers
    )


def _cell_frame(frame: RunFrame, windows, accepted, seconds) -> pl.DataFrame:
    point, lo, hi = accepted
    step = frame.rows["step"].to_numpy()
    bs = frame.step_bs[step]
    t = seconds[step]
    return frame.rows.select("rid", "workload", "level", "step").with_columns(
        pl.Series("window", windows),
        pl.Series("acc", point),
        pl.Series("acc_lo", lo),
        pl.Series("acc_hi", hi),
        pl.Series("t_share", t / bs),
        pl.Series("t", t),
        pl.Series("tokens", (windows + 1).astype(np.float64)),
    )


def _ratio_interval(num: str, den: str, lo: str, hi: str) -> list[pl.Expr]:
    """`num/den` per cell with its interval: the bracket of the unknown ceilings, widened by
    the spread between two runs of one policy on the same traffic (the prediction's and a
    real run's sampling errors: `sqrt(2)` standard errors of the ratio, each the larger of
    the cluster-robust one by request and the one treating request-steps as independent,
    so that a cell of one request still has a spread)."""
    total = pl.col(den).sum()
    rate = pl.col(num).sum() / total
    rows = ((pl.col(num) - rate * pl.col(den)) ** 2).sum()
    se = pl.max_horizontal(pl.col(f"_e2_{den}").first(), rows).sqrt() / total
    half = Z95 * np.sqrt(2.0) * se
    return [
        rate.alias(f"_{den}_rate"),
        (pl.col(lo).sum() / total - half).alias(f"_{den}_lo"),
        (pl.col(hi).sum() / total + half).alias(f"_{den}_hi"),
    ]


def _aggregate(cells: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    c = cells.with_columns(
        (pl.col("acc") + 1).alias("com"),
        (pl.col("acc_lo") + 1).alias("com_lo"),
        (pl.col("acc_hi") + 1).alias("com_hi"),
    )
    # per request within the cell: residuals of the committed tokens around each ratio
    per_rid = c.group_by(*by, "rid").agg(
        pl.col("com").sum(), pl.col("t_share").sum(), pl.col("t").sum()
    )
    ratios = c.group_by(by).agg(
        (pl.col("com").sum() / pl.col("t_share").sum()).alias("_rs"),
        (pl.col("com").sum() / pl.col("t").sum()).alias("_rt"),
    )
    resid = (
        per_rid.join(ratios, on=by)
        .group_by(by)
        .agg(
            ((pl.col("com") - pl.col("_rs") * pl.col("t_share")) ** 2).sum().alias("_e2_t_share"),
            ((pl.col("com") - pl.col("_rt") * pl.col("t")) ** 2).sum().alias("_e2_t"),
        )
    )
    return (
        c.join(resid, on=by)
        .group_by(by)
        .agg(
            pl.col("step").n_unique().alias("steps"),
            pl.len().alias("request_steps"),
            pl.col("window").mean().alias("mean_window"),
            pl.col("acc").mean().alias("mean_accepted"),
            pl.col("acc_lo").mean().alias("mean_accepted_lo"),
            pl.col("acc_hi").mean().alias("mean_accepted_hi"),
            pl.col("com").mean().alias("mean_committed"),
            (pl.col("tokens").sum() / pl.col("step").n_unique()).alias("_tokens_per_step"),
            (pl.col("t").mean() * 1e3).alias("_step_ms"),
            *_ratio_interval("com", "t_share", "com_lo", "com_hi"),
            *_ratio_interval("com", "t", "com_lo", "com_hi"),
        )
    )


def _step_level(frame: RunFrame, seconds: np.ndarray, windows: np.ndarray) -> pl.DataFrame:
    """Per level: mean step time and packed verify tokens per step (whole batches)."""
    level = frame.rows["level"].to_numpy()[frame.step_start]
    tokens = frame.step_bs + np.add.reduceat(windows, frame.step_start)
    return (
        pl.DataFrame({"level": level, "t": seconds, "m": tokens})
        .group_by("level")
        .agg((pl.col("t").mean() * 1e3).alias("step_ms"), pl.col("m").mean().alias("verify"))
    )


def predict_policy(frame: RunFrame, policy: Policy, shapes, exact) -> list[dict]:
    """The cells of one policy, sorted by level then workload (`all` first)."""
    inp = frame.inputs
    windows = policy_windows(
        policy,
        window=inp.window,
        gamma=frame.gamma,
        survival=frame.survival,
        logits=frame.logits,
        step_start=frame.step_start,
        step_bs=frame.step_bs,
        table=frame.table,
    )
    accepted = accepted_under(inp, exact, shapes, windows)
    seconds = step_seconds(frame, windows)
    cells = _cell_frame(frame, windows, accepted, seconds)
    per_level = _step_level(frame, seconds, windows)
    parts = [
        _aggregate(cells.with_columns(pl.lit("all").alias("workload")), ["level", "workload"]),
        _aggregate(cells, ["level", "workload"]),
    ]
    out = []
    for part in parts:
        part = part.join(per_level, on="level").sort("level", "workload")
        for r in part.iter_rows(named=True):
            whole = r["workload"] == "all"
            out.append(
                {
                    "policy": policy.spec,
                    "level": r["level"],
                    "workload": r["workload"],
                    "steps": r["steps"],
                    "request_steps": r["request_steps"],
                    "mean_window": r["mean_window"],
                    "verify_tokens_per_step": r["verify"] if whole else r["_tokens_per_step"],
                    "mean_accepted": r["mean_accepted"],
                    "mean_accepted_lo": r["mean_accepted_lo"],
                    "mean_accepted_hi": r["mean_accepted_hi"],
                    "mean_committed": r["mean_committed"],
                    "step_ms": r["step_ms"] if whole else r["_step_ms"],
                    "tokens_per_s": r["_t_share_rate"],
                    "tokens_per_s_lo": r["_t_share_lo"],
                    "tokens_per_s_hi": r["_t_share_hi"],
                    "per_request_tokens_per_s": r["_t_rate"],
                    "per_request_tokens_per_s_lo": r["_t_lo"],
                    "per_request_tokens_per_s_hi": r["_t_hi"],
                }
            )
    out.sort(key=lambda c: (c["level"], c["workload"] != "all", c["workload"]))
    return out


def whatif(
    run: Run,
    policies: list[str] | None = None,
    *,
    use_shadow: bool = True,
    skip_unavailable: bool = False,
) -> dict:
    """The `dspark-obs whatif --json` object: every policy's cells on the run's traffic.

    `skip_unavailable` leaves out a policy the run cannot support (an SPS policy without
    survivals or logits) and names it with the reason under `unavailable`, so that the
    report draws what it can; without it such a policy is refused.
    """
    parsed = [parse_policy(p) for p in (policies or DEFAULT_POLICIES)]
    frame = load_run_frame(run, use_shadow=use_shadow)
    inp = frame.inputs
    exact = exact_ceiling(inp)
    shapes = tail_shapes(inp, exact, int(inp.group.max()) + 1)
    cells, unavailable = [], {}
    for policy in parsed:
        try:
            cells += predict_policy(frame, policy, shapes, exact)
        except ValueError as exc:
            if not skip_unavailable:
                raise
            unavailable[policy.spec] = str(exc)
    out = {
        "run": str(run.path),
        "mode": run.manifest.get("mode"),
        "gamma": frame.gamma,
        "cost_table": frame.table_source,
        "request_steps": len(inp.window),
        "unknown_ceilings": len(shapes.rows),
        "ceiling_sources": frame.ceiling_sources,
        "cells": cells,
    }
    if skip_unavailable:
        out["unavailable"] = unavailable
    return out

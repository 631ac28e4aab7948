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

The prediction holds the traffic and the token streams fixed. A real run of another
policy commits the same tokens per request (DSpark's verification is lossless) but in a
different number of steps, so its batches hold another mix: each workload's share of a
level moves with its committed tokens per request-step (`closed_loop_weights`), and an
SPS budget is split again over batches of that mix (`_recomposed`). Which requests a
real run's level holds beyond that is sampling, the interval's sampling part. What it
does not cover is a policy that changes the load itself (an open-loop server whose queue
grows when steps slow down).

Cells are (load level, workload) and (load level, `all`): a level is the batch size
(`load.load_level`), tokens/s a cell's committed tokens over its request-steps' share
of step time (`T / bs` each; for `all` exactly the level's throughput) and per-request
tokens/s committed tokens over the step time its requests sat through.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..analysis.load import run_load_level
from ..analysis.request_codes import dense_codes, positions, request_codes
from ..analysis.step_time import measured_step_ms
from ..analysis.workload_codes import workload_code
from ..estimator.evaluate import Z95, walked_blocks
from ..runtime.cost_table import DEFAULT_CAPTURE_TIERS, AdditiveCostTable, repriced_seconds
from ..store import Run
from ..store.errors import READ_ERRORS, unreadable
from .counterfactual_accept import AcceptInputs, accepted_under, exact_ceiling, tail_shapes
from .policies import Policy, parse_policy, policies_windows, policy_windows

#: Policies `whatif` predicts when none are named.
DEFAULT_POLICIES = ("own", "static", "sps", "window=3", "sps:scale=0.5")

#: Request-steps at most that an SPS policy's batches are drawn again from (`_recomposed`,
#: twice per policy: the two passes cost what one over 1M did).
RECOMPOSED_ROWS = 1 << 19

#: Steps before a step whose largest level decides its stretch of a level (`_inside`).
STRETCH_SLACK = 32

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
class CellCodes:
    """Each request-step's cell as integers, so that a policy's cells are `np.bincount`s.

    `cell` is `level_code * len(workloads) + group`; `pair` a dense code of (level,
    request), the clusters of the interval's cluster-robust part; `part` a dense code of
    (step, workload), the rows that share a step time and a cell, over which the
    interval's row-level spread is summed (about 80 times fewer than the rows of a 10M
    request-step run).
    The pairs and parts serve the intervals and the closed loop alone: a frame loaded
    without `clusters` (`load_run_frame`) holds None there.
    """

    levels: np.ndarray  # the level of each level code
    workloads: list  # the name of each workload code (None: rows without one)
    cell: np.ndarray  # [rows] (level, workload) code
    step_level: np.ndarray  # [steps] level code
    cell_rows: np.ndarray  # [cells] request-steps, as float64
    cell_steps: np.ndarray  # [cells] distinct steps holding the cell's rows
    level_steps: np.ndarray  # [levels] steps
    pair: np.ndarray | None = None  # [rows] (level, request) code
    pair_cell: np.ndarray | None = None  # [pairs] the pair's (level, workload) code
    pair_level: np.ndarray | None = None  # [pairs] the pair's level code
    part: np.ndarray | None = None  # [rows] (step, workload) code
    part_step: np.ndarray | None = None  # [parts] the part's step
    part_cell: np.ndarray | None = None  # [parts] the part's (level, workload) code
    part_rows: np.ndarray | None = None  # [parts] its request-steps, as float64
    pair_rows: np.ndarray | None = None  # [pairs] request-steps, as float64
    pair_inside: np.ndarray | None = (
        None  # [pairs] the request began and ended in the level's stretch
    )


@dataclass
class RunFrame:
    """A run's request-steps, grouped by step, as the predictions read them."""

    gamma: int
    step: np.ndarray  # [rows] the row's step (index into the step arrays)
    cells: CellCodes
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
    own_committed: np.ndarray | None = None  # [pairs] the run's committed tokens
    #: [rows] under a confidence relay, the row whose survival each row's budget is planned
    #: on (-1: survival 1); None without a relay (`relay_rows`)
    relay_row: np.ndarray | None = None
    #: [rows] the same one step back, whatever the run's relay (the `topk` policy's); None
    #: where no such policy was asked for
    last_step_row: np.ndarray | None = None


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
    names = req.select(pl.col("workload").unique()).collect()["workload"].to_list()
    known = sorted(n for n in names if n is not None)
    sps = policies is None or any(p.kind in ("sps", "topk") for p in policies)
    topk = policies is not None and any(p.kind == "topk" for p in policies)
    recalibrated = policies is None or any(p.sts is not None for p in policies)
    shadow = pl.col("shadow_ceiling") if use_shadow else pl.lit(None, pl.Int64)
    steps = run.steps().filter(pl.col("bs") > 0)
    lagged = "lag_steps" in steps.collect_schema().names()
    lagged = lagged and (steps.select(pl.col("lag_steps").max()).collect().item() or 0) > 0
    # the slots are read only where a relay needs them (80 MB on 10M request-steps)
    pool = (
        pl.col("req_pool_index")
        if "req_pool_index" in req.collect_schema().names()
        else pl.lit(-1, pl.Int64).alias("req_pool_index")
    )
    df = req.select(
        "rank",
        "forward_ct",
        *([pool] if lagged or topk else []),
        workload_code(known),
        "window",
        "correct_drafts",
        pl.coalesce(pl.col("ceiling"), shadow).cast(pl.Float64).alias("known_ceiling"),
    ).collect()
    unknown = _unknown_ceilings(df, gamma)
    walks = rid = None
    walk_rid: list = []
    if clusters or lagged or topk or unknown.any():
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
    step_keys = (step_cols["rank"].to_numpy() << 40) + step_cols["forward_ct"].to_numpy()
    by_key = np.argsort(step_keys, kind="stable")
    start = _starts(key)
    found = positions(step_keys[by_key], key[start])
    if (found < 0).any():  # rows of a step the steps table lacks (or holds as empty)
        kept = np.flatnonzero(np.repeat(found >= 0, np.diff(np.append(start, len(key)))))
        order = kept if order is None else order[kept]
        key, found = key[kept], found[found >= 0]
        start = _starts(key)
    if len(key) == 0:
        raise ValueError(f"{run.path} holds no request-steps of a step with requests")
    if order is not None:
        df, unknown = df[order], unknown[order]
        rid = None if rid is None else rid[order]
    bs = np.diff(np.append(start, len(key)))
    step = np.repeat(np.arange(len(start)), bs)
    step_row = by_key[found]
    levels = step_cols["level"].to_numpy()[step_row]
    looked_up = None if clusters else np.flatnonzero(unknown)
    walk = _walk_columns(walks, walk_rid, key[start], step, rid, looked_up)
    inputs = AcceptInputs(
        gamma=gamma,
        window=df["window"].to_numpy(),
        accepted=df["correct_drafts"].to_numpy(),
        ceiling=df["known_ceiling"].to_numpy().astype(np.float64),
        group=df["group"].to_numpy(),
        confidence=None,
        **walk,
    )
    if np.isnan(exact_ceiling(inputs)).any():
        inputs.confidence = _matrix(req, "confidence", gamma, order, True)
    table, source = _cost_table(run)
    sources = {
        "observed_or_shadow": int(np.isfinite(inputs.ceiling).sum()),
        "walked": int(np.isfinite(inputs.walk_point).sum()),
    }
    recorded_keys = _step_keys(run.steps()) if lagged or topk else None
    return RunFrame(
        gamma=gamma,
        step=step,
        cells=_cell_codes(levels, inputs.group, rid if clusters else None, step, [*known, None]),
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
        relay_row=None
        if not lagged
        else relay_rows(
            key[start],
            recorded_keys,
            step,
            rid,
            df["req_pool_index"].to_numpy(),
            step_cols["lag_steps"].to_numpy()[step_row],
        ),
        last_step_row=None
        if not topk
        else relay_rows(
            key[start],
            recorded_keys,
            step,
            rid,
            df["req_pool_index"].to_numpy(),
            np.ones(len(start), np.int64),
        ),
    )


def relay_rows(
    step_keys: np.ndarray,
    recorded: np.ndarray,
    step: np.ndarray,
    rid: np.ndarray,
    pool: np.ndarray,
    lag: np.ndarray,
) -> np.ndarray | None:
    """`[rows]` under a confidence relay, the row whose survival each request-step's budget
    was planned on: the same request's row `lag` steps before (`step_keys`: each step's
    `(rank << 40) + forward_ct`, ascending) where it held the same slot (`pool`, its
    `req_pool_index`; -1 where not recorded) in every step since, -1 where it did not (the
    relay hands a slot that changed hands survival 1: a new request, or one back from a
    retraction, or any request of the rank's first steps), and the row itself where a step
    in between is not among the `recorded` keys (every step the run holds, empty ones too:
    no better guess there). None where no step has a lag (`lag`, per step)."""
    if not (lag > 0).any():
        return None
    n = len(step)
    span = int(rid.max()) + 1
    by_row = np.argsort(step * span + rid, kind="stable")
    sorted_rows = (step * span + rid)[by_row]
    row_lag = lag[step]
    out = np.arange(n)
    stale = np.zeros(n, bool)
    unknown = np.zeros(n, bool)
    for d in range(1, int(lag.max()) + 1):
        due = row_lag >= d
        before = positions(step_keys, step_keys - d)[step]  # the step d before, -1 if absent
        hit = positions(sorted_rows, np.where(before >= 0, before * span + rid, -1))
        prev = np.where(hit >= 0, by_row[np.maximum(hit, 0)], -1)
        moved = (prev < 0) | ((pool >= 0) & (pool[np.maximum(prev, 0)] != pool))
        # a step before the rank's first (forward_ct < 0) relayed nothing: held, and empty
        none = (step_keys & ((1 << 40) - 1)) < d
        held = ((positions(recorded, step_keys - d) >= 0) | none)[step]
        stale |= due & held & moved
        unknown |= due & ~held
        at_lag = row_lag == d
        out[at_lag] = prev[at_lag]
    out[unknown] = np.arange(n)[unknown]
    out[stale & ~unknown] = -1
    return out


def _step_keys(steps: pl.LazyFrame) -> np.ndarray:
    """Every recorded step's `(rank << 40) + forward_ct`, ascending and unique."""
    keys = steps.select("rank", "forward_ct").collect()
    return np.unique((keys["rank"].to_numpy() << 40) + keys["forward_ct"].to_numpy())


def relayed(frame: RunFrame, rows: np.ndarray | None = None, *, last_step: bool = False):
    """`(survival, logits)` each row's budget is planned on under the run's confidence relay
    (`relay_row`; rows `rows` of the run, all by default), a row planned on survival 1
    holding 1 (and logits of +inf, 1 under any STS); None without a relay. `last_step`:
    one step back instead (`last_step_row`, the `topk` policy's)."""
    relay = frame.last_step_row if last_step else frame.relay_row
    if relay is None:
        return None
    source = relay if rows is None else relay[rows]
    fresh = (source >= 0)[:, None]
    take = np.maximum(source, 0)

    def gather(m: np.ndarray | None, fill: float):
        return None if m is None else np.where(fresh, m[take], fill)

    return gather(frame.survival, 1.0), gather(frame.logits, np.inf)


def _unknown_ceilings(df: pl.DataFrame, gamma: int) -> np.ndarray:
    """`[rows]` the request-steps whose ceiling neither the run (`known_ceiling`) nor their
    own untrimmed window gives (`counterfactual_accept.exact_ceiling` before the walks):
    the rows a walk is read for."""
    window, accepted = df["window"].to_numpy(), df["correct_drafts"].to_numpy()
    trimmed = (accepted >= window) & (window < gamma)
    return df["known_ceiling"].is_null().to_numpy() & trimmed


def _starts(key: np.ndarray) -> np.ndarray:
    """The first row of each run of equal `key`s."""
    return np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))


def _walk_columns(
    walks, walk_rid: list, step_keys, step: np.ndarray, rid, rows: np.ndarray | None = None
) -> dict:
    """Each row's walk (`walk_exact`, `walk_lo`, `walk_point`, `walk_hi`; NaN and False where
    none covered it), the last of a block's walks where the table holds more than one;
    looked up for rows `rows` alone where given.

    A walk names its block by (rank, forward_ct, rid): matched here as the integer pair
    (the row's step, its request code) by a sort and a binary search, where a join on
    the string id cost most of loading the run."""
    n = len(step)
    out = {"walk_exact": np.zeros(n, bool)}
    out.update({c: np.full(n, np.nan) for c in ("walk_lo", "walk_point", "walk_hi")})
    if walks is None:
        return out
    w = walks.select(
        "rank",
        "forward_ct",
        ((pl.col("method") == "greedy") & (pl.col("status") == "exact")).alias("exact"),
        pl.col("lo", "point", "hi").cast(pl.Float64),
    ).collect()
    span = int(max(rid.max(initial=0), walk_rid[0].max(initial=0))) + 1
    walk_step = positions(step_keys, (w["rank"].to_numpy() << 40) + w["forward_ct"].to_numpy())
    walk_key = walk_step * span + walk_rid[0]
    by_key = np.flatnonzero(walk_step >= 0)
    by_key = by_key[np.argsort(walk_key[by_key], kind="stable")]
    walk_key = walk_key[by_key]
    last = np.append(walk_key[1:] != walk_key[:-1], True)  # a block's last walk
    if rows is None:
        hit = positions(walk_key[last], step * span + rid)
        rows = np.flatnonzero(hit >= 0)
    else:
        hit = positions(walk_key[last], step[rows] * span + rid[rows])
        rows = rows[hit >= 0]
    take = by_key[last][hit[hit >= 0]]
    out["walk_exact"][rows] = w["exact"].fill_null(False).to_numpy()[take]
    for c in ("lo", "point", "hi"):
        out[f"walk_{c}"][rows] = w[c].to_numpy()[take]
    return out


def _cell_codes(
    step_values: np.ndarray, group: np.ndarray, rid, step: np.ndarray, names: list
) -> CellCodes:
    """The cells from each step's level (`step_values`) and each row's workload code,
    request code and step, all by integer tables (no sort of the rows); without `rid`
    (None) the cells alone, no pairs or parts."""
    levels, step_level = np.unique(step_values, return_inverse=True)
    level = step_level[step]
    n_wl, n_cells = len(names), len(levels) * len(names)
    cell = level * n_wl + group
    # a cell's steps: the distinct (step, workload) pairs of its rows, its parts
    key = step * n_wl + group
    seen = np.zeros(len(step_level) * n_wl, bool)
    seen[key] = True
    held = np.flatnonzero(seen)
    part_cell = step_level[held // n_wl] * n_wl + held % n_wl
    cells = CellCodes(
        levels=levels,
        workloads=names,
        cell=cell,
        step_level=step_level,
        cell_rows=np.bincount(cell, minlength=n_cells).astype(np.float64),
        cell_steps=np.bincount(part_cell, minlength=n_cells),
        level_steps=np.bincount(step_level, minlength=len(levels)),
    )
    if rid is None:
        return cells
    pair, n_pairs = dense_codes(level * (int(rid.max()) + 1) + rid)
    pair_cell = np.zeros(n_pairs, np.int64)
    pair_cell[pair] = cell
    part = (np.cumsum(seen) - 1)[key]
    return dataclasses.replace(
        cells,
        pair=pair,
        pair_cell=pair_cell,
        pair_level=pair_cell // n_wl,
        part=part,
        part_step=held // n_wl,
        part_cell=part_cell,
        part_rows=np.bincount(part, minlength=len(held)).astype(np.float64),
        pair_rows=np.bincount(pair, minlength=n_pairs).astype(np.float64),
        pair_inside=np.bincount(pair, _inside(step_level, rid, step), minlength=n_pairs) > 0,
    )


def _inside(step_level: np.ndarray, rid: np.ndarray, step: np.ndarray) -> np.ndarray:
    """`[rows]` whether the row's request began and ended within its level's stretch of
    steps (a request cut by the stretch's end, or carried in from before it, is not): the
    requests the closed loop's steady state describes.
    Where levels are bands of batch sizes, a stretch is that of the band the batch holds
    when it is full, so the requests of a batch that dips into the band below are the
    stretch's too."""
    first = np.full(int(rid.max()) + 1, len(step_level), np.int64)
    last = np.full(int(rid.max()) + 1, -1, np.int64)
    np.minimum.at(first, rid, step)
    np.maximum.at(last, rid, step)
    # a stretch is where the last steps' largest level holds: a batch that dips below its
    # level for a few steps (retracted requests) stays in its stretch
    pad = np.pad(step_level, (STRETCH_SLACK, 0), mode="edge")
    held = np.lib.stride_tricks.sliding_window_view(pad, STRETCH_SLACK + 1).max(axis=1)
    edge = np.flatnonzero(np.diff(held)) + 1
    bounds = np.concatenate(([0], edge, [len(step_level)]))
    stretch = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    begin, end = bounds[:-1][stretch], bounds[1:][stretch] - 1
    return (first[rid] >= begin[step]) & (last[rid] < end[step])


def step_tokens(frame: RunFrame, windows: np.ndarray, weight: np.ndarray | None = None):
    """`[steps]` packed verify tokens (`bs` + the windows). With `weight` (per row, from
    `closed_loop_weights`) each step holds its batch size of the reweighted mix: `bs` times
    its rows' weighted mean window (rounded to 1e-9, so that a step of one workload keeps
    its own tokens and tier)."""
    bs = frame.step_bs.astype(np.float64)
    if weight is None:
        return bs + np.add.reduceat(windows, frame.step_start)
    mean = np.add.reduceat(weight * windows, frame.step_start)
    mean /= np.add.reduceat(weight, frame.step_start)
    return bs + np.round(bs * mean, 9)


def step_seconds(frame: RunFrame, tokens: np.ndarray) -> np.ndarray:
    """`[steps]` predicted step time at `tokens` (`step_tokens`): measured times scaled by
    the table."""
    bs = frame.step_bs.astype(np.float64)
    return repriced_seconds(
        frame.table, bs, tokens, frame.step_tier, frame.step_ms / 1e3, frame.tiers
    )


def closed_loop_weights(frame: RunFrame, committed: np.ndarray) -> np.ndarray:
    """`[pairs]` how much more (or less) of a level's request-steps each request holds under
    the policy than in the run: `c_own / c_policy`, its committed tokens per request-step
    in the run over the policy's (`committed`: its sum per (level, request) pair), scaled so
    that a level keeps its request-steps.

    Fixed concurrency (the reference runtime, a benchmark) or a queue that serves every
    request: a slot, or the server, takes the traffic's requests in turn, and each holds
    its place for its tokens over its committed tokens per request-step. Its tokens do not
    depend on the policy, `c` does, and by how much differs from request to request within
    a workload (a policy that trims harder slows down most the requests whose drafts it
    trims), so the move is per request, not per workload. That holds for the requests a
    level's stretch of steps holds from beginning to end (`CellCodes.pair_inside`); the
    rest (carried in, or cut by the stretch's end) keep their recorded request-steps."""
    c = frame.cells
    n_levels = len(c.levels)
    if frame.own_committed is None:
        frame.own_committed = np.bincount(
            c.pair, frame.inputs.accepted + 1.0, minlength=len(c.pair_rows)
        )
    ratio = frame.own_committed / committed
    moved = c.pair_rows * c.pair_inside
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.bincount(c.pair_level, moved, minlength=n_levels) / np.bincount(
            c.pair_level, moved * ratio, minlength=n_levels
        )
    return np.where(c.pair_inside, ratio * np.nan_to_num(scale)[c.pair_level], 1.0)


def _recomposed(frame: RunFrame, policy: Policy, shapes, exact, weight, same) -> tuple:
    """An SPS policy's windows and accepted drafts with its budget split over batches of
    the policy's mix, not the run's.

    The scheduler splits one budget over a batch, so a request's window depends on who
    else is in it. Each step's batch (at most `RECOMPOSED_ROWS` rows, from every k-th step
    beyond) is moved to the policy's mix (`weight`, per row, `closed_loop_weights`) by as
    few changes as it takes: a row of a request the policy holds less of leaves with
    probability `1 - weight`, and a row of one it holds more of, from the same level, takes
    its slot. The batches are scheduled again; per cell, the rows' windows and accepted
    drafts over what the same rows had in their recorded batches (`same`) scale the
    recorded rows. A policy whose mix is the run's changes nothing (the run's own SPS
    replay stays exact), and the ratio over the same rows cancels the draw's sampling where
    the batch does not matter (a batch of one: exactly 1)."""
    c, inp = frame.cells, frame.inputs
    every = -(-len(frame.step) // RECOMPOSED_ROWS)
    steps = np.arange(0, len(frame.step_start), every)
    bs = frame.step_bs[steps]
    rows = np.repeat(frame.step_start[steps] - np.cumsum(np.append(0, bs[:-1])), bs)
    rows += np.arange(len(rows))  # the sampled steps' own rows
    rng = np.random.default_rng(0)
    # a row stays with probability min(1, weight); its slot goes to a row of a request
    # the policy holds more of, drawn in proportion to that excess within the level
    leave = rng.random(len(rows)) >= weight[rows]
    excess = np.maximum(weight - 1.0, 0.0)
    row_level = c.cell[rows] // len(c.workloads)
    for i in range(len(c.levels)):
        free = np.flatnonzero(leave & (row_level == i))
        if len(free) == 0:
            continue
        pool = rows[row_level == i]  # the drawn steps' rows of the level: all, up to 0.5M rows
        cdf = np.cumsum(excess[pool])
        if cdf[-1] <= 0:  # a level has rows leaving only with some excess
            continue
        pick = np.searchsorted(cdf, rng.random(len(free)) * cdf[-1], side="right")
        rows[free] = pool[np.minimum(pick, len(pool) - 1)]
    windows = policy_windows(
        policy,
        window=inp.window[rows],
        gamma=frame.gamma,
        survival=None if frame.survival is None else frame.survival[rows],
        logits=None if frame.logits is None else frame.logits[rows],
        step_start=np.concatenate(([0], np.cumsum(bs)[:-1])),
        step_bs=bs,
        table=frame.table,
        relayed=relayed(frame, rows),
        last_step=relayed(frame, rows, last_step=True),
    )
    drawn = accepted_under(inp, exact, shapes, windows, rows)
    cell, n = c.cell[rows], len(c.levels) * len(c.workloads)

    def factor(new: np.ndarray, old: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.bincount(cell, new, minlength=n) / np.bincount(cell, old[rows], minlength=n)
        return np.where(np.isfinite(f), f, 1.0)[c.cell]

    old_windows, old_accepted = same
    pairs = dict(enumerate(zip(drawn, old_accepted, strict=True)))
    scaled = _per_array(lambda da: da[1] * factor(*da), pairs)
    return old_windows * factor(windows, old_windows), tuple(scaled.values())


def _per_array(fn, values: dict) -> dict:
    """`fn` of each value, once for values that are the same objects (`accepted_under`'s
    point and bounds, one array where every ceiling is known)."""
    done: dict = {}
    out = {}
    for key, v in values.items():
        ids = tuple(map(id, v)) if isinstance(v, tuple) else id(v)
        if ids not in done:
            done[ids] = fn(v)
        out[key] = done[ids]
    return out


def _rate_interval(
    sums: dict, pair_scope: np.ndarray, pair_sums: dict, parts: dict, den: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`com/den` per cell with its interval: the bracket of the unknown ceilings, widened by
    the spread between two runs of one policy on the same traffic (the prediction's and a
    real run's sampling errors: `sqrt(2)` standard errors of the ratio, each the larger of
    the cluster-robust one by request and the one treating request-steps as independent,
    so that a cell of one request still has a spread).

    The request-steps' squared residuals `(com - rate * den)^2` are summed by part (`parts`,
    `_spread_parts`): a part's rows share `den`, so theirs are the squares about the part's
    mean plus its rows times `(mean - rate * den)^2`."""
    n = len(sums["count"])
    total = sums[den]
    scope = parts["scope"]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (sums["acc"] + sums["count"]) / total
        resid = pair_sums["com"] - rate[pair_scope] * pair_sums[den]
        clusters = np.bincount(pair_scope, resid**2, minlength=n)
        gap = parts["mean"] - rate[scope] * parts[den]
        squares = parts["weight2"] * (parts["within"] + parts["rows"] * gap**2)
        spread = np.bincount(scope, squares, minlength=n)
        half = Z95 * np.sqrt(2.0) * np.sqrt(np.maximum(clusters, spread)) / total
        lo = (sums["lo"] + sums["count"]) / total - half
        hi = (sums["hi"] + sums["count"]) / total + half
    return rate, lo, hi


def _figures(sums: dict, pair_scope, pair_sums: dict | None, parts: dict | None) -> dict:
    """A scope's cell figures from its sums (`pair_scope`: the (level, request) pairs'
    cells; `parts`: what the row-level spread reads, `_spread_parts`); the rates' points
    alone, without their intervals, where `parts` is None."""
    count = sums["count"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {
            "request_steps": count,
            "mean_window": sums["window"] / count,
            "mean_accepted": sums["acc"] / count,
            "mean_accepted_lo": sums["lo"] / count,
            "mean_accepted_hi": sums["hi"] / count,
            "mean_committed": (sums["acc"] + count) / count,
            "tokens": sums["window"] + count,
            "step_ms": sums["t"] / count * 1e3,
        }
    for key, den in (("tokens_per_s", "share"), ("per_request_tokens_per_s", "t")):
        if parts is None:
            with np.errstate(divide="ignore", invalid="ignore"):
                out[key] = (sums["acc"] + count) / sums[den]
            continue
        rate, lo, hi = _rate_interval(sums, pair_scope, pair_sums, parts, den)
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = rate, lo, hi
    return out


def _part_seconds(frame: RunFrame, seconds: np.ndarray) -> dict:
    """Each part's step time (`t`) and its request-steps' share of it (`share`)."""
    c = frame.cells
    t = seconds[c.part_step]
    return {"t": t, "share": t / frame.step_bs[c.part_step]}


def _row_seconds(frame: RunFrame, seconds: np.ndarray) -> dict:
    """Each request-step's step time (`t`) and its share of it (`share`); a cell's sums of
    them are taken over its rows, in row order, not as its parts' times their rows, which
    would round differently. A step's rows are contiguous: a repeat, not a gather."""
    bs = frame.step_bs
    return {"t": np.repeat(seconds, bs), "share": np.repeat(seconds / bs, bs)}


def _spread_parts(frame: RunFrame, com: np.ndarray, part_den: dict) -> dict:
    """Per part, what the spread of a cell's request-steps reads: its rows, the mean of
    their committed tokens and the sum of their squares about it, and the part's `t` and
    `share` (`_part_seconds`)."""
    c = frame.cells
    n_parts = len(c.part_cell)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.bincount(c.part, com, minlength=n_parts) / c.part_rows
    dev = mean[c.part]
    np.subtract(com, dev, out=dev)
    within = np.bincount(c.part, np.square(dev, out=dev), minlength=n_parts)
    return {"rows": c.part_rows, "mean": mean, "within": within, **part_den}


def _cell_figures(frame: RunFrame, windows, accepted, seconds, weight=None) -> tuple[dict, dict]:
    """Every (level, workload) cell's figures and every level's (`all`): one `np.bincount`
    per sum over the rows (over the parts for the spread's squares), the levels' sums those of
    their workloads; each request-step weighted by its (level, request) pair's `weight`
    where given (`closed_loop_weights`), the cell's request-steps still the recorded ones.
    The rates' points alone where the frame holds no clusters (`load_run_frame`)."""
    point, lo, hi = accepted
    c = frame.cells
    com = point + 1.0
    n_levels, n_wl = len(c.levels), len(c.workloads)
    n = n_levels * n_wl
    row_weight = None if weight is None else weight[c.pair]

    def cell_sum(v: np.ndarray) -> np.ndarray:
        return np.bincount(c.cell, v if row_weight is None else v * row_weight, minlength=n)

    per_wl = _per_array(cell_sum, {"window": windows, "acc": point, "lo": lo, "hi": hi})
    row_seconds = _row_seconds(frame, seconds)
    if c.pair is None:
        per_wl.update({k: cell_sum(v) for k, v in row_seconds.items()}, count=c.cell_rows)
        whole = {k: v.reshape(n_levels, n_wl).sum(axis=1) for k, v in per_wl.items()}
        return _figures(per_wl, None, None, None), _figures(whole, None, None, None)
    n_pairs = len(c.pair_cell)
    pair_weight = 1.0 if weight is None else weight
    pair_sums = {"com": np.bincount(c.pair, com, minlength=n_pairs) * pair_weight}
    for k, v in row_seconds.items():
        per_wl[k] = cell_sum(v)
        pair_sums[k] = np.bincount(c.pair, v, minlength=n_pairs) * pair_weight
    per_wl["count"] = c.cell_rows if row_weight is None else cell_sum(np.ones(len(c.cell)))
    parts = _spread_parts(frame, com, _part_seconds(frame, seconds))
    # a part's rows share a step and a workload, not a request: their mean weight stands
    # for each (the spread is an estimate of the sampling error, not a figure)
    part_weight = 1.0
    if row_weight is not None:
        part_weight = np.bincount(c.part, row_weight, minlength=len(c.part_rows))
        part_weight = (part_weight / c.part_rows) ** 2
    cell_parts = {**parts, "scope": c.part_cell, "weight2": part_weight}
    figures = _figures(per_wl, c.pair_cell, pair_sums, cell_parts)
    figures["request_steps"] = c.cell_rows
    whole = {k: v.reshape(n_levels, n_wl).sum(axis=1) for k, v in per_wl.items()}
    level_parts = {**parts, "scope": c.part_cell // n_wl, "weight2": part_weight}
    out = _figures(whole, c.pair_level, pair_sums, level_parts)
    out["request_steps"] = c.cell_rows.reshape(n_levels, n_wl).sum(axis=1)
    return figures, out


def _rates(frame: RunFrame, com: np.ndarray, seconds: np.ndarray) -> tuple[dict, dict]:
    """The tokens/s and per-request tokens/s points alone, of each cell and each level, on
    the request-steps as recorded (`com`: each cell's committed tokens): what the
    closed-loop correction is measured against."""
    c = frame.cells
    n_levels, n_wl = len(c.levels), len(c.workloads)
    sums = {"com": com}
    for k, v in _row_seconds(frame, seconds).items():
        sums[k] = np.bincount(c.cell, v, minlength=n_levels * n_wl)
    whole = {k: v.reshape(n_levels, n_wl).sum(axis=1) for k, v in sums.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        return tuple(
            {"tokens_per_s": x["com"] / x["share"], "per_request_tokens_per_s": x["com"] / x["t"]}
            for x in (sums, whole)
        )


def _windows(frame: RunFrame, policies: list[Policy]) -> list[np.ndarray]:
    """`policies_windows` on the run's request-steps."""
    return policies_windows(
        policies,
        window=frame.inputs.window,
        gamma=frame.gamma,
        survival=frame.survival,
        logits=frame.logits,
        step_start=frame.step_start,
        step_bs=frame.step_bs,
        table=frame.table,
        relayed=relayed(frame),
        last_step=relayed(frame, last_step=True),
    )


def _planned_together(frame: RunFrame, policies: list[Policy]) -> dict:
    """The windows of the SPS policies, by spec, scheduled together (one sort of each
    step's survivals for all of them); empty where one of them cannot be scheduled, so
    that each policy says why on its own."""
    sps = [p for p in policies if p.kind == "sps"]
    if len(sps) < 2:
        return {}
    try:
        return {p.spec: w for p, w in zip(sps, _windows(frame, sps), strict=True)}
    except ValueError:
        return {}


def predict_policy(
    frame: RunFrame,
    policy: Policy,
    shapes,
    exact,
    *,
    closed_loop: bool = True,
    windows: np.ndarray | None = None,
) -> list[dict]:
    """The cells of one policy, sorted by level then workload (`all` first).

    `closed_loop` (any policy but `own`) moves each level's mix of workloads to the one the
    policy's speeds give (`closed_loop_weights`); without it the cells are on the
    request-steps as recorded, the cost of trimming's definition. `windows`: the policy's
    on the run's request-steps where already scheduled (`_planned_together`)."""
    inp = frame.inputs
    if windows is None:
        windows = _windows(frame, [policy])[0]
    accepted = accepted_under(inp, exact, shapes, windows)
    c = frame.cells
    weight = row_weight = None
    same = (windows, accepted)
    if closed_loop and policy.kind != "own":
        committed = np.bincount(c.pair, accepted[0] + 1.0, minlength=len(c.pair_rows))
        weight = closed_loop_weights(frame, committed)
        row_weight = weight[c.pair]
        if policy.kind in ("sps", "topk"):
            windows, accepted = _recomposed(frame, policy, shapes, exact, row_weight, same)
            # the mix and the budget split over it move together: the mix again from what
            # the recomposed batches commit, and the batches again over that mix
            committed = np.bincount(c.pair, accepted[0] + 1.0, minlength=len(c.pair_rows))
            weight = closed_loop_weights(frame, committed)
            row_weight = weight[c.pair]
            windows, accepted = _recomposed(frame, policy, shapes, exact, row_weight, same)
    tokens = step_tokens(frame, windows, row_weight)
    seconds = step_seconds(frame, tokens)
    n_levels, n_wl = len(c.levels), len(c.workloads)
    per_wl, whole = _cell_figures(frame, windows, accepted, seconds, weight)
    if weight is not None:
        # the correction rests on the steady state of a level that its first requests (the
        # previous level's) have left, and on batches drawn at random: half its size is
        # taken as its uncertainty, on both sides
        cell_committed = np.bincount(c.cell, same[1][0] + 1.0, minlength=len(c.cell_rows))
        recorded_seconds = step_seconds(frame, step_tokens(frame, same[0]))
        recorded = _rates(frame, cell_committed, recorded_seconds)
        for fig, same in zip((per_wl, whole), recorded, strict=True):
            for key, value in same.items():
                half = 0.5 * np.abs(fig[key] - value)
                fig[f"{key}_lo"] = fig[f"{key}_lo"] - half
                fig[f"{key}_hi"] = fig[f"{key}_hi"] + half
    # whole batches: per level, the mean step time and packed verify tokens per step
    level_sum = lambda v: np.bincount(c.step_level, v, minlength=n_levels)  # noqa: E731
    whole["step_ms"] = level_sum(seconds) / c.level_steps * 1e3
    whole["verify_tokens_per_step"] = level_sum(tokens) / c.level_steps
    with np.errstate(divide="ignore", invalid="ignore"):
        per_wl["verify_tokens_per_step"] = per_wl["tokens"] / c.cell_steps
    out = []
    for i, level in enumerate(c.levels.tolist()):
        ids = [(whole, i, "all", c.level_steps[i])]
        named = sorted((w, k) for k, w in enumerate(c.workloads) if w is not None)
        unnamed = [(None, k) for k, w in enumerate(c.workloads) if w is None]
        for w, k in named + unnamed:
            ids.append((per_wl, i * n_wl + k, w, c.cell_steps[i * n_wl + k]))
        for fig, j, workload, steps in ids:
            if fig["request_steps"][j] == 0:
                continue
            cell = {"policy": policy.spec, "level": level, "workload": workload,
                    "steps": int(steps), "request_steps": int(fig["request_steps"][j])}  # fmt: skip
            for key in CELL_KEYS[5:]:
                if key in fig:  # a rate's interval only where the frame has clusters
                    cell[key] = float(fig[key][j])
            out.append(cell)
    return out


def whatif(
    run: Run,
    policies: list[str] | None = None,
    *,
    use_shadow: bool = True,
    skip_unavailable: bool = False,
    closed_loop: bool = True,
    same_steps: tuple[str, ...] = (),
    intervals: bool = True,
) -> dict:
    """The `dspark-obs whatif --json` object: every policy's cells on the run's traffic.

    `skip_unavailable` leaves out a policy the run cannot support (an SPS policy without
    survivals or logits) and names it with the reason under `unavailable`, so that the
    report draws what it can; without it such a policy is refused. `closed_loop=False`
    predicts on the request-steps as recorded (`predict_policy`); `same_steps` names
    policies (of `policies`) predicted that way too, under `same_steps_cells`.
    `intervals=False` (with `closed_loop=False` only) leaves the rates' intervals out of
    the cells (their `_lo` and `_hi` keys) and loads the run without what only they
    read (`load_run_frame`'s `clusters`): the cost of trimming reads the points and the
    accepted drafts' bracket alone.
    """
    if not intervals and closed_loop:
        raise ValueError("the closed loop moves requests: it needs the run's intervals' clusters")
    gamma = run.gamma
    defaults = [p for p in DEFAULT_POLICIES if not p.startswith("window=") or int(p[7:]) < gamma]
    parsed = [parse_policy(p, gamma) for p in (policies or defaults)]
    frame = load_run_frame(run, use_shadow=use_shadow, policies=parsed, clusters=intervals)
    inp = frame.inputs
    exact = exact_ceiling(inp)
    shapes = tail_shapes(inp, exact, int(inp.group.max()) + 1)
    # the predictions read the ceilings from `exact` and `shapes` alone: the columns they
    # came from go (330 MB on 10M request-steps, 890 MB with the confidences)
    dropped = ("ceiling", "confidence", "walk_exact", "walk_lo", "walk_point", "walk_hi")
    frame.inputs = inp = dataclasses.replace(inp, **dict.fromkeys(dropped))
    cells, unavailable, same = [], {}, []
    planned = None  # at the first SPS policy, so that the others run without its windows
    for policy in parsed:
        if planned is None and policy.kind == "sps":
            planned = _planned_together(frame, parsed)
        windows = (planned or {}).pop(policy.spec, None)
        try:
            cells += predict_policy(
                frame, policy, shapes, exact, closed_loop=closed_loop, windows=windows
            )
            if closed_loop and policy.spec in same_steps:
                same += predict_policy(
                    frame, policy, shapes, exact, closed_loop=False, windows=windows
                )
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
    if same_steps:
        out["same_steps_cells"] = same
    return out

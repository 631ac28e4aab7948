"""How well the ceiling estimators did on a stored run, against the shadow twin's truth.

The in-band walks left one row per trimmed block in the `ceilings` table; where
a run has none (an older run, a run ingested from SGLang) the stored steps are
replayed through the walks here, without gathered log-probabilities, so sampled
intervals are wider. The cap-accept shadow twin's `shadow_ceiling` of the same
request-step is the truth; the population model is fitted on the run's
(window, accepted, confidence) rows and compared with the truth's survival.

Per method the aggregate interval is the one for a realised mean: the mean of
`lo` and `hi` widened by the realised ceilings' spread around their expectations
(`interval.aggregate_interval`: Bennett's bound, which holds for few blocks as for
many); the truth mean should fall inside it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from dspark_obs.domain.workload_codes import workload_code
from dspark_obs.store import Run

from .ceiling_estimator import POPULATION_BATCH_STEPS, CeilingEstimator
from .extrapolation_check import ExtrapolationCheck
from .interval import aggregate_interval
from .population import HazardModel

Z95 = 1.959963984540054


def walked_blocks(run: Run) -> pl.LazyFrame:
    """The `ceilings` rows of a run, computing them by replay where the run has none."""
    if "ceilings" in run.tables():
        return run.scan("ceilings")
    gamma = run.gamma
    estimator = CeilingEstimator(gamma)
    frames = []
    for batch in run.batches():
        estimator.update(batch)
        rows = estimator.take_rows()
        if rows is not None:
            frames.append(rows)
    estimator.close()
    rows = estimator.take_rows()
    if rows is not None:
        frames.append(rows)
    if not frames:
        return pl.LazyFrame()
    return pl.concat(frames).lazy()


#: `method_aggs`' columns that runs merge by their largest value (the rest add up).
MAX_AGGS = ("bound_lo", "bound_hi")


def bound_aggs(var_hi: str, gamma: int) -> list[pl.Expr]:
    """`MAX_AGGS` over blocks with a `window`, `lo`, `hi`, `var` and `var_hi`: the most one
    block's lower outcome falls short of its mean (`lo - window`) and its upper one exceeds
    it (`gamma - hi`), over blocks whose end is uncertain (`interval.aggregate_interval`)."""
    return [
        pl.when(pl.col("var") > 0)
        .then(pl.col("lo") - pl.col("window"))
        .max()
        .fill_null(0.0)
        .alias("bound_lo"),
        pl.when(pl.col(var_hi) > 0)
        .then(gamma - pl.col("hi"))
        .max()
        .fill_null(0.0)
        .alias("bound_hi"),
    ]


def method_aggs(columns: list[str], gamma: int) -> list[pl.Expr]:
    """Sums over walked blocks (with a `truth` column, null where unknown) that every
    figure of a method's entry is a ratio of, and the ranges its interval needs (the most
    one block's outcome falls short of, or exceeds, its mean: `MAX_AGGS`): mergeable
    across runs."""
    truth, lo, hi = pl.col("truth"), pl.col("lo"), pl.col("hi")
    exact, censored = pl.col("status") == "exact", pl.col("status") == "censored"
    var_hi = "var_hi" if "var_hi" in columns else "var"  # runs recorded before it: var
    ranged = [c for c in ("unidentified", "point_lo", "point_hi") if c in columns]
    return [
        pl.len().alias("blocks"),
        *(pl.col(c).sum().alias(c) for c in ("lo", "point", "hi", "var", "window", *ranged)),
        pl.col(var_hi).sum().alias("var_hi"),
        *bound_aggs(var_hi, gamma),
        censored.sum().alias("censored"),
        exact.sum().alias("exact"),
        truth.sum().alias("truth_sum"),
        truth.count().alias("truth_n"),
        ((lo <= truth) & (truth <= hi)).sum().alias("covering"),
        (exact & truth.is_not_null()).sum().alias("exact_known"),
        (exact & (pl.col("point") == truth)).sum().alias("exact_agree"),
        (censored & (lo > truth)).sum().alias("censored_above"),
    ]


def method_entry_from_sums(s: dict, method: str, gamma: int) -> dict:
    """A method's entry (`estimate --json`'s `greedy` or `sampled`) from `method_aggs`' sums."""
    n = s["blocks"]
    if not n:
        return {"blocks": 0}
    entry = {
        "blocks": n,
        "lo": s["lo"] / n,
        "point": s["point"] / n,
        "hi": s["hi"] / n,
        "censored_rate": s["censored"] / n,
    }
    parts = {
        "observed": s["window"] / n,
        "walked": (s["lo"] - s["window"]) / n,
        "extrapolated": (s["point"] - s["lo"]) / n,
    }
    entry["parts"] = parts
    entry["shares"] = {k: v / entry["point"] if entry["point"] else None for k, v in parts.items()}
    if "unidentified" in s:  # runs recorded before the point range have none
        entry["unidentified"] = s["unidentified"] / n
        entry["point_range"] = [s["point_lo"] / n, s["point_hi"] / n]
    entry["interval"] = list(
        aggregate_interval(
            n,
            **{k: s[k] for k in ("lo", "hi", "var", "var_hi", "bound_lo", "bound_hi")},
            least=s["window"],
            most=gamma * n,
        )
    )
    if method == "greedy":
        entry["mean"] = entry["point"]
        entry["exact_rate"] = s["exact"] / n
    if s["truth_n"] == n:
        t = s["truth_sum"] / n
        entry["truth"] = t
        entry["error"] = entry["point"] / t - 1.0 if t else None
        entry["covered"] = bool(entry["interval"][0] <= t <= entry["interval"][1])
        entry["block_coverage"] = s["covering"] / n
        if method == "greedy":
            known = s["exact_known"]
            entry["exact_agreement"] = s["exact_agree"] / known if known else None
            entry["censored_never_above_truth"] = s["censored_above"] == 0
    return entry


def _method_entry(df: pl.DataFrame, method: str, gamma: int) -> dict:
    part = df.filter(pl.col("method") == method)
    sums = part.select(method_aggs(part.columns, gamma)).row(0, named=True)
    return method_entry_from_sums(sums, method, gamma)


def _trimmed(gamma: int) -> pl.Expr:
    return (pl.col("correct_drafts") == pl.col("window")) & (pl.col("window") < gamma)


def all_steps(stats: dict, walked: dict, gamma: int) -> dict:
    """Mean ceiling over every request-step: exact where observed, walked or bracketed elsewhere.

    A request-step that was not trimmed has ceiling = accepted; a walked block
    contributes its lo/point/hi; a trimmed block no walk covered is only known
    to lie in [window, gamma], so it widens the bracket and leaves no point.
    `walked` holds the walked blocks' count (`blocks`) and their lo, point, hi and
    window sums; `stats` the request-steps' sums of `evaluate`.
    """
    n = stats["n"]
    exact = stats["untrimmed_accepted"]
    skipped = stats["trimmed"] - walked["blocks"]
    skipped_window = stats["trimmed_window"] - walked["window"]
    return {
        "lo": (exact + walked["lo"] + skipped_window) / n,
        "point": (exact + walked["point"]) / n if skipped == 0 else None,
        "hi": (exact + walked["hi"] + skipped * gamma) / n,
    }


#: The walked blocks' sums `all_steps` reads, besides their count.
_WALK_SUMS = ("lo", "point", "hi", "window")


def _workload_sums(blocks: pl.DataFrame, gamma: int) -> tuple[dict, dict]:
    """Per (workload, method) `method_aggs`' sums, and per workload the walked blocks'
    count, lo, point, hi and window sums and their censored and resolved counts: two
    group-bys over the joined blocks, where a copy of them per workload and a filter per
    method cost several times as much on a large run."""
    if not blocks.height:
        return {}, {}
    by_method = blocks.group_by("workload", "method").agg(method_aggs(blocks.columns, gamma))
    status = pl.col("status")
    per_workload = blocks.group_by("workload").agg(
        pl.len().alias("blocks"),
        *(pl.col(c).sum().cast(pl.Float64) for c in _WALK_SUMS),
        (status == "censored").sum().alias("censored"),
        (status != "censored").sum().alias("resolved"),
    )
    return (
        {(r["workload"], r["method"]): r for r in by_method.iter_rows(named=True)},
        {r["workload"]: r for r in per_workload.iter_rows(named=True)},
    )


#: The key of a request-step: a walked block's row is its request-step's.
STEP_ROW = ("rank", "forward_ct", "rid")


def with_truth(blocks: pl.DataFrame, truth: pl.DataFrame) -> pl.DataFrame:
    """`blocks` less their key (`STEP_ROW`) with the `truth` of `truth`'s row of the same
    key (null where none), in the blocks' order, so that sums over them, and the report,
    repeat bit for bit from run to run: `blocks.join(truth, on=STEP_ROW, how="left",
    maintain_order="left").drop(STEP_ROW)`, the frame and its order.

    Joined on one 64-bit hash of the key instead, and each block's row of `truth` found
    that way held to the block's key: on 5M blocks 1.6 s of CPU against 2.8 s for that join
    on three columns (a string among them) gathering every column of the blocks through it.
    Where a hash finds two rows, or a row whose key differs (two keys of one hash, a key
    twice among the truth's rows, a null in a key), or the keys' types differ, the join on
    the keys themselves gives the frame.
    """
    keys = list(STEP_ROW)
    if all(blocks.schema[k] == truth.schema[k] for k in keys):
        # each column's own hash (a struct of the key's columns is a copy of them first)
        key = pl.reduce(lambda a, b: a ^ b, [pl.col(k).hash(i) for i, k in enumerate(keys)])
        key = key.alias("key")
        rows = truth.select(key, pl.int_range(pl.len()).alias("row"))
        row = blocks.select(key).join(rows, on="key", how="left", maintain_order="left")["row"]
        del rows
        unmatched = row.is_null()
        if len(row) == blocks.height and all(
            (blocks[k].eq(truth[k].gather(row)).fill_null(False) | unmatched).all() for k in keys
        ):
            return blocks.drop(keys).with_columns(truth["truth"].gather(row))
    return blocks.join(truth, on=keys, how="left", maintain_order="left").drop(keys)


def _contiguous(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` (emptied) with each column in one piece, copied a column at a time. The
    walked blocks come a piece a part; grouped as read, the sums per workload took 1.7 s
    on 5M blocks against 1.0 s once contiguous, and a peak higher by the pieces' copies.
    Done once the truth is joined, so that the key's columns (a string among them), which
    the join only hashes and compares, are never copied."""
    return pl.DataFrame([frame.drop_in_place(name).rechunk() for name in frame.columns])


#: Request-steps `population_replay` reads at a time (see there). Two chunks are held
#: at once (one read ahead); on 10M request-steps 500k rows kept the replay's peak at
#: 0.6 GB against 1.0 GB at 1M, in the same time (250k: a quarter slower).
REPLAY_CHUNK_ROWS = 500_000
#: Batches of steps, and request-steps, `population_replay` replays in one call at most.
REPLAY_BATCHES = 256
REPLAY_ROWS = 1 << 17


def _step_chunks(parts: list[pl.LazyFrame]) -> tuple[int, list[int], np.ndarray]:
    """The run's first step; the first step of each chunk of the run (ranges of steps, each
    whole batches of `POPULATION_BATCH_STEPS` steps from the first and about
    `REPLAY_CHUNK_ROWS` request-steps, the last one open); and each part's first and last
    step (`[parts, 2]`, -1 where it holds no rows), in one read of the step column."""
    fct = pl.col("forward_ct")
    steps = pl.concat(
        [part.select(fct, pl.lit(i, pl.Int64).alias("part")) for i, part in enumerate(parts)]
    )
    per_step = steps.group_by("part", "forward_ct").agg(pl.len().alias("n")).collect()
    bounds = np.full((len(parts), 2), -1, dtype=np.int64)
    if per_step.height == 0:
        return 0, [], bounds
    step = per_step["forward_ct"].to_numpy()
    first = int(step.min())
    batch, at = np.unique((step - first) // POPULATION_BATCH_STEPS, return_inverse=True)
    n = np.bincount(at, weights=per_step["n"].to_numpy()).astype(np.int64)
    chunk = np.cumsum(n) // REPLAY_CHUNK_ROWS
    starts = first + batch[np.r_[0, np.flatnonzero(np.diff(chunk)) + 1]] * POPULATION_BATCH_STEPS
    held = per_step.group_by("part").agg(fct.min().alias("lo"), fct.max().alias("hi"))
    bounds[held["part"].to_numpy()] = held.select("lo", "hi").to_numpy()
    return first, starts.tolist(), bounds


def population_replay(
    parts: list[pl.LazyFrame], names: list, gamma: int, reservoir: int
) -> tuple[list[dict], list[dict]]:
    """Per workload: the population model's estimates over every block
    (`HazardModel.estimates`, `reservoir` at least the largest workload's request-steps),
    and the in-band extrapolation's held-out check replayed over the run: every
    `POPULATION_BATCH_STEPS` steps' known positions against the population model learnt
    from the steps before them, as the estimator checked it in band. One pass serves both:
    the model the check replays is, once it has learnt the last batch, the one fitted on
    every block.

    The request-steps (`parts`: the `requests` table a part a frame, `Run.scan_parts`)
    are read in chunks of whole batches of steps, about `REPLAY_CHUNK_ROWS` rows each, in
    step order: the check needs three gamma-wide float columns of every row, which for a
    10M request-step run held at once (and sorted) were 3.4 GB of a `report`'s peak. Each
    part is read once, whole, when the first chunk that needs it comes (its steps are
    known from one read of the step column, `_step_chunks`); its rows past that chunk wait
    for the next. A filter per chunk over every part instead had polars look through all
    the parts' footers each time, and decode twice the parts a chunk's end cuts.
    """
    model = HazardModel(gamma, reservoir=max(1, reservoir))
    check = ExtrapolationCheck(gamma)
    model.ensure_groups(len(names))
    first, starts, bounds = _step_chunks(parts)
    chunks = _PartChunks(parts, names, bounds)
    with ThreadPoolExecutor(1, thread_name_prefix="replay-read") as reader:

        def read(k: int):
            return reader.submit(chunks.rows, [*starts, None][k + 1], gamma, first)

        # the next chunk is read (polars, the GIL released) while this one is replayed
        pending = read(0) if starts else None
        for k in range(len(starts)):
            rows = pending.result()
            pending = read(k + 1) if k + 1 < len(starts) else None
            batch = rows.pop("batch")
            for lo, hi in _replay_calls(batch):
                part = {k: None if v is None else v[lo:hi] for k, v in rows.items()}
                check.observe_in_batches(model, batch[lo:hi] - batch[lo], **part)
    return model.estimates(), [check.calibration(g) for g in range(len(names))]


def _replay_calls(batch: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of whole batches (`batch` per row, never decreasing), each at most
    `REPLAY_BATCHES` batches and `REPLAY_ROWS` rows, or one batch: the models' tables
    before each batch of a call are held at once, and so are the call's `[rows, gamma]`
    temporaries."""
    if len(batch) == 0:
        return []
    starts = np.flatnonzero(np.diff(batch, prepend=batch[0] - 1)).tolist()
    calls, lo = [], 0
    for start, end in zip(starts, [*starts[1:], len(batch)], strict=True):
        too_many = end - lo > REPLAY_ROWS or batch[start] - batch[lo] >= REPLAY_BATCHES
        if too_many and start > lo:
            calls.append((lo, start))
            lo = start
    return [*calls, (lo, len(batch))]


#: The gamma-wide columns the replay reads.
_MATRICES = ("confidence", "target_logprobs", "draft_logprobs")


class _PartChunks:
    """The run's request-steps a chunk of steps at a time, each part read once: the rows
    of the parts read so far that are not yet handed out wait, by part, for their chunk."""

    def __init__(self, parts: list[pl.LazyFrame], names: list, bounds: np.ndarray) -> None:
        known = [n for n in names if n is not None]
        columns = (
            "forward_ct",
            workload_code(known),
            "window",
            "correct_drafts",
            pl.col("greedy").cast(pl.Int8).fill_null(-1),
            *_MATRICES,
        )
        held = np.flatnonzero(bounds[:, 0] >= 0)  # parts with no rows are never read
        self._unread = [(int(bounds[i, 0]), int(i), parts[i].select(columns)) for i in held]
        self._unread.sort(key=lambda u: u[:2], reverse=True)  # the next to read is last
        self._waiting: dict[int, pl.DataFrame] = {}

    def rows(self, end: int | None, gamma: int, first: int) -> dict:
        """The rows before step `end` (all of them when None) not handed out yet, in part
        order and then in step order, as `observe_in_batches`' arguments (the gamma-wide
        columns None where all NaN), and each row's `batch` of steps from `first`."""
        due = []
        while self._unread and (end is None or self._unread[-1][0] < end):
            due.append(self._unread.pop())
        for (_, i, _), df in zip(due, pl.collect_all([u[2] for u in due]), strict=True):
            self._waiting[i] = df
        pieces = []
        for i in sorted(self._waiting):
            df = self._waiting.pop(i)
            if end is not None:
                later = df["forward_ct"] >= end
                if later.any():
                    self._waiting[i] = df.filter(later)
                    df = df.filter(~later)
            pieces.append(df)
        rows = pl.concat(pieces)
        if not rows["forward_ct"].is_sorted():  # parts of several ranks interleave
            rows = rows.sort("forward_ct", maintain_order=True)
        fct = rows["forward_ct"].to_numpy()
        mats = [rows[c].to_numpy().reshape(-1, gamma) for c in _MATRICES]
        conf, target, draft = (None if np.isnan(m).all() else m for m in mats)
        return {
            "batch": (fct - first) // POPULATION_BATCH_STEPS,
            "group": rows["group"].to_numpy(),
            "window": rows["window"].to_numpy(),
            "accepted": rows["correct_drafts"].to_numpy(),
            "greedy": rows["greedy"].to_numpy(),
            "confidence": conf,
            "target_logprobs": target,
            "draft_logprobs": draft,
            "forward_ct": fct,
        }


def evaluate(run: Run) -> dict:
    """The `dspark-obs estimate --json` object.

    Lazy where it can be: the truth joins only trimmed request-steps, and the
    population model and the held-out check's replay read the run once, in chunks,
    in a worker thread while that join runs (`population_replay`).
    """
    gamma = run.gamma
    if "requests" not in run.tables():  # walks only (an ingested block-accept JSONL)
        blocks = walked_blocks(run).collect().with_columns(pl.lit(None, pl.Float64).alias("truth"))
        return {
            "run": str(run.path),
            "gamma": gamma,
            "workloads": {
                name: {
                    "truth": None,
                    "greedy": _method_entry(part, "greedy", gamma),
                    "sampled": _method_entry(part, "sampled", gamma),
                    "counts": {
                        "walked": part.height,
                        "censored": int((part["status"] == "censored").sum()),
                    },
                }
                for (name,), part in blocks.sort("workload").group_by(
                    "workload", maintain_order=True
                )
            },
        }
    truth_col = pl.coalesce("ceiling", "shadow_ceiling").alias("truth")
    req = run.requests().with_columns(truth_col)
    trimmed = _trimmed(gamma)
    stats = {
        row["workload"]: row
        for row in req.group_by("workload")
        .agg(
            pl.len().alias("n"),
            pl.col("truth").mean().alias("truth_mean"),
            pl.col("truth").null_count().alias("truth_nulls"),
            trimmed.sum().alias("trimmed"),
            pl.col("window").filter(trimmed).sum().alias("trimmed_window"),
            pl.col("correct_drafts").filter(~trimmed).sum().alias("untrimmed_accepted"),
            *((pl.col("truth") > j).mean().alias(f"s{j}") for j in range(gamma)),
        )
        .collect()
        .iter_rows(named=True)
    }
    names = sorted(stats, key=lambda w: (w is None, w))
    with ThreadPoolExecutor(1, thread_name_prefix="population") as pool:
        # the model is numpy on one core: it fits while polars joins the walks with
        # their truth, instead of leaving the other core idle
        largest = max(st["n"] for st in stats.values())
        fit = pool.submit(population_replay, run.scan_parts("requests"), names, gamma, largest)
        blocks = walked_blocks(run)
        if blocks.collect_schema().names():
            used = ("workload", "method", "status", "window", "lo", "point", "hi", "var")
            ranged = ("var_hi", "point_lo", "point_hi", "unidentified")
            have = set(blocks.collect_schema().names())
            used += tuple(c for c in ranged if c in have)
            blocks = _contiguous(
                with_truth(
                    blocks.select(*STEP_ROW, *used).collect(),
                    req.filter(trimmed).select(*STEP_ROW, "truth").collect(),
                )
            )
        else:
            blocks = pl.DataFrame()
        by_method, by_workload = _workload_sums(blocks, gamma)
    pops, checks = fit.result()
    out = {"run": str(run.path), "gamma": gamma, "workloads": {}}
    none = {"blocks": 0, "censored": 0, "resolved": 0, **dict.fromkeys(_WALK_SUMS, 0.0)}
    for name, pop, check in zip(names, pops, checks, strict=True):
        st = stats[name]
        walked = by_workload.get(name, none)
        has_truth = st["truth_nulls"] == 0
        methods = {
            m: method_entry_from_sums(by_method[name, m], m, gamma)
            if (name, m) in by_method
            else {"blocks": 0}
            for m in ("greedy", "sampled")
        }
        entry = {
            "truth": st["truth_mean"] if has_truth else None,
            **methods,
            "population": {k: pop[k] for k in ("mean", "survival", "identifiable", "naive_km")},
            "all_steps": all_steps(st, walked, gamma),
            "extrapolation_check": check,
            "counts": {
                "blocks": st["n"],
                "trimmed": st["trimmed"],
                "walked": walked["blocks"],
                "resolved": walked["resolved"],
                "censored": walked["censored"],
                "skipped": st["trimmed"] - walked["blocks"],
            },
        }
        if has_truth:
            entry["population"]["truth_survival"] = [st[f"s{j}"] for j in range(gamma)]
        out["workloads"][name] = entry
    return out

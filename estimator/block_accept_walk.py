"""The sampled-walk ceiling estimate over SGLang's block-accept JSONL (read by
`telemetry.block_accept_log`): per block, the tail acceptance along what later rows walked.

Units: everything here is in ACCEPTED DRAFTS, the quantity cap-accept mode
reports as `correct_drafts + cap_trim`: lo = w + sum_m P_m. SGLang's own online
aggregate (`_OnlineCeiling`, logged as "uncapped-acc-len") reports accept
LENGTH, which counts the bonus token: SGLang's lo/hi = ours + 1, per block and
for every mean.

Bounds per block follow SGLang's `_finalize_walk_online`,
`_finalize_at_end_online` and `_finalize_eos_online`, with `prod` the running
product after the last walked entry and `unreached = gamma - w - walked`:

- `resolved`: the walk diverged (realized != token; SGLang still counts that
  entry's a before stopping, since the token could have been accepted even
  though the target sampled something else) or reached offset gamma.
  hi = lo + prod * (gamma - last walked offset), which is 0 when exhausted.
- `eos`: the request stopped naturally with the block pending. Nothing beyond
  the stop was ever going to be committed, so SGLang takes lo for both bounds.
- `open`: the file ended (or SGLang dropped the block on a sequence-length
  discontinuity, which the file cannot tell apart) first: censored, hi =
  lo + prod * (gamma - next_offset + 1), as SGLang drains pending blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark_obs.telemetry.block_accept_log import BlockAcceptLog, default_workload_of

from .interval import (
    Extrapolate,
    acceptance_log_ratio,
    aggregate_interval,
    block_interval,
    extrapolated_parts,
    point_range,
    rate_extrapolation,
    reach_all_variance,
    running_sums,
)
from .tail_model import TailModel, features, fit_tail_model

__all__ = [
    "Extrapolate",
    "summarize_by_workload",
    "tail_acceptance_rates",
    "tail_model",
    "walk_blocks",
]

RESOLVED, EOS, OPEN = "resolved", "eos", "open"


def _gamma_of(log: BlockAcceptLog, gamma: int | None) -> int | None:
    """The file has no gamma field; every tail spans w+1..gamma, so it is implied."""
    implied = np.unique(log.block_window + np.diff(log.tail_indptr))
    if gamma is None:
        if len(implied) > 1:
            raise ValueError(f"blocks imply different gammas {implied.tolist()}; pass gamma")
        return int(implied[0]) if len(implied) else None
    if len(implied) and (len(implied) > 1 or implied[0] != gamma):
        raise ValueError(f"gamma={gamma} but the blocks' w + len(tail) are {implied.tolist()}")
    return gamma


@dataclass(frozen=True)
class _Walk:
    """Per-block walk over an (n_blocks, gamma) grid; column c is offset c + 1."""

    log_ratio: np.ndarray
    walked: np.ndarray
    diverged: np.ndarray
    log_q: np.ndarray  # the tail's draft log-probabilities, NaN before the window's end

    @property
    def a(self) -> np.ndarray:
        """The acceptance ratio at each walked entry (1 elsewhere)."""
        return np.exp(self.log_ratio)


def _walk(log: BlockAcceptLog, gamma: int) -> _Walk:
    n = log.n_blocks
    w = log.block_window
    cols = np.arange(gamma)
    in_tail = cols[None, :] >= w[:, None]

    q = np.full((n, gamma), np.nan)
    tail_len = np.diff(log.tail_indptr)
    tail_row = np.repeat(np.arange(n), tail_len)
    within = np.arange(len(log.tail_q_lp)) - np.repeat(log.tail_indptr[:-1], tail_len)
    q[tail_row, w[tail_row] + within] = log.tail_q_lp

    b, c = log.entry_block, log.entry_offset - 1
    have = np.zeros((n, gamma), dtype=bool)
    have[b, c] = True
    match = np.ones((n, gamma), dtype=bool)
    match[b, c] = log.entry_token == log.entry_realized
    log_ratio = np.zeros((n, gamma))
    with np.errstate(invalid="ignore", over="ignore"):
        entry = acceptance_log_ratio(log.entry_p_lp, q[b, c])
    # SGLang computes min(1.0, exp(x)) in Python, which yields 1.0 for x = NaN.
    log_ratio[b, c] = np.where(np.isnan(entry), 0.0, entry)

    # The walk is the contiguous run of entries from offset w+1 that stops right
    # after the first divergence; anything past a gap or a divergence is unusable.
    contiguous = np.logical_and.accumulate(have | ~in_tail, axis=1) & in_tail
    diverging = have & ~match & in_tail
    diverged_before = np.zeros_like(diverging)
    diverged_before[:, 1:] = np.logical_or.accumulate(diverging, axis=1)[:, :-1]
    walked = contiguous & ~diverged_before
    return _Walk(
        log_ratio=log_ratio,
        walked=walked,
        diverged=(walked & diverging).any(axis=1),
        log_q=q,
    )


def tail_acceptance_rates(
    log: BlockAcceptLog, gamma: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The file's own per-position conditional acceptance rate, `rates[offset - 1]`.

    The default extrapolation for positions a walk never reached. It is the mean
    a over every walked entry at that offset, i.e. conditional on the walk having
    got there; entries are weighted equally, not by their block's survival, and
    walks that reach deep offsets are those whose committed tokens kept matching,
    which favours confident contexts, so deep rates lean optimistic. Offsets with
    no walked entry fall back to the pooled mean over all entries (0 if none).
    Returns (rates, entries per offset).
    """
    gamma = _gamma_of(log, gamma)
    if gamma is None:
        raise ValueError("no blocks in the log; pass gamma")
    walk = _walk(log, gamma)
    counts = walk.walked.sum(axis=0)
    sums = np.where(walk.walked, walk.a, 0.0).sum(axis=0)
    pooled = sums.sum() / counts.sum() if counts.sum() else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(counts > 0, sums / counts, pooled)
    return rates, counts


def _first(walk: _Walk) -> np.ndarray:
    """`[n, gamma]` whether no walked entry of the block comes before each position."""
    before = np.zeros_like(walk.walked)
    before[:, 1:] = np.logical_or.accumulate(walk.walked, axis=1)[:, :-1]
    return ~before


def _request_ease(log: BlockAcceptLog, walk: _Walk) -> np.ndarray:
    """`[n]` the mean acceptance ratio at the first tail position over the blocks of each
    block's request: walked in every block whatever followed, so free of the selection
    that makes the walks' continuation positions easy (`tail_model`). A request none of
    whose first positions was walked takes the file's mean."""
    n, gamma = walk.walked.shape
    rows = np.arange(n)
    col = np.minimum(log.block_window, gamma - 1)
    seen = walk.walked[rows, col] & (log.block_window < gamma)
    a = np.where(seen, walk.a[rows, col], 0.0)
    _, request = np.unique(log.block_rid.astype(str), return_inverse=True)
    request = request.reshape(-1)
    total, count = np.bincount(request, a), np.bincount(request, seen)
    fallback = a.sum() / seen.sum() if seen.any() else 0.0
    return np.where(count[request] > 0, total[request] / np.maximum(count[request], 1), fallback)


def _features_at(walk: _Walk, first: np.ndarray, ease: np.ndarray, rows: np.ndarray, cols):
    return features(walk.log_q[rows, cols], cols + 1, first[rows, cols], ease[rows])


def _fit_model(
    log: BlockAcceptLog, walk: _Walk, gamma: int, groups: np.ndarray, names: tuple[str, ...]
) -> TailModel:
    """The tail model fitted on every walked entry (a known acceptance ratio)."""
    rows, cols = np.nonzero(walk.walked)
    x = _features_at(walk, _first(walk), _request_ease(log, walk), rows, cols)
    continuation = cols > log.block_window[rows]
    return fit_tail_model(
        x, walk.a[rows, cols], groups[rows], rows, cols + 1, continuation, names, gamma
    )


def tail_model(
    log: BlockAcceptLog,
    gamma: int | None = None,
    *,
    workload_of: Callable[[str], str] | None = None,
) -> TailModel:
    """The file's tail model, per workload (`tail_model.py`); `walk_blocks` takes it."""
    gamma = _gamma_of(log, gamma)
    if gamma is None:
        raise ValueError("no blocks in the log; pass gamma")
    wl_of = workload_of or default_workload_of
    workload = np.asarray([wl_of(str(r)) for r in log.block_rid], dtype=np.str_)
    names, groups = np.unique(workload, return_inverse=True)
    return _fit_model(log, _walk(log, gamma), gamma, groups.reshape(-1), tuple(names.tolist()))


def _modelled_extra(
    model: TailModel, log: BlockAcceptLog, walk: _Walk, groups: np.ndarray, start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per block: the model's expected further accepted drafts from `start` on, the same
    with every rate at the low and at the high end of its range, and the part of the
    first that rests on unidentified cells. Only blocks with something left are computed."""
    n, gamma = walk.walked.shape
    out = np.zeros((4, n))
    need = np.flatnonzero(start < gamma)
    if len(need):
        cols = np.arange(gamma)[None, :]
        rows = np.broadcast_to(need[:, None], (len(need), gamma))
        cols = np.broadcast_to(cols, rows.shape)
        x = _features_at(walk, _first(walk), _request_ease(log, walk), rows, cols)
        continuation = cols > log.block_window[need][:, None]
        out[:, need] = model.parts(x, groups[need], start[need], continuation)
    return out[0], out[1], out[2], out[3]


def walk_blocks(
    log: BlockAcceptLog,
    gamma: int | None = None,
    extrapolate: Extrapolate | np.ndarray | None = None,
    *,
    workload_of: Callable[[str], str] | None = None,
) -> dict[str, np.ndarray]:
    """Bounds, point estimate and walk variance per block, in accepted drafts.

    `gamma` may be omitted when the blocks agree on it; a value they contradict
    raises, because every bound would silently be wrong. `extrapolate` fills the
    positions the walk never reached in the point estimate: either an
    `interval.Extrapolate` (the tail walk's signature; the groups it gets are the
    blocks' workloads numbered in sorted order, the confidence None, as the file has
    none), or per-offset conditional rates `rates[offset - 1]` (length gamma).
    Default: `tail_acceptance_rates` of this file. Whatever it returns is clipped to
    [0, unreached] so lo <= point <= hi holds by construction; eos blocks have
    nothing unreached, and only blocks with something unreached are asked.

    `var` is the variance of the accepted tail drafts over the walked positions
    only; the unreached positions are covered by the lo/hi bracket instead, and
    `var_hi` is the variance were they all accepted (`interval.reach_all_variance`),
    the spread of what the bracket's upper end stands for.
    """
    gamma = _gamma_of(log, gamma)
    wl_of = workload_of or default_workload_of
    rid = log.block_rid
    workload = np.asarray([wl_of(str(r)) for r in rid], dtype=np.str_)
    n = log.n_blocks
    w = log.block_window.astype(np.float64)
    if gamma is None:  # no blocks at all
        empty = np.zeros(0)
        return {
            "rid": rid,
            "block_fct": log.block_fct,
            "workload": workload,
            "window": log.block_window,
            "lo": empty,
            "point": empty,
            "hi": empty,
            "var": empty,
            "var_hi": empty,
            "point_lo": empty,
            "point_hi": empty,
            "unidentified": empty,
            "status": np.zeros(0, dtype=np.str_),
            "walked": np.zeros(0, dtype=np.int64),
            "prod": empty,
            "unreached": np.zeros(0, dtype=np.int64),
        }

    walk = _walk(log, gamma)
    walked_n = walk.walked.sum(axis=1)
    # the walked entries run on from offset w + 1, so the product after them is `prod`
    prod, lo_extra, var_terms = running_sums(
        walk.log_ratio, walk.walked, log.block_window, np.ones(n)
    )

    resolved = walk.diverged | (log.block_window + walked_n == gamma)
    status = np.where(resolved, RESOLVED, np.where(log.block_eos, EOS, OPEN))
    unreached = np.where(status == EOS, 0, gamma - log.block_window - walked_n)
    start = log.block_window + walked_n  # the first position (0-based) the walk did not reach

    names, groups = np.unique(workload, return_inverse=True)
    groups = groups.reshape(-1)
    if extrapolate is None or isinstance(extrapolate, TailModel):
        model = extrapolate or _fit_model(log, walk, gamma, groups, tuple(names.tolist()))
        if model.names != tuple(names.tolist()):
            raise ValueError(f"the tail model is of workloads {model.names}, the blocks of {names}")
        extra, extra_lo, extra_hi, unidentified = _modelled_extra(
            model, log, walk, groups, np.where(unreached > 0, start, gamma)
        )
    else:
        if not callable(extrapolate):
            rates = np.asarray(extrapolate, dtype=np.float64)
            if rates.shape != (gamma,):
                raise ValueError(f"rates must have shape ({gamma},), got {rates.shape}")
            extrapolate = rate_extrapolation(rates)
        extra, extra_lo, extra_hi, unidentified = extrapolated_parts(
            extrapolate, groups, start, None, unreached
        )
    interval = block_interval(w, lo_extra, var_terms, prod, unreached, extra)
    interval["var_hi"] = reach_all_variance(interval["var"], lo_extra, prod, walked_n, unreached)
    interval.update(point_range(interval["lo"], prod, unreached, extra_lo, extra_hi, unidentified))
    return {
        "rid": rid,
        "block_fct": log.block_fct,
        "workload": workload,
        "window": log.block_window,
        **interval,
        "status": status,
        "walked": walked_n,
        "prod": prod,
        "unreached": unreached,
    }


def _interval(cols: dict[str, np.ndarray], level: float) -> dict[str, Any]:
    """Means of a set of steps' `lo`, `point`, `hi` (and the interval), and what the point
    is made of: `observed` (verified windows and exact ceilings), `walked` (exact products
    along the walks), `extrapolated` (modelled), which sum to `mean_point`.

    Each end of the interval has its own spread: the lower end that of the walked
    positions' outcome (`se`), which the realised ceiling never falls short of, the upper
    end that of the outcome with every unreached position accepted (`se_hi`), which it
    never exceeds (`interval.reach_all_variance`); each is widened by Bennett's bound on
    that outcome (`interval.aggregate_interval`), which holds for few blocks as for many."""
    lo, point, hi = cols["lo"], cols["point"], cols["hi"]
    n = len(lo)
    se = math.sqrt(float(cols["var"].sum())) / n
    se_hi = math.sqrt(float(cols["var_hi"].sum())) / n
    mean_lo, mean_hi, mean_point = float(lo.mean()), float(hi.mean()), float(point.mean())
    walked, reach_all = cols["var"] > 0, cols["var_hi"] > 0
    ci_lo, ci_hi = aggregate_interval(
        n,
        **{k: float(cols[k].sum()) for k in ("lo", "hi", "var", "var_hi")},
        bound_lo=float(np.max(lo[walked] - cols["observed"][walked], initial=0.0)),
        bound_hi=float(np.max(cols["most"][reach_all] - hi[reach_all], initial=0.0)),
        least=float(cols["observed"].sum()),
        most=float(cols["most"].sum()),
        level=level,
    )
    parts = {
        "observed": float(cols["observed"].mean()),
        "walked": float((lo - cols["observed"]).mean()),
        "extrapolated": float((point - lo).mean()),
    }
    return {
        "mean_lo": mean_lo,
        "mean_point": mean_point,
        "mean_hi": mean_hi,
        "se": se,
        "se_hi": se_hi,
        "ci_lo": ci_lo,
        "ci_hi": ci_hi,
        "parts": parts,
        "shares": {k: v / mean_point if mean_point else None for k, v in parts.items()},
        "unidentified": float(cols["unidentified"].mean()),
        "mean_point_lo": float(cols["point_lo"].mean()),
        "mean_point_hi": float(cols["point_hi"].mean()),
    }


_SUMMED = ("lo", "point", "hi", "var", "var_hi", "point_lo", "point_hi", "unidentified")


def _block_cols(blocks: dict[str, np.ndarray], sel: np.ndarray) -> dict[str, np.ndarray]:
    cols = {k: blocks[k][sel] for k in _SUMMED}
    cols["observed"] = blocks["window"][sel].astype(np.float64)
    # the largest ceiling a block could have: its window, walked and unreached positions
    reach = blocks["window"][sel] + blocks["walked"][sel] + blocks["unreached"][sel]
    cols["most"] = reach.astype(np.float64)
    return cols


def model_report(model: TailModel) -> dict[str, dict[str, Any]]:
    """Per workload, what the tail model rests on: known positions per offset, the
    continuation positions among them (what unreached positions are predicted from),
    which offsets those identify, the held-out calibration check, and the spread its
    continuation positions gave the continuation rates (`tail_model.continuation_spread`)."""
    return {
        name: {
            "known_positions": model.known[g].tolist(),
            "continuation_positions": model.continuation[g].tolist(),
            "identified": model.identified[g].tolist(),
            "calibration": model.calibration[g],
            "continuation_spread": float(model.spread[g]),
        }
        for g, name in enumerate(model.names)
    }


def summarize_by_workload(
    blocks: dict[str, np.ndarray],
    workload_of: Callable[[str], str] | None = None,
    *,
    log: BlockAcceptLog | None = None,
    level: float = 0.95,
) -> dict[str, dict[str, Any]]:
    """Per-workload means with an interval meant to cover the realized mean ceiling.

    The interval [`ci_lo`, `ci_hi`] widens the lo/hi bracket (what the unreached positions
    could add) by the sampling noise of the realised outcome at either end (spread `se`
    and `se_hi` per step; Bennett's bound at `level`, `interval.aggregate_interval`,
    which holds for a few blocks as for many), so it covers
    the mean of cap-accept's `correct_drafts + cap_trim` over the same censored steps
    whatever the unreached positions' acceptance. With `log`, an
    `all_steps` entry adds the rows that opened no block, whose ceiling is exact
    (cl + ct): that mean is the one comparable to a cap-accept run's overall
    mean, and (+1) to SGLang's cumulative online estimate. Without
    `workload_of`, the walk's `workload` column is used.

    Each mean also says what its point is made of (`parts`, in accepted drafts, and
    `shares` of the point): what was observed, what the walks measured, what was
    extrapolated; `unidentified` is the part of the extrapolation that no known position
    backs, and [`mean_point_lo`, `mean_point_hi`] the point's range (`walk_blocks`).
    """
    if workload_of is None:
        workload = blocks["workload"]
    else:
        workload = np.asarray([workload_of(str(r)) for r in blocks["rid"]], dtype=np.str_)
    status = blocks["status"]
    out: dict[str, dict[str, Any]] = {}
    for wl in sorted(set(workload.tolist())):
        sel = workload == wl
        stats: dict[str, Any] = {
            "blocks": int(sel.sum()),
            "resolved": int((status[sel] == RESOLVED).sum()),
            "eos": int((status[sel] == EOS).sum()),
            "open": int((status[sel] == OPEN).sum()),
            "mean_window": float(blocks["window"][sel].mean()),
        }
        stats.update(_interval(_block_cols(blocks, sel), level))
        out[wl] = stats
    if log is None:
        return out

    known = dict(zip(blocks["rid"].tolist(), workload.tolist(), strict=True))
    wl_of = workload_of or default_workload_of
    exact = ~log.row_opens
    row_wl = np.asarray([known.get(r) or wl_of(r) for r in log.row_rid.tolist()], dtype=np.str_)
    exact_ceiling = (log.row_cl + log.row_ct).astype(np.float64)
    for wl in sorted(set(row_wl[exact].tolist()) | set(out)):
        sel_b = workload == wl
        sel_r = exact & (row_wl == wl)
        ceil = exact_ceiling[sel_r]
        exact_cols = {
            k: ceil for k in ("lo", "point", "hi", "point_lo", "point_hi", "observed", "most")
        }
        zeros = np.zeros(len(ceil))
        exact_cols.update(var=zeros, var_hi=zeros, unidentified=zeros)
        cols = _block_cols(blocks, sel_b)
        steps = _interval({k: np.concatenate([v, exact_cols[k]]) for k, v in cols.items()}, level)
        steps = {"steps": int(sel_b.sum() + sel_r.sum()), "exact_steps": int(sel_r.sum()), **steps}
        out.setdefault(wl, {"blocks": 0, "resolved": 0, "eos": 0, "open": 0})["all_steps"] = steps
    return out

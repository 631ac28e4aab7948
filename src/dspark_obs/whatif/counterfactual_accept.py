"""What a request-step would have accepted under another window, from what the run knows.

Acceptance is a chain over the block: the drafts accepted under window w' are
`min(C, w')`, C the ceiling (what full verification accepts). Where C is known the
answer is exact: the step was not trimmed (accepted < window, or window = gamma), the
run observed it (static, cap-accept) or a cap-accept shadow twin reported it, or a
greedy walk resolved it. Below the recorded window nothing is needed either: a trimmed
step accepted its whole window, so `min(C, w') = w'` for every `w' <= w`.

What remains is a trimmed step under a longer window. Its expectation is
`w + sum_{m=w}^{w'-1} P(C > m)`: the ceiling estimator's walk gives the whole tail's
expectation (`point - w`, exact where the walk saw the positions, the population model
beyond), and the population model's per-cell rates (`HazardModel.rates`, the block's
own confidence bins) give its shape over positions, which the walk does not keep. So
the model's tail terms are scaled to the walk's point: a window of gamma reproduces
the estimator's point exactly, a shorter one takes the model's share of it. The bounds
are the walk's `lo` and `hi` cut at w' (`w` and `gamma` where no walk covered the step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..estimator.population import HazardModel, tail_terms


@dataclass
class AcceptInputs:
    """Per request-step of a run, what the counterfactual reads (numpy, one row each).
    `whatif` sets the ceilings' columns to None once it has `exact_ceiling` and
    `tail_shapes` from them."""

    gamma: int
    recorded_window: np.ndarray  # drafts the run verified (its scheduled window)
    accepted: np.ndarray  # correct_drafts
    known_ceiling: np.ndarray | None  # float, NaN where the run (or its shadow) has none
    group: np.ndarray  # workload code
    confidence: np.ndarray | None  # [rows, gamma] calibrated, or None
    walk_exact: np.ndarray | None  # bool: a greedy walk resolved the ceiling exactly
    walk_lo: np.ndarray | None  # float, NaN where no walk covered the step
    walk_point: np.ndarray | None
    walk_hi: np.ndarray | None


@dataclass
class TailShapes:
    """The unknown-ceiling rows and, for each, the model's tail terms P(C > m | C >= w)."""

    rows: np.ndarray  # indices of the rows whose ceiling is unknown
    terms: np.ndarray  # [len(rows), gamma]: 1 below w, the model's products from w on
    scale: np.ndarray  # the walk's tail expectation over the model's (1 without a walk)
    lo: np.ndarray
    hi: np.ndarray


def exact_ceiling(inp: AcceptInputs) -> np.ndarray:
    """`[rows]` the ceiling where it is known exactly, NaN elsewhere."""
    untrimmed = (inp.accepted < inp.recorded_window) | (inp.recorded_window >= inp.gamma)
    c = np.where(np.isnan(inp.known_ceiling), np.nan, inp.known_ceiling)
    c = np.where(untrimmed & np.isnan(c), inp.accepted, c)
    return np.where(np.isnan(c) & inp.walk_exact, inp.walk_point, c)


def tail_shapes(inp: AcceptInputs, exact: np.ndarray, groups: int) -> TailShapes:
    """The population model fitted on every row of the run, evaluated on the unknown rows."""
    rows = np.flatnonzero(np.isnan(exact))
    g = inp.gamma
    if len(rows) == 0:
        empty = np.zeros(0)
        return TailShapes(rows, np.zeros((0, g)), empty, empty, empty)
    model = HazardModel(g, reservoir=1)
    model.ensure_groups(groups)
    model.update(inp.group, inp.recorded_window, inp.accepted, inp.confidence)
    conf = None if inp.confidence is None else inp.confidence[rows]
    rates = model.acceptance(inp.group[rows], conf)[0]
    w = inp.recorded_window[rows]
    terms, model_tail = tail_terms(rates, w)
    point = inp.walk_point[rows]
    walked = ~np.isnan(point)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(walked & (model_tail > 0), (point - w) / model_tail, 1.0)
    lo = np.where(walked, inp.walk_lo[rows], w)
    hi = np.where(walked, inp.walk_hi[rows], g)
    return TailShapes(rows, terms, scale, lo, hi)


def accepted_under(
    inp: AcceptInputs,
    exact: np.ndarray,
    shapes: TailShapes,
    windows: np.ndarray,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(point, lo, hi)` accepted drafts per request-step under a policy's `windows`; with `rows`
    (indices into the run's rows, repeats allowed), of those rows, `windows` one each.
    Where every ceiling is known the three are one array (the callers only read them)."""
    if rows is None:
        e, recorded, r, k = exact, inp.recorded_window, shapes.rows, slice(None)
    elif len(shapes.rows) == 0:
        e, recorded, r = exact[rows], inp.recorded_window[rows], shapes.rows
    else:
        e, recorded = exact[rows], inp.recorded_window[rows]
        where = np.full(len(exact), -1, np.int64)
        where[shapes.rows] = np.arange(len(shapes.rows))
        k = where[rows]
        r = np.flatnonzero(k >= 0)
        k = k[r]
    point = np.minimum(e, windows)
    if len(r) == 0:
        return point, point, point
    lo, hi = point.copy(), point.copy()
    w, wn = recorded[r], windows[r]
    g = inp.gamma
    pos = np.arange(g)[None, :]
    inside = (pos >= w[:, None]) & (pos < wn[:, None])
    extra = shapes.scale[k] * np.where(inside, shapes.terms[k], 0.0).sum(axis=1)
    longer = wn > w
    p = np.where(longer, np.minimum(w + extra, wn), wn)
    lo_r = np.where(longer, np.minimum(shapes.lo[k], wn), wn)
    hi_r = np.where(longer, np.minimum(shapes.hi[k], wn), wn)
    point[r] = np.clip(p, lo_r, hi_r)
    lo[r], hi[r] = lo_r, hi_r
    return point, lo, hi


def per_array(fn, values: dict) -> dict:
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

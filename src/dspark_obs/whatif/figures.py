"""A policy's figures per cell: sums over its request-steps, one `np.bincount` each.

tokens/s is a cell's committed tokens over its request-steps' share of step time
(`T / bs` each; for `all` exactly the level's throughput), per-request tokens/s committed
tokens over the step time its requests sat through.
"""

from __future__ import annotations

import numpy as np

from .counterfactual_accept import per_array
from .frame import RunFrame
from .intervals import part_seconds, rate_interval, spread_parts


def _figures(sums: dict, pair_scope, pair_sums: dict | None, parts: dict | None) -> dict:
    """A scope's cell figures from its sums (`pair_scope`: the (level, request) pairs'
    cells; `parts`: what the row-level spread reads, `spread_parts`); the rates' points
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
        rate, lo, hi = rate_interval(sums, pair_scope, pair_sums, parts, den)
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = rate, lo, hi
    return out


def _row_seconds(frame: RunFrame, seconds: np.ndarray) -> dict:
    """Each request-step's step time (`t`) and its share of it (`share`); a cell's sums of
    them are taken over its rows, in row order, not as its parts' times their rows, which
    would round differently. A step's rows are contiguous: a repeat, not a gather."""
    bs = frame.step_bs
    return {"t": np.repeat(seconds, bs), "share": np.repeat(seconds / bs, bs)}


def cell_figures(
    frame: RunFrame, windows, accepted, seconds, pair_weight=None
) -> tuple[dict, dict]:
    """Every (level, workload) cell's figures and every level's (`all`): one `np.bincount`
    per sum over the rows (over the parts for the spread's squares), the levels' sums those of
    their workloads; each request-step weighted by its (level, request) pair's `pair_weight`
    where given (`closed_loop_weights`), the cell's request-steps still the recorded ones.
    The rates' points alone where the frame holds no clusters (`load_run_frame`)."""
    point, lo, hi = accepted
    c = frame.cells
    com = point + 1.0
    n_levels, n_wl = len(c.levels), len(c.workloads)
    n = n_levels * n_wl
    row_weight = None if pair_weight is None else pair_weight[c.pair]

    def cell_sum(v: np.ndarray) -> np.ndarray:
        return np.bincount(c.cell, v if row_weight is None else v * row_weight, minlength=n)

    per_wl = per_array(cell_sum, {"window": windows, "acc": point, "lo": lo, "hi": hi})
    row_seconds = _row_seconds(frame, seconds)
    if c.pair is None:
        per_wl.update({k: cell_sum(v) for k, v in row_seconds.items()}, count=c.cell_rows)
        whole = {k: v.reshape(n_levels, n_wl).sum(axis=1) for k, v in per_wl.items()}
        return _figures(per_wl, None, None, None), _figures(whole, None, None, None)
    n_pairs = len(c.pair_cell)
    pair_scale = 1.0 if pair_weight is None else pair_weight
    pair_sums = {"com": np.bincount(c.pair, com, minlength=n_pairs) * pair_scale}
    for k, v in row_seconds.items():
        per_wl[k] = cell_sum(v)
        pair_sums[k] = np.bincount(c.pair, v, minlength=n_pairs) * pair_scale
    per_wl["count"] = c.cell_rows if row_weight is None else cell_sum(np.ones(len(c.cell)))
    parts = spread_parts(frame, com, part_seconds(frame, seconds))
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


def recorded_rates(frame: RunFrame, com: np.ndarray, seconds: np.ndarray) -> tuple[dict, dict]:
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

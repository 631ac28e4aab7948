"""A trimmed block's ceiling as an interval, in accepted drafts: the one definition.

Both walks use it: the tail walk over in-band steps (`tails.py`, whose per-step pass
`_tailwalk.c` repeats `running_sums`' arithmetic position by position and is held to it
by tests/test_tails_compiled.py) and the walk over SGLang's block-accept JSONL
(`block_accept_walk.py`).

A block verified its window of w drafts and accepted all of them; tail draft m
(1-based, at block position j = w + m - 1) would have been accepted by full
verification with probability a_m = min(1, p_m / q_m). Along the positions a walk
evaluates, P_m = a_1 ... a_m is the probability that the first m tail drafts would all
have been accepted, so the accepted tail drafts N have mean sum_m P_m and variance
sum_m (2m - 1) P_m - (sum_m P_m)^2 (N = sum_m 1[N >= m]; the product of two of
those indicators is the one with the larger m). Greedy walks are the case a_m = 1
along the matched run.

The interval (`block_interval`): lo counts the evaluated positions only (the rest
rejected), hi takes every unreached position as accepted, each weighted by the
probability of reaching it (the last running product), and the point estimate fills
the unreached positions with an extrapolation, clipped to [0, unreached] so that
lo <= point <= hi holds by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import numpy as np

#: `extrapolate(groups, start, confidence) -> extra`, per block (`[k]` each):
#: the expected number of further accepted drafts from block position `start` (0-based:
#: the first position the walk did not reach) to the end of the block, given that every
#: draft before `start` was accepted. `groups` are the blocks' group ids (the estimator's
#: aggregate groups; the block-accept walk's workloads, numbered in sorted order);
#: `confidence` is `[k, gamma]` (NaN where unknown) or None where the source has none.
#: Only blocks with something unreached are asked (`extrapolated_extra`), and what
#: comes back is clipped to [0, unreached] (`block_interval`). The population model's
#: `HazardModel.expected_extra` is one; `rate_extrapolation` makes one from
#: per-position rates. Both walks take any of them.
Extrapolate = Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]

#: The floor of a log acceptance ratio: a zero probability (-inf) becomes a finite log
#: that exp takes to 0, so that in a sum of logs it cannot meet a 0 and poison the rest.
LOG_RATIO_FLOOR = -1e300


def acceptance_log_ratio(log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """log a = log min(1, p / q) from the target's and the draft's log-probabilities.

    Floored at `LOG_RATIO_FLOOR` (a ratio of 0); NaN (unknown) stays NaN.
    """
    return np.clip(np.subtract(log_p, log_q), LOG_RATIO_FLOOR, 0.0)


@cache
def _upper(n: int) -> np.ndarray:
    """`x @ _upper(n)`: running sums along each row of an `[k, n]` matrix."""
    upper = np.triu(np.ones((n, n)))
    upper.setflags(write=False)
    return upper


@cache
def window_rows(gamma: int) -> np.ndarray:
    """`[gamma + 1, gamma]`: row w marks the positions inside a window of w drafts. Blocks'
    masks are `window_rows(gamma).take(window, axis=0)`, where comparing `[k, 1]` with
    `[1, gamma]` costs numpy a loop per row."""
    rows = np.arange(gamma)[None, :] < np.arange(gamma + 1)[:, None]
    rows.setflags(write=False)
    return rows


@cache
def _ones(n: int) -> np.ndarray:
    ones = np.ones(n)
    ones.setflags(write=False)
    return ones


def running_sums(
    log_ratio: np.ndarray, counted: np.ndarray, window: np.ndarray, cum: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running products of a walk's acceptance ratios, and the sums the interval needs.

    `log_ratio` and `counted` are `[k, n]` over block positions 0..n-1: the log ratio
    at each position (`acceptance_log_ratio`) and whether the walk evaluated it; a
    position not counted neither changes the product nor adds to the sums. `window`
    `[k]` places tail draft m at position window + m - 1; `cum` `[k]` is the running
    product before position 0 (1 for a block not walked before).

    Returns, per block: the running product after the last position (the probability of
    reaching the next one), the sum of the counted running products (the expected
    accepted tail drafts among them), and the sum of (2m - 1) times each (the variance's
    first term). A NaN ratio makes every product from its position on NaN.

    `_tailwalk.c`'s `evaluate` does the same per position, multiplying ratios in turn
    where this sums their logs, so the two may differ in the last bits.
    """
    n = log_ratio.shape[1]
    log_ratio = np.where(counted, log_ratio, 0.0)
    if np.isnan(log_ratio).any():  # a NaN must poison only what follows it
        running = np.cumprod(np.exp(log_ratio), axis=1)
    else:
        running = np.exp(log_ratio @ _upper(n))
    products = np.asarray(cum, dtype=np.float64)[:, None] * running
    kept = np.where(counted, products, 0.0)
    weight = 2 * (np.arange(n) - np.asarray(window)[:, None]) + 1
    ones = _ones(n)
    return products[:, -1], kept @ ones, (kept * weight) @ ones


def block_interval(
    window: np.ndarray,
    lo_extra: np.ndarray,
    var_terms: np.ndarray,
    reach_prob: np.ndarray,
    unreached: np.ndarray,
    extra: np.ndarray,
) -> dict[str, np.ndarray]:
    """`lo`, `point`, `hi` and `var` of each block's ceiling, in accepted drafts.

    `lo_extra` and `var_terms` are `running_sums`' two sums (a greedy walk's matched run
    of r drafts: r and r ** 2); `reach_prob` the running product after the walk's last
    position; `unreached` the positions the walk did not reach that could still count
    (0 for a block known to end where its walk did); `extra` the extrapolated further
    accepted drafts, clipped here to [0, unreached] (NaN counts as 0).
    """
    lo = window + lo_extra
    extra = np.clip(np.nan_to_num(extra, nan=0.0), 0.0, unreached)
    return {
        "lo": lo,
        "point": lo + reach_prob * extra,
        "hi": lo + reach_prob * unreached,
        "var": np.maximum(var_terms - lo_extra**2, 0.0),
    }


def reach_all_variance(
    var: np.ndarray,
    lo_extra: np.ndarray,
    reach_prob: np.ndarray,
    walked: np.ndarray,
    unreached: np.ndarray,
) -> np.ndarray:
    """`[k]` the variance of a block's accepted tail drafts were every unreached position
    accepted: the spread the upper end of an aggregate interval must allow for.

    Why: `var` is the spread of the accepted drafts among the walked positions only
    (N_w, mean `lo_extra`). The realised count is N <= N_w + U 1[N_w = K] =: N_hi, with K
    the walked positions and U the unreached ones, whatever their acceptance; N_hi's law
    is known from the walk alone (mean `hi`), so a mean of realised ceilings lies below
    mean hi + z sqrt(sum var(N_hi)) / n at the stated level, model-free. With P =
    `reach_prob` = P(N_w = K): var(N_hi) = var + U^2 P (1 - P) + 2 U P (K - lo_extra)
    (cov(N_w, 1[N_w = K]) = K P - lo_extra P). A block whose first unreached draft is
    unlikely to be reached (small P) but would then run to gamma has a realised ceiling
    far above its `hi`, which the walked spread alone does not cover.
    """
    u = np.asarray(unreached, dtype=np.float64)
    p = np.asarray(reach_prob, dtype=np.float64)
    extra = u * u * p * (1.0 - p) + 2.0 * u * p * (np.asarray(walked) - lo_extra)
    return np.maximum(var + extra, 0.0)


def extrapolated_extra(
    extrapolate: Extrapolate,
    groups: np.ndarray,
    start: np.ndarray,
    confidence: np.ndarray | None,
    unreached: np.ndarray,
) -> np.ndarray:
    """`[k]` what `extrapolate` expects past each block's walk; 0 where nothing is unreached.

    Only the blocks with unreached positions are asked, in one call.
    """
    extra = np.zeros(len(unreached))
    need = np.flatnonzero(unreached > 0)
    if len(need):
        conf = None if confidence is None else confidence[need]
        got = np.asarray(extrapolate(groups[need], start[need], conf), dtype=np.float64)
        if got.shape != (len(need),):
            raise ValueError(f"extrapolate must return shape ({len(need)},), got {got.shape}")
        extra[need] = got
    return extra


def extrapolated_parts(
    extrapolate: Extrapolate | None,
    groups: np.ndarray,
    start: np.ndarray,
    confidence: np.ndarray | None,
    unreached: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`[k]` each: the extrapolated further accepted drafts, the low and high ends of its
    range, and the part of it that no known position backs; 0 where nothing is unreached.

    An extrapolation with a `parts(groups, start, confidence)` method (`[4, k]`, in that
    order) says its own range; any other was checked by nothing, so its range is all of
    [0, unreached] and all of it counts as unidentified. Without one (None) the point
    takes the middle of what the unreached positions could add.
    """
    parts = getattr(extrapolate, "parts", None)
    if parts is None:
        if extrapolate is None:
            extra = 0.5 * unreached
        else:
            extra = extrapolated_extra(extrapolate, groups, start, confidence, unreached)
        unchecked = np.clip(np.nan_to_num(extra, nan=0.0), 0.0, unreached)
        return extra, np.zeros(len(unreached)), unreached.astype(np.float64), unchecked
    out = np.zeros((4, len(unreached)))
    need = np.flatnonzero(unreached > 0)
    if len(need):
        conf = None if confidence is None else confidence[need]
        got = np.asarray(parts(groups[need], start[need], conf), dtype=np.float64)
        if got.shape != (4, len(need)):
            raise ValueError(f"parts must return shape (4, {len(need)}), got {got.shape}")
        out[:, need] = got
    return out[0], out[1], out[2], out[3]


def point_range(
    lo: np.ndarray,
    reach_prob: np.ndarray,
    unreached: np.ndarray,
    extra_lo: np.ndarray,
    extra_hi: np.ndarray,
    unidentified: np.ndarray,
) -> dict[str, np.ndarray]:
    """`point_lo`, `point_hi` (the point with every extrapolated rate at the low, and at the
    high, end of its range) and `unidentified` (the part of the point that rests on
    positions nothing identifies), in accepted drafts, clipped as `block_interval` clips."""
    return {
        "point_lo": lo + reach_prob * np.clip(extra_lo, 0.0, unreached),
        "point_hi": lo + reach_prob * np.clip(extra_hi, 0.0, unreached),
        "unidentified": reach_prob * np.clip(unidentified, 0.0, unreached),
    }


def position_terms(rates: np.ndarray, start: np.ndarray) -> np.ndarray:
    """`[..., k, n]` each block's expected acceptance of each position from `start` on.

    `rates[..., b, j]` is the probability that block b's draft at position j is accepted
    given every earlier one was; the term at j >= start is the product of the rates from
    `start` to j (0 before `start`), so a row's sum is the expected further accepted
    drafts, and a subset of its columns says how much of that rests on those positions.
    Leading axes are sets of rates for the same blocks.
    """
    running = np.empty(np.moveaxis(rates, -1, 0).shape)
    np.clip(np.moveaxis(rates, -1, 0), 0.0, 1.0, out=running)
    return np.moveaxis(_running_terms(running, start), 0, -1)


def _running_terms(running: np.ndarray, start: np.ndarray) -> np.ndarray:
    """`position_terms` in place on position-major rates `[n, ..., k]`, already in [0, 1].

    One position at a time: n vector multiplies, where numpy's cumprod along so short an
    axis costs several times as much (the same products in the same order, so the same
    numbers); the masks are `[n, k]`, never `[k, 1]` against `[1, n]`, which numpy
    compares with a loop per row."""
    n = running.shape[0]
    before = np.arange(n)[:, None] < np.asarray(start)[None, :]
    before = before.reshape(n, *(1,) * (running.ndim - 2), -1)
    np.copyto(running, 1.0, where=before)
    for j in range(1, n):
        running[j] *= running[j - 1]
    np.copyto(running, 0.0, where=before)
    return running


def extra_parts(
    rates: np.ndarray, identified: np.ndarray, margin: np.ndarray, start: np.ndarray
) -> np.ndarray:
    """`[4, k]`: the expected further accepted drafts from `start` on (`position_terms`),
    the same with every rate at the low and at the high end of its range, and the part of
    the first that rests on unidentified positions.

    `rates` and `identified` are `[k, n]`, `margin` `[k]`: an identified rate's range is
    the rate +- its block's margin (the model's held-out miss), an unidentified one's all
    of [0, 1], so where nothing identifies a position the range runs to the lo/hi bracket.
    The three sets of rates run position-major in one buffer.
    """
    k, n = rates.shape
    rt, ident = rates.T, identified.T
    m = np.asarray(margin, dtype=np.float64)[None, :]
    terms = np.empty((n, 3, k))
    np.clip(rt, 0.0, 1.0, out=terms[:, 0])
    terms[:, 1] = np.where(ident, np.clip(rt - m, 0.0, 1.0), 0.0)
    terms[:, 2] = np.where(ident, np.clip(rt + m, 0.0, 1.0), 1.0)
    _running_terms(terms, start)
    out = np.empty((4, k))
    terms.sum(axis=0, out=out[:3])
    np.where(ident, 0.0, terms[:, 0]).sum(axis=0, out=out[3])
    return out


def rate_extrapolation(rates: np.ndarray) -> Extrapolate:
    """An `Extrapolate` from per-position conditional acceptance rates (`rates[j]`: the
    probability that the draft at position j is accepted given every earlier one was),
    the same for every group: the expected accepted drafts from `start` on are
    r_start (1 + r_start+1 (1 + ...)). Rates are clipped to [0, 1]."""
    rates = np.clip(np.asarray(rates, dtype=np.float64), 0.0, 1.0)
    gamma = len(rates)
    from_position = np.zeros(gamma + 1)  # [j]: expected accepted drafts from position j on
    for j in range(gamma - 1, -1, -1):
        from_position[j] = rates[j] * (1.0 + from_position[j + 1])

    def extrapolate(
        groups: np.ndarray, start: np.ndarray, confidence: np.ndarray | None
    ) -> np.ndarray:
        return from_position[np.clip(start, 0, gamma)]

    return extrapolate


def bennett_margin(var: float, bound: float, level: float = 0.95) -> float:
    """How far past its mean a sum of independent block outcomes goes with probability at
    most (1 - level) / 2, given their summed variance `var` and the most any one of them
    can exceed its own mean (`bound`): Bennett's inequality, P(S - E S >= t) <=
    exp(-(var / bound^2) h(bound t / var)), h(u) = (1 + u) log(1 + u) - u, solved for t.

    Why not 1.96 standard errors: the normal law is the limit of many blocks, and a
    workload with few uncertain blocks is far from it. Where each block's outcome is
    mostly its walked part but now and then (probability P, small) runs on through
    every unreached position, the sum is skewed to the right and its upper tail is
    heavier than the normal one (windows near gamma, a few dozen trimmed blocks: the
    normal upper end was exceeded in 6 of 90 runs). Bennett's bound holds whatever the
    number of blocks, from the variance and the range alone, and tends to
    sqrt(2 var log(2 / (1 - level))) (2.72 standard errors at 95 %) as blocks grow.
    """
    if var <= 0.0:
        return 0.0
    log_inv = math.log(2.0 / (1.0 - level))
    if bound <= 0.0:  # no block can exceed its mean by anything: the sub-Gaussian limit
        return math.sqrt(2.0 * var * log_inv)
    c = log_inv * bound * bound / var
    # h(u) >= u^2 / (2 (1 + u / 3)) (Bernstein), so this u is at or past the root, and
    # Newton's steps on the convex, increasing h come down to it without overshooting
    u = c / 3.0 + math.sqrt(c * c / 9.0 + 2.0 * c)
    for _ in range(100):
        step = ((1.0 + u) * math.log1p(u) - u - c) / math.log1p(u)
        u -= step
        if step <= 1e-14 * u:
            break
    return u * var / bound


def aggregate_interval(
    n: int,
    *,
    lo: float,
    hi: float,
    var: float,
    var_hi: float,
    bound_lo: float,
    bound_hi: float,
    least: float,
    most: float,
    level: float = 0.95,
) -> tuple[float, float]:
    """The interval for a realised mean ceiling over `n` steps, from sums over them: the
    lo/hi bracket widened at each end by `bennett_margin` of that end's outcome. The
    lower end's is the walked positions' outcome (never above the realised one; spread
    `var`, `bound_lo` the most one block's falls short of its mean: its `lo - window`),
    the upper end's the outcome with every unreached position accepted (never below it:
    `reach_all_variance`; `bound_hi` the most one block's exceeds its mean: its largest
    ceiling minus `hi`). Neither end passes what the steps' ceilings could be at all
    (`least`, `most`: sums of the windows, and of the largest ceilings), which the
    realised mean cannot pass either."""
    return (
        max((lo - bennett_margin(var, bound_lo, level)) / n, least / n),
        min((hi + bennett_margin(var_hi, bound_hi, level)) / n, most / n),
    )

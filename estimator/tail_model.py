"""The acceptance of a tail token no walk reached, modelled from the tokens walks did reach.

Why: in SGLang's block-accept JSONL a walk stops at the first position where the
committed stream left the tail, so on hard traffic (windows near one draft, early
divergence) most of every tail is never evaluated and the point estimate is mostly
extrapolation. The file still says something about every unreached token: its draft
log-probability `q_lp`, its offset, its block's window, and the acceptance ratios its
request's walks saw. Walked entries have a known outcome, the acceptance ratio
a = min(1, p/q), so they are the training set.

Two kinds of position. A block's first tail position (offset w + 1) is always walked:
the opening row commits its bonus token there. Every later one, a *continuation*
position, is walked only while the committed stream kept matching the tail, which
happens with the target's probability p of each earlier tail token: a few percent of
blocks on most traffic. Every position a walk leaves unreached is a continuation
position (the first one never is), so what the extrapolation rests on is the
continuation positions alone.

The model, per workload: a fractional logistic regression (the quasi-likelihood of a
in [0, 1], fitted by Newton steps) of a on log q, (log q)^2, whether the position is a
first position, the offset *apart for first and continuation positions*, and the
request's ease (the mean ratio at the first tail positions of the request's blocks).
Each workload's coefficients are pulled towards the pooled fit of the whole file by a
ridge penalty of `SHRINK` (standardised features), so a workload with few known
positions borrows the pooled shape instead of fitting noise. The fit is checked on
held-out known positions: blocks are split into `FOLDS` folds, each fold predicted by
a model fitted on the others, and the held-out predictions compared with the observed
ratios (`calibration`).

The spread at continuation positions. The coefficients are learnt mostly on first
positions (thousands of them against a few dozen continuation positions on hard
traffic), and there how acceptance moves with log q and with the request's ease is
steeper than along a tail: on held-out continuation positions a workload's predictions
can be too spread out (a logit slope of 0.57 on `poetry` in the runtime's
`adversarial-confidence` world, 0.23 on `noise` in `unstable-slots`, as the truth at
the unreached positions shows too). Too spread is not harmless: the point
sums running products of the rates, which is convex in them, so rates spread too far
lift the point even where their mean is right. So each workload's held-out logits at
its continuation positions are regressed on the observed ratios, slope pulled towards 1
by the ridge of `SHRINK` (a workload with few continuation positions keeps the model's
spread), and every continuation rate's logit is pulled towards the centre of those
held-out logits by that slope (`spread`). Only the slope is taken, not the level: walked
continuation positions are the easy ones (a walk goes on where the target agreed), and
the model's features, not their mean, carry that selection into the level.

Why the offset has two slopes: at first positions the offset is the window plus one,
so a slope learnt there is a slope across blocks of different windows, and where
windows are chosen on confidence, long windows belong to easy blocks: that slope is
the scheduler's selection, not how acceptance moves along one block's tail. Shared with
continuation positions it lent the ease of long-window blocks to the deep positions of
short-window ones. Apart, the depth trend of a tail is learnt from continuation
positions only (where the workload has few, pooled over the file's workloads: one
drafter's quality decays with depth alike). Why the request's ease: a walk goes on past
a position with the target's probability of its token, which is higher in requests the
drafter serves well, so continuation positions over-represent easy requests; every
block's first tail position is walked whatever happened after it, so the mean over a
request's blocks measures its ease without that selection. The block's own earlier
ratios are no regressor: they are the selection itself (a walk reached the position
because the earlier tokens matched), and their effect learnt on walked positions did
not hold for unreached ones (reached positions in the runtime's worlds showed a
positive effect; unreached ones none).

Assumption (what the estimate rests on): given those features, whether a position was
reached says nothing more about its acceptance ratio. A difficulty that varies inside a
request, which neither q_lp nor the request's other blocks reveal, still biases the deep
positions the model extrapolates to.

A (workload, offset) cell with fewer than `MIN_KNOWN` known positions of the kind a
prediction needs (continuation positions for unreached ones) identifies nothing: the
coefficients there extrapolate from other offsets, from first positions or from other
workloads. Such cells are flagged (`identified`), and the per-block model range
(`parts`, `interval.extra_parts`) lets their rates run over all of [0, 1], so the range
widens to the lo/hi bracket there instead of trusting the guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .interval import extra_parts

#: Known positions a (workload, offset) cell needs before its rate counts as identified.
MIN_KNOWN = 30
#: Ridge precision pulling a workload's standardised coefficients to the pooled ones.
SHRINK = 1.0
#: Block folds of the held-out calibration check.
FOLDS = 5
#: Equal-width bins of predicted acceptance in the calibration check.
CALIBRATION_BINS = 10
#: A bin fails the check when its gap exceeds this plus 3 standard errors.
CALIBRATION_SLACK = 0.02
#: Held-out positions a bin needs before it is tested (its standard error means little below).
CALIBRATION_MIN_COUNT = 20
#: The floor of log q in the features: a draft token is never quite impossible.
LOG_Q_FLOOR = -30.0
_NEWTON_STEPS = 50
_FEATURES = 7


def features(
    log_q: np.ndarray, offset: np.ndarray, first: np.ndarray, ease: np.ndarray
) -> np.ndarray:
    """`[..., 7]` regressors: 1, log q, (log q)^2, the offset at a first position (else
    0), the offset at a continuation position (else 0), first or not, the request's ease.

    `first` says the position has no earlier walked entry in its block; `ease` is the
    request's mean ratio at its blocks' first tail positions (broadcast like `log_q`).
    """
    lq = np.clip(np.nan_to_num(log_q, nan=LOG_Q_FLOOR), LOG_Q_FLOOR, 0.0)
    first = np.broadcast_to(first, lq.shape)
    off = np.broadcast_to(offset, lq.shape).astype(np.float64)
    cols = (
        np.ones_like(lq),
        lq,
        lq * lq,
        np.where(first, off, 0.0),
        np.where(first, 0.0, off),
        first.astype(np.float64),
        np.broadcast_to(ease, lq.shape).astype(np.float64),
    )
    return np.stack(cols, axis=-1)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def fit_coefficients(
    x: np.ndarray,
    a: np.ndarray,
    prior: np.ndarray,
    shrink: float,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Coefficients minimising the fractional logistic loss + shrink/2 |beta - prior|^2.

    `x` is standardised (its first column the intercept), so one penalty suits all;
    `weight` counts each row that many times (rows that stand for a cell of positions).
    """
    beta = prior.copy()
    ridge = shrink * np.eye(x.shape[1])
    w = np.ones(len(a)) if weight is None else weight
    for _ in range(_NEWTON_STEPS):
        mu = sigmoid(x @ beta)
        grad = x.T @ (w * (mu - a)) + shrink * (beta - prior)
        hess = (x * (w * mu * (1 - mu))[:, None]).T @ x + ridge
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return beta


def continuation_spread(
    z: np.ndarray, a: np.ndarray, group: np.ndarray, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, (slope, centre) of held-out logits `z` at continuation positions against
    their observed ratios `a`: the slope of a fractional logistic regression of `a` on `z`
    (with an intercept; ridge `SHRINK` towards slope 1) and the mean of `z`. A group with
    no such position keeps slope 1."""
    slope, centre = np.ones(groups), np.zeros(groups)
    for g in np.unique(group).tolist():
        sel = group == g
        x = np.stack([np.ones(int(sel.sum())), z[sel]], axis=1)
        slope[g] = fit_coefficients(x, a[sel], np.array([0.0, 1.0]), SHRINK)[1]
        centre[g] = z[sel].mean()
    return slope, centre


def _fit_groups(
    x: np.ndarray, a: np.ndarray, group: np.ndarray, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """(pooled coefficients, `[groups, features]` per-group coefficients shrunk to them)."""
    pooled = fit_coefficients(x, a, np.zeros(x.shape[1]), 1e-3)
    per = np.tile(pooled, (groups, 1))
    for g in np.unique(group).tolist():
        sel = group == g
        per[g] = fit_coefficients(x[sel], a[sel], pooled, SHRINK)
    return pooled, per


def calibration_sums(
    predicted: np.ndarray,
    observed: np.ndarray,
    predicted_se: np.ndarray | None = None,
    key: np.ndarray | None = None,
    keys: int = 1,
) -> np.ndarray:
    """`[5, CALIBRATION_BINS]` per bin of the prediction: count, sum predicted, sum observed,
    sum observed squared, sum of the predictions' own standard errors (0 where not given);
    sums of several sets of positions add up (`calibration_report`). With `key` (values
    below `keys`), each key's positions are summed apart in one pass: `[5, keys, BINS]`."""
    b = np.minimum((predicted * CALIBRATION_BINS).astype(np.int64), CALIBRATION_BINS - 1)
    if key is not None:
        b = b + np.asarray(key, dtype=np.int64) * CALIBRATION_BINS
    size = keys * CALIBRATION_BINS
    se = np.zeros(len(b)) if predicted_se is None else predicted_se
    out = np.stack(
        [
            np.bincount(b, minlength=size).astype(np.float64),
            np.bincount(b, predicted, size),
            np.bincount(b, observed, size),
            np.bincount(b, observed * observed, size),
            np.bincount(b, se, size),
        ]
    )
    return out if key is None else out.reshape(5, keys, CALIBRATION_BINS)


def calibration_report(sums: np.ndarray) -> dict:
    """Held-out predictions against the observed ratios, from `calibration_sums`.

    A bin's standard error is the observed ratios' plus the mean of the predictions' own
    (taken as fully correlated: predictions from one estimated cell share its error)."""
    count, pred_sum, obs_sum, obs_sq, pred_se = sums
    n = int(count.sum())
    if n == 0:
        return {"held_out": 0, "calibrated": None}
    keep = count > 0
    tested = count >= CALIBRATION_MIN_COUNT
    c = np.maximum(count, 1)
    pred, obs, second = pred_sum / c, obs_sum / c, obs_sq / c
    se = np.sqrt(np.maximum(second - obs * obs, 0.0) / c + (pred_se / c) ** 2)
    gap = pred - obs
    ok = np.abs(gap) <= CALIBRATION_SLACK + 3 * se
    return {
        "held_out": n,
        "mean_predicted": float(pred_sum.sum() / n),
        "mean_observed": float(obs_sum.sum() / n),
        "ece": float((count * np.abs(gap)).sum() / n),
        "tested_bins": int(tested.sum()),
        "calibrated": bool(ok[tested].all()) if tested.any() else None,
        "bins": [
            {"predicted": float(pred[i]), "observed": float(obs[i]), "count": int(count[i])}
            for i in np.flatnonzero(keep).tolist()
        ],
    }


@dataclass(frozen=True)
class TailModel:
    """The fitted model: per-group coefficients, identified cells, and the held-out check.

    `names` are the groups' names (workloads, in the order of their ids);
    `known[g, c]`: group g's known positions at offset c + 1, `continuation[g, c]` those of
    them that are continuation positions (an earlier tail entry of their block walked);
    `identified[g, c]`: at least `MIN_KNOWN` continuation positions there, what an
    unreached position's rate rests on (`identified_first`: at least `MIN_KNOWN` first
    positions, for a block nothing of whose tail was walked); `margin[g]` the group's
    held-out ECE, the half-width of an identified rate's range; `spread[g]` and
    `centre[g]` the slope and centre of `continuation_spread`, which continuation rates'
    logits are pulled towards.
    """

    names: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    known: np.ndarray
    continuation: np.ndarray
    margin: np.ndarray
    calibration: list[dict]
    spread: np.ndarray
    centre: np.ndarray

    @property
    def identified(self) -> np.ndarray:
        return self.continuation >= MIN_KNOWN

    @property
    def identified_first(self) -> np.ndarray:
        return self.known - self.continuation >= MIN_KNOWN

    def rates(self, x: np.ndarray, group: np.ndarray, continuation: np.ndarray) -> np.ndarray:
        """Predicted acceptance ratio for features `x` `[k, gamma, 7]` of blocks in `group`;
        at continuation positions (`continuation`, `[k, gamma]`) with the group's spread."""
        z = ((x - self.mean) / self.scale * self.coef[group][:, None, :]).sum(axis=-1)
        centre = self.centre[group][:, None]
        pulled = centre + self.spread[group][:, None] * (z - centre)
        return sigmoid(np.where(continuation, pulled, z))

    def parts(
        self, x: np.ndarray, group: np.ndarray, start: np.ndarray, continuation: np.ndarray
    ) -> np.ndarray:
        """`interval.extra_parts` of blocks with features `x` `[k, gamma, 7]` in `group`,
        from position `start` on (`continuation`: whether each position is a continuation
        position): identified cells within the group's margin, the others anywhere."""
        ident = np.where(continuation, self.identified[group], self.identified_first[group])
        rates = self.rates(x, group, continuation)
        return extra_parts(rates, ident, self.margin[group], start)


def fit_tail_model(
    x: np.ndarray, a: np.ndarray, group: np.ndarray, block: np.ndarray, offset: np.ndarray,
    continuation: np.ndarray, names: tuple[str, ...], gamma: int,
) -> TailModel:  # fmt: skip
    """Fit on known positions: features `x` `[n, 7]`, ratios `a`, their group, block,
    1-based offset and whether each is a continuation position; the held-out check
    splits by block so a block never checks itself, and its logits at continuation
    positions set the spread (`continuation_spread`)."""
    n, groups = len(a), len(names)
    cell = group * gamma + offset - 1
    known = np.bincount(cell, minlength=groups * gamma).reshape(groups, gamma)
    cont = np.bincount(cell, continuation.astype(np.int64), minlength=groups * gamma)
    cont = cont.reshape(groups, gamma).astype(np.int64)
    mean, scale = np.zeros(_FEATURES), np.ones(_FEATURES)
    if n:
        mean[1:] = x[:, 1:].mean(axis=0)
        std = x[:, 1:].std(axis=0)
        scale[1:] = np.where(std > 0, std, 1.0)
    xs = (x - mean) / scale
    if n == 0:
        coef = np.zeros((groups, _FEATURES))
    else:
        coef = _fit_groups(xs, a, group, groups)[1]

    fold = block % FOLDS
    held = np.full(n, np.nan)  # held-out logits
    for f in range(FOLDS):
        test = fold == f
        if not test.any() or test.all():
            continue
        train = ~test
        per = _fit_groups(xs[train], a[train], group[train], groups)[1]
        held[test] = (xs[test] * per[group[test]]).sum(axis=1)
    checked = ~np.isnan(held)
    predicted = sigmoid(held)
    calibration = [
        calibration_report(calibration_sums(predicted[checked & sel], a[checked & sel]))
        for sel in (group == g for g in range(groups))
    ]
    margin = np.asarray([c.get("ece", 1.0) for c in calibration])
    along = checked & continuation
    spread, centre = continuation_spread(held[along], a[along], group[along], groups)
    return TailModel(names, mean, scale, coef, known, cont, margin, calibration, spread, centre)

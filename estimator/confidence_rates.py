"""A smooth model of acceptance in position and confidence, for the cells the population
model cannot estimate.

Why: the population model (`population.HazardModel`) estimates a hazard per (group,
position, confidence bin) cell from blocks at risk there; a cell with too few (deep
positions, low-confidence bins: what no window reaches) takes `1 - mean calibrated
confidence` instead, which holds only where the calibration does. Where the confidence
does not track acceptance (a head that reads the draft's own probability) that fallback
misses, in a direction nothing in the cell shows. Every verified draft of a sampled
request has a known acceptance ratio a = min(1, p/q), at every position and confidence
the windows reach, so a model smooth in position and confidence, fitted on them, says
what those positions imply for the cells beyond them.

The model, per group: a fractional logistic regression (`tail_model.fit_coefficients`)
of a on the position, the confidence's logit, its square, and their product, fitted on
every known position the group has had. The positions are kept as counts and sums of a
per (position, `BINS` confidence bins) cell, each standing at its bin's centre, so a
refit costs a few hundred rows whatever the run's length, and a group is refitted once
its known positions grew by `REFIT_GROWTH` since its last fit (the fit moves slowly
once it rests on many). Which of the two rates an unidentified cell takes is the data's
choice (`extrapolation_check.ExtrapolationCheck.blend_weight`).
"""

from __future__ import annotations

import numpy as np

from .tail_model import fit_coefficients, sigmoid

#: Equal-width confidence bins of the cells the known positions are summed in.
BINS = 64
#: Known positions within `SUPPORT_WIDTH` of a confidence, at its position, that make the
#: smooth model's rate there an interpolation.
SUPPORT = 30
SUPPORT_WIDTH = 0.05
#: Relative growth of a group's known positions that triggers a refit.
REFIT_GROWTH = 0.1
#: A confidence is kept inside (eps, 1 - eps) before its logit is taken.
_EPS = 1e-4
_FEATURES = 5


def features(position: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """`[..., 5]` regressors: 1, position, logit c, (logit c)^2, position * logit c."""
    c = np.clip(confidence, _EPS, 1.0 - _EPS)
    logit = np.log(c) - np.log1p(-c)
    pos = np.broadcast_to(position, logit.shape).astype(np.float64)
    return np.stack([np.ones_like(logit), pos, logit, logit * logit, pos * logit], axis=-1)


class ConfidenceRates:
    """Per group: known positions summed per (position, confidence bin) cell, and the
    smooth model's coefficients."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        # [groups, 2, gamma, BINS]: positions, sum of a
        self._sums = np.zeros((0, 2, gamma, BINS))
        self._coef = np.zeros((0, _FEATURES))
        self._mean = np.zeros((0, _FEATURES))
        self._scale = np.ones((0, _FEATURES))
        self._fitted_on = np.zeros(0)  # known positions at each group's last fit
        self._cumulative_counts: np.ndarray | None = None

    def _grow(self, n: int) -> None:
        extra = n - len(self._sums)
        if extra <= 0:
            return

        def grow(a: np.ndarray, fill: float = 0.0) -> np.ndarray:
            return np.concatenate([a, np.full((extra, *a.shape[1:]), fill)])

        self._sums, self._coef = grow(self._sums), grow(self._coef)
        self._mean, self._scale = grow(self._mean), grow(self._scale, 1.0)
        self._fitted_on = np.concatenate([self._fitted_on, np.zeros(extra)])

    @property
    def groups(self) -> int:
        """The groups the model holds sums for."""
        return len(self._sums)

    def fitted(self, groups: np.ndarray) -> np.ndarray:
        """`[k]` whether each group has any known position to rest on."""
        groups = np.asarray(groups, dtype=np.int64)
        have = groups < len(self._sums)
        out = np.zeros(len(groups), dtype=bool)
        out[have] = self._sums[:, 0].any(axis=(1, 2))[groups[have]]
        return out

    def update(
        self, group: np.ndarray, known: np.ndarray, a: np.ndarray, confidence: np.ndarray
    ) -> None:
        """Add the known positions (`known` `[n, gamma]`, their ratios `a` and confidences)
        of rows in `group`, and refit the groups that grew enough (`REFIT_GROWTH`)."""
        group = np.asarray(group, dtype=np.int64)
        # flat indices and `take`: numpy's 2-D fancy indexing costs several times as much
        flat = np.flatnonzero(known & ~np.isnan(confidence))
        if len(flat) == 0:
            return
        rows, cols = np.divmod(flat, self.gamma)
        self._grow(int(group.max()) + 1)
        b = np.minimum((confidence.take(flat) * BINS).astype(np.int64), BINS - 1)
        cell = (group.take(rows) * self.gamma + cols) * BINS + b
        size = len(self._sums) * self.gamma * BINS
        for i, w in enumerate((None, a.take(flat))):
            self._sums[:, i] += np.bincount(cell, w, size).reshape(-1, self.gamma, BINS)
        self._refit_grown()

    def add(self, sums: np.ndarray, known: int) -> None:
        """`update` from its sums, counted elsewhere (`[groups, 2, gamma, BINS]`: positions
        and sum of a per cell, over `known` positions): the compiled kernel's form."""
        if known == 0:
            return
        self._grow(len(sums))
        self._sums[: len(sums)] += sums
        self._refit_grown()

    def _refit_grown(self) -> None:
        """Refit the groups whose known positions grew enough (`REFIT_GROWTH`)."""
        self._cumulative_counts = None
        total = self._sums[:, 0].sum(axis=(1, 2))
        for k in np.flatnonzero(total > (1.0 + REFIT_GROWTH) * self._fitted_on).tolist():
            self._refit(k, self._sums[k])
            self._fitted_on[k] = total[k]

    def learn_in_batches(
        self,
        batch: np.ndarray,
        group: np.ndarray,
        known: np.ndarray,
        a: np.ndarray,
        confidence: np.ndarray,
        groups: int = 0,
    ) -> ConfidenceRates:
        """`update` with each batch's rows in turn (`batch` per row, from 0, never
        decreasing), in one pass; returns the model as it stood before each batch, as one
        whose group `b * n + g` is group `g` before batch `b` (for `rates`), n the groups
        (at least `groups`).

        The sums before each batch are the running sums of the batches' own, and the
        groups are refitted after the batches where `update` would refit them, from the
        same sums: the same coefficients to the last bit (`population.HazardModel.
        learn_in_batches` says why)."""
        group = np.asarray(group, dtype=np.int64)
        batch = np.asarray(batch, dtype=np.int64)
        nb = int(batch[-1]) + 1 if len(batch) else 0
        self._grow(max(groups, int(group.max()) + 1 if len(group) else 0))
        n_groups, g = len(self._sums), self.gamma
        flat = np.flatnonzero(known & ~np.isnan(confidence))
        rows, cols = np.divmod(flat, g)
        b = np.minimum((confidence.take(flat) * BINS).astype(np.int64), BINS - 1)
        # each row's (batch, group) taken once per known position, not its batch and group
        cell = (batch * n_groups + group).take(rows) * g
        cell += cols
        cell *= BINS
        cell += b
        # the state, then each batch's sums, added up in place: the running sums
        running = np.empty((nb + 1, n_groups, 2, g, BINS))
        running[0] = self._sums
        for i, w in enumerate((None, a.take(flat))):
            counts = np.bincount(cell, w, nb * n_groups * g * BINS)
            running[1:, :, i] = counts.reshape(nb, n_groups, g, BINS)
        # a batch taught something where it counted a known position
        taught = running[1:, :, 0].any(axis=(1, 2, 3))
        np.cumsum(running, axis=0, out=running)
        totals = running[1:, :, 0].sum(axis=(2, 3))
        coef, mean, scale = (np.empty((nb, n_groups, _FEATURES)) for _ in range(3))
        for k in range(nb):
            coef[k], mean[k], scale[k] = self._coef, self._mean, self._scale
            if not taught[k]:  # `update` returns before its refits on a batch of nothing
                continue
            grown = totals[k] > (1.0 + REFIT_GROWTH) * self._fitted_on
            for j in np.flatnonzero(grown).tolist():
                self._refit(j, running[k + 1, j])
                self._fitted_on[j] = totals[k, j]
        self._sums = running[-1].copy()
        self._cumulative_counts = None
        before = ConfidenceRates(g)
        before._sums = running[:-1].reshape(nb * n_groups, 2, g, BINS)
        before._coef, before._mean, before._scale = (
            x.reshape(nb * n_groups, _FEATURES) for x in (coef, mean, scale)
        )
        before._fitted_on = np.zeros(nb * n_groups)
        return before

    def _refit(self, k: int, sums: np.ndarray) -> None:
        """Group `k`'s coefficients on its `sums` (`[2, gamma, BINS]`)."""
        count, total = sums
        pos, b = np.nonzero(count)
        n = count[pos, b]
        x = features(pos, (b + 0.5) / BINS)
        a = total[pos, b] / n
        mean, scale = np.zeros(_FEATURES), np.ones(_FEATURES)
        # weighted means as np.average takes them (the same products and sums, so the same
        # bits), without its argument checks, which cost as much as the sums at this size
        weight, total_weight = n[:, None], n.sum()
        mean[1:] = (x[:, 1:] * weight).sum(axis=0) / total_weight
        spread = np.sqrt(((x[:, 1:] - mean[1:]) ** 2 * weight).sum(axis=0) / total_weight)
        scale[1:] = np.where(spread > 0, spread, 1.0)
        # the old coefficients are in the old standardisation: start from them in the new
        old = self._coef[k] / self._scale[k]
        old[0] -= (old[1:] * self._mean[k, 1:]).sum()
        start = old * scale
        start[0] += (old[1:] * mean[1:]).sum()
        self._mean[k], self._scale[k] = mean, scale
        self._coef[k] = fit_coefficients((x - mean) / scale, a, start, 1e-3, n)

    def supported(self, groups: np.ndarray, confidence: np.ndarray) -> np.ndarray:
        """`[k, gamma]` whether at least `SUPPORT` known positions of the group lie at the
        same position within `SUPPORT_WIDTH` of the confidence: where the smooth model
        interpolates rather than extrapolates."""
        groups = np.asarray(groups, dtype=np.int64)
        return self.supported_at(groups[:, None], np.arange(self.gamma)[None, :], confidence)

    def supported_at(
        self, groups: np.ndarray, position: np.ndarray, confidence: np.ndarray
    ) -> np.ndarray:
        """`supported` at given (group, position, confidence) triples, broadcast together:
        callers that need a few cells of many blocks ask for those alone."""
        groups = np.asarray(groups, dtype=np.int64)
        if groups.size:
            self._grow(int(groups.max()) + 1)
        count = self._cumulative()
        c = np.nan_to_num(confidence, nan=-1.0)
        lo = np.clip(((c - SUPPORT_WIDTH) * BINS).astype(np.int64), 0, BINS)
        hi = np.clip(((c + SUPPORT_WIDTH) * BINS).astype(np.int64) + 1, 0, BINS)
        # one flat index per triple and `take`, cheaper than 3-D fancy indexing
        base = (groups * self.gamma + position) * (BINS + 1)
        inside = count.take(base + hi) - count.take(base + lo)
        return (inside >= SUPPORT) & ~np.isnan(confidence)

    def _cumulative(self) -> np.ndarray:
        """`[groups, gamma, BINS + 1]` known positions in the bins below each bin edge (kept
        until the next `update`)."""
        if self._cumulative_counts is None or len(self._cumulative_counts) != len(self._sums):
            count = np.cumsum(self._sums[:, 0], axis=2)
            zero = np.zeros((*count.shape[:2], 1))
            self._cumulative_counts = np.concatenate([zero, count], axis=2)
        return self._cumulative_counts

    def rates(self, groups: np.ndarray, confidence: np.ndarray) -> np.ndarray:
        """`[k, gamma]` the predicted acceptance ratio at each block's positions (NaN where
        its confidence is NaN or its group has no known position)."""
        groups = np.asarray(groups, dtype=np.int64)
        return self.rates_at(groups[:, None], np.arange(self.gamma)[None, :], confidence)

    def rates_at(
        self, groups: np.ndarray, position: np.ndarray, confidence: np.ndarray
    ) -> np.ndarray:
        """`rates` at given (group, position, confidence) triples, broadcast together."""
        groups = np.asarray(groups, dtype=np.int64)
        # a group the model never learned has no rate: asking grows nothing, so the model's
        # state is what it learned, however it was asked (and whichever form asked it)
        inside = groups < len(self._sums)
        if not inside.all():
            shape = np.broadcast_shapes(groups.shape, np.shape(position), np.shape(confidence))
            if len(self._sums) == 0:
                return np.full(shape, np.nan)
            groups = np.where(inside, groups, 0)
        # the standardised coefficients as raw ones, per group: the linear predictor is then
        # a few elementwise operations, no [..., features] temporaries
        raw = self._coef / self._scale
        raw[:, 0] -= (raw[:, 1:] * self._mean[:, 1:]).sum(axis=1)
        b = np.moveaxis(raw.take(groups, axis=0), -1, 0)  # [features, *groups.shape]
        c = np.clip(confidence, _EPS, 1.0 - _EPS)
        lc = np.log(c) - np.log1p(-c)
        z = b[0] + b[1] * position + lc * (b[2] + b[3] * lc + b[4] * position)
        fitted = self._sums[:, 0].any(axis=(1, 2))[groups] & inside
        return np.where(np.isnan(confidence) | ~fitted, np.nan, sigmoid(z))

"""The in-band extrapolation held against positions whose acceptance is known.

Why: the sampled walk's point fills the tail positions no walk reached with the
population model's rates (`population.HazardModel`: 1 - the hazard of each position's
(group, position, confidence bin) cell), and where windows are short most of the point
is that extrapolation. In band every verified draft of a sampled request has a known
acceptance ratio a = min(1, p/q): the step carries the target's and the draft's
log-probabilities of each token of its window, whether or not an earlier one was
rejected (verification scores the whole window in one pass). Those are the known
positions the extrapolation is checked on.

Held out: each batch of rows is checked against the model as it stood before it learnt
them (prequential), so no position checks a model it taught. Only the rows of one step
in `CHECK_EVERY` are checked (`checked_steps`, a hash of the step's forward_ct, so the
in-band check and its replay over a run's Parquet check the same rows): every sum of the
check and of the blend's moments is then a sample of the full one, and the means,
`ece` and the blend weight, ratios of those sums, are the full check's in expectation.
Checking every verified position cost a third of the estimator's step; the smooth model
still learns from every known position. The comparison is the
block-accept tail model's (`tail_model.calibration_sums`, `calibration_report`): bins
of the predicted rate, `calibrated` false where a bin of 20 or more positions misses by
more than 0.02 + 3 standard errors (the ratios' and the mean of the predicted rates' own,
sqrt(h (1 - h) / at risk) per cell, since a thin cell's rate is itself noisy), `ece` the
count-weighted mean gap.

What it checks: the rates where outcomes are known, i.e. the identified cells' hazards
(`calibrated`, `ece`), and apart (`unidentified_cells`) the calibration fallback where a
verified position fell in a cell too thin to estimate (on the reference runtime that
fallback under-states low-confidence acceptance by a few points, which is why it is kept
out of the margin and such cells' rates are not trusted at all).
Known positions are verified ones, which the scheduler picks by confidence, while the
extrapolated ones lie past the windows: whether censoring is ignorable given the
confidence bin (the population model's first assumption) is what no verified position
can test. `identified` says where the rates rest on data at all.

Identification: a cell is identified where the population model estimated its hazard
from data (`min_at_risk` blocks at risk). `CheckedExtrapolation.parts` gives each
block's point range, identified rates within the group's held-out `ece` (its margin; 1
before anything was checked) and unidentified ones anywhere in [0, 1], and the part of
the point resting on unidentified cells (`interval.extra_parts`).

The blend: an unidentified cell's rate, the population model's calibration fallback, is
blended with a model smooth in position and confidence fitted on the known positions
(`confidence_rates.ConfidenceRates`), by the weight whose blend missed the known
positions that fell in unidentified cells least, held out like the check; where no known
position lies near (`ConfidenceRates.supported`) both rates are extrapolations and the
point takes the middle of the two. The range still lets those rates run over [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import compiled
from .confidence_rates import BINS, ConfidenceRates
from .interval import acceptance_log_ratio, extra_parts, position_terms, window_rows
from .population import HazardModel, QueuedStep, stacked
from .tail_model import CALIBRATION_BINS, calibration_report, calibration_sums

#: One step in this many has its rows checked (`checked_steps`).
CHECK_EVERY = 4
#: Fibonacci hashing's multiplier (2^64 / the golden ratio): its high bits mix the step.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

#: The smooth model's weight where no known position supports it (an extrapolation as
#: much as the fallback is: the point takes the middle of the two).
UNSUPPORTED_WEIGHT = 0.5


def known_ratios(
    window: np.ndarray,
    greedy: np.ndarray,
    target_logprobs: np.ndarray | None,
    draft_logprobs: np.ndarray | None,
    gamma: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`([n, gamma] known, [n, gamma] a)`: the verified positions of sampled rows (greedy
    == 0) whose acceptance ratio both log-probabilities give (-inf target: a ratio of 0)."""
    n = len(window)
    if target_logprobs is None or draft_logprobs is None:
        return np.zeros((n, gamma), dtype=bool), np.zeros((n, gamma))
    with np.errstate(invalid="ignore"):
        a = acceptance_log_ratio(target_logprobs, draft_logprobs)
        np.exp(a, out=a)
    # a greedy row counts as a window of 0: nothing of it is known
    sampled_window = np.where(np.asarray(greedy) == 0, window, 0)
    known = window_rows(gamma).take(sampled_window, axis=0)
    known &= ~np.isnan(a)
    return known, a


def any_per_row(mask: np.ndarray) -> np.ndarray:
    """`mask.any(axis=1)` of an `[n, gamma]` mask, its columns or-ed in turn: numpy reduces
    a short last axis a row at a time, several times slower (1.9 ms against 0.3 ms on a
    replay call's 130k rows of 7)."""
    out = mask[:, 0].copy()
    for j in range(1, mask.shape[1]):
        out |= mask[:, j]
    return out


def checked_steps(forward_ct: np.ndarray) -> np.ndarray:
    """Whether each step's rows are checked: one step in `CHECK_EVERY`, by the high bits of
    a multiplicative hash of its forward_ct, so neighbouring steps and any period in the
    traffic fall apart (the low bits of a counter would pick the same phase forever)."""
    mixed = np.asarray(forward_ct).astype(np.uint64) * _GOLDEN
    return (mixed >> np.uint64(40)) % np.uint64(CHECK_EVERY) == 0


def _added_in_turn(total: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """`total` plus each of `parts` (along its first axis) in turn, one addition each, so
    that sums over many batches round as one addition per batch does."""
    if len(parts) == 1:
        return total + parts[0]
    return np.cumsum(np.concatenate([total[None], parts]), axis=0)[-1]


class ExtrapolationCheck:
    """Per group: the population model's rates against known ratios, held out (prequential)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        self.sums = np.zeros((0, 2, 5, CALIBRATION_BINS))
        self.smooth = ConfidenceRates(gamma)
        #: per group, over the known positions in unidentified cells, held out: the sums
        #: of d * e and d * d, d the smooth rate less the fallback, e the observed ratio
        #: less the fallback; the blend weight that misses them least is their quotient
        self.blend_moments = np.zeros((0, 2))

    def observe(
        self,
        model: HazardModel,
        group: np.ndarray,
        window: np.ndarray,
        greedy: np.ndarray,
        confidence: np.ndarray | None,
        target_logprobs: np.ndarray | None,
        draft_logprobs: np.ndarray | None,
        forward_ct: np.ndarray,
    ) -> None:
        """Check the rows of the `checked_steps` (`forward_ct` per row) against `model`
        before it learns them (call before `model.update`); the smooth model learns every
        row's known positions."""
        group = self._grow(group)
        known, a = known_ratios(window, greedy, target_logprobs, draft_logprobs, self.gamma)
        rows = np.flatnonzero(checked_steps(forward_ct) & any_per_row(known))
        if len(rows):
            conf = None if confidence is None else confidence[rows]
            self._check(model, self.smooth, group[rows], group[rows], known[rows], a[rows], conf)
        if confidence is not None:
            self.smooth.update(group, known, a, confidence)

    def observe_steps(self, model: HazardModel, steps: list[QueuedStep]) -> int | None:
        """`observe` over the rows of queued steps, in their order (call before the model
        learns them): compiled where built, reading the steps' own columns, else
        concatenated. The same sums, moments and smooth model either way. Returns the
        steps' largest group id once the kernels' `validate_steps` passed them (-1: no
        rows), for `HazardModel.update_steps`; None from the numpy form."""
        kernels = compiled.KERNELS
        if kernels is None:
            group, w, greedy = (np.concatenate([s[i] for s in steps]) for i in (0, 1, 4))
            rows = [len(s.group) for s in steps]
            fct = np.repeat(np.array([s.forward_ct for s in steps], np.int64), rows)
            conf, target_lp, draft_lp = (
                stacked(steps, name, self.gamma)
                for name in ("confidence", "target_logprobs", "draft_logprobs")
            )
            self.observe(model, group, w, greedy, conf, target_lp, draft_lp, fct)
            return None
        top = kernels.validate_steps(steps, self.gamma)
        if top < 0:
            return top
        self._ensure_groups(top + 1)
        model.ensure_groups(top + 1)
        # the known positions' ratios: the negative logs exponentiated by numpy, as
        # `known_ratios` does (the kernel writes a log of 0 as its ratio 1)
        ratios, offsets, logs, where = kernels.known_log_ratios(steps, self.gamma)
        ratios.put(logs, np.exp(ratios.take(logs)))
        checked = checked_steps(np.array([s.forward_ct for s in steps], np.int64))
        hazard, data = model.tables()
        sums, (group, position, conf, fallback, a) = kernels.check_sums(
            steps, checked, ratios, offsets, hazard, data, model.at_risk(), CALIBRATION_BINS
        )
        self.sums[: len(sums)] += sums[: len(self.sums)]
        smooth = self.smooth.rates_at(group, position, conf)
        have = np.flatnonzero(~np.isnan(smooth))
        if len(have):
            self._add_moments(smooth[have], fallback[have], a[have], group[have], 1)
        sums = kernels.smooth_sums(steps, ratios, offsets, where, top + 1, self.gamma, BINS)
        self.smooth.add(*sums)
        return top

    def observe_in_batches(
        self,
        model: HazardModel,
        batch: np.ndarray,
        group: np.ndarray,
        window: np.ndarray,
        accepted: np.ndarray,
        greedy: np.ndarray,
        confidence: np.ndarray | None,
        target_logprobs: np.ndarray | None,
        draft_logprobs: np.ndarray | None,
        forward_ct: np.ndarray,
    ) -> None:
        """`observe`, then `model.update`, for each batch in turn (`batch` per row, from 0,
        never decreasing), in one pass: the in-band estimator's teaching of the population
        model, replayed over a stored run. The figures are those of a call of each per
        batch, to the last bit (`HazardModel.learn_in_batches`)."""
        group = self._grow(group)
        batch = np.asarray(batch, dtype=np.int64)
        known, a = known_ratios(window, greedy, target_logprobs, draft_logprobs, self.gamma)
        # both models stack their groups by the same count
        n_groups = max(model.groups, len(self.sums), self.smooth.groups)
        model.ensure_groups(n_groups)
        before = model.learn_in_batches(batch, group, window, accepted, confidence)
        smooth = self.smooth
        if confidence is not None:
            smooth = self.smooth.learn_in_batches(batch, group, known, a, confidence, n_groups)
        rows = np.flatnonzero(checked_steps(forward_ct) & any_per_row(known))
        if len(rows):
            conf = None if confidence is None else confidence[rows]
            stacked = batch[rows] * n_groups + group[rows]
            self._check(
                before, smooth, stacked, group[rows], known[rows], a[rows], conf, batch[rows]
            )

    def _grow(self, group: np.ndarray) -> np.ndarray:
        """`group` as int64, the sums grown to hold it."""
        group = np.asarray(group, dtype=np.int64)
        if len(group):
            self._ensure_groups(int(group.max()) + 1)
        return group

    def _ensure_groups(self, n: int) -> None:
        """The sums and moments grown to at least `n` groups."""
        if n > len(self.sums):
            grown = np.zeros((n, 2, 5, CALIBRATION_BINS))
            grown[: len(self.sums)] = self.sums
            self.sums = grown
            moments = np.zeros((n, 2))
            moments[: len(self.blend_moments)] = self.blend_moments
            self.blend_moments = moments

    def _check(
        self,
        model: HazardModel,
        smooth_model: ConfidenceRates,
        model_group: np.ndarray,
        group: np.ndarray,
        known: np.ndarray,
        a: np.ndarray,
        conf: np.ndarray | None,
        batch: np.ndarray | None = None,
    ) -> None:
        """Add checked rows to the calibration sums and the blend's moments. The models
        are asked for `model_group` (a group of the stacked models of `observe_in_batches`,
        else the row's `group`); with `batch`, each batch's sums are added in turn."""
        rates, ident, se = model.rates(model_group, conf)
        # the smooth model's rates, only on the rows with a known position in a silent cell
        silent = np.flatnonzero(any_per_row(known & ~ident)) if conf is not None else []
        smooth = np.full(known.shape, np.nan)
        if len(silent):
            smooth[silent] = smooth_model.rates(model_group[silent], conf[silent])
        # every (batch, group)'s sums in one pass: key = group * 2 + (0 identified, 1 not);
        # flat indices and `take`, where 2-D fancy indexing costs several times as much
        gamma = known.shape[1]
        flat = np.flatnonzero(known)
        groups = len(self.sums)
        batches = 1 if batch is None else int(batch[-1]) + 1
        row_key = group if batch is None else batch * groups + group
        key = row_key.take(flat // gamma) * 2 + ~ident.take(flat)
        sums = calibration_sums(
            rates.take(flat), a.take(flat), se.take(flat), key, 2 * groups * batches
        )
        per_batch = sums.reshape(5, batches, groups, 2, CALIBRATION_BINS).transpose(1, 2, 3, 0, 4)
        self.sums = _added_in_turn(self.sums, per_batch)
        flat = np.flatnonzero(known & ~ident & ~np.isnan(smooth))
        if len(flat):
            self._add_moments(
                smooth.take(flat),
                rates.take(flat),
                a.take(flat),
                row_key.take(flat // gamma),
                batches,
            )

    def _add_moments(
        self, smooth: np.ndarray, fallback: np.ndarray, a: np.ndarray, key: np.ndarray, batches: int
    ) -> None:
        """The blend's moments of held-out known positions in unidentified cells (their
        smooth and fallback rates and ratios; `key`: batch * groups + group), each batch's
        added in turn."""
        groups = len(self.sums)
        d, e = smooth - fallback, a - fallback
        moments = np.stack([np.bincount(key, v, groups * batches) for v in (d * e, d * d)], axis=1)
        self.blend_moments = _added_in_turn(self.blend_moments, moments.reshape(batches, groups, 2))

    def calibration(self, g: int) -> dict:
        """The held-out check of group `g` on positions in identified cells
        (`tail_model.calibration_report`), and under `unidentified_cells` the same over the
        positions whose cells the model extrapolated (which `parts` does not trust)."""
        sums = self.sums[g] if g < len(self.sums) else np.zeros((2, 5, CALIBRATION_BINS))
        report = calibration_report(sums[0])
        other = calibration_report(sums[1])
        keys = ("held_out", "mean_predicted", "mean_observed", "ece")
        report["unidentified_cells"] = {k: other[k] for k in keys if k in other}
        return report

    def blend_weight(self, groups: np.ndarray) -> np.ndarray:
        """`[k]` the weight of the smooth model's rate in each group's unidentified cells:
        the one in [0, 1] whose blend missed the held-out known positions there least, in
        squared error (0 for a group with none checked, where the population model's
        fallback stands alone). In closed form, so it moves as little as its data do: a
        weight picked from a grid would jump between neighbours on a near tie."""
        groups = np.asarray(groups, dtype=np.int64)
        # per group, then per entry (callers pass one per unidentified cell)
        de, dd = self.blend_moments.T
        weight = np.clip(np.divide(de, dd, out=np.zeros_like(de), where=dd > 0), 0.0, 1.0)
        out = np.zeros(len(groups))
        have = groups < len(weight)
        out[have] = weight.take(groups[have])
        return out

    def rates(
        self,
        model: HazardModel,
        groups: np.ndarray,
        confidence: np.ndarray | None,
        start: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`([k, gamma] rates, identified)`: the population model's rate in identified
        cells, elsewhere its fallback blended with the smooth model's: by `blend_weight`
        where known positions support the smooth model (`ConfidenceRates.supported`),
        half and half where they do not. With `start` (`[k]`), only each block's cells
        from its start on take the blend, the earlier ones keep the model's rate: the
        walks' extrapolation reads nothing before the start (`interval.position_terms`),
        and about half the unidentified cells of the blocks a walk ends lie there."""
        rates, identified = model.acceptance(groups, confidence)
        if confidence is None:
            return rates, identified
        # only the unidentified cells take the blend: the smooth model is asked for those
        # (flat indices and `take`/`put`: 2-D fancy indexing costs several times as much)
        blend = ~identified & ~np.isnan(confidence)
        if start is not None:
            blend &= ~window_rows(rates.shape[1]).take(np.asarray(start, np.int64), axis=0)
        flat = np.flatnonzero(blend)
        r, c = np.divmod(flat, rates.shape[1])
        g = np.asarray(groups, dtype=np.int64).take(r)
        blended = rates.copy()
        blended.put(flat, self.blended(g, c, confidence.take(flat), rates.take(flat)))
        return blended, identified

    def blended(
        self, groups: np.ndarray, position: np.ndarray, conf: np.ndarray, fallback: np.ndarray
    ) -> np.ndarray:
        """The blend of unidentified cells (their groups, positions, confidences and the
        population model's fallback rates), as `rates` gives it; `CheckedExtrapolation`'s
        compiled path blends the model's position-major rates in place with it."""
        smooth = self.smooth.rates_at(groups, position, conf)
        # where no known position is near, the smooth model extrapolates too: neither rate
        # is identified there, and the point takes the middle of the two
        supported = self.smooth.supported_at(groups, position, conf)
        weight = np.where(supported, self.blend_weight(groups), UNSUPPORTED_WEIGHT)
        return np.where(np.isnan(smooth), fallback, weight * (smooth - fallback) + fallback)

    def margin(self, groups: np.ndarray) -> np.ndarray:
        """`[k]` the groups' held-out ECE over identified cells: the half-width of an
        identified rate's range (1 for a group nothing was checked on)."""
        groups = np.asarray(groups, dtype=np.int64)
        s = self.sums[:, 0]  # [groups, 5, bins]: identified cells
        # count * |mean predicted - mean observed| per bin is |sum predicted - sum observed|;
        # per group, then taken per block (a few groups, thousands of blocks); a group past
        # the sums takes the last entry, 1
        count, gap = s[:, 0].sum(axis=1), np.abs(s[:, 1] - s[:, 2]).sum(axis=1)
        per_group = np.append(np.where(count > 0, gap / np.maximum(count, 1), 1.0), 1.0)
        return per_group.take(np.minimum(groups, len(s)))


@dataclass(frozen=True)
class CheckedExtrapolation:
    """The population model's extrapolation (an `interval.Extrapolate`) with its range:
    `parts` for the walk's point range and unidentified part (`interval.extrapolated_parts`)."""

    model: HazardModel
    check: ExtrapolationCheck

    def __call__(
        self, groups: np.ndarray, start: np.ndarray, confidence: np.ndarray | None
    ) -> np.ndarray:
        rates, _ = self.check.rates(self.model, groups, confidence, start)
        return position_terms(rates, start).sum(axis=1)

    def parts(
        self, groups: np.ndarray, start: np.ndarray, confidence: np.ndarray | None
    ) -> np.ndarray:
        kernels = compiled.KERNELS
        margin = self.check.margin(groups)
        if kernels is None:
            rates, identified = self.check.rates(self.model, groups, confidence, start)
            return extra_parts(rates, identified, margin, start)
        # `ExtrapolationCheck.rates` on the model's position-major rates, in place: the
        # kernel finds the cells to blend, numpy blends them (the smooth model's rates)
        start = np.asarray(start, np.int64)
        rates, identified = self.model.acceptance(groups, confidence, start)
        pm_rates, pm_ident = rates.T, identified.T  # `HazardModel.acceptance`'s own layout
        if confidence is not None:
            confidence = np.ascontiguousarray(confidence, dtype=np.float64)
            row, position = kernels.blend_cells(pm_ident, confidence, start)
            if len(row):
                g = np.asarray(groups, dtype=np.int64).take(row)
                conf = confidence.take(row * pm_rates.shape[0] + position)
                cell = position * pm_rates.shape[1] + row
                pm_rates.put(cell, self.check.blended(g, position, conf, pm_rates.take(cell)))
        return kernels.extra_parts(pm_rates, pm_ident, margin, start)

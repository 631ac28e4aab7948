"""Population survival of the ceiling under compact verification, without logits.

Why: compact verification checks only the scheduled window w of each block, so
a block whose window is fully accepted (a == w < gamma) says nothing about the
drafts past w: its ceiling is censored. The windows are not random: the
scheduler verifies the positions whose calibrated survival is high, so the
censored blocks are exactly the ones with low confidence past their window.
Plain Kaplan-Meier treats censoring as independent of the outcome and so
borrows the hazards of the long (confident) windows for the short (doubtful)
ones: it over-states survival at deep positions. The confidence that drove the
window is recorded with every block, which is enough to undo that.

The estimator is a conditional-hazard model stratified by calibrated
confidence. For group g (a workload), position i and confidence bin k
(equal-width bins of the block's calibrated confidence c_i on [0, 1]):

- at risk  n[g, i, k]: blocks with a >= i and w > i (i was verified, every
  earlier draft accepted);
- events   d[g, i, k]: blocks with a == i < w (rejected at i);
- hazard   h = d / n where n >= min_at_risk, else extrapolated from the
  calibration: h = 1 - (mean c_i over *all* blocks with c_i in bin k at
  position i, reached or not). All blocks rather than the at-risk ones because
  the cells that need extrapolating are exactly those almost no window reaches;
  within a bin of width 1/bins the mean barely depends on which blocks are
  averaged, and a cell no block ever fell in uses the bin's midpoint.

A block's survival is the product of its cells' (1 - h) along its own bin
sequence (confidence is known at every drafted position, verified or not), and
the population survival S_j = P(ceiling > j) is the mean of that product over
blocks (online: over a ring of the most recent blocks of the group).

Assumptions:

1. Censoring is ignorable given the bin: within a (group, i, k) cell, whether
   position i was verified does not depend on whether its draft would be
   accepted. The scheduler decides from confidence only, so stratifying by the
   confidence removes most of the dependence; what remains (the window also
   depends on c_0..c_{i-1} and on where c_i falls inside its bin) is the
   estimator's bias, shrinking with narrower bins.
2. Given its bin at i, a block's acceptance at i does not depend on its other
   positions' bins, so per-cell hazards multiply into the block's survival.
3. Where the data are silent, the calibration holds: the mean calibrated
   confidence of a bin is its conditional acceptance rate.

Unidentifiable positions: a cell whose blocks are (almost) never verified at i
carries no information about acceptance there, typically low-confidence bins
at deep positions, which the scheduler by design does not verify; with hard
traffic the last positions of the block are unidentifiable for nearly every
bin. Those cells use assumption 3, and `identifiable[j]` says whether at least
95% of the cells the blocks pass through at positions 0..j (block x position
pairs) had their hazard estimated from data (and every earlier position is
identifiable). The share pools positions, so past position 19 one entirely
extrapolated position could hide behind well-identified earlier ones;
`identified` gives the per-cell flags.

Without confidence (None, or NaN entries) a block falls into one pooled
stratum: the group's unstratified Kaplan-Meier hazard over all its blocks.
Beyond the last position with min_at_risk blocks at risk that hazard is the
last identified one (a geometric tail); before any position is identified it
is the group's pooled hazard sum(d) / sum(n) (1 with no data at all, so that
nothing unseen is credited). That stratum is also `naive_km`: what ignoring
informative censoring gives.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import compiled

IDENTIFIABLE_SHARE = 0.95

#: Rows per internal slice of `HazardModel.update` and `survival`.
UPDATE_CHUNK = 1 << 16

#: `HazardModel`'s counts, in the order its `_counts` gives them.
_STATE = ("_n0", "_d0", "_n", "_d", "_ccnt", "_csum")


class QueuedStep(NamedTuple):
    """One step's rows as the online estimator queues them for its models, which learn
    in batches of steps (the compiled kernels read the fields by position, in this order)."""

    group: np.ndarray
    window: np.ndarray
    accepted: np.ndarray
    confidence: np.ndarray | None
    greedy: np.ndarray
    target_logprobs: np.ndarray | None
    draft_logprobs: np.ndarray | None
    forward_ct: int


def stacked(steps: list[QueuedStep], name: str, gamma: int) -> np.ndarray | None:
    """The steps' `[rows, gamma]` column `name` in one: NaN where a step lacks it, None
    where every step does."""
    mats = [getattr(s, name) for s in steps]
    if all(m is None for m in mats):
        return None
    return np.concatenate(
        [
            m if m is not None else np.full((len(s.group), gamma), np.nan)
            for m, s in zip(mats, steps, strict=True)
        ]
    )


def tail_terms(rates: np.ndarray, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`([k, gamma], [k])`: per block trimmed at `window`, P(C > m | C >= window) at each m
    (1 below the window, the running product of `rates` from it on) and their sum, the
    expected accepted drafts past the window. Both the live cost of trimming and the
    what-if predictions read an unwalked tail this way."""
    g = rates.shape[1]
    after = np.arange(g)[None, :] >= window[:, None]
    terms = np.where(after, rates, 1.0)
    for j in range(1, g):  # gamma column multiplies: the running product from the window on
        terms[:, j] *= terms[:, j - 1]
    return terms, np.where(after, terms, 0.0).sum(axis=1)


class HazardModel:
    """Online stratified conditional-hazard model of the ceiling, per group.

    Counts accumulate over every block seen; survival averages over a bounded
    reservoir of the most recent blocks' bin sequences so that its cost does
    not grow with the run.
    """

    def __init__(
        self, gamma: int, bins: int = 10, min_at_risk: int = 30, reservoir: int = 8192
    ) -> None:
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        if not 1 <= bins <= 254:
            # uint8 bin codes, with one code kept for the pooled (no-confidence) stratum
            raise ValueError(f"bins must be within 1..254, got {bins}")
        if min_at_risk < 1:
            raise ValueError(f"min_at_risk must be >= 1, got {min_at_risk}")
        if reservoir < 1:
            raise ValueError(f"reservoir must be >= 1, got {reservoir}")
        self.gamma = gamma
        self.bins = bins
        self.min_at_risk = min_at_risk
        self.reservoir = reservoir
        self.groups = 0
        g = gamma
        self._n = np.zeros((0, g, bins), np.int64)
        self._d = np.zeros((0, g, bins), np.int64)
        self._csum = np.zeros((0, g, bins))
        self._ccnt = np.zeros((0, g, bins), np.int64)
        self._n0 = np.zeros((0, g), np.int64)
        self._d0 = np.zeros((0, g), np.int64)
        self._ring = np.zeros((0, reservoir, g), np.uint8)
        self._fill = np.zeros(0, np.int64)
        self._head = np.zeros(0, np.int64)
        self._cache: tuple[np.ndarray, np.ndarray] | None = None
        # per reach r (row) and position j: 2 * (j's first cell) + (j < r)
        j = np.arange(g)
        self._pair_rows = (2 * bins * j[None, :] + (j[None, :] < np.arange(g + 1)[:, None])).astype(
            np.int32
        )

    # -- state -------------------------------------------------------------

    def ensure_groups(self, n: int) -> None:
        """Grow the per-group state to at least `n` groups (ids 0..n-1)."""
        extra = n - self.groups
        if extra <= 0:
            return

        def grow(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros((extra, *a.shape[1:]), a.dtype)])

        for name in ("_n", "_d", "_csum", "_ccnt", "_n0", "_d0", "_ring", "_fill", "_head"):
            setattr(self, name, grow(getattr(self, name)))
        self.groups = n
        self._cache = None

    def _bin_codes(self, confidence: np.ndarray | None, rows: int) -> np.ndarray:
        """uint8 bin per (block, position); `bins` marks the pooled stratum (no confidence)."""
        if confidence is None:
            return np.full((rows, self.gamma), self.bins, np.uint8)
        c = np.asarray(confidence, dtype=np.float64)
        if c.shape != (rows, self.gamma):
            raise ValueError(f"confidence has shape {c.shape}, expected ({rows}, {self.gamma})")
        if c.size and (np.fmin.reduce(c, axis=None) < 0 or np.fmax.reduce(c, axis=None) > 1):
            raise ValueError("confidence outside [0, 1]")
        # scaled in place of a copy; NaN (no confidence) goes to the pooled code after the cast
        x = c * self.bins
        np.minimum(x, self.bins - 1, out=x)
        missing = np.isnan(x)
        if missing.any():
            x[missing] = self.bins
        return x.astype(np.uint8)

    def update(
        self,
        group: np.ndarray | int,
        window: np.ndarray,
        accepted: np.ndarray,
        confidence: np.ndarray | None,
    ) -> None:
        """Add blocks: `group`, `window`, `accepted` `[n]` (group may be a scalar)."""
        grp, w, a = self._checked(group, window, accepted, confidence)
        if len(w) == 0:
            return
        # cache-sized slices: the [rows, gamma] temporaries of a large offline fit stay small
        for lo in range(0, len(w), UPDATE_CHUNK):
            sl = slice(lo, lo + UPDATE_CHUNK)
            conf = None if confidence is None else confidence[sl]
            codes = self._bin_codes(conf, len(w[sl]))
            counts = self._counts(grp[sl], w[sl], a[sl], codes, conf, self.groups)
            for total, part in zip(self._state(), counts, strict=True):
                total += part
            self._remember(grp[sl], codes)
        self._cache = None

    def update_steps(self, steps: list[QueuedStep], top: int | None = None) -> None:
        """`update` with the rows of queued steps, in their order: in one compiled pass
        over the steps' own columns where built (the same counts and reservoir), else
        concatenated. `top`: the steps' largest group id, where the caller already had
        the kernels' `validate_steps` refuse bad rows (the estimator checks the same steps
        just before; one pass over them is enough)."""
        kernels = compiled.KERNELS
        if kernels is None:
            grp, w, a = (np.concatenate([s[i] for s in steps]) for i in range(3))
            self.update(grp, w, a, stacked(steps, "confidence", self.gamma))
            return
        if top is None:
            top = kernels.validate_steps(steps, self.gamma)
        self.ensure_groups(top + 1)
        reservoir = (self._ring, self._head, self._fill)
        kernels.count_blocks(steps, self.bins, UPDATE_CHUNK, *self._state(), *reservoir)
        self._cache = None

    def learn_in_batches(
        self,
        batch: np.ndarray,
        group: np.ndarray,
        window: np.ndarray,
        accepted: np.ndarray,
        confidence: np.ndarray | None,
    ) -> HazardModel:
        """`update` with each batch's rows in turn (`batch`: each row's, from 0, never
        decreasing in row order), in one pass; returns the model as it stood before each
        batch, as one model whose group `b * groups + g` is group `g` before batch `b`, for
        its `rates` and `acceptance` (it keeps no reservoir).

        Why: the held-out check's replay over a stored run (`extrapolation_check`) asks the
        model's rates before each of thousands of small batches; a call per batch cost
        most of that replay in numpy's per-call overhead. The counts before each batch are
        the running sums of the batches' counts, taken in the same order as one `update`
        per batch takes them, so every table is the same to the last bit."""
        grp, w, a = self._checked(group, window, accepted, confidence)
        b = np.asarray(batch, dtype=np.int64).reshape(-1)
        if b.shape != w.shape or (len(b) and (b[0] < 0 or (np.diff(b) < 0).any())):
            raise ValueError("batch must be one per row, from 0 and never decreasing")
        nb, n_groups = (int(b[-1]) + 1 if len(b) else 0), self.groups
        # per table: the state, then each batch's counts (a batch of no rows counts 0), added
        # up in place below
        stacked = [np.zeros((nb + 1, *x.shape), x.dtype) for x in self._state()]
        for out, total in zip(stacked, self._state(), strict=True):
            out[0] = total
        # slices of whole batches, about UPDATE_CHUNK rows each: a batch's sums are taken in
        # one pass, as one `update` of the batch takes them
        bounds = np.searchsorted(b, np.arange(nb + 1))
        lo = 0
        while lo < len(w):
            first = int(b[lo])
            last = max(first + 1, int(np.searchsorted(bounds, lo + UPDATE_CHUNK, "right")) - 1)
            sl = slice(lo, int(bounds[last]))
            conf = None if confidence is None else confidence[sl]
            codes = self._bin_codes(conf, sl.stop - lo)
            key = (b[sl] - first) * n_groups + grp[sl]
            counts = self._counts(key, w[sl], a[sl], codes, conf, (last - first) * n_groups)
            for out, part in zip(stacked, counts, strict=True):
                out[first + 1 : last + 1] = part.reshape(last - first, *out.shape[1:])
            self._remember(grp[sl], codes)
            lo = sl.stop
        before = HazardModel(self.gamma, self.bins, self.min_at_risk, reservoir=1)
        before.ensure_groups(nb * n_groups)
        for total, running, name in zip(self._state(), stacked, _STATE, strict=True):
            # the running sums, the state first: exactly the additions of one update a batch
            np.cumsum(running, axis=0, out=running)
            setattr(before, name, running[:-1].reshape(-1, *total.shape[1:]))
            total[...] = running[-1]
        self._cache = None
        return before

    def _checked(self, group, window, accepted, confidence) -> tuple:
        """`update`'s arguments as int64 arrays, refused where they are not blocks."""
        w = np.asarray(window, dtype=np.int64).reshape(-1)
        a = np.asarray(accepted, dtype=np.int64).reshape(-1)
        n = len(w)
        grp = np.broadcast_to(np.asarray(group, dtype=np.int64), (n,))
        if a.shape != (n,):
            raise ValueError(f"accepted has shape {a.shape}, expected ({n},)")
        if n == 0:
            return grp, w, a
        gam = self.gamma
        if (w < 0).any() or (w > gam).any():
            raise ValueError(f"window outside 0..gamma={gam}")
        if (a < 0).any() or (a > w).any():
            raise ValueError("accepted outside 0..window")
        if (grp < 0).any():
            raise ValueError("group ids must be >= 0")
        if confidence is not None and np.shape(confidence) != (n, gam):
            raise ValueError(f"confidence has shape {np.shape(confidence)}, expected ({n}, {gam})")
        self.ensure_groups(int(grp.max()) + 1)
        return grp, w, a

    def _state(self) -> tuple[np.ndarray, ...]:
        """The counts, in `_STATE`'s order."""
        return tuple(getattr(self, name) for name in _STATE)

    def _counts(
        self,
        grp: np.ndarray,
        w: np.ndarray,
        a: np.ndarray,
        codes: np.ndarray,
        confidence: np.ndarray | None,
        groups: int,
    ) -> tuple[np.ndarray, ...]:
        """The blocks' counts over `groups` groups (`grp` below it), in `_STATE`'s order."""
        gam, B, G = self.gamma, self.bins, groups
        # a block is at risk at positions 0..reach-1 (verified, every earlier draft accepted)
        reach = np.minimum(a + 1, w)
        event = a < w
        # unstratified counts from per-block reach: a histogram, then a reverse cumulative sum
        hist = np.bincount(grp * (gam + 1) + reach, minlength=G * (gam + 1)).reshape(G, gam + 1)
        n0 = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]
        # events at a (< w); a block without one lands in a spare column that is dropped
        stop = np.where(event, a, gam)
        d0 = np.bincount(grp * (gam + 1) + stop, minlength=G * (gam + 1)).reshape(G, gam + 1)
        size = G * gam * B
        n = np.zeros((G, gam, B), np.int64)
        d, ccnt, csum = np.zeros_like(n), np.zeros_like(n), np.zeros((G, gam, B))
        pooled = codes == B
        if not pooled.all():
            # one histogram counts both the cell's blocks and those at risk in it: key
            # 2 * (group, position, bin) cell + (at risk), so no masked copy of the cells is
            # made; int32 halves the memory traffic. The positions' part comes from a table
            # row per reach: comparing [n, 1] with [1, gamma] costs numpy a loop per row.
            pair = self._pair_rows.take(reach, axis=0)
            pair += np.minimum(codes, B - 1).astype(np.int32) * 2
            pair += (grp.astype(np.int32) * (2 * gam * B))[:, None]
            cell = pair >> 1
            rows = np.flatnonzero(event)
            if pooled.any():
                strat = ~pooled
                rows = rows[strat[rows, a[rows]]]
                flat_pairs, flat_cells = pair[strat], cell[strat]
                flat_c = np.asarray(confidence, dtype=np.float64)[strat]
            else:  # the usual case: every position has a confidence
                flat_pairs, flat_cells = pair.ravel(), cell.ravel()
                flat_c = np.asarray(confidence, dtype=np.float64).ravel()
            both = np.bincount(flat_pairs, minlength=2 * size).reshape(G, gam, B, 2)
            n = both[..., 1]
            ccnt = both[..., 0] + both[..., 1]
            d = np.bincount(cell[rows, a[rows]], minlength=size).reshape(G, gam, B)
            csum = np.bincount(flat_cells, weights=flat_c, minlength=size).reshape(G, gam, B)
        return n0, d0[:, :gam], n, d, ccnt, csum

    def _remember(self, grp: np.ndarray, codes: np.ndarray) -> None:
        """Each group's newest blocks into its ring, in order: at most two slices (the ring
        wraps once), written by slice rather than by per-row fancy index."""
        present = np.bincount(grp, minlength=self.groups)
        for g in np.flatnonzero(present).tolist():
            mine = (codes if present[g] == len(grp) else np.compress(grp == g, codes, axis=0))[
                -self.reservoir :
            ]
            # blocks older than the reservoir pass over it unwritten: each block lands where
            # it would have, had the rows come one batch at a time
            k = len(mine)
            head = (int(self._head[g]) + int(present[g]) - k) % self.reservoir
            first = min(k, self.reservoir - head)
            self._ring[g, head : head + first] = mine[:first]
            self._ring[g, : k - first] = mine[first:]
            self._head[g] = (head + k) % self.reservoir
            self._fill[g] = min(self._fill[g] + k, self.reservoir)

    # -- hazards -----------------------------------------------------------

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Hazard and from-data flag, `[groups, gamma, bins + 1]`; the last column is pooled."""
        if self._cache is not None:
            return self._cache
        B, m = self.bins, self.min_at_risk
        ident = self._n >= m
        raw = self._d / np.maximum(self._n, 1)
        centre = (np.arange(B) + 0.5) / B
        calibrated = np.where(
            self._ccnt > 0, 1.0 - self._csum / np.maximum(self._ccnt, 1), 1.0 - centre
        )
        strat = np.clip(np.where(ident, raw, calibrated), 0.0, 1.0)

        ident0 = self._n0 >= m
        raw0 = self._d0 / np.maximum(self._n0, 1)
        total_n, total_d = self._n0.sum(axis=1), self._d0.sum(axis=1)
        pooled = np.where(total_n > 0, total_d / np.maximum(total_n, 1), 1.0)
        pos = np.arange(self.gamma)[None, :]
        last = np.maximum.accumulate(np.where(ident0, pos, -1), axis=1)
        carried = np.take_along_axis(raw0, np.maximum(last, 0), axis=1)
        km = np.where(last >= 0, carried, pooled[:, None])

        hazard = np.concatenate([strat, km[:, :, None]], axis=2)
        data = np.concatenate([ident, ident0[:, :, None]], axis=2)
        self._cache = (hazard, data)
        return self._cache

    def _group(self, g: int) -> int:
        if not 0 <= g < self.groups:
            raise KeyError(f"group {g} not seen (groups 0..{self.groups - 1})")
        return g

    def hazards(self, g: int) -> np.ndarray:
        """`[gamma, bins]` conditional rejection probability per position and confidence bin."""
        return self.tables()[0][self._group(g), :, : self.bins].copy()

    def identified(self, g: int) -> np.ndarray:
        """`[gamma, bins]` True where the hazard came from data, False where extrapolated."""
        return self.tables()[1][self._group(g), :, : self.bins].copy()

    def km_hazards(self, g: int) -> np.ndarray:
        """`[gamma]` unstratified Kaplan-Meier hazards (the pooled stratum)."""
        return self.tables()[0][self._group(g), :, self.bins].copy()

    def naive_km(self, g: int) -> np.ndarray:
        """`[gamma]` Kaplan-Meier survival treating trimmed blocks as independently censored."""
        return np.cumprod(1.0 - self.km_hazards(g))

    # -- estimates ---------------------------------------------------------

    def survival(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """`(S [gamma], identifiable [gamma])` over the group's reservoir.

        S is NaN (and nothing identifiable) for a group whose reservoir is empty.
        """
        hazard, data = self.tables()
        g = self._group(g)
        codes = self._ring[g, : self._fill[g]]
        if len(codes) == 0:
            return np.full(self.gamma, np.nan), np.zeros(self.gamma, dtype=bool)
        width = hazard.shape[2]
        offset = (np.arange(self.gamma) * width)[None, :]
        keep, known = (1.0 - hazard[g]).ravel(), data[g].ravel()
        s_sum = np.zeros(self.gamma)
        visits = np.zeros(self.gamma * width, np.int64)  # blocks per (position, bin)
        for lo in range(0, len(codes), UPDATE_CHUNK):
            idx = offset + codes[lo : lo + UPDATE_CHUNK]  # flat (position, bin) per block
            s = keep.take(idx)
            # the running product column by column: the same products as cumprod(axis=1),
            # which loops per row of 7 and costs five times as much
            for j in range(1, self.gamma):
                s[:, j] *= s[:, j - 1]
            s_sum += s.sum(axis=0)
            visits += np.bincount(idx.ravel(), minlength=len(visits))
        s = s_sum / len(codes)
        data_sum = (visits * known).reshape(self.gamma, width).sum(axis=1)
        share = np.cumsum(data_sum / len(codes)) / np.arange(1, self.gamma + 1)
        # S_j rests on every S_i before it: once unidentified, it stays so
        return s, np.logical_and.accumulate(share >= IDENTIFIABLE_SHARE)

    def estimates(self) -> list[dict]:
        """Per group: `survival`, `identifiable`, `mean` (E[ceiling]) and `naive_km`, over
        the group's reservoir (`population_estimates`)."""
        out = []
        for g in range(self.groups):
            s, identifiable = self.survival(g)
            out.append(
                {
                    "survival": s.tolist(),
                    "identifiable": identifiable.tolist(),
                    "mean": float(s.sum()),
                    "naive_km": self.naive_km(g).tolist(),
                }
            )
        return out

    def expected_ceiling(self, g: int) -> float:
        """E[ceiling] = sum_j S_j."""
        return float(self.survival(g)[0].sum())

    def expected_extra(
        self, group_ids: np.ndarray, start: np.ndarray, confidence: np.ndarray | None
    ) -> np.ndarray:
        """`[k]` E[further accepted drafts from `start` on | position `start` reached].

        An `interval.Extrapolate`, so either walk takes it as its extrapolation.
        For a walk that ran out of evidence at `start`: the sum over m >= start of
        prod_{i=start..m} (1 - h[g, i, bin(c_i)]), 0 once start >= gamma. NaN
        confidence entries (or None) use the group's pooled Kaplan-Meier hazard.
        """
        grp = np.asarray(group_ids, dtype=np.int64).reshape(-1)
        k = len(grp)
        st = np.broadcast_to(np.asarray(start, dtype=np.int64), (k,))
        if k == 0:
            return np.zeros(0)
        if (st < 0).any():
            raise ValueError("start positions must be >= 0")
        hazard, _, cell = self._cells(grp, confidence)
        gam = self.gamma
        # position-major [gamma, k], the running product one position row at a time:
        # gamma vector multiplies, where numpy's cumprod along either axis of so short a
        # dimension costs about five times as much
        pos = np.arange(gam)[:, None]
        after = pos >= st[None, :]
        keep = np.where(after, 1.0 - hazard.take(cell), 1.0)
        for j in range(1, gam):
            keep[j] *= keep[j - 1]
        return np.where(after, keep, 0.0).sum(axis=0)

    def rates(
        self, group_ids: np.ndarray, confidence: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`[k, gamma]` each, for each block's own cells: the acceptance rate (1 - hazard),
        whether that hazard was estimated from data (else extrapolated), and the standard
        error of an estimated one (sqrt(h (1 - h) / at risk); 0 where extrapolated)."""
        grp = np.asarray(group_ids, dtype=np.int64).reshape(-1)
        if len(grp) == 0:
            empty = np.zeros((0, self.gamma))
            return empty, empty.astype(bool), empty
        hazard, data, cell = self._cells(grp, confidence)
        at_risk = self.at_risk().take(cell).T
        h, ident = hazard.take(cell).T, data.take(cell).T
        se = np.where(ident, np.sqrt(h * (1.0 - h) / np.maximum(at_risk, 1)), 0.0)
        return 1.0 - h, ident, se

    def acceptance(
        self,
        group_ids: np.ndarray,
        confidence: np.ndarray | None,
        start: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`rates` without the standard errors, which the walks' extrapolation does not
        read: the at-risk table they need costs as much as the rates themselves. With
        `start` (`[k]`), the compiled form looks up only the positions from each block's
        start on (the earlier ones NaN and unidentified): the walks' extrapolation reads
        nothing before it; the numpy form gives every position."""
        grp = np.asarray(group_ids, dtype=np.int64).reshape(-1)
        if len(grp) == 0:
            empty = np.zeros((0, self.gamma))
            return empty, empty.astype(bool)
        kernels = compiled.KERNELS
        if kernels is not None:
            self._ensure_for(grp)
            return kernels.cell_rates(*self.tables(), grp, confidence, start)
        hazard, data, cell = self._cells(grp, confidence)
        return 1.0 - hazard.take(cell).T, data.take(cell).T

    def at_risk(self) -> np.ndarray:
        """`[groups, gamma, bins + 1]` the blocks at risk per cell, the pooled stratum last
        (the tables' layout)."""
        return np.concatenate([self._n, self._n0[:, :, None]], axis=2)

    def _ensure_for(self, grp: np.ndarray) -> None:
        """The state grown to hold groups `grp` (refused where one is negative)."""
        if (grp < 0).any():
            raise ValueError("group ids must be >= 0")
        self.ensure_groups(int(grp.max()) + 1)

    def _cells(
        self, grp: np.ndarray, confidence: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The hazard and from-data tables, and `[gamma, k]` flat indices of each block's
        cell per position (position-major)."""
        self._ensure_for(grp)
        codes = self._bin_codes(confidence, len(grp))
        hazard, data = self.tables()
        gam, width = self.gamma, hazard.shape[2]
        pos = np.arange(gam)[:, None]
        return hazard, data, (grp * (gam * width))[None, :] + pos * width + codes.T


def population_estimates(
    group: np.ndarray,
    window: np.ndarray,
    accepted: np.ndarray,
    confidence: np.ndarray | None,
    gamma: int,
    bins: int = 10,
    min_at_risk: int = 30,
    groups: int = 1,
) -> list[dict]:
    """Offline estimates for groups `0..max(groups - 1, max(group))`, every block in its average.

    Per group: `survival` (S_j = P(ceiling > j)), `identifiable`, `mean`
    (E[ceiling]) and `naive_km`, the unstratified Kaplan-Meier survival, to
    show what treating trimmed blocks as independently censored costs. One
    pass, not one per group, so a large run is read and binned once.
    """
    grp = np.asarray(group, dtype=np.int64).reshape(-1)
    sizes = np.bincount(grp, minlength=groups)
    reservoir = max(1, int(sizes.max()))
    model = HazardModel(gamma, bins=bins, min_at_risk=min_at_risk, reservoir=reservoir)
    model.ensure_groups(len(sizes))
    model.update(grp, window, accepted, confidence)
    return model.estimates()


def population_estimate(
    window: np.ndarray,
    accepted: np.ndarray,
    confidence: np.ndarray | None,
    gamma: int,
    bins: int = 10,
    min_at_risk: int = 30,
) -> dict:
    """`population_estimates` for one population of blocks."""
    w = np.asarray(window, dtype=np.int64).reshape(-1)
    return population_estimates(
        np.zeros(len(w), np.int64), w, accepted, confidence, gamma, bins, min_at_risk
    )[0]

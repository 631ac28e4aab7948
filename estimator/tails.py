"""The tail walk: what full verification would have accepted of a trimmed block.

When compact verification accepts a request's whole window w < gamma, the
drafts beyond it (the tail) were never verified and the ceiling is censored.
Later steps of the same request reveal it: they commit tokens at the tail's
positions, and along the run where the committed tokens equal the tail the
context is the one the tail was drafted in.

- Greedy requests commit the target's argmax, so a tail draft would have been
  accepted exactly when it equals the committed token: the ceiling is w plus the
  matching run, exact once the run ends at a mismatch or the tail is used up.
- Sampled requests accept a draft with probability a = min(1, p/q); along the
  matching run p is the target's log-probability of the (equal) committed token,
  and at the first mismatch it is gathered from that step's verify distribution
  when the source can (`gather`). The expected tail acceptance is the sum of the
  running products of a; positions the walk cannot reach bound it: `lo` takes
  them as rejected, `hi` as accepted, and the point estimate extrapolates them
  with the population model (`extrapolate`).

A request that ends (its slot is reused, or it goes idle) before its block
resolves leaves the block censored: reported as a lower bound, never as exact.

State lives in arrays per (rank, req_pool_index) slot, at most gamma pending
blocks per slot (every step commits at least one token, so a block resolves
within gamma steps); the per-step work is vectorised over the pending blocks of
the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dspark_obs.telemetry import StepBatch

#: `gather(batch_rows, verify_rows, tokens) -> log p` from the step just verified.
Gather = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: `extrapolate(rows_of_blocks, start_position, confidence [k, gamma]) -> expected extra`.
Extrapolate = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

GREEDY, SAMPLED = "greedy", "sampled"


@dataclass
class Outcomes:
    """Blocks that left the walk in one step (columns over blocks)."""

    rid: list = field(default_factory=list)
    columns: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, rid: np.ndarray, **cols: np.ndarray) -> None:
        if len(rid) == 0:
            return
        self.rid.append(rid)
        for k, v in cols.items():
            self.columns.setdefault(k, []).append(np.asarray(v))

    def frame(self) -> dict[str, np.ndarray]:
        if not self.rid:
            return {}
        out = {k: np.concatenate(v) for k, v in self.columns.items()}
        out["rid"] = np.concatenate(self.rid)
        return out


# packed per-block scalars (exact in float64: positions, counts and ids stay far below 2**53)
OPEN_PREFIX, NEXT_POS, WINDOW, OPEN_FCT, GROUP, GREEDY, PROD, LO_EXTRA, VAR_TERMS = range(9)
_FIELDS = 9


class _RankSlots:
    """Pending blocks of one rank: slot = SGLang's req_pool_index, gamma blocks per slot.

    Block b = slot * gamma + m; its scalars are one row of `scal` and its drafted
    row (tokens, draft log-probs, calibrated confidence) rows of `tail`, `q_lp`,
    `conf`, so a step gathers each with one `take`.
    """

    def __init__(self, gamma: int, capacity: int = 64) -> None:
        self.gamma = gamma
        self.capacity = 0
        self.grow(capacity)

    def grow(self, capacity: int) -> None:
        g, old = self.gamma, self.capacity
        if capacity <= old:
            return

        def extend(name, shape, fill, dtype):
            new = np.full((capacity, *shape), fill, dtype=dtype)
            if old:
                new[:old] = getattr(self, name)
            setattr(self, name, new)

        extend("rid", (), None, object)
        extend("expect", (), -1, np.int64)
        extend("last_seen", (), 0, np.int64)
        extend("active", (g,), False, bool)
        extend("scal", (g, _FIELDS), 0.0, np.float64)
        extend("tail", (g, g), 0, np.int64)
        extend("q_lp", (g, g), np.nan, np.float64)
        extend("conf", (g, g), np.nan, np.float64)
        self.capacity = capacity

    def flat(self, name: str) -> np.ndarray:
        arr = getattr(self, name)
        return arr.reshape(self.capacity * self.gamma, *arr.shape[2:])


class TailWalker:
    """Opens a block per trimmed request-step and walks pending blocks every step.

    `assume_greedy` decides for rows whose source does not say (SGLang dumps):
    None skips them, True or False treats them as greedy or sampled.
    """

    def __init__(
        self, gamma: int, *, assume_greedy: bool | None = None, idle_steps: int = 4096
    ) -> None:
        self.gamma = gamma
        self.assume_greedy = assume_greedy
        self.idle_steps = idle_steps
        self.ranks: dict[int, _RankSlots] = {}
        self.steps = 0
        self.skipped = 0  # trimmed blocks no walk can follow (unknown sampling, no log-probs)
        self.opened = 0
        # rows of the last step that opened a walk, or were trimmed but could not
        self.opened_rows = np.zeros(0, dtype=bool)
        self.skipped_rows = np.zeros(0, dtype=bool)

    def pending(self) -> int:
        return int(sum(r.active.sum() for r in self.ranks.values()))

    def step(
        self,
        batch: StepBatch,
        group: np.ndarray,
        gather: Gather | None = None,
        extrapolate: Extrapolate | None = None,
    ) -> dict[str, np.ndarray]:
        """Fold one validated step in; returns the blocks that resolved or were censored."""
        out = Outcomes()
        self.steps += 1
        if not batch.has_reqs or batch.num_reqs == 0 or batch.draft_tokens is None:
            return out.frame()
        g = self.gamma
        slots = self.ranks.get(batch.rank)
        if slots is None:
            slots = self.ranks[batch.rank] = _RankSlots(g)
        pool = batch.req_pool_index
        if pool.max() >= slots.capacity:
            slots.grow(max(2 * slots.capacity, int(pool.max()) + 1))
        prefix, cl = batch.prefix_len, batch.correct_drafts
        # a slot continues its request only when the rid and the expected position agree
        same = (slots.rid[pool] == batch.rid) & (slots.expect[pool] == prefix)
        if not same.all():
            lost = pool[~same]
            self._censor(slots, lost, out, extrapolate, batch.forward_ct)
            slots.rid[lost] = batch.rid[~same]
        n = len(pool)
        realized = np.empty((n, g + 1), np.int64)
        realized[:, :g] = batch.draft_tokens
        rows = np.arange(n)
        realized[rows, cl] = batch.bonus_token
        realized_lp = np.full((n, g + 1), np.nan)
        if batch.target_logprobs is not None:
            realized_lp[:, :g] = batch.target_logprobs
        realized_lp[rows, cl] = batch.bonus_logprob
        self._open(batch, slots, pool, group)
        self._walk(batch, slots, pool, realized, realized_lp, gather, extrapolate, out)
        slots.expect[pool] = prefix + cl + 1
        slots.last_seen[pool] = self.steps
        if self.steps % 256 == 0:
            self._evict_idle(out, extrapolate, batch.forward_ct)
        return out.frame()

    def _greedy_rows(self, batch: StepBatch) -> np.ndarray:
        flag = batch.greedy.astype(np.int8)
        if self.assume_greedy is not None:
            flag = np.where(flag < 0, np.int8(self.assume_greedy), flag)
        return flag

    def _open(
        self, batch: StepBatch, slots: _RankSlots, pool: np.ndarray, group: np.ndarray
    ) -> None:
        g = self.gamma
        w, a = batch.window, batch.correct_drafts
        trimmed = (a == w) & (w < g)
        greedy = self._greedy_rows(batch)
        logprobs = batch.draft_logprobs is not None and batch.target_logprobs is not None
        can_walk = (greedy == 1) | ((greedy == 0) & logprobs)
        self.skipped_rows = trimmed & ~can_walk
        self.opened_rows = trimmed & can_walk
        self.skipped += int(np.count_nonzero(self.skipped_rows))
        rows = np.flatnonzero(self.opened_rows)
        if len(rows) == 0:
            return
        s = pool[rows]
        free = np.argmin(slots.active[s], axis=1)
        full = slots.active[s, free]
        if full.any():  # cannot happen with gamma slots per request; never overwrite silently
            self.skipped += int(full.sum())
            self.skipped_rows[rows[full]] = True
            self.opened_rows[rows[full]] = False
            rows, s, free = rows[~full], s[~full], free[~full]
        self.opened += len(rows)
        fi = s * g + free
        slots.active[s, free] = True
        scal = np.zeros((len(rows), _FIELDS))
        scal[:, OPEN_PREFIX] = batch.prefix_len[rows]
        scal[:, NEXT_POS] = batch.prefix_len[rows] + w[rows]
        scal[:, WINDOW] = w[rows]
        scal[:, OPEN_FCT] = batch.forward_ct
        scal[:, GROUP] = group[rows]
        scal[:, GREEDY] = greedy[rows]
        scal[:, PROD] = 1.0
        slots.flat("scal")[fi] = scal
        slots.flat("tail")[fi] = batch.draft_tokens[rows]
        slots.flat("q_lp")[fi] = (
            np.nan if batch.draft_logprobs is None else batch.draft_logprobs[rows]
        )
        slots.flat("conf")[fi] = np.nan if batch.confidence is None else batch.confidence[rows]

    def _walk(
        self,
        batch: StepBatch,
        slots: _RankSlots,
        pool: np.ndarray,
        realized: np.ndarray,
        realized_lp: np.ndarray,
        gather: Gather | None,
        extrapolate: Extrapolate | None,
        out: Outcomes,
    ) -> None:
        g = self.gamma
        r, m = np.nonzero(slots.active[pool])
        if len(r) == 0:
            return
        fi = pool[r] * g + m
        st = np.take(slots.flat("scal"), fi, axis=0)
        open_prefix = st[:, OPEN_PREFIX].astype(np.int64)
        next_pos = st[:, NEXT_POS].astype(np.int64)
        start_j = next_pos - open_prefix  # draft index of the next tail token
        k = np.arange(g + 1)
        idx = (next_pos - batch.prefix_len[r])[:, None] + k  # index into this step's tokens
        j = start_j[:, None] + k
        valid = (idx <= batch.correct_drafts[r][:, None]) & (j < g)
        idx = np.minimum(idx, g)
        j = np.minimum(j, g - 1)
        kk = np.arange(len(r))[:, None] * g
        tail = np.take(np.take(slots.flat("tail"), fi, axis=0), kk + j)
        flat_real = r[:, None] * (g + 1) + idx
        match = (tail == np.take(realized, flat_real)) & valid
        run = np.cumprod(match, axis=1).sum(axis=1)
        n_valid = valid.sum(axis=1)
        diverged = run < n_valid
        end_j = start_j + run
        done = diverged | (end_j >= g)

        greedy = st[:, GREEDY] == 1
        n_eval = run.copy()
        prod, lo_extra, var_terms = st[:, PROD], st[:, LO_EXTRA], st[:, VAR_TERMS]
        sampled = np.flatnonzero(~greedy)
        if len(sampled):
            p_lp = np.take(realized_lp, flat_real[sampled])
            div = np.flatnonzero(diverged[sampled])
            if len(div):
                at = run[sampled[div]]
                known = np.full(len(div), np.nan)
                if gather is not None:
                    known = gather(r[sampled[div]], idx[sampled[div], at], tail[sampled[div], at])
                p_lp[div, at] = known
                n_eval[sampled[div]] += np.isfinite(known)
            q = np.take(
                np.take(slots.flat("q_lp"), fi[sampled], axis=0), kk[: len(sampled)] + j[sampled]
            )
            evaluated = k[None, :] < n_eval[sampled, None]
            a = np.where(evaluated, np.exp(np.minimum(p_lp - q, 0.0)), 1.0)
            cum = prod[sampled, None] * np.cumprod(a, axis=1)
            tail_pos = j[sampled] - st[sampled, WINDOW][:, None] + 1  # 1-based within the tail
            lo_extra[sampled] += np.where(evaluated, cum, 0.0).sum(axis=1)
            var_terms[sampled] += np.where(evaluated, (2 * tail_pos - 1) * cum, 0.0).sum(axis=1)
            prod[sampled] = cum[:, -1]

        scal = slots.flat("scal")
        keep = ~done
        st[:, NEXT_POS] = next_pos + n_valid
        scal[fi[keep]] = st[keep]
        fin = np.flatnonzero(done)
        if len(fin):
            self._emit(
                slots,
                fi[fin],
                st[fin],
                out,
                extrapolate,
                batch.forward_ct,
                censored=False,
                reached=start_j[fin] + n_eval[fin],
                exact=end_j[fin],
            )
            slots.active.reshape(-1)[fi[fin]] = False

    def _emit(
        self,
        slots: _RankSlots,
        fi: np.ndarray,
        st: np.ndarray,
        out: Outcomes,
        extrapolate: Extrapolate | None,
        fct: int,
        *,
        censored: bool,
        reached: np.ndarray,
        exact: np.ndarray | None,
    ) -> None:
        """Ceilings in accepted drafts: (lo, point, hi) per block and its status."""
        g = self.gamma
        window = st[:, WINDOW].astype(np.int64)
        greedy = st[:, GREEDY] == 1
        group = st[:, GROUP].astype(np.int64)
        prod, lo_extra = st[:, PROD], st[:, LO_EXTRA]
        remaining = g - reached
        if extrapolate is not None:
            extra = extrapolate(group, reached, np.take(slots.flat("conf"), fi, axis=0))
        else:
            extra = 0.5 * remaining
        # greedy: the matched run is certain; sampled: the running products of a
        lo = np.where(greedy, reached, window + lo_extra).astype(np.float64)
        reach_prob = np.where(greedy, 1.0, prod)
        hi = lo + reach_prob * remaining
        point = lo + reach_prob * np.minimum(extra, remaining)
        var = np.where(greedy, 0.0, np.maximum(st[:, VAR_TERMS] - lo_extra**2, 0.0))
        if exact is not None:  # a greedy walk that ended inside the tail is exact
            ex = greedy & ~censored
            lo, hi, point = (np.where(ex, exact, v) for v in (lo, hi, point))
        out.add(
            slots.rid[fi // g],
            open_fct=st[:, OPEN_FCT].astype(np.int64),
            resolved_fct=np.full(len(fi), fct, dtype=np.int64),
            group=group,
            window=window,
            greedy=greedy,
            status=np.full(len(fi), 2 if censored else 1, dtype=np.int8),  # 1 resolved, 2 censored
            lo=lo,
            point=point,
            hi=hi,
            var=var,
        )

    def _censor(
        self,
        slots: _RankSlots,
        pool: np.ndarray,
        out: Outcomes,
        extrapolate: Extrapolate | None,
        fct: int,
    ) -> None:
        r, m = np.nonzero(slots.active[pool])
        if len(r) == 0:
            return
        fi = pool[r] * self.gamma + m
        st = np.take(slots.flat("scal"), fi, axis=0)
        reached = (st[:, NEXT_POS] - st[:, OPEN_PREFIX]).astype(np.int64)
        self._emit(slots, fi, st, out, extrapolate, fct, censored=True, reached=reached, exact=None)
        slots.active.reshape(-1)[fi] = False

    def _evict_idle(self, out: Outcomes, extrapolate: Extrapolate | None, fct: int) -> None:
        for slots in self.ranks.values():
            idle = np.flatnonzero(
                slots.active.any(axis=1) & (slots.last_seen < self.steps - self.idle_steps)
            )
            if len(idle):
                self._censor(slots, idle, out, extrapolate, fct)
                slots.rid[idle] = None
                slots.expect[idle] = -1

    def close(self, extrapolate: Extrapolate | None = None) -> dict[str, np.ndarray]:
        """Censor every block still pending (the source ended)."""
        out = Outcomes()
        for slots in self.ranks.values():
            busy = np.flatnonzero(slots.active.any(axis=1))
            self._censor(slots, busy, out, extrapolate, -1)
        return out.frame()

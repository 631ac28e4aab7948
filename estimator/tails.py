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
  with the population model (`extrapolate`, an `interval.Extrapolate`).

A block follows its request by rid: mostly through its slot (`req_pool_index`),
where the request usually stays, and by rid where the request left the slot
(SGLang retracts requests under memory pressure and re-admits them later,
often into another slot, with steps between where they are absent). A request
that leaves its slot parks its open blocks in `away`, a rid -> chain of block ids;
the first later step showing that rid on the block's rank takes them back. Only
missing tokens censor a block before it resolves: the request shows up at a
prefix that does not continue the one it left, or never again (idle for
`idle_steps`, or the source ends). A censored block is reported as a lower bound,
never as exact. Rows without a rid (None) keep the slot keying: another request
in the slot censors their blocks, an empty slot lets them wait there.

Cost. A block is walked, vectorised with every other block its rank has in
the step, at each step its request appears in: from the opening step on (its
first tail position holds that step's bonus) until the first mismatch or the
end of the tail. Most blocks resolve at once (the bonus differs from the first
tail draft), so only a few stay open, and only their rows are looked at
later; the sampled walk's single gather per block happens at the step that
committed the mismatching position, while its verify distributions exist, so
the walk needs no history of committed tokens. Settled blocks wait and are
emitted together every `walk_every` steps, where the population model's
extrapolation runs once for all of them. The per-step pass runs in C
(`_tailwalk.c`) where it was built: vectorised, it is ~50 numpy calls a step
on arrays of a few hundred elements, which cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

import numpy as np

from dspark_obs.telemetry import StepBatch

# the per-step pass in C (see _tailwalk.c); the numpy form below where it did not build or
# DSPARK_OBS_NO_EXTENSIONS switches it off
from .compiled import KERNELS as _tailwalk
from .interval import (
    Extrapolate,
    acceptance_log_ratio,
    block_interval,
    extrapolated_parts,
    point_range,
    reach_all_variance,
    running_sums,
)

#: `gather(batch_rows, verify_rows, tokens) -> log p` from the step just verified.
Gather = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# block state, packed in one float64 row (exact: positions, counts, ids and forward_cts stay
# below 2**53), so that taking, updating and settling a set of blocks is one indexing each
(
    OPEN_PREFIX,  # the opening step's prefix length: tail draft j sits at OPEN_PREFIX + j
    WINDOW,
    OPEN_FCT,
    GROUP,
    GREEDY,  # 1 greedy, 0 sampled
    RANK,
    POOL,  # the request's req_pool_index on its rank
    NEXT,  # the next tail index to compare; once settled, the position the walk reached
    EXPECT,  # the prefix length the request's next step must have
    SEEN,  # the walker step that last walked the block (idle timeout)
    CUM,  # sampled: running product of the acceptance ratios so far
    LO_EXTRA,  # sampled: sum of the running products (expected accepted tail drafts)
    VAR_TERMS,  # sampled: sum of (2m - 1) times the running product at tail draft m
    RESOLVED_FCT,
    CENSORED,
    AWAY,  # 1 while the request is not in the block's slot: the block waits in `away`
    LINK,  # while away: the next block id of the rid's chain (-1: the last)
) = range(17)
_FIELDS = 17  # _tailwalk.c names the same fields in this order (tests/test_tails.py)
N_FREE, N_SETTLED = 0, 1  # the counters' entries, as _tailwalk.c has them


def _grown(arr: np.ndarray, size: int, fill) -> np.ndarray:
    new = np.full((size, *arr.shape[1:]), fill, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


class TailWalker:
    """Opens a block per trimmed request-step and walks it as its request's steps arrive.

    `assume_greedy` decides for rows whose source does not say (SGLang dumps):
    None skips them, True or False treats them as greedy or sampled. A block
    whose request comes back at a prefix that does not continue it, or has not
    appeared for `idle_steps` steps, is censored; one whose request moved slot
    walks on from the new one. A request that left its slot and is not seen again for
    `away_steps` steps most likely finished (SGLang's own block-accept recorder drops a
    request's pending blocks after as many idle steps): its blocks are censored then,
    so finished requests do not hold blocks for the whole `idle_steps`.
    `compiled` picks the per-step pass: C where it built (None, the default) or numpy
    (False); both give the same blocks.
    """

    def __init__(
        self,
        gamma: int,
        *,
        assume_greedy: bool | None = None,
        idle_steps: int = 4096,
        away_steps: int = 1024,
        walk_every: int = 32,
        compiled: bool | None = None,
    ) -> None:
        if compiled and _tailwalk is None:
            raise RuntimeError(
                "the compiled tail walker is not built in this install (or switched off)"
            )
        self.compiled = _tailwalk is not None if compiled is None else compiled
        g = self.gamma = gamma
        self.assume_greedy = assume_greedy
        self.idle_steps = idle_steps
        self.away_steps = away_steps
        self.walk_every = walk_every
        self.steps = 0
        self.skipped = 0  # trimmed blocks no walk can follow (unknown sampling, no log-probs)
        self.opened = 0
        self.opened_rows = np.zeros(0, dtype=bool)
        self.skipped_rows = np.zeros(0, dtype=bool)
        self._j = np.arange(g)
        self.first_rank: int | None = None
        self.one_rank = True  # every step so far from `first_rank`: no rank filter needed
        # open blocks, in a pool whose free ids sit on a stack
        self.blk_live = np.zeros(0, dtype=bool)
        self.blk = np.zeros((0, _FIELDS))
        self.blk_rid = np.zeros(0, dtype=object)
        self.blk_tail = np.zeros((0, g), dtype=np.int64)
        self.blk_q = np.zeros((0, g))
        self.blk_conf = np.zeros((0, g))
        self.free_blk = np.zeros(0, dtype=np.int64)  # a stack: ids [0, n_free) are free
        # [N_FREE, N_SETTLED]: free ids, blocks in the settled buffers (`n_free`, `set_count`)
        self._counters = np.zeros(2, dtype=np.int64)
        self.row_of = np.zeros(0, dtype=np.int64)  # req_pool_index -> row of the current step
        # rid -> the first id of a chain (through LINK) of blocks whose request left its slot
        self.away: dict = {}
        # settled blocks waiting for the next emission: (state rows, rids, confidence)
        self.settled: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # the compiled pass settles into these buffers instead; `settle` empties them first
        self.set_f = np.zeros((0, _FIELDS))
        self.set_rid = np.zeros(0, dtype=object)
        self.set_conf = np.zeros((0, g))
        # compiled: the arrays above bound in C (`_tailwalk.Pool`); None once one of them
        # is replaced, bound again before the next step
        self._pool = None

    @property
    def n_free(self) -> int:
        """Free ids in the pool: `free_blk[:n_free]`."""
        return int(self._counters[N_FREE])

    @n_free.setter
    def n_free(self, value: int) -> None:
        self._counters[N_FREE] = value

    @property
    def set_count(self) -> int:
        """Blocks the compiled pass has settled into `set_f`, `set_rid`, `set_conf`."""
        return int(self._counters[N_SETTLED])

    @set_count.setter
    def set_count(self, value: int) -> None:
        self._counters[N_SETTLED] = value

    def pending(self) -> int:
        return int(np.count_nonzero(self.blk_live))

    def _reserve(self, n: int) -> None:
        """Grow the pool until `n` ids are free (the new ids go under the free ones)."""
        if self.n_free >= n:
            return
        old = len(self.blk_live)
        size = max(2 * old, old + n, 256)
        self.blk_live = _grown(self.blk_live, size, False)
        self.blk = _grown(self.blk, size, 0.0)
        self.blk_rid = _grown(self.blk_rid, size, None)
        self.blk_tail = _grown(self.blk_tail, size, 0)
        self.blk_q = _grown(self.blk_q, size, np.nan)
        self.blk_conf = _grown(self.blk_conf, size, np.nan)
        free = np.empty(size, dtype=np.int64)
        added = size - old
        free[:added] = np.arange(size - 1, old - 1, -1)
        free[added : added + self.n_free] = self.free_blk[: self.n_free]
        self.free_blk, self.n_free = free, added + self.n_free
        self._pool = None

    def _new_blocks(self, n: int) -> np.ndarray:
        self._reserve(n)
        ids = self.free_blk[self.n_free - n : self.n_free][::-1].copy()
        self.n_free -= n
        self.blk_live[ids] = True
        return ids

    # -- per step -------------------------------------------------------------

    def step(
        self,
        batch: StepBatch,
        group: np.ndarray,
        gather: Gather | None = None,
        extrapolate: Extrapolate | None = None,
    ) -> dict[str, np.ndarray]:
        """Walk one validated step; every `walk_every` steps, emit the blocks settled so far."""
        self.steps += 1
        n = batch.num_reqs
        if batch.has_reqs and n and batch.draft_tokens is not None:
            if self.first_rank is None:
                self.first_rank = batch.rank
            self.one_rank &= batch.rank == self.first_rank
            # every open block's slot came from a step; the last entry stays -1, so that a
            # row without a slot (-1) never continues a block
            top = int(batch.req_pool_index.max()) + 1
            if top >= len(self.row_of):
                self.row_of = _grown(self.row_of, max(top + 1, 2 * len(self.row_of), 64), -1)
                self._pool = None
            if self.compiled:
                self._advance_compiled(batch, group, gather)
            else:
                self._advance(batch, group, gather)
        else:
            self.opened_rows = self.skipped_rows = np.zeros(n, dtype=bool)
        if self.steps % self.walk_every:
            return {}
        return self.settle(extrapolate, batch.forward_ct)

    def _advance_compiled(self, batch: StepBatch, group: np.ndarray, gather: Gather | None) -> None:
        """The same pass as `_advance`, in C: a loop over the step's blocks costs less
        than numpy's per-call overhead on arrays this small. The pool's arrays are bound
        once (`_bind`); a step passes only itself."""
        self._reserve(batch.num_reqs)
        cap = len(self.blk_live)
        if len(self.set_f) < self.set_count + cap:
            size = max(2 * len(self.set_f), self.set_count + cap)
            self.set_f = _grown(self.set_f, size, 0.0)
            self.set_rid = _grown(self.set_rid, size, None)
            self.set_conf = _grown(self.set_conf, size, np.nan)
            self._pool = None
        pool = self._pool if self._pool is not None else self._bind()
        gathers, n_done, opened, skipped, n_opened, n_skipped = pool.advance(
            batch, group, self.steps, self.one_rank
        )
        self.opened_rows, self.skipped_rows = opened, skipped
        self.opened += n_opened
        self.skipped += n_skipped
        if n_done == 0:
            return
        try:
            logp = None
            if gathers is not None and gather is not None:
                # the first mismatch of each sampled block: the target's log-prob of its tail
                # draft
                logp = np.ascontiguousarray(gather(*gathers), np.float64)
            pool.finish(logp)
        except BaseException:
            pool.abandon()  # the step's done blocks leave the pool, censored
            raise

    def _bind(self):
        """Binds the walker's arrays to a new compiled pool (after any of them grew)."""
        self._pool = _tailwalk.Pool(
            self.gamma,
            -1 if self.assume_greedy is None else int(self.assume_greedy),
            self._counters,
            self.blk,
            self.blk_live,
            self.blk_rid,
            self.blk_tail,
            self.blk_q,
            self.blk_conf,
            self.free_blk,
            self.row_of,
            self.set_f,
            self.set_rid,
            self.set_conf,
            self.away,
        )
        return self._pool

    def _advance(self, batch: StepBatch, group: np.ndarray, gather: Gather | None) -> None:
        """Walk the open blocks this step continues and the ones it opens, in one pass.

        A new block enters the pool only if its opening step leaves it open, so
        the common block (resolved by its own bonus) is never stored. (Row
        gathers use `take`, which numpy does far faster than fancy indexing of
        2-D arrays at these sizes.)
        """
        ids, rows = self._continuing(batch)
        new_rows, f_new = self._open(batch, group)
        k = len(ids)
        if k + len(new_rows) == 0:
            return
        new_tail = batch.draft_tokens.take(new_rows, axis=0)
        draft_q = batch.draft_logprobs
        new_q = np.full(new_tail.shape, np.nan) if draft_q is None else draft_q.take(new_rows, 0)
        if k:
            f = np.concatenate([self.blk.take(ids, axis=0), f_new])
            tail = np.concatenate([self.blk_tail.take(ids, axis=0), new_tail])
            q = np.concatenate([self.blk_q.take(ids, axis=0), new_q])
            rows = np.concatenate([rows, new_rows])
        else:
            f, tail, q, rows = f_new, new_tail, new_q, new_rows
        done = self._walk(batch, f, tail, q, rows, gather)
        fct = batch.forward_ct
        if k:
            self.blk[ids] = f[:k]
            old_done = done[:k].nonzero()[0]
            if len(old_done):
                self._settle_ids(ids[old_done], fct, censored=False)
        if len(new_rows) == 0:
            return
        f, done = f[k:], done[k:]
        conf = batch.confidence
        new_conf = np.full(new_tail.shape, np.nan) if conf is None else conf.take(new_rows, 0)
        fin = done.nonzero()[0]
        if len(fin):
            settled = f.take(fin, axis=0)
            settled[:, RESOLVED_FCT] = fct
            self.settled.append(
                (settled, batch.rid.take(new_rows[fin]), new_conf.take(fin, axis=0))
            )
        if len(fin) < len(done):
            stay = (~done).nonzero()[0]
            ids = self._new_blocks(len(stay))
            self.blk[ids] = f.take(stay, axis=0)
            self.blk_rid[ids] = batch.rid.take(new_rows[stay])
            self.blk_tail[ids] = new_tail.take(stay, axis=0)
            self.blk_q[ids] = new_q.take(stay, axis=0)
            self.blk_conf[ids] = new_conf.take(stay, axis=0)

    def _continuing(self, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
        """Open blocks whose request is in this step, and their rows.

        Through the slot first; a block whose request is not there leaves for `away`
        (a rid-less one waits in its slot, or is censored by another request there),
        and `_returning` takes back the ones whose rid this step shows.
        """
        live = self.blk_live & (self.blk[:, AWAY] == 0)
        if not self.one_rank:
            live &= self.blk[:, RANK] == batch.rank
        ids = rows = live.nonzero()[0]
        if len(ids):
            f = self.blk.take(ids, axis=0)
            pool = batch.req_pool_index
            self.row_of[pool] = np.arange(len(pool))
            self.row_of[-1] = -1  # a slotless row (-1) wrote there
            rows = self.row_of.take(f[:, POOL].astype(np.int64))
            self.row_of[pool] = -1
            rid = self.blk_rid.take(ids)
            here = rows >= 0
            same = here & (batch.rid.take(rows) == rid)
            cont = same & (batch.prefix_len.take(rows) == f[:, EXPECT])
            leave = ~same & np.not_equal(rid, None)
            censor = here & ~cont & ~leave
            if np.count_nonzero(censor):
                self._settle_ids(ids[censor], batch.forward_ct, censored=True)
            if np.count_nonzero(leave):
                self._leave(ids[leave])
            ids, rows = ids[cont], rows[cont]
        if self.away:
            back, back_rows = self._returning(batch)
            if len(back):
                ids, rows = np.concatenate([ids, back]), np.concatenate([rows, back_rows])
        return ids, rows

    def _leave(self, ids: np.ndarray) -> None:
        """Park blocks whose request left its slot, chained under their rid."""
        for b, rid in zip(ids.tolist(), self.blk_rid.take(ids).tolist(), strict=True):
            self.blk[b, LINK] = self.away.get(rid, -1)
            self.away[rid] = b
        self.blk[ids, AWAY] = 1

    def _returning(self, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
        """Parked blocks whose rid this step shows on their rank, and their rows.

        One dictionary lookup per row; only the rows that find a chain (requests
        back from elsewhere, a few per step) walk it. A block whose request comes back
        at a prefix that does not continue it is censored: tokens are missing.
        """
        rids = batch.rid.tolist()
        heads = np.fromiter(map(self.away.get, rids, repeat(-1)), np.int64, len(rids))
        back, back_rows, lost = [], [], []
        for r in np.flatnonzero(heads >= 0).tolist():
            b = self.away.get(rids[r], -1)  # a rid twice in one step: the first row took it
            keep = []
            while b >= 0:
                f = self.blk[b]
                if f[RANK] != batch.rank:
                    keep.append(b)
                elif batch.prefix_len[r] == f[EXPECT]:
                    back.append(b)
                    back_rows.append(r)
                else:
                    lost.append(b)
                b = int(f[LINK])
            self._chain(rids[r], keep)
        back_ids = np.array(back, dtype=np.int64)
        rows = np.array(back_rows, dtype=np.int64)
        self.blk[back_ids, AWAY] = 0
        self.blk[back_ids, POOL] = batch.req_pool_index.take(rows)
        if lost:
            lost_ids = np.array(lost, dtype=np.int64)
            self.blk[lost_ids, AWAY] = 0
            self._settle_ids(lost_ids, batch.forward_ct, censored=True)
        return back_ids, rows

    def _chain(self, rid, ids: list[int]) -> None:
        """Make `ids` the rid's chain in `away` (none: the rid leaves it)."""
        if not ids:
            self.away.pop(rid, None)
            return
        self.away[rid] = ids[0]
        self.blk[ids, LINK] = [*ids[1:], -1]

    def _greedy_rows(self, batch: StepBatch) -> np.ndarray:
        flag = batch.greedy.astype(np.int8)
        if self.assume_greedy is not None:
            flag = np.where(flag < 0, np.int8(self.assume_greedy), flag)
        return flag

    def _open(self, batch: StepBatch, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows that open a block, and the blocks' initial state."""
        g = self.gamma
        w, a = batch.window, batch.accepted
        trimmed = (a == w) & (w < g)
        greedy = self._greedy_rows(batch)
        logprobs = batch.draft_logprobs is not None and batch.target_logprobs is not None
        can_walk = (greedy == 1) | ((greedy == 0) & logprobs)
        self.opened_rows = trimmed & can_walk
        self.skipped_rows = trimmed & ~can_walk
        self.skipped += np.count_nonzero(self.skipped_rows)
        rows = self.opened_rows.nonzero()[0]
        self.opened += len(rows)
        # filled field by field in a [fields, blocks] array, whose rows are contiguous
        f = np.zeros((_FIELDS, len(rows)))
        f[OPEN_PREFIX] = batch.prefix_len.take(rows)
        f[WINDOW] = f[NEXT] = w.take(rows)
        f[OPEN_FCT] = batch.forward_ct
        f[GROUP] = group.take(rows)
        f[GREEDY] = greedy.take(rows)
        f[RANK] = batch.rank
        f[POOL] = batch.req_pool_index.take(rows)
        f[CUM] = 1.0
        return rows, f.T

    def _walk(
        self,
        batch: StepBatch,
        f: np.ndarray,
        tail: np.ndarray,
        q: np.ndarray,
        rows: np.ndarray,
        gather: Gather | None,
    ) -> np.ndarray:
        """Compare the blocks' tails with what their rows committed in this step.

        Updates the block states `f` in place; returns which blocks resolved.
        Along the short position axis numpy's cumulative and reducing ufuncs
        cost a loop per block, so the run's end is an argmin (and the running
        products, `interval.running_sums`, a triangular matrix product in log space).
        """
        g, j = self.gamma, self._j
        k = len(rows)
        prefix, a = batch.prefix_len.take(rows), batch.accepted.take(rows)
        # tail draft j sits at offset j - (prefix - open prefix) of the row's committed tokens
        off = (f[:, OPEN_PREFIX] - prefix)[:, None] + j
        ahead = j >= f[:, NEXT][:, None]
        committed_here = ahead & (off <= a[:, None])
        row_base = np.arange(0, k * (g + 1), g + 1)
        flat = row_base[:, None] + np.maximum(off, 0).astype(np.int64)
        bonus_at = row_base + a
        tok = np.empty((k, g + 1), np.int64)
        tok[:, :g] = batch.draft_tokens.take(rows, axis=0)
        tok.ravel()[bonus_at] = batch.bonus_token.take(rows)
        match = committed_here & (tok.take(flat) == tail)
        # the run ends at the first position at or past NEXT that is not a match (g: none)
        stops = np.ones((k, g + 1), dtype=bool)
        stops[:, :g] = ahead & ~match
        run_end = stops.argmax(axis=1)
        at = np.minimum(run_end, g - 1)
        mismatch = (run_end < g) & committed_here.ravel().take(np.arange(0, k * g, g) + at)
        sampled = f[:, GREEDY] == 0
        reached = run_end
        if np.count_nonzero(sampled):
            evaluated = match & (j < run_end[:, None]) & sampled[:, None]
            lp = np.full((k, g + 1), np.nan)
            if batch.target_logprobs is not None:
                lp[:, :g] = batch.target_logprobs.take(rows, axis=0)
            lp.ravel()[bonus_at] = batch.bonus_logprob.take(rows)
            p = lp.take(flat)
            div = (mismatch & sampled).nonzero()[0]
            if gather is not None and len(div):
                # the first mismatch: the target's log-prob of the tail draft, from this step
                d_at = at[div]
                got = np.asarray(
                    gather(rows[div], off[div, d_at].astype(np.int64), tail[div, d_at])
                )
                known = ~np.isnan(got)  # -inf: the target excludes the draft, a ratio of 0
                div, d_at = div[known], d_at[known]
                p[div, d_at] = got[known]
                evaluated[div, d_at] = True
                reached = run_end + np.bincount(div, minlength=k)
            cum, lo_extra, var_terms = running_sums(
                acceptance_log_ratio(p, q), evaluated, f[:, WINDOW], f[:, CUM]
            )
            f[:, LO_EXTRA] += lo_extra
            f[:, VAR_TERMS] += var_terms
            f[:, CUM] = cum
        f[:, NEXT] = reached
        f[:, EXPECT] = prefix + a + 1
        f[:, SEEN] = self.steps
        return mismatch | (run_end >= g)

    # -- settling -------------------------------------------------------------

    def _settle_ids(self, ids: np.ndarray, fct: int, *, censored: bool) -> None:
        f = self.blk.take(ids, axis=0)
        if np.count_nonzero(f[:, AWAY]):
            self._unpark(ids[f[:, AWAY] == 1])
        f[:, RESOLVED_FCT] = fct
        f[:, CENSORED] = censored
        self.settled.append((f, self.blk_rid.take(ids), self.blk_conf.take(ids, axis=0)))
        self.blk_live[ids] = False
        self.blk_rid[ids] = None
        self.free_blk[self.n_free : self.n_free + len(ids)] = ids
        self.n_free += len(ids)

    def _unpark(self, ids: np.ndarray) -> None:
        """Take parked blocks (idle, or the source ended) out of their rids' chains."""
        gone = set(ids.tolist())
        for rid in set(self.blk_rid.take(ids).tolist()):
            chain, b = [], self.away.get(rid, -1)
            while b >= 0:
                chain.append(b)
                b = int(self.blk[b, LINK])
            self._chain(rid, [b for b in chain if b not in gone])

    def settle(
        self, extrapolate: Extrapolate | None, fct: int, *, final: bool = False
    ) -> dict[str, np.ndarray]:
        """Censor idle blocks (all, when `final`), then emit every block settled so far."""
        if final:
            stale = self.blk_live
        else:
            seen = self.blk[:, SEEN]
            away = self.blk[:, AWAY] == 1
            stale = self.blk_live & (
                (seen < self.steps - self.idle_steps)
                | (away & (seen < self.steps - self.away_steps))
            )
        ids = np.flatnonzero(stale)
        if len(ids):
            self._settle_ids(ids, fct, censored=True)
        return self.emit_settled(extrapolate)

    def emit_settled(self, extrapolate: Extrapolate | None) -> dict[str, np.ndarray]:
        """Every block settled so far, resolved or censored. Also called between the
        `walk_every` steps (a metrics snapshot), so that once the source goes quiet every
        ended walk is counted live, not only when the source ends."""
        chunks, self.settled = self.settled, []
        c, self.set_count = self.set_count, 0
        if c:
            # the compiled pass's buffers are read in place (`_emit` copies what it keeps;
            # the rids are copied here, as the buffer's slots are reused)
            chunks.insert(0, (self.set_f[:c], self.set_rid[:c].copy(), self.set_conf[:c]))
        if not chunks:
            return {}
        if len(chunks) == 1:
            return self._emit(*chunks[0], extrapolate)
        return self._emit(
            np.concatenate([c[0] for c in chunks]),
            np.concatenate([c[1] for c in chunks]),
            np.concatenate([c[2] for c in chunks]),
            extrapolate,
        )

    def _emit(
        self, f: np.ndarray, rid: np.ndarray, conf: np.ndarray, extrapolate: Extrapolate | None
    ) -> dict[str, np.ndarray]:
        """Ceilings in accepted drafts: (lo, point, hi) per block and its status."""
        g = self.gamma
        window = f[:, WINDOW].astype(np.int64)
        greedy = f[:, GREEDY] == 1
        group = f[:, GROUP].astype(np.int64)
        censored = f[:, CENSORED] == 1
        reached = f[:, NEXT].astype(np.int64)
        # a greedy walk that ended inside the tail is exact: nothing past it can count
        unreached = np.where(greedy & ~censored, 0, g - reached)
        extra, extra_lo, extra_hi, unidentified = extrapolated_parts(
            extrapolate, group, reached, conf, unreached
        )
        if self.compiled:
            names = ("lo", "point", "hi", "var", "point_lo", "point_hi", "unidentified", "var_hi")
            ceilings = _tailwalk.block_ceilings(
                np.ascontiguousarray(f), extra, extra_lo, extra_hi, unidentified, unreached
            )
            interval = dict(zip(names, ceilings, strict=True))
        else:
            interval = _ceilings(
                f, window, greedy, reached, unreached, extra, extra_lo, extra_hi, unidentified
            )
        return {
            "open_fct": f[:, OPEN_FCT].astype(np.int64),
            "resolved_fct": f[:, RESOLVED_FCT].astype(np.int64),
            "group": group,
            "window": window,
            "greedy": greedy,
            "status": np.where(censored, 2, 1).astype(np.int8),  # 1 resolved, 2 censored
            **interval,
            "rid": rid,
        }

    def close(self, extrapolate: Extrapolate | None = None) -> dict[str, np.ndarray]:
        """Settle everything: the source ended, so unresolved blocks are censored."""
        return self.settle(extrapolate, -1, final=True)


def _ceilings(
    f: np.ndarray,
    window: np.ndarray,
    greedy: np.ndarray,
    reached: np.ndarray,
    unreached: np.ndarray,
    extra: np.ndarray,
    extra_lo: np.ndarray,
    extra_hi: np.ndarray,
    unidentified: np.ndarray,
) -> dict[str, np.ndarray]:
    """The settled blocks' ceilings in numpy (the compiled `block_ceilings` is the same
    arithmetic, block by block)."""
    # greedy: the matched run is certain (each ratio 1, so the running products sum to
    # its length r, and (2m - 1) times them to r ** 2); sampled: the walk's sums
    run = (reached - window).astype(np.float64)
    reach_prob = np.where(greedy, 1.0, f[:, CUM])
    interval = block_interval(
        window,
        np.where(greedy, run, f[:, LO_EXTRA]),
        np.where(greedy, run**2, f[:, VAR_TERMS]),
        reach_prob,
        unreached,
        extra,
    )
    interval.update(
        point_range(interval["lo"], reach_prob, unreached, extra_lo, extra_hi, unidentified)
    )
    interval["var_hi"] = reach_all_variance(
        interval["var"], interval["lo"] - window, reach_prob, run, unreached
    )
    return interval

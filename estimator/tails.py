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

A request that ends (its slot shows another rid or a discontinuous position, or
it goes idle) before its block resolves leaves the block censored: reported as
a lower bound, never as exact.

Cost. Per step the walker only notes: which request instance each row is,
the trimmed blocks (popped from a free stack, never searched for), and (in
band) the verify log-probabilities of the few sampled tails whose positions
this step verified, while the step's distributions exist. The committed
tokens are written into the requests' history rings, and the comparison runs,
every `walk_every` steps over all pending steps and blocks at once, so numpy's
per-call overhead is paid per walk, not per step. A request instance (its history) lives
until its last block is settled, so a slot reused by the next request never
overwrites what an unsettled block still needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dspark_obs.telemetry import StepBatch

#: `gather(batch_rows, verify_rows, tokens) -> log p` from the step just verified.
Gather = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: `extrapolate(groups, start_position, confidence [k, gamma]) -> expected further acceptance`.
Extrapolate = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# block scalars, packed (exact in float64: positions, counts and ids stay far below 2**53)
OPEN_PREFIX, WINDOW, OPEN_FCT, GROUP, GREEDY, INSTANCE = range(6)
_FIELDS = 6


@dataclass
class Outcomes:
    """Blocks that left the walk (columns over blocks)."""

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


def _grown(arr: np.ndarray, size: int, fill) -> np.ndarray:
    new = np.full((size, *arr.shape[1:]), fill, dtype=arr.dtype)
    new[: len(arr)] = arr
    return new


class TailWalker:
    """Opens a block per trimmed request-step; settles pending blocks every `walk_every` steps.

    `assume_greedy` decides for rows whose source does not say (SGLang dumps):
    None skips them, True or False treats them as greedy or sampled.
    """

    def __init__(
        self,
        gamma: int,
        *,
        assume_greedy: bool | None = None,
        idle_steps: int = 4096,
        walk_every: int = 16,
    ) -> None:
        g = self.gamma = gamma
        self.assume_greedy = assume_greedy
        self.idle_steps = idle_steps
        self.walk_every = walk_every
        # a block needs the history from its tail's first position; between walks a request
        # commits at most gamma + 1 tokens a step
        self.horizon = (walk_every + 2) * (g + 1) + g
        self.steps = 0
        self.skipped = 0  # trimmed blocks no walk can follow (unknown sampling, no log-probs)
        self.opened = 0
        self.opened_rows = np.zeros(0, dtype=bool)
        self.skipped_rows = np.zeros(0, dtype=bool)
        self.slots: dict[int, np.ndarray] = {}  # rank -> instance id per req_pool_index
        # request instances: their committed-token history
        self.inst_live = np.zeros(0, dtype=bool)
        self.inst_rid = np.zeros(0, dtype=object)
        self.inst_expect = np.zeros(0, dtype=np.int64)
        self.inst_ended = np.zeros(0, dtype=bool)
        self.inst_seen = np.zeros(0, dtype=np.int64)
        self.hist_tok = np.zeros((0, self.horizon), dtype=np.int64)
        self.hist_lp = np.zeros((0, self.horizon))
        # blocks
        self.blk_live = np.zeros(0, dtype=bool)
        self.blk = np.zeros((0, _FIELDS))
        self.blk_tail = np.zeros((0, g), dtype=np.int64)
        self.blk_q = np.zeros((0, g))
        self.blk_conf = np.zeros((0, g))
        self.blk_p = np.zeros((0, g))  # gathered target log-prob of each tail token
        self.free_inst = np.zeros(0, dtype=np.int64)  # stacks of free ids
        self.free_blk = np.zeros(0, dtype=np.int64)
        self.gathering = np.zeros(0, dtype=np.int64)  # sampled blocks a later step may verify
        self.row_of = np.zeros(0, dtype=np.int64)  # instance -> row of the current step, or -1
        self.unrecorded: list[tuple[StepBatch, np.ndarray]] = []  # steps not yet in history

    def pending(self) -> int:
        return int(np.count_nonzero(self.blk_live))

    # -- allocation ---------------------------------------------------------

    def _new_instances(self, n: int) -> np.ndarray:
        if len(self.free_inst) < n:
            old = len(self.inst_live)
            size = max(2 * old, old + n, 64)
            self.inst_live = _grown(self.inst_live, size, False)
            self.inst_rid = _grown(self.inst_rid, size, None)
            self.inst_expect = _grown(self.inst_expect, size, -1)
            self.inst_ended = _grown(self.inst_ended, size, False)
            self.inst_seen = _grown(self.inst_seen, size, 0)
            self.hist_tok = _grown(self.hist_tok, size, -1)
            self.hist_lp = _grown(self.hist_lp, size, np.nan)
            self.row_of = _grown(self.row_of, size, -1)
            self.free_inst = np.concatenate([np.arange(size - 1, old - 1, -1), self.free_inst])
        ids = self.free_inst[len(self.free_inst) - n :][::-1]
        self.free_inst = self.free_inst[: len(self.free_inst) - n]
        self.inst_live[ids] = True
        self.inst_ended[ids] = False
        return ids

    def _new_blocks(self, n: int) -> np.ndarray:
        if len(self.free_blk) < n:
            old = len(self.blk_live)
            size = max(2 * old, old + n, 256)
            self.blk_live = _grown(self.blk_live, size, False)
            self.blk = _grown(self.blk, size, 0.0)
            self.blk_tail = _grown(self.blk_tail, size, 0)
            self.blk_q = _grown(self.blk_q, size, np.nan)
            self.blk_conf = _grown(self.blk_conf, size, np.nan)
            self.blk_p = _grown(self.blk_p, size, np.nan)
            self.free_blk = np.concatenate([np.arange(size - 1, old - 1, -1), self.free_blk])
        ids = self.free_blk[len(self.free_blk) - n :][::-1]
        self.free_blk = self.free_blk[: len(self.free_blk) - n]
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
        """Record one validated step; every `walk_every` steps, settle what can be settled."""
        self.steps += 1
        n = batch.num_reqs
        if batch.has_reqs and n and batch.draft_tokens is not None:
            inst = self._instances(batch)
            self.inst_expect[inst] = batch.prefix_len + batch.correct_drafts + 1
            self.inst_seen[inst] = self.steps
            self.unrecorded.append((batch, inst))
            self._open(batch, inst, group)
            if gather is not None:  # also the block just opened: its first tail position
                self._gather(batch, inst, gather)  # is where this step drew the bonus
        else:
            self.opened_rows = self.skipped_rows = np.zeros(n, dtype=bool)
        if self.steps % self.walk_every:
            return {}
        return self.settle(extrapolate, batch.forward_ct)

    def _instances(self, batch: StepBatch) -> np.ndarray:
        """The request instance of every row: the slot's, or a new one when the request changed."""
        pool = batch.req_pool_index
        slots = self.slots.get(batch.rank)
        if slots is None or pool.max() >= len(slots):
            size = max(int(pool.max()) + 1, 2 * (0 if slots is None else len(slots)), 64)
            slots = self.slots[batch.rank] = _grown(
                np.zeros(0, np.int64) if slots is None else slots, size, -1
            )
        inst = slots[pool]
        known = inst >= 0
        same = known.copy()
        same[known] = (self.inst_rid[inst[known]] == batch.rid[known]) & (
            self.inst_expect[inst[known]] == batch.prefix_len[known]
        )
        if not same.all():
            changed = np.flatnonzero(~same)
            self.inst_ended[inst[changed][known[changed]]] = True
            ids = self._new_instances(len(changed))
            self.inst_rid[ids] = batch.rid[changed]
            slots[pool[changed]] = ids
            inst[changed] = ids
        return inst

    def _record(self) -> None:
        """Write the pending steps' committed tokens into their requests' history rings.

        Each step's tokens go to distinct ring slots of its instance (the ring
        holds more positions than `walk_every` steps can commit), and instance
        ids are only reused after a walk, so the steps can be written at once.
        """
        steps, self.unrecorded = self.unrecorded, []
        if not steps:
            return
        g, h = self.gamma, self.horizon
        inst = np.concatenate([i for _, i in steps])
        cl = np.concatenate([b.correct_drafts for b, _ in steps])
        prefix = np.concatenate([b.prefix_len for b, _ in steps])
        n = len(inst)
        rows = np.arange(n)
        tok = np.empty((n, g + 1), np.int64)
        tok[:, :g] = np.concatenate([b.draft_tokens for b, _ in steps])
        tok[rows, cl] = np.concatenate([b.bonus_token for b, _ in steps])
        lp = np.full((n, g + 1), np.nan)
        lp[:, :g] = np.concatenate(
            [
                np.full((b.num_reqs, g), np.nan) if b.target_logprobs is None else b.target_logprobs
                for b, _ in steps
            ]
        )
        lp[rows, cl] = np.concatenate([b.bonus_logprob for b, _ in steps])
        valid = np.arange(g + 1) <= cl[:, None]
        flat = (inst[:, None] * h + (prefix[:, None] + np.arange(g + 1)) % h)[valid]
        self.hist_tok.reshape(-1)[flat] = tok[valid]
        self.hist_lp.reshape(-1)[flat] = lp[valid]

    def _greedy_rows(self, batch: StepBatch) -> np.ndarray:
        flag = batch.greedy.astype(np.int8)
        if self.assume_greedy is not None:
            flag = np.where(flag < 0, np.int8(self.assume_greedy), flag)
        return flag

    def _open(self, batch: StepBatch, inst: np.ndarray, group: np.ndarray) -> None:
        g = self.gamma
        w, a = batch.window, batch.correct_drafts
        trimmed = (a == w) & (w < g)
        greedy = self._greedy_rows(batch)
        logprobs = batch.draft_logprobs is not None and batch.target_logprobs is not None
        can_walk = (greedy == 1) | ((greedy == 0) & logprobs)
        self.opened_rows = trimmed & can_walk
        self.skipped_rows = trimmed & ~can_walk
        self.skipped += int(np.count_nonzero(self.skipped_rows))
        rows = np.flatnonzero(self.opened_rows)
        if len(rows) == 0:
            return
        self.opened += len(rows)
        ids = self._new_blocks(len(rows))
        fields = np.empty((len(rows), _FIELDS))
        fields[:, OPEN_PREFIX] = batch.prefix_len[rows]
        fields[:, WINDOW] = w[rows]
        fields[:, OPEN_FCT] = batch.forward_ct
        fields[:, GROUP] = group[rows]
        fields[:, GREEDY] = greedy[rows]
        fields[:, INSTANCE] = inst[rows]
        self.blk[ids] = fields
        self.blk_tail[ids] = batch.draft_tokens[rows]
        self.blk_q[ids] = np.nan if batch.draft_logprobs is None else batch.draft_logprobs[rows]
        self.blk_conf[ids] = np.nan if batch.confidence is None else batch.confidence[rows]
        self.blk_p[ids] = np.nan
        sampled = ids[greedy[rows] == 0]
        if len(sampled):
            self.gathering = np.concatenate([self.gathering, sampled])

    def _gather(self, batch: StepBatch, inst: np.ndarray, gather: Gather) -> None:
        """Target log-probs of pending sampled tail tokens at this step's verified positions.

        Only the first mismatch needs one (matched positions use the committed
        token's), but the walk runs later, when this step's distributions are gone.
        """
        cand = self.gathering
        if len(cand) == 0:
            return
        g = self.gamma
        f = self.blk[cand]
        cinst = f[:, INSTANCE].astype(np.int64)
        tail_end = f[:, OPEN_PREFIX].astype(np.int64) + g  # one past the last drafted position
        # a block is done gathering once it settled or its request moved past the tail
        keep = self.blk_live[cand] & (self.inst_expect[cinst] < tail_end)
        self.row_of[inst] = np.arange(len(inst))
        rows = self.row_of[cinst]
        self.row_of[inst] = -1
        self.gathering = cand[keep]
        here = (rows >= 0) & self.blk_live[cand]
        if not here.any():
            return
        live, rows, f = cand[here], rows[here], f[here]
        j = np.arange(g)
        offset = (f[:, OPEN_PREFIX].astype(np.int64) - batch.prefix_len[rows])[:, None] + j
        want = (j >= f[:, WINDOW][:, None]) & (offset >= 0)
        want &= offset <= batch.correct_drafts[rows][:, None]
        b, jj = np.nonzero(want)
        if len(b):
            self.blk_p[live[b], jj] = gather(rows[b], offset[b, jj], self.blk_tail[live[b], jj])

    # -- settling -------------------------------------------------------------

    def settle(
        self, extrapolate: Extrapolate | None, fct: int, *, final: bool = False
    ) -> dict[str, np.ndarray]:
        """Walk every pending block against its request's history; emit the settled ones."""
        out = Outcomes()
        self._record()
        idle = self.inst_live & (self.inst_seen < self.steps - self.idle_steps)
        self.inst_ended |= idle | (self.inst_live & final)
        live = np.flatnonzero(self.blk_live)
        if len(live):
            self._walk(live, extrapolate, fct, out)
        # instances that ended and hold no pending block are free again
        held = np.zeros(len(self.inst_live), dtype=bool)
        held[self.blk[self.blk_live, INSTANCE].astype(np.int64)] = True
        done = self.inst_live & self.inst_ended & ~held
        self.inst_live[done] = False
        self.inst_rid[done] = None
        self.free_inst = np.concatenate([self.free_inst, np.flatnonzero(done)])
        for slots in self.slots.values():
            known = slots >= 0
            slots[known & done[np.maximum(slots, 0)]] = -1
        return out.frame()

    def _walk(
        self, live: np.ndarray, extrapolate: Extrapolate | None, fct: int, out: Outcomes
    ) -> None:
        g, h = self.gamma, self.horizon
        f = self.blk[live]
        inst = f[:, INSTANCE].astype(np.int64)
        op = f[:, OPEN_PREFIX].astype(np.int64)
        w = f[:, WINDOW].astype(np.int64)
        j = np.arange(g)
        pos = op[:, None] + j
        in_tail = j >= w[:, None]
        seen = pos < self.inst_expect[inst][:, None]
        flat = inst[:, None] * h + pos % h
        realized = np.take(self.hist_tok, flat)
        tail = self.blk_tail[live]
        match = (tail == realized) & seen
        run_end = np.cumprod(match | ~in_tail, axis=1).sum(axis=1)  # draft index after the run
        at = np.minimum(run_end, g - 1)
        rows = np.arange(len(live))
        diverged = (run_end < g) & seen[rows, at]
        resolved = diverged | (run_end >= g)
        ended = self.inst_ended[inst]
        settle = resolved | ended
        if not settle.any():
            return
        greedy = f[:, GREEDY] == 1
        reached = run_end.copy()
        lo_extra = np.zeros(len(live))
        var_terms = np.zeros(len(live))
        prod = np.ones(len(live))
        sampled = np.flatnonzero(settle & ~greedy)
        if len(sampled):
            sl = live[sampled]
            p = np.take(self.hist_lp, flat[sampled])
            p_div = self.blk_p[sl, at[sampled]]
            dv = diverged[sampled] & np.isfinite(p_div)
            p[dv, at[sampled][dv]] = p_div[dv]
            end = run_end[sampled] + dv
            reached[sampled] = end
            evaluated = in_tail[sampled] & (j < end[:, None])
            a = np.where(evaluated, np.exp(np.minimum(p - self.blk_q[sl], 0.0)), 1.0)
            cum = np.cumprod(a, axis=1)
            lo_extra[sampled] = np.where(evaluated, cum, 0.0).sum(axis=1)
            tail_pos = j - w[sampled, None] + 1  # 1-based within the tail
            var_terms[sampled] = np.where(evaluated, (2 * tail_pos - 1) * cum, 0.0).sum(axis=1)
            prod[sampled] = cum[:, -1]
        fin = np.flatnonzero(settle)
        self._emit(
            live[fin],
            f[fin],
            out,
            extrapolate,
            fct,
            censored=~resolved[fin],
            reached=reached[fin],
            prod=prod[fin],
            lo_extra=lo_extra[fin],
            var_terms=var_terms[fin],
        )
        self.blk_live[live[fin]] = False
        self.free_blk = np.concatenate([self.free_blk, live[fin]])

    def _emit(
        self,
        ids: np.ndarray,
        f: np.ndarray,
        out: Outcomes,
        extrapolate: Extrapolate | None,
        fct: int,
        *,
        censored: np.ndarray,
        reached: np.ndarray,
        prod: np.ndarray,
        lo_extra: np.ndarray,
        var_terms: np.ndarray,
    ) -> None:
        """Ceilings in accepted drafts: (lo, point, hi) per block and its status."""
        g = self.gamma
        window = f[:, WINDOW].astype(np.int64)
        greedy = f[:, GREEDY] == 1
        group = f[:, GROUP].astype(np.int64)
        remaining = g - reached
        exact = greedy & ~censored  # a greedy walk that ended inside the tail
        if extrapolate is not None:
            # only blocks with something left to extrapolate ask the model
            extra = np.zeros(len(ids))
            need = np.flatnonzero(~exact & (remaining > 0))
            if len(need):
                extra[need] = extrapolate(group[need], reached[need], self.blk_conf[ids[need]])
        else:
            extra = 0.5 * remaining
        # greedy: the matched run is certain; sampled: the running products of a
        lo = np.where(greedy, reached, window + lo_extra).astype(np.float64)
        reach_prob = np.where(greedy, 1.0, prod)
        hi = lo + reach_prob * remaining
        point = lo + reach_prob * np.minimum(extra, remaining)
        hi = np.where(exact, lo, hi)
        point = np.where(exact, lo, point)
        var = np.where(greedy, 0.0, np.maximum(var_terms - lo_extra**2, 0.0))
        out.add(
            self.inst_rid[f[:, INSTANCE].astype(np.int64)],
            open_fct=f[:, OPEN_FCT].astype(np.int64),
            resolved_fct=np.full(len(ids), fct, dtype=np.int64),
            group=group,
            window=window,
            greedy=greedy,
            status=np.where(censored, 2, 1).astype(np.int8),  # 1 resolved, 2 censored
            lo=lo,
            point=point,
            hi=hi,
            var=var,
        )

    def close(self, extrapolate: Extrapolate | None = None) -> dict[str, np.ndarray]:
        """Settle everything: the source ended, so unresolved blocks are censored."""
        return self.settle(extrapolate, -1, final=True)

"""The hook's device pass in torch: the form the Triton kernel is held to, block for block.

It runs where the kernel cannot (CPU tensors, no Triton) and in the tests. Per
step it fills one packed block (`step_layout`): the step's columns, the
log-probabilities the estimator needs and nothing more (target rows inside each
sampled request's window, its bonus row, draft rows only for the trimmed tails of
sampled requests), and the tail walk's gathers.

The tail table mirrors what the estimator's walker (`estimator/tails.py`, whose numpy
form is the tail walk's definition: tests/test_pack_walk.py holds this walk to it) keeps
for sampled blocks, keyed by `req_pool_index` instead of rid: each step compares every
open tail of a request's slot with the tokens the step commits, and where a tail
first differs it reads the target's log-probability of the tail's draft from this
step's verify row, the one read the walker cannot do later. A tail whose slot shows
a prefix that does not continue it is dropped, as the walker censors it; a value
gathered for a tail the walker no longer has is never wrong, only unused, because
it is a function of (row, offset, token) alone, which the consumer matches.
"""

from __future__ import annotations

from .observed_step import ObservedStep
from .step_layout import StepLayout


class TorchPacker:
    by_address = False
    writes_stamp = False

    def __init__(self, layout: StepLayout, pool_slots: int, device) -> None:
        import torch

        self.layout = layout
        self.pool_slots = pool_slots
        g, e = layout.gamma, layout.entries
        i64 = dict(dtype=torch.int64, device=device)
        self.live = torch.zeros((pool_slots, e), dtype=torch.bool, device=device)
        self.open_prefix = torch.zeros((pool_slots, e), **i64)
        self.next = torch.zeros((pool_slots, e), **i64)
        self.expect = torch.zeros((pool_slots, e), **i64)
        self.born = torch.zeros((pool_slots, e), **i64)
        self.tail = torch.zeros((pool_slots, e, g), **i64)
        self.steps = 0

    def pack(self, step: ObservedStep, seq: int, stream: int, out, out_at: int) -> None:
        """Fill `out[:bs]` (`out` a [max_bs, width] float64 tensor, on any device) with this
        step: the packer protocol (`submit.Packer`). Torch enqueues on the current stream,
        which `stream` is, and writes by tensor, so `seq` and `out_at` are not needed."""
        import torch

        from .token_logprobs import token_logprobs

        lay, g, bs = self.layout, self.layout.gamma, step.bs
        self.steps += 1
        dev = step.draft.device
        c = lay.columns
        i64 = torch.int64

        def vec(t, dtype=i64):
            return t.reshape(-1)[:bs].to(dtype)

        draft = step.draft[:bs].to(i64)
        w = (
            vec(step.verify_lens) - 1
            if step.verify_lens is not None
            else torch.full((bs,), g, dtype=i64, device=dev)
        )
        a = vec(step.accepted)
        bonus = vec(step.bonus)
        prefix = vec(step.prefix)
        pool = vec(step.pool)
        greedy = vec(step.greedy, torch.bool)
        sampled = ~greedy
        temps = vec(step.temperature, torch.float32)
        o = torch.full((bs, lay.width), float("nan"), dtype=torch.float64, device=dev)
        o[:, lay.col("window")] = w.double()
        o[:, lay.col("accepted")] = a.double()
        o[:, lay.col("committed")] = vec(step.committed, torch.float64)
        o[:, lay.col("cap_trim")] = vec(step.cap_trim, torch.float64)
        o[:, lay.col("bonus")] = bonus.double()
        o[:, lay.col("prefix")] = prefix.double()
        o[:, lay.col("pool")] = pool.double()
        o[:, lay.col("greedy")] = greedy.double()
        o[:, lay.col("temperature")] = temps.double()
        o[:, c["draft"]] = draft.double()
        if step.confidence is not None:
            o[:, c["confidence"]] = step.confidence[:bs].reshape(bs, g).double()
        if step.confidence_raw is not None:
            o[:, c["confidence_raw"]] = step.confidence_raw[:bs].reshape(bs, g).double()

        gathers = self._walk_tails(draft, w, a, bonus, prefix, pool, sampled)
        g_off, g_tok, evicted = gathers
        o[:, lay.col("evicted")] = evicted.double()
        o[:, c["gather_offset"]] = g_off.double()
        o[:, c["gather_token"]] = torch.where(g_off >= 0, g_tok, -1).double()

        j = torch.arange(g, device=dev)
        target = step.target_logits
        if target is not None:
            # target rows: each sampled request's drafts inside its window, its bonus, and
            # every tail's first mismatch
            b_t, j_t = (sampled[:, None] & (j[None, :] < w[:, None])).nonzero(as_tuple=True)
            b_b = sampled.nonzero(as_tuple=True)[0]
            b_g, k_g = (g_off >= 0).nonzero(as_tuple=True)
            rows = torch.cat([j_t, a[b_b], g_off[b_g, k_g]]) + torch.cat([b_t, b_b, b_g]) * (g + 1)
            toks = torch.cat([draft[b_t, j_t], bonus[b_b], g_tok[b_g, k_g]])
            lp = token_logprobs(target, rows, toks, temps[torch.cat([b_t, b_b, b_g])]).double()
            n_t, n_b = len(b_t), len(b_b)
            tlp = o[:, c["target_logprob"]]
            tlp[b_t, j_t] = lp[:n_t]
            o[:, c["target_logprob"]] = tlp
            o[b_b, lay.col("bonus_logprob")] = lp[n_t : n_t + n_b]
            glp = o[:, c["gather_logprob"]]
            glp[b_g, k_g] = lp[n_t + n_b :]
            o[:, c["gather_logprob"]] = glp
        # draft rows: the tails of trimmed sampled requests
        tails = sampled[:, None] & ((a == w) & (w < g))[:, None] & (j[None, :] >= w[:, None])
        dlp = o[:, c["draft_logprob"]]
        if step.greedy_draft:
            dlp[tails] = 0.0  # an argmax draft: q is one-hot at the drafted token
        elif step.draft_logits is not None:
            b_d, j_d = tails.nonzero(as_tuple=True)
            logits = step.draft_logits[:bs].reshape(bs * g, -1)
            d_temps = vec(step.draft_temperature, torch.float32)[b_d]
            dlp[b_d, j_d] = token_logprobs(logits, b_d * g + j_d, draft[b_d, j_d], d_temps).double()
        o[:, c["draft_logprob"]] = dlp
        out[:bs].copy_(o)

    def _walk_tails(self, draft, w, a, bonus, prefix, pool, sampled):
        """Walk the slot's open tails and this step's new one; returns each request's
        gathers (offset or -1, token) [bs, entries + 1] and whether a tail was evicted."""
        import torch

        g, e = self.layout.gamma, self.layout.entries
        bs = draft.shape[0]
        dev = draft.device
        slot_ok = (pool >= 0) & (pool < self.pool_slots)
        p = pool.clamp(0, self.pool_slots - 1)
        old_live = self.live[p] & slot_ok[:, None]
        # a tail whose slot does not continue it is dropped (the walker censors it)
        old_live &= self.expect[p] == prefix[:, None]
        opens = sampled & (a == w) & (w < g) & slot_ok
        live = torch.cat([old_live, opens[:, None]], 1)
        open_prefix = torch.cat([self.open_prefix[p], prefix[:, None]], 1)
        nxt = torch.cat([self.next[p], w[:, None]], 1)
        tail = torch.cat([self.tail[p], draft[:, None, :]], 1)
        j = torch.arange(g, device=dev)
        # tail draft j sits at offset j - (prefix - start) of the tokens this step commits
        off = (open_prefix - prefix[:, None])[:, :, None] + j
        ahead = j >= nxt[:, :, None]
        committed_here = ahead & (off <= a[:, None, None])
        commit_tok = torch.cat([draft, torch.zeros_like(draft[:, :1])], 1)
        commit_tok.scatter_(1, a[:, None], bonus[:, None])
        tok = commit_tok.gather(1, off.clamp(0, g).reshape(bs, -1)).reshape(off.shape)
        match = committed_here & (tok == tail)
        stops = torch.cat([ahead & ~match, torch.ones_like(match[:, :, :1])], 2)
        run_end = stops.to(torch.int8).argmax(2)
        at = run_end.clamp(max=g - 1)[:, :, None]
        mismatch = live & (run_end < g) & committed_here.gather(2, at)[:, :, 0]
        g_off = torch.where(mismatch, off.gather(2, at)[:, :, 0], -1)
        g_tok = tail.gather(2, at)[:, :, 0]
        still = live & ~mismatch & (run_end < g)
        # write back: the old entries, then the new tail into a free entry (or the oldest)
        keep = still[:, :e]
        new = still[:, e]
        free = ~keep
        has_free = free.any(1)
        slot_e = torch.where(has_free, free.to(torch.int8).argmax(1), self.born[p].argmin(1))
        evicted = new & ~has_free
        rows = slot_ok.nonzero(as_tuple=True)[0]
        pr = p[rows]
        self.live[pr] = keep[rows]
        self.next[pr] = run_end[rows, :e]
        self.expect[pr] = (prefix + a + 1)[rows, None].expand(-1, e)
        n = (new & slot_ok).nonzero(as_tuple=True)[0]
        pn, en = p[n], slot_e[n]
        self.live[pn, en] = True
        self.open_prefix[pn, en] = prefix[n]
        self.next[pn, en] = run_end[n, e]
        self.born[pn, en] = self.steps
        self.tail[pn, en] = draft[n]
        return g_off, g_tok, evicted

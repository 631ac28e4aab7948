"""The hook's device pass as one Triton kernel: a step packed in one launch.

The same numbers as the torch form (`pack_torch.py`, the definition), but in
one launch over a (request, row) grid, because the serving thread can afford a
launch or two per step and the torch form takes dozens. Program (b, r) for r <= gamma
owns target row r of request b; for r > gamma, draft row r - gamma - 1. A program
reads its logit row once, only where a number needs it (a sampled request's row
inside its window, its bonus row, a tail's first mismatch; a draft row only inside
a trimmed sampled request's tail), keeps an online maximum and sum of exponentials,
and picks every token it owes from that one pass. Program (b, 0) also writes the
request's columns and walks its slot's tails.

The tail table is double-buffered per slot, with the step that wrote each half:
every program of a request reads the half written last before this step, and
program (b, 0) writes the other one, so no program of the launch sees a
half-written state (programs of different requests never share a slot).
"""

from __future__ import annotations

from .observed_step import ObservedStep
from .step_layout import StepLayout

BLOCK, NUM_WARPS = 8192, 8


class TritonPacker:
    def __init__(self, layout: StepLayout, pool_slots: int, device) -> None:
        import torch

        self.kernel = _kernel()  # ImportError without Triton: the caller falls back
        self.layout = layout
        self.pool_slots = pool_slots
        g, e = layout.gamma, layout.entries
        i64 = dict(dtype=torch.int64, device=device)
        self.t_live = torch.zeros((pool_slots, 2, e), dtype=torch.int8, device=device)
        self.t_start = torch.zeros((pool_slots, 2, e), **i64)
        self.t_next = torch.zeros((pool_slots, 2, e), **i64)
        self.t_expect = torch.zeros((pool_slots, 2, e), **i64)
        self.t_born = torch.zeros((pool_slots, 2, e), **i64)
        self.t_tail = torch.zeros((pool_slots, 2, e, g), **i64)
        self.t_stamp = torch.tensor([[-1, -2]], **i64).repeat(pool_slots, 1)
        self.dummy = torch.zeros(1, dtype=torch.float32, device=device)
        if layout.columns != kernel_columns(g, e):
            raise ValueError("the packed step's layout is not the one the kernel writes")
        self.gp2 = max(2, 1 << (g - 1).bit_length())
        self.ep2 = max(2, 1 << e.bit_length())  # entries + 1 (the new tail) fit

    def pack(self, step: ObservedStep, out, stamp, seq: int) -> None:
        """Enqueue the pass: `out[:bs]` filled, the table advanced, `stamp[0] = seq`."""
        g, bs = self.layout.gamma, step.bs
        d = self.dummy
        target, draft_logits = step.target_logits, step.draft_logits
        conf, raw, vlen = step.confidence, step.confidence_raw, step.verify_lens
        self.kernel[(bs, 2 * g + 1)](
            out, stamp, seq, step.draft, step.draft.stride(0),
            d if vlen is None else vlen, step.accepted, step.committed, step.cap_trim,
            step.bonus, step.prefix, step.pool, step.greedy, step.temperature,
            step.draft_temperature,
            d if conf is None else conf, 0 if conf is None else conf.stride(0),
            d if raw is None else raw, 0 if raw is None else raw.stride(0),
            d if target is None else target, 0 if target is None else target.stride(0),
            0 if target is None else target.shape[-1],
            d if draft_logits is None else draft_logits,
            0 if draft_logits is None else draft_logits.stride(0),
            0 if draft_logits is None else draft_logits.stride(1),
            0 if draft_logits is None else draft_logits.shape[-1],
            self.t_live, self.t_start, self.t_next, self.t_expect, self.t_born, self.t_tail,
            self.t_stamp, self.pool_slots,
            G=g, GP2=self.gp2, E=self.layout.entries, EP2=self.ep2, WIDTH=self.layout.width,
            HAS_VLEN=vlen is not None, HAS_CONF=conf is not None, HAS_RAW=raw is not None,
            HAS_TARGET=target is not None, HAS_DRAFT=draft_logits is not None,
            GREEDY_DRAFT=step.greedy_draft, BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip


def kernel_columns(g: int, e: int) -> dict[str, slice]:
    """The columns the kernel writes (it computes them from G and E, as constants, rather
    than take twenty more launch arguments); `StepLayout` must equal them."""
    n = e + 1
    one = ("window", "accepted", "committed", "cap_trim", "bonus", "prefix", "pool",
           "greedy", "temperature", "bonus_logprob", "evicted")  # fmt: skip
    cols = {name: slice(i, i + 1) for i, name in enumerate(one)}
    at = len(one)
    for name, size in (("draft", g), ("confidence", g), ("confidence_raw", g),
                       ("target_logprob", g), ("draft_logprob", g), ("gather_offset", n),
                       ("gather_token", n), ("gather_logprob", n)):  # fmt: skip
        cols[name] = slice(at, at + size)
        at += size
    return cols


_KERNEL = None


def _kernel():
    """Define the kernel on first use (Triton is imported only here)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def row_lse(base, n, scale, BLOCK: tl.constexpr):
        # online (max, sum of exp) over one row, each logit read once; exp2 with log2(e)/t
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        for off in range(0, n, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < n, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp2((m - m_ref) * scale) + tl.sum(tl.exp2((x - m_ref) * scale), 0)
            m = m_new
        return m, s

    @triton.jit(do_not_specialize=["seq"])
    def pack(
        out, stamp, seq, draft, s_draft,
        vlen, acc, com, cap, bonus, prefix, pool, greedy, temps, dtemps,
        conf, s_conf, raw, s_raw, target, s_target, V, dlog, s_dlog0, s_dlog1, VD,
        t_live, t_start, t_next, t_expect, t_born, t_tail, t_stamp, P,
        G: tl.constexpr, GP2: tl.constexpr, E: tl.constexpr, EP2: tl.constexpr,
        WIDTH: tl.constexpr, HAS_VLEN: tl.constexpr, HAS_CONF: tl.constexpr,
        HAS_RAW: tl.constexpr, HAS_TARGET: tl.constexpr, HAS_DRAFT: tl.constexpr,
        GREEDY_DRAFT: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # the columns, as kernel_columns() has them
        C_WIN, C_ACC, C_COM, C_CAP, C_BON, C_PRE = 0, 1, 2, 3, 4, 5
        C_POOL, C_GRD, C_TMP, C_BLP, C_EVI, C_DRF = 6, 7, 8, 9, 10, 11
        C_CNF = C_DRF + G
        C_RAW = C_CNF + G
        C_TLP = C_RAW + G
        C_DLP = C_TLP + G
        C_GOF = C_DLP + G
        C_GTK = C_GOF + E + 1
        C_GLP = C_GTK + E + 1
        b = tl.program_id(0)
        r = tl.program_id(1)
        nan = float("nan")
        LOG2E = 1.4426950408889634
        if HAS_VLEN:
            w = tl.load(vlen + b).to(tl.int64) - 1
        else:
            w = tl.full([], G, tl.int64)
        a = tl.load(acc + b).to(tl.int64)
        bon = tl.load(bonus + b).to(tl.int64)
        pre = tl.load(prefix + b).to(tl.int64)
        p = tl.load(pool + b).to(tl.int64)
        sampled = tl.load(greedy + b).to(tl.int32) == 0
        t = tl.maximum(tl.load(temps + b).to(tl.float32), 1e-5)
        jj = tl.arange(0, GP2)
        jm = jj < G
        row_out = out + b.to(tl.int64) * WIDTH
        drow = draft + b.to(tl.int64) * s_draft
        dr = tl.load(drow + jj, mask=jm, other=0).to(tl.int64)

        # -- the slot's tails against the tokens this step commits ---------------------
        slot_ok = (p >= 0) & (p < P)
        pc = tl.minimum(tl.maximum(p, 0), P - 1)
        s0 = tl.load(t_stamp + pc * 2)
        s1 = tl.load(t_stamp + pc * 2 + 1)
        v0 = s0 < seq
        v1 = s1 < seq
        h = tl.where(v1 & ((~v0) | (s1 > s0)), 1, 0).to(tl.int64)
        ee = tl.arange(0, EP2)
        old = ee < E
        isnew = ee == E
        at_e = (pc * 2 + h) * E + ee
        ld = old & slot_ok
        live_old = (tl.load(t_live + at_e, mask=ld, other=0) != 0) & (
            tl.load(t_expect + at_e, mask=ld, other=-1) == pre
        )
        opens = sampled & (a == w) & (w < G) & slot_ok
        live = tl.where(isnew, opens, live_old & ld)
        start = tl.where(isnew, pre, tl.load(t_start + at_e, mask=ld, other=0))
        nxt = tl.where(isnew, w, tl.load(t_next + at_e, mask=ld, other=0))
        tail_old = tl.load(
            t_tail + at_e[:, None] * G + jj[None, :], mask=ld[:, None] & jm[None, :], other=-1
        )
        tail = tl.where(isnew[:, None], dr[None, :], tail_old)
        off = (start - pre)[:, None] + jj[None, :]
        ahead = jj[None, :] >= nxt[:, None]
        here = ahead & (off <= a) & jm[None, :]
        off_c = tl.minimum(tl.maximum(off, 0), G - 1)
        tok = tl.where(off == a, bon, tl.load(drow + off_c, mask=here, other=-1).to(tl.int64))
        match = here & (tok == tail)
        stop = ahead & (~match) & jm[None, :]
        run_end = tl.min(tl.where(stop, jj[None, :], G), 1)
        at = tl.minimum(run_end, G - 1)
        sel = jj[None, :] == at[:, None]
        here_at = tl.sum(tl.where(sel, here.to(tl.int32), 0), 1) > 0
        off_at = tl.sum(tl.where(sel, off, 0), 1)
        tok_at = tl.sum(tl.where(sel, tail, 0), 1)
        mismatch = live & (run_end < G) & here_at
        g_row = tl.where(mismatch, off_at, -1)

        if r <= G:
            # target row r of request b
            owed = (sampled & (r <= w)) | (tl.sum((g_row == r).to(tl.int32), 0) > 0)
            if HAS_TARGET:
                if owed:
                    base = target + (b.to(tl.int64) * (G + 1) + r) * s_target
                    m, s = row_lse(base, V, LOG2E / t, BLOCK)
                    log_s = tl.log(s)
                    if sampled & (r < w):
                        x = tl.load(base + tl.load(drow + r).to(tl.int64)).to(tl.float32)
                        tl.store(row_out + C_TLP + r, ((x - m) / t - log_s).to(tl.float64))
                    if sampled & (r == a):
                        x = tl.load(base + bon).to(tl.float32)
                        tl.store(row_out + C_BLP, ((x - m) / t - log_s).to(tl.float64))
                    mine = g_row == r
                    x = tl.load(base + tok_at, mask=mine, other=0.0).to(tl.float32)
                    tl.store(row_out + C_GLP + ee, ((x - m) / t - log_s).to(tl.float64), mask=mine)
        else:
            # draft row j of request b: only inside a trimmed sampled request's tail
            j = r - G - 1
            if HAS_DRAFT:
                if sampled & (a == w) & (w < G) & (j >= w):
                    td = tl.maximum(tl.load(dtemps + b).to(tl.float32), 1e-5)
                    base = dlog + b.to(tl.int64) * s_dlog0 + j.to(tl.int64) * s_dlog1
                    m, s = row_lse(base, VD, LOG2E / td, BLOCK)
                    x = tl.load(base + tl.load(drow + j).to(tl.int64)).to(tl.float32)
                    tl.store(row_out + C_DLP + j, ((x - m) / td - tl.log(s)).to(tl.float64))

        if r == 0:
            # the request's columns, NaN where no number is owed
            tl.store(row_out + C_WIN, w.to(tl.float64))
            tl.store(row_out + C_ACC, a.to(tl.float64))
            tl.store(row_out + C_COM, tl.load(com + b).to(tl.float64))
            tl.store(row_out + C_CAP, tl.load(cap + b).to(tl.float64))
            tl.store(row_out + C_BON, bon.to(tl.float64))
            tl.store(row_out + C_PRE, pre.to(tl.float64))
            tl.store(row_out + C_POOL, p.to(tl.float64))
            tl.store(row_out + C_GRD, tl.where(sampled, 0.0, 1.0).to(tl.float64))
            tl.store(row_out + C_TMP, tl.load(temps + b).to(tl.float64))
            tl.store(row_out + C_DRF + jj, dr.to(tl.float64), mask=jm)
            if HAS_CONF:
                cv = tl.load(conf + b.to(tl.int64) * s_conf + jj, mask=jm, other=0.0)
                tl.store(row_out + C_CNF + jj, cv.to(tl.float64), mask=jm)
            else:
                tl.store(row_out + C_CNF + jj, tl.full([GP2], nan, tl.float64), mask=jm)
            if HAS_RAW:
                rv = tl.load(raw + b.to(tl.int64) * s_raw + jj, mask=jm, other=0.0)
                tl.store(row_out + C_RAW + jj, rv.to(tl.float64), mask=jm)
            else:
                tl.store(row_out + C_RAW + jj, tl.full([GP2], nan, tl.float64), mask=jm)
            nan_v = tl.full([GP2], nan, tl.float64)
            t_owed = sampled & (jj < w)
            if HAS_TARGET:
                tl.store(row_out + C_TLP + jj, nan_v, mask=jm & ~t_owed)
                if ~sampled:
                    tl.store(row_out + C_BLP, nan)
            else:
                tl.store(row_out + C_TLP + jj, nan_v, mask=jm)
                tl.store(row_out + C_BLP, nan)
            tails = sampled & (a == w) & (w < G) & (jj >= w)
            if GREEDY_DRAFT:
                tl.store(row_out + C_DLP + jj, tl.where(tails, 0.0, nan).to(tl.float64), mask=jm)
            elif HAS_DRAFT:
                tl.store(row_out + C_DLP + jj, nan_v, mask=jm & ~tails)
            else:
                tl.store(row_out + C_DLP + jj, nan_v, mask=jm)
            gm = ee < E + 1
            tl.store(row_out + C_GOF + ee, g_row.to(tl.float64), mask=gm)
            tl.store(row_out + C_GTK + ee, tl.where(mismatch, tok_at, -1).to(tl.float64), mask=gm)
            if HAS_TARGET:
                tl.store(row_out + C_GLP + ee, tl.full([EP2], nan, tl.float64), mask=gm & ~mismatch)
            else:
                tl.store(row_out + C_GLP + ee, tl.full([EP2], nan, tl.float64), mask=gm)
            # the slot's new state, into the half this step does not read
            still = live & ~mismatch & (run_end < G)
            keep = still & old
            new_still = tl.sum((still & isnew).to(tl.int32), 0) > 0
            new_end = tl.sum(tl.where(isnew, run_end, 0), 0)
            free = old & ~keep
            has_free = tl.sum(free.to(tl.int32), 0) > 0
            first_free = tl.min(tl.where(free, ee, EP2), 0)
            born = tl.load(t_born + at_e, mask=ld, other=0)
            oldest_born = tl.min(tl.where(old, born, 2**62), 0)
            oldest = tl.min(tl.where(old & (born == oldest_born), ee, EP2), 0)
            ins = tl.where(has_free, first_free, oldest)
            put = old & (ee == ins) & new_still
            tl.store(row_out + C_EVI, tl.where(new_still & ~has_free, 1.0, 0.0).to(tl.float64))
            if slot_ok:
                hw = 1 - h
                at_w = (pc * 2 + hw) * E + ee
                tl.store(t_live + at_w, tl.where(put, 1, keep.to(tl.int32)).to(tl.int8), mask=old)
                tl.store(t_start + at_w, tl.where(put, pre, start), mask=old)
                tl.store(t_next + at_w, tl.where(put, new_end, run_end), mask=old)
                tl.store(t_expect + at_w, tl.full([EP2], 0, tl.int64) + pre + a + 1, mask=old)
                tl.store(t_born + at_w, tl.where(put, seq, born), mask=old)
                new_tail = tl.where(put[:, None], dr[None, :], tail_old)
                tl.store(t_tail + at_w[:, None] * G + jj[None, :], new_tail,
                         mask=old[:, None] & jm[None, :])  # fmt: skip
                tl.store(t_stamp + pc * 2 + hw, seq)
            if b == 0:
                tl.store(stamp, seq)

    _KERNEL = pack
    return _KERNEL

"""The hook's device pass as one Triton kernel: a step packed in one launch.

The same numbers as the torch form (`pack_torch.py`, the definition), but in
one launch over a (request, row) grid, because the serving thread can afford a
launch or two per step and the torch form takes dozens. Program (b, r) for r <= gamma
owns target row r of request b; for gamma < r <= 2 gamma, draft row r - gamma - 1. A
row is read once, only where a number needs it (a sampled request's row inside its
window, its bonus row, a tail's first mismatch; a draft row only inside a trimmed
sampled request's tail), keeping an online maximum and sum of exponentials, and every
token it owes is picked after that one pass. Program (b, 2 gamma + 1) writes the
request's columns and walks its slot's tails; it reads no row, so that this walk, the
longest chain of dependent loads, runs beside the rows' reads rather than after one.

A few hundred rows leave most of a large GPU idle when each has one program, so at
small batches a row is split into S slices over the grid's third axis: each slice's
program writes its partial (maximum, sum) and takes a ticket from the row's counter;
the program that takes the last ticket combines the S pairs, writes the row's
numbers and resets the counter. S is chosen from the batch (`splits_for`), 1 at
large batches, where the rows alone fill the GPU and the ticket would only cost.

The tail table is double-buffered per slot, with the step that wrote each half:
every program of a request reads the half written last before this step, and
the columns' program writes the other one, so no program of the launch sees a
half-written state (programs of different requests never share a slot).
"""

from __future__ import annotations

from operator import attrgetter, methodcaller

from .observed_step import ObservedStep
from .step_layout import StepLayout

#: Logits per load and warps per program: the fastest pair measured on an H200 (B = 256,
#: V = 129,280; bench/RESULTS.md).
BLOCK, NUM_WARPS = 8192, 4
#: Programs per SM to aim for when rows are split, and the most slices a row takes
#: (H200, B = 16 .. 256; bench/RESULTS.md).
PROGRAMS_PER_SM, MAX_SPLITS = 4, 16

#: The step's tensors the kernel takes by address, in the kernel's order after `seq`.
INPUTS = ("draft", "verify_lens", "accepted", "committed", "cap_trim", "bonus", "prefix",
          "pool", "greedy", "temperature", "draft_temperature", "confidence",
          "confidence_raw")  # fmt: skip
# has-flags, bits of the kernel's `FL` constant
F_VLEN, F_CONF, F_RAW, F_TARGET, F_DRAFT, F_GREEDY_DRAFT = 1, 2, 4, 8, 16, 32
#: The largest step number an int32 launch argument holds; past it the kernel is compiled
#: again with an int64 one.
I32_MAX = 2**31 - 1
_DTYPE, _ADDRESS = attrgetter("dtype"), methodcaller("data_ptr")


class TritonPacker:
    """Packs a step with one launch, its inputs' addresses passed by value.

    Triton's Python launcher binds every argument on every call (tens of microseconds for
    the ~30 a step has), so after the first launch of a specialisation the compiled
    kernel's own C launch is called directly (`_launcher`), behind a key this class holds
    (the inputs' dtypes and strides, which inputs exist, the logits' alignment). The
    inputs are compiled without value or alignment specialisation (`do_not_specialize`),
    so any address fits; the two logit tensors are specialised, for aligned vector loads.
    The addresses travel in the launch's parameters: no copy to the device before the
    launch, and no program waits on a load of them before reading its request's scalars.
    """

    def __init__(self, layout: StepLayout, pool_slots: int, device, max_bs: int, stamp, *,
                 block: int = BLOCK, num_warps: int = NUM_WARPS,
                 programs_per_sm: int = PROGRAMS_PER_SM) -> None:  # fmt: skip
        import torch

        from ..kernels.token_logprobs import _sm_count

        self.kernel = _kernel()  # ImportError without Triton: the caller falls back
        self.layout = layout
        self.pool_slots = pool_slots
        self.device = torch.device(device)
        self.block, self.num_warps = block, num_warps
        self.programs = programs_per_sm * _sm_count(self.device)
        self.splits: dict[int, int] = {}
        #: the grid's second axis: target rows 0..gamma, draft rows, the columns' program
        self.rows = 2 * layout.gamma + 2
        g, e = layout.gamma, layout.entries
        i64 = dict(dtype=torch.int64, device=device)
        t_live = torch.zeros((pool_slots, 2, e), dtype=torch.int8, device=device)
        t_tail = torch.zeros((pool_slots, 2, e, g), **i64)
        t_start, t_next, t_expect, t_born = (torch.zeros((pool_slots, 2, e), **i64)
                                             for _ in range(4))  # fmt: skip
        t_stamp = torch.tensor([[-1, -2]], **i64).repeat(pool_slots, 1)
        self.dummy = torch.zeros(8, dtype=torch.float32, device=device)
        # a split row's partial (maximum, sum) per slice, and its ticket counter (kept at 0
        # between launches: the last program of a row resets it)
        rows_max = max_bs * (2 * g + 1)
        part = torch.zeros((rows_max, MAX_SPLITS, 2), dtype=torch.float32, device=device)
        tick = torch.zeros(rows_max, dtype=torch.int32, device=device)
        if layout.columns != kernel_columns(g, e):
            raise ValueError("the packed step's layout is not the one the kernel writes")
        self.gp2 = max(2, 1 << (g - 1).bit_length())
        self.ep2 = max(2, 1 << e.bit_length())  # entries + 1 (the new tail) fit
        #: the buffers every launch takes, after the inputs and the output: tensors for the
        #: first launch of a specialisation, their addresses for the direct calls
        self.fixed = (stamp, t_live, t_start, t_next, t_expect, t_born, t_tail, t_stamp, part,
                      tick)  # fmt: skip
        self.fixed_at = tuple(t.data_ptr() for t in self.fixed)
        self.compiled: dict[tuple, object] = {}

    def pack(self, step: ObservedStep, seq: int, stream: int, out, out_at: int) -> None:
        """Enqueue the pass on `stream`: `out[:bs]` filled, the table advanced, `stamp = seq`.

        `out` is a `[max_bs, width]` float64 tensor (on the device, or over registered host
        memory, which the first launch of a specialisation maps) and `out_at` its device
        address, which the direct calls take."""
        d = self.dummy
        flags = 0
        vlen, conf, raw = step.verify_lens, step.confidence, step.confidence_raw
        if vlen is None:
            vlen = d
        else:
            flags = F_VLEN
        if conf is None:
            conf, s_conf = d, 0
        else:
            flags |= F_CONF
            s_conf = conf.stride(0)
        if raw is None:
            raw, s_raw = d, 0
        else:
            flags |= F_RAW
            s_raw = raw.stride(0)
        target, dlog = step.target_logits, step.draft_logits
        if target is None:
            target, st, v = d, 0, 0
        else:
            flags |= F_TARGET
            st, v = target.stride(0), target.shape[-1]
        if dlog is None:
            dlog, sd0, sd1, vd = d, 0, 0, 0
        else:
            flags |= F_DRAFT
            sd0, sd1, vd = dlog.stride(0), dlog.stride(1), dlog.shape[-1]
        if step.greedy_draft:
            flags |= F_GREEDY_DRAFT
        draft = step.draft
        inputs = (draft, vlen, step.accepted, step.committed, step.cap_trim, step.bonus,
                  step.prefix, step.pool, step.greedy, step.temperature, step.draft_temperature,
                  conf, raw)  # fmt: skip
        tp, dp = target.data_ptr(), dlog.data_ptr()
        bs = step.bs
        split = self.splits.get(bs)
        if split is None:
            split = self.splits[bs] = splits_for(bs * (self.layout.gamma + 1), self.programs)
        strides = (draft.stride(0), s_conf, s_raw)
        key = (*map(_DTYPE, inputs), flags, *strides, st, v, sd0, sd1, vd, target.dtype,
               dlog.dtype, tp & 15, dp & 15, split, seq > I32_MAX)  # fmt: skip
        hit = self.compiled.get(key)
        if hit is not None:
            launch, head, constants = hit
            launch(bs, self.rows, split, stream, *head, tp, dp, seq, *map(_ADDRESS, inputs),
                   out_at, *self.fixed_at, *constants)  # fmt: skip
            return
        grid = (bs, self.rows, split)
        lay = self.layout
        constants = dict(G=lay.gamma, GP2=self.gp2, E=lay.entries, EP2=self.ep2,
                         P=self.pool_slots, WIDTH=lay.width, BLOCK=self.block, FL=flags,
                         S_T=st, V=v, S_D0=sd0, S_D1=sd1, VD=vd, SPLIT=split,
                         CH_T=_slice(v, split, self.block), CH_D=_slice(vd, split, self.block),
                         S_DR=strides[0], S_CF=strides[1], S_RW=strides[2])  # fmt: skip
        kernel = self.kernel[grid](target, dlog, seq, *inputs, out, *self.fixed, **constants,
                                   num_warps=self.num_warps)  # fmt: skip
        if _no_launch_hooks():
            self.compiled[key] = (*_launcher(kernel), tuple(constants.values()))


def splits_for(rows: int, programs: int) -> int:
    """Slices per row: the largest power of two that keeps `rows` (the most a step can read)
    times it within `programs`, at most MAX_SPLITS; 1 once the rows reach half of it. On an
    H200 (528 programs): 4 slices at B = 16 (8 were about 1 us slower), 2 at B = 32 (4 were
    slower), 1 at B = 64 (2 were slower)."""
    if 2 * rows >= programs:
        return 1
    return min(MAX_SPLITS, 1 << ((programs // rows).bit_length() - 1))


def _slice(n: int, split: int, block: int) -> int:
    """Logits per slice: whole blocks, so that every slice's loads stay aligned."""
    return max(1, -(-n // (split * block))) * block


def _launcher(kernel) -> tuple:
    """The compiled kernel's launch and what it takes before the kernel's arguments: the C
    launch itself where Triton's wrapper would only add a Python call (no scratch memory to
    allocate; 2 us of the serving thread's time on an H200 host), else the wrapper."""
    run = kernel.run
    meta = (kernel.packed_metadata, None, None, None)  # launch metadata and hooks: none
    direct = all(getattr(run, a, 1) == 0 for a in ("global_scratch_size", "profile_scratch_size"))
    if direct and hasattr(run, "launch_pdl") and hasattr(run, "launch_cooperative_grid"):
        return run.launch, (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None,
                            None, *meta)  # fmt: skip
    return run, (kernel.function, *meta)


def _no_launch_hooks() -> bool:
    """The direct call skips Triton's launch hooks; with a profiler's hooks set, keep the
    normal launch. (Triton 3.5 and later keep them as chains, empty when unused.)"""
    from triton import knobs

    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return all(h is None or not getattr(h, "calls", True) for h in hooks)


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
#: The kernel's arguments compiled for any value and alignment: the step number and the
#: inputs, whose addresses change from step to step.
_UNSPECIALISED = ("seq", "draft", "vlen", "acc", "com", "cap", "bonus", "prefix", "pool",
                  "greedy", "temps", "dtemps", "conf", "raw")  # fmt: skip


def _kernel():
    """Define the kernel on first use (Triton is imported only here)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def row_slice(base, lo, n: tl.constexpr, scale, CH: tl.constexpr, BLOCK: tl.constexpr):
        # online (max, sum of exp) over logits [lo, lo + CH) of a row of n, each read once;
        # exp2 with log2(e)/t
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        for off in range(0, CH, BLOCK):
            idx = lo + off + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < n, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp2((m - m_ref) * scale) + tl.sum(tl.exp2((x - m_ref) * scale), 0)
            m = m_new
        return m, s

    @triton.jit
    def row_lse(base, n: tl.constexpr, scale, part, tick, row, c,
                SPLIT: tl.constexpr, CH: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        # (max, sum of exp, done) of a row whose slice c this program reads; done in the
        # program that finishes the row, which alone may use the pair
        m, s = row_slice(base, c * CH, n, scale, CH, BLOCK)
        done = c == 0
        if SPLIT > 1:
            at = part + row * (2 * SPLIT)
            tl.store(at + 2 * c, m)
            tl.store(at + 2 * c + 1, s)
            tl.debug_barrier()
            done = tl.atomic_add(tick + row, 1, sem="acq_rel") == SPLIT - 1
            if done:
                cc = tl.arange(0, SPLIT)
                mm = tl.load(at + 2 * cc, volatile=True)
                ss = tl.load(at + 2 * cc + 1, volatile=True)
                m = tl.max(mm, 0)
                m_ref = tl.where(m == float("-inf"), 0.0, m)
                s = tl.sum(ss * tl.exp2((mm - m_ref) * scale), 0)
                tl.store(tick + row, 0)
        return m, s, done

    @triton.jit
    def tails_load(t_live, t_start, t_next, t_expect, t_born, t_tail, t_stamp, p,
                   P: tl.constexpr, G: tl.constexpr, GP2: tl.constexpr, E: tl.constexpr,
                   EP2: tl.constexpr):  # fmt: skip
        # both halves of the slot's tail table and their stamps, [2, ...]: one round of
        # loads that needs only the slot, so that it can be issued before a row is read
        hh = tl.arange(0, 2)
        jj = tl.arange(0, GP2)
        ee = tl.arange(0, EP2)
        slot_ok = (p >= 0) & (p < P)
        pc = tl.minimum(tl.maximum(p, 0), P - 1)
        stamps = tl.load(t_stamp + pc * 2 + hh)
        at = (pc * 2 + hh[:, None]) * E + ee[None, :]
        ld = (ee[None, :] < E) & slot_ok & (hh[:, None] < 2)
        live = tl.load(t_live + at, mask=ld, other=0).to(tl.int32)
        expect = tl.load(t_expect + at, mask=ld, other=-1)
        start = tl.load(t_start + at, mask=ld, other=0)
        nxt = tl.load(t_next + at, mask=ld, other=0)
        born = tl.load(t_born + at, mask=ld, other=0)
        tail = tl.load(t_tail + at[:, :, None] * G + jj[None, None, :],
                       mask=ld[:, :, None] & (jj < G)[None, None, :], other=-1)  # fmt: skip
        return slot_ok, pc, stamps, live, expect, start, nxt, born, tail

    @triton.jit
    def walk(slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2, tail2, seq, pre, a, w,
             bon, sampled, dr, G: tl.constexpr, GP2: tl.constexpr, E: tl.constexpr,
             EP2: tl.constexpr):  # fmt: skip
        # the slot's tails (as tails_load read them) against the tokens this step commits:
        # the half read, each entry's state and the first mismatch's row and token (-1: none)
        hh = tl.arange(0, 2)
        jj = tl.arange(0, GP2)
        jm = jj < G
        ee = tl.arange(0, EP2)
        old = ee < E
        isnew = ee == E
        s0 = tl.sum(tl.where(hh == 0, stamps, 0), 0)
        s1 = tl.sum(tl.where(hh == 1, stamps, 0), 0)
        v0 = s0 < seq
        v1 = s1 < seq
        h = tl.where(v1 & ((~v0) | (s1 > s0)), 1, 0).to(tl.int64)
        pick = hh[:, None] == h
        ld = old & slot_ok
        live_old = (tl.sum(tl.where(pick, live2, 0), 0) != 0) & (
            tl.sum(tl.where(pick, expect2, 0), 0) == pre
        )
        opens = sampled & (a == w) & (w < G) & slot_ok
        live = tl.where(isnew, opens, live_old & ld)
        start = tl.where(isnew, pre, tl.sum(tl.where(pick, start2, 0), 0))
        nxt = tl.where(isnew, w, tl.sum(tl.where(pick, nxt2, 0), 0))
        born = tl.sum(tl.where(pick, born2, 0), 0)
        tail_old = tl.sum(tl.where(pick[:, :, None], tail2, 0), 0)
        tail = tl.where(isnew[:, None], dr[None, :], tail_old)
        off = (start - pre)[:, None] + jj[None, :]
        ahead = jj[None, :] >= nxt[:, None]
        here = ahead & (off <= a) & jm[None, :]
        off_c = tl.minimum(tl.maximum(off, 0), G - 1)
        # the drafted token at each offset, from the draft row already in registers
        drafted = tl.sum(tl.where(off_c[:, :, None] == jj[None, None, :], dr[None, None, :], 0), 2)
        tok = tl.where(off == a, bon, tl.where(here, drafted, -1))
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
        return h, live, start, born, tail_old, run_end, mismatch, g_row, tok_at

    @triton.jit(do_not_specialize=_UNSPECIALISED)
    def pack(
        target, dlog, seq, draft, vlen, acc, com, cap, bonus, prefix, pool, greedy, temps,
        dtemps, conf, raw, out, stamp, t_live, t_start, t_next, t_expect, t_born, t_tail,
        t_stamp, part, tick,
        G: tl.constexpr, GP2: tl.constexpr, E: tl.constexpr, EP2: tl.constexpr,
        P: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, FL: tl.constexpr,
        S_T: tl.constexpr, V: tl.constexpr, S_D0: tl.constexpr, S_D1: tl.constexpr,
        VD: tl.constexpr, SPLIT: tl.constexpr, CH_T: tl.constexpr, CH_D: tl.constexpr,
        S_DR: tl.constexpr, S_CF: tl.constexpr, S_RW: tl.constexpr,
    ):  # fmt: skip
        # the flag bits, as the module's F_* constants have them
        HAS_VLEN: tl.constexpr = (FL & 1) != 0
        HAS_CONF: tl.constexpr = (FL & 2) != 0
        HAS_RAW: tl.constexpr = (FL & 4) != 0
        HAS_TARGET: tl.constexpr = (FL & 8) != 0
        HAS_DRAFT: tl.constexpr = (FL & 16) != 0
        GREEDY_DRAFT: tl.constexpr = (FL & 32) != 0
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
        c = tl.program_id(2)
        row = b * (2 * G + 1) + r
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
        dr = tl.load(draft + b.to(tl.int64) * S_DR + jj, mask=jm, other=0).to(tl.int64)

        ee = tl.arange(0, EP2)
        if r <= G:
            # target row r of request b: owed inside a sampled request's window, or where a
            # tail's first mismatch falls (walked first only when the window does not decide)
            if HAS_TARGET:
                base = target + (b.to(tl.int64) * (G + 1) + r) * S_T
                # the slot's tails, read before the row so that they arrive while it streams
                slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2, tail2 = tails_load(
                    t_live, t_start, t_next, t_expect, t_born, t_tail, t_stamp, p, P, G, GP2, E,
                    EP2)  # fmt: skip
                owed = sampled & (r <= w)
                if ~owed:
                    g_row = walk(slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2, tail2,
                                 seq, pre, a, w, bon, sampled, dr, G, GP2, E, EP2)[7]  # fmt: skip
                    owed = tl.sum((g_row == r).to(tl.int32), 0) > 0
                if owed:
                    # the drafted and the bonus token's logits, likewise read early
                    want_t = sampled & (r < w)
                    want_b = sampled & (r == a)
                    x_t = tl.load(base + tl.sum(tl.where(jj == r, dr, 0), 0), mask=want_t,
                                  other=0.0).to(tl.float32)  # fmt: skip
                    x_b = tl.load(base + bon, mask=want_b, other=0.0).to(tl.float32)
                    m, s, done = row_lse(base, V, LOG2E / t, part, tick, row, c, SPLIT, CH_T,
                                         BLOCK)  # fmt: skip
                    if done:
                        log_s = tl.log(s)
                        if want_t:
                            tl.store(row_out + C_TLP + r, ((x_t - m) / t - log_s).to(tl.float64))
                        if want_b:
                            tl.store(row_out + C_BLP, ((x_b - m) / t - log_s).to(tl.float64))
                        walked = walk(slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2,
                                      tail2, seq, pre, a, w, bon, sampled, dr, G, GP2, E,
                                      EP2)  # fmt: skip
                        mine = walked[7] == r
                        x = tl.load(base + walked[8], mask=mine, other=0.0).to(tl.float32)
                        tl.store(row_out + C_GLP + ee, ((x - m) / t - log_s).to(tl.float64),
                                 mask=mine)  # fmt: skip
        elif r <= 2 * G:
            # draft row j of request b: only inside a trimmed sampled request's tail
            j = r - G - 1
            if HAS_DRAFT:
                if sampled & (a == w) & (w < G) & (j >= w):
                    td = tl.maximum(tl.load(dtemps + b).to(tl.float32), 1e-5)
                    base = dlog + b.to(tl.int64) * S_D0 + j.to(tl.int64) * S_D1
                    x = tl.load(base + tl.sum(tl.where(jj == j, dr, 0), 0)).to(tl.float32)
                    m, s, done = row_lse(base, VD, LOG2E / td, part, tick, row, c, SPLIT, CH_D,
                                         BLOCK)  # fmt: skip
                    if done:
                        tl.store(row_out + C_DLP + j, ((x - m) / td - tl.log(s)).to(tl.float64))

        if (r == 2 * G + 1) & (c == 0):
            # the request's columns, NaN where no number is owed
            slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2, tail2 = tails_load(
                t_live, t_start, t_next, t_expect, t_born, t_tail, t_stamp, p, P, G, GP2, E, EP2
            )
            h, live, start, born, tail_old, run_end, mismatch, g_row, tok_at = walk(
                slot_ok, pc, stamps, live2, expect2, start2, nxt2, born2, tail2, seq, pre, a, w,
                bon, sampled, dr, G, GP2, E, EP2)  # fmt: skip
            old = ee < E
            isnew = ee == E
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
                cv = tl.load(conf + b.to(tl.int64) * S_CF + jj, mask=jm, other=0.0)
                tl.store(row_out + C_CNF + jj, cv.to(tl.float64), mask=jm)
            else:
                tl.store(row_out + C_CNF + jj, tl.full([GP2], nan, tl.float64), mask=jm)
            if HAS_RAW:
                rv = tl.load(raw + b.to(tl.int64) * S_RW + jj, mask=jm, other=0.0)
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

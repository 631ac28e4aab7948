"""The hook's device pass as one Triton kernel: a step packed in one launch.

The same numbers as the torch form (`pack_torch.py`), its gathers the ones the numpy tail
walk of `estimator/tails.py` asks for, and its columns the layout's (`step_layout`, passed
as compile-time constants, `kernel_constants`), but in one launch over a (request, row)
grid, because the serving thread can afford a launch or two per step and the torch form
takes dozens. Program (b, r) for r <= gamma
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
from .step_layout import (
    GREEDY_DRAFT,
    HAS_CONFIDENCE,
    HAS_DRAFT_LOGITS,
    HAS_RAW,
    HAS_TARGET,
    HAS_VERIFY_LENS,
    PER_DRAFT,
    PER_GATHER,
    SCALARS,
    StepLayout,
)

#: Logits per load and warps per program: the fastest pair measured on an H200 (B = 256,
#: V = 129,280; bench/RESULTS.md).
BLOCK, NUM_WARPS = 8192, 4
#: Programs per SM to aim for when rows are split, and the most slices a row takes
#: (H200, B = 16 .. 256; bench/RESULTS.md).
PROGRAMS_PER_SM, MAX_SPLITS = 4, 16

#: The step's tensors the kernel takes by address, in the kernel's order after `seq`: the
#: kernel's arguments carry the `ObservedStep` fields' names.
INPUTS = ("draft", "verify_lens", "accepted", "committed", "cap_trim", "bonus", "prefix",
          "pool", "greedy", "temperature", "draft_temperature", "confidence",
          "confidence_raw")  # fmt: skip
#: The kernel's compile-time switches, each set by one of the step's flag bits.
SWITCHES = (("HAS_VERIFY_LENS", HAS_VERIFY_LENS), ("HAS_CONFIDENCE", HAS_CONFIDENCE),
            ("HAS_RAW", HAS_RAW), ("HAS_TARGET", HAS_TARGET),
            ("HAS_DRAFT_LOGITS", HAS_DRAFT_LOGITS), ("GREEDY_DRAFT", GREEDY_DRAFT))  # fmt: skip
#: The largest step number an int32 launch argument holds; past it the kernel is compiled
#: again with an int64 one.
I32_MAX = 2**31 - 1
_DTYPE, _ADDRESS = attrgetter("dtype"), methodcaller("data_ptr")


class TritonPacker:
    """Packs a step with one launch, its inputs' addresses passed by value.

    Triton's Python launcher binds every argument on every call (tens of microseconds for
    the ~30 a step has), so after the first launch of a specialisation the compiled
    kernel's own C launch is called directly (`direct_launch`), behind a key this class holds
    (the inputs' dtypes and strides, which inputs exist, the logits' alignment). The
    inputs are compiled without value or alignment specialisation (`do_not_specialize`),
    so any address fits; the two logit tensors are specialised, for aligned vector loads.
    The addresses travel in the launch's parameters: no copy to the device before the
    launch, and no program waits on a load of them before reading its request's scalars.
    """

    by_address = True
    writes_stamp = True

    def __init__(self, layout: StepLayout, pool_slots: int, device, max_bs: int, stamp, *,
                 block: int = BLOCK, num_warps: int = NUM_WARPS,
                 programs_per_sm: int = PROGRAMS_PER_SM) -> None:  # fmt: skip
        import torch

        from .token_logprobs import _sm_count

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
        t_open_prefix, t_next, t_expect, t_born = (torch.zeros((pool_slots, 2, e), **i64)
                                                   for _ in range(4))  # fmt: skip
        t_stamp = torch.tensor([[-1, -2]], **i64).repeat(pool_slots, 1)
        self.dummy = torch.zeros(8, dtype=torch.float32, device=device)
        # a split row's partial (maximum, sum) per slice, and its ticket counter (kept at 0
        # between launches: the last program of a row resets it)
        rows_max = max_bs * (2 * g + 1)
        part = torch.zeros((rows_max, MAX_SPLITS, 2), dtype=torch.float32, device=device)
        tick = torch.zeros(rows_max, dtype=torch.int32, device=device)
        self.columns = kernel_constants(layout)
        self.gp2 = max(2, 1 << (g - 1).bit_length())
        self.ep2 = max(2, 1 << e.bit_length())  # entries + 1 (the new tail) fit
        #: the buffers every launch takes, after the inputs and the output: tensors for the
        #: first launch of a specialisation, their addresses for the direct calls
        self.fixed = (stamp, t_live, t_open_prefix, t_next, t_expect, t_born, t_tail, t_stamp, part,
                      tick)  # fmt: skip
        self.fixed_at = tuple(t.data_ptr() for t in self.fixed)
        self.compiled: dict[tuple, object] = {}

    def pack(self, step: ObservedStep, seq: int, stream: int, out, out_at: int) -> None:
        """Enqueue the pass on `stream`: `out[:bs]` filled, the table advanced, `stamp = seq`
        (the packer protocol, `submit.Packer`).

        `out` is a `[max_bs, width]` float64 tensor (on the device, or over registered host
        memory, which the first launch of a specialisation maps) and `out_at` its device
        address, which the direct calls take."""
        d = self.dummy
        flags = 0
        verify_lens, confidence, raw = step.verify_lens, step.confidence, step.confidence_raw
        if verify_lens is None:
            verify_lens = d
        else:
            flags = HAS_VERIFY_LENS
        if confidence is None:
            confidence, stride_confidence = d, 0
        else:
            flags |= HAS_CONFIDENCE
            stride_confidence = confidence.stride(0)
        if raw is None:
            raw, stride_raw = d, 0
        else:
            flags |= HAS_RAW
            stride_raw = raw.stride(0)
        target, draft_logits = step.target_logits, step.draft_logits
        if target is None:
            target, stride_target, vocab = d, 0, 0
        else:
            flags |= HAS_TARGET
            stride_target, vocab = target.stride(0), target.shape[-1]
        if draft_logits is None:
            draft_logits, stride_dreq, stride_dpos, vocab_draft = d, 0, 0, 0
        else:
            flags |= HAS_DRAFT_LOGITS
            stride_dreq, stride_dpos = draft_logits.stride(0), draft_logits.stride(1)
            vocab_draft = draft_logits.shape[-1]
        if step.greedy_draft:
            flags |= GREEDY_DRAFT
        draft = step.draft
        inputs = (draft, verify_lens, step.accepted, step.committed, step.cap_trim, step.bonus,
                  step.prefix, step.pool, step.greedy, step.temperature, step.draft_temperature,
                  confidence, raw)  # fmt: skip
        tp, dp = target.data_ptr(), draft_logits.data_ptr()
        bs = step.bs
        split = self.splits.get(bs)
        if split is None:
            split = self.splits[bs] = splits_for(bs * (self.layout.gamma + 1), self.programs)
        strides = (draft.stride(0), stride_confidence, stride_raw)
        key = (*map(_DTYPE, inputs), flags, *strides, stride_target, vocab, stride_dreq,
               stride_dpos, vocab_draft, target.dtype, draft_logits.dtype, tp & 15, dp & 15,
               split, seq > I32_MAX)  # fmt: skip
        hit = self.compiled.get(key)
        if hit is not None:
            launch, head, constants = hit
            launch(bs, self.rows, split, stream, *head, tp, dp, seq, *map(_ADDRESS, inputs),
                   out_at, *self.fixed_at, *constants)  # fmt: skip
            return
        grid = (bs, self.rows, split)
        lay = self.layout
        # in the kernel's order of its compile-time parameters
        constants = dict(
            G=lay.gamma, GP2=self.gp2, ENTRIES=lay.entries, EP2=self.ep2,
            POOL_SLOTS=self.pool_slots, WIDTH=lay.width, BLOCK=self.block,
            **{name: (flags & bit) != 0 for name, bit in SWITCHES},
            STRIDE_TARGET=stride_target, VOCAB=vocab, STRIDE_DRAFT_REQ=stride_dreq,
            STRIDE_DRAFT_POS=stride_dpos, VOCAB_DRAFT=vocab_draft, SPLIT=split,
            CHUNK_TARGET=_slice(vocab, split, self.block),
            CHUNK_DRAFT=_slice(vocab_draft, split, self.block),
            STRIDE_DRAFTS=strides[0], STRIDE_CONFIDENCE=strides[1], STRIDE_RAW=strides[2],
            **self.columns,
        )  # fmt: skip
        kernel = self.kernel[grid](target, draft_logits, seq, *inputs, out, *self.fixed,
                                   **constants, num_warps=self.num_warps)  # fmt: skip
        if no_launch_hooks():
            self.compiled[key] = (*direct_launch(kernel), tuple(constants.values()))


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


def direct_launch(kernel) -> tuple:
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


def no_launch_hooks() -> bool:
    """The direct call skips Triton's launch hooks; with a profiler's hooks set, keep the
    normal launch. (Triton 3.5 and later keep them as chains, empty when unused.)"""
    from triton import knobs

    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return all(h is None or not getattr(h, "calls", True) for h in hooks)


def kernel_constants(layout: StepLayout) -> dict[str, int]:
    """The kernel's column parameters (`C_<FIELD>`, compile-time constants), every field's
    first column as the layout has it. As constants they cost the direct launch no
    binding, and the kernel holds no column of its own."""
    return {f"C_{name.upper()}": layout.col(name) for name in (*SCALARS, *PER_DRAFT, *PER_GATHER)}


_KERNEL = None
#: The kernel's arguments compiled for any value and alignment: the step number and the
#: inputs, whose addresses change from step to step.
_UNSPECIALISED = ("seq", *INPUTS)


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
    def tails_load(t_live, t_open_prefix, t_next, t_expect, t_born, t_tail, t_stamp, slot,
                   POOL_SLOTS: tl.constexpr, G: tl.constexpr, GP2: tl.constexpr,
                   ENTRIES: tl.constexpr, EP2: tl.constexpr):  # fmt: skip
        # both halves of the slot's tail table and their stamps, [2, ...]: one round of
        # loads that needs only the slot, so that it can be issued before a row is read
        hh = tl.arange(0, 2)
        jj = tl.arange(0, GP2)
        ee = tl.arange(0, EP2)
        slot_ok = (slot >= 0) & (slot < POOL_SLOTS)
        pc = tl.minimum(tl.maximum(slot, 0), POOL_SLOTS - 1)
        stamps = tl.load(t_stamp + pc * 2 + hh)
        at = (pc * 2 + hh[:, None]) * ENTRIES + ee[None, :]
        ld = (ee[None, :] < ENTRIES) & slot_ok & (hh[:, None] < 2)
        live = tl.load(t_live + at, mask=ld, other=0).to(tl.int32)
        expect = tl.load(t_expect + at, mask=ld, other=-1)
        open_prefix = tl.load(t_open_prefix + at, mask=ld, other=0)
        nxt = tl.load(t_next + at, mask=ld, other=0)
        born = tl.load(t_born + at, mask=ld, other=0)
        tail = tl.load(t_tail + at[:, :, None] * G + jj[None, None, :],
                       mask=ld[:, :, None] & (jj < G)[None, None, :], other=-1)  # fmt: skip
        return slot_ok, pc, stamps, live, expect, open_prefix, nxt, born, tail

    @triton.jit
    def walk(slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2, born2, tail2, seq,
             prefix_len, n_accepted, window, bonus_token, sampled, drafts, G: tl.constexpr,
             GP2: tl.constexpr, ENTRIES: tl.constexpr, EP2: tl.constexpr):  # fmt: skip
        # the slot's tails (as tails_load read them) against the tokens this step commits:
        # the half read, each entry's state and the first mismatch's row and token (-1: none)
        hh = tl.arange(0, 2)
        jj = tl.arange(0, GP2)
        jm = jj < G
        ee = tl.arange(0, EP2)
        old = ee < ENTRIES
        isnew = ee == ENTRIES
        s0 = tl.sum(tl.where(hh == 0, stamps, 0), 0)
        s1 = tl.sum(tl.where(hh == 1, stamps, 0), 0)
        v0 = s0 < seq
        v1 = s1 < seq
        h = tl.where(v1 & ((~v0) | (s1 > s0)), 1, 0).to(tl.int64)
        pick = hh[:, None] == h
        ld = old & slot_ok
        live_old = (tl.sum(tl.where(pick, live2, 0), 0) != 0) & (
            tl.sum(tl.where(pick, expect2, 0), 0) == prefix_len
        )
        opens = sampled & (n_accepted == window) & (window < G) & slot_ok
        live = tl.where(isnew, opens, live_old & ld)
        open_prefix = tl.where(isnew, prefix_len, tl.sum(tl.where(pick, open_prefix2, 0), 0))
        nxt = tl.where(isnew, window, tl.sum(tl.where(pick, nxt2, 0), 0))
        born = tl.sum(tl.where(pick, born2, 0), 0)
        tail_old = tl.sum(tl.where(pick[:, :, None], tail2, 0), 0)
        tail = tl.where(isnew[:, None], drafts[None, :], tail_old)
        # tail draft j sits at offset j - (prefix - open prefix) of the tokens this step commits
        off = (open_prefix - prefix_len)[:, None] + jj[None, :]
        ahead = jj[None, :] >= nxt[:, None]
        here = ahead & (off <= n_accepted) & jm[None, :]
        off_c = tl.minimum(tl.maximum(off, 0), G - 1)
        # the drafted token at each offset, from the draft row already in registers
        drafted = tl.sum(
            tl.where(off_c[:, :, None] == jj[None, None, :], drafts[None, None, :], 0), 2
        )
        tok = tl.where(off == n_accepted, bonus_token, tl.where(here, drafted, -1))
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
        return h, live, open_prefix, born, tail_old, run_end, mismatch, g_row, tok_at

    @triton.jit(do_not_specialize=_UNSPECIALISED)
    def pack(
        target, draft_logits, seq, draft, verify_lens, accepted, committed, cap_trim, bonus,
        prefix, pool, greedy, temperature, draft_temperature, confidence, confidence_raw, out,
        stamp, t_live, t_open_prefix, t_next, t_expect, t_born, t_tail, t_stamp, part, tick,
        G: tl.constexpr, GP2: tl.constexpr, ENTRIES: tl.constexpr, EP2: tl.constexpr,
        POOL_SLOTS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
        HAS_VERIFY_LENS: tl.constexpr, HAS_CONFIDENCE: tl.constexpr, HAS_RAW: tl.constexpr,
        HAS_TARGET: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, GREEDY_DRAFT: tl.constexpr,
        STRIDE_TARGET: tl.constexpr, VOCAB: tl.constexpr, STRIDE_DRAFT_REQ: tl.constexpr,
        STRIDE_DRAFT_POS: tl.constexpr, VOCAB_DRAFT: tl.constexpr, SPLIT: tl.constexpr,
        CHUNK_TARGET: tl.constexpr, CHUNK_DRAFT: tl.constexpr, STRIDE_DRAFTS: tl.constexpr,
        STRIDE_CONFIDENCE: tl.constexpr, STRIDE_RAW: tl.constexpr,
        C_WINDOW: tl.constexpr, C_ACCEPTED: tl.constexpr, C_COMMITTED: tl.constexpr,
        C_CAP_TRIM: tl.constexpr, C_BONUS: tl.constexpr, C_PREFIX: tl.constexpr,
        C_POOL: tl.constexpr, C_GREEDY: tl.constexpr, C_TEMPERATURE: tl.constexpr,
        C_BONUS_LOGPROB: tl.constexpr, C_EVICTED: tl.constexpr, C_DRAFT: tl.constexpr,
        C_CONFIDENCE: tl.constexpr, C_CONFIDENCE_RAW: tl.constexpr,
        C_TARGET_LOGPROB: tl.constexpr, C_DRAFT_LOGPROB: tl.constexpr,
        C_GATHER_OFFSET: tl.constexpr, C_GATHER_TOKEN: tl.constexpr,
        C_GATHER_LOGPROB: tl.constexpr,
    ):  # fmt: skip
        # the switches are the step's flag bits (step_layout), the C_* columns the layout's
        # (kernel_constants)
        b = tl.program_id(0)
        r = tl.program_id(1)
        c = tl.program_id(2)
        row = b * (2 * G + 1) + r
        nan = float("nan")
        LOG2E = 1.4426950408889634
        if HAS_VERIFY_LENS:
            window = tl.load(verify_lens + b).to(tl.int64) - 1
        else:
            window = tl.full([], G, tl.int64)
        n_accepted = tl.load(accepted + b).to(tl.int64)
        bonus_token = tl.load(bonus + b).to(tl.int64)
        prefix_len = tl.load(prefix + b).to(tl.int64)
        slot = tl.load(pool + b).to(tl.int64)
        sampled = tl.load(greedy + b).to(tl.int32) == 0
        temp = tl.maximum(tl.load(temperature + b).to(tl.float32), 1e-5)
        jj = tl.arange(0, GP2)
        jm = jj < G
        row_out = out + b.to(tl.int64) * WIDTH
        drafts = tl.load(draft + b.to(tl.int64) * STRIDE_DRAFTS + jj, mask=jm, other=0).to(tl.int64)

        ee = tl.arange(0, EP2)
        if r <= G:
            # target row r of request b: owed inside a sampled request's window, or where a
            # tail's first mismatch falls (walked first only when the window does not decide)
            if HAS_TARGET:
                base = target + (b.to(tl.int64) * (G + 1) + r) * STRIDE_TARGET
                # the slot's tails, read before the row so that they arrive while it streams
                slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2, born2, tail2 = (
                    tails_load(t_live, t_open_prefix, t_next, t_expect, t_born, t_tail,
                               t_stamp, slot, POOL_SLOTS, G, GP2, ENTRIES, EP2)
                )  # fmt: skip
                owed = sampled & (r <= window)
                if ~owed:
                    g_row = walk(slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2, born2,
                                 tail2, seq, prefix_len, n_accepted, window, bonus_token,
                                 sampled, drafts, G, GP2, ENTRIES, EP2)[7]  # fmt: skip
                    owed = tl.sum((g_row == r).to(tl.int32), 0) > 0
                if owed:
                    # the drafted and the bonus token's logits, likewise read early
                    want_t = sampled & (r < window)
                    want_b = sampled & (r == n_accepted)
                    x_t = tl.load(base + tl.sum(tl.where(jj == r, drafts, 0), 0), mask=want_t,
                                  other=0.0).to(tl.float32)  # fmt: skip
                    x_b = tl.load(base + bonus_token, mask=want_b, other=0.0).to(tl.float32)
                    m, s, done = row_lse(base, VOCAB, LOG2E / temp, part, tick, row, c, SPLIT,
                                         CHUNK_TARGET, BLOCK)  # fmt: skip
                    if done:
                        log_s = tl.log(s)
                        if want_t:
                            tl.store(row_out + C_TARGET_LOGPROB + r,
                                     ((x_t - m) / temp - log_s).to(tl.float64))  # fmt: skip
                        if want_b:
                            tl.store(row_out + C_BONUS_LOGPROB,
                                     ((x_b - m) / temp - log_s).to(tl.float64))  # fmt: skip
                        walked = walk(slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2,
                                      born2, tail2, seq, prefix_len, n_accepted, window,
                                      bonus_token, sampled, drafts, G, GP2, ENTRIES,
                                      EP2)  # fmt: skip
                        mine = walked[7] == r
                        x = tl.load(base + walked[8], mask=mine, other=0.0).to(tl.float32)
                        tl.store(row_out + C_GATHER_LOGPROB + ee,
                                 ((x - m) / temp - log_s).to(tl.float64), mask=mine)  # fmt: skip
        elif r <= 2 * G:
            # draft row j of request b: only inside a trimmed sampled request's tail
            j = r - G - 1
            if HAS_DRAFT_LOGITS:
                if sampled & (n_accepted == window) & (window < G) & (j >= window):
                    draft_temp = tl.maximum(tl.load(draft_temperature + b).to(tl.float32), 1e-5)
                    base = (draft_logits + b.to(tl.int64) * STRIDE_DRAFT_REQ
                            + j.to(tl.int64) * STRIDE_DRAFT_POS)  # fmt: skip
                    x = tl.load(base + tl.sum(tl.where(jj == j, drafts, 0), 0)).to(tl.float32)
                    m, s, done = row_lse(base, VOCAB_DRAFT, LOG2E / draft_temp, part, tick, row,
                                         c, SPLIT, CHUNK_DRAFT, BLOCK)  # fmt: skip
                    if done:
                        tl.store(row_out + C_DRAFT_LOGPROB + j,
                                 ((x - m) / draft_temp - tl.log(s)).to(tl.float64))  # fmt: skip

        if (r == 2 * G + 1) & (c == 0):
            # the request's columns, NaN where no number is owed
            slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2, born2, tail2 = tails_load(
                t_live, t_open_prefix, t_next, t_expect, t_born, t_tail, t_stamp, slot,
                POOL_SLOTS, G, GP2, ENTRIES, EP2)  # fmt: skip
            h, live, open_prefix, born, tail_old, run_end, mismatch, g_row, tok_at = walk(
                slot_ok, pc, stamps, live2, expect2, open_prefix2, nxt2, born2, tail2, seq,
                prefix_len, n_accepted, window, bonus_token, sampled, drafts, G, GP2, ENTRIES,
                EP2)  # fmt: skip
            old = ee < ENTRIES
            isnew = ee == ENTRIES
            tl.store(row_out + C_WINDOW, window.to(tl.float64))
            tl.store(row_out + C_ACCEPTED, n_accepted.to(tl.float64))
            tl.store(row_out + C_COMMITTED, tl.load(committed + b).to(tl.float64))
            tl.store(row_out + C_CAP_TRIM, tl.load(cap_trim + b).to(tl.float64))
            tl.store(row_out + C_BONUS, bonus_token.to(tl.float64))
            tl.store(row_out + C_PREFIX, prefix_len.to(tl.float64))
            tl.store(row_out + C_POOL, slot.to(tl.float64))
            tl.store(row_out + C_GREEDY, tl.where(sampled, 0.0, 1.0).to(tl.float64))
            tl.store(row_out + C_TEMPERATURE, tl.load(temperature + b).to(tl.float64))
            tl.store(row_out + C_DRAFT + jj, drafts.to(tl.float64), mask=jm)
            if HAS_CONFIDENCE:
                cv = tl.load(confidence + b.to(tl.int64) * STRIDE_CONFIDENCE + jj, mask=jm,
                             other=0.0)  # fmt: skip
                tl.store(row_out + C_CONFIDENCE + jj, cv.to(tl.float64), mask=jm)
            else:
                tl.store(row_out + C_CONFIDENCE + jj, tl.full([GP2], nan, tl.float64), mask=jm)
            if HAS_RAW:
                rv = tl.load(confidence_raw + b.to(tl.int64) * STRIDE_RAW + jj, mask=jm,
                             other=0.0)  # fmt: skip
                tl.store(row_out + C_CONFIDENCE_RAW + jj, rv.to(tl.float64), mask=jm)
            else:
                tl.store(row_out + C_CONFIDENCE_RAW + jj, tl.full([GP2], nan, tl.float64),
                         mask=jm)  # fmt: skip
            nan_v = tl.full([GP2], nan, tl.float64)
            t_owed = sampled & (jj < window)
            if HAS_TARGET:
                tl.store(row_out + C_TARGET_LOGPROB + jj, nan_v, mask=jm & ~t_owed)
                if ~sampled:
                    tl.store(row_out + C_BONUS_LOGPROB, nan)
            else:
                tl.store(row_out + C_TARGET_LOGPROB + jj, nan_v, mask=jm)
                tl.store(row_out + C_BONUS_LOGPROB, nan)
            tails = sampled & (n_accepted == window) & (window < G) & (jj >= window)
            if GREEDY_DRAFT:
                tl.store(row_out + C_DRAFT_LOGPROB + jj, tl.where(tails, 0.0, nan).to(tl.float64),
                         mask=jm)  # fmt: skip
            elif HAS_DRAFT_LOGITS:
                tl.store(row_out + C_DRAFT_LOGPROB + jj, nan_v, mask=jm & ~tails)
            else:
                tl.store(row_out + C_DRAFT_LOGPROB + jj, nan_v, mask=jm)
            gm = ee < ENTRIES + 1
            tl.store(row_out + C_GATHER_OFFSET + ee, g_row.to(tl.float64), mask=gm)
            tl.store(row_out + C_GATHER_TOKEN + ee, tl.where(mismatch, tok_at, -1).to(tl.float64),
                     mask=gm)  # fmt: skip
            if HAS_TARGET:
                tl.store(row_out + C_GATHER_LOGPROB + ee, tl.full([EP2], nan, tl.float64),
                         mask=gm & ~mismatch)  # fmt: skip
            else:
                tl.store(row_out + C_GATHER_LOGPROB + ee, tl.full([EP2], nan, tl.float64),
                         mask=gm)  # fmt: skip
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
            tl.store(row_out + C_EVICTED, tl.where(new_still & ~has_free, 1.0, 0.0).to(tl.float64))
            if slot_ok:
                hw = 1 - h
                at_w = (pc * 2 + hw) * ENTRIES + ee
                tl.store(t_live + at_w, tl.where(put, 1, keep.to(tl.int32)).to(tl.int8), mask=old)
                tl.store(t_open_prefix + at_w, tl.where(put, prefix_len, open_prefix), mask=old)
                tl.store(t_next + at_w, tl.where(put, new_end, run_end), mask=old)
                tl.store(t_expect + at_w, tl.full([EP2], 0, tl.int64) + prefix_len + n_accepted + 1,
                         mask=old)  # fmt: skip
                tl.store(t_born + at_w, tl.where(put, seq, born), mask=old)
                new_tail = tl.where(put[:, None], drafts[None, :], tail_old)
                tl.store(t_tail + at_w[:, None] * G + jj[None, :], new_tail,
                         mask=old[:, None] & jm[None, :])  # fmt: skip
                tl.store(t_stamp + pc * 2 + hw, seq)
            if b == 0:
                tl.store(stamp, seq)

    _KERNEL = pack
    return _KERNEL

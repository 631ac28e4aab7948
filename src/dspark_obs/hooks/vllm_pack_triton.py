"""vLLM's verify step packed by one Triton launch, on the serving thread's budget.

The torch form (`vllm_pack.py`, the definition) takes about twenty operations a step; on a
GPU each is a dispatch and a launch of the serving thread's time, several hundred
microseconds a step in all, which is what the article's team cut from the host. This
kernel writes the same block in one launch: each program owns a few rows, reads the
step's counts, its bonus token and its request slot's drafts and confidences by the
slot, and the host's columns straight from the page-locked staging row (the device reads
it through the host mapping, so no copy is enqueued for it), and writes every column of
its rows, the absent values included, into the output: the ring slot itself where the
stream can write the slot's stamp, else the submitter's device buffer.

As in `pack_triton.py`, only the first launch of a specialisation goes through Triton's
launcher; later ones call the compiled kernel's C launch with the inputs' addresses.
"""

from __future__ import annotations

from operator import attrgetter

from .pack_triton import direct_launch, no_launch_hooks
from .step_layout import StepLayout
from .vllm_pack import HOST_WIDTH, VLLMStep, host_columns, staging_rows

#: rows per program: one [ROWS, width] tile, the whole block in a few programs
ROWS, NUM_WARPS = 16, 4
_DTYPE = attrgetter("dtype")
_UNSPECIALISED = ("host", "idx", "num_sampled", "num_rejected", "sampled", "drafts",
                  "confidence", "bs")  # fmt: skip
_KERNEL = None


def _kernel():
    """Define the kernel on first use (Triton is imported only here)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=_UNSPECIALISED)
    def pack(
        out, host, idx, num_sampled, num_rejected, sampled, drafts, confidence, bs,
        S_SAMPLED: tl.constexpr, S_DRAFTS: tl.constexpr, S_CONFIDENCE: tl.constexpr,
        HAS_CONFIDENCE: tl.constexpr, GAMMA: tl.constexpr, WIDTH: tl.constexpr,
        WIDTH_P2: tl.constexpr, HOST_WIDTH: tl.constexpr, COL_WINDOW: tl.constexpr,
        COL_ACCEPTED: tl.constexpr, COL_COMMITTED: tl.constexpr, COL_CAP_TRIM: tl.constexpr,
        COL_BONUS: tl.constexpr, COL_HOST: tl.constexpr, COL_EVICTED: tl.constexpr,
        COL_DRAFT: tl.constexpr, COL_CONFIDENCE: tl.constexpr, COL_GATHER_OFFSET: tl.constexpr,
        GATHERS: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        live = rows < bs
        rows64 = rows.to(tl.int64)
        cols = tl.arange(0, WIDTH_P2)
        ns = tl.load(num_sampled + rows, mask=live, other=0).to(tl.int64)
        nr = tl.load(num_rejected + rows, mask=live, other=0).to(tl.int64)
        window = tl.maximum(ns + nr - 1, 0)
        accepted = tl.maximum(ns - 1, 0)
        bonus = tl.load(sampled + rows64 * S_SAMPLED + accepted, mask=live, other=0)
        slot = tl.load(idx + rows, mask=live, other=0).to(tl.int64)
        # the host row: its named columns, then the drafts the scheduler scheduled
        hosted = live[:, None] & (cols >= COL_HOST)[None, :]
        hosted = hosted & (cols < COL_HOST + HOST_WIDTH - 1)[None, :]
        host_row = host + rows64[:, None] * HOST_WIDTH
        from_host = tl.load(host_row + (cols - COL_HOST)[None, :], mask=hosted, other=0.0)
        scheduled = tl.load(host + rows64 * HOST_WIDTH + HOST_WIDTH - 1, mask=live, other=0.0)
        j = cols - COL_DRAFT
        is_draft = (j >= 0) & (j < GAMMA)
        drafted = is_draft[None, :] & (j[None, :] < scheduled[:, None]) & live[:, None]
        draft = tl.load(drafts + slot[:, None] * S_DRAFTS + j[None, :], mask=drafted, other=-1)
        k = cols - COL_CONFIDENCE
        is_confidence = (k >= 0) & (k < GAMMA)
        if HAS_CONFIDENCE:
            conf = tl.load(confidence + slot[:, None] * S_CONFIDENCE + k[None, :],
                           mask=is_confidence[None, :] & live[:, None], other=0.0)  # fmt: skip
            conf = conf.to(tl.float64)
        else:
            conf = tl.full([ROWS, WIDTH_P2], float("nan"), tl.float64)
        c = cols[None, :]
        value = tl.full([ROWS, WIDTH_P2], float("nan"), tl.float64)
        value = tl.where((c == COL_CAP_TRIM) | (c == COL_EVICTED), 0.0, value)
        g = c - COL_GATHER_OFFSET
        value = tl.where((g >= 0) & (g < 2 * GATHERS), -1.0, value)
        value = tl.where(c == COL_WINDOW, window[:, None].to(tl.float64), value)
        value = tl.where(c == COL_ACCEPTED, accepted[:, None].to(tl.float64), value)
        value = tl.where(c == COL_COMMITTED, ns[:, None].to(tl.float64), value)
        value = tl.where(c == COL_BONUS, bonus[:, None].to(tl.float64), value)
        value = tl.where(hosted, from_host, value)
        value = tl.where(is_draft[None, :], draft.to(tl.float64), value)
        value = tl.where(is_confidence[None, :], conf, value)
        tl.store(out + rows64[:, None] * WIDTH + c, value, mask=live[:, None] & (c < WIDTH))

    _KERNEL = pack
    return pack


class VLLMTritonPacker:
    """`pack(step, seq, stream, out, out_at)`: `TritonPacker`'s interface (`hooks/submit`),
    for vLLM's step: `out[:bs]` filled by one launch on `stream`."""

    by_address = True
    writes_stamp = False

    def __init__(self, layout: StepLayout, device, slots: int, max_bs: int) -> None:
        import torch

        self.kernel = _kernel()  # ImportError without Triton: the caller falls back
        self.layout = layout
        c = layout.columns
        host_at = host_columns(layout)
        self.constants = dict(
            GAMMA=layout.gamma, WIDTH=layout.width,
            WIDTH_P2=1 << (layout.width - 1).bit_length(), HOST_WIDTH=HOST_WIDTH,
            COL_WINDOW=layout.col("window"), COL_ACCEPTED=layout.col("accepted"),
            COL_COMMITTED=layout.col("committed"), COL_CAP_TRIM=layout.col("cap_trim"),
            COL_BONUS=layout.col("bonus"), COL_HOST=host_at.start,
            COL_EVICTED=layout.col("evicted"), COL_DRAFT=c["draft"].start,
            COL_CONFIDENCE=c["confidence"].start, COL_GATHER_OFFSET=c["gather_offset"].start,
            GATHERS=layout.gathers, ROWS=ROWS,
        )  # fmt: skip
        if c["gather_token"].start != c["gather_offset"].stop:
            raise ValueError("the layout's gather offsets and tokens are not adjacent")
        self.device = torch.device(device)
        self.staging = staging_rows(slots, max_bs, pin=True)
        self.staging_np = [s.numpy() for s in self.staging]
        self.staging_at = [s.data_ptr() for s in self.staging]
        self.dummy = torch.zeros(1, dtype=torch.float32, device=self.device)
        self.compiled: dict[tuple, tuple] = {}

    def pack(self, step: VLLMStep, seq: int, stream: int, out, out_at: int) -> None:
        bs = step.bs
        self.staging_np[step.slot][:bs] = step.host
        conf = step.confidence_table
        has_conf = conf is not None
        conf = conf if has_conf else self.dummy
        inputs = (step.idx, step.num_sampled, step.num_rejected, step.sampled,
                  step.draft_table, conf)  # fmt: skip
        strides = (step.sampled.stride(0), step.draft_table.stride(0),
                   conf.stride(0) if has_conf else 0)  # fmt: skip
        key = (*map(_DTYPE, inputs), *strides, has_conf)
        grid = -(-bs // ROWS)
        hit = self.compiled.get(key)
        if hit is not None:
            launch, head, constants = hit
            launch(grid, 1, 1, stream, *head, out_at, self.staging_at[step.slot],
                   *(t.data_ptr() for t in inputs), bs, *constants)  # fmt: skip
            return
        constants = dict(S_SAMPLED=strides[0], S_DRAFTS=strides[1], S_CONFIDENCE=strides[2],
                         HAS_CONFIDENCE=has_conf, **self.constants)  # fmt: skip
        kernel = self.kernel[(grid,)](out, self.staging[step.slot], *inputs, bs, **constants,
                                      num_warps=NUM_WARPS)  # fmt: skip
        if no_launch_hooks():
            self.compiled[key] = (*direct_launch(kernel), tuple(constants.values()))

"""Log-probabilities of chosen tokens from verify logits, at temperature.

`token_logprobs(logits, rows, tokens, temps)[k]` is
`log_softmax(logits[rows[k]] / max(temps[k], 1e-5))[tokens[k]]` in float32.

The verify logits of one DSpark step are [B·(gamma+1), V] with V about 129k:
at B = 256 that is half a gigabyte of bf16, and the hook gathers from it every
step. The obvious torch form (`logits[rows].float() / T`, then `logsumexp`)
writes a [K, V] float32 copy and reads it several times over; the work only
needs each logit read once. So:

- on CUDA with Triton, a fused kernel streams each requested row once, keeping
  an online maximum and sum of exponentials over chunks of V; when there are
  few rows to fill the GPU, each row is split over several programs and a
  second, tiny kernel combines their partial (max, sum) pairs;
- elsewhere (CPU, no Triton, or a kernel that fails to compile) the torch form
  below: chunks of rows, few passes, in place, no [K, V] float32 copy;
- `token_logprobs_reference` keeps the naive form, for comparison.

The fused and torch forms subtract the row's raw maximum before dividing by
the temperature: (x - max) is exact (or rounded once) in float32, so the result
keeps float32's relative precision even at temperatures near zero, where x / T
is ~1e5 (the naive form divides first and loses it there).
Out-of-range rows or tokens are not checked by the kernel (torch raises).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-5
#: Rows per torch chunk: this many bytes of float32. It bounds memory; on an H200 chunks
#: small enough for L2 (16 MiB) were slower, by launches, and larger ones within ~5 %.
TORCH_CHUNK_BYTES = 256 << 20
#: Triton: logits per program iteration, warps per program, programs to aim for per SM
#: (the best or within noise of it on an H200 for K = 2 .. 1792, bench/gpu_gather.py).
BLOCK, NUM_WARPS, PROGRAMS_PER_SM = 8192, 8, 4

_triton_broken = False


def token_logprobs(logits, rows, tokens, temps):
    """float32 [K]: log softmax(logits[rows] / temps.clamp(1e-5)) at tokens.

    logits [N, V] (bf16, fp16 or fp32); rows, tokens [K] (int32 or int64);
    temps [K]. The fused Triton kernel on CUDA, the torch form otherwise, and
    the torch form for good once the kernel has failed (it is logged once).
    """
    global _triton_broken
    if logits.is_cuda and not _triton_broken and rows.numel() and logits.stride(-1) == 1:
        try:
            return token_logprobs_triton(logits, rows, tokens, temps)
        except Exception as exc:  # no Triton, or it cannot compile here: torch is still right
            _triton_broken = True
            log.warning("token_logprobs: Triton kernel unavailable (%r); using torch", exc)
    return token_logprobs_torch(logits, rows, tokens, temps)


def _prepare(logits, rows, tokens, temps):
    import torch

    device = logits.device
    rows = rows.reshape(-1).to(device)
    tokens = tokens.reshape(-1).to(device)
    temps = temps.reshape(-1).to(device=device, dtype=torch.float32)
    return rows, tokens, temps


def token_logprobs_torch(logits, rows, tokens, temps, *, chunk_bytes: int = TORCH_CHUNK_BYTES):
    """The torch form: per chunk of rows, as few passes as eager torch allows.

    The rows are copied in their own dtype, their max taken there (exact), and
    `rows - max` written once as float32 (type promotion does the upcast in
    the same pass); divide, exp and sum then work on that buffer in place.
    The max is 0 after the shift, so no logsumexp (another max, another
    temporary) is needed.
    """
    import torch

    rows, tokens, temps = _prepare(logits, rows, tokens, temps)
    rows, tokens = rows.to(torch.int64), tokens.to(torch.int64)
    temps = temps.clamp_min(MIN_TEMPERATURE)
    k, v = rows.numel(), logits.shape[-1]
    out = torch.empty(k, dtype=torch.float32, device=logits.device)
    step = max(1, chunk_bytes // (4 * v))
    for i in range(0, k, step):
        y = logits.index_select(0, rows[i : i + step])
        x = y - y.amax(1, keepdim=True).to(torch.float32)
        x.div_(temps[i : i + step, None])
        picked = x.gather(1, tokens[i : i + step, None]).squeeze(1)
        out[i : i + step] = picked - x.exp_().sum(1).log_()
    return out


def token_logprobs_reference(logits, rows, tokens, temps, *, chunk_rows: int = 1024):
    """The naive form the hook used: `logits[rows].float() / T`, gather minus logsumexp."""
    import torch

    rows, tokens, temps = _prepare(logits, rows, tokens, temps)
    rows, tokens = rows.to(torch.int64), tokens.to(torch.int64)
    temps = temps.clamp_min(MIN_TEMPERATURE)
    out = torch.empty(rows.numel(), dtype=torch.float32, device=logits.device)
    for i in range(0, rows.numel(), chunk_rows):
        x = logits[rows[i : i + chunk_rows]].to(torch.float32) / temps[i : i + chunk_rows, None]
        picked = x.gather(1, tokens[i : i + chunk_rows, None]).squeeze(1)
        out[i : i + chunk_rows] = picked - torch.logsumexp(x, dim=1)
    return out


def token_logprobs_triton(
    logits,
    rows,
    tokens,
    temps,
    *,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
    programs_per_sm: int = PROGRAMS_PER_SM,
):
    """The fused kernel: each row read once; rows split over programs when K is small.

    While K is under two programs per SM, a row is split into S slices (whole
    blocks) so that K·S reaches about `programs_per_sm` programs per SM;
    otherwise S = 1: one program per row and no second pass (splitting then
    measured no faster). `programs_per_sm=0` forces S = 1.
    """
    import torch

    kernels = _kernels()
    rows, tokens, temps = _prepare(logits, rows, tokens, temps)
    rows, tokens, temps = rows.contiguous(), tokens.contiguous(), temps.contiguous()
    k, v = rows.numel(), logits.shape[-1]
    out = torch.empty(k, dtype=torch.float32, device=logits.device)
    if k == 0:
        return out
    n_blocks = -(-v // block)
    splits = 1
    sms = _sm_count(logits.device)
    if programs_per_sm > 0 and k < 2 * sms:
        splits = min(n_blocks, max(1, -(-programs_per_sm * sms // k)))
    split_len = -(-n_blocks // splits) * block
    splits = -(-v // split_len)
    partial = out.new_empty((2, k, splits)) if splits > 1 else out.new_empty((2, 1, 1))
    kernels.partial[(k, splits)](
        logits, logits.stride(0), rows, tokens, temps, out, partial[0], partial[1],
        v, split_len, splits, BLOCK=block, SINGLE=splits == 1, num_warps=num_warps,
    )  # fmt: skip
    if splits > 1:
        block_s = max(2, 1 << (splits - 1).bit_length())
        block_k = max(1, 4096 // block_s)
        kernels.combine[(-(-k // block_k),)](
            logits, logits.stride(0), rows, tokens, temps, out, partial[0], partial[1],
            k, splits, BLOCK_K=block_k, BLOCK_S=block_s, num_warps=4,
        )  # fmt: skip
    return out


_SM_COUNT: dict = {}


def _sm_count(device) -> int:
    import torch

    if device.type != "cuda":  # Triton's interpreter on CPU, in tests
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


_KERNELS = None


def _kernels():
    """Define the Triton kernels on first use (Triton is imported only here)."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    from types import SimpleNamespace

    import triton
    import triton.language as tl

    @triton.jit
    def partial(
        logits, stride, rows, tokens, temps, out, part_m, part_s,
        V, SPLIT_LEN, S, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
    ):  # fmt: skip
        # Online (max, sum exp) over this program's slice of the row: one read of each logit,
        # one exp each; the sum is kept relative to the running raw maximum m.
        k = tl.program_id(0)
        sp = tl.program_id(1)
        row = tl.load(rows + k).to(tl.int64)
        t = tl.maximum(tl.load(temps + k), 1e-5)
        scale = 1.4426950408889634 / t  # exp(z / t) = exp2(z * scale)
        base = logits + row * stride
        start = sp * SPLIT_LEN
        stop = tl.minimum(start + SPLIT_LEN, V)
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        for off in range(start, stop, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            # slices are whole blocks: only the row's end needs a mask (keeps loads vectorised)
            x = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all -inf block: no NaN
            s = s * tl.exp2((m - m_ref) * scale) + tl.sum(tl.exp2((x - m_ref) * scale), 0)
            m = m_new
        if SINGLE:
            tok = tl.load(tokens + k).to(tl.int64)
            picked = tl.load(base + tok).to(tl.float32)
            tl.store(out + k, (picked - m) / t - tl.log(s))
        else:
            tl.store(part_m + k * S + sp, m)
            tl.store(part_s + k * S + sp, s)

    @triton.jit
    def combine(
        logits, stride, rows, tokens, temps, out, part_m, part_s,
        K, S, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        # Merge each row's S partial (max, sum) pairs, then read the chosen logit.
        ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
        live = ks < K
        sp = tl.arange(0, BLOCK_S)
        at = ks[:, None] * S + sp[None, :]
        both = live[:, None] & (sp[None, :] < S)
        m = tl.load(part_m + at, mask=both, other=float("-inf"))
        s = tl.load(part_s + at, mask=both, other=0.0)
        t = tl.maximum(tl.load(temps + ks, mask=live, other=1.0), 1e-5)
        m_row = tl.max(m, 1)
        m_ref = tl.where(m_row == float("-inf"), 0.0, m_row)
        total = tl.sum(s * tl.exp2((m - m_ref[:, None]) * (1.4426950408889634 / t)[:, None]), 1)
        row = tl.load(rows + ks, mask=live, other=0).to(tl.int64)
        tok = tl.load(tokens + ks, mask=live, other=0).to(tl.int64)
        picked = tl.load(logits + row * stride + tok, mask=live, other=0.0).to(tl.float32)
        tl.store(out + ks, (picked - m_row) / t - tl.log(total), mask=live)

    _KERNELS = SimpleNamespace(partial=partial, combine=combine)
    return _KERNELS

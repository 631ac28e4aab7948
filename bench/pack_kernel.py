"""The hook's pack kernel alone at small batches: its launch shape against the floor.

At B = 16 the rows a step must read fill a fraction of a large GPU, so the kernel's time
is set by its chain of dependent loads (the request's scalars, a slice's blocks, the
row's ticket and partials) more than by bandwidth. This sweeps the launch shape that
sets that chain, slices a row takes and logits a load reads (with the warps that read
them), and times each shape where the step leaves the kernel: right after H1's LM-head
GEMM has written the logits (`bench/hook_step.py`'s stand-in), between two CUDA events,
cycling H1's 16 steps (every request sampled, windows 2..7).

Each shape's packed blocks are first held to the torch form's (`against_torch_form`: NaN
places, the largest absolute and relative difference; these logits reach a few hundred,
so a log-probability's float32 step is about 6e-5). Beside them, two references for the same rows:

- `floor`: the bytes of exactly the rows the numbers need, at the read bandwidth a bare
  `amax` over 4 GiB reaches in the same run and at the card's nominal bandwidth;
- `bare_read`: one Triton launch that only streams those rows (a row's address loaded
  from a table, its maximum and sum of exponentials written), with the same slices and
  loads as the best shape: what a one-launch pass over them in that shape costs;
- `amax_same_bytes`: torch's `amax` over as many contiguous bytes of the logits: one
  library reduction over the same amount of memory, the nearest thing to the floor that
  one launch reaches on this card.

Needs CUDA and Triton; `python -m bench.pack_kernel [--json] [--quick]`.
"""

from __future__ import annotations

import statistics
from functools import partial

from .common import record, run_alone, skipped_without
from .hook_step import GAMMA, StandInStep, V, _floor_bytes, _read_bandwidth, _steps, needed_rows

NAME = "H1_pack_kernel"
#: (slices, logits a load, warps); the kernel's default shape is the first at each batch
#: (None: the slices `splits_for` picks)
SHAPES = {
    16: [(None, 8192, 4), (2, 8192, 4), (8, 8192, 4), (16, 8192, 4), (4, 4096, 4),
         (8, 4096, 4), (4, 8192, 8), (4, 16384, 8), (1, 32768, 16)],
    32: [(None, 8192, 4), (1, 8192, 4), (4, 8192, 4)],
    64: [(None, 8192, 4), (2, 8192, 4)],
    256: [(None, 8192, 4), (None, 4096, 4)],
}  # fmt: skip
#: nominal HBM read bandwidth by device name prefix, bytes a second
NOMINAL = {"NVIDIA H100": 3.35e12, "NVIDIA H200": 4.8e12}


def run(quick: bool) -> list[dict]:
    skipped = skipped_without(NAME, "triton")
    if skipped is not None:
        return skipped
    import torch

    bandwidth = _read_bandwidth()
    name = torch.cuda.get_device_name()
    nominal = next((v for k, v in NOMINAL.items() if name.startswith(k)), None)
    out = []
    for b, shapes in SHAPES.items():
        if quick and b != 16:
            continue
        out.append(_batch_record(b, shapes, bandwidth, nominal, 40 if quick else 200))
    return out


def _batch_record(b: int, shapes, bandwidth: float, nominal, calls: int) -> dict:
    import torch

    from dspark_obs.hooks.observed_step import ObservedStep
    from dspark_obs.hooks.pack_torch import TorchPacker
    from dspark_obs.hooks.pack_triton import TritonPacker
    from dspark_obs.hooks.step_layout import StepLayout

    gemm = StandInStep(b)
    logits = gemm.hidden @ gemm.weight
    kws = _steps(b, "cuda", V)
    floors = [_floor_bytes(kw) for kw in kws]
    for kw in kws:
        kw["target_logits"] = logits
    steps = [ObservedStep.from_observer(kw) for kw in kws]
    layout = StepLayout(GAMMA)
    stream = torch.cuda.current_stream().cuda_stream

    def out_block():
        return torch.empty((b, layout.width), dtype=torch.float64, device="cuda")

    def packer(shape):
        split, block, warps = shape
        stamp = torch.zeros(1, dtype=torch.int64, device="cuda")
        p = TritonPacker(layout, max(b, 64), "cuda", b, stamp, block=block, num_warps=warps)
        if split is not None:
            p.splits[b] = split
        return p

    def blocks(p):
        o, got = out_block(), []
        for i, step in enumerate(steps):
            p.pack(step, i + 1, stream, o, o.data_ptr())
            got.append(o.clone())
        return torch.stack(got).cpu()

    want = blocks(TorchPacker(layout, max(b, 64), "cuda"))
    equal = {}
    for shape in shapes:
        got = blocks(packer(shape))
        diff = (got - want).nan_to_num().abs()
        equal[_label(shape)] = dict(
            same_nan=bool(torch.equal(got.isnan(), want.isnan())),
            max_abs=diff.max().item(),
            max_rel=(diff / want.nan_to_num().abs().clamp(min=1.0)).max().item(),
        )
    live = {shape: (packer(shape), out_block()) for shape in shapes}
    for p, o in live.values():  # compile each shape's launch before timing
        for i, step in enumerate(steps):
            p.pack(step, 100 + i, stream, o, o.data_ptr())
    seq = {shape: 1000 for shape in shapes}
    times: dict = {shape: [] for shape in shapes}
    for _ in range(max(1, calls // 20)):  # shapes take turns, 20 calls each: drift falls alike
        for shape, (p, o) in live.items():
            for _ in range(20):
                n = seq[shape]
                call = partial(p.pack, steps[n % len(steps)], n, stream, o, o.data_ptr())
                times[shape].append(_after_gemm(gemm, logits, call))
                seq[shape] += 1
    med = {s: _median_seconds(v) for s, v in times.items()}
    best = min(med, key=med.get)
    bare = _bare_read(gemm, logits, kws, best, live[best][0].splits[b], calls)
    floor_bytes = statistics.median(floors)
    amax = _amax_read(gemm, logits, int(floor_bytes) // 2, calls)
    floor_measured = floor_bytes / bandwidth
    rec = record(NAME, {"B": b, "gamma": GAMMA, "V": V, "calls": calls}, "us",
                 [a.elapsed_time(z) * 1e-3 for a, z in times[best]], 1e6)  # fmt: skip
    rec.update(
        device=torch.cuda.get_device_name(),
        default_shape=_label(shapes[0]),
        default_splits=live[shapes[0]][0].splits.get(b),
        best_shape=_label(best),
        shapes_us={_label(s): round(v * 1e6, 2) for s, v in med.items()},
        against_torch_form=equal,
        bare_read_us=round(bare * 1e6, 2),
        floor_us_measured_bw=round(floor_measured * 1e6, 2),
        floor_us_nominal_bw=None if nominal is None else round(floor_bytes / nominal * 1e6, 2),
        read_bandwidth_TBps=round(bandwidth / 1e12, 2),
        default_to_floor=round(med[shapes[0]] / floor_measured, 2),
        best_to_floor=round(med[best] / floor_measured, 2),
        bare_read_to_floor=round(bare / floor_measured, 2),
        amax_same_bytes_us=round(amax * 1e6, 2),
        best_to_amax_same_bytes=round(med[best] / amax, 2),
    )
    return rec


def _label(shape) -> str:
    split, block, warps = shape
    return f"{'default' if split is None else split}x{block}/{warps}w"


def _after_gemm(gemm, logits, call) -> tuple:
    """`call()` between two CUDA events, enqueued right after the stand-in's GEMM has written
    the logits (as in the step); the events, read once the GPU is done."""
    import torch

    torch.matmul(gemm.hidden, gemm.weight, out=logits)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    call()
    e1.record()
    return e0, e1


def _median_seconds(events: list[tuple]) -> float:
    import torch

    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(z) * 1e-3 for a, z in events)


def _bare_read(gemm, logits, kws, shape, split: int, calls: int) -> float:
    """Median seconds of one launch that streams each step's needed rows and nothing else."""
    import torch

    block, warps = shape[1], shape[2]
    chunk = max(1, -(-V // (split * block))) * block
    tables = []
    for kw in kws:
        target, draft = needed_rows(kw)
        logits_of = kw["draft_block"].corrected_logits
        rows = [logits[r].data_ptr() for r in target]
        rows += [logits_of[i, j].data_ptr() for i, j in draft]
        tables.append(torch.tensor(rows, dtype=torch.int64, device="cuda"))
    out = torch.empty((max(len(t) for t in tables), split, 2), dtype=torch.float32, device="cuda")
    kernel = _bare_kernel()

    def launch(t):
        kernel[(len(t), split)](t, out, V, CH=chunk, BLOCK=block, num_warps=warps)

    times = [_after_gemm(gemm, logits, partial(launch, tables[i % len(tables)]))
             for i in range(calls)]  # fmt: skip
    return _median_seconds(times[5:])  # the first launches compile


def _amax_read(gemm, logits, n: int, calls: int) -> float:
    """Median seconds of torch's `amax` over the first `n` logits, right after the GEMM."""
    flat = logits.view(-1)[: min(n, logits.numel())]
    return _median_seconds([_after_gemm(gemm, logits, flat.amax) for _ in range(calls)][5:])


def _bare_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def bare(rows, out, n, CH: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0)
        c = tl.program_id(1)
        base = tl.load(rows + i).to(tl.pointer_type(tl.bfloat16))
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        for off in range(0, CH, BLOCK):
            idx = c * CH + off + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < n, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp2(m - m_ref) + tl.sum(tl.exp2(x - m_ref), 0)
            m = m_new
        at = out + (i * tl.num_programs(1) + c) * 2
        tl.store(at, m)
        tl.store(at + 1, s)

    return bare


if __name__ == "__main__":
    run_alone(run)

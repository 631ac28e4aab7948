"""The fused Triton pass against the torch form and the numpy tail walk, on a GPU.

Skipped without CUDA or Triton (CI has neither): the torch form carries the hook's
tests there (tests/test_sglang_hook.py, tests/test_pack_walk.py), and the kernel's
columns are held to the layout by tests/test_pack_layout.py. Here both passes see the
same steps, each with its own tail table, and must write the same packed blocks:
identical integers and NaN places, log-probabilities within 1e-5; the kernel's gathers
are what the numpy walk asks for (the adapter of tests/test_pack_walk.py); and the whole
hook on the GPU must publish what the synchronous reference does.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from dspark_obs.hooks.observed_step import ObservedStep  # noqa: E402
from dspark_obs.hooks.pack_torch import TorchPacker  # noqa: E402
from dspark_obs.hooks.pack_triton import MAX_SPLITS, TritonPacker  # noqa: E402
from dspark_obs.hooks.sglang_worker import SOURCE, attach  # noqa: E402
from dspark_obs.hooks.step_layout import StepLayout  # noqa: E402
from dspark_obs.pipeline import build_pipeline  # noqa: E402
from tests.hook_reference import FakeObservers as Observers  # noqa: E402
from tests.hook_reference import StepStream, reference_batch  # noqa: E402
from tests.test_pack_walk import STREAMS, held_to_the_numpy_walk  # noqa: E402
from tests.test_sglang_hook import metrics, rows_the_hook_reads  # noqa: E402


def to_cuda(value, dtype=None):
    if isinstance(value, torch.Tensor):
        value = value.cuda()
        return value.to(dtype) if dtype is not None and value.is_floating_point() else value
    if isinstance(value, SimpleNamespace):
        return SimpleNamespace(**{k: to_cuda(v, dtype) for k, v in vars(value).items()})
    if isinstance(value, dict):
        return {k: to_cuda(v, dtype) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    "options",
    [dict(), dict(greedy_draft=True), dict(confidence=False), dict(greedy_every=0, agree=0.9)],
    ids=["mixed", "greedy-draft", "no-confidence", "sampled-long-tails"],
)
@pytest.mark.parametrize("vocab", [6, 20_000])
@pytest.mark.parametrize("slices", [1, 4, MAX_SPLITS], ids=["one-program-a-row", "4-slices",
                                                           "most-slices"])  # fmt: skip
def test_the_kernel_writes_what_the_torch_form_writes(options, vocab, slices):
    """Rows read whole by one program, split over 4 slices (the split of a batch of 16 on
    an H200), and over the most slices (empty ones included where the vocabulary is
    small), must give the same blocks."""
    stream = StepStream(seed=7, vocab=vocab, requests=12, **options)
    fused, gathered = same_blocks(stream, programs_per_sm_for(slices), range(1, 81))
    if options.get("greedy_every") == 0:
        assert gathered > 50
    if slices == 4:  # the steps' batches are 8 to 12 requests: most take 4 slices
        assert 4 in set(fused.splits.values()) <= {4, 8}
    else:
        assert set(fused.splits.values()) == {slices}


def programs_per_sm_for(slices: int) -> int:
    """Programs per SM that split the rows of a batch of 8 to 12 requests (64 to 96 rows)
    into `slices`: 1 (never split), 4 (about 448 programs) or the most."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return {1: 0, 4: max(1, round(448 / sms)), MAX_SPLITS: 1000}[slices]


def test_step_numbers_past_int32_keep_the_blocks_and_the_stamp():
    """The step number is a 32-bit launch argument until it outgrows one; the kernel is then
    compiled again with a 64-bit one, and the tails opened before go on being walked."""
    stream = StepStream(seed=3, vocab=2_000, requests=12, greedy_every=0, agree=0.9)
    fused, gathered = same_blocks(stream, 0, range(2**31 - 12, 2**31 + 12))
    assert gathered > 10
    assert len(fused.compiled) == 2


def same_blocks(stream, programs_per_sm: int, seqs) -> tuple[TritonPacker, int]:
    """Pack the stream's steps with both passes, numbered `seqs`; the blocks must agree.
    Returns the packer and how many tail gathers the blocks held."""
    layout = StepLayout(stream.g)
    ref = TorchPacker(layout, 64, "cuda")
    out = torch.empty((64, layout.width), dtype=torch.float64, device="cuda")
    stamp = torch.zeros(1, dtype=torch.int64, device="cuda")
    fused = TritonPacker(layout, 64, "cuda", 64, stamp, programs_per_sm=programs_per_sm)
    cuda_stream = torch.cuda.current_stream().cuda_stream
    gathered = 0
    for seq in seqs:
        step = ObservedStep.from_observer(to_cuda(stream.step()))
        want = torch.empty((64, layout.width), dtype=torch.float64, device="cuda")
        ref.pack(step, seq, cuda_stream, want, want.data_ptr())
        fused.pack(step, seq, cuda_stream, out, out.data_ptr())
        got, want = out[: step.bs].cpu().numpy(), want[: step.bs].cpu().numpy()
        assert int(stamp) == seq
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        gathered += int((got[:, layout.columns["gather_offset"]] >= 0).sum())
    return fused, gathered


@pytest.mark.parametrize("options", STREAMS.values(), ids=STREAMS.keys())
def test_the_kernel_gathers_what_the_numpy_walk_asks_for(options):
    """The adapter of tests/test_pack_walk.py on the kernel's blocks: no request leaves its
    slot, so the gathers are the numpy walk's triples exactly, with its values."""
    stream = StepStream(seed=13, requests=10, **options)
    stream.churn = lambda: None
    layout = StepLayout(stream.g)
    out = torch.empty((64, layout.width), dtype=torch.float64, device="cuda")
    stamp = torch.zeros(1, dtype=torch.int64, device="cuda")
    fused = TritonPacker(layout, 64, "cuda", 64, stamp)
    cuda_stream = torch.cuda.current_stream().cuda_stream

    def pack(step, seq):
        fused.pack(step, seq, cuda_stream, out, out.data_ptr())
        return out[: step.bs].cpu().numpy()

    counts = held_to_the_numpy_walk(stream, 150, pack, to_cuda)
    assert counts["asked"] > 40
    assert counts["extra"] == 0 and counts["evicted"] == 0


@pytest.mark.parametrize("direct", [True, False], ids=["kernel-into-ring", "copies"])
def test_the_hook_on_a_gpu_publishes_what_the_reference_does(direct, monkeypatch):
    """The kernel writing the ring slot and the stream its stamp, or (where the stream
    cannot write values) a device buffer copied. No request moves slot: the device keeps
    open tails by slot (docs/sglang.md)."""
    if not direct:
        from dspark_obs.hooks.device_copy import DeviceCopy

        monkeypatch.setattr(DeviceCopy, "can_write_values", lambda self: False)
    stream = StepStream(seed=9, vocab=50_000, requests=16, greedy_every=3, agree=0.8, moves=False)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    reference = build_pipeline(stream.g)
    for _ in range(60):
        kw = stream.step()
        worker._observers.observe_verify_step(**to_cuda(kw, torch.bfloat16))
        # the reference reads the same bf16 logits, widened on the host, and learns from the
        # rows the hook reads
        batch, gather = reference_batch(to_cuda(kw, torch.bfloat16), stream.g)
        reference.ingest(rows_the_hook_reads(batch), SOURCE, gather)
        hook.drain()
    assert isinstance(hook.submitter.packer, TritonPacker) and hook.submitter.direct == direct
    assert_close_metrics(metrics(hook.pipeline), metrics(reference))
    hook.close()


def assert_close_metrics(got: str, want: str) -> None:
    """The same series with the same values, up to float32 summation order: the kernel and
    the torch form add a row's exponentials in different orders."""
    got_lines, want_lines = got.splitlines(), want.splitlines()
    assert len(got_lines) == len(want_lines)
    for a, b in zip(got_lines, want_lines, strict=True):
        if a.startswith("#") or a == b:
            assert a == b
            continue
        name_a, value_a = a.rsplit(" ", 1)
        name_b, value_b = b.rsplit(" ", 1)
        assert name_a == name_b
        assert float(value_a) == pytest.approx(float(value_b), rel=1e-6, abs=1e-9), a

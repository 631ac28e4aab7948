"""vLLM's one-launch pass against the torch form it is defined by, on a GPU.

Skipped without CUDA or Triton (CI has neither): there the torch form carries vLLM's hook
tests (tests/test_vllm_hook.py). Here both passes see the same steps, the torch form on
the CPU, and must write the same blocks bit for bit (NaN places included): every column
is a token id, a count, a float32 confidence or a float64 copied from the host, so
nothing may differ.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from dspark_obs.hooks.step_layout import StepLayout  # noqa: E402
from dspark_obs.hooks.vllm_pack import VLLMPacker, VLLMStep  # noqa: E402
from dspark_obs.hooks.vllm_pack_triton import ROWS, VLLMTritonPacker  # noqa: E402

GAMMA, SLOTS, VOCAB = 7, 64, 50_000


def steps(seed: int, *, confidence: bool, token_dtype, draft_slots: int = SLOTS):
    """Random steps as vLLM's sampler leaves them: a request-state table of drafts (and
    confidences), and per step a batch of slots with its counts and sampled tokens."""
    rng = np.random.default_rng(seed)
    drafts = torch.from_numpy(rng.integers(0, VOCAB, (draft_slots, GAMMA + 3))).to(token_dtype)
    drafts = drafts[:, :GAMMA]  # a row stride other than gamma
    conf = torch.from_numpy(rng.uniform(0, 1, (draft_slots, GAMMA))).float() if confidence else None
    for bs in (1, 2, ROWS - 1, ROWS, ROWS + 1, 48, SLOTS):
        slots = rng.permutation(draft_slots)[:bs]
        scheduled = rng.integers(1, GAMMA + 1, bs)
        admitted = np.minimum(rng.integers(0, GAMMA + 1, bs), scheduled)
        accepted = np.minimum(rng.geometric(0.4, bs) - 1, admitted)
        num_sampled = accepted + 1
        num_sampled[rng.random(bs) < 0.1] = 0  # a row that sampled nothing
        host = np.empty((bs, 5))
        host[:, 0] = rng.integers(10, 4000, bs)
        host[:, 1] = slots
        temperature = rng.choice([0.0, 0.7, 1.0], bs)
        host[:, 2] = temperature == 0.0
        host[:, 3] = temperature
        host[:, 4] = scheduled
        sampled = torch.from_numpy(rng.integers(0, VOCAB, (bs + 3, GAMMA + 1))).to(token_dtype)
        yield SimpleNamespace(
            bs=bs, idx=torch.from_numpy(np.concatenate([slots, [0, 0]]).astype(np.int32)),
            num_sampled=torch.from_numpy(np.append(num_sampled, 0).astype(np.int32)),
            num_rejected=torch.from_numpy(np.append(admitted - accepted, 0).astype(np.int32)),
            sampled=sampled, drafts=drafts, conf=conf, host=host,
        )  # fmt: skip


def make_step(s, device, slot: int) -> VLLMStep:
    on = {k: None if v is None else v.to(device) for k, v in
          dict(idx=s.idx, ns=s.num_sampled, nr=s.num_rejected, sampled=s.sampled,
               drafts=s.drafts, conf=s.conf).items()}  # fmt: skip
    return VLLMStep(s.bs, slot, on["idx"], on["ns"], on["nr"], on["sampled"], on["drafts"],
                    on["conf"], s.host)  # fmt: skip


@pytest.mark.parametrize("confidence", [True, False], ids=["adaptive", "static"])
@pytest.mark.parametrize("token_dtype", [torch.int64, torch.int32])
def test_the_kernel_writes_what_the_torch_form_writes(confidence, token_dtype):
    layout = StepLayout(GAMMA)
    cpu = VLLMPacker(layout, "cpu", slots=4, max_bs=SLOTS)
    gpu = VLLMTritonPacker(layout, "cuda", slots=4, max_bs=SLOTS)
    out = torch.full((SLOTS, layout.width), 7.0, dtype=torch.float64, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    checked = 0
    for seq, s in enumerate(steps(3, confidence=confidence, token_dtype=token_dtype), 1):
        want = torch.empty((SLOTS, layout.width), dtype=torch.float64)
        cpu.pack(make_step(s, "cpu", seq % 4), seq, 0, want, 0)
        out.fill_(7.0)
        gpu.pack(make_step(s, "cuda", seq % 4), seq, stream, out, out.data_ptr())
        got = out.cpu().numpy()
        assert np.array_equal(got[: s.bs], want[: s.bs].numpy(), equal_nan=True), f"bs={s.bs}"
        assert (got[s.bs :] == 7.0).all(), "rows past the batch are left alone"
        checked += 1
    # the later launches took the direct path
    assert len(gpu.compiled) == 1 and checked == 7

"""Token log-probabilities at temperature against an independent float64 log_softmax.

The torch form is checked on CPU; the Triton kernel only where CUDA is there.
Near-zero temperatures (clamped at 1e-5) make log-probabilities of ~1e5 that
float32 holds only to ~1e-7 relative, so the tolerance is 1e-5 absolute plus
1e-6 of the value: for temperatures near 1 that is 1e-5 absolute.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dspark_obs.hooks.token_logprobs import (  # noqa: E402
    token_logprobs,
    token_logprobs_reference,
    token_logprobs_torch,
    token_logprobs_triton,
)

V = 1003  # a multiple of no chunk or block size
TEMPS = (1e-7, 1e-3, 0.7, 1.0, 1.3)


def expected(logits, rows, tokens, temps):
    x = logits.double().cpu()[rows.long().cpu()] / temps.double().cpu().clamp_min(1e-5)[:, None]
    return torch.log_softmax(x, dim=1).gather(1, tokens.long().cpu()[:, None]).squeeze(1)


def problem(dtype, k: int, device="cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = 9
    logits = (torch.randn(n, V, generator=gen) * 4).to(dtype)
    logits[2, 700:] = float("-inf")  # masked vocabulary: whole blocks of -inf
    rows = torch.randint(0, n, (k,), generator=gen)  # repeats
    tokens = torch.randint(0, 700, (k,), generator=gen)
    temps = torch.tensor(TEMPS)[torch.randint(0, len(TEMPS), (k,), generator=gen)]
    return logits.to(device), rows.to(device), tokens.to(device), temps.to(device)


def check(got, want):
    assert got.dtype == torch.float32 and got.shape == want.shape
    got = got.double().cpu()
    assert torch.isfinite(got).all()
    assert ((got - want).abs() <= 1e-5 + 1e-6 * want.abs()).all(), (got - want).abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_torch_form_matches_float64(dtype, index):
    logits, rows, tokens, temps = problem(dtype, 64)
    rows, tokens = rows.to(index), tokens.to(index)
    want = expected(logits, rows, tokens, temps)
    check(token_logprobs(logits, rows, tokens, temps), want)
    for chunk_bytes in (1, 4 * V * 3, 1 << 30):  # one row, three rows, everything per chunk
        check(token_logprobs_torch(logits, rows, tokens, temps, chunk_bytes=chunk_bytes), want)


def test_near_zero_temperature_is_greedy():
    logits, rows, tokens, _ = problem(torch.bfloat16, 32)
    top = logits.float().argmax(1)
    logits[torch.arange(len(logits)), top] += 1.0  # a unique maximum: no ties in bf16
    tokens = top[rows]
    got = token_logprobs(logits, rows, tokens, torch.full((32,), 1e-9))
    assert got.abs().max() < 1e-5


def test_reference_form_and_empty():
    logits, rows, tokens, temps = problem(torch.bfloat16, 40)
    temps = temps.clamp_min(0.5)  # the naive form divides before subtracting the max
    want = expected(logits, rows, tokens, temps)
    check(token_logprobs_reference(logits, rows, tokens, temps, chunk_rows=7), want)
    empty = torch.zeros(0, dtype=torch.int64)
    for fn in (token_logprobs, token_logprobs_torch, token_logprobs_reference):
        out = fn(logits, empty, empty, torch.zeros(0))
        assert out.shape == (0,) and out.dtype == torch.float32


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [0, 1, 5, 300, 3000])
def test_triton_matches_float64(dtype, k):
    pytest.importorskip("triton")
    logits, rows, tokens, temps = problem(dtype, k, "cuda", seed=k)
    want = expected(logits, rows, tokens, temps)
    for programs_per_sm in (0, 4, 1000):  # one program per row; split rows; split to blocks
        for block in (256, 8192):
            got = token_logprobs_triton(
                logits, rows.int(), tokens, temps, block=block, programs_per_sm=programs_per_sm
            )
            check(got, want)
    check(token_logprobs(logits, rows, tokens, temps), want)


@cuda
def test_triton_at_verify_size():
    pytest.importorskip("triton")
    gen = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(64, 129_280, generator=gen, device="cuda").mul_(4).bfloat16()
    rows = torch.arange(64, device="cuda").repeat(2)
    tokens = torch.randint(0, 129_280, (128,), generator=gen, device="cuda")
    temps = torch.rand(128, generator=gen, device="cuda") + 0.5
    check(token_logprobs_triton(logits, rows, tokens, temps), expected(logits, rows, tokens, temps))

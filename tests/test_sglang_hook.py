"""The in-process SGLang hook, driven with SGLang's tensor shapes on CPU.

No SGLang worker runs here. The fake worker below exposes an observer whose
keyword signature is SGLang 0.5.23's `DsparkStepObservers.observe_verify_step`,
and the step tensors have the shapes SGLang passes: drafts [bs, gamma], the
draft's corrected logits [bs, gamma, V], the target's verify logits
[bs * (gamma + 1), V], per-request counts [bs].
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dspark_obs.hooks.sglang_worker import SOURCE, attach  # noqa: E402

G, V = 4, 32


class Observers:
    def __init__(self) -> None:
        self.calls = 0

    def observe_verify_step(
        self,
        *,
        forward_ct,
        reqs,
        bs,
        proposal_folded,
        verify_ids_2d,
        target_logits,
        layout,
        confidence,
        confidence_raw,
        prefix_lens,
        draft_tokens,
        draft_block,
        sampling_info,
        correct_len,
        cap_trim_lens,
        bonus,
        commit_lens,
        verify_token_budget,
        req_pool_indices,
        verify_tier_num_tokens,
        dp_tier_num_tokens,
    ) -> None:
        self.calls += 1


def step(forward_ct: int, gen: torch.Generator, prefix: torch.Tensor, windows, accepted):
    bs = len(windows)
    draft = torch.randint(0, V, (bs, G), generator=gen)
    w = torch.tensor(windows)
    cl = torch.tensor(accepted)
    return dict(
        forward_ct=forward_ct,
        reqs=[SimpleNamespace(rid=f"gsm8k-{i}") for i in range(bs)],
        bs=bs,
        proposal_folded=False,
        verify_ids_2d=torch.zeros(bs, G + 1, dtype=torch.int64),
        target_logits=torch.randn(bs * (G + 1), V, generator=gen),
        layout=SimpleNamespace(verify_lens=(w + 1).to(torch.int32)),
        confidence=torch.rand(bs, G, generator=gen),
        confidence_raw=torch.randn(bs, G, generator=gen),
        prefix_lens=prefix.clone(),
        draft_tokens=draft,
        draft_block=SimpleNamespace(
            corrected_logits=torch.randn(bs, G, V, generator=gen),
            temperatures=torch.tensor([[1.0], [0.7]][:bs]),
            greedy_mask=torch.tensor([True, False][:bs]),
        ),
        sampling_info=SimpleNamespace(temperatures=torch.tensor([[1.0], [0.7]][:bs])),
        correct_len=cl,
        cap_trim_lens=torch.zeros(bs, dtype=torch.int64),
        bonus=torch.randint(0, V, (bs,), generator=gen),
        commit_lens=cl + 1,
        verify_token_budget=int(w.sum()),
        req_pool_indices=torch.arange(bs),
        verify_tier_num_tokens=int((w + 1).sum()),
        dp_tier_num_tokens=None,
    )


def reference_logprob(logits: torch.Tensor, token: int, temp: float) -> float:
    return float(torch.log_softmax(logits.double() / temp, dim=-1)[token])


def test_steps_become_batches_with_logprobs_from_the_logits():
    worker = SimpleNamespace(_observers=Observers())
    original = worker._observers
    hook = attach(worker, gamma=G)
    assert hook is not None
    gen = torch.Generator().manual_seed(0)
    kw = step(7, gen, torch.tensor([10, 20]), windows=[2, 4], accepted=[2, 1])
    captured = []
    hook.pipeline.ingest = lambda batch, source, gather: captured.append((batch, source, gather))
    worker._observers.observe_verify_step(**kw)
    assert original.calls == 1  # SGLang's own observers still run
    (batch, source, gather) = captured[0]
    assert source == SOURCE and batch.forward_ct == 7 and batch.bs == 2
    assert batch.rid.tolist() == ["gsm8k-0", "gsm8k-1"]
    assert batch.window.tolist() == [2, 4] and batch.correct_drafts.tolist() == [2, 1]
    assert batch.greedy.tolist() == [1, 0]
    assert batch.temperature.tolist() == pytest.approx([0.0, 0.7])
    batch.validate()
    temps = [1.0, 0.7]
    for b in range(2):
        for j in range(G):
            row = kw["target_logits"][b * (G + 1) + j]
            want = reference_logprob(row, int(kw["draft_tokens"][b, j]), temps[b])
            if j < [2, 4][b]:
                assert batch.target_logprobs[b, j] == pytest.approx(want, abs=1e-5)
            else:
                assert np.isnan(batch.target_logprobs[b, j])
            q = reference_logprob(
                kw["draft_block"].corrected_logits[b, j], int(kw["draft_tokens"][b, j]), temps[b]
            )
            assert batch.draft_logprobs[b, j] == pytest.approx(q, abs=1e-5)
        bonus_row = kw["target_logits"][b * (G + 1) + [2, 1][b]]
        assert batch.bonus_logprob[b] == pytest.approx(
            reference_logprob(bonus_row, int(kw["bonus"][b]), temps[b]), abs=1e-5
        )
    np.testing.assert_allclose(
        batch.survival, np.cumprod(kw["confidence"].numpy(), axis=1), rtol=1e-6
    )
    got = gather(np.array([1]), np.array([1]), np.array([5]))
    want = reference_logprob(kw["target_logits"][1 * (G + 1) + 1], 5, 0.7)
    assert got[0] == pytest.approx(want, abs=1e-5)


def test_the_hook_feeds_the_estimator_over_several_steps():
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=G)
    gen = torch.Generator().manual_seed(1)
    prefix = torch.tensor([10, 20])
    for fct in range(40):
        kw = step(fct, gen, prefix, windows=[2, 3], accepted=[2, 1])
        worker._observers.observe_verify_step(**kw)
        prefix = prefix + kw["correct_len"] + 1
    records, errors, _ = hook.pipeline.stats.snapshot()
    assert records[SOURCE] == 40 and not errors and hook.failures == 0
    hook.pipeline.estimator.close()
    assert hook.pipeline.estimator.walker.opened == 40  # request 0 trims every step


def test_a_different_interface_is_left_alone_with_one_warning():
    class Other:
        def observe_verify_step(self, *, forward_ct, reqs):
            pass

    worker = SimpleNamespace(_observers=Other())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert attach(worker, gamma=G) is None
    assert len(caught) == 1 and "not attached" in str(caught[0].message)
    with pytest.warns(RuntimeWarning):
        assert attach(SimpleNamespace(), gamma=G) is None


def test_a_failing_step_is_counted_never_raised():
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=G)
    gen = torch.Generator().manual_seed(2)
    kw = step(0, gen, torch.tensor([10, 20]), windows=[2, 3], accepted=[2, 1])
    kw["draft_tokens"] = kw["draft_tokens"][:, :2]  # a shape the hook cannot use
    worker._observers.observe_verify_step(**kw)
    assert hook.failures == 1
    assert hook.pipeline.stats.snapshot()[1][(SOURCE, "hook_failed")] == 1

"""The hook on SGLang 0.5.23's own DSpark observer and draft-block types, on CPU.

These tests import SGLang itself (tests/sglang_real.py): `DsparkStepObservers`, the
object the hook wraps, with SGLang's `/server_info` dumper and block-accept recorder
switched on, as an operator would; `DraftBlockResult`, the frozen msgspec struct the
worker hands its observers; and `RaggedVerifyLayout`. They need the `sglang` package,
which pins a torch the rest of the suite does not use, so the test command installs it
in a second environment and runs this file there (tools/test.sh); in the main
environment the file skips. What around those types is not SGLang's own, and why, is
in tests/sglang_real.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sglang")

from dspark_obs.hooks.sglang_worker import OBSERVER_PARAMETERS, SOURCE, attach
from dspark_obs.pipeline import build_pipeline
from tests.hook_reference import StepStream, reference_batch
from tests.sglang_real import DraftBlockResult, DsparkStepObservers, as_sglang
from tests.sglang_real import observers as sglang_observers
from tests.test_sglang_hook import assert_same_batch, metrics, rows_the_hook_reads


def observers(gamma: int, tmp_path, monkeypatch) -> DsparkStepObservers:
    """SGLang's observers with its own two collection paths on: the `/server_info`
    dumper and the block-accept JSONL recorder."""
    monkeypatch.setenv("SGLANG_DSPARK_DEBUG_DUMP", "core,step_cpu_time")
    monkeypatch.setenv("SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", str(tmp_path / "ba.jsonl"))
    return sglang_observers(gamma)


def test_the_hook_knows_sglangs_own_observer_signature():
    import inspect

    params = inspect.signature(DsparkStepObservers.observe_verify_step).parameters.values()
    assert {p.name for p in params if p.kind is p.KEYWORD_ONLY} == OBSERVER_PARAMETERS
    assert set(DraftBlockResult.__struct_fields__) == {
        "draft_tokens", "corrected_logits", "greedy_mask", "temperatures", "greedy_draft",
    }  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [dict(), dict(folded=True), dict(greedy_draft=True), dict(greedy_every=0)],
    ids=["eager-mixed", "folded", "greedy-draft", "all-sampled"],
)
def test_every_step_on_sglangs_own_observers(options, tmp_path, monkeypatch):
    """Attached to a real DsparkStepObservers, the hook publishes what the synchronous
    reference does on every step, folded and greedy-draft ones included, while SGLang's
    own paths run beside it: the dumper records every step, and the block-accept recorder
    skips folded proposals and greedy drafts, which the hook does not. No request moves
    slot (the device keeps tails by slot; tests/test_sglang_hook.py has the moves)."""
    stream = StepStream(seed=11, vocab=30, requests=8, moves=False, **options)
    obs = observers(stream.g, tmp_path, monkeypatch)
    worker = SimpleNamespace(_observers=obs)
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    assert hook is not None
    got = []
    ingest = hook.pipeline.ingest
    hook.pipeline.ingest = lambda b, s, g: (got.append(b), ingest(b, s, g))[1]
    reference = build_pipeline(stream.g)
    want = []
    steps = 60
    for _ in range(steps):
        kw = as_sglang(stream.step())
        obs.observe_verify_step(**kw)
        batch, gather = reference_batch(kw, stream.g)
        want.append(batch)
        reference.ingest(rows_the_hook_reads(batch), SOURCE, gather)
        hook.drain()
    assert len(got) == steps and hook.failures == 0
    for new, ref in zip(got, want, strict=True):
        assert_same_batch(new, ref)
    assert metrics(hook.pipeline) == metrics(reference)
    # SGLang's own paths, on the same steps
    dumped = obs.dump_info_records()["records"]
    assert [r["forward_ct"] for r in dumped] == list(range(steps))
    recorder = obs._block_accept_recorder
    recorded = recorder._observed_step_ct
    if options.get("folded") or options.get("greedy_draft"):
        assert recorded == 0
    else:
        assert recorded == steps
    json.dumps(dumped)  # what /server_info serves
    hook.close()


def test_a_greedy_draft_block_has_no_logits_and_log_q_zero(tmp_path, monkeypatch):
    """SGLANG_DSPARK_USE_GREEDY_DRAFT=1: SGLang's block carries corrected_logits=None;
    the hook records the trimmed tails' draft log-probabilities as 0 (a one-hot draft)."""
    stream = StepStream(seed=4, vocab=30, requests=8, greedy_every=0, greedy_draft=True, agree=0.9)
    obs = observers(stream.g, tmp_path, monkeypatch)
    worker = SimpleNamespace(_observers=obs)
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    got = []
    ingest = hook.pipeline.ingest
    hook.pipeline.ingest = lambda b, s, g: (got.append(b), ingest(b, s, g))[1]
    for _ in range(40):
        kw = as_sglang(stream.step())
        assert kw["draft_block"].corrected_logits is None
        obs.observe_verify_step(**kw)
        hook.drain()
    q = np.concatenate([b.draft_logprobs.ravel() for b in got])
    assert (q[~np.isnan(q)] == 0).all() and (~np.isnan(q)).sum() > 10
    hook.close()

"""The in-process SGLang hook, driven at SGLang 0.5.23's observer interface on CPU.

No SGLang worker runs here (it needs a GPU and a model). The fake worker below exposes
an observer whose keyword signature is SGLang 0.5.23's
`DsparkStepObservers.observe_verify_step` (tests/test_sglang_real_types.py holds it to
SGLang's own source), and `hook_reference.StepStream` passes the tensors SGLang
passes. The hook's device pass runs in its torch form on CPU tensors; the Triton
kernel is held to the same numbers on a GPU (tests/test_pack_triton_gpu.py).
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dspark_obs.exporters.collector import Collector  # noqa: E402

from dspark_obs.hooks.consumer import HookConsumer  # noqa: E402
from dspark_obs.hooks.sglang_worker import SOURCE, attach  # noqa: E402
from dspark_obs.pipeline import build_pipeline  # noqa: E402
from tests.hook_reference import FakeObservers as Observers  # noqa: E402
from tests.hook_reference import StepStream, reference_batch  # noqa: E402
from tests.prometheus_harness import free_port  # noqa: E402


def metrics(pipeline) -> str:
    est = pipeline.estimator
    est.close()
    return (
        Collector()
        .collect(pipeline.aggregates.snapshot(), pipeline.stats.snapshot(), est.snapshot())
        .decode()
    )


def read_rows(batch) -> tuple[np.ndarray, np.ndarray]:
    """`[n, gamma]` masks of the log-probabilities the hook reads (docs/sglang.md): target
    rows inside a sampled request's window, draft rows of a trimmed sampled request's
    tail."""
    j = np.arange(batch.gamma)
    window = batch.verify_len - 1
    sampled = (batch.greedy == 0)[:, None]
    trimmed = ((batch.correct_drafts == window) & (window < batch.gamma))[:, None]
    return sampled & (j < window[:, None]), sampled & trimmed & (j >= window[:, None])


def rows_the_hook_reads(batch):
    """The reference's batch without the log-probabilities the hook does not read, so that
    both pipelines learn from the same numbers. (The in-band blend's smooth model learns
    from verified positions' draft log-probabilities, which the hook leaves unread.)"""
    inside, tails = read_rows(batch)
    return dataclasses.replace(
        batch,
        target_logprobs=np.where(inside, batch.target_logprobs, np.nan),
        draft_logprobs=np.where(tails, batch.draft_logprobs, np.nan),
    )


def run_both(stream: StepStream, steps: int, *, drain_every: int = 1, ring_slots: int = 64):
    """The same steps through the hook (inline consumer) and the synchronous reference."""
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=ring_slots)
    got, want = [], []
    ingest = hook.pipeline.ingest

    def capture(batch, source, gather):
        got.append(batch)
        return ingest(batch, source, gather)

    hook.pipeline.ingest = capture
    reference = build_pipeline(stream.g)
    for i in range(steps):
        kw = stream.step()
        worker._observers.observe_verify_step(**kw)
        batch, gather = reference_batch(kw, stream.g)
        want.append(batch)
        reference.ingest(rows_the_hook_reads(batch), SOURCE, gather)
        if (i + 1) % drain_every == 0:
            hook.drain()
    hook.drain()
    assert worker._observers.calls == steps  # SGLang's own observers still run
    return hook, got, want, reference


def assert_same_batch(new, ref):
    for name in ("forward_ct", "bs", "budget", "num_verify_tokens", "mode", "gamma"):
        assert getattr(new, name) == getattr(ref, name), name
    for name in ("rid", "req_pool_index", "prefix_len", "verify_len", "correct_drafts",
                 "acc_len", "cap_trim", "bonus_token", "greedy", "draft_tokens"):  # fmt: skip
        np.testing.assert_array_equal(getattr(new, name), getattr(ref, name), err_msg=name)
    np.testing.assert_allclose(new.temperature, ref.temperature, rtol=1e-7)
    for name in ("confidence", "survival", "confidence_logits"):
        a, b = getattr(new, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)
    sampled = ref.greedy == 0
    inside, tails = read_rows(ref)
    # target log-probabilities: sampled requests inside their windows, else not read
    np.testing.assert_allclose(new.target_logprobs[inside], ref.target_logprobs[inside], atol=1e-5)
    assert np.isnan(new.target_logprobs[~inside]).all()
    np.testing.assert_allclose(new.bonus_logprob[sampled], ref.bonus_logprob[sampled], atol=1e-5)
    assert np.isnan(new.bonus_logprob[~sampled]).all()
    # draft log-probabilities: the tails of trimmed sampled requests only
    np.testing.assert_allclose(new.draft_logprobs[tails], ref.draft_logprobs[tails], atol=1e-5)
    assert np.isnan(new.draft_logprobs[~tails]).all()


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(folded=True),
        dict(greedy_draft=True),
        dict(greedy_every=0),  # all sampled
        dict(greedy_every=1),  # all greedy
        dict(confidence=False),
    ],
    ids=["mixed", "folded", "greedy-draft", "all-sampled", "all-greedy", "no-confidence"],
)
def test_same_numbers_as_the_synchronous_hook(options):
    """Every step observed; batches, aggregates, calibration and ceilings as before.

    No request moves slot here: the device keeps open tails by slot, so a sampled tail
    whose request SGLang re-admits elsewhere gets no gather (docs/sglang.md), where the
    synchronous hook, reading every row on the host, has one; the moves are the next
    test's."""
    stream = StepStream(seed=3, moves=False, **options)
    hook, got, want, reference = run_both(stream, 120, drain_every=7)
    assert len(got) == len(want) == 120
    for new, ref in zip(got, want, strict=True):
        assert_same_batch(new, ref)
    walker = hook.pipeline.estimator.walker
    assert walker.opened == reference.estimator.walker.opened
    if options.get("greedy_every", 2) != 1:
        assert walker.opened > 20  # the stream opens sampled tails
    assert metrics(hook.pipeline) == metrics(reference)
    assert hook.failures == 0 and hook.consumer.evicted == 0
    hook.close()


def test_tails_that_run_on_over_several_steps_get_their_gathers():
    """Drafts that agree with the committed stream keep tails open past their opening step;
    the device's gathers then come from later steps, and the sampled walk uses them."""
    stream = StepStream(seed=11, greedy_every=0, agree=0.9, vocab=6)
    later = []
    to_batch = HookConsumer.to_batch

    def count_later(self, meta, rids, block):
        # gather slots 0..entries-1 belong to tails opened at earlier steps
        offsets = block[:, self.layout.columns["gather_offset"]][:, : self.layout.entries]
        later.append(int(np.count_nonzero(offsets >= 0)))
        return to_batch(self, meta, rids, block)

    HookConsumer.to_batch = count_later
    try:
        hook, _, _, reference = run_both(stream, 200)
    finally:
        HookConsumer.to_batch = to_batch
    assert sum(later) > 20
    assert metrics(hook.pipeline) == metrics(reference)
    assert hook.pipeline.estimator.walker.opened > 100
    hook.close()


def test_a_request_retracted_and_readmitted_does_not_corrupt_a_walk():
    """Same rid, new req_pool_index; and a new request taking a slot at the very position
    its old occupant would have continued from (the device cannot see rids)."""
    stream = StepStream(seed=5, greedy_every=0, agree=0.9, vocab=6)
    stream.churn = lambda: None
    kws = [stream.step() for _ in range(3)]
    req = stream.reqs[0]
    old_slot = req["slot"]
    req["slot"] = stream.free_slots.pop()  # retracted, re-admitted elsewhere
    old = stream.reqs[1]  # finished; a new request continues from its very position
    stream.reqs[1] = stream._new_request(prefix=old["prefix"], slot=old["slot"])
    stream.reqs.append(stream._new_request(slot=old_slot))  # its old slot, another request
    kws += [stream.step() for _ in range(40)]
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    reference = build_pipeline(stream.g)
    for kw in kws:
        worker._observers.observe_verify_step(**kw)
        batch, gather = reference_batch(kw, stream.g)
        reference.ingest(rows_the_hook_reads(batch), SOURCE, gather)
        hook.drain()
    assert metrics(hook.pipeline) == metrics(reference)
    hook.close()


@pytest.mark.parametrize("drain_every", [1, 3], ids=["every-step", "ring-full-drops"])
def test_request_ids_follow_the_running_batch_as_sglang_keeps_it(drain_every):
    """SGLang passes its running batch's own `reqs` list step after step, the same Req
    objects for a request's lifetime; it replaces the list when requests leave and grows it
    when they join. The hook takes the ids again only when that list changed, and writes
    them into a ring slot only when the slot holds others; every delivered step's ids must
    still be that step's, steps dropped or not."""
    stream = StepStream(seed=5, vocab=40, requests=10)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=2)
    got = {}
    ingest = hook.pipeline.ingest

    def capture(batch, source, gather):
        got[batch.forward_ct] = list(batch.rid)
        return ingest(batch, source, gather)

    hook.pipeline.ingest = capture
    objects, running, want = {}, [], {}
    kinds = {"same": 0, "grown": 0, "replaced": 0}
    for i in range(150):
        kw = stream.step()
        reqs = [objects.setdefault(r.rid, r) for r in kw["reqs"]]
        n = len(running)
        if reqs == running:
            kinds["same"] += 1
        elif n and reqs[:n] == running:
            running.extend(reqs[n:])
            kinds["grown"] += 1
        else:
            running = reqs
            kinds["replaced"] += 1
        kw["reqs"] = running
        worker._observers.observe_verify_step(**kw)
        want[kw["forward_ct"]] = [r.rid for r in reqs]
        if (i + 1) % drain_every == 0:
            hook.drain()
    hook.drain()
    dropped = hook.ring.counters()["dropped_full"]
    assert len(got) + dropped == 150 and (dropped > 20) == (drain_every > 1)
    assert got == {fct: want[fct] for fct in got}
    assert min(kinds.values()) > 0, kinds
    hook.close()


def test_a_full_ring_drops_whole_steps_and_counts_them():
    stream = StepStream(seed=1)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=2)
    for _ in range(5):
        worker._observers.observe_verify_step(**stream.step())
    assert hook.drain() == 2  # the consumer was away: three steps found no slot
    text = metrics(hook.pipeline)
    assert 'dspark_dropped_steps_total{reason="hook_ring_full"} 3' in text
    assert f'dspark_ingest_records_total{{source="{SOURCE}"}} 2' in text
    worker._observers.observe_verify_step(**stream.step())
    assert hook.drain() == 1  # released slots are used again
    hook.close()


def test_a_greedy_draft_has_log_q_zero_on_its_tails():
    stream = StepStream(seed=2, greedy_draft=True, greedy_every=0)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    seen = []
    ingest = hook.pipeline.ingest
    hook.pipeline.ingest = lambda b, s, g: (seen.append(b), ingest(b, s, g))[1]
    for _ in range(30):
        worker._observers.observe_verify_step(**stream.step())
    hook.drain()
    tails = np.concatenate([b.draft_logprobs[~np.isnan(b.draft_logprobs)] for b in seen])
    assert len(tails) > 10 and (tails == 0.0).all()
    assert hook.failures == 0
    hook.close()


def test_a_failing_step_is_counted_never_raised():
    stream = StepStream(seed=2)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    kw = stream.step()
    kw["draft_tokens"] = kw["draft_tokens"][:, :2]  # a shape the hook cannot use
    worker._observers.observe_verify_step(**kw)
    assert hook.failures == 1
    hook.drain()
    assert hook.pipeline.stats.snapshot().errors[(SOURCE, "hook_failed")] == 1
    worker._observers.observe_verify_step(**stream.step())
    assert hook.drain() == 1  # and the next step goes through
    hook.close()


def test_an_idle_rank_and_an_oversized_batch_are_not_steps():
    stream = StepStream(seed=4, requests=6)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=3)
    kw = stream.step()
    worker._observers.observe_verify_step(**{**kw, "bs": 0})
    worker._observers.observe_verify_step(**kw)  # more requests than the pool has slots
    assert hook.drain() == 0 and hook.failures == 0
    assert "hook_slot_too_small" in metrics(hook.pipeline)
    hook.close()


def test_a_different_interface_is_left_alone_with_one_warning():
    class Other:
        def observe_verify_step(self, *, forward_ct, reqs):
            pass

    worker = SimpleNamespace(_observers=Other())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert attach(worker, gamma=4) is None
    assert len(caught) == 1 and "not attached" in str(caught[0].message)
    with pytest.warns(RuntimeWarning):
        assert attach(SimpleNamespace(), gamma=4) is None


def test_the_consumer_process_serves_metrics():
    """attach() as a user calls it: a `dspark-obs hook-consumer` process, real HTTP."""
    stream = StepStream(seed=6)
    worker = SimpleNamespace(_observers=Observers())
    port = free_port()
    hook = attach(
        worker, gamma=stream.g, listen=f"127.0.0.1:{port}", pool_slots=64, model_name="m-1"
    )
    url = f"http://127.0.0.1:{port}/metrics"
    labels = 'engine="sglang",model_name="m-1"'

    def scrape() -> str:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def counted(text: str) -> int:
        found = re.findall(
            rf'^(?:dspark_ingest_records_total{{{labels},source="{SOURCE}"}}|'
            rf'dspark_dropped_steps_total{{{labels},reason="hook_ring_full"}}) (\d+)$',
            text,
            re.M,
        )
        return sum(int(n) for n in found)

    try:
        deadline = time.monotonic() + 180  # generous: a loaded machine only makes it slower
        while not scrape() and time.monotonic() < deadline:
            time.sleep(0.1)  # the endpoint is up before traffic comes
        for _ in range(25):
            worker._observers.observe_verify_step(**stream.step())
        while counted(text := scrape()) < 25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counted(text) == 25  # every step aggregated, or dropped and counted
        assert f'dspark_ingest_records_total{{{labels},source="{SOURCE}"}}' in text
    finally:
        hook.close()
    hook.process.terminate()  # shared by the node's ranks, it outlives a hook's close
    assert hook.process.wait(180) == 0


def test_kernel_rows_are_split_only_while_they_leave_programs_to_fill():
    """Slices per logit row: a power of two bringing the rows to the programs asked for,
    without going over."""
    from dspark_obs.hooks.pack_triton import MAX_SPLITS, splits_for

    assert splits_for(2000, 528) == splits_for(264, 528) == 1
    assert splits_for(263, 528) == 2  # 528 / 263 = 2.01 slices: the power of two within
    assert splits_for(128, 528) == 4
    assert splits_for(127, 528) == 4
    assert splits_for(66, 528) == 8
    assert splits_for(1, 528) == MAX_SPLITS


def test_request_ids_that_are_not_strings_are_taken_as_text():
    stream = StepStream(seed=4, requests=6)
    worker = SimpleNamespace(_observers=Observers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    got = []
    ingest = hook.pipeline.ingest
    hook.pipeline.ingest = lambda b, s, g: (got.append(list(b.rid)), ingest(b, s, g))[1]
    kw = stream.step()
    kw["reqs"] = [SimpleNamespace(rid=1000 + i) for i in range(kw["bs"])]
    worker._observers.observe_verify_step(**kw)
    hook.drain()
    assert got == [[str(1000 + i) for i in range(kw["bs"])]]
    assert hook.failures == 0
    hook.close()

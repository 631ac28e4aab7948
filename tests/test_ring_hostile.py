"""The ring between a serving process and its consumer: a broken slot is skipped and counted,
and a consumer taking over a live ring says so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from dspark_obs.exporters.collector import Collector

from dspark_obs.hooks import shared_ring as sr
from dspark_obs.hooks.node_consumer import NodeConsumer
from dspark_obs.hooks.sglang_worker import SOURCE, attach
from dspark_obs.pipeline import build_pipeline
from tests.hook_reference import FakeObservers, StepStream


def metrics(pipeline) -> str:
    return (
        Collector()
        .collect(pipeline.aggregates.snapshot(), pipeline.stats.snapshot(), None)
        .decode()
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [(sr.M_BS, 1 << 40), (sr.M_BS, -3), (sr.M_RID_LEN, 1 << 40)],
    ids=["huge-batch", "negative-batch", "huge-rids"],
)
def test_a_broken_slot_is_skipped_counted_and_the_consumer_goes_on(field, value, caplog):
    stream = StepStream(seed=1)
    worker = SimpleNamespace(_observers=FakeObservers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=8)
    for _ in range(4):
        worker._observers.observe_verify_step(**stream.step())
    hook._wait_for_device()
    ring = hook.ring
    ring.metas[2 % ring.slots][field] = value  # step 2's slot, written by a broken producer
    assert hook.consumer.drain() == 4
    text = metrics(hook.pipeline)
    assert f'dspark_ingest_records_total{{source="{SOURCE}"}} 3' in text
    assert f'source="{SOURCE}",reason="ring_slot_corrupt"}} 1' in text
    assert "the ring slot of step 2 is broken" in caplog.text
    worker._observers.observe_verify_step(**stream.step())
    assert hook.drain() == 1  # the next step is fed
    hook.close()


def test_rids_that_do_not_match_the_batch_are_a_broken_slot():
    stream = StepStream(seed=2)
    worker = SimpleNamespace(_observers=FakeObservers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=8)
    worker._observers.observe_verify_step(**stream.step())
    hook._wait_for_device()
    ring = hook.ring
    slot = 1 % ring.slots
    ring.rids[slot][: int(ring.metas[slot][sr.M_RID_LEN])] = ord("x")  # no separators left
    hook.drain()
    assert sum(c.corrupt for c in hook.consumer.consumers.values()) == 1
    snap = hook.pipeline.stats.snapshot()
    assert snap.errors[(SOURCE, "ring_slot_corrupt")] == 1
    hook.close()


def test_a_consumer_taking_over_a_live_ring_counts_a_restart(caplog):
    stream = StepStream(seed=3)
    worker = SimpleNamespace(_observers=FakeObservers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64, ring_slots=8)
    for _ in range(3):
        worker._observers.observe_verify_step(**stream.step())
    assert hook.drain() == 3  # the first consumer released three steps, then went away
    follower = NodeConsumer(build_pipeline(stream.g))
    mapped = sr.SharedRing(hook.ring.name, create=False)
    assert follower.add(mapped)
    assert follower.pipeline.stats.snapshot().errors[(SOURCE, "consumer_restarted")] == 1
    assert "stopped at step 3; this one takes over" in caplog.text
    worker._observers.observe_verify_step(**stream.step())
    hook._wait_for_device()
    assert follower.feed() == 1  # and goes on from the step after
    mapped.close()
    hook.close()

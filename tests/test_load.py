"""Load: `serve` polling eight busy SGLang ranks accounts for every step, over real HTTP.

The server is bench/sglang_load.py's stub speaking SGLang's documented protocol
(`GET /server_info` with one `internal_states` entry per data-parallel rank, `POST
/set_internal_state {"server_args": {"dspark_clear_info_records": true}}` to
drain) for eight ranks running 256 requests each, serving real step records of the
reference runtime at batch size 256 at a fixed rate per rank.

The stub knows what it did: which steps each read handed out and which steps a
drain wiped before any read saw them (the read/clear race SGLang's protocol
has). So the test checks exactly: every step handed out was ingested once
(`dspark_steps_total{rank}`), the steps lost are the race's and are what the
poller counts as `dropped_steps`, nothing else is rejected. These hold however
fast the machine is. Whether `serve` keeps up (the lag, the buffers, the rate)
is a speed claim: `python -m bench sglang_load` measures it (P9;
docs/reliability.md records the figures).
"""

from __future__ import annotations

from bench.sglang_load import (
    POLL_INTERVAL,
    RANKS,
    STEPS_PER_SECOND,
    StubRanks,
    ingest_errors,
    per_rank_steps,
    polling_args,
    record_pool,
)

from .serving import wait_until
from .test_serve_cli import Child, scrape

#: Reads of traffic: enough reads, drains and races to account for (a few hundred steps),
#: counted rather than timed, so that a loaded machine gives the poller the same work.
LOAD_READS = 5


def test_serve_accounts_for_every_step_of_eight_busy_ranks(tmp_path):
    pool, envelope = record_pool()
    stub = StubRanks(RANKS, STEPS_PER_SECOND, pool, envelope)
    serve = Child(
        *polling_args(stub.url, poll_interval=POLL_INTERVAL, out=tmp_path / "run"),
        workdir=tmp_path / "serve",
    )
    try:
        with serve:
            metrics = serve.url()
            stub.begin()  # traffic starts once the poller is up
            reads = stub.reads
            wait_until(lambda: stub.reads >= reads + LOAD_READS, f"{LOAD_READS} reads", serve)
            stub.freeze()

            def drained() -> str | None:
                """The exposition once the poller has taken and ingested every step."""
                text = scrape(metrics)
                ingested = per_rank_steps(text)
                done = stub.buffered().sum() == 0 and (ingested == stub.handed).all()
                return text if done else None

            text = wait_until(drained, "every step ingested", serve, interval=POLL_INTERVAL / 4)
            ingested, errors = per_rank_steps(text), ingest_errors(text)
            assert serve.stop() == 0, serve.describe()
    finally:
        stub.close()

    recorded = stub.recorded()
    dropped = errors.get("dropped_steps", 0.0)
    print(
        f"\nload: {RANKS} ranks x {STEPS_PER_SECOND:g} steps/s over {stub.reads} reads: "
        f"{recorded.sum()} steps recorded, lost to the read/clear race "
        f"{stub.lost.sum()}, counted {dropped:.0f}"
    )
    assert recorded.sum() > 0 and stub.reads > 1
    # exact accounting: each step handed out was ingested once, per rank; nothing else rejected
    assert (ingested == stub.handed).all(), (ingested, stub.handed)
    assert (stub.handed + stub.lost == recorded).all(), (stub.handed, stub.lost, recorded)
    assert set(errors) <= {"dropped_steps"}, errors
    # a race loss is counted once a later step of the rank arrives: all but the final drain's
    assert stub.lost.sum() - RANKS * 2 <= dropped <= stub.lost.sum(), (dropped, stub.lost)

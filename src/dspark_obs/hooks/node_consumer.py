"""The node's consumer: every hook ring of a node, one pipeline, one `/metrics`.

Each serving process that observes a rank writes its own ring (`rendezvous`); this
process finds the rings made for its port, feeds their steps into one pipeline under
each ring's `rank` label and serves them on one port, so a node is one scrape target
however many ranks it runs. Rings come and go: a rank that restarts makes a new ring
and is found again; a ring whose process closed it or died is drained and let go, its
counters kept in the totals. The steps a ring's producer dropped (its consumer a whole
ring behind, or gone) are counted in the ring and published here, summed over the
rings, alive and gone.

One consumer serves one engine, model and gamma (its `/metrics` carry `engine` and
`model_name` on every series): a ring of another is refused, counted and logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..pipeline import Pipeline
from . import rendezvous
from . import shared_ring as sr
from .consumer import HookConsumer

log = logging.getLogger(__name__)

#: the ring counters that are published, and under which `dspark_dropped_steps_total` reason
_DROPPED = {"dropped_full": "hook_ring_full", "dropped_other": "hook_slot_too_small"}


class NodeConsumer:
    """The rings of one node (found on `port`, or given with `add`) into `pipeline`."""

    def __init__(self, pipeline: Pipeline, *, port: int | None = None) -> None:
        self.pipeline = pipeline
        self.port = port
        self.consumers: dict[str, HookConsumer] = {}
        #: (engine, model_name, gamma) of the first ring; every later one must match
        self.identity: tuple[str, str, int] | None = None
        self.refused: set[str] = set()
        self.retired = dict.fromkeys(("dropped_full", "dropped_other", "failed"), 0)
        self._failed_seen = 0

    # -- rings ------------------------------------------------------------------------

    def add(self, ring: sr.SharedRing, name: str | None = None) -> bool:
        """Feed `ring` from now on; False (counted, logged once) where it is of another
        engine, model or gamma than this consumer's."""
        ident = (ring.engine, ring.model_name, ring.gamma)
        if self.identity is None:
            self.identity = ident
        elif ident != self.identity:
            engine, model, gamma = ident
            self.pipeline.stats.error(
                sr.source_name(engine),
                "ring_mismatch",
                f"a ring of {engine} model {model!r} at gamma {gamma} cannot join a consumer "
                f"of {self.identity[0]} model {self.identity[1]!r} at gamma "
                f"{self.identity[2]}: give it a --listen port of its own",
            )
            ring.close()
            return False
        consumer = HookConsumer(ring, self.pipeline)
        if consumer.seq > 0 and not ring.header[sr.H_CLOSED]:
            # a consumer leaves only once no ring is left: one that released steps of a
            # live ring and is gone died, and this one took over (a hook that dropped a
            # step found no consumer and started this one)
            self.pipeline.stats.error(
                sr.source_name(ring.engine),
                "consumer_restarted",
                f"rank {ring.rank}'s ring {ring.name} was left by a consumer that stopped at "
                f"step {consumer.seq}; this one takes over (steps dropped meanwhile are "
                "counted as hook_ring_full)",
            )
        self.consumers[name or ring.name] = consumer
        return True

    def scan(self) -> None:
        """Map the rings made for this port since the last scan."""
        names = rendezvous.ring_names(self.port)
        self.refused &= set(names)
        for name in names:
            if name in self.consumers or name in self.refused:
                continue
            try:
                ring = sr.SharedRing(name, create=False)
            except FileNotFoundError:
                continue  # removed between the listing and the open
            except sr.RingNotReady:
                continue  # its producer is still writing the header: next scan
            except ValueError as exc:
                self.refused.add(name)
                self.pipeline.stats.error(sr.source_name("sglang"), "ring_invalid", str(exc))
                continue
            if not self.add(ring, name):
                self.refused.add(name)

    def retire(self) -> None:
        """Let go of the rings whose producer closed them or died, once drained; a dead
        producer's segment is removed too (its process can no longer do it)."""
        for name, consumer in list(self.consumers.items()):
            ring = consumer.ring
            closed = bool(ring.header[sr.H_CLOSED])
            if closed or not _alive(ring.pid):
                if consumer.pending():
                    continue
                for key, n in ring.counters().items():
                    if key in self.retired:
                        self.retired[key] += n
                ring.close()
                del self.consumers[name]
                if not closed and self.port is not None:
                    _unlink(name)
                log.info("hook consumer: rank %d's ring %s is done", consumer.rank, name)

    # -- feeding ----------------------------------------------------------------------

    def feed(self, limit: int | None = None) -> int:
        """Feed every ready step of every ring (at most `limit` a ring); how many."""
        return sum(c.drain(limit) for c in self.consumers.values())

    def drain(self) -> int:
        n = self.feed()
        self.publish_counters()
        return n

    @property
    def evicted(self) -> int:
        """Open tails the device table had no room for, over the rings fed now."""
        return sum(c.evicted for c in self.consumers.values())

    def totals(self) -> dict[str, int]:
        """The rings' drop and failure counters, summed over the rings alive and gone."""
        out = dict(self.retired)
        for consumer in self.consumers.values():
            for key, n in consumer.ring.counters().items():
                if key in out:
                    out[key] += n
        return out

    def publish_counters(self) -> None:
        totals = self.totals()
        stats = self.pipeline.stats
        for key, reason in _DROPPED.items():
            stats.set_dropped(reason, totals[key])
        if totals["failed"] > self._failed_seen and self.identity is not None:
            stats.error(
                sr.source_name(self.identity[0]),
                "hook_failed",
                "the observer call raised inside the hook (the serving process logs it)",
                count=totals["failed"] - self._failed_seen,
            )
            self._failed_seen = totals["failed"]

    def run(self, stop: threading.Event, *, idle_exit: float = 60.0, scan_every: float = 0.1,
            idle_sleep: float = 2e-4) -> None:  # fmt: skip
        """Feed until `stop` is set or no ring has been left for `idle_exit` seconds."""
        last_ring = time.monotonic()
        next_scan = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + scan_every
                self.scan()
                self.retire()
                self.publish_counters()
                if self.consumers:
                    last_ring = now
                elif now - last_ring > idle_exit:
                    log.info("hook consumer: no ring left for %.0f s; stopping", idle_exit)
                    break
            if self.feed(limit=64) == 0:
                time.sleep(idle_sleep)
        self.drain()

    def close(self) -> None:
        for consumer in self.consumers.values():
            consumer.ring.close()
        self.consumers.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(rendezvous.SHM_DIR, name))
    except OSError:
        pass  # already gone (its process's resource tracker removes it too)


def first_ring(port: int, stop: threading.Event, wait: float) -> sr.SharedRing | None:
    """The first valid ring made for `port`, waiting up to `wait` seconds for one."""
    deadline = time.monotonic() + wait
    while not stop.is_set() and time.monotonic() < deadline:
        for name in rendezvous.ring_names(port):
            try:
                return sr.SharedRing(name, create=False)
            except (FileNotFoundError, ValueError):
                continue
        time.sleep(0.05)
    return None


def run_node_consumer(
    listen: tuple[str, int], *, stop: threading.Event, idle_exit: float = 60.0,
    web_config=None, detail: bool = False, store: dict | None = None,
) -> bool:  # fmt: skip
    """The consumer process of the node's port: take its lock (False at once where another
    consumer holds it), wait for a ring, build the pipeline and `/metrics` for that ring's
    gamma, engine and model, and feed every ring of the port until none is left. `store`:
    keep every step in a production store (`root` and ProductionStore's options)."""
    from ..exporters.endpoint import Exporter
    from ..pipeline import build_pipeline

    host, port = listen
    lock = rendezvous.take_lock(port)
    if lock is None:
        log.info("hook consumer: another consumer serves port %d; leaving it to that one", port)
        return False
    exporter = None
    node = None
    try:
        ring = first_ring(port, stop, idle_exit)
        if ring is None:
            log.info("hook consumer: no ring for port %d came within %.0f s", port, idle_exit)
            return True
        pipeline = build_pipeline(ring.gamma)
        if store is not None:
            from ..store.production import ProductionStore

            options = dict(store)
            manifest = {
                "format": 1, "source": sr.source_name(ring.engine), "gamma": ring.gamma,
                "engine": ring.engine, "model_name": ring.model_name or "unknown",
            }  # fmt: skip
            pipeline.writer = ProductionStore(options.pop("root"), manifest, **options)
        node = NodeConsumer(pipeline, port=port)
        node.add(ring, ring.name)
        identity = (ring.engine, ring.model_name or "unknown")
        exporter = Exporter(pipeline, host, port, web_config, identity=identity, detail=detail)
        try:
            log.info("dspark-obs hook consumer: serving %s", exporter.start())
        except OSError as exc:
            exporter = None
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        node.run(stop, idle_exit=idle_exit)
        return True
    finally:
        if exporter is not None:
            exporter.stop()
        if node is not None:
            node.close()
            node.pipeline.close()  # the store's hours are closed, and complete
        os.close(lock)

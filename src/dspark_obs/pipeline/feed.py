"""Sources fed into a pipeline until they end or a stop event is set.

One thread per source (several SGLang servers poll at once); a source that fails is
marked down and counted, and the service stays up.
"""

from __future__ import annotations

import logging
import threading

from ..sources import Source
from .core import Pipeline

log = logging.getLogger(__name__)


def run_source(source: Source, pipeline: Pipeline, stop: threading.Event, on_batch=None) -> int:
    """Feed one source into the pipeline until it ends or `stop` is set; returns steps fed."""
    fed = 0
    pipeline.stats.set_up(source.name, True)
    gather = getattr(source, "gather", None)
    try:
        for batch in source.batches(stop):
            pipeline.ingest(batch, source.name, gather)
            fed += 1
            if on_batch is not None:
                on_batch(batch)
            if stop.is_set():
                break
    except Exception as exc:  # a failing source is reported, the service stays up
        pipeline.stats.set_up(source.name, False)
        pipeline.stats.error(source.name, "source_failed", repr(exc))
        log.exception("source %s failed", source.name)
    return fed


def run_sources(sources: list, pipeline: Pipeline, stop: threading.Event) -> int:
    """Feed every source on its own thread until all end or `stop` is set; steps fed."""
    if len(sources) == 1:
        return run_source(sources[0], pipeline, stop)
    fed = [0] * len(sources)

    def feed(i: int) -> None:
        fed[i] = run_source(sources[i], pipeline, stop)

    threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and not stop.is_set():
            t.join(0.2)
    for t in threads:
        t.join(5.0)
    return sum(fed)

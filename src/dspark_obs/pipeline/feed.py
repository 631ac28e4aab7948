"""Sources fed into a pipeline until they end or a stop event is set.

One thread per source (several SGLang servers poll at once). A source decides where
its stream ends once stopped (the SGLang poller first converts the answer it took and
cleared on the server), so a stop never cuts a taken answer short here.

A live source (the runtime, an SGLang server) does not end by itself: when one fails,
or when the run store fails under it (a full disk), the feed stops every source and
raises `SourceFailed`, since a service that went on would serve frozen metrics as if
they were live. A finite source (a replayed run, `finite = True`) that fails is only
counted and marked down: what it fed stays served, as when it ends.
"""

from __future__ import annotations

import logging
import threading

from ..sources import Source
from .core import Pipeline, StoreFailed

log = logging.getLogger(__name__)

#: How long a stopped feed waits for each source thread: a poller drains its last answer
#: for at most its drain time (5 s), and a poll under way ends at once when stopped.
DRAIN_JOIN_SECONDS = 8.0


class SourceFailed(RuntimeError):
    """A live source, or the run store under it, failed; every source has been stopped."""


def run_source(source: Source, pipeline: Pipeline, stop: threading.Event, on_batch=None) -> int:
    """Feed one source into the pipeline until it ends or stops; returns steps fed.

    Raises SourceFailed when a live source or the run store fails.
    """
    fed = 0
    pipeline.stats.set_up(source.name, True)
    gather = getattr(source, "gather", None)
    try:
        for batch in source.batches(stop):
            pipeline.ingest(batch, source.name, gather)
            fed += 1
            if on_batch is not None:
                on_batch(batch)
    except Exception as exc:  # counted and logged; fatal unless the source is a finite one
        pipeline.stats.set_up(source.name, False)
        pipeline.stats.error(source.name, "source_failed", repr(exc))
        if isinstance(exc, StoreFailed):
            raise SourceFailed(str(exc)) from exc
        if not getattr(source, "finite", False):
            raise SourceFailed(f"source {source.name} failed: {exc!r}") from exc
        log.exception("source %s failed", source.name)
    return fed


def run_sources(sources: list, pipeline: Pipeline, stop: threading.Event) -> int:
    """Feed every source on its own thread until all end or `stop` is set; steps fed.

    The first SourceFailed stops the others and is raised once they have ended.
    """
    if len(sources) == 1:
        try:
            return run_source(sources[0], pipeline, stop)
        except SourceFailed:
            stop.set()
            raise
    fed = [0] * len(sources)
    failed: list[SourceFailed] = []

    def feed(i: int) -> None:
        try:
            fed[i] = run_source(sources[i], pipeline, stop)
        except SourceFailed as exc:
            failed.append(exc)
            stop.set()

    threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and not stop.is_set():
            t.join(0.2)
    for t in threads:
        t.join(DRAIN_JOIN_SECONDS)
    if failed:
        raise failed[0]
    return sum(fed)

"""A running exporter: sources feeding the pipeline while `/metrics` is served.

The pipeline runs on the caller's thread; the HTTP server on its own. A stop
event (Ctrl-C, SIGTERM) ends the source loop between steps, after which the
store is flushed and closed, so an interrupted service leaves a readable run.
"""

from __future__ import annotations

import logging
import threading

from .exporters.exposition import wsgi_app
from .exporters.http_server import MetricsServer
from .exporters.render import Renderer
from .pipeline import Pipeline
from .sources import Source

log = logging.getLogger(__name__)


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: port outside 0..65535")
    return host.strip("[]"), int(port)


class Exporter:
    """Aggregates + renderer + HTTP server around one pipeline."""

    def __init__(self, pipeline: Pipeline, host: str, port: int, web_config=None) -> None:
        self.pipeline = pipeline
        self.renderer = Renderer()
        self._render_lock = threading.Lock()
        self.server = MetricsServer(
            host=host, port=port, web_config=web_config, metrics_app=wsgi_app(self.render)
        )

    def render(self) -> bytes:
        with self._render_lock:
            est = self.pipeline.estimator
            return self.renderer.render(
                self.pipeline.aggregates.snapshot(),
                self.pipeline.stats,
                None if est is None else est.snapshot(),
            )

    def start(self) -> str:
        self.server.start()
        return self.server.url + "/metrics"

    def stop(self) -> None:
        self.server.stop()


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

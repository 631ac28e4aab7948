"""`/metrics` of a running pipeline: snapshots of its aggregates, estimator and ingest
counters collected on each scrape, served by the HTTP server on its own thread."""

from __future__ import annotations

import threading

from ..pipeline import Pipeline
from .catalog import IDENTITY
from .collector import Collector
from .exposition import wsgi_app
from .http_server import MetricsServer


class Exporter:
    """Aggregates + collector + HTTP server around one pipeline; `identity` is the
    (engine, model_name) every series is labelled with, `detail` whether the families of
    fine detail are written too."""

    def __init__(
        self, pipeline: Pipeline, host: str, port: int, web_config=None, *,
        identity: tuple[str, str] = ("", ""), detail: bool = False,
    ) -> None:  # fmt: skip
        self.pipeline = pipeline
        self.collector = Collector(
            const_labels=tuple(zip(IDENTITY, identity, strict=True)), detail=detail
        )
        self._render_lock = threading.Lock()
        self.server = MetricsServer(
            host=host, port=port, web_config=web_config, metrics_app=wsgi_app(self.render)
        )

    def render(self, names: frozenset[str] | None = None, openmetrics: bool = False) -> bytes:
        """The exposition (OpenMetrics, with exemplars, where asked); only the families
        `names` asks for when given (`name[]=`)."""
        with self._render_lock:
            est = self.pipeline.estimator
            # a production store publishes its own figures (a run's writer has none)
            store = getattr(self.pipeline.writer, "snapshot", None)
            return self.collector.collect(
                self.pipeline.aggregates.snapshot(),
                self.pipeline.stats.snapshot(),
                None if est is None else est.snapshot(),
                None if store is None else store(),
                names=names,
                openmetrics=openmetrics,
            )

    def start(self) -> str:
        self.server.start()
        return self.server.url + "/metrics"

    def stop(self) -> None:
        self.server.stop()

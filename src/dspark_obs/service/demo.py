"""The demo's run: the reference runtime recorded into a run while `/metrics` is served.

The demo must work on any machine with nothing else running, so a taken port is not
an error here: the exporter moves to a free one and says where.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..calibration import StsCalibration
from ..exporters.endpoint import Exporter, parse_listen
from ..pipeline import Pipeline
from ..runs import record_reference_run
from ..runtime.config import RuntimeConfig
from ..telemetry import StepBatch


def _start_exporter(pipeline: Pipeline, listen: str) -> Exporter:
    host, port = parse_listen(listen)
    exporter = Exporter(pipeline, host, port)
    try:
        exporter.start()
    except OSError:
        exporter = Exporter(pipeline, host, 0)
        exporter.start()
    return exporter


def record_while_serving(
    config: RuntimeConfig,
    out: Path,
    sts: StsCalibration | None,
    *,
    listen: str | None,
    on_step: Callable[[StepBatch], object] | None = None,
    say: Callable[[str], object] = print,
) -> Exporter | None:
    """Record the run into `out`, serving its live metrics on `listen` (None: not served).

    Returns the exporter, still serving the run's final values; the caller stops it.
    """
    if listen is not None:
        parse_listen(listen)
    exporter: Exporter | None = None

    def serve(pipeline: Pipeline) -> None:
        nonlocal exporter
        if listen is None:
            return
        exporter = _start_exporter(pipeline, listen)
        say(f"serving live metrics at {exporter.server.url}/metrics while the demo runs")

    try:
        record_reference_run(config, out, sts, on_step=on_step, on_pipeline=serve)
    except BaseException:
        if exporter is not None:
            exporter.stop()
        raise
    return exporter

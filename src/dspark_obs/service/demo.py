"""The demo's run: the reference runtime recorded into a run while `/metrics` is served.

The demo must work on any machine with nothing else running, so a taken default port is
not an error: the exporter moves to a free one and says so, naming both. A port the user
chose is kept to: when it is taken the demo stops with an error before its warm-up, since
a Prometheus or a browser pointed at that port would otherwise read nothing, or another
process.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from ..calibration import StsCalibration
from ..exporters.endpoint import Exporter
from ..listen import parse_listen
from ..pipeline import Pipeline
from ..recording import record_reference_run, runtime_manifest
from ..runtime.config import RuntimeConfig
from ..store.manifest import identity
from ..telemetry import StepBatch


def check_can_listen(listen: str) -> None:
    """Raise OSError naming `listen` when nothing could listen there now (checked before a
    long warm-up, not after it)."""
    host, port = parse_listen(listen)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise OSError(f"cannot listen on {listen}: {exc.strerror or exc}") from None


def _start_exporter(
    pipeline: Pipeline,
    listen: str,
    move_if_taken: bool,
    say: Callable[[str], object],
    identity: tuple[str, str],
) -> Exporter:
    host, port = parse_listen(listen)
    exporter = Exporter(pipeline, host, port, identity=identity)
    try:
        exporter.start()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if not move_if_taken:
            raise OSError(f"cannot listen on {listen}: {reason}") from None
        exporter = Exporter(pipeline, host, 0, identity=identity)
        exporter.start()
        say(
            f"note: {listen} is taken ({reason}), so the demo serves on a free port instead "
            "(choose one with --listen HOST:PORT)"
        )
    return exporter


def record_while_serving(
    config: RuntimeConfig,
    out: Path,
    sts: StsCalibration | None,
    *,
    listen: str | None,
    move_if_taken: bool = False,
    on_step: Callable[[StepBatch], object] | None = None,
    say: Callable[[str], object] = print,
) -> Exporter | None:
    """Record the run into `out`, serving its live metrics on `listen` (None: not served;
    `move_if_taken`: on a free port when `listen`'s is taken, said through `say`).

    Returns the exporter, still serving the run's final values; the caller stops it.
    """
    if listen is not None:
        parse_listen(listen)
    exporter: Exporter | None = None

    def serve(pipeline: Pipeline) -> None:
        nonlocal exporter
        if listen is None:
            return
        engine_model = identity(runtime_manifest(config, sts))
        exporter = _start_exporter(pipeline, listen, move_if_taken, say, engine_model)
        say(f"serving live metrics at {exporter.server.url}/metrics while the demo runs")

    try:
        record_reference_run(config, out, sts, on_step=on_step, on_pipeline=serve)
    except BaseException:
        if exporter is not None:
            exporter.stop()
        raise
    return exporter

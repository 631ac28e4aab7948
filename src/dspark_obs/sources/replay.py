"""A stored run replayed as a live source, at its recorded pace times `speed`."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from ..store import open_run
from ..telemetry import StepBatch
from .pacing import Pacer


class ReplaySource:
    #: it ends by itself: a failure leaves what it fed served, as its end does (pipeline/feed)
    finite = True

    def __init__(self, run_dir: str, speed: float = 1.0) -> None:
        self.run = open_run(run_dir)
        self.name = f"run:{run_dir}"
        self.gamma = int(self.run.manifest["gamma"])
        self.speed = speed

    def batches(self, stop: threading.Event) -> Iterator[StepBatch]:
        pacer = Pacer(self.speed, stop)
        for batch in self.run.batches():
            if stop.is_set():
                return
            step_ms = batch.step_gpu_ms if batch.step_gpu_ms is not None else batch.step_cpu_ms
            pacer.wait(None if step_ms is None else step_ms / 1e3)
            yield batch

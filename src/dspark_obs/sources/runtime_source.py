"""The embedded reference runtime as a live source: traffic generated continuously."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from ..runtime.config import RuntimeConfig
from ..runtime.factory import make_runtime
from ..telemetry import StepBatch
from .pacing import Pacer


class RuntimeSource:
    name = "runtime"

    def __init__(self, config: RuntimeConfig, speed: float = 1.0) -> None:
        self.runtime = make_runtime(config)
        self.config = config
        self.gamma = config.gamma
        self.speed = speed
        # in band: the estimator reads the verify distributions of the step just yielded
        self.gather = self.runtime.gather_target_logprobs

    def batches(self, stop: threading.Event) -> Iterator[StepBatch]:
        """Repeats the concurrency sweep, each step paced by its (simulated) step time."""
        pacer = Pacer(self.speed, stop)
        for batch in self.runtime.run_forever():
            if stop.is_set():
                return
            pacer.wait(None if batch.step_gpu_ms is None else batch.step_gpu_ms / 1e3)
            yield batch

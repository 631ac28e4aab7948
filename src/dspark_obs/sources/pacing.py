"""Real-time pacing: deliver steps as fast as they happened, times a speed factor."""

from __future__ import annotations

import threading
import time


class Pacer:
    """Sleeps so that step k is delivered at the sum of the first k step times / speed.

    A consumer that falls behind is not made to burst: the schedule restarts
    from now, so pacing never delivers faster than `speed` allows.
    """

    def __init__(self, speed: float, stop: threading.Event) -> None:
        if speed < 0:
            raise ValueError("speed must be >= 0 (0: as fast as possible)")
        self.speed = speed
        self.stop = stop
        self._next = time.monotonic()

    def wait(self, step_seconds: float | None) -> None:
        if self.speed == 0 or not step_seconds or step_seconds <= 0:
            return
        self._next += step_seconds / self.speed
        delay = self._next - time.monotonic()
        if delay > 0:
            self.stop.wait(delay)
        elif delay < -1.0:
            self._next = time.monotonic()

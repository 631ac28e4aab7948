"""Per-client rate limiting for the front: a token bucket per address, answered with 429.

The handler asks it before authentication, so it slows a key-guessing loop as well as a
runaway client; it forgets idle clients so that many addresses cannot grow memory without
bound.
"""

from __future__ import annotations

import logging
import math
import threading
import time

log = logging.getLogger(__name__)

#: Requests per second per client address before 429: far above what a poller (1/s) or a
#: benchmark client of the simulated runtime needs, low enough to blunt a runaway loop or
#: an API-key guessing script.
DEFAULT_RATE_LIMIT = 200.0


class RateLimiter:
    """A token bucket per client address: `rate` requests per second, bursts up to `burst`.

    Buckets are kept per address only while they matter: once more than
    `max_clients` are tracked, buckets that have refilled completely (idle
    clients) are forgotten, so a scan from many addresses cannot grow memory
    without bound.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock=time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        if not math.isfinite(rate) or rate < 0:
            raise ValueError("--rate-limit must be a finite number >= 0 (0 disables it)")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.clock = clock
        self.max_clients = max_clients
        self.refused = 0
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """0 when `client` may go ahead (a token is taken), else seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                if len(self._buckets) > self.max_clients:
                    self._forget_idle(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            self.refused += 1
            if self.refused == 1:
                log.warning(
                    "client %s went over --rate-limit %g/s (answered 429); "
                    "further refusals are only counted",
                    client,
                    self.rate,
                )
            return (1.0 - tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        full = [
            c
            for c, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.rate >= self.burst
        ]
        for c in full:
            del self._buckets[c]

"""What the tests of live processes share: waiting on a condition while a child runs, and
posting `/generate` requests to an SGLang-protocol front (`runtime-server`, RuntimeFrontend).

Every wait polls its condition and returns once it holds: the timeout is generous, so a
loaded machine only makes a test slower, never changes its verdict.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Protocol

# Loopback only: a CI proxy from http_proxy must not swallow requests meant for 127.0.0.1.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: Seconds to wait for a child to start, answer or stop.
WAIT = 180.0


class Watched(Protocol):
    """A child process a wait fails on as soon as it exits (tests/test_serve_cli.Child)."""

    def exited(self) -> bool: ...

    def describe(self) -> str: ...


def wait_until(
    condition: Callable[[], object],
    what: str,
    child: Watched | None = None,
    timeout: float = WAIT,
    interval: float = 0.05,
):
    """`condition()`'s first true value, polled every `interval` s; fails once `child` has
    exited (with what it printed) or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if child is not None and child.exited():
            raise AssertionError(f"exited before {what}\n{child.describe()}")
        if time.monotonic() > deadline:
            described = f"\n{child.describe()}" if child is not None else ""
            raise AssertionError(f"not {what} after {timeout} s{described}")
        time.sleep(interval)
    return value


def generate(url: str, rid: str, max_new_tokens: int, timeout: float = WAIT) -> None:
    """One greedy request to the front at `url`, answered in full (200)."""
    body = {
        "rid": rid,
        "text": f"prompt {rid}",
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
    }
    req = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with OPENER.open(req, timeout=timeout) as resp:
        assert resp.status == 200
        resp.read()

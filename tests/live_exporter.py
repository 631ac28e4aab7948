"""A live exporter scraped by a real Prometheus: `serve` on the embedded runtime, with data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .prometheus_harness import PrometheusServer
from .test_serve_cli import Child


def start_scraped(workdir: Path, request: pytest.FixtureRequest, *args: str) -> PrometheusServer:
    """`serve` on the runtime, small and fast (`args` added), scraped every second by a real
    Prometheus; both reaped at teardown. Returns once Prometheus sees the target up.

    The runtime keeps its own pace (a step every 8 ms or so, about a fifth of a core), as a
    server's steps come: what the tests wait for is Prometheus' scrapes, and as fast as it
    can go the child would take a whole core for as long as they wait."""
    child = Child(
        "serve",
        "--source", "runtime",
        "--listen", "127.0.0.1:0",
        "--concurrency", "8,32",
        "--steps-per-level", "40",
        "--sts-warmup-steps", "20",
        *args,
        workdir=workdir / "serve",
    )  # fmt: skip
    request.addfinalizer(child.kill)
    target = re.sub(r"^https?://", "", child.url()).split("/")[0]
    prom = PrometheusServer({"dspark": [target]}, scrape_interval="1s", workdir=workdir / "prom")
    prom.start()
    request.addfinalizer(prom.stop)
    prom.wait_until_up("dspark")
    return prom


def serve_scraped(tmp_path: Path, request: pytest.FixtureRequest) -> PrometheusServer:
    """Start both (reaped at teardown) and return once every rate() has two samples."""
    prom = start_scraped(tmp_path, request, "--shadow", "cap-accept", "--mode", "compact")
    # rate() over 1m needs two samples of every counter; the first panels' data is the proof
    prom.wait_for(
        "count(rate(dspark_request_steps_total[1m]) > 0)",
        lambda r: bool(r) and float(r[0]["value"][1]) >= 3,
        timeout=30,
    )
    return prom

"""Every HTTP server we run reads requests one strict way (http_strict), over real sockets.

The request-smuggling forms a proxy may read differently from us, oversized and slow
headers, too many connections, oversized batches and deep JSON bodies: each refused with
its status, counted under its reason on the server, and never a traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections import Counter

import pytest
from dspark_obs.exporters.http_server import MetricsServer
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dspark_obs import http_strict
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend
from dspark_obs.runtime_server.protocol import MAX_BATCH

SMUGGLING = {
    "repeated": (b"Content-Length: 2\r\nContent-Length: 2\r\n", "bad_content_length"),
    "negative": (b"Content-Length: -1\r\n", "bad_content_length"),
    "space before colon": (b"Content-Length : 2\r\n", "bad_header"),
    "folded": (b"Content-Length: 2\r\n 3\r\n", "folded_header"),
    "plus": (b"Content-Length: +2\r\n", "bad_content_length"),
    "underscore": (b"Content-Length: 0_2\r\n", "bad_content_length"),
    "non-ASCII digit": ("Content-Length: \u0662\r\n".encode(), "bad_header"),
    "with Transfer-Encoding": (
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        "bad_content_length",
    ),
}


@pytest.fixture(params=["runtime-server", "metrics"])
def server(request):
    if request.param == "runtime-server":
        front = RuntimeFrontend(RuntimeConfig(), port=0)
        front.start()
        yield front.httpd.server_address[:2], front.refusals, "/generate"
        front.stop()
    else:
        metrics = MetricsServer(registry=CollectorRegistry(), port=0)
        metrics.start()
        yield metrics.address, metrics.refusals, "/metrics"
        metrics.stop()


def exchange(addr, data: bytes, wait: float = 10.0) -> bytes:
    """Send `data` and read the answer until the server closes."""
    with socket.create_connection(addr, timeout=wait) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("form", SMUGGLING, ids=list(SMUGGLING))
def test_smuggling_forms_are_refused_with_400_and_counted(server, form, caplog):
    addr, refusals, path = server
    headers, reason = SMUGGLING[form]
    request = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n{}"
    with caplog.at_level(logging.WARNING, "dspark_obs.http_strict"):
        answer = exchange(addr, request)
    assert status(answer) == 400, answer[:200]
    assert refusals.snapshot() == {reason: 1}
    assert b"Connection: close" in answer
    assert "refused a request from 127.0.0.1" in caplog.text


@pytest.fixture(scope="module")
def front():
    """One runtime server for every example below: a server's stop waits out its serve loop's
    half-second poll, which sixty servers of their own spent in all."""
    front = RuntimeFrontend(RuntimeConfig(), port=0)
    front.start()
    yield front
    front.stop()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="0123456789+-_ .e\u0662\u00b9x", min_size=1, max_size=6))
def test_a_content_length_is_ascii_digits_or_refused(front, value):
    before = Counter(front.refusals.snapshot())
    head = f"POST /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {value}"
    answer = exchange(front.httpd.server_address[:2], head.encode() + b"\r\n\r\n")
    refused = Counter(front.refusals.snapshot()) - before
    digits = value.strip(" ").isascii() and value.strip(" ").isdigit()
    if digits and int(value) == 0:
        assert status(answer) == 404  # read, then answered: POST /health is no endpoint
        assert refused == {}
    elif not digits:
        assert status(answer) == 400
        assert refused.total() == 1


def test_headers_are_bounded_in_lines_and_bytes(server):
    addr, refusals, _ = server
    many = b"".join(b"X-%d: y\r\n" % i for i in range(http_strict.MAX_HEADERS + 1))
    assert status(exchange(addr, b"GET / HTTP/1.1\r\n" + many + b"\r\n")) == 431
    big = b"X: " + b"y" * (http_strict.MAX_LINE + 10) + b"\r\n"
    assert status(exchange(addr, b"GET / HTTP/1.1\r\n" + big + b"\r\n")) == 431
    assert refusals.snapshot() == {"headers_too_large": 2}


def test_a_trickling_client_is_cut_at_the_request_deadline(server, monkeypatch):
    addr, refusals, _ = server
    monkeypatch.setattr(http_strict, "REQUEST_DEADLINE", 0.5)
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")  # and then nothing more
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.")
    assert status(answer) == 408
    assert refusals.snapshot() == {"slow_request": 1}


def test_connections_over_the_bound_get_503(monkeypatch):
    monkeypatch.setattr(http_strict.BoundedThreadingServer, "max_connections", 2)
    front = RuntimeFrontend(RuntimeConfig(), port=0)
    front.start()
    addr = front.httpd.server_address[:2]
    held = [socket.create_connection(addr) for _ in range(2)]
    try:
        time.sleep(0.2)  # both accepted and waiting for a request line
        answer = exchange(addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status(answer) == 503
        assert front.refusals.snapshot() == {"too_many_connections": 1}
    finally:
        for s in held:
            s.close()
        front.stop()


def post(addr, path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}"
    return exchange(addr, head.encode() + b"\r\n\r\n" + body)


def test_runtime_server_bounds_a_batch_and_a_deep_body():
    with RuntimeFrontend(RuntimeConfig(), port=0) as front:
        addr = front.httpd.server_address[:2]
        batch = json.dumps({"text": ["a"] * (MAX_BATCH + 1)}).encode()
        answer = post(addr, "/generate", batch)
        assert status(answer) == 413
        assert f"at most {MAX_BATCH}".encode() in answer
        deep = b"[" * 100_000 + b"]" * 100_000
        answer = post(addr, "/generate", deep)
        assert status(answer) == 400
        assert b"nested 100000 levels deep" in answer
        # and the server still answers
        assert status(exchange(addr, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200


def test_a_client_that_hangs_up_costs_no_traceback(capfd):
    with RuntimeFrontend(RuntimeConfig(), port=0) as front:
        addr = front.httpd.server_address[:2]
        body = json.dumps(
            {"text": ["x"] * 8, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
        ).encode()
        for _ in range(5):
            s = socket.create_connection(addr)
            s.sendall(
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                + body
            )
            # a reset, not a close: the server's next write fails
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(r.engine.pending for r in front.ranks):
            time.sleep(0.1)
        assert status(exchange(addr, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err

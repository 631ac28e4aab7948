"""Limits and secrets at the edges, over real sockets and real processes.

- answers and records over a byte limit are refused without being read whole,
  counted under `reason="oversized"` and logged once;
- the runtime-server answers 413 for large bodies and 429 (with Retry-After)
  for a client over its request rate;
- everything listens on loopback unless told otherwise;
- secrets (SGLang's bearer token, the runtime-server's key, basic-auth
  passwords) appear in no log line, error message or run manifest.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import logging
import os
import re
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from dspark_obs.exporters import MetricsServer, hash_password

from dspark_obs.cli.demo_cmd import DEFAULT_LISTEN as DEMO_LISTEN
from dspark_obs.cli.main import build_parser
from dspark_obs.ingest.lines import JsonlFollower
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RateLimiter, RuntimeFrontend
from dspark_obs.runtime_server.handler import MAX_BODY
from dspark_obs.sources.sglang_http import ResponseTooLarge, SGLangClient
from dspark_obs.sources.sglang_poller import SGLangPoller
from dspark_obs.sources.stats import IngestStats

from .conftest import cli
from .test_serve_cli import OPENER, Child, scrape
from .test_sglang_poller import SAMPLE, Stub

MiB = 1 << 20


@pytest.fixture(scope="module")
def sample_info() -> dict:
    return json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]


# -- oversized /server_info answers ---------------------------------------------------------------


class Flood:
    """Answers every GET with `size` bytes, with or without declaring the length.

    Counts what it managed to send before the client hung up, which is how the
    tests see that the client stopped reading instead of draining the body.
    """

    def __init__(self, size: int, declare: bool) -> None:
        self.sent = 0
        self.done = threading.Event()
        flood = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # close-delimited: the body has no declared end

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                if declare:
                    self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b" " * (256 << 10)
                try:
                    while flood.sent < size:
                        self.wfile.write(chunk)
                        flood.sent += len(chunk)
                except OSError:
                    pass  # the client hung up: what we wanted
                finally:
                    flood.done.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("declare", [True, False])
def test_client_stops_at_the_limit_without_holding_the_body(declare):
    flood = Flood(256 * MiB, declare)
    client = SGLangClient(flood.url, timeout=10, max_bytes=1 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(ResponseTooLarge, match="1,048,576"):
            client.request("/server_info")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert flood.done.wait(10)
    # memory: the limit plus a chunk, not the 256 MiB on offer
    assert peak < 4 * MiB, peak
    # and the rest was never fetched: the server's writes failed once the socket closed
    assert flood.sent < 64 * MiB, flood.sent
    flood.close()


def test_poller_counts_oversized_once_drains_and_recovers(sample_info, caplog):
    """An answer over the limit is refused and counted; draining lets the next poll through."""
    stub = Stub(copy.deepcopy(sample_info))
    stats = IngestStats()
    poller = SGLangPoller(stub.url, stats=stats, interval=0.05, retries=100, max_bytes=64 << 10)
    big = len(json.dumps({"internal_states": [{"dspark_info_record": sample_info}]}))
    assert big > 64 << 10  # the sample answer is over the limit
    stop = threading.Event()
    out: list = []
    thread = threading.Thread(target=lambda: out.extend(poller.batches(stop)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="dspark_obs"):
        thread.start()
        deadline = time.monotonic() + 120
        while stub.clears < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stub.clears >= 1  # the over-large buffer was drained
        new = [dict(sample_info["records"][-1], forward_ct=50_000 + i) for i in range(3)]
        stub.add(new)
        while len(out) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()
        thread.join(5)
    assert [b.forward_ct for b in out] == [50_000, 50_001, 50_002]
    errors = stats.snapshot()[1]
    assert errors[(poller.name, "oversized")] == 1
    assert stats.snapshot()[2][poller.name] == 1  # up again
    warnings = [r for r in caplog.records if "oversized" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    stub.close()


def test_serve_refuses_oversized_answers(sample_info, tmp_path, request):
    """`serve --sglang-max-bytes`: counted in /metrics by reason, logged once, still serving."""
    stub = Stub(copy.deepcopy(sample_info))
    request.addfinalizer(stub.close)
    child = Child(
        "serve", "--source", f"sglang:{stub.url}", "--listen", "127.0.0.1:0",
        "--poll-interval", "0.05", "--no-clear", "--sglang-max-bytes", "10000",
        workdir=tmp_path / "child",
    )  # fmt: skip
    request.addfinalizer(child.kill)
    url = child.url()
    pattern = re.compile(
        rf'dspark_ingest_errors_total\{{source="sglang:{re.escape(stub.url)}",'
        rf'reason="oversized"\}} (\d+)'
    )
    deadline = time.monotonic() + 120
    count = 0
    while time.monotonic() < deadline and count < 3:
        match = pattern.search(scrape(url))
        count = int(match.group(1)) if match else 0
        time.sleep(0.1)
    assert count >= 3, scrape(url)
    assert f'dspark_source_up{{source="sglang:{stub.url}"}} 0' in scrape(url)
    assert child.stop() == 0
    # logged once (the final line counts them apart: "N failed polls (oversized N)")
    assert child.stderr.count(": oversized: ") == 1, child.stderr
    assert re.search(r"failed polls \(oversized \d+\)", child.stderr), child.stderr


# -- oversized records in files ------------------------------------------------------------------


def test_ingest_skips_and_counts_lines_over_the_limit(sample_info, tmp_path):
    recs = sample_info["records"]
    lines = [
        {"internal_states": [{"dspark_info_record": {**sample_info, "records": part}}]}
        for part in (recs[:5], recs[5:60], recs[60:65])  # the middle snapshot is large
    ]
    text = [json.dumps(x) for x in lines]
    limit = max(len(text[0]), len(text[2])) + 10
    assert len(text[1]) > limit
    path = tmp_path / "polled.jsonl"
    path.write_text("\n".join(text) + "\n")
    out = tmp_path / "run"
    proc = cli("ingest", str(path), "--out", str(out), "--max-record-bytes", str(limit))
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["steps"] == 10
    assert manifest["bad_records"] == {"oversized": 1}
    assert "oversized 1" in proc.stdout


def test_ingest_block_accept_line_over_the_limit(tmp_path):
    sample = (Path(__file__).parent / "data" / "sglang" / "block_accept.sampled.jsonl").read_bytes()
    lines = sample.splitlines()[:200]
    limit = max(len(line) for line in lines) + 1
    huge = b'{"rid": "x-1", "fct": 0, "w": 0, "cl": 0, "ct": 0, "pad": "' + b"y" * limit + b'"}'
    path = tmp_path / "block.jsonl"
    path.write_bytes(b"\n".join([*lines[:100], huge, *lines[100:]]) + b"\n")
    out = tmp_path / "run"
    cli("ingest", str(path), "--out", str(out), "--max-record-bytes", str(limit))
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["bad_records"]["oversized"] == 1
    assert manifest["jsonl_counts"]["lines"] == 200


def test_ingest_of_a_file_that_is_one_huge_line_fails_clearly(tmp_path):
    path = tmp_path / "dump.json"
    path.write_bytes(SAMPLE.read_bytes().replace(b"\n", b" "))
    proc = cli("ingest", str(path), "--out", str(tmp_path / "run"), "--max-record-bytes", "1000",
               check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("every line is over --max-record-bytes (1,000)")
    assert not (tmp_path / "run").exists()


def test_follower_drops_a_runaway_line_as_it_grows(tmp_path):
    path = tmp_path / "grow.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    follower = JsonlFollower(path, max_line_bytes=100)
    assert follower.read_lines() == [b'{"a": 1}']
    with path.open("ab") as fh:
        for _ in range(5):  # a line arriving in pieces, each one alone under the limit
            fh.write(b"x" * 60)
            fh.flush()
            assert follower.read_lines() == []
        fh.write(b'\n{"b": 2}\n')
    assert follower.read_lines() == [b'{"b": 2}']
    assert follower.oversized_lines == 1
    follower.close()


# -- the runtime-server ----------------------------------------------------------------------------


def _config() -> RuntimeConfig:
    return RuntimeConfig(seed=3, concurrency=[4], steps_per_level=1, max_new_tokens=16)


def _get(url: str, path: str = "/health", headers: dict | None = None):
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def test_rate_limiter_token_arithmetic():
    now = [0.0]
    limiter = RateLimiter(4.0, clock=lambda: now[0])
    assert [limiter.wait("a") for _ in range(4)] == [0.0] * 4  # a burst of one second's worth
    assert limiter.wait("a") == pytest.approx(0.25)
    assert limiter.wait("b") == 0.0  # per client
    now[0] = 0.25
    assert limiter.wait("a") == 0.0
    assert limiter.wait("a") == pytest.approx(0.25)
    now[0] = 100.0
    assert [limiter.wait("a") for _ in range(5)][-1] > 0  # refills to the burst, not beyond
    assert limiter.refused == 3
    assert RateLimiter(0).wait("a") == 0.0  # 0 disables
    with pytest.raises(ValueError):
        RateLimiter(float("nan"))


def test_runtime_server_answers_429_with_retry_after():
    with RuntimeFrontend(_config(), port=0, rate_limit=5) as front:
        # the bucket's clock stands still unless moved: how fast requests go does not matter
        now = [0.0]
        front.limiter.clock = lambda: now[0]
        statuses = [_get(front.url)[0] for _ in range(20)]
        assert statuses == [200] * 5 + [429] * 15  # a burst of one second's worth
        status, headers, body = _get(front.url)
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert json.loads(body)["error"]["code"] == 429
        now[0] += 0.21  # > 1/5 s: one token back
        assert [_get(front.url)[0] for _ in range(2)] == [200, 429]
        # a refused POST: answered without reading its body, and its connection closed
        conn = http.client.HTTPConnection(front.url.removeprefix("http://"), timeout=10)
        conn.request("POST", "/generate", body=b'{"text": "x"}')
        resp = conn.getresponse()
        assert resp.status == 429 and resp.getheader("Connection") == "close"
        conn.close()
        assert front.limiter.refused == 18


def test_runtime_server_rate_limit_zero_disables_it():
    with RuntimeFrontend(_config(), port=0, rate_limit=0) as front:
        assert {_get(front.url)[0] for _ in range(300)} == {200}


def test_runtime_server_refuses_large_and_chunked_bodies():
    with RuntimeFrontend(_config(), port=0) as front:
        host = front.url.removeprefix("http://")
        body = b" " * (MAX_BODY + 1)  # sent for real, not only announced
        conn = http.client.HTTPConnection(host, timeout=10)
        try:
            conn.request("POST", "/generate", body=body)
            resp = conn.getresponse()
            assert resp.status == 413
            assert str(MAX_BODY) in json.loads(resp.read())["error"]["message"]
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close before the body is fully sent; it answered first
        finally:
            conn.close()
        conn = http.client.HTTPConnection(host, timeout=10)
        conn.putrequest("POST", "/generate")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        conn.send(b"5\r\nhello\r\n0\r\n\r\n")
        assert conn.getresponse().status == 411
        conn.close()
        assert _get(front.url)[0] == 200  # still serving


def test_cli_rate_limit_logs_once(tmp_path, request):
    child = Child("runtime-server", "--port", "0", "--sts", "none", "--rate-limit", "2",
                  workdir=tmp_path)  # fmt: skip
    request.addfinalizer(child.kill)
    url = child.wait_for_line(r"serving (http://\S+)").group(1)
    statuses = [_get(url)[0] for _ in range(2)]
    assert statuses == [200, 200]  # the burst; then refusals, however slow each request
    while statuses.count(429) < 3:
        assert len(statuses) < 1000, statuses
        statuses.append(_get(url)[0])
    assert child.stop() == 0
    assert child.stderr.count("--rate-limit") == 1, child.stderr


# -- loopback by default --------------------------------------------------------------------------


def test_everything_listens_on_loopback_by_default():
    parser = build_parser()
    assert parser.parse_args(["serve"]).listen == "127.0.0.1:9464"
    assert parser.parse_args(["runtime-server"]).host == "127.0.0.1"
    assert parser.parse_args(["demo"]).listen is None  # then the demo's default:
    assert DEMO_LISTEN.startswith("127.0.0.1:")
    with MetricsServer(metrics_app=lambda env, start: [], port=0) as server:
        assert server.address[0] == "127.0.0.1"
    with RuntimeFrontend(_config(), port=0) as front:
        assert front.httpd.server_address[0] == "127.0.0.1"


# -- secrets stay out of logs, errors and manifests ------------------------------------------------

SECRET = "tok-3f9a1c7e-never-print-me"


def _assert_nowhere(secret: str, *texts: str, run_dir: Path | None = None) -> None:
    for text in texts:
        assert secret not in text
    if run_dir is not None and run_dir.exists():
        for f in run_dir.rglob("*"):
            if f.is_file():
                assert secret.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("via", ["file", "env"])
def test_sglang_token_is_never_logged(sample_info, tmp_path, request, via):
    """serve against a server that refuses the token, then one that is down."""
    stub = Stub(copy.deepcopy(sample_info), api_key="the-server-wants-another")
    request.addfinalizer(stub.close)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there any more: connection refused
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    args = ["--sglang-api-key-file", str(key_file)] if via == "file" else []
    env = {"DSPARK_SGLANG_API_KEY": SECRET} if via == "env" else {}
    out = tmp_path / "run"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        child = Child(  # --debug: tracebacks on, so that nothing is hidden from the grep
            "--debug", "serve", "--source", f"sglang:{stub.url}", "--source", f"sglang:{dead_url}",
            "--listen", "127.0.0.1:0", "--poll-interval", "0.05", "--poll-retries", "1",
            "--out", str(out), *args, workdir=tmp_path / "child",
        )  # fmt: skip
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    request.addfinalizer(child.kill)
    url = child.url()
    deadline = time.monotonic() + 120
    text = ""
    while time.monotonic() < deadline:
        text = scrape(url)
        if 'reason="http_401"' in text and 'reason="connect_failed"' in text:
            break
        time.sleep(0.1)
    assert 'reason="http_401"' in text and 'reason="connect_failed"' in text, text
    assert child.stop() == 0
    assert "401" in child.stderr  # the failure itself is reported...
    _assert_nowhere(SECRET, child.stdout, child.stderr, text, run_dir=out)  # ...the token never


def test_sglang_token_file_errors_name_the_file_not_its_content(tmp_path):
    bad = tmp_path / "key"
    bad.write_bytes(b"\xff" + SECRET.encode())
    proc = cli("serve", "--source", "sglang:http://127.0.0.1:9", "--listen", "127.0.0.1:0",
               "--sglang-api-key-file", str(bad), check=False)  # fmt: skip
    assert proc.returncode == 2 and str(bad) in proc.stderr
    _assert_nowhere(SECRET, proc.stdout, proc.stderr)


def test_credentials_in_a_source_url_are_refused_unechoed():
    proc = cli("serve", "--source", f"sglang:http://admin:{SECRET}@127.0.0.1:9",
               "--listen", "127.0.0.1:0", check=False)  # fmt: skip
    assert proc.returncode == 2 and "credentials in the URL" in proc.stderr
    _assert_nowhere(SECRET, proc.stdout, proc.stderr)


@pytest.mark.parametrize("via", ["file", "env", "argv"])
def test_runtime_server_key_is_never_logged(tmp_path, request, via):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    args = {"file": ["--api-key-file", str(key_file)], "argv": ["--api-key", SECRET], "env": []}
    old = os.environ.get("DSPARK_RUNTIME_API_KEY")
    if via == "env":
        os.environ["DSPARK_RUNTIME_API_KEY"] = SECRET
    try:
        child = Child("runtime-server", "--port", "0", "--sts", "none", *args[via],
                      workdir=tmp_path / "child")  # fmt: skip
    finally:
        if via == "env":
            if old is None:
                os.environ.pop("DSPARK_RUNTIME_API_KEY")
            else:
                os.environ["DSPARK_RUNTIME_API_KEY"] = old
    request.addfinalizer(child.kill)
    url = child.wait_for_line(r"serving (http://\S+)").group(1)
    status, _, body = _get(url, "/server_info", {"Authorization": "Bearer wrong-" + SECRET})
    assert status == 401
    assert SECRET not in body.decode()
    assert _get(url, "/server_info", {"Authorization": f"Bearer {SECRET}"})[0] == 200
    assert child.stop() == 0
    _assert_nowhere(SECRET, child.stdout, child.stderr)


def test_runtime_server_key_file_missing_or_empty(tmp_path):
    for name, content in (("missing", None), ("empty", "  \n")):
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        proc = cli("runtime-server", "--port", "0", "--sts", "none", "--api-key-file", str(path),
                   check=False)  # fmt: skip
        assert proc.returncode == 2 and f"--api-key-file {path}" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_basic_auth_passwords_are_never_logged(tmp_path, request):
    password, guess = "pw-" + SECRET, "guess-" + SECRET
    config = tmp_path / "web.json"
    config.write_text(json.dumps({"basic_auth_users": {"prom": hash_password(password, rounds=4)}}))
    child = Child("--debug", "serve", "--listen", "127.0.0.1:0", "--web-config", str(config),
                  "--speed", "0", "--concurrency", "4", "--steps-per-level", "5", "--sts", "none",
                  workdir=tmp_path / "child")  # fmt: skip
    request.addfinalizer(child.kill)
    url = child.url()
    for user, pw, status in (
        ("prom", guess, 401),
        ("nobody", password, 401),
        ("prom", password, 200),
    ):
        token = base64.b64encode(f"{user}:{pw}".encode()).decode()
        req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        try:
            got = OPENER.open(req, timeout=10).status
        except urllib.error.HTTPError as exc:
            got = exc.code
        assert got == status
    assert child.stop() == 0
    _assert_nowhere(SECRET, child.stdout, child.stderr)

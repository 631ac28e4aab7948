"""The SGLang poller and `serve` against hostile servers on loopback (tests/hostile_sglang.py).

Each class of the issue: the key never leaves the configured origin; a poll has a deadline
for the whole answer and a stop ends it at once; a stop drains the answer taken or counts
what it could not convert; a step counter that jumps is not a gap; a nested answer is a
counted failure; a run store that fails stops `serve` with a message. Counters and messages
are checked, not only exit codes.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import resource
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.answer_memory import answer
from bench.sglang_load import polling_args
from dspark_obs.dashboards.querying import Prometheus, RenderError
from dspark_obs.sources.sglang_http import SGLangClient
from dspark_obs.sources.sglang_poller import SGLangPoller
from dspark_obs.sources.stats import IngestStats
from dspark_obs.telemetry.batch import MAX_FORWARD_CT, MAX_STEP_GAP

from .hostile_sglang import HostileServer, wait_for
from .test_serve_cli import Child, without_identity

SAMPLE = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"
KEY = "hostile-test-key"


@pytest.fixture(scope="module")
def sample_info() -> dict:
    return json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]


@pytest.fixture
def hostile(sample_info, request):
    """A server answering with the sample's records until told to misbehave."""
    servers = []

    def make(info: dict | None = sample_info) -> HostileServer:
        server = HostileServer(copy.deepcopy(info) if info else None)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _errors(stats: IngestStats, name: str) -> Counter:
    return Counter({r: n for (s, r), n in stats.snapshot().errors.items() if s == name})


def _run(poller: SGLangPoller, stop: threading.Event) -> tuple[list, threading.Thread]:
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(poller.batches(stop)), daemon=True)
    thread.start()
    return got, thread


# -- credentials stay on the configured origin ------------------------------------------------


@pytest.mark.parametrize("where", ["other_port", "other_host", "other_scheme"])
def test_a_redirect_to_another_origin_is_refused_counted_and_gets_no_key(hostile, caplog, where):
    server, elsewhere = hostile(), hostile()
    port = elsewhere.url.rsplit(":", 1)[1]
    server.mode = "redirect"
    server.redirect_to = {
        "other_port": f"{elsewhere.url}/server_info",
        "other_host": f"http://localhost:{port}/server_info",  # same address, another host
        "other_scheme": f"https://127.0.0.1:{server.url.rsplit(':', 1)[1]}/server_info",
    }[where]
    stats, stop = IngestStats(), threading.Event()
    poller = SGLangPoller(server.url, stats=stats, interval=0.05, retries=100, api_key=KEY)
    with caplog.at_level(logging.WARNING):
        got, thread = _run(poller, stop)
        assert wait_for(lambda: _errors(stats, poller.name)["redirect_refused"] >= 3)
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and got == []
    assert elsewhere.auth_seen == [] and server.auth_seen[0] == f"Bearer {KEY}"
    assert stats.snapshot().up[poller.name] == 0
    target = re.escape(re.sub(r"/server_info$", "", server.redirect_to).replace("localhost", ""))
    assert re.search(r"redirect_refused: .*another origin: refused", caplog.text), caplog.text
    assert re.search(target.split("//")[0], caplog.text)
    assert KEY not in caplog.text


def test_a_redirect_within_the_origin_is_followed(hostile, sample_info):
    server = hostile()
    server.mode = "redirect"
    server.redirect_status = 307
    server.redirect_to = "/moved"  # relative: the same origin
    client = SGLangClient(server.url, KEY, timeout=10)
    info = msgspec.json.decode(client.request("/server_info"))
    assert len(info["internal_states"][0]["dspark_info_record"]["records"]) == len(
        sample_info["records"]
    )
    assert server.paths == ["/server_info", "/moved"]
    assert server.auth_seen == [f"Bearer {KEY}"] * 2


def test_prometheus_queries_refuse_a_redirect_to_another_origin(hostile):
    server, elsewhere = hostile(None), hostile(None)
    server.mode = "redirect"
    server.redirect_status = 307
    server.redirect_to = f"{elsewhere.url}/api/v1/query"
    server.redirect_from = ("/api/v1/query",)  # the client asks with GET
    server.paths.clear()
    with pytest.raises(RenderError, match="another origin: refused"):
        Prometheus(server.url, timeout=10).check()
    assert elsewhere.paths == []


# -- a deadline for the whole answer, and a stop that ends a poll at once ---------------------


def test_a_dripping_server_is_a_counted_timeout_and_the_source_goes_down(hostile):
    server = hostile()
    server.mode = "drip"
    server.drip_every = 0.2  # each read succeeds: only a deadline on the whole answer helps
    stats, stop = IngestStats(), threading.Event()
    poller = SGLangPoller(server.url, stats=stats, interval=0.05, timeout=0.5, retries=100)
    got, thread = _run(poller, stop)
    assert wait_for(lambda: _errors(stats, poller.name)["timeout"] >= 2)
    assert stats.snapshot().up[poller.name] == 0
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and got == []
    assert set(_errors(stats, poller.name)) == {"timeout"}


@pytest.mark.parametrize("mode", ["drip", "silent"])
def test_a_stop_ends_a_poll_at_once_whatever_its_timeout(hostile, mode):
    server = hostile()
    server.mode = mode
    stats, stop = IngestStats(), threading.Event()
    poller = SGLangPoller(server.url, stats=stats, timeout=3600)
    got, thread = _run(poller, stop)
    assert wait_for(lambda: server.paths)  # the poll is under way
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and got == []
    assert _errors(stats, poller.name) == Counter()  # a stop is not a failure


def test_serve_goes_down_on_a_dripping_server_and_stops_within_10_s(hostile, tmp_path, request):
    server = hostile()
    server.mode = "drip"
    server.drip_every = 0.2
    args = polling_args(server.url, poll_interval=0.1, out=tmp_path / "run")
    child = Child(*args, "--poll-timeout", "1", workdir=tmp_path / "child")
    request.addfinalizer(child.kill)
    url, name = child.url(), f"sglang:{server.url}"
    text = ""

    def down() -> bool:
        nonlocal text
        text = without_identity(urllib.request.urlopen(url, timeout=10).read().decode())
        timeouts = re.search(
            rf'dspark_ingest_errors_total{{source="{name}",reason="timeout"}} (\d+)', text
        )
        return bool(timeouts) and f'dspark_source_up{{source="{name}"}} 0' in text

    assert wait_for(down, timeout=120, every=0.3), text
    polls = len(server.paths)
    assert wait_for(lambda: len(server.paths) > polls)  # a dripping poll is under way
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(10) == 0, child.describe()
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["complete"] is True and manifest["steps"] == 0
    assert "Traceback" not in child.stderr


# -- a stop drains what was taken, or counts it ------------------------------------------------


def _tiny_answer(n: int) -> bytes:
    return answer(n)


@pytest.mark.parametrize("drain_seconds", [0.0, 60.0])
def test_a_stop_while_converting_stores_or_counts_every_step_taken(hostile, drain_seconds):
    """Stopped after the first step of a cleared answer: with time to drain, every step comes
    out; with none, the rest is counted as dropped_at_stop, one per step, none lost silently."""
    n = 5000
    server = hostile()
    server.mode = "payload"
    server.payload, server.after_clear = _tiny_answer(n), _tiny_answer(0)
    stats, stop = IngestStats(), threading.Event()
    poller = SGLangPoller(
        server.url, stats=stats, interval=0.05, gamma=7, drain_seconds=drain_seconds
    )
    got = []
    for batch in poller.batches(stop):
        got.append(batch.forward_ct)
        stop.set()
    assert server.clears == 1
    errors = _errors(stats, poller.name)
    assert len(got) + poller.dropped_at_stop == n
    assert errors["dropped_at_stop"] == poller.dropped_at_stop
    assert got == list(range(len(got)))
    if drain_seconds:
        assert len(got) == n and poller.dropped_at_stop == 0
    else:
        assert len(got) < n and set(errors) == {"dropped_at_stop"}


def test_serve_sigterm_mid_answer_stores_or_counts_every_cleared_step(hostile, tmp_path, request):
    n = 60_000
    server = hostile()
    server.mode = "payload"
    server.payload, server.after_clear = _tiny_answer(n), _tiny_answer(0)
    args = polling_args(server.url, poll_interval=0.1, out=tmp_path / "run")
    child = Child(*args, workdir=tmp_path / "child")
    request.addfinalizer(child.kill)
    child.url()
    assert wait_for(lambda: server.clears >= 1, timeout=120)
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(15) == 0, child.describe()
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["steps"] + manifest["dropped_at_stop"] == n, manifest
    stopped = child.stderr.splitlines()[-1]
    assert f"{manifest['steps']:,} steps ingested" in stopped
    if manifest["dropped_at_stop"]:
        assert f"{manifest['dropped_at_stop']:,} taken from the server but not converted" in stopped


# -- step counters: a jump is not a gap ---------------------------------------------------------


def _answer_with(info: dict, fcts: list[int]) -> bytes:
    template = info["records"][0]
    records = [dict(template, forward_ct=f) for f in fcts]
    return json.dumps({"internal_states": [{"dspark_info_record": dict(info, records=records)}]})


def _expected(fcts: list[int]) -> tuple[list[int], int, int, int]:
    """Which steps a poller hands out, and its dropped, jumps and rejected counts, from the
    rules written out: valid counters only, oldest first, a hole over MAX_STEP_GAP a jump."""
    valid = sorted(f for f in fcts if 0 <= f <= MAX_FORWARD_CT)
    out, dropped, jumps = [], 0, 0
    for f in valid:
        if out and f <= out[-1]:
            continue
        if out and f - out[-1] - 1 > MAX_STEP_GAP:
            jumps += 1
        elif out:
            dropped += f - out[-1] - 1
        out.append(f)
    return out, dropped, jumps, len(fcts) - len(valid)


STEP_COUNTERS = st.lists(
    st.one_of(
        st.integers(0, 40),
        st.integers(MAX_STEP_GAP - 2, MAX_STEP_GAP + 50),
        st.integers(MAX_FORWARD_CT - 3, MAX_FORWARD_CT + 3),
        st.integers(2**64 - 8, 2**64 + 8),
        st.integers(-3, -1),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(STEP_COUNTERS)
def test_step_counter_jumps_and_out_of_range_values_never_feed_the_gap_count(sample_info, fcts):
    stats = IngestStats()
    poller = SGLangPoller("http://127.0.0.1:9", stats=stats, gamma=sample_info["gamma"])
    states = poller._decode(_answer_with(sample_info, fcts).encode())
    got = [b.forward_ct for b in poller._records(states)]
    want, dropped, jumps, rejected = _expected(fcts)
    errors = _errors(stats, poller.name)
    assert got == want
    assert poller.dropped_steps == errors["dropped_steps"] == dropped
    assert errors["forward_ct_jump"] == jumps
    assert errors["malformed"] + errors["bad_record"] == rejected
    assert dropped <= MAX_STEP_GAP * max(1, len(fcts))


# -- answers nested too deep, and a store that fails ---------------------------------------------


@pytest.mark.parametrize("where", ["top", "record"])
def test_a_deeply_nested_answer_is_a_counted_failure(hostile, sample_info, where):
    deep = "[" * 100_000 + "]" * 100_000
    text = json.dumps({"internal_states": [{"dspark_info_record": sample_info}]})
    text = (
        f'{{"x": {deep}, ' + text[1:]
        if where == "top"
        else text.replace('"bs": ', f'"zz": {deep}, "bs": ', 1)
    )
    server = hostile()
    server.mode = "payload"
    server.payload = text.encode()
    stats, stop = IngestStats(), threading.Event()
    poller = SGLangPoller(server.url, stats=stats, interval=0.05, retries=100)
    got, thread = _run(poller, stop)
    assert wait_for(lambda: _errors(stats, poller.name)["too_deep"] >= 2)
    stop.set()
    thread.join(10)
    assert got == [] and stats.snapshot().up[poller.name] == 0


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (48 << 10, 48 << 10))  # a disk that fills up


def test_serve_stops_with_a_message_when_the_run_store_fails(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, "-m", "dspark_obs", "serve", "--source", "runtime", "--speed", "0",
            "--listen", "127.0.0.1:0", "--out", str(out), "--flush-steps", "20",
            "--concurrency", "64",
        ],
        preexec_fn=_small_files,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dspark-obs serve: error: the run store failed:"), proc.stderr
    assert "File too large" in last and last.endswith("stopped serving")
    assert json.loads((out / "run.json").read_text())["complete"] is False

"""The SGLang poller over real HTTP against a server speaking SGLang's documented protocol.

No GPU SGLang server runs here: the stub below answers `GET /server_info` with
payloads in SGLang 0.5.23's exact record format (built from the sample dumps in
tests/data/sglang, written with SGLang's own record types) and honours
`POST /set_internal_state {"server_args": {"dspark_clear_info_records": true}}`
as the server does: it empties the records.
"""

from __future__ import annotations

import copy
import json
import signal
import threading
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.sglang_load import polling_args
from dspark_obs.sources.sglang_poller import SGLangPoller
from dspark_obs.sources.stats import IngestStats
from dspark_obs.sources.workloads import workload_rule
from dspark_obs.telemetry.server_info import decode_info_record

from .prometheus_harness import free_port
from .test_serve_cli import Child, without_identity
from .test_sglang_columnar import assert_same

#: Seconds to wait for a condition: generous, so that a loaded machine only makes a test slower.
WAIT = 120.0
SAMPLE = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"


class Stub:
    """A DSpark SGLang server's HTTP surface, with switchable faults."""

    def __init__(self, info: dict, *, api_key: str | None = None, port: int = 0) -> None:
        self.info = info  # the dspark_info_record of rank 0 (records are served, then cleared)
        self.records = list(info["records"])
        self.fault: str | None = None
        self.api_key = api_key
        self.clears = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _auth(self) -> bool:
                if stub.api_key and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                    self.send_response(401)
                    self.end_headers()
                    return False
                return True

            def do_GET(self):
                if not self._auth():
                    return
                fault = stub.fault
                if fault == "500":
                    self.send_response(500)
                    self.end_headers()
                    return
                if fault == "slow":
                    time.sleep(1.5)
                with stub.lock:
                    record = dict(stub.info, records=list(stub.records))
                body = json.dumps({"internal_states": [{"dspark_info_record": record}]}).encode()
                if fault == "truncated":
                    body = body[: len(body) // 2]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                if not self._auth():
                    return
                length = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(length))
                if req.get("server_args", {}).get("dspark_clear_info_records"):
                    with stub.lock:
                        stub.records.clear()
                        stub.clears += 1
                body = json.dumps([{"updated": True}]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, records: list[dict]) -> None:
        with self.lock:
            self.records.extend(records)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sample_info() -> dict:
    return json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]


def collect(poller: SGLangPoller, stop: threading.Event, until, timeout: float = WAIT) -> list:
    out: list = []

    def run():
        for b in poller.batches(stop):
            out.append(b)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(out):
        time.sleep(0.05)
    stop.set()
    t.join(5)
    return out


def test_reads_every_record_once_and_drains(sample_info):
    stub = Stub(copy.deepcopy(sample_info))
    stats = IngestStats()
    poller = SGLangPoller(
        stub.url, stats=stats, interval=0.1, workload_of=workload_rule(r"^(?P<workload>[a-z0-9]+)-")
    )
    n = len(sample_info["records"])
    got = collect(poller, threading.Event(), lambda out: len(out) >= n and stub.clears >= 2)
    assert [b.forward_ct for b in got] == [r["forward_ct"] for r in sample_info["records"]]
    assert stub.clears >= 1 and poller.duplicates == 0 and poller.dropped_steps == 0
    assert set(got[0].workload) <= {"gsm8k", "arena", "poetry"}
    assert stats.snapshot()[2][poller.name] == 1
    stub.close()


def test_without_draining_overlapping_reads_are_deduplicated(sample_info):
    stub = Stub(copy.deepcopy(sample_info))
    poller = SGLangPoller(stub.url, stats=IngestStats(), interval=0.05, clear=False)
    n = len(sample_info["records"])
    got = collect(poller, threading.Event(), lambda out: poller.duplicates >= 2 * n)
    assert len(got) == n and stub.clears == 0
    stub.close()


def test_gaps_count_dropped_steps_and_a_restart_follows_the_old_steps(sample_info):
    info = copy.deepcopy(sample_info)
    records = info["records"]
    info["records"] = records[:10] + records[15:20]  # five steps never seen
    stub = Stub(info)
    stats = IngestStats()
    poller = SGLangPoller(stub.url, stats=stats, interval=0.05)
    got = collect(poller, threading.Event(), lambda out: len(out) >= 15)
    assert poller.dropped_steps == 5 and len(got) == 15
    assert stats.snapshot()[1][(poller.name, "dropped_steps")] == 5
    # the server restarts: its step counter starts again from 0, and its steps are stored
    # after the last one taken (the same key twice would pool two steps into one)
    stop = threading.Event()
    stub.add(copy.deepcopy(records[:3]))
    again = collect(poller, stop, lambda out: len(out) >= 3)
    last = records[19]["forward_ct"]
    assert [b.forward_ct for b in again] == [last + 1 + r["forward_ct"] for r in records[:3]]
    assert stats.snapshot()[1][(poller.name, "server_restart")] == 1
    stub.close()


def test_without_draining_a_restart_past_the_old_counter_is_seen_by_its_records(sample_info):
    """Its newest step is no older than the last one taken, but the step of that number is
    another step: a new life, stored after the old one; the same records again are not."""
    records = sample_info["records"]
    stub = Stub(copy.deepcopy(sample_info))
    stub.records = copy.deepcopy(records[:5])
    stats = IngestStats()
    poller = SGLangPoller(stub.url, stats=stats, interval=0.05, clear=False)
    first = collect(poller, threading.Event(), lambda out: len(out) >= 5 and poller.duplicates)
    assert [b.forward_ct for b in first] == [r["forward_ct"] for r in records[:5]]
    assert (poller.name, "server_restart") not in stats.snapshot()[1]
    second_life = copy.deepcopy(records[:10])
    for r in second_life:  # the same numbers, other steps: their requests differ
        for req in r["reqs"]:
            req["rid"] = f"again-{req['rid']}"
    with stub.lock:
        stub.records = second_life
    again = collect(poller, threading.Event(), lambda out: len(out) >= 10)
    last = records[4]["forward_ct"]
    assert [b.forward_ct for b in again] == [last + 1 + r["forward_ct"] for r in second_life]
    assert stats.snapshot()[1][(poller.name, "server_restart")] == 1
    stub.close()


def test_faults_are_counted_and_the_poller_recovers(sample_info):
    port = free_port()
    stats = IngestStats()
    poller = SGLangPoller(
        f"http://127.0.0.1:{port}", stats=stats, interval=0.1, timeout=0.5, retries=50
    )
    stop = threading.Event()
    out: list = []
    t = threading.Thread(target=lambda: out.extend(poller.batches(stop)), daemon=True)
    t.start()
    deadline = time.monotonic() + WAIT  # down at start
    while (poller.name, "connect_failed") not in stats.snapshot()[1]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stats.snapshot()[2][poller.name] == 0
    stub = Stub(copy.deepcopy(sample_info), port=port)
    n = len(sample_info["records"])
    deadline = time.monotonic() + WAIT
    while len(out) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(out) == n and stats.snapshot()[2][poller.name] == 1
    for fault, reason in (("500", "http_500"), ("truncated", "bad_json"), ("slow", "timeout")):
        stub.fault = fault
        deadline = time.monotonic() + WAIT
        while (poller.name, reason) not in stats.snapshot()[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (poller.name, reason) in stats.snapshot()[1], reason
        assert stats.snapshot()[2][poller.name] == 0
        stub.fault = None
        stub.add([dict(sample_info["records"][-1], forward_ct=10_000 + len(out))])
        before = len(out)
        deadline = time.monotonic() + WAIT
        while len(out) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(out) == before + 1, f"no recovery after {fault}"
        assert stats.snapshot()[2][poller.name] == 1
    stop.set()
    t.join(5)
    stub.close()


def test_a_bad_record_is_counted_and_the_rest_kept(sample_info):
    info = copy.deepcopy(sample_info)
    info["records"] = info["records"][:5]
    info["records"][2]["reqs"][0]["draft_tokens"] = [1, 2]  # not gamma long
    stub = Stub(info)
    stats = IngestStats()
    poller = SGLangPoller(stub.url, stats=stats, interval=0.05)
    got = collect(poller, threading.Event(), lambda out: len(out) >= 4)
    assert len(got) == 4
    assert stats.snapshot()[1][(poller.name, "bad_record")] == 1
    stub.close()


def test_a_valid_poll_is_converted_in_one_pass_as_record_by_record(sample_info, monkeypatch):
    """Each rank's records go through the one-pass conversion (never a Python object per
    number); the batches are what converting each record gives, and a poll with a bad
    record still goes record by record (see the test above)."""
    from dspark_obs.telemetry import server_info_raw

    per_record_calls = []
    real = server_info_raw.record_to_batch
    monkeypatch.setattr(
        server_info_raw,
        "record_to_batch",
        lambda *a, **k: per_record_calls.append(1) or real(*a, **k),
    )
    workload_of = workload_rule(r"^(?P<workload>[a-z0-9]+)-")
    stub = Stub(copy.deepcopy(sample_info))
    poller = SGLangPoller(stub.url, stats=IngestStats(), interval=0.05, workload_of=workload_of)
    n = len(sample_info["records"])
    got = collect(poller, threading.Event(), lambda out: len(out) >= n)
    stub.close()
    assert per_record_calls == [] and poller.mode == sample_info["mode"]
    info = decode_info_record(sample_info)
    want = [
        real(rec, gamma=info.gamma, mode=info.mode, rank=0, workload_of=workload_of)
        for rec in info.records
    ]
    assert_same(got, want)


def test_bearer_token(sample_info, tmp_path):
    stub = Stub(copy.deepcopy(sample_info), api_key="s3cret")
    stats = IngestStats()
    refused = SGLangPoller(stub.url, stats=stats, interval=0.05)
    collect(
        refused,
        threading.Event(),
        lambda out: (refused.name, "http_401") in stats.snapshot()[1],
    )
    assert (refused.name, "http_401") in stats.snapshot()[1]
    poller = SGLangPoller(stub.url, stats=IngestStats(), interval=0.05, api_key="s3cret")
    got = collect(poller, threading.Event(), lambda out: len(out) >= 5)
    assert len(got) >= 5
    stub.close()


def serve_polling(stub: Stub, n: int, out: Path, tmp_path: Path, request) -> tuple[Child, str]:
    """`serve --source sglang:URL` on the stub (reaped at teardown), once all `n` records are in.

    Returns the still running child and its last /metrics text.
    """
    child = Child(*polling_args(stub.url, poll_interval=0.1, out=out), workdir=tmp_path / "child")
    request.addfinalizer(child.kill)
    url = child.url()
    want = f'dspark_ingest_records_total{{source="sglang:{stub.url}"}} {n}'
    deadline = time.monotonic() + WAIT
    text = ""
    while time.monotonic() < deadline:
        text = without_identity(urllib.request.urlopen(url, timeout=5).read().decode())
        if want in text:
            break
        time.sleep(0.2)
    return child, text


def stop_serving(child: Child) -> None:
    child.proc.send_signal(signal.SIGINT)
    assert child.proc.wait(15) == 0, child.describe()


def test_serve_polls_a_server_into_metrics(sample_info, tmp_path, request):
    """`serve --source sglang:URL` end to end: every record served reaches /metrics once."""
    stub = Stub(copy.deepcopy(sample_info))
    n = len(sample_info["records"])
    child, text = serve_polling(stub, n, tmp_path / "run", tmp_path, request)
    expected = Counter(
        r["rid"].rsplit("-", 1)[0] for rec in sample_info["records"] for r in rec["reqs"]
    )
    assert f'dspark_ingest_records_total{{source="sglang:{stub.url}"}} {n}' in text
    for wl, count in expected.items():
        assert (
            f'dspark_request_steps_total{{workload="{wl}",mode="compact",rank="0"}} {count}' in text
        )
    assert f'dspark_source_up{{source="sglang:{stub.url}"}} 1' in text
    stop_serving(child)
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["complete"] is True and manifest["steps"] == n
    stub.close()


def test_unknown_fields_are_ignored_missing_ones_counted(sample_info):
    """A newer server may add fields (ignored); a record missing a required one is rejected."""
    info = copy.deepcopy(sample_info)
    info["records"] = info["records"][:4]
    info["records"][0]["some_future_field"] = {"x": 1}
    info["records"][0]["reqs"][0]["another_new_field"] = 3
    del info["records"][1]["reqs"][0]["correct_drafts"]
    stub = Stub(info)
    stats = IngestStats()
    poller = SGLangPoller(stub.url, stats=stats, interval=0.05)
    got = collect(poller, threading.Event(), lambda out: len(out) >= 3)
    assert [b.forward_ct for b in got] == [0, 2, 3]
    assert stats.snapshot()[1][(poller.name, "bad_record")] == 1
    stub.close()

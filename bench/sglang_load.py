"""Load: `serve` polling eight busy SGLang ranks keeps up, over real HTTP on loopback (P9).

The server is a stub speaking SGLang's documented protocol (`GET /server_info`
with one `internal_states` entry per data-parallel rank, `POST
/set_internal_state {"server_args": {"dspark_clear_info_records": true}}` to
drain) for eight ranks running 256 requests each. Its records are real: step
records of the reference runtime at batch size 256, encoded once in SGLang's
exact JSON, then served at a fixed rate per rank with consecutive `forward_ct`s.
Producing them costs the stub next to nothing, so on a two-core machine `serve`
gets a core to itself, as it would beside a GPU server. The stub knows which
steps each read handed out and which a drain wiped unread (SGLang's read/clear
race).

Keeping up is a speed claim, so it is measured here and not asserted by a test:
sampled every two seconds, the lag (steps recorded and not yet ingested or counted
dropped), its slope, the ranks' record buffers, the share of the offered traffic
processed and the share lost to the race, each with the bound a serve that keeps
up stays within (`meets_*`). tests/test_load.py runs the same stub for its exact
accounting: every step handed out ingested once, every race loss counted.

`python -m bench sglang_load [--quick]`; `--steps-per-second` via
`DSPARK_LOAD_STEPS_PER_SECOND` finds a machine's ceiling (docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import numpy as np

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.telemetry.server_info import batch_to_record, batches_to_info_record

from .common import record
from .serve_child import SERVING, serve_args

RANKS = 8
PER_RANK = 256
#: Steps per second each rank records: 8 x 8 x 256 = 16,384 request-steps/s in all, about
#: a seventh of what one serve process ingests on a two-core machine (docs/reliability.md).
STEPS_PER_SECOND = float(os.environ.get("DSPARK_LOAD_STEPS_PER_SECOND", "8"))
SAMPLE_EVERY = 2.0
POLL_INTERVAL = 1.0
#: Distinct records served in a cycle (a rank's rids repeat after this many steps).
POOL = 96
#: The stubs' rids start with the workload.
RID = r"^(?P<workload>[a-z0-9]+)-"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def polling_args(*urls: str, poll_interval: float, out: Path) -> list[str]:
    """`serve` polling SGLang servers (or stubs of them), stored to `out`.

    SGLang's dumps do not say how requests sample; the stubs' traffic is greedy,
    which lets the ceiling walk run exactly.
    """
    return [
        *serve_args(*(f"sglang:{url}" for url in urls)),
        "--poll-interval", str(poll_interval),
        "--gamma", "7",
        "--assume", "greedy",
        "--workload-from-rid", RID,
        "--out", str(out),
    ]  # fmt: skip


class StubRanks:
    """SGLang's `/server_info` and drain for `ranks` ranks recording `rate` steps per second.

    Rank r has recorded `floor(rate * elapsed)` steps (`dspark_steps`); its
    buffer holds those after the last drain (SGLang keeps at most 200,000).
    Accounting: `handed[r]` counts the steps reads handed out (each once: a
    drain follows every read here), `lost[r]` the steps a drain wiped unread.
    """

    def __init__(self, ranks: int, rate: float, pool: list[bytes], envelope: dict) -> None:
        self.ranks, self.rate, self.pool = ranks, rate, pool
        self.lock = threading.Lock()
        self.start: float | None = None  # no steps recorded before `begin`
        self.frozen: float | None = None
        self.cleared = np.zeros(ranks, dtype=np.int64)  # first step still in the buffer
        self.read_upto = np.zeros(ranks, dtype=np.int64)  # one past the last step handed out
        self.handed = np.zeros(ranks, dtype=np.int64)
        self.lost = np.zeros(ranks, dtype=np.int64)
        self.reads = 0
        head, sep, tail = msgspec.json.encode({**envelope, "records": []}).partition(
            b'"records":[]'
        )
        assert sep
        self.head, self.tail = head + b'"records":[', b"]" + tail
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(stub.server_info() if self.path == "/server_info" else b"{}")

            def do_POST(self) -> None:
                body = msgspec.json.decode(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("server_args", {}).get("dspark_clear_info_records"):
                    stub.clear()
                answer = [{"updated": True, "server_args": body["server_args"]}] * stub.ranks
                self._send(msgspec.json.encode(answer))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def begin(self) -> None:
        """Traffic starts: each rank records `rate` steps per second from now."""
        with self.lock:
            self.start = time.monotonic()

    def recorded(self) -> np.ndarray:
        """Steps each rank has recorded so far (ranks are staggered by a fraction of a step)."""
        if self.start is None:
            return np.zeros(self.ranks, dtype=np.int64)
        now = self.frozen if self.frozen is not None else time.monotonic()
        phase = np.arange(self.ranks) / self.ranks
        return np.floor((now - self.start) * self.rate + phase).astype(np.int64)

    def freeze(self) -> None:
        """Traffic stops: no more steps are recorded."""
        with self.lock:
            self.frozen = time.monotonic()

    def server_info(self, account: bool = True) -> bytes:
        """The answer, built by one join over the pre-encoded records (no copies per record)."""
        with self.lock:
            upto = self.recorded()
            lo = np.maximum(self.cleared, upto - 200_000)
            if account:
                self.reads += 1
                self.handed += upto - np.maximum(lo, self.read_upto)
                self.read_upto = upto
        parts = [b'{"internal_states":[']
        for r in range(self.ranks):
            parts += [b"," if r else b"", b'{"dspark_info_record":', self.head]
            for i, f in enumerate(range(int(lo[r]), int(upto[r]))):
                parts += [b',{"forward_ct":' if i else b'{"forward_ct":', b"%d," % f]
                parts.append(self.pool[f % len(self.pool)])
            parts.append(self.tail)
            parts.append(b',"dspark_steps":%d,"num_running_reqs":%d}' % (upto[r], PER_RANK))
        parts.append(b"]}")
        return b"".join(parts)

    def clear(self) -> None:
        with self.lock:
            upto = self.recorded()
            self.lost += upto - np.maximum(self.cleared, self.read_upto)
            self.cleared = upto
            self.read_upto = np.maximum(self.read_upto, upto)

    def buffered(self) -> np.ndarray:
        with self.lock:
            return self.recorded() - self.cleared

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def record_pool() -> tuple[list[bytes], dict]:
    """`POOL` consecutive steps of the runtime at 256 running requests, as SGLang encodes them
    (each without its leading `{"forward_ct":N,`, which the stub writes per step)."""
    runtime = DSparkRuntime(
        RuntimeConfig(seed=5, concurrency=[PER_RANK], steps_per_level=POOL, max_new_tokens=128)
    )
    pool = []
    for batch in runtime.run():
        record = batch_to_record(batch)
        record.draft_gpu_ms = record.target_verify_gpu_ms = None  # not dumped, as in the front
        raw = msgspec.json.encode(record)
        prefix = b'{"forward_ct":%d,' % batch.forward_ct
        assert raw.startswith(prefix) and batch.num_reqs == PER_RANK
        pool.append(raw[len(prefix) :])
    envelope = batches_to_info_record(
        [], mode="compact", gamma=7, components=("core", "reqs", "step_cpu_time", "step_gpu_time")
    )
    return pool, envelope


def per_rank(text: str, name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'rank="' in line:
            rank = int(line.split('rank="', 1)[1].split('"', 1)[0])
            out[rank] = out.get(rank, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def ingest_errors(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("dspark_ingest_errors_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape(url: str) -> str:
    with _OPENER.open(url, timeout=30) as resp:
        return resp.read().decode()


def per_rank_steps(text: str) -> np.ndarray:
    per = per_rank(text, "dspark_steps_total")
    return np.array([per.get(r, 0.0) for r in range(RANKS)])


def _sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))  # fmt: skip


def run(quick: bool) -> list[dict]:
    seconds = 8.0 if quick else 40.0
    pool, envelope = record_pool()
    stub = StubRanks(RANKS, STEPS_PER_SECOND, pool, envelope)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "stdout"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dspark_obs",
                 *polling_args(stub.url, poll_interval=POLL_INTERVAL, out=Path(tmp) / "run")],
                stdout=fh, stderr=subprocess.DEVNULL, cwd=tmp,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not (m := SERVING.search(log.read_text())):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"serve did not start:\n{log.read_text()}")
                time.sleep(0.05)
            metrics = m.group("url")
            stub.begin()
            samples = []  # (t, recorded, ingested, dropped, request-steps, buffered)
            while (t := time.monotonic() - stub.start) < seconds:
                time.sleep(SAMPLE_EVERY)
                recorded, buffered = stub.recorded(), stub.buffered()
                text = scrape(metrics)
                samples.append((t, recorded, per_rank_steps(text),
                                ingest_errors(text).get("dropped_steps", 0.0),
                                _sum(text, "dspark_request_steps_total"), buffered))  # fmt: skip
            stub.freeze()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            stub.close()
    t = np.array([s[0] for s in samples])
    recorded_t = np.stack([s[1] for s in samples]).astype(float)
    ingested_t = np.stack([s[2] for s in samples])
    dropped_t = np.array([s[3] for s in samples])
    rows_t = np.array([s[4] for s in samples])
    buffers = np.stack([s[5] for s in samples])
    lag = recorded_t.sum(axis=1) - ingested_t.sum(axis=1) - dropped_t  # steps, all ranks
    span = t[-1] - t[0]
    rate = (ingested_t[-1] - ingested_t[0]) / span  # steps/s ingested per rank
    processed = (ingested_t[-1].sum() + dropped_t[-1] - ingested_t[0].sum() - dropped_t[0]) / span
    slope = np.polyfit(t[len(t) // 2 :], lag[len(t) // 2 :], 1)[0]
    offered = RANKS * STEPS_PER_SECOND
    recorded = stub.recorded().sum()
    # the bounds a serve that keeps up stays within: all the traffic processed, what is
    # outstanding within a few seconds of it (a poll interval, one read's ingest, a sampling
    # gap) and not growing, the ranks' buffers drained, the race costing little
    checks = {
        "processed": processed >= 0.95 * offered,
        "per_rank_rate": bool(rate.min() >= 0.8 * STEPS_PER_SECOND),
        "lag_max": lag.max() <= 5.0 * offered,
        "lag_last_quarter": lag[-max(1, len(lag) // 4) :].mean() <= 3.0 * offered,
        "lag_slope": slope < 0.1 * offered,
        "buffers": buffers.max() <= 5.0 * STEPS_PER_SECOND,
        "race_share": stub.lost.sum() <= 0.15 * recorded,
    }
    parameters = {"ranks": RANKS, "per_rank": PER_RANK, "steps_per_second": STEPS_PER_SECOND,
                  "seconds": seconds, "poll_interval": POLL_INTERVAL}  # fmt: skip
    interval_rates = (np.diff(rows_t) / np.diff(t)).tolist()  # request-steps/s between samples
    return [record(
        "P9_sglang_load", parameters, "request_steps_per_s", interval_rates, 1.0,
        request_steps_per_s=float((rows_t[-1] - rows_t[0]) / span),
        steps_per_s=float(rate.sum()),
        processed_steps_per_s=float(processed),
        offered_steps_per_s=offered,
        lag_max_steps=float(lag.max()),
        lag_slope_steps_per_s=float(slope),
        buffer_max_records=int(buffers.max()),
        lost_to_race=int(stub.lost.sum()),
        recorded=int(recorded),
        reads=stub.reads,
        **{f"meets_{k}": bool(v) for k, v in checks.items()},
        keeps_up=all(checks.values()),
    )]  # fmt: skip

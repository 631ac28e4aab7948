"""P10: peak memory of `serve` polling one large `/server_info` answer, and of `ingest` of it.

One answer of N step records (1M in the full profile, about 190 MB: records without
`reqs`, the smallest SGLang writes, so the most steps per byte) is served once by a
loopback stub and then cleared, as SGLang does. `serve --source sglang:` polls it into a
run; `ingest` reads the same answer from a file into another. Each is a fresh process;
its peak resident size (VmHWM) is compared with the same command's peak over a
tiny answer (the constant: interpreter, libraries, the pipeline), and the difference is
given per MB of answer: the promise is at most 4 (docs/reliability.md).

The steps are also counted: every record of the answer must reach the run (a crash
otherwise), so the figure is never that of a command that skipped the work.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .common import record
from .serve_child import SERVING, serve_args

TARGET_PER_MB = 4.0
SAMPLE = (
    Path(__file__).parent.parent / "tests" / "data" / "sglang" / "server_info.compact.greedy.json"
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answer(n: int) -> bytes:
    """A one-rank `/server_info` answer of `n` records with consecutive forward_cts."""
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    template = {k: v for k, v in info["records"][0].items() if k != "reqs"}
    template["bs"] = 0
    head = json.dumps({k: v for k, v in template.items() if k != "forward_ct"})[1:]
    records = b",".join(b'{"forward_ct":%d,%s' % (i, head.encode()) for i in range(n))
    envelope = {k: v for k, v in info.items() if k != "records"}
    envelope["components"] = [c for c in envelope["components"] if c != "reqs"]
    env = json.dumps(envelope)[:-1].encode()
    return (
        b'{"internal_states":[{"dspark_info_record":' + env + b',"records":[' + records + b"]}}]}"
    )


class _OneAnswer:
    """Serves `body` until a clear, then an empty answer."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.empty = answer(0)
        holder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(holder.body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                holder.body = holder.empty
                self._send(b"[]")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _peak_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def _serve_peak(body: bytes, n: int, workdir: Path) -> float:
    """Peak RSS (MB) of `serve` once it has ingested all `n` records of `body`."""
    stub = _OneAnswer(body)
    log = workdir / "serve.log"
    args = [
        *serve_args(f"sglang:{stub.url}"),
        "--poll-interval",
        "0.2",
        "--out",
        str(workdir / "run"),
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_obs", *args], stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        url = None
        # the series whatever other labels it carries (engine, model_name)
        want = re.compile(
            rf'^dspark_ingest_records_total{{[^}}]*source="sglang:{re.escape(stub.url)}"[^}}]*}} '
            rf"{n}(\.0)?$",
            re.M,
        )
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and proc.poll() is None:
            if url is None and (m := SERVING.search(log.read_text(errors="replace"))):
                url = m.group("url")
            if url is not None:
                with _OPENER.open(url, timeout=30) as resp:
                    if want.search(resp.read().decode()):
                        return _peak_mb(proc.pid)
            time.sleep(0.5)
        raise RuntimeError(f"serve did not ingest {n} records: {log.read_text()[-2000:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        stub.close()


#: `ingest` in a process that prints its own peak resident size last: a child's ru_maxrss
#: also counts what its parent held when it forked, VmHWM only its own.
_INGEST = (
    "import re, sys; from pathlib import Path; from dspark_obs.cli.main import main; "
    "rc = main(['ingest', *sys.argv[1:]]); "
    r"print(re.search(r'VmHWM:\s+(\d+)', Path('/proc/self/status').read_text()).group(1)); "
    "sys.exit(rc)"
)


def _ingest_peak(body: bytes, n: int, workdir: Path) -> float:
    """Peak RSS (MB) of `ingest` of `body` as a file; its run must hold all `n` steps."""
    path = workdir / "answer.json"
    path.write_bytes(body)
    out = workdir / "ingested"
    proc = subprocess.run(
        [sys.executable, "-c", _INGEST, str(path), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ingest failed: {proc.stderr[-2000:]}")
    steps = json.loads((out / "run.json").read_text())["steps"]
    if steps != n:
        raise RuntimeError(f"ingest stored {steps} of {n} steps")
    return int(proc.stdout.split()[-1]) / 1024


def run(quick: bool) -> list[dict]:
    n = 20_000 if quick else 1_000_000
    out = []
    for command, peak in (("serve", _serve_peak), ("ingest", _ingest_peak)):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "small").mkdir()
            (work / "large").mkdir()
            base = peak(answer(10), 10, work / "small")
            body = answer(n)
            mb = len(body) / 2**20
            top = peak(body, n, work / "large")
            del body
        per_mb = (top - base) / mb
        out.append(
            record(
                f"P10_{command}_rss_per_answer_mb",
                {"records": n, "answer_mb": round(mb, 1)},
                "MB_rss_per_MB_answer",
                [per_mb],
                1.0,
                target=TARGET_PER_MB,
                peak_rss_mb=round(top, 1),
                constant_rss_mb=round(base, 1),
            )
        )
    return out


if __name__ == "__main__":
    from .common import run_alone

    run_alone(run)

"""`dspark-obs serve` and `demo` as an operator meets them: a separate process, real signals.

A service is judged by its edges: Ctrl-C or a SIGTERM from systemd must leave a complete,
readable run (not a truncated part and a manifest claiming "incomplete"), a finite replay must
be able to end by itself for batch jobs, and every mistake on the command line must come back
as one line and exit status 2 rather than a traceback an operator has to decode.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from bench.serve_child import EPHEMERAL, SERVING, serve_args

from .serving import OPENER, WAIT, wait_until

RUNTIME = [
    "--source",
    "runtime",
    "--speed",
    "0",
    "--concurrency",
    "8",
    "--steps-per-level",
    "20",
    "--sts",
    "none",
]
DEMO = ["--concurrency", "8", "--steps-per-level", "20", "--sts-warmup-steps", "20", "--quiet"]


class Child:
    """A `dspark-obs` command in its own process, signalled the way a terminal or systemd would.

    Output goes to files rather than pipes, so a child can never stall on a full pipe while the
    test is busy scraping it, and whatever it printed is still there for a failure message.
    """

    def __init__(self, *args: str, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.args = args
        self._out, self._err = workdir / "stdout.txt", workdir / "stderr.txt"
        with self._out.open("wb") as out, self._err.open("wb") as err:
            # cwd=workdir: a default `runs/...` directory must never land in the checkout.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dspark_obs", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"},
            )

    @property
    def stdout(self) -> str:
        return self._out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self._err.read_text(errors="replace")

    def describe(self) -> str:
        return (
            f"dspark-obs {' '.join(self.args)} (rc={self.proc.poll()})\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def wait_for_line(self, pattern: re.Pattern[str] | str, timeout: float = WAIT) -> re.Match:
        """The child announces its URL on stdout; poll for it rather than guessing a delay."""
        regex = re.compile(pattern)
        return wait_until(
            lambda: regex.search(self.stdout), f"printing {regex.pattern!r}", self, timeout
        )

    def url(self, timeout: float = WAIT) -> str:
        return self.wait_for_line(SERVING, timeout).group("url")

    def stop(self, sig: int = signal.SIGINT, timeout: float = WAIT) -> int:
        """Signal and wait; a child that outlives `timeout` fails the test (and is killed)."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"still running {timeout}s after {signal.Signals(sig).name}\n{self.describe()}"
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        # a failed test must not leave a poller running: it would drain servers that later
        # tests start on the same (reused) ports
        self.kill()


#: the exporter's own labels, which lead every sample's label set (exporters/catalog.IDENTITY)
_IDENTITY = re.compile(r'engine="[^"]*",model_name="[^"]*",?')


def without_identity(text: str) -> str:
    """An exposition without the exporter's `engine` and `model_name` labels, for tests
    about the other labels (test_serve_labels_every_series_with_engine_and_model has them)."""
    return _IDENTITY.sub("", text).replace("{}", "")


def scrape(url: str, opener: urllib.request.OpenerDirector = OPENER) -> str:
    """`/metrics` as text, without the exporter's identity labels."""
    with opener.open(url, timeout=10) as resp:
        assert resp.status == 200
        return without_identity(resp.read().decode())


def sample_sum(text: str, name: str) -> float:
    """Sum of one family's samples across label sets, read off the exposition text."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def run_cli(*args: str, cwd: Path, timeout: float = WAIT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dspark_obs", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "160"},
    )


def parquet_rows(table_dir: Path) -> int:
    return pl.read_parquet(str(table_dir / "part-*.parquet")).height


# --- stopping -----------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_runtime_serve_stops_on_signal_with_a_complete_run(tmp_path, sig):
    out = tmp_path / "served"
    child = Child("serve", *RUNTIME, "--out", str(out), "--listen", EPHEMERAL, workdir=tmp_path)
    try:
        url = child.url()
        seen = wait_until(
            lambda: (n := sample_sum(scrape(url), "dspark_steps_total")) > 50 and n,
            "50 steps",
            child,
        )
        rc = child.stop(sig)
    finally:
        child.kill()
    assert rc == 0, child.describe()

    manifest = json.loads((out / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["source"] == "serve:runtime"
    # Every step the service accepted reached the store: none lost in an unflushed buffer.
    stored = parquet_rows(out / "steps")
    assert stored == manifest["steps"] >= seen
    assert parquet_rows(out / "requests") == manifest["request_steps"] > 0
    assert f"stopped: {stored:,} steps ingested, 0 rejected" in child.stderr
    assert "Traceback" not in child.stderr


def test_replay_exits_by_itself_with_exit_when_done(compact_run, tmp_path):
    run_dir, summary = compact_run
    steps = summary["overall"]["steps"]
    out = tmp_path / "copy"
    proc = run_cli(
        *serve_args(f"run:{run_dir}", speed=0),
        "--exit-when-done",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert SERVING.search(proc.stdout)
    assert f"ended after {steps:,} steps" in proc.stdout
    assert "still serving" not in proc.stdout
    # The replay is re-stored whole: the copy holds the same steps and request rows.
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["steps"] == parquet_rows(out / "steps") == steps
    assert parquet_rows(out / "requests") == summary["overall"]["request_steps"]


# --- bad input ----------------------------------------------------------------------------


@pytest.fixture
def bound_port() -> Iterator[int]:
    """A port some other program is already listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _bad_web_config(tmp_path: Path) -> Path:
    path = tmp_path / "web.json"
    path.write_text(json.dumps({"tls_server_config": {"cert_file": "x.crt"}, "http2": True}))
    return path


BAD_INPUTS = {
    # case: (tmp_path, port in use) -> (arguments, what the message must name)
    "unknown-source": lambda tmp, port: (["--source", "bogus"], "bogus"),
    "missing-run-dir": lambda tmp, port: (["--source", "run:/nonexistent"], "/nonexistent"),
    "dir-is-not-a-run": lambda tmp, port: (["--source", f"run:{tmp}"], "run.json"),
    "listen-without-port": lambda tmp, port: (["--listen", "nonsense"], "nonsense"),
    "listen-port-taken": lambda tmp, port: (
        [*RUNTIME, "--listen", f"127.0.0.1:{port}"],
        f"cannot listen on 127.0.0.1:{port}",
    ),
    "web-config-invalid": lambda tmp, port: (
        [*RUNTIME, "--web-config", str(_bad_web_config(tmp))],
        "http2",
    ),
    "web-config-missing": lambda tmp, port: (
        [*RUNTIME, "--web-config", str(tmp / "nowhere.json")],
        "nowhere.json",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(tmp_path, bound_port, case):
    args, needle = BAD_INPUTS[case](tmp_path, bound_port)
    out = tmp_path / "out"
    args = [*args, "--out", str(out)]
    if "--listen" not in args:
        args += ["--listen", "127.0.0.1:0"]
    proc = run_cli("serve", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    assert "\n" not in message, message
    assert message.startswith("dspark-obs serve: error: "), message
    assert needle in message
    assert "serving" not in proc.stdout
    # A refused start must not leave a run behind that blocks the corrected command.
    assert not (out / "run.json").exists()


# --- demo ---------------------------------------------------------------------------------


def test_demo_prints_the_scrape_url_and_serves_the_run_there(tmp_path):
    out = tmp_path / "demo"
    child = Child(
        "demo", *DEMO, "--out", str(out), "--listen", "127.0.0.1:0", "--hold", workdir=tmp_path
    )
    try:
        announced = child.wait_for_line(r"serving live metrics at (http://\S+/metrics)").group(1)
        held = child.wait_for_line(r"still serving (http://\S+/metrics)").group(1)
        assert held == announced
        text = scrape(announced)
        rc = child.stop(signal.SIGINT)
    finally:
        child.kill()
    assert rc == 0, child.describe()
    # What the printed URL served is the demo's own run, step for step.
    steps = json.loads((out / "run.json").read_text())["steps"]
    assert sample_sum(text, "dspark_steps_total") == steps > 0


def test_demo_no_serve_prints_no_url(tmp_path):
    proc = run_cli("demo", *DEMO, "--out", str(tmp_path / "demo"), "--no-serve", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "serving" not in proc.stdout
    assert "/metrics" not in proc.stdout
    assert "http://" not in proc.stdout
    assert json.loads((tmp_path / "demo" / "run.json").read_text())["complete"] is True


def test_serve_labels_every_series_with_engine_and_model(compact_run, tmp_path):
    """`engine` and `model_name` lead every sample's labels: the run's (a reference run:
    `reference`, `dspark-obs/<world>`), or the model `--model-name` names."""
    run_dir, _ = compact_run
    for extra, model in (((), "dspark-obs/reference"), (("--model-name", "org/m 1"), "org/m 1")):
        child = Child(*serve_args(f"run:{run_dir}", speed=0), *extra, workdir=tmp_path / model)
        try:
            url = child.url()
            child.wait_for_line(r"ended after")  # the whole run is in
            with OPENER.open(url, timeout=10) as resp:
                text = resp.read().decode()
        finally:
            child.stop()
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert len(samples) > 100
        lead = f'{{engine="reference",model_name="{model}"'
        unlabelled = [s for s in samples if f"{lead}," not in s and f"{lead}}}" not in s]
        assert not unlabelled, unlabelled[:3]

"""A server restarted under `serve --out`: its new steps follow the old ones, never mix.

A real `runtime-server` process (SGLang's protocol) is polled by a real `serve` process
storing a run; the server is killed and started again on the same port mid-serve, so its
step counter starts over. Before, the second life's steps were stored under the first
life's keys, and every reader pooled two steps under one: `report`'s load read 41 tokens a
step at batch 1, where gamma + 1 = 8 is the most.

Every step served is accounted for: ingested, or lost to the read/clear race and counted
as a gap once a later step of the rank comes. A gap is counted only after a step of that
life was taken: SGLang's answers carry no counter, so steps that the drain after an answer
holding none of a life's steps wipes are lost unseen (an idle server's first steps, about one
poll in ten on a loaded machine). Each life therefore serves a request before the poller can
read it: the first before `serve` starts, the second while `serve` is stopped (SIGSTOP), once
its failed reads of the dead server show that its next contact is a read, not a drain.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from bench.sglang_load import polling_args
from dspark_obs.analysis.load import step_tokens
from dspark_obs.store import open_run

from .prometheus_harness import free_port
from .serving import OPENER, WAIT, generate, wait_until
from .test_serve_cli import Child

GAMMA = 7


def _server(port: int, workdir: Path) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "out.txt").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_obs", "runtime-server", "--port", str(port),
             "--mode", "compact", "--gamma", str(GAMMA), "--concurrency", "4", "--seed", "5"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def up() -> bool:
        assert proc.poll() is None, (workdir / "out.txt").read_text()
        try:
            with OPENER.open(f"http://127.0.0.1:{port}/health", timeout=5):
                return True
        except OSError:
            return False

    wait_until(up, "runtime-server up")
    return proc


def _generate(port: int, n: int, tag: str) -> None:
    """`n` requests one after another: every step runs at batch size 1."""
    for i in range(n):
        generate(f"http://127.0.0.1:{port}", f"{tag}-{i}", max_new_tokens=24)


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` whose labels include `labels`."""
    with OPENER.open(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def test_a_server_restarted_mid_serve_is_stored_after_its_first_life(tmp_path, request):
    port = free_port()
    server = _server(port, tmp_path / "server")
    request.addfinalizer(server.kill)
    _generate(port, 1, "before")  # the poller's first answer holds steps of this life
    run_dir = tmp_path / "run"
    args = polling_args(f"http://127.0.0.1:{port}", poll_interval=0.2, out=run_dir)
    child = Child(*args, workdir=tmp_path / "serve")
    request.addfinalizer(child.kill)
    metrics = child.url()

    def accounted() -> float:
        """Steps ingested, and steps the read/clear race lost (counted once a later one came)."""
        lost = _metric(metrics, "dspark_ingest_errors_total", reason="dropped_steps")
        return _metric(metrics, "dspark_steps_total") + lost

    def server_state() -> dict:
        with OPENER.open(f"http://127.0.0.1:{port}/server_info", timeout=10) as resp:
            return json.loads(resp.read())["internal_states"][0]

    def wait_accounted(before: int, what: str) -> int:
        """Wait until this life's steps (and `before`) are all ingested or counted lost; the
        life's step count. A step the read/clear race lost is counted once a later one
        comes: where the count stops short while the server holds no step the poller has
        not read, and it made no progress since the last look, one more request brings one
        (at worst needlessly, while the poller is still ingesting what it read)."""
        life = {"steps": server_state()["dspark_steps"], "n": 0, "stalled": None}

        def done() -> bool:
            now = accounted()
            if now >= before + life["steps"]:
                return True
            if server_state()["dspark_info_record"]["records"]:
                life["stalled"] = None  # the poller has steps still to read
            elif life["stalled"] != now:
                life["stalled"] = now
            else:
                _generate(port, 1, f"probe{life['n']}")
                life.update(steps=server_state()["dspark_steps"], n=life["n"] + 1, stalled=None)
            return False

        wait_until(done, what, child, interval=0.1)
        return life["steps"]

    _generate(port, 3, "first")
    first_life = wait_accounted(0, "the first life's steps")

    server.send_signal(signal.SIGKILL)  # the server dies; a new one takes its port
    server.wait(WAIT)
    wait_until(lambda: _metric(metrics, "dspark_source_up") == 0, "a failed read", child)
    child.proc.send_signal(signal.SIGSTOP)
    request.addfinalizer(lambda: child.proc.send_signal(signal.SIGCONT))
    server = _server(port, tmp_path / "server")
    request.addfinalizer(server.kill)
    _generate(port, 1, "restarted")  # the poller's first answer holds steps of this life
    child.proc.send_signal(signal.SIGCONT)
    _generate(port, 3, "second")
    second_life = wait_accounted(first_life, "the second life's steps")
    assert second_life > 0
    lost = accounted() - _metric(metrics, "dspark_steps_total")
    assert _metric(metrics, "dspark_ingest_errors_total", reason="server_restart") == 1
    assert child.stop(signal.SIGINT) == 0, child.describe()
    assert "the server restarted" in child.stderr, child.stderr

    run = open_run(run_dir)
    stored = run.steps().collect()
    assert stored.height + lost == first_life + second_life
    # each step its own key, the second life numbered after the first, in order
    assert stored.select(pl.struct("rank", "forward_ct").is_unique().all()).item()
    fct = stored.sort("forward_ct")["forward_ct"].to_list()
    assert fct == sorted(fct) and stored["forward_ct"].to_list() == sorted(fct)
    # the load every reader computes: at batch 1, at most gamma + 1 tokens a step
    load = step_tokens(run).collect()
    assert load.height == stored.height
    assert (load["committed"] <= (GAMMA + 1) * load["bs"]).all(), load.sort("committed").tail(3)
    assert (load["committed"] > 0).sum() == load.filter(pl.col("bs") > 0).height

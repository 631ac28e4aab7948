"""Every rank of a node, one consumer, one scrape target: the hook as a deployment runs it.

Two serving processes (tests/hook_rank.py), DP ranks 0 and 1, each with the hook attached
to its DSpark observers, share one `dspark-obs hook-consumer` on one port, which a real
Prometheus scrapes. `sglang` runs them the way `python -m sglang.launch_server
--forward-hooks "$(dspark-obs sglang-flag --json)"` does: SGLang 0.5.23's own
`register_forward_hooks` with the printed spec, then SGLang's own `DsparkStepObservers`
(it needs the SGLang environment, tools/test.sh; elsewhere that case skips). `observer`
attaches the hook to an observer with SGLang's signature, in the main environment.

What Prometheus ingests is held to an in-process attach fed the same steps (every counter
and histogram series, both ranks, with `engine` and `model_name`); then one rank is killed
and restarted (it rejoins under its rank), and the consumer is killed (the ranks go on
stepping, never raising or waiting; a hook starts a new consumer; every step is either
counted by it or counted as dropped).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dspark_obs.exporters.collector import Collector

from dspark_obs.hooks.sglang_worker import attach_observers
from dspark_obs.pipeline import build_pipeline
from tests.hook_rank import GAMMA
from tests.hook_reference import FakeObservers, StepStream
from tests.prometheus_harness import (
    WAIT,
    PrometheusServer,
    free_port,
    require_prometheus,
)
from tests.serving import wait_until

require_prometheus()

ROOT = Path(__file__).resolve().parent.parent
MODEL = "test-org/dspark-model"
#: a counter or histogram sample: what sums over a run and must equal the reference's
SUMMED = re.compile(r"^(dspark_\w+?(?:_total|_bucket|_sum|_count))(?:\{(.*)\})? (\S+)$")


class Rank:
    """One serving process of tests/hook_rank.py, started; `attached` waits for its hook."""

    def __init__(self, rank: int, seed: int, listen: str, spec: str, sglang: bool) -> None:
        cmd = [sys.executable, "-m", "tests.hook_rank", "--rank", str(rank), "--seed", str(seed),
               "--listen", listen, "--model", MODEL]  # fmt: skip
        if sglang:
            cmd += ["--sglang", "--spec", spec]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def attached(self) -> Rank:
        self.expect("attached")
        return self

    def expect(self, prefix: str) -> list[str]:
        line = self.proc.stdout.readline()
        assert line.startswith(prefix), f"expected {prefix!r}, got {line!r}"
        return line.split()

    def run(self, n: int, pause: float = 0.0) -> float:
        """n steps, `pause` seconds apart; the longest observer call so far, in seconds."""
        self.proc.stdin.write(f"run {n} {pause}\n")
        self.proc.stdin.flush()
        return float(self.expect("ran")[2])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("close\n")
            self.proc.stdin.flush()
            self.expect("closed")
            self.proc.stdin.close()
            self.proc.wait(60)


class Reference:
    """The same ranks' steps through an in-process attach, into one pipeline."""

    def __init__(self) -> None:
        self.pipeline = build_pipeline(GAMMA)
        self.ranks: dict[int, tuple] = {}

    def start(self, rank: int, seed: int) -> None:
        obs = FakeObservers()
        hook = attach_observers(
            obs, gamma=GAMMA, pool_slots=64, rank=rank, model_name=MODEL, consumer="inline",
            pipeline=self.pipeline,
        )  # fmt: skip
        self.ranks[rank] = (obs, hook, StepStream(gamma=GAMMA, seed=seed,
                                                  rid_prefix=f"r{rank}s{seed}"))  # fmt: skip

    def run(self, rank: int, n: int) -> None:
        obs, hook, stream = self.ranks[rank]
        for _ in range(n):
            obs.observe_verify_step(**stream.step())
            hook.drain()

    def series(self) -> dict[tuple, float]:
        text = Collector(const_labels=(("engine", "sglang"), ("model_name", MODEL))).collect(
            self.pipeline.aggregates.snapshot(),
            self.pipeline.stats.snapshot(),
            self.pipeline.estimator.snapshot(),
        )
        return summed(text.decode())


def summed(text: str) -> dict[tuple, float]:
    out = {}
    for line in text.splitlines():
        m = SUMMED.match(line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def ingested(prom: PrometheusServer) -> dict[tuple, float]:
    out = {}
    for r in prom.query('{__name__=~"dspark_.+(_total|_bucket|_sum|_count)", job="node"}'):
        metric = dict(r["metric"])
        name = metric.pop("__name__")
        metric.pop("job"), metric.pop("instance")
        out[(name, tuple(sorted(metric.items())))] = float(r["value"][1])
    return out


#: The sampled walk's point extrapolates the positions no later step revealed with the
#: population model as it stands when the walk is folded in, which a scrape does: the
#: consumer is scraped every second, the reference once, so this one family agrees to a
#: relative 1e-3 (every other, exactly).
MODELLED = {"dspark_estimator_walk_point_tokens_total": 1e-3}


def differences(want: dict[tuple, float], got: dict[tuple, float]) -> list[tuple]:
    out = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key), got.get(key)
        # float sums folded at other step boundaries (how the consumer drains the rings) may
        # differ in their last bit; 1e-12 of a count still tells any whole step apart
        tol = MODELLED.get(key[0], 1e-12)
        if a is None or b is None or abs(a - b) > tol * max(abs(a), abs(b)):
            out.append((key, a, b))
    return out


def assert_ingested(prom: PrometheusServer, want: dict[tuple, float]) -> None:
    """Prometheus holds `want`'s series and values, once its scrapes caught up."""
    deadline = time.monotonic() + WAIT
    while (diff := differences(want, ingested(prom))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not diff, f"{len(diff)} series differ (series, reference, ingested): {diff[:8]}"


def steps_by_rank(prom: PrometheusServer) -> dict[str, int]:
    rows = prom.query('sum by (rank) (dspark_steps_total{job="node"})')
    return {r["metric"]["rank"]: int(float(r["value"][1])) for r in rows}


def dropped(prom: PrometheusServer) -> int:
    rows = prom.query('sum(dspark_dropped_steps_total{job="node", reason="hook_ring_full"})')
    return int(float(rows[0]["value"][1])) if rows else 0


def consumer_pids(listen: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"hook-consumer" in cmd and listen.encode() in cmd:
                pids.append(int(entry))
    return pids


def sglang_available() -> bool:
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("how", ["observer", "sglang"])
def test_every_rank_of_a_node_on_one_scrape_target(how, tmp_path):
    if how == "sglang" and not sglang_available():
        pytest.skip("needs SGLang 0.5.23 (its test environment, tools/test.sh)")
    port = free_port()
    listen = f"127.0.0.1:{port}"
    spec = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "sglang-flag", "--json", "--listen", listen,
         "--model", MODEL], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    sglang = how == "sglang"
    # both ranks start at once, as a server's scheduler processes do (each imports SGLang)
    ranks = {0: Rank(0, 1, listen, spec, sglang), 1: Rank(1, 2, listen, spec, sglang)}
    ref = Reference()
    ref.start(0, 1)
    ref.start(1, 2)
    prom = PrometheusServer({"node": [listen]}, scrape_interval="1s", workdir=tmp_path / "prom")
    try:
        prom.start()
        for rank in ranks.values():
            rank.attached()
        prom.wait_until_up("node")
        for r, total in ((0, {"0": 60}), (1, {"0": 60, "1": 60})):
            ranks[r].run(60)
            ref.run(r, 60)
            wait_until(lambda total=total: steps_by_rank(prom) == total, f"rank {r}'s steps")
        want = ref.series()
        assert {k[0] for k in want} >= {"dspark_request_steps_total", "dspark_window_tokens_bucket"}
        assert_ingested(prom, want)
        assert ("model_name", MODEL) in next(iter(want))[1]

        # rank 1's process dies and comes back: a new ring, the same rank (stepping at 50 a
        # second, as a server does, while the consumer finds the ring within 0.1 s). The
        # ranks step one after the other, as the reference takes them: the sampled walk's
        # point extrapolates with a model fitted on both ranks' blocks, so it depends on the
        # order in which the consumer meets them.
        ranks[1].kill()
        ranks[1] = Rank(1, 3, listen, spec, sglang).attached()
        ref.start(1, 3)
        for r, total in ((0, {"0": 100, "1": 60}), (1, {"0": 100, "1": 100})):
            ranks[r].run(40, 0.02)
            ref.run(r, 40)
            wait_until(lambda total=total: steps_by_rank(prom) == total, f"rank {r}'s steps")
        assert_ingested(prom, ref.series())

        # the consumer dies: serving goes on, steps are dropped and counted, a new one starts
        (old,) = consumer_pids(listen)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: old not in consumer_pids(listen), "the consumer's death")
        longest = max(ranks[r].run(150) for r in ranks)
        assert longest < 10.0  # the observer call never waited for the consumer
        # each rank's hook may start one; the one that takes the lock stays
        (new,) = wait_until(
            lambda: pids if len(pids := consumer_pids(listen)) == 1 else None, "one consumer"
        )
        assert new != old

        def after_restart():
            steps = steps_by_rank(prom)
            return sum(steps.values()) + dropped(prom) == 300 and dropped(prom) > 0

        wait_until(after_restart, "every step counted or dropped by the new consumer")
        for r in ranks:
            ranks[r].run(20)
        before = dropped(prom)
        wait_until(lambda: sum(steps_by_rank(prom).values()) + before == 340, "the later steps")
        assert dropped(prom) == before  # a consumer that keeps up drops nothing
        for r in ranks:
            ranks[r].close()
    finally:
        for rank in ranks.values():
            if rank.proc.poll() is None:
                rank.kill()
        prom.stop()
        for pid in consumer_pids(listen):
            os.kill(pid, signal.SIGKILL)

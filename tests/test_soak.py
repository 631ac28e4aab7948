"""Bounded memory: `serve --source runtime` streaming requests for a long time stays flat.

A long-running exporter must not grow with the traffic it has seen: per-request
state (the tail walker's open walks) is freed when a
request ends, whether the runtime reuses its slot (finish) or the request just
stops appearing (idle timeout, `idle_steps` = 4096 steps), the run store holds at
most one flush interval in memory, and workload labels are capped however many
names the traffic invents.

The child's resident set size is read from /proc/PID/status (VmRSS) while it
runs; `dspark_estimator_pending_blocks` (open walks) and the step counters are
scraped from its /metrics. A plateau: the largest RSS of the last third of the
run is under 500 MB and a robust straight line (Theil-Sen) through the floor of the
last half rises by less than a few tens of MB per million request-steps served.
Against the traffic, not the clock: a leak grows with what was served, and a loaded
machine serves less of it per second, so the verdict does not depend on the machine's
speed.

The default run streams a million request-steps at 256 running requests (about 25 s
on two cores; freed on finish), checks the idle timeout in process with a short timeout, and
the workload label cap with 10,000 names. The full profile (>= 20M
request-steps, >= 1M requests, sweeps 256 -> 1 so that every concurrency-1
phase frees the other slots' requests by the idle timeout; about 11 minutes on
two cores) is marked `soak` and excluded by default (`pytest -m soak
tests/test_soak.py -s`). docs/reliability.md records the last figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.tails import TailWalker
from scipy.stats import theilslopes

from bench.serve_child import serve_args
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

from .test_serve_cli import Child, sample_sum, scrape

RSS_LIMIT_MB = 500.0
IDLE_STEPS = 4096  # the tail walker's idle timeout (estimator/tails.py)
WALK_EVERY = 16  # ... and how often it walks
MAX_NEW_TOKENS = 32
#: After a level change a finished request's last step is at most MAX_NEW_TOKENS steps in;
#: its open walks are idle IDLE_STEPS later and censored at the next walk.
EVICTED_AFTER = MAX_NEW_TOKENS + IDLE_STEPS + 2 * WALK_EVERY
#: Open walks of the one request left running at concurrency 1.
PENDING_AT_ONE = 8


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Samples:
    """What the soak watched: RSS over time, and scraped counters over time."""

    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MB)
    scraped: list[tuple[float, float, float, float]] = field(default_factory=list)
    # (t, steps, request-steps, pending blocks)
    manifest: dict = field(default_factory=dict)
    # (request-steps served, dspark_store_bytes, bytes under the store): a store's only
    disk: list[tuple[float, float, int]] = field(default_factory=list)


def _du(path: Path) -> int:
    """Bytes of the files under `path`. Retention deletes closed hours while the child runs,
    so a directory or file gone between its listing and its stat counts as deleted (os.walk
    skips a directory it can no longer list)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


def _closed_segments(root: Path) -> dict[Path, int]:
    """A production store's closed segments (an hour's run directory whose writer closed
    it) and the steps each holds: what retention may delete, oldest first."""
    out = {}
    for manifest in root.glob("node=*/rank=*/hour=*/run.json"):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):  # deleted or replaced while read: not closed here
            continue
        if m.get("complete") is True:
            out[manifest.parent] = m.get("steps") or 0
    return out


def _store_manifest(root: Path, deleted: float) -> dict:
    """A production store's hours summed as one manifest, with the steps retention deleted
    (`deleted`: as last scraped, and those of the closed segments gone since)."""
    out = {"steps": 0, "request_steps": 0, "requests_finished": 0, "complete": True}
    for manifest in root.glob("node=*/rank=*/hour=*/run.json"):
        m = json.loads(manifest.read_text())
        for key in ("steps", "request_steps", "requests_finished"):
            out[key] += m.get(key) or 0
        out["complete"] &= m.get("complete") is True
    out["deleted_steps"] = deleted
    # a flush's part of every table it wrote (steps, requests, ceilings), the largest
    parts: dict[tuple[Path, str], int] = {}
    for f in root.glob("node=*/rank=*/hour=*/*/part-*.parquet"):
        key = (f.parent.parent, f.name)
        parts[key] = parts.get(key, 0) + f.stat().st_size
    out["largest_part"] = max(parts.values())
    return out


def runtime_serve(tmp_path: Path, *args: str, store_gb: float | None = None) -> Child:
    """`serve` on the embedded runtime as fast as it goes, without STS, stored to `tmp_path/run`:
    one run directory, or (`store_gb`) a production store bounded to that size.

    The checks read the stored run back from there, and the child's cwd is
    kept apart so nothing it writes by default lands in the checkout.

    The runtime draws from a vocabulary of 32 tokens rather than its default 128: the tokens
    are the traffic, not what is watched (per-request state, the store, the labels keep no
    table by token), while the `[rows, vocab]` tables and log-softmaxes that generate each
    step are most of the child's CPU; at 32 tokens a step at 256 requests costs a third as
    much, so the same request-steps are served in less time. A part is published every 256
    steps (or 5 s) rather than every 2,000: the buffer a flush holds, which the resident size
    carries, is then bounded by the traffic, not by how much a fast machine serves in 5 s.
    """
    where = ["--out", str(tmp_path / "run")]
    if store_gb is not None:
        where = ["--store", str(tmp_path / "run"), "--retention-gb", str(store_gb)]
    return Child(
        *serve_args("runtime", speed=0),
        "--sts",
        "none",
        "--vocab-size",
        "32",
        "--flush-steps",
        "256",
        *where,
        *args,
        workdir=tmp_path / "cwd",
    )


def soak(
    tmp_path: Path,
    *,
    concurrency: str,
    steps_per_level: int,
    request_steps: int,
    timeout: float,
    every: float,
    extra: tuple[str, ...] = (),
    store_gb: float | None = None,
) -> Samples:
    """Run serve until it has served `request_steps` (or `timeout` s), sampling, then SIGTERM.

    With `store_gb`, into a production store of that bound: its bytes on disk are sampled
    too, and the manifest read back is the store's sums (steps kept, steps retention
    deleted)."""
    out = tmp_path / "run"
    samples = Samples()
    child = runtime_serve(
        tmp_path,
        "--concurrency",
        concurrency,
        "--steps-per-level",
        str(steps_per_level),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        *extra,
        store_gb=store_gb,
    )
    with child:
        url = child.url()
        start = time.monotonic()
        rows = 0.0
        while rows < request_steps and time.monotonic() - start < timeout:
            time.sleep(every)
            t = time.monotonic() - start
            samples.rss.append((t, _rss_mb(child.proc.pid)))
            if store_gb is not None:  # before the scrape: what it may since delete
                closed = _closed_segments(out)
            text = scrape(url)
            rows = sample_sum(text, "dspark_request_steps_total")
            samples.scraped.append(
                (
                    t,
                    sample_sum(text, "dspark_steps_total"),
                    rows,
                    sample_sum(text, "dspark_estimator_pending_blocks"),
                )
            )
            if store_gb is not None:
                samples.disk.append((rows, sample_sum(text, "dspark_store_bytes"), _du(out)))
                deleted = sample_sum(text, "dspark_store_deleted_steps_total")
        assert child.stop(signal.SIGTERM) == 0, child.describe()
    if store_gb is not None:
        # closing the last segment at the stop runs retention once more, after the last
        # scrape: the closed segments listed before that scrape and gone now were deleted
        # (one deleted between the listing and the scrape counts twice: a window of one request)
        deleted += sum(steps for path, steps in closed.items() if not path.exists())
    if store_gb is None:
        samples.manifest = json.loads((out / "run.json").read_text())
    else:
        samples.manifest = _store_manifest(out, deleted)
    assert samples.manifest["complete"] is True
    samples.manifest["store_mb"] = _du(out) / 2**20
    shutil.rmtree(out)  # gigabytes after the long profile
    return samples


def floor_slope(mb: np.ndarray, served: np.ndarray, chunks: int = 4) -> float:
    """MB per million request-steps by which the floor of RSS rises: the lowest sample of
    each of `chunks` consecutive stretches against their mean traffic, through a robust
    line (Theil-Sen). A flush's buffer lifts a sample or two above the floor and drops
    again; what is left behind lifts the floor, and only that is a leak. Spikes are too
    many for a line through every sample (a flush every few samples), and where they
    fall depends on the sampling phase, not on what the process holds."""
    parts = np.array_split(np.arange(len(mb)), chunks)
    floors = np.array([mb[p].min() for p in parts])
    traffic = np.array([served[p].mean() for p in parts])
    return float(theilslopes(floors, traffic).slope)


def check_plateau(samples: Samples, max_mb_per_million: float) -> tuple[float, float]:
    """RSS stays under the limit over the last third and its floor flat over the last half,
    against the request-steps served."""
    served = np.array([s[2] for s in samples.scraped]) / 1e6  # million request-steps
    mb = np.array([s[1] for s in samples.rss])
    last_third = mb[len(mb) * 2 // 3 :]
    half = len(mb) // 2
    slope = floor_slope(mb[half:], served[half:])
    assert last_third.max() <= RSS_LIMIT_MB, (last_third.max(), mb)
    assert slope < max_mb_per_million, (slope, mb.tolist(), served.tolist())
    return float(last_third.max()), slope


def test_floor_slope_sees_a_leak_under_flush_spikes_and_not_the_spikes():
    """The verdict's arithmetic on made-up traces: flushes every five samples (+40 to
    +80 MB for two samples) over a flat floor, and the same over a floor that leaks."""
    served = np.linspace(0.5, 1.0, 26)
    spikes = np.zeros(26)
    for phase in range(5):
        spikes[:] = 0
        spikes[phase::5] = 80
        spikes[(phase + 1) % 5 :: 5] = 40
        assert abs(floor_slope(210 + spikes, served)) < 1e-9
        leaking = 210 + 300 * (served - served[0]) + spikes
        assert floor_slope(leaking, served) > 150


def check_eviction(samples: Samples, concurrency: int, steps_per_level: int) -> tuple[float, list]:
    """Open walks stay within a bound while `concurrency` requests run (finished requests'
    state is freed as their slots are reused), and once the sweep drops to one request the
    finished requests' walks are gone after the idle timeout. Returns the largest number of
    open walks and, per idle phase sampled, (open walks before the timeout, after)."""
    cycle = 2 * steps_per_level
    busy, idle_before, idle_after = [], {}, {}
    for _, steps, _, pending in samples.scraped:
        k, pos = divmod(steps, cycle)
        if pos < steps_per_level:
            busy.append(pending)
        elif pos < steps_per_level + IDLE_STEPS:
            idle_before.setdefault(k, []).append(pending)
        elif pos >= steps_per_level + EVICTED_AFTER:
            idle_after.setdefault(k, []).append(pending)
    assert busy and idle_after, "no sample after the idle timeout: raise steps_per_level"
    # each of `concurrency` requests opens at most one walk a step; a walk settles at the
    # first walk after its tail is revealed, so a few walk intervals' worth stay open
    assert max(busy) <= concurrency * 2 * WALK_EVERY, max(busy)
    phases = []
    for k, after in idle_after.items():
        assert max(after) <= PENDING_AT_ONE, (k, after)
        phases.append((max(idle_before.get(k, [0])), max(after)))
    return max(busy), phases


def report(name: str, samples: Samples, peak: float, slope: float, busy: float, phases) -> str:
    m = samples.manifest
    t_end = samples.scraped[-1][0]
    rows = samples.scraped[-1][2]
    line = (
        f"{name}: {m['request_steps']:,} request-steps, {m['steps']:,} steps, "
        f"{m['requests_finished']:,} requests finished in {t_end:.0f} s "
        f"({rows / t_end:,.0f} request-steps/s); RSS first {samples.rss[0][1]:.0f} MB, "
        f"max {max(r for _, r in samples.rss):.0f} MB, last-third max {peak:.0f} MB, "
        f"last-half slope {slope:+.2f} MB per million request-steps; "
        f"open walks max {busy:.0f}, idle phases "
        f"(before, after the timeout) {phases}; store {m['store_mb']:.0f} MB"
    )
    print("\n" + line)
    return line


@pytest.mark.slow
def test_rss_plateaus_and_finished_requests_are_freed(tmp_path):
    samples = soak(
        tmp_path,
        concurrency="256",
        steps_per_level=10**6,
        request_steps=int(os.environ.get("DSPARK_SOAK_QUICK_REQUEST_STEPS", "1000000")),
        timeout=1800,  # a bound on a hung child, far above any machine's pace
        every=1.0,
    )
    # the warm-up's tail still shows in a million request-steps (docs/reliability.md)
    peak, slope = check_plateau(samples, max_mb_per_million=150.0)
    pending = np.array([s[3] for s in samples.scraped])
    # slots are reused as requests finish: open walks stay a few walk intervals' worth
    assert pending.max() <= 256 * 2 * WALK_EVERY, pending.max()
    third = len(pending) // 3
    assert pending[2 * third :].max() <= 2 * pending[: 2 * third].max() + 64, pending
    report("soak (quick)", samples, peak, slope, pending.max(), [])
    # every step reached the store, and the requests were many
    assert samples.manifest["steps"] >= samples.scraped[-1][1]
    assert samples.manifest["requests_finished"] >= 20_000


def test_idle_requests_are_freed_after_the_timeout():
    """The walker frees a request that stops appearing (no slot reuse tells it the request
    ended) once it has been idle `idle_steps`; here with a short timeout, in process."""
    idle = 64
    level = 48
    runtime = DSparkRuntime(
        RuntimeConfig(
            seed=3, concurrency=[level, 1], steps_per_level=400, max_new_tokens=MAX_NEW_TOKENS
        )
    )
    walker = TailWalker(runtime.gamma, idle_steps=idle, walk_every=WALK_EVERY)
    trace = []  # (step, open walks, open walks of requests not in the step, settled chunks)
    for batch in runtime.run():
        walker.step(batch, np.zeros(batch.num_reqs, dtype=np.int64), None, None)
        stale = set(walker.blk_rid[walker.blk_live]) - set(batch.rid)
        trace.append((batch.forward_ct, walker.pending(), len(stale), len(walker.settled)))
    trace = np.array(trace)
    busy = trace[trace[:, 0] < 400]
    drained = trace[trace[:, 0] >= 400 + MAX_NEW_TOKENS + idle + 2 * WALK_EVERY]
    waiting = trace[(trace[:, 0] >= 400 + MAX_NEW_TOKENS) & (trace[:, 0] < 400 + idle)]
    # the only per-request state is an open walk: at most gamma per running request
    assert busy[:, 1].max() <= level * runtime.gamma, busy[:, 1].max()
    # settled blocks wait at most one walk interval to be emitted (at most three chunks a
    # step: walks censored, walks resolved, new blocks resolved at once)
    assert trace[:, 3].max() <= 3 * WALK_EVERY, trace[:, 3].max()
    # after the drop to one request: a walk of a request that stopped in another slot
    # lingers (nothing reuses its slot) until the timeout...
    assert waiting[:, 2].min() > 0, waiting
    # ...then only the running request's walks are left
    assert drained[:, 2].max() == 0 and drained[:, 1].max() <= PENDING_AT_ONE, drained
    print(
        f"\nidle eviction: {level} -> 1 requests, idle_steps={idle}: walks of stopped "
        f"requests {int(waiting[:, 2].min())}..{int(waiting[:, 2].max())} before the timeout, "
        f"{int(drained[:, 2].max())} after"
    )


def check_store_bounds(samples: Samples, bound_gb: float, served_steps: float) -> float:
    """The store stays under its bound (one open segment a rank beside it, an eighth of the
    bound, and a flush's part being written), says what it holds, and lost no step that
    retention did not delete. Returns the most bytes it held."""
    bound = bound_gb * (1 << 30)
    most = max(d[2] for d in samples.disk)
    # beside the bound: the segment being written, which closes at an eighth of the bound
    # once a part is published, so it may hold an eighth and one part more
    part = samples.manifest["largest_part"]
    assert most <= bound + bound / 8 + part, (most, bound, part)
    # what it publishes is what the disk holds, but for a part published, or an hour
    # deleted, between the scrape and the count that follows it
    for _, said, on_disk in samples.disk:
        assert abs(said - on_disk) <= 2 * part + (1 << 20), (said, on_disk)
    m = samples.manifest
    assert m["deleted_steps"] > 0, "retention never ran: raise request_steps"
    assert m["steps"] + m["deleted_steps"] >= served_steps, (m, served_steps)
    return most


@pytest.mark.slow
def test_a_store_stays_within_its_bound_and_loses_nothing_uncounted(tmp_path):
    """The production store under the quick soak's traffic with a 48 MiB bound: disk within
    it, memory flat, every step stored or counted as deleted by retention."""
    bound_gb = 48 / 1024
    samples = soak(
        tmp_path,
        concurrency="256",
        steps_per_level=10**6,
        request_steps=int(os.environ.get("DSPARK_SOAK_STORE_REQUEST_STEPS", "600000")),
        timeout=1800,
        every=1.0,
        store_gb=bound_gb,
    )
    most = check_store_bounds(samples, bound_gb, samples.scraped[-1][1])
    peak, slope = check_plateau(samples, max_mb_per_million=150.0)
    print(
        f"\nstore soak (quick): {samples.scraped[-1][2]:,.0f} request-steps, store at most "
        f"{most / 2**20:.1f} MiB of a {bound_gb * 1024:.0f} MiB bound, "
        f"{samples.manifest['deleted_steps']:,.0f} steps deleted by retention; RSS last-third "
        f"max {peak:.0f} MB, slope {slope:+.1f} MB per million request-steps"
    )


@pytest.mark.soak
def test_a_store_soak_of_ten_million_request_steps(tmp_path):
    bound_gb = 0.25
    samples = soak(tmp_path, concurrency="256", steps_per_level=10**6,
                   request_steps=10_000_000, timeout=3 * 3600, every=2.0,
                   store_gb=bound_gb)  # fmt: skip
    most = check_store_bounds(samples, bound_gb, samples.scraped[-1][1])
    peak, slope = check_plateau(samples, max_mb_per_million=2.0)
    print(
        f"\nstore soak (long): {samples.scraped[-1][2]:,.0f} request-steps, store at most "
        f"{most / 2**20:.1f} MiB of a {bound_gb * 1024:.0f} MiB bound, "
        f"{samples.manifest['deleted_steps']:,.0f} steps deleted by retention; RSS last-third "
        f"max {peak:.0f} MB, slope {slope:+.2f} MB per million request-steps"
    )


@pytest.mark.soak
def test_soak_twenty_million_request_steps(tmp_path):
    steps_per_level = 6000
    samples = soak(
        tmp_path,
        concurrency="256,1",
        steps_per_level=steps_per_level,
        request_steps=20_000_000,
        timeout=3 * 3600,
        every=2.0,
    )
    record = os.environ.get("DSPARK_SOAK_RECORD")
    if record:  # keep the curves for the docs, whatever the verdict
        Path(record).write_text(
            json.dumps(
                {"manifest": samples.manifest, "rss": samples.rss, "scraped": samples.scraped}
            )
            + "\n"
        )
    assert samples.manifest["request_steps"] >= 20_000_000
    assert samples.manifest["requests_finished"] >= 1_000_000
    peak, slope = check_plateau(samples, max_mb_per_million=2.0)
    busy, phases = check_eviction(samples, 256, steps_per_level)
    report("soak (long)", samples, peak, slope, busy, phases)


@pytest.mark.slow
def test_workload_labels_are_capped_with_ten_thousand_names(tmp_path):
    cap = 16
    names = ",".join(f"w{i}={1 + i % 5}" for i in range(10_000))
    child = runtime_serve(
        tmp_path,
        "--concurrency",
        "256",
        "--max-new-tokens",
        "16",
        "--workloads",
        names,
        "--workload-cap",
        str(cap),
    )
    with child:
        url = child.url()
        deadline = time.monotonic() + 600  # generous: a loaded machine only makes it slower
        while True:  # until the traffic has shown thousands of names
            text = scrape(url)
            if sample_sum(text, "dspark_request_steps_total") >= 60_000:
                break
            assert time.monotonic() < deadline, child.describe()
            time.sleep(0.5)
        assert child.stop(signal.SIGTERM) == 0, child.describe()
    stored = (
        pl.scan_parquet(str(tmp_path / "run" / "requests" / "*.parquet"))
        .select(pl.col("workload").unique())
        .collect()["workload"]
        .to_list()
    )
    seen_names = len(stored)
    assert seen_names >= 5_000, seen_names
    assert "other" not in stored  # the store keeps every name; only the labels are capped
    label = re.compile(r'workload="([^"]*)"')
    families: dict[str, set[str]] = {}
    series: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#") or 'workload="' not in line:
            continue
        family = re.split(r"[{ ]", line, maxsplit=1)[0]
        families.setdefault(family, set()).add(label.search(line).group(1))
        if family == "dspark_request_steps_total":
            series[line.split(" ")[0]] = 1
    assert families, "no workload-labelled series"
    widest = max(len(v) for v in families.values())
    assert widest == cap + 1, {f: len(v) for f, v in families.items()}
    assert all("other" in v for v in families.values())
    # one series per (workload, mode, rank): the cap plus `other`
    assert len(series) == cap + 1, sorted(series)
    overflow = sample_sum(text, "dspark_workload_overflow_total")
    total = sample_sum(text, "dspark_request_steps_total")
    other = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dspark_request_steps_total{") and 'workload="other"' in line
    )
    assert overflow == other > 0.9 * total, (overflow, other, total)
    print(
        f"\nlabel cap: {seen_names:,} workload names in the traffic, {widest} workload values "
        f"per family (cap {cap} + other), {len(series)} dspark_request_steps_total series, "
        f"{overflow:,.0f} of {total:,.0f} request-steps under other"
    )

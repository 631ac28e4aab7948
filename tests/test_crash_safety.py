"""Crash safety: `serve` and `run` killed at random moments leave a readable, honest run.

The run store publishes a part per flush by atomic rename, so SIGKILL (the OOM
killer, a power cut, `kill -9`) may cost what was buffered since the last part
and nothing else. Each repeat (two at a time; ten by default, twenty in the long form,
`-m long`) starts a real child writing a run directory and kills it with SIGKILL at a
seeded random moment: a quarter to a third of the repeats a random delay after the
process starts (often before it has created anything), the others a random delay after
its first few parts are published (often mid-flush). Which repeats have published parts
when killed is thus fixed by the seed, not by how fast the machine is. Each kill then checks:

- every published part of every table reads (`scan`), `Run.batches()` gives the
  stored steps and their request rows back, step keys are unique, and the
  stored steps are a gap-free prefix of what the child produced;
- the loss is at most one flush interval: `serve` (flushing every N steps) had
  served at most N steps more than it stored, per the last `dspark_steps_total`
  scraped before the kill; `run` (flushing every S seconds) published its last
  part at most S seconds plus one flush before the kill, a flush taking at most
  as long as the longest gap between the parts this run published (a loaded
  machine stretches both alike; tests/test_store.py holds the interval itself
  to S on a controlled clock);
- the manifest says `complete: false`;
- starting the same command into the same directory is refused with one line and
  exit status 2 and leaves the directory byte for byte as it was, or, when the
  child died before writing `run.json`, starts afresh into it.

SIGTERM and Ctrl-C, by contrast, flush and close: exit 0, `complete: true`, every
step served stored, even with a flush interval longer than the run.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from bench.serve_child import serve_args
from dspark_obs.store import open_run

from .test_serve_cli import Child, run_cli, sample_sum, scrape

SEED = 20251130
#: Repeats per command, and of those how many are killed a random delay after the start
#: (the rest after published parts): the default form, and the long one (`-m long`).
SHORT = {"serve": 6, "run": 4}, {"serve": 2, "run": 1}
LONG = {"serve": 12, "run": 8}, {"serve": 3, "run": 2}
SERVE_FLUSH_STEPS = (16, 40)  # drawn per repeat
RUN_FLUSH_SECONDS = 0.4
#: What a flush in progress may add to `run`'s bound at least: writing one part of
#: RUN_FLUSH_SECONDS worth of steps, on a busy two-core machine.
FLUSH_SLACK_SECONDS = 1.5
#: Generous: a child on a loaded machine may take long to start or to publish its parts.
WAIT_SECONDS = 120.0

RUNTIME = ["--sts", "none", "--concurrency", "32", "--max-new-tokens", "64"]


def _args(command: str, out: Path, seed: int, flush_steps: int, flush_seconds: float) -> list[str]:
    """`serve` (the runtime, unpaced) or `run` (steps enough to outlast any kill) into `out`."""
    if command == "serve":
        head = serve_args("runtime", speed=0)
    else:
        head = ["run", "--steps-per-level", "1000000", "--quiet"]
    return [
        *head,
        *RUNTIME,
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--flush-steps",
        str(flush_steps),
        "--flush-seconds",
        str(flush_seconds),
    ]


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def check_readable(run_dir: Path) -> tuple[int, int]:
    """Everything published reads back consistently; (steps, request rows) stored."""
    run = open_run(run_dir)
    frames = {table: run.scan(table).collect() for table in run.tables()}
    if "steps" not in frames:
        # killed before the first flush: nothing else may have been published either
        assert frames == {}, list(frames)
        return 0, 0
    steps, reqs = frames["steps"], frames.get("requests", pl.DataFrame())
    # one rank, counting from 0: the stored steps are exactly the first n, each once
    fct = steps["forward_ct"].to_numpy()
    assert steps.select(pl.struct("rank", "forward_ct").is_unique().all()).item()
    assert (np.sort(fct) == np.arange(len(fct))).all(), fct
    per_step = reqs.group_by("forward_ct").len()
    joined = steps.join(per_step, on="forward_ct", how="left").fill_null(0)
    assert (joined["len"] == joined["bs"]).all()
    batches = list(run.batches())
    assert [b.forward_ct for b in batches] == fct.tolist()
    assert sum(b.num_reqs for b in batches) == reqs.height == steps["bs"].sum()
    # extra tables are published after their flush's steps: none outlives a killed flush
    step_parts = {p.name for p in run.parts("steps")}
    for table in frames:
        assert {p.name for p in run.parts(table)} <= step_parts, table
    if "ceilings" in frames:
        assert frames["ceilings"]["forward_ct"].max() < len(fct)
    # no temporary file is ever mistaken for a part
    assert not any(p.name.endswith(".tmp") for t in frames for p in run.parts(t))
    return steps.height, reqs.height


def check_restart(args: list[str], run_dir: Path, cwd: Path, command: str) -> str:
    """The same command into the killed run's directory; what it did ('refused' / 'fresh')."""
    if not (run_dir / "run.json").exists():
        # died before the writer began: the directory holds no run, so a restart begins one
        assert not list(run_dir.rglob("*.parquet")) if run_dir.exists() else True
        with Child(*args, workdir=cwd) as child:
            if command == "serve":
                child.url()
            else:
                assert _started(run_dir), child.describe()
            rc = child.stop(signal.SIGTERM)
        assert rc == 0, child.describe()
        assert json.loads((run_dir / "run.json").read_text())["complete"] is True
        check_readable(run_dir)
        return "fresh"
    before = _snapshot(run_dir)
    proc = run_cli(*args, cwd=cwd)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"dspark-obs {command}: error: {run_dir} already holds a run (incomplete: its writer "
        "was stopped before closing it); choose another --out\n"
    ), proc.stderr
    assert "serving" not in proc.stdout
    assert _snapshot(run_dir) == before
    return "refused"


def _published(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "steps").glob("part-*.parquet"))


def _publication_gaps(run_dir: Path) -> list[float]:
    """Seconds between consecutive publications (`run.json`, then each steps part)."""
    times = [p.stat().st_mtime for p in [run_dir / "run.json", *_published(run_dir)]]
    return [b - a for a, b in itertools.pairwise(times)]


def _started(run_dir: Path, timeout: float = WAIT_SECONDS) -> bool:
    deadline = time.monotonic() + timeout
    while not (run_dir / "run.json").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@dataclass(frozen=True)
class Kill:
    """One repeat: which command, its flush interval, and when it is killed."""

    i: int
    command: str
    flush_steps: int
    flush_seconds: float
    moment: str  # "early": a delay after the start; "": a delay after `parts` parts
    parts: int
    delay: float


def _kills(rng: random.Random, kills: dict[str, int], early_kills: dict[str, int]) -> list[Kill]:
    """Every repeat's plan, drawn from the seed before any runs, so that which repeats are
    killed when does not depend on the order or the pace in which they run."""
    early = {c: rng.sample(range(n), early_kills[c]) for c, n in kills.items()}
    plans = []
    for i in range(sum(kills.values())):
        command = "serve" if i < kills["serve"] else "run"
        if command == "serve":
            flush_steps, flush_seconds = rng.choice(SERVE_FLUSH_STEPS), 3600.0
        else:
            flush_steps, flush_seconds = 1_000_000, RUN_FLUSH_SECONDS
        # early: a delay from the start of the process, which often lands before anything
        # exists; otherwise a delay after the first `parts` parts, often mid-flush
        moment = "early" if i - (command == "run") * kills["serve"] in early[command] else ""
        parts = 0 if moment else rng.randint(1, 3)
        delay = rng.uniform(0.0, 1.5) if moment else rng.uniform(0.0, 0.6)
        plans.append(Kill(i, command, flush_steps, flush_seconds, moment, parts, delay))
    return plans


def _kill_and_check(plan: Kill, tmp_path: Path) -> tuple:
    """Start the plan's child, SIGKILL it at its moment, check what it left and a restart."""
    command, flush_steps, flush_seconds = plan.command, plan.flush_steps, plan.flush_seconds
    out = tmp_path / f"{command}{plan.i}"
    cwd = tmp_path / f"cwd{plan.i}"
    args = _args(command, out, plan.i, flush_steps, flush_seconds)
    seen = None  # the last dspark_steps_total scraped (serve)
    with Child(*args, workdir=cwd) as child:
        waited = time.monotonic() + WAIT_SECONDS
        while len(_published(out)) < plan.parts:
            assert child.proc.poll() is None and time.monotonic() < waited, child.describe()
            seen = _scrape_steps(child, command, seen)
            time.sleep(0.01)
        deadline = time.monotonic() + plan.delay
        while time.monotonic() < deadline:
            seen = _scrape_steps(child, command, seen)
            time.sleep(0.01)
        killed_at = time.time()
        child.proc.send_signal(signal.SIGKILL)
        assert child.proc.wait(10) == -signal.SIGKILL, child.describe()

    behind = None  # run: seconds between the last published part and the kill
    if not (out / "run.json").exists():
        stored = rows = 0
        assert seen is None or seen == 0
    else:
        manifest = json.loads((out / "run.json").read_text())
        assert manifest["complete"] is False
        stored, rows = check_readable(out)
        if command == "serve" and seen is not None:
            # everything served up to the last scrape, but one flush interval, is stored
            assert seen - stored <= flush_steps, (seen, stored, flush_steps)
        if command == "run":
            published = _published(out)
            last = (published[-1] if published else out / "run.json").stat().st_mtime
            behind = killed_at - last
            flush = max([FLUSH_SLACK_SECONDS, *_publication_gaps(out)])
            assert behind <= flush_seconds + flush, (behind, flush, len(published))
    restart = check_restart(args, out, cwd, command)
    when = plan.moment or f"after {plan.parts} parts"
    return (command, when, round(plan.delay, 2), flush_steps, seen, stored, rows, restart, behind)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kills", "early_kills"),
    [pytest.param(*SHORT, id="short"), pytest.param(*LONG, id="long", marks=pytest.mark.long)],
)
def test_sigkill_at_random_moments_loses_at_most_one_flush_interval(tmp_path, kills, early_kills):
    # Two repeats at a time: each is mostly a child starting up or waiting on its parts, and
    # every bound above holds whatever else the machine runs (the serve bound counts steps,
    # the run bound stretches with the run's own gaps between parts).
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(
            pool.map(
                lambda plan: _kill_and_check(plan, tmp_path),
                _kills(random.Random(SEED), kills, early_kills),
            )
        )

    lost = [o[4] - o[5] for o in outcomes if o[0] == "serve" and o[4] is not None]
    behind = [o[8] for o in outcomes if o[8] is not None]
    kills = {c: sum(o[0] == c for o in outcomes) for c in ("serve", "run")}
    restarts = {r: sum(o[7] == r for o in outcomes) for r in ("refused", "fresh")}
    print(
        f"\ncrash safety: {len(outcomes)} SIGKILLs ({kills['serve']} serve, {kills['run']} run); "
        f"{sum(o[5] > 0 for o in outcomes)} left published parts, all readable; "
        f"steps stored {sum(o[5] for o in outcomes):,}, "
        f"request rows {sum(o[6] for o in outcomes):,}; "
        f"serve loss vs last scrape max {max(lost, default=0):.0f} steps "
        f"(bound {max(SERVE_FLUSH_STEPS)}); run's last part before the kill max "
        f"{max(behind, default=0):.2f} s (flush every {RUN_FLUSH_SECONDS} s); "
        f"restarts refused {restarts['refused']}, "
        f"fresh {restarts['fresh']}"
    )
    for o in outcomes:
        print("  ", o)
    # every kill after published parts found them whole: both commands, most repeats
    for command, n in kills.items():
        parted = [o for o in outcomes if o[0] == command and o[1] != "early"]
        assert len(parted) == n - early_kills[command] >= n // 2
        assert all(o[5] > 0 for o in parted), parted


def _cpu_seconds(pid: int) -> float:
    """CPU seconds a process has used (Linux `/proc`): work done, whatever the machine's load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _work(child: Child, seconds: float) -> None:
    """Wait until `child` has used `seconds` more CPU time."""
    until = _cpu_seconds(child.proc.pid) + seconds
    deadline = time.monotonic() + WAIT_SECONDS
    while _cpu_seconds(child.proc.pid) < until:
        assert child.proc.poll() is None and time.monotonic() < deadline, child.describe()
        time.sleep(0.05)


def _scrape_steps(child: Child, command: str, seen: float | None) -> float | None:
    """`serve`'s `dspark_steps_total` once it serves (else `seen` unchanged)."""
    if command != "serve" or "serving" not in child.stdout:
        return seen
    return sample_sum(scrape(child.url()), "dspark_steps_total")


@pytest.mark.parametrize("command", ["serve", "run"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_flush_and_close(tmp_path, command, sig):
    out = tmp_path / "run"
    # a flush interval longer than the run: only the closing flush can store anything
    args = _args(command, out, 7, 1_000_000, 3600.0)
    with Child(*args, workdir=tmp_path / "cwd") as child:
        seen = 0.0
        if command == "serve":
            url = child.url()
            deadline = time.monotonic() + WAIT_SECONDS
            while (seen := sample_sum(scrape(url), "dspark_steps_total")) < 50:
                assert time.monotonic() < deadline, child.describe()
                time.sleep(0.05)
        else:
            assert _started(out), child.describe()
            _work(child, 1.0)  # steps made, however busy the machine
        assert not list(out.glob("steps/part-*.parquet"))  # nothing flushed before the signal
        rc = child.stop(sig)
    assert rc == 0, child.describe()
    assert "Traceback" not in child.stderr
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["complete"] is True
    stored, rows = check_readable(out)
    assert stored == manifest["steps"] >= max(seen, 1)
    assert rows == manifest["request_steps"] > 0
    if command == "run":
        assert manifest["interrupted"] is True
        assert f"interrupted: {stored:,} steps stored in {out}" in child.stderr
    else:
        assert f"stopped: {stored:,} steps ingested, 0 rejected" in child.stderr
        assert manifest["requests_arrived"] >= manifest["requests_finished"] > 0

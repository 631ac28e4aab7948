"""The production record: a store's time range answers as the same steps recorded as one run.

One reference run (compact, a cap-accept shadow) goes through two pipelines: one writing a
run directory, one a production store whose clock puts the steps across three UTC hours.
The post-hoc commands, as a user runs them (subprocesses, `--json`), then give the same
answers on the store as on the run; and on a range that cuts two hours, the same as on a
run directory written from exactly the steps (and estimator rows) the range holds.
Retention deletes whole closed hours, by age and by size, and counts what it deleted;
`--sample-requests` keeps requests whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dspark_obs.pipeline import build_pipeline
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.store import RunWriter, open_run
from dspark_obs.store.production import PARTITION_SECONDS, ProductionStore, Retention
from tests.conftest import cli
from tests.golden_outputs import json_differences

#: the first step's time: half past an hour, so the steps span three hours
T0 = 1_796_000_400.0 + 1800
#: seconds between steps
DT = 4.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record(root: Path) -> tuple[Path, Path, list[float]]:
    config = RuntimeConfig(mode="compact", shadow="cap-accept", concurrency=[6, 24],
                           steps_per_level=700, seed=7)  # fmt: skip
    runtime = DSparkRuntime(config)
    manifest = {"format": 1, "source": "runtime", "gamma": config.gamma, "mode": config.mode,
                "world": config.world, "cost_table": config.manifest()["cost_table"]}  # fmt: skip
    clock = Clock()
    run = build_pipeline(config.gamma, writer=RunWriter(root / "run", manifest))
    unbounded = Retention(None, None)
    writer = ProductionStore(root / "store", manifest, node="n1", clock=clock, retention=unbounded)
    store = build_pipeline(config.gamma, writer=writer)
    times = []
    for batch in runtime.run():
        for pipeline in (run, store):
            pipeline.ingest(batch, gather=runtime.gather_target_logprobs)
        times.append(clock.now)
        clock.now += DT
    run.close()
    store.close()
    return root / "run", root / "store", times


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record(tmp_path_factory.mktemp("production"))


def answers(*args: str) -> dict:
    out = {}
    for command in ("summary", "calibration", "estimate", "whatif"):
        data = json.loads(cli(command, *args, "--json").stdout)
        out[command] = _without_paths(data)
    return out


def _without_paths(value):
    """The answers without the file paths they name (the store's view is another path)."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if k not in ("run", "path")}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


def test_the_store_holds_the_steps_by_rank_and_hour(recorded):
    run_dir, store, times = recorded
    hours = sorted((store / "node=n1" / "rank=0").iterdir())
    assert len(hours) == 3 and {int(t // PARTITION_SECONDS) for t in times}.__len__() == 3
    total = 0
    for hour in hours:
        run = open_run(hour)
        assert run.complete and run.manifest["node"] == "n1" and run.manifest["rank"] == 0
        steps = run.steps().collect()
        lo = int(steps["time"].min() // PARTITION_SECONDS)
        assert lo == int(steps["time"].max() // PARTITION_SECONDS)  # one hour a partition
        total += steps.height
    assert total == open_run(run_dir).manifest["steps"]


def same_answers(got: dict, want: dict) -> list[str]:
    """Where two commands' answers differ beyond the last bits of a float (polars sums a
    run's parts in another order than a view's: the golden outputs' rule, 1e-9 relative)."""
    return json_differences(got, want)


def test_a_store_answers_as_the_same_steps_recorded_as_one_run(recorded):
    run_dir, store, _ = recorded
    assert not same_answers(answers(str(store)), answers(str(run_dir)))


def test_a_range_that_cuts_hours_answers_as_a_run_of_its_steps(recorded, tmp_path):
    run_dir, store, times = recorded
    start, end = times[len(times) // 5] + 1.0, times[4 * len(times) // 5] + 1.0
    # the same steps and estimator rows, written as a run directory of their own
    source = open_run(run_dir)
    steps = source.steps().collect()
    kept = np.array(times)[(np.array(times) >= start) & (np.array(times) < end)]
    assert 0 < len(kept) < len(times)
    keys = (
        steps.with_row_index()
        .filter(pl.col("index").is_between(times.index(kept[0]), times.index(kept[-1])))
        .select("rank", "forward_ct")
    )
    batches = [
        b for b in source.batches()
        if keys.filter((pl.col("rank") == b.rank) & (pl.col("forward_ct") == b.forward_ct)).height
    ]  # fmt: skip
    # an estimator row belongs to the step that opened its block
    ceilings = source.scan("ceilings").collect().join(keys, on=["rank", "forward_ct"], how="semi")
    with RunWriter(tmp_path / "cut", source.manifest) as writer:
        for b in batches:
            writer.append(b)
        writer.write_rows("ceilings", ceilings)
    between = ("--between", str(start), str(end))
    assert not same_answers(answers(str(store), *between), answers(str(tmp_path / "cut")))


def test_retention_deletes_whole_old_hours_and_counts_them(tmp_path):
    clock = Clock()
    config = RuntimeConfig(mode="compact", concurrency=[4], steps_per_level=300, seed=1)
    manifest = {"format": 1, "gamma": config.gamma}
    store = ProductionStore(tmp_path / "s", manifest, node="n", clock=clock,
                            retention=Retention(max_age_hours=1.0, max_bytes=None))  # fmt: skip
    for batch in DSparkRuntime(config).run():
        store.append(batch)
        clock.now += 30.0  # 300 steps: 2.5 hours
    hours = sorted(p.name for p in (tmp_path / "s" / "node=n" / "rank=0").iterdir())
    snap = store.snapshot().series
    # at the end (T0 + 9000 s) an hour that ended before now - 1 h is gone: the first
    assert len(hours) == 2 and snap.deleted_hours == 1
    assert snap.deleted_steps == 60  # its 60 steps, 30 s apart over its last 30 minutes
    store.close()
    # by size: over the bound, the oldest closed hours go until within it
    small = ProductionStore(tmp_path / "s", manifest, node="n", clock=clock,
                            retention=Retention(None, max_bytes=1))  # fmt: skip
    small.apply_retention()
    assert not any((tmp_path / "s" / "node=n" / "rank=0").iterdir())
    assert small.snapshot().series.deleted_steps == 300 - 60


def test_a_sample_keeps_requests_whole(tmp_path):
    config = RuntimeConfig(mode="compact", concurrency=[16], steps_per_level=120, seed=2)
    store = ProductionStore(tmp_path / "s", {"format": 1, "gamma": config.gamma}, node="n",
                            sample_requests=0.5, clock=Clock())  # fmt: skip
    seen: dict[str, int] = {}
    for batch in DSparkRuntime(config).run():
        for rid in batch.rid:
            seen[rid] = seen.get(rid, 0) + 1
        store.append(batch)
    store.close()
    (hour,) = (tmp_path / "s" / "node=n" / "rank=0").iterdir()
    rows = open_run(hour).requests().collect()
    kept = rows.group_by("rid").len()
    assert 0.3 < kept.height / len(seen) < 0.7
    for rid, n in kept.iter_rows():
        assert n == seen[rid]  # every step of a kept request
    steps = open_run(hour).steps().collect()
    assert steps.height == 120 and steps["bs"].sum() > rows.height  # steps keep their bs

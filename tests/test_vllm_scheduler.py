"""The reference runtime under `--scheduler topk`: every compact step's windows and budget
are vLLM 0.33.0's rule (`scheduler.topk_schedule`, held to vLLM's own code in
tests/test_vllm_topk.py) applied to that step's survivals, with the budget planned on each
request's survivals of the step before (1 for a request that was not in the batch then),
recomputed here from the recorded steps alone; `run --scheduler topk` records it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.factory import make_runtime
from dspark_obs.runtime.scheduler import schedule, topk_schedule


def test_every_step_is_vllms_rule_on_last_steps_survivals():
    config = RuntimeConfig(seed=4, scheduler="topk", concurrency=[6, 40], steps_per_level=60)
    runtime = make_runtime(config)
    last: dict = {}
    steps = differs = 0
    for batch in runtime.run():
        if batch.bs <= 0:
            continue
        assert batch.lag_steps == 1
        previous = last if batch.forward_ct - 1 == last.get("_ct") else {}
        stale = np.stack([previous.get(r, np.ones(config.gamma)) for r in batch.rid.tolist()])
        plan = topk_schedule(batch.survival, config.cost_table, stale)
        np.testing.assert_array_equal(batch.window, plan.windows)
        assert batch.budget == plan.budget
        differs += schedule(batch.survival, config.cost_table).budget != plan.budget
        last = dict(zip(batch.rid.tolist(), batch.survival, strict=True))
        last["_ct"] = batch.forward_ct
        steps += 1
    assert steps == 120 and differs > 0  # the lag changes budgets: the rule is not SPS's


def test_the_scheduler_option_is_checked():
    with pytest.raises(ValueError, match="sps or topk"):
        RuntimeConfig(scheduler="fifo").validate()
    with pytest.raises(ValueError, match="takes none"):
        RuntimeConfig(scheduler="topk", budget_scale=0.5).validate()


def test_run_records_topk_steps(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dspark_obs", "run", "--scheduler", "topk",
           "--concurrency", "4", "--steps-per-level", "20", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    from dspark_obs.store import open_run

    steps = open_run(out).steps().collect()
    assert steps.height == 20 and set(steps["lag_steps"].to_list()) == {1}
    bad = subprocess.run([*cmd[:5], "fifo"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'fifo'" in bad.stderr

"""What-if on a world that retracts requests and plans its budget on relayed confidence.

One small compact run of the `unstable-slots` world (confidence relayed two steps, requests
retracted and re-admitted into another slot) is recorded once per module in process.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dspark_obs.recording import record_reference_run
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.store import open_run
from dspark_obs.whatif.frame_loader import load_run_frame
from dspark_obs.whatif.policies import parse_policy, policy_windows
from dspark_obs.whatif.predict import whatif
from dspark_obs.whatif.relay import relay_rows, relayed
from dspark_obs.whatif.study_truth import measured_cells

STS = [1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("relay") / "compact"
    config = RuntimeConfig(seed=3, world="unstable-slots", shadow="cap-accept",
                           concurrency=[1, 12], level_steps=[150, 60], max_new_tokens=200,
                           sts_temperatures=STS)  # fmt: skip
    record_reference_run(config, out, None)
    return open_run(out)


def _walk(keys, recorded, step, rid, pool, lag) -> np.ndarray:
    """The relay's rule request-step by request-step, over dictionaries."""
    at = {(int(key), int(r)): i for i, (key, r) in enumerate(zip(keys[step], rid, strict=True))}
    out = []
    for i in range(len(step)):
        d_max, key, r = int(lag[step[i]]), int(keys[step[i]]), int(rid[i])
        if d_max == 0:
            out.append(i)
            continue
        if any(key - d not in recorded and (key - d) % (1 << 40) < key % (1 << 40)
               for d in range(1, d_max + 1)):  # fmt: skip
            out.append(i)
            continue
        same = [at.get((key - d, r)) for d in range(1, d_max + 1)]
        ok = all(j is not None and (pool[i] < 0 or pool[j] == pool[i]) for j in same)
        out.append(same[-1] if ok else -1)
    return np.array(out)


def test_relay_rows_follow_the_request_and_its_slot():
    rng = np.random.default_rng(0)
    keys = np.arange(40) + (1 << 40)  # rank 1, forward_ct 0..39
    recorded = set(keys.tolist()) - {(1 << 40) + 17}  # step 17 missing from the records
    recorded.add((1 << 40) + 41)  # an empty step (held, no rows)
    keys = np.array(sorted(k for k in keys.tolist() if k in recorded))
    step, rid, pool = [], [], []
    for s in range(len(keys)):
        members = rng.choice(12, size=rng.integers(1, 8), replace=False)
        step += [s] * len(members)
        rid += members.tolist()
        pool += (members + 20 * (rng.random(len(members)) < 0.1)).tolist()  # some move slot
    step, rid, pool = np.array(step), np.array(rid), np.array(pool)
    lag = np.where(np.arange(len(keys)) % 5 == 0, 1, 2)
    want = _walk(keys, recorded, step, rid, pool, lag)
    sorted_recorded = np.array(sorted(recorded))
    got = relay_rows(keys, sorted_recorded, step, rid, pool, [lag])[0]
    assert (got == want).all()
    assert (want == -1).any() and (want == np.arange(len(step))).any() and (want >= 0).any()
    none = np.zeros(len(keys), int)
    assert relay_rows(keys, sorted_recorded, step, rid, pool, [none]) == [None]
    # several lags in one pass (a relayed run asked for topk): each as on its own
    one = np.ones(len(keys), int)
    together = relay_rows(keys, sorted_recorded, step, rid, pool, [lag, none, one])
    assert (together[0] == want).all() and together[1] is None
    assert (together[2] == _walk(keys, recorded, step, rid, pool, one)).all()


def test_sps_replay_plans_the_budget_on_relayed_survivals(run):
    """Every window of the run is the scheduler's with the budget planned on the relayed
    survivals; planned on the current ones (as before) a share of them is not."""
    frame = load_run_frame(run, use_shadow=False, policies=[parse_policy("sps", 7)])
    assert frame.relay_row is not None and (frame.relay_row == -1).any()
    sps = parse_policy("sps", 7)
    recorded = frame.inputs.recorded_window
    args = {"recorded_window": recorded, "gamma": frame.gamma, "survival": frame.survival,
            "logits": None, "step_start": frame.step_start, "step_bs": frame.step_bs,
            "table": frame.table}  # fmt: skip
    assert (policy_windows(sps, **args, relayed=relayed(frame)) == recorded).all()
    assert (policy_windows(sps, **args) != recorded).mean() > 0.02
    report = whatif(run, ["own", "sps"], use_shadow=False)
    own = {(c["level"], c["workload"]): c for c in report["cells"] if c["policy"] == "own"}
    for c in report["cells"]:
        if c["policy"] == "sps":
            want = own[(c["level"], c["workload"])]
            assert c["mean_window"] == pytest.approx(want["mean_window"], rel=1e-12)
            assert c["tokens_per_s"] == pytest.approx(want["tokens_per_s"], rel=1e-12)


def test_levels_are_the_configured_concurrency(run):
    """Retractions make batches smaller than the concurrency; the levels stay the sweep's."""
    steps = run.steps().filter(pl.col("bs") > 0).collect()
    assert steps["bs"].n_unique() > 4 and (steps["bs"] < 12).sum() > 10
    cells = measured_cells(run)
    assert {level for level, _ in cells} == {1, 12}
    first = steps.filter(pl.col("forward_ct") < 150)
    assert cells[(1, "all")]["request_steps"] == first["bs"].sum()
    predicted = {(c["level"], c["workload"]) for c in whatif(run, ["own"])["cells"]}
    assert predicted == set(cells)

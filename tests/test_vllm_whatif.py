"""`whatif --policy topk` (vLLM 0.33.0's admission) held to real `run --scheduler topk` runs.

Per seed, one compact run (SGLang's SPS rule, with a cap-accept shadow the prediction
ignores, so it rests on the ceiling estimator alone) and a real run of the topk scheduler
with the same seed, traffic and STS. The prediction's whole-batch tokens/s at batch 64
(6,400 request-steps a run) must be within 2 % of the real run's on every one of 10 seeds,
and inside its interval; `whatif`'s topk replay on the real topk run must give that run's
own windows, every request-step (the replay is the runtime's rule, lag included).
"""

from __future__ import annotations

import dataclasses

import pytest

from dspark_obs.recording import record_reference_run
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.store import open_run
from dspark_obs.whatif.frame_loader import load_run_frame
from dspark_obs.whatif.policies import parse_policy
from dspark_obs.whatif.predict import frame_windows, whatif
from dspark_obs.whatif.study_summary import TARGET_ERROR, TARGET_SEEDS

STS = [1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4]
LEVEL = 64

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("topk")
    out = []
    for seed in range(TARGET_SEEDS):
        base = RuntimeConfig(seed=seed, shadow="cap-accept", concurrency=[LEVEL],
                             steps_per_level=100, max_new_tokens=300,
                             sts_temperatures=STS)  # fmt: skip
        record_reference_run(base, tmp / f"compact{seed}", None)
        topk = dataclasses.replace(base, scheduler="topk", shadow=None)
        record_reference_run(topk, tmp / f"topk{seed}", None)
        out.append((open_run(tmp / f"compact{seed}"), open_run(tmp / f"topk{seed}")))
    return out


def _whole(report: dict, policy: str) -> dict:
    return next(
        c for c in report["cells"]
        if c["policy"] == policy and c["workload"] == "all" and c["level"] == LEVEL
    )  # fmt: skip


def test_topk_replay_is_the_runtime_scheduler(pairs):
    topk = parse_policy("topk", 7)
    for _, run in pairs[:3]:
        frame = load_run_frame(run, policies=[topk])
        assert (frame_windows(frame, [topk])[0] == frame.inputs.recorded_window).all()


def test_topk_predicted_from_a_compact_run_holds_against_real_topk_runs(pairs):
    errors = []
    for compact, real_run in pairs:
        predicted = _whole(whatif(compact, ["topk"], use_shadow=False), "topk")
        real = _whole(whatif(real_run, ["own"]), "own")["tokens_per_s"]
        errors.append(predicted["tokens_per_s"] / real - 1)
        assert predicted["tokens_per_s_lo"] <= real <= predicted["tokens_per_s_hi"]
    assert len(errors) >= 10
    assert max(abs(e) for e in errors) <= TARGET_ERROR, errors

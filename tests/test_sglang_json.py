"""SGLang `dspark_info_record` conversion against the documented field list.

No SGLang server runs here; the payloads are SGLang 0.5.23's exact shapes: the
sample dumps shipped with the project's reference material (written with
SGLang's own record types) and records built by hand from the field list of
`DecodeStepRecord` / `ReqDetail`.
"""

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.telemetry.server_info import (
    SGLangFormatError,
    batches_to_info_record,
    info_record_to_batches,
    server_info_ranks,
)

SAMPLES = Path(__file__).parent / "data" / "sglang"
SAMPLE_FILES = ["server_info.compact.greedy.json", "server_info.compact.sampled.json"]


def _hand_record() -> dict:
    return {
        "mode": "cap-accept",
        "gamma": 3,
        "verify_num_draft_tokens": 4,
        "components": ["core", "reqs", "step_gpu_time"],
        "simulate_acc_len": None,
        "records": [
            {
                "forward_ct": 41,
                "bs": 2,
                "mode": "cap-accept",
                "budget": 3,
                "lag_steps": 2,
                "num_running_reqs": 2,
                "num_verify_tokens": 8,
                "verify_tokens_local": 5,
                "verify_tokens_graph_key": 8,
                "predicted_step_ms": 7.25,
                "predicted_theta": 410.5,
                "step_gpu_ms": 7.5,
                "reqs": [
                    {
                        "req_pool_index": 3,
                        "prefix_len": 100,
                        "verify_len": 3,
                        "acc_len": 3,
                        "correct_drafts": 2,
                        "cap_trim": 1,
                        "bonus_token": 9,
                        "draft_tokens": [4, 5, 6],
                        "rid": "a-1",
                        "confidence": [0.9, 0.8, 0.7],
                        "survival": [0.9, 0.72, 0.504],
                    },
                    {
                        "req_pool_index": 0,
                        "prefix_len": 7,
                        "verify_len": 1,
                        "acc_len": 1,
                        "correct_drafts": 0,
                        "cap_trim": 0,
                        "bonus_token": 2,
                        "draft_tokens": [1, 1, 1],
                        "rid": "b-2",
                        "confidence": [0.1, 0.5, 0.5],
                        "survival": [0.1, 0.05, 0.025],
                    },
                ],
            },
            {"forward_ct": 42, "bs": 1, "mode": "cap-accept", "verify_tokens_dp_synced": 12},
        ],
    }


@pytest.mark.parametrize("name", SAMPLE_FILES)
def test_sample_dumps_round_trip_exactly(name):
    raw = (SAMPLES / name).read_bytes()
    (info,) = server_info_ranks(raw)
    batches = info_record_to_batches(info)
    back = batches_to_info_record(
        batches,
        mode=info["mode"],
        gamma=info["gamma"],
        components=info["components"],
        simulate_acc_len=info["simulate_acc_len"],
    )
    assert back == info
    assert json.dumps(back) == json.dumps(info)  # same key order as the server writes


def test_sample_values_land_in_the_right_columns():
    (info,) = server_info_ranks((SAMPLES / SAMPLE_FILES[0]).read_bytes())
    batches = info_record_to_batches(info)
    rec = info["records"][0]
    b = batches[0]
    assert b.forward_ct == rec["forward_ct"] and b.bs == rec["bs"] and b.budget == rec["budget"]
    assert b.mode == "compact" and b.gamma == 7
    for i, r in enumerate(rec["reqs"]):
        assert b.rid[i] == r["rid"]
        assert b.window[i] == r["verify_len"] - 1
        assert b.correct_drafts[i] == r["correct_drafts"]
        assert b.acc_len[i] == r["acc_len"]
        assert b.draft_tokens[i].tolist() == r["draft_tokens"]
        assert b.confidence[i].tolist() == r["confidence"]
    assert (b.greedy == -1).all() and np.isnan(b.temperature).all()
    assert (b.ceiling == -1).all()  # compact censors the ceiling
    assert sum(x.num_reqs for x in batches) == sum(len(r["reqs"]) for r in info["records"])


def test_hand_built_record_round_trips_and_derives_ceiling():
    info = _hand_record()
    batches = info_record_to_batches(json.dumps(info), rank=3)
    first, second = batches
    assert first.rank == 3 and first.ceiling.tolist() == [3, 0]
    assert first.window.tolist() == [2, 0]
    assert second.has_reqs is False and second.num_reqs == 0
    assert second.verify_tokens_dp_synced == 12 and second.num_verify_tokens == -1
    assert second.budget is None and second.step_gpu_ms is None
    back = batches_to_info_record(
        batches, mode="cap-accept", gamma=3, components=info["components"]
    )
    assert back == info


def test_static_ceiling_is_accepted():
    info = _hand_record()
    info["mode"] = "static"
    for rec in info["records"]:
        rec["mode"] = "static"
    info["records"][0]["reqs"][0]["cap_trim"] = 0
    (b, _) = info_record_to_batches(info)
    assert b.ceiling.tolist() == b.correct_drafts.tolist()


def test_workload_rule_applies_to_rids():
    info = _hand_record()
    batches = info_record_to_batches(
        info, workload_of=lambda rids: np.array([r.split("-")[0] for r in rids], dtype=object)
    )
    assert batches[0].workload.tolist() == ["a", "b"]


def test_runtime_batches_survive_the_sglang_form():
    """What our runtime emits, SGLang's form carries exactly (for the fields SGLang has)."""
    rt = DSparkRuntime(RuntimeConfig(mode="cap-accept", concurrency=[8], steps_per_level=30))
    batches = list(rt.run())
    payload = msgspec.json.encode(
        batches_to_info_record(
            batches, mode="cap-accept", gamma=7, components=["core", "reqs", "step_gpu_time"]
        )
    )
    again = info_record_to_batches(payload)
    for a, b in zip(batches, again, strict=True):
        for name in (
            "forward_ct",
            "bs",
            "budget",
            "num_verify_tokens",
            "verify_tokens_local",
            "predicted_step_ms",
            "predicted_theta",
            "step_gpu_ms",
        ):
            assert getattr(a, name) == getattr(b, name), name
        for name in (
            "rid",
            "req_pool_index",
            "prefix_len",
            "verify_len",
            "correct_drafts",
            "acc_len",
            "cap_trim",
            "bonus_token",
            "draft_tokens",
            "confidence",
            "survival",
        ):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        np.testing.assert_array_equal(a.ceiling, b.ceiling)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["records"][0]["reqs"][0].update(draft_tokens=[1, 2]), "3 long"),
        (lambda d: d["records"][0]["reqs"][0].update(verify_len=9), "window"),
        (lambda d: d["records"][0]["reqs"][0].update(correct_drafts=3), "correct_drafts"),
        (lambda d: d["records"][0].update(mode="turbo"), "unknown mode"),
        (lambda d: d["records"][0]["reqs"][1].pop("confidence"), "confidence on some"),
        (lambda d: d["records"][0].update(bs="two"), "not a dspark_info_record"),
        (lambda d: d.pop("gamma"), "not a dspark_info_record"),
    ],
)
def test_bad_records_are_rejected_clearly(mutate, message):
    info = _hand_record()
    mutate(info)
    with pytest.raises(SGLangFormatError, match=message):
        info_record_to_batches(info)


def test_server_info_without_internal_states_is_rejected():
    with pytest.raises(SGLangFormatError, match="internal_states"):
        server_info_ranks(b'{"version": "0.5.23"}')
    assert server_info_ranks(b'{"internal_states": [{"x": 1}]}') == [None]

"""The SGLang-protocol front, over real HTTP on loopback, read back with the project's own
SGLang decoders (what the poller uses against a real server)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter

import numpy as np
import pytest

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend
from dspark_obs.telemetry.server_info import info_record_to_batches, server_info_ranks


def _config(**kw) -> RuntimeConfig:
    base = dict(seed=3, concurrency=[16], steps_per_level=1, max_new_tokens=256)
    base.update(kw)
    return RuntimeConfig(**base)


def _call(url, path, body=None, *, raw=None, headers=None, method=None):
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _gen(url, text, rid=None, max_new=24, temperature=0.0, **extra):
    body = {
        "text": text,
        "sampling_params": {"temperature": temperature, "max_new_tokens": max_new},
    }
    if rid is not None:
        body["rid"] = rid
    status, out = _call(url, "/generate", {**body, **extra})
    assert status == 200, out
    return out


def _ranks(url):
    status, info = _call(url, "/server_info")
    assert status == 200
    return info, server_info_ranks(info)


@pytest.fixture(scope="module")
def two_ranks():
    with RuntimeFrontend(_config(mode="cap-accept"), port=0, dp_size=2) as front:
        yield front.url


def test_health(two_ranks):
    assert _call(two_ranks, "/health") == (200, {})


def test_greedy_generate_returns_sglang_shape(two_ranks):
    out = _gen(two_ranks, "What is 7 * 6?", rid="gsm8k-a", max_new=40)
    ids = out["output_ids"]
    meta = out["meta_info"]
    assert meta["id"] == "gsm8k-a"
    assert 1 <= len(ids) <= 40 and meta["completion_tokens"] == len(ids)
    assert isinstance(out["text"], str) and len(out["text"]) == len(ids)
    reason = meta["finish_reason"]
    assert reason["type"] in ("stop", "length")
    if reason["type"] == "length":
        assert len(ids) == 40
    else:
        assert ids[-1] == reason["matched"] and reason["matched"] not in ids[:-1]
    assert meta["spec_verify_ct"] >= 1


def test_same_seed_and_prompt_same_tokens_across_ranks_and_servers(two_ranks):
    # round-robin puts consecutive requests on different ranks: still one stream
    first = [_gen(two_ranks, "the same prompt", max_new=60)["output_ids"] for _ in range(3)]
    assert first[0] == first[1] == first[2]
    with RuntimeFrontend(_config(mode="compact"), port=0) as other:
        assert _gen(other.url, "the same prompt", max_new=60)["output_ids"] == first[0]
        ids = _gen(other.url, None, input_ids=[5, 6, 7], max_new=60)
        assert ids["output_ids"] != first[0]
    with RuntimeFrontend(_config(mode="compact", seed=4), port=0) as reseeded:
        assert _gen(reseeded.url, "the same prompt", max_new=60)["output_ids"] != first[0]


def test_ignore_eos_runs_to_length_and_batches_answer_in_order(two_ranks):
    status, out = _call(
        two_ranks,
        "/generate",
        {
            "input_ids": [[1, 2, 3], [4, 5], [9]],
            "rid": ["poetry-1", "arena-2", "gsm8k-3"],
            "sampling_params": {"temperature": 0.7, "max_new_tokens": 50, "ignore_eos": True},
        },
    )
    assert status == 200
    assert [o["meta_info"]["id"] for o in out] == ["poetry-1", "arena-2", "gsm8k-3"]
    assert all(len(o["output_ids"]) == 50 for o in out)


def test_server_info_records_round_trip_per_rank(two_ranks):
    assert _call(
        two_ranks, "/set_internal_state", {"server_args": {"dspark_clear_info_records": True}}
    ) == (200, [{"updated": True, "server_args": {"dspark_clear_info_records": True}}] * 2)
    before = _call(two_ranks, "/server_info")[1]["internal_states"]
    steps_before = [s["dspark_steps"] for s in before]
    assert all(s["dspark_info_record"]["records"] == [] for s in before)

    rids = [f"{w}-{i}" for i, w in enumerate(["gsm8k", "arena", "poetry"] * 4)]
    status, _ = _call(
        two_ranks,
        "/generate",
        {
            "text": [f"prompt {i}" for i in range(12)],
            "rid": rids,
            "sampling_params": {"temperature": 0},
        },
    )
    assert status == 200
    info, ranks = _ranks(two_ranks)
    assert len(ranks) == 2
    seen = Counter()
    for r, (rec, state) in enumerate(zip(ranks, info["internal_states"], strict=True)):
        assert rec["mode"] == "cap-accept" and rec["gamma"] == 7
        assert rec["components"] == ["core", "reqs", "step_cpu_time", "step_gpu_time"]
        batches = info_record_to_batches(rec, rank=r)
        assert len(batches) == state["dspark_steps"] - steps_before[r] > 0
        fct = np.array([b.forward_ct for b in batches])
        assert (np.diff(fct) == 1).all() and fct[0] == steps_before[r]
        for b in batches:
            assert b.step_gpu_ms > 0 and b.step_cpu_ms > 0 and b.budget is not None
            assert b.bs == b.num_reqs
            assert (b.correct_drafts <= b.verify_len - 1).all()
            seen[r] += b.num_reqs
        assert all(
            "draft_gpu_ms" not in x and "target_verify_gpu_ms" not in x for x in rec["records"]
        )
    assert seen[0] > 0 and seen[1] > 0  # both ranks ran requests
    req_ranks = {
        q["rid"]: r for r, rec in enumerate(ranks) for x in rec["records"] for q in x["reqs"]
    }
    assert Counter(req_ranks.values()) == {0: 6, 1: 6}

    assert (
        _call(
            two_ranks, "/set_internal_state", {"server_args": {"dspark_clear_info_records": True}}
        )[0]
        == 200
    )
    _, ranks = _ranks(two_ranks)
    assert all(rec["records"] == [] for rec in ranks)


def test_record_buffer_drops_oldest():
    with RuntimeFrontend(_config(), port=0, max_records=5) as front:
        _gen(front.url, "long one", max_new=200)
        info, ranks = _ranks(front.url)
        fct = [r["forward_ct"] for r in ranks[0]["records"]]
        steps = info["internal_states"][0]["dspark_steps"]
        assert steps > 5 and fct == list(range(steps - 5, steps))


def test_bad_requests_are_answered_not_crashed(two_ranks):
    for raw in (b"{bad", b"", b"\xff\xfe"):
        status, out = _call(two_ranks, "/generate", raw=raw, method="POST")
        assert status == 400 and "JSON" in out["error"]["message"]
    cases = [
        [1, 2],
        {"sampling_params": {}},
        {"text": "x", "input_ids": [1]},
        {"text": "x", "sampling_params": {"max_new_tokens": 0}},
        {"text": "x", "sampling_params": {"temperature": -1}},
        {"text": "x", "workload": "nope"},
        {"input_ids": [1, -2]},
        {"text": "x", "stream": True},
    ]
    for body in cases:
        status, out = _call(two_ranks, "/generate", body)
        assert status == 400, body
        assert out["error"]["message"]
    assert _call(two_ranks, "/set_internal_state", {"x": 1})[0] == 400
    status, out = _call(
        two_ranks, "/set_internal_state", {"server_args": {"dspark_force_budget_frac": 2}}
    )
    assert status == 400
    assert _call(two_ranks, "/nope")[0] == 404
    conn = http.client.HTTPConnection(two_ranks.removeprefix("http://"), timeout=10)
    conn.request("POST", "/generate", body=b"x", headers={"Content-Length": str(2 << 20)})
    assert conn.getresponse().status == 413
    conn.close()
    assert _gen(two_ranks, "still alive", max_new=8)["meta_info"]["completion_tokens"] >= 1


def test_force_budget_frac_is_stored(two_ranks):
    status, out = _call(
        two_ranks, "/set_internal_state", {"server_args": {"dspark_force_budget_frac": 0.5}}
    )
    assert status == 200 and all(o["updated"] for o in out)
    info, _ = _ranks(two_ranks)
    assert [s["dspark_force_budget_frac"] for s in info["internal_states"]] == [0.5, 0.5]
    status, out = _call(two_ranks, "/set_internal_state", {"server_args": {"bogus": 1}})
    assert status == 200 and not any(o["updated"] for o in out)


def test_cli_runtime_server_with_api_key():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dspark_obs",
            "runtime-server",
            "--port",
            "0",
            "--dp-size",
            "2",
            "--api-key",
            "s3cret",
            "--sts",
            "none",
            "--mode",
            "static",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving http://"), line + proc.stderr.read()
        url = line.split()[1]
        assert _call(url, "/health")[0] == 200
        assert _call(url, "/server_info")[0] == 401
        body = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        assert _call(url, "/generate", body)[0] == 401
        bad = {"Authorization": "Bearer nope"}
        assert _call(url, "/generate", body, headers=bad)[0] == 401
        auth = {"Authorization": "Bearer s3cret"}
        for _ in range(2):
            status, out = _call(url, "/generate", body, headers=auth)
            assert status == 200 and out["meta_info"]["completion_tokens"] >= 1
        status, info = _call(url, "/server_info", headers=auth)
        ranks = server_info_ranks(info)
        assert [len(r["records"]) > 0 for r in ranks] == [True, True]
        assert all(rec["verify_len"] == 8 for r in ranks for x in r["records"] for rec in x["reqs"])
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_engine_external_admission_queues_beyond_capacity():
    from dspark_obs.runtime.engine import DSparkRuntime

    engine = DSparkRuntime(_config(concurrency=[2]))
    for i in range(5):
        engine.submit(f"arena-{i}", input_ids=[7, 8, 9], temperature=0, max_new_tokens=30)
    assert engine.workload_names[engine.submit("x", text="y").workload] == "gsm8k"
    assert engine.external_request("poetry-1", text="y").workload == 2
    finished, steps = {}, 0
    while engine.has_external_work:
        step = engine.step_external()
        assert step.batch.bs <= 2
        steps += 1
        finished.update({f.rid: f.output_ids for f in step.finished})
    assert engine.step_external() is None
    assert len(finished) == 6 and engine.forward_ct == steps
    assert len({tuple(finished[f"arena-{i}"]) for i in range(5)}) == 1

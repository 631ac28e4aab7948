"""The columnar decode of `dspark_info_record` JSON against the record-by-record one.

`info_record_to_batches` takes JSON text through `_columnar_batches`; whatever that
path hands out must equal, field by field, what `record_to_batch` makes of each
decoded record, and whatever it declines must end in the same error.
"""

from __future__ import annotations

import dataclasses
import json
import random

import msgspec
import numpy as np
import pytest

from dspark_obs.sources.workloads import workload_rule
from dspark_obs.telemetry.server_info import (
    SGLangFormatError,
    decode_info_record,
    info_record_to_batches,
    record_to_batch,
)
from dspark_obs.telemetry.server_info_columnar import _columnar_batches

WORKLOAD_OF = workload_rule(r"^(?P<workload>[a-z]+)-")


def per_record(payload, rank=0):
    info = decode_info_record(payload)
    return [
        record_to_batch(rec, gamma=info.gamma, mode=info.mode, rank=rank, workload_of=WORKLOAD_OF)
        for rec in info.records
    ]


def outcome(fn):
    try:
        return fn()
    except SGLangFormatError as exc:
        return (exc.reason, str(exc))


def assert_same(ours, ref):
    if isinstance(ref, tuple):  # an error: same reason and message
        assert ours == ref
        return
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref, strict=True):
        assert vars(a).keys() == vars(b).keys()  # built without __init__: no more, no fewer
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
                assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray), f.name
                assert x.dtype == y.dtype and x.shape == y.shape, f.name
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
                if x.dtype.kind == "f":  # same doubles, down to the sign of zero
                    assert x.tobytes() == y.tobytes(), f.name
            else:
                assert type(x) is type(y) and x == y, (f.name, x, y)


def random_request(rng: random.Random, gamma: int, probs: bool, rid: bool) -> dict:
    w = rng.randint(0, gamma)
    a = rng.randint(0, w)
    req = {
        "req_pool_index": rng.randint(-1, 4000),
        "prefix_len": rng.randint(0, 10**6),
        "verify_len": w + 1,
        "acc_len": a + 1,
        "correct_drafts": a,
        "cap_trim": rng.randint(0, gamma - a),
        "bonus_token": rng.randint(0, 200_000),
        "draft_tokens": [rng.choice((0, rng.randint(0, 10**17))) for _ in range(gamma)],
    }
    if rid:
        req["rid"] = f"{rng.choice(('chat', 'code', 'poetry'))}-{rng.randint(0, 50)}"
    if probs:
        for name in ("confidence", "survival"):
            req[name] = [random_probability(rng) for _ in range(gamma)]
    return req


def random_probability(rng: random.Random):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice((0.0, 1.0, 0, 1))
    if kind == 1:
        return rng.random()  # full precision, up to 17 significant digits
    return round(rng.random(), rng.randint(1, 6))


def random_payload(rng: random.Random) -> dict:
    gamma = rng.randint(1, 9)
    probs = rng.random() < 0.7
    records = []
    for fct in range(rng.randint(0, 6)):
        rec = {"forward_ct": fct * rng.randint(1, 3), "mode": rng.choice(("", "static", "compact"))}
        if rng.random() < 0.8:
            rec["bs"] = -1 if rng.random() < 0.2 else None
            rids = rng.random() < 0.8
            rec["reqs"] = [
                random_request(rng, gamma, probs, rids) for _ in range(rng.choice((0, 1, 5, 40)))
            ]
            if rec["bs"] is None:
                rec["bs"] = len(rec["reqs"])
        if rng.random() < 0.5:
            rec["step_gpu_ms"] = rng.random() * 30
            rec["budget"] = rng.randint(0, 1000)
        records.append(rec)
    return {
        "mode": rng.choice(("compact", "cap-accept", "static")),
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": ["core", "reqs"],
        "records": records,
    }


def encodings(payload: dict) -> list[bytes | str]:
    return [msgspec.json.encode(payload), json.dumps(payload), json.dumps(payload, indent=1)]


@pytest.mark.parametrize("seed", range(40))
def test_equal_to_per_record_on_random_payloads(seed):
    rng = random.Random(seed)
    payload = random_payload(rng)
    for text in encodings(payload):
        ref = per_record(text, 2)
        assert_same(info_record_to_batches(text, rank=2, workload_of=WORKLOAD_OF), ref)
        fast = _columnar_batches(text, 2, WORKLOAD_OF)
        if fast is not None:
            assert_same(fast, ref)


def test_plain_payloads_take_the_columnar_path():
    """Probabilities rounded to 4 digits, as SGLang sends them (full doubles may not be)."""
    rng = random.Random(7)
    for _ in range(20):
        payload = random_payload(rng)
        for rec in payload["records"]:
            for req in rec.get("reqs") or ():
                for name in ("confidence", "survival"):
                    if name in req:
                        req[name] = [round(x, 4) for x in req[name]]
        for text in encodings(payload):
            assert _columnar_batches(text, 0, WORKLOAD_OF) is not None


def valid_payload() -> dict:
    rng = random.Random(3)
    payload = random_payload(rng)
    while not any(rec.get("reqs") for rec in payload["records"]):
        payload = random_payload(rng)
    return payload


def first_req(payload: dict) -> dict:
    return next(rec["reqs"][0] for rec in payload["records"] if rec.get("reqs"))


MUTATIONS = {
    "short draft": lambda r: r.update(draft_tokens=r["draft_tokens"][:-1]),
    "long draft": lambda r: r.update(draft_tokens=[*r["draft_tokens"], 1]),
    "empty draft": lambda r: r.update(draft_tokens=[]),
    "nested draft": lambda r: r.update(draft_tokens=[r["draft_tokens"]]),
    "draft not a list": lambda r: r.update(draft_tokens=5),
    "draft string": lambda r: r.update(draft_tokens=["1"] * len(r["draft_tokens"])),
    "draft float": lambda r: r.update(draft_tokens=[1.5] * len(r["draft_tokens"])),
    "draft negative": lambda r: r.update(draft_tokens=[-3] * len(r["draft_tokens"])),
    "draft int64 max": lambda r: r.update(draft_tokens=[2**63 - 1] * len(r["draft_tokens"])),
    "draft beyond int64": lambda r: r.update(draft_tokens=[2**64 - 1] * len(r["draft_tokens"])),
    "draft null": lambda r: r.update(draft_tokens=None),
    "no draft": lambda r: r.pop("draft_tokens"),
    "confidence null": lambda r: r.update(confidence=None),
    "confidence here only": lambda r: r.update(confidence=[0.5] * len(r["draft_tokens"])),
    "confidence short": lambda r: r.update(confidence=[0.5] * (len(r["draft_tokens"]) - 1)),
    "confidence exponent": lambda r: r.update(confidence=[1e-05] * len(r["draft_tokens"])),
    "confidence negative zero": lambda r: r.update(confidence=[-0.0] * len(r["draft_tokens"])),
    "confidence above one": lambda r: r.update(confidence=[1.5] * len(r["draft_tokens"])),
    "confidence strings": lambda r: r.update(confidence=["x"] * len(r["draft_tokens"])),
    "confidence bools": lambda r: r.update(confidence=[True] * len(r["draft_tokens"])),
    "prefix_len string": lambda r: r.update(prefix_len="3"),
    "prefix_len huge": lambda r: r.update(prefix_len=2**64 - 1),
    "window too wide": lambda r: r.update(verify_len=99),
    "pool index huge": lambda r: r.update(req_pool_index=1 << 30),
    "rid missing": lambda r: r.pop("rid", None),
    "rid number": lambda r: r.update(rid=5),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_damaged_requests_end_as_per_record(name):
    payload = valid_payload()
    MUTATIONS[name](first_req(payload))
    for text in encodings(payload):
        assert_same(
            outcome(lambda text=text: info_record_to_batches(text, workload_of=WORKLOAD_OF)),
            outcome(lambda text=text: per_record(text)),
        )


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.update(gamma=0),
        lambda p: p.update(gamma=65),
        lambda p: p.update(mode="fast"),
        lambda p: p["records"][-1].update(mode="fast"),
        lambda p: p["records"][-1].update(bs=12345),
        lambda p: p["records"][-1].update(forward_ct=-1),
        lambda p: p["records"][-1].update(forward_ct=2**60),
        lambda p: p["records"][-1].update(forward_ct=2**53 + 1),
        lambda p: p["records"][-1].update(forward_ct=2**53),  # the largest taken
        lambda p: p["records"][-1].update(budget=2**64 - 1),
        lambda p: p["records"].append({"bs": 1}),
        lambda p: p.update(records=None),
    ],
)
def test_damaged_steps_end_as_per_record(damage):
    payload = valid_payload()
    damage(payload)
    for text in encodings(payload):
        assert_same(
            outcome(lambda text=text: info_record_to_batches(text, workload_of=WORKLOAD_OF)),
            outcome(lambda text=text: per_record(text)),
        )

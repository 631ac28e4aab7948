"""Fuzzing every input boundary: what arrives from outside may be wrong, never fatal.

Each target gets generated inputs (structured ones derived from the documented
schema and then mutated, plus raw bytes) and one contract: the input is used,
or it is refused with the project's own typed error (or counted), and nothing
else ever escapes. Where an exact answer is known in advance (which records a
pipeline must accept and under which reason it must count the rest), the
pipeline's counters are compared against it.

The default profile is CI's: derandomized (the same inputs every run, so a red
CI run is reproducible) and quick, a wide fixed set sized to CI's time budget
(docs/security.md lists the counts). For a longer, randomized search with ten
times the examples per target:

    DSPARK_FUZZ_PROFILE=long python -m pytest -q tests/test_fuzz.py

A crash found this way is fixed in the owning module and its input kept here
as an explicit `@example` or regression test.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import io
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.block_accept_walk import walk_blocks
from dspark_obs.estimator.ceiling_estimator import CeilingEstimator
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from dspark_obs.aggregates import Aggregates
from dspark_obs.aggregates.tokens import histogram_slices
from dspark_obs.analysis.summary import summarize
from dspark_obs.calibration.sts import StsCalibration, load_sts
from dspark_obs.cli.main import main as cli_main
from dspark_obs.domain.cost_table import AdditiveCostTable, load_cost_table
from dspark_obs.ingest.server_info_reader import ServerInfoReader
from dspark_obs.pipeline import Pipeline, run_source
from dspark_obs.sources.replay import ReplaySource
from dspark_obs.sources.sglang_poller import SGLangPoller
from dspark_obs.sources.stats import IngestStats
from dspark_obs.sources.workloads import workload_rule
from dspark_obs.store import RunWriter, open_run
from dspark_obs.store.errors import READ_ERRORS
from dspark_obs.telemetry.batch import MODES, InvalidBatch
from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl
from dspark_obs.telemetry.server_info import (
    SGLangFormatError,
    decode_step_record,
    info_record_to_batches,
    record_to_batch,
    server_info_ranks,
)

from .conftest import cli

LONG = os.environ.get("DSPARK_FUZZ_PROFILE", "") == "long"
settings.register_profile(
    "fuzz",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
# randomized, and failures saved (in .hypothesis/, git-ignored) so that a rerun replays them
settings.register_profile(
    "fuzz-long",
    settings.get_profile("fuzz"),
    derandomize=False,
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
)
_PROFILE = settings.get_profile("fuzz-long" if LONG else "fuzz")


def fuzz(examples: int) -> settings:
    """Per-test settings: `examples` in CI, ten times that with DSPARK_FUZZ_PROFILE=long."""
    return settings(_PROFILE, max_examples=examples * (10 if LONG else 1))


@pytest.fixture(autouse=True)
def _quiet_logs():
    """Rejections log a warning once per reason; thousands of examples would flood the output."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


# -- SGLang records: structured strategies from the documented schema -------------------------

INT64_EDGES = [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30]
WEIRD = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, *INT64_EDGES, -1, 0, 1.5, True, None]),
    st.integers(-3, 12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-2, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def request_dicts(draw, gamma: int, scored: bool) -> dict:
    w = draw(st.integers(0, gamma))
    cd = draw(st.integers(0, w))
    ct = draw(st.integers(0, gamma - cd))
    req = {
        "req_pool_index": draw(st.integers(0, 300)),
        "prefix_len": draw(st.integers(0, 4096)),
        "verify_len": w + 1,
        "acc_len": cd + 1,
        "correct_drafts": cd,
        "cap_trim": ct,
        "bonus_token": draw(st.integers(0, 127)),
        "draft_tokens": draw(st.lists(st.integers(0, 127), min_size=gamma, max_size=gamma)),
        "rid": f"{draw(st.sampled_from(['gsm8k', 'arena', 'poetry']))}-{draw(st.integers(0, 9))}",
    }
    if scored:
        conf = draw(st.lists(st.floats(0, 1), min_size=gamma, max_size=gamma))
        req["confidence"] = conf
        req["survival"] = np.cumprod(conf).tolist()
    return req


@st.composite
def step_dicts(draw, gamma: int, mode: str, fct: int, scored: bool) -> dict:
    n = draw(st.integers(0, 4))
    rec = {
        "forward_ct": fct,
        "bs": n,
        "mode": mode,
        "budget": draw(st.none() | st.integers(0, 64)),
        "lag_steps": 2,
        "num_running_reqs": n,
        "num_verify_tokens": draw(st.integers(-1, 512)),
        "verify_tokens_local": draw(st.integers(-1, 512)),
        "verify_tokens_graph_key": draw(st.integers(-1, 512)),
        "predicted_step_ms": draw(st.none() | st.floats(0, 100)),
        "step_cpu_ms": draw(st.none() | st.floats(0, 100)),
        "step_gpu_ms": draw(st.none() | st.floats(0, 100)),
    }
    if draw(st.booleans()) or n:
        rec["reqs"] = [draw(request_dicts(gamma, scored)) for _ in range(n)]
    return rec


@st.composite
def envelopes(draw, gamma: int | None = None, max_records: int = 4) -> dict:
    gamma = gamma if gamma is not None else draw(st.integers(1, 8))
    mode = draw(st.sampled_from(MODES))
    scored = draw(st.booleans())
    first = draw(st.integers(0, 1000))
    n = draw(st.integers(0, max_records))
    return {
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": ["core", "reqs", "step_cpu_time", "step_gpu_time"],
        "simulate_acc_len": None,
        "records": [draw(step_dicts(gamma, mode, first + i, scored)) for i in range(n)],
    }


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):
            yield from _paths(v, (*prefix, i))


def _parent(obj, path):
    for key in path[:-1]:
        obj = obj[key]
    return obj


@st.composite
def mutated(draw, base, max_mutations: int = 4):
    """`base` with random damage: wrong values, missing or extra keys, huge, duplicated or
    reordered lists. Every kind of damage the server (or a disk, or a proxy) could do."""
    obj = copy.deepcopy(base)
    huge = False
    for _ in range(draw(st.integers(0, max_mutations))):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(obj, path), path[-1]
        op = draw(st.sampled_from(["set", "set", "set", "delete", "extra", "huge", "dup", "swap"]))
        target = parent[key]
        if op == "set":
            parent[key] = draw(WEIRD)
        elif op == "delete":
            del parent[key]
        elif op == "extra" and isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=6))] = draw(WEIRD)
        elif op == "huge" and isinstance(target, list) and target and not huge:
            huge = True  # one per input: thousands of elements, not millions
            target.extend([target[-1]] * draw(st.sampled_from([100, 2000])))
        elif op == "dup" and isinstance(target, list) and target:
            target.append(copy.deepcopy(target[draw(st.integers(0, len(target) - 1))]))
        elif op == "swap" and isinstance(target, list) and len(target) > 1:
            target.reverse()
    return obj


#: One valid request of a gamma=3 block, for hand-written regression examples.
_REQ3 = {
    "req_pool_index": 0,
    "prefix_len": 10,
    "verify_len": 3,
    "acc_len": 2,
    "correct_drafts": 1,
    "cap_trim": 0,
    "bonus_token": 5,
    "draft_tokens": [1, 2, 3],
}


@st.composite
def server_infos(draw):
    ranks = [draw(envelopes(max_records=3)) for _ in range(draw(st.integers(1, 2)))]
    payload = {"version": "0.5.23", "internal_states": [{"dspark_info_record": e} for e in ranks]}
    return draw(mutated(payload, max_mutations=5))


def _pipeline(gamma: int, stats: IngestStats | None = None) -> Pipeline:
    return Pipeline(
        Aggregates(gamma, window_steps=16, segments=2),
        stats=stats or IngestStats(),
        estimator=CeilingEstimator(gamma, window_steps=16, segments=2, assume_greedy=True),
    )


def _gamma_of(payload) -> int:
    try:
        g = payload["internal_states"][0]["dspark_info_record"]["gamma"]
    except (KeyError, IndexError, TypeError):
        return 7
    return g if isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= 64 else 7


def _feed(pipeline: Pipeline, batches, source: str = "fuzz") -> None:
    for b in batches:
        b.validate()  # whatever a decoder hands out is a valid StepBatch
        pipeline.ingest(b, source)


def _encode(payload, as_bytes: bool):
    # the stdlib writes NaN/Infinity literals (as SGLang's json.dumps would): invalid JSON
    return json.dumps(payload, default=str).encode() if as_bytes else payload


@fuzz(600)
@given(server_infos(), st.booleans())
@example(  # a rank whose dspark_info_record is null once crashed the decoder (TypeError)
    {"internal_states": [{"dspark_info_record": None}, 3]}, False
)
@example({"internal_states": [{}] * 300}, False)  # more ranks than any server: refused
@example(b"\xff{not json", True)
def test_server_info_decodes_or_raises_typed_error(payload, as_bytes):
    """`server_info_ranks` + `info_record_to_batches`: valid batches or SGLangFormatError."""
    raw = payload if isinstance(payload, bytes) else _encode(payload, as_bytes)
    pipeline = _pipeline(_gamma_of(payload) if isinstance(payload, dict) else 7)
    try:
        ranks = server_info_ranks(raw)
    except SGLangFormatError as exc:
        assert exc.reason and str(exc)
        return
    for rank, env in enumerate(ranks):
        try:
            batches = info_record_to_batches(env, rank=rank)
        except SGLangFormatError as exc:
            assert exc.reason and str(exc)
            continue
        _feed(pipeline, batches)
    pipeline.close()
    pipeline.aggregates.snapshot()


@fuzz(600)
@given(server_infos())
def test_server_info_through_file_reader_and_poller_never_raise(payload):
    """What `ingest` (ServerInfoReader) and `serve` (SGLangPoller) do with one answer."""
    gamma = _gamma_of(payload)
    reader = ServerInfoReader(workload_rule())
    pipeline = _pipeline(gamma)
    try:
        reader.add_snapshot(payload)
    except SGLangFormatError:
        pass
    else:
        _feed(pipeline, reader.take_batches(), "ingest")
    assert all(n > 0 for n in reader.bad.values())

    stats = IngestStats()
    poller = SGLangPoller("http://127.0.0.1:9", stats=stats, gamma=gamma)
    try:  # what the poller checks of an answer's bytes before its records (counted, not raised)
        states = poller._decode(_encode(payload, True))
    except SGLangFormatError as exc:
        assert exc.reason in ("too_many_ranks", "bad_json")
    except ValueError:  # not JSON (a NaN literal): the poller counts it as bad_json
        pass
    else:
        _feed(pipeline, poller._records(states), poller.name)
    pipeline.close()
    pipeline.aggregates.snapshot()
    pipeline.estimator.snapshot()


@st.composite
def single_steps(draw):
    gamma = draw(st.integers(1, 8))
    mode = draw(st.sampled_from(MODES))
    base = draw(step_dicts(gamma, mode, draw(st.integers(0, 2**40)), draw(st.booleans())))
    return gamma, mode, draw(mutated(base, max_mutations=3))


@fuzz(1000)
@given(single_steps())
# correct_drafts + cap_trim wrapped around int64 and passed the range check unnoticed
@example((3, "cap-accept", {"forward_ct": 1, "reqs": [{**_REQ3, "cap_trim": 2**63 - 1}]}))
# integers beyond int64 crashed the conversion (OverflowError) instead of being counted
@example((3, "compact", {"forward_ct": 1, "reqs": [{**_REQ3, "prefix_len": 2**64}]}))
@example((3, "compact", {"forward_ct": 1, "budget": 10**30, "reqs": []}))
@example((3, "compact", {"forward_ct": 1, "reqs": [{**_REQ3, "draft_tokens": [2**70, 0, 0]}]}))
# the estimator sized per-slot state by req_pool_index: 2**63 - 1 asked numpy for an array of
# that length (ValueError), 10**9 would have allocated gigabytes, a negative one IndexError
@example((3, "static", {"forward_ct": 1, "reqs": [{**_REQ3, "req_pool_index": 2**63 - 1}]}))
@example((3, "static", {"forward_ct": 1, "reqs": [{**_REQ3, "req_pool_index": 10**9}]}))
@example((3, "static", {"forward_ct": 1, "reqs": [{**_REQ3, "req_pool_index": -(2**63)}]}))
@example((10**9, "compact", {"forward_ct": 1, "reqs": [_REQ3]}))  # absurd gamma: refused
# a record without reqs skipped validation, so its forward_ct 2**63 reached the aggregates
@example((3, "static", {"forward_ct": 2**63}))
def test_single_step_record_converts_or_raises_typed_error(case):
    gamma, mode, raw = case
    try:
        batch = record_to_batch(decode_step_record(raw), gamma=gamma, mode=mode)
    except SGLangFormatError as exc:
        assert isinstance(exc, InvalidBatch) and exc.reason and str(exc)
        return
    batch.validate()
    pipeline = _pipeline(gamma)
    assert pipeline.ingest(batch, "fuzz")
    pipeline.close()


# -- the pipeline's accounting: every record offered is accepted or counted, exactly ------------

#: Damage to one record, and the reason it must be counted under (None: still accepted).
STEP_DAMAGE = {
    "none": None,
    "extra_key": None,
    "wrong_type": "bad_record",
    "missing_forward_ct": "bad_record",
    "bad_mode": "bad_record",
    "bs_mismatch": "malformed",
    "huge_budget": "malformed",
}
REQ_DAMAGE = {
    "window_high": "window_out_of_range",
    "window_negative": "window_out_of_range",
    "accepted_over_window": "accepted_out_of_range",
    "cap_trim_negative": "cap_trim_out_of_range",
    "committed_high": "committed_out_of_range",
    "draft_tokens_length": "bad_record",
    "huge_prefix_len": "bad_record",
    "huge_pool_index": "pool_index_out_of_range",
    "missing_correct_drafts": "bad_record",
    "verify_len_as_text": "bad_record",
}
SCORED_DAMAGE = {
    "nan_confidence": "probability_out_of_range",
    "inf_survival": "probability_out_of_range",
}


def _damage(rec: dict, kind: str, gamma: int) -> None:
    reqs = rec.get("reqs")
    req = reqs[0] if reqs else None
    match kind:
        case "extra_key":
            rec["a_future_field"] = {"x": [1, 2]}
        case "wrong_type":
            rec["bs"] = "six"
        case "missing_forward_ct":
            del rec["forward_ct"]
        case "bad_mode":
            rec["mode"] = "turbo"
        case "bs_mismatch":
            rec["bs"] = len(reqs) + 1
        case "huge_budget":
            rec["budget"] = 2**64
        case "window_high":
            req["verify_len"] = gamma + 2
        case "window_negative":
            req["verify_len"] = 0
        case "accepted_over_window":
            req["correct_drafts"] = req["verify_len"]
        case "cap_trim_negative":
            req["cap_trim"] = -1
        case "committed_high":
            req["acc_len"] = gamma + 2
        case "draft_tokens_length":
            req["draft_tokens"] = [*req["draft_tokens"], 0]
        case "huge_prefix_len":
            req["prefix_len"] = 2**64
        case "huge_pool_index":
            req["req_pool_index"] = 10**9
        case "missing_correct_drafts":
            del req["correct_drafts"]
        case "verify_len_as_text":
            req["verify_len"] = str(req["verify_len"])
        case "nan_confidence":
            req["confidence"][0] = math.nan
        case "inf_survival":
            req["survival"][-1] = math.inf
        case "confidence_on_some":
            del reqs[1]["confidence"]


@st.composite
def accounted_payloads(draw):
    """A server_info whose every record has a known fate, and that fate per record."""
    gamma = draw(st.integers(1, 8))
    env = draw(envelopes(gamma=gamma, max_records=8))
    scored = bool(env["records"]) and all(
        "confidence" in r for rec in env["records"] for r in rec.get("reqs") or []
    )
    expected: Counter[str] = Counter()
    accepted: list[dict] = []
    for rec in env["records"]:
        options = [k for k in STEP_DAMAGE if k != "bs_mismatch" or "reqs" in rec]
        if rec.get("reqs"):
            options += list(REQ_DAMAGE)
            if scored:
                options += list(SCORED_DAMAGE)
                if len(rec["reqs"]) >= 2:
                    options.append("confidence_on_some")
        kind = draw(st.sampled_from(options))
        reason = {**STEP_DAMAGE, **REQ_DAMAGE, **SCORED_DAMAGE}.get(kind, "bad_record")
        _damage(rec, kind, gamma)
        event(f"record: {kind}")
        if reason is None:
            accepted.append(rec)
        else:
            expected[reason] += 1
    dups = draw(st.lists(st.sampled_from(accepted), max_size=3)) if accepted else []
    env["records"] = draw(st.permutations(env["records"] + copy.deepcopy(dups)))
    states = [{"dspark_info_record": env}]
    other = []
    if draw(st.booleans()):  # a second rank running another block size: all refused
        other_gamma = draw(st.integers(1, 8).filter(lambda g: g != gamma))
        other = draw(envelopes(gamma=other_gamma, max_records=3))["records"]
        states.append({"dspark_info_record": {**env, "gamma": other_gamma, "records": other}})
        expected["gamma_mismatch"] += len(other)
    payload = {"internal_states": states}
    return gamma, payload, accepted, len(dups), expected


def _assert_reached_aggregates(pipeline: Pipeline, accepted: list[dict], gamma: int) -> None:
    """The aggregates' window histogram holds exactly the accepted records' request rows."""
    pipeline.aggregates.flush()
    total = pipeline.aggregates.snapshot().tokens["total"]
    window_hist = total[:, histogram_slices(gamma)["window"]].sum(axis=0)
    windows = [r["verify_len"] - 1 for rec in accepted for r in rec.get("reqs") or []]
    assert window_hist.sum() == len(windows)
    assert (window_hist * np.arange(gamma + 1)).sum() == sum(windows)


@fuzz(300)
@given(accounted_payloads())
def test_pipeline_counts_every_rejected_record_by_reason(case):
    """Poller path (`serve`) and file path (`ingest`): accepted + rejected == offered."""
    gamma, payload, accepted, dups, expected = case
    offered = sum(len(s["dspark_info_record"]["records"]) for s in payload["internal_states"])

    try:
        answer = json.dumps(payload, allow_nan=False).encode()
    except ValueError:  # NaN or infinity: JSON has neither, so no server answer carries one
        answer = None
    if answer is not None:  # the poller reads the answer's bytes
        stats = IngestStats()
        pipeline = _pipeline(gamma, stats)
        poller = SGLangPoller("http://127.0.0.1:9", stats=stats, gamma=gamma)
        for batch in poller._records(poller._decode(answer)):
            pipeline.ingest(batch, poller.name)
        records, errors = stats.snapshot()[:2]
        rejected = Counter({r: n for (_, r), n in errors.items() if r != "dropped_steps"})
        assert rejected == expected
        assert records.get(poller.name, 0) == len(accepted)
        assert poller.duplicates == dups
        assert len(accepted) + rejected.total() + dups == offered
        _assert_reached_aggregates(pipeline, accepted, gamma)

    reader = ServerInfoReader(workload_rule())
    pipeline = _pipeline(gamma)
    reader.add_snapshot(payload)
    for batch in reader.take_batches():
        pipeline.ingest(batch, "ingest")
    records, errors = pipeline.stats.snapshot()[:2]
    rejected = Counter(reader.bad) + Counter({r: n for (_, r), n in errors.items()})
    assert rejected == expected
    assert records.get("ingest", 0) == len(accepted)
    assert reader.dedup.duplicates == dups
    _assert_reached_aggregates(pipeline, accepted, gamma)


# -- block-accept JSONL ---------------------------------------------------------------------


@st.composite
def block_accept_rows(draw) -> dict:
    gamma = 7
    w = draw(st.integers(0, gamma - 1))
    cl = draw(st.sampled_from([w, draw(st.integers(0, w))]))
    row = {
        "rid": f"{draw(st.sampled_from(['gsm8k', 'arena']))}-{draw(st.integers(0, 3))}",
        "fct": draw(st.integers(0, 20)),
        "w": w,
        "cl": cl,
        "ct": draw(st.integers(0, gamma - cl)),
    }
    if cl == w and draw(st.booleans()):
        tail = gamma - w
        row["trimmed_tokens"] = draw(st.lists(st.integers(0, 127), min_size=tail, max_size=tail))
        row["q_lp"] = draw(st.lists(st.floats(-20, 0), min_size=tail, max_size=tail))
    if draw(st.booleans()):
        row["pg"] = [
            [draw(st.integers(0, 20)), draw(st.integers(1, gamma)), draw(st.floats(-20, 0)),
             draw(st.integers(0, 127)), draw(st.integers(0, 127))]
            for _ in range(draw(st.integers(1, 3)))
        ]  # fmt: skip
    return row


@st.composite
def jsonl_lines(draw) -> tuple[bytes, bool]:
    """One line and whether it is garbage (can never be a usable row)."""
    kind = draw(st.sampled_from(["row", "row", "mutated", "marker", "bytes", "truncated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=80)), True
    if kind == "marker":
        marker = {"rid": "gsm8k-1", "eos_end": draw(st.lists(st.integers(0, 20), max_size=3))}
        return json.dumps(marker).encode(), False
    row = draw(block_accept_rows())
    if kind == "mutated":
        row = draw(mutated(row, max_mutations=3))
    text = json.dumps(row, default=str).encode()  # NaN / Infinity literals, as json.dumps writes
    if kind == "truncated":
        return text[: draw(st.integers(0, len(text) - 1))], True
    return text, False


@fuzz(1700)
@given(st.lists(jsonl_lines(), max_size=12))
# integers beyond int64 crashed the parser (OverflowError) instead of counting the line
@example([(b'{"rid": "a-1", "fct": 18446744073709551616, "w": 0, "cl": 0, "ct": 0}', False)])
@example(
    [(b'{"rid": "a-1", "fct": 0, "w": 0, "cl": 0, "ct": 0, "pg": [[0, 1, 0, %d, 1]]}' % 2**80, 0)]
)
def test_block_accept_jsonl_counts_bad_lines_and_never_raises(lines):
    raw = [line for line, _ in lines]
    log = read_block_accept_jsonl(raw)
    blank = sum(1 for line in raw if not line.strip())
    garbage = sum(1 for line, bad in lines if bad and line.strip())
    assert log.n_lines == len(raw)
    assert log.bad_lines >= garbage
    # every non-blank line is exactly one of: bad, a row, a repeated row, an eos marker
    assert log.bad_lines + log.n_rows + log.duplicate_rows + log.n_markers == len(raw) - blank
    assert len(log.bad_line_samples) == min(log.bad_lines, 20)
    try:
        blocks = walk_blocks(log)
    except ValueError as exc:  # blocks implying different gammas: the CLI's one-line error
        assert "gamma" in str(exc)
        return
    assert len(blocks["lo"]) == log.n_blocks
    assert np.all(blocks["lo"] <= blocks["hi"] + 1e-9)


# -- STS and cost-table JSON files ------------------------------------------------------------


def _json_containers(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    _json_containers,
    max_leaves=12,
)
STS_BASE = {
    "temperatures": [0.5, 1.0, 2.0],
    "dataset": "",
    "num_samples": 10,
    "ece_before": [0.1, 0.2, 0.3],
    "ece_after": [0.05, 0.1, 0.1],
}
COST_BASE = {
    "bias_seconds": 0.002,
    "bs_probes": [1, 8, 64],
    "alpha_seconds": [0.0005, 0.001, 0.002],
    "m_probes": [1, 64, 256],
    "theta_seconds": [0.005, 0.006, 0.008],
}


def json_files(base: dict):
    """File contents: near-valid objects with damage, any JSON value, or any bytes."""
    near = mutated(base, max_mutations=3).map(lambda d: json.dumps(d, default=str).encode())
    anything = JSON_VALUES.map(lambda v: json.dumps(v).encode())
    truncated = st.integers(0, 60).map(lambda k: json.dumps(base).encode()[:k])
    return st.one_of(near, near, anything, truncated, st.binary(max_size=64))


_FILES = Path(tempfile.mkdtemp(prefix="fuzz-files-"))
atexit.register(shutil.rmtree, _FILES, ignore_errors=True)  # one per worker process


def _load_or_value_error(load, content: bytes, name: str):
    path = _FILES / name
    path.write_bytes(content)
    try:
        return load(path)
    except ValueError as exc:
        message = str(exc)
        assert str(path) in message and "\n" not in message.strip(), message
        return None


@fuzz(1000)
@given(json_files(STS_BASE))
@example(b'{"temperatures": [1e999]}')
@example(b'{"temperatures": [1.0], "num_samples": 1e3}')
def test_sts_json_loads_or_raises_value_error(content):
    cal = _load_or_value_error(load_sts, content, "sts.json")
    if cal is not None:
        assert isinstance(cal, StsCalibration)
        assert cal.temperatures and all(math.isfinite(t) and t > 0 for t in cal.temperatures)


@fuzz(1000)
@given(json_files(COST_BASE))
@example(b'{"bias_seconds": 1, "bs_probes": [1], "alpha_seconds": [1e400], '
         b'"m_probes": [1], "theta_seconds": [0]}')  # fmt: skip
def test_cost_table_json_loads_or_raises_value_error(content):
    table = _load_or_value_error(load_cost_table, content, "cost.json")
    if table is not None:
        assert isinstance(table, AdditiveCostTable)
        assert np.isfinite(table.step_seconds(np.array([1, 64]), np.array([0, 7]))).all()


# -- the run store: damaged parts and manifests ----------------------------------------------

SAMPLE = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A real run directory of three flushes (parts 0..2 of steps and requests)."""
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    info["records"] = info["records"][:30]
    batches = info_record_to_batches(info, workload_of=workload_rule(r"^(?P<workload>[a-z]+)-"))
    out = tmp_path_factory.mktemp("store") / "run"
    with RunWriter(out, {"gamma": info["gamma"], "mode": info["mode"]}, flush_steps=10) as w:
        for b in batches:
            w.append(b)
    return out


@st.composite
def damages(draw):
    """What a disk, a crash or a careless copy does to a run directory."""
    kind = draw(
        st.sampled_from(
            ["truncate", "flip", "garbage", "empty", "wrong_schema", "other_types", "manifest",
             "drop_requests", "drop_steps_column"]
        )
    )  # fmt: skip
    table = draw(st.sampled_from(["steps", "requests"]))
    part = draw(st.integers(0, 2))
    # without its checksum records the run is one written before parts had them
    checksums = draw(st.booleans())
    return kind, table, part, draw(st.randoms(use_true_random=False)), checksums


def _damage_run(run: Path, damage) -> None:
    kind, table, part, rnd, checksums = damage
    if not checksums:
        shutil.rmtree(run / "_checksums")
    target = run / table / f"part-{part:06d}.parquet"
    data = target.read_bytes()
    if kind == "truncate":
        target.write_bytes(data[: rnd.randrange(len(data))])
    elif kind == "flip":
        raw = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            raw[rnd.randrange(len(raw))] ^= 1 << rnd.randrange(8)
        target.write_bytes(bytes(raw))
    elif kind == "garbage":
        target.write_bytes(rnd.randbytes(rnd.randint(1, 4096)))
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "wrong_schema":
        pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(target)
    elif kind == "other_types":  # the right names, a column of the wrong type
        df = pl.read_parquet(target)
        col = rnd.choice(["forward_ct", "rank", "mode", "gamma"])
        df.with_columns(pl.col(col).cast(pl.String) + "x").write_parquet(target)
    elif kind == "drop_steps_column":
        df = pl.read_parquet(target)
        df.drop(rnd.choice(df.columns)).write_parquet(target)
    elif kind == "drop_requests":
        (run / "requests" / f"part-{part:06d}.parquet").unlink()
    elif kind == "manifest":
        choice = rnd.randrange(4)
        text = [b"", b"{", b"[1, 2]", rnd.randbytes(rnd.randint(1, 64))][choice]
        (run / "run.json").write_bytes(text)


def _read_everything(run_dir: Path) -> None:
    run = open_run(run_dir)
    for lazy in (run.scan("steps"), run.requests()):
        # scan checks footers and schemas; damage inside a data page can only show when a
        # caller's query reads it, as polars' own error (or panic), not ours
        with contextlib.suppress(*READ_ERRORS):
            lazy.collect()
    sum(b.num_reqs for b in run.batches())
    summarize(run)


#: polars aborts the whole process (Rust allocation failure, no exception) when a flipped bit
#: turns a page's size into exabytes. Part checksums catch that before polars reads the part;
#: a part without a checksum record (a run written before parts had them) is still exposed.
#: Reads therefore run in a child process, and this exact signature is tolerated (and
#: counted) for such runs only.
POLARS_ALLOC_ABORT = re.compile(r"memory allocation of \d+ bytes failed")

_READER = """
import json, sys
from dspark_obs.store import RunStoreError
from tests.test_fuzz import _read_everything
for line in sys.stdin:
    try:
        _read_everything(line.strip())
        out = ["ok", ""]
    except RunStoreError as exc:
        out = ["store", str(exc)]
    except BaseException as exc:
        out = ["other", repr(exc)]
    print(json.dumps(out), flush=True)
"""


class IsolatedReader:
    """`_read_everything` in a long-lived child process, restarted when polars aborts it."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.proc: subprocess.Popen | None = None
        self.aborts = 0

    def read(self, run_dir: Path) -> tuple[str, str]:
        if self.proc is None:
            self.stderr = self.logs / f"reader-{self.aborts}.stderr"
            with self.stderr.open("w") as err:  # the child keeps its own descriptor
                self.proc = self._start(err)
        self.proc.stdin.write(f"{run_dir}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if line:
            kind, detail = json.loads(line)
            return kind, detail
        self.proc.wait(30)
        self.proc.stdout.close()
        self.proc = None
        self.aborts += 1
        return "died", self.stderr.read_text(errors="replace")[-2000:]

    @staticmethod
    def _start(err) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", _READER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=Path(__file__).parents[1],
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(30)
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def isolated_reader(tmp_path_factory):
    reader = IsolatedReader(tmp_path_factory.mktemp("reader"))
    yield reader
    reader.close()


@fuzz(250)
@given(damages())
@example(("truncate", "steps", 1, random.Random(1), False))  # footer gone: polars error
@example(("other_types", "steps", 0, random.Random(2), False))
@example(("flip", "requests", 2, random.Random(3), False))
@example(("truncate", "steps", 1, random.Random(1), True))
@example(("other_types", "steps", 0, random.Random(2), True))
@example(("flip", "requests", 2, random.Random(3), True))
def test_damaged_run_raises_run_store_error(small_run, isolated_reader, damage):
    """open_run / scan / batches / summarize: the data, or RunStoreError naming the path.

    With checksum records, any change to a part's bytes is that part's damaged-part error.
    """
    kind_of_damage, table, part, _, checksums = damage
    work = Path(tempfile.mkdtemp(prefix="fuzz-run-"))
    try:
        run_dir = work / "run"
        shutil.copytree(small_run, run_dir)
        target = run_dir / table / f"part-{part:06d}.parquet"
        before = target.read_bytes()
        _damage_run(run_dir, damage)
        changed = target.is_file() and target.read_bytes() != before
        kind, detail = isolated_reader.read(run_dir)
        event(f"{kind_of_damage} (checksums={checksums}): {kind}")
        if kind == "died":
            assert not checksums and POLARS_ALLOC_ABORT.search(detail), detail
            return
        assert kind in ("ok", "store"), detail
        if kind == "store":
            assert str(run_dir) in detail and "\n" not in detail, detail
        if checksums and changed and kind_of_damage != "manifest":
            assert kind == "store" and f"{target}: damaged" in detail, detail
    finally:
        shutil.rmtree(work)


#: One bit of a `steps` part (byte 209, bit 0, in the first page header) that made polars
#: ask for 2 EiB and abort before parts carried checksums. Found by the long profile.
ABORTING_FLIP = ("steps", 1, 209, 0x01)


def _flip(part: Path, offset: int, bit: int) -> None:
    raw = bytearray(part.read_bytes())
    raw[offset % len(raw)] ^= bit
    part.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("where", "offset"),
    [("page header", ABORTING_FLIP[2]), ("page data", None), ("footer", -12)],
)
def test_a_flipped_bit_is_a_damaged_part_error_not_an_abort(small_run, tmp_path, where, offset):
    run_dir = tmp_path / "run"
    shutil.copytree(small_run, run_dir)
    table, part, _, bit = ABORTING_FLIP
    target = run_dir / table / f"part-{part:06d}.parquet"
    size = target.stat().st_size
    _flip(target, size // 2 if offset is None else offset, bit)
    # `estimate` reads the steps part whole, as a replay (`serve --source run:DIR`) does
    proc = cli("estimate", str(run_dir), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{target}: damaged: CRC-32" in lines[0], proc.stderr
    assert "memory allocation" not in proc.stderr


def test_report_refuses_a_damaged_part_in_one_line(small_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(small_run, run_dir)
    table, part, offset, bit = ABORTING_FLIP
    target = run_dir / table / f"part-{part:06d}.parquet"
    _flip(target, offset, bit)
    proc = cli("report", str(run_dir), "--out", str(tmp_path / "report"), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{target}: damaged" in lines[0], proc.stderr


def test_replaying_a_damaged_run_is_a_counted_source_failure(small_run, tmp_path, caplog):
    """`serve --source run:DIR`: the steps before the damaged part are fed, then the source is
    down and counted, and the service goes on."""
    run_dir = tmp_path / "run"
    shutil.copytree(small_run, run_dir)
    table, part, offset, bit = ABORTING_FLIP
    target = run_dir / table / f"part-{part:06d}.parquet"
    _flip(target, offset, bit)
    source = ReplaySource(str(run_dir), speed=0)
    pipeline = Pipeline(Aggregates(source.gamma), stats=IngestStats())
    with caplog.at_level(logging.ERROR):
        fed = run_source(source, pipeline, threading.Event())
    first_part = pl.read_parquet(run_dir / table / "part-000000.parquet").height
    assert fed == first_part
    _, errors, up = pipeline.stats.snapshot()[:3]
    assert errors == {(source.name, "source_failed"): 1} and up == {source.name: 0}
    assert f"{target}: damaged" in caplog.text


# -- CLI arguments ----------------------------------------------------------------------------

#: Subcommands fuzzed in process. Left out: `report` and `demo` (seconds of plotting or running
#: per valid call), `dashboards` and `shadow` (they contact other servers), `hash-password`
#: (reads a terminal). Their argument handling is covered by their own tests.
FUZZED_COMMANDS = (
    ("run",),
    ("serve",),
    ("runtime-server",),
    ("ingest",),
    ("summary",),
    ("estimate",),
    ("calibration",),
    ("compare",),
    ("sts", "fit"),
    ("cost", "fit"),
)


def _leaf_parsers():
    """Every fuzzed subcommand's parser, with its flags taken from the real parser."""
    import argparse

    from dspark_obs.cli.main import build_parser

    def sub(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices[name]
        raise KeyError(name)

    out = {}
    for path in FUZZED_COMMANDS:
        parser = build_parser()
        for name in path:
            parser = sub(parser, name)
        flags = sorted(
            (opt, action.nargs != 0)
            for action in parser._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt not in ("--help", "--version")
        )
        out[path] = flags
    return out


LEAVES = _leaf_parsers()


class _Reached(BaseException):
    """Raised where a valid command would start its real work (serve forever, run a sweep).

    A BaseException so that main()'s error handling cannot mistake it for a user error."""


@pytest.fixture(scope="module")
def cli_world(small_run, tmp_path_factory):
    """Files the generated argv may name: good, bad, missing, a directory."""
    root = tmp_path_factory.mktemp("cli")
    info = json.loads(SAMPLE.read_text())
    info["internal_states"][0]["dspark_info_record"]["records"] = info["internal_states"][0][
        "dspark_info_record"
    ]["records"][:4]
    (root / "server_info.json").write_text(json.dumps(info))
    block = Path(__file__).parent / "data" / "sglang" / "block_accept.sampled.jsonl"
    (root / "block.jsonl").write_bytes(b"".join(block.read_bytes().splitlines(True)[:40]))
    (root / "bad.json").write_bytes(b'{"temperatures": [1, -2]')
    (root / "sts.json").write_text(json.dumps({"temperatures": [1.0] * 7}))
    (root / "cost.json").write_text(json.dumps(COST_BASE))
    (root / "empty").write_bytes(b"")
    (root / "dir").mkdir()
    damaged = root / "damaged_run"
    shutil.copytree(small_run, damaged)
    (damaged / "steps" / "part-000001.parquet").write_bytes(b"PAR1 not really")
    return root


def _values(world: Path, small_run: Path):
    paths = [
        str(small_run),
        str(world / "damaged_run"),
        str(world / "server_info.json"),
        str(world / "block.jsonl"),
        str(world / "bad.json"),
        str(world / "sts.json"),
        str(world / "cost.json"),
        str(world / "empty"),
        str(world / "dir"),
        str(world / "missing" / "x"),
    ]
    junk = ["", "-1", "0", "1", "7", "65", "2", "nan", "inf", "-0.5", "1e400", str(2**70), "x",
            "--", "a,b", ",", "gsm8k=poetry", "static", "compact", "cap-accept", "greedy",
            "auto", "none", "runtime", "run:" + str(small_run), "sglang:http://127.0.0.1:9",
            "sglang:http://u:p@127.0.0.1:9", "sglang:file:///etc/passwd", "127.0.0.1:0",
            "[::1]:99999", "^(?P<workload>[a-z]+)-", "(", "\x00", "é"]  # fmt: skip
    return st.sampled_from(paths) | st.sampled_from(junk) | st.text(max_size=6)


def _valid_argv(path: tuple[str, ...], world: Path, run: Path, fresh: str) -> list[str]:
    """A call that works, so that random additions also reach the checks behind parsing."""
    base = {
        "run": ["--out", fresh, "--sts", "none"],
        "serve": ["--listen", "127.0.0.1:0", "--sts", "none"],
        "runtime-server": ["--port", "0", "--sts", "none"],
        "ingest": [str(world / "server_info.json"), "--out", fresh],
        "summary": [str(run)],
        "estimate": [str(run)],
        "calibration": [str(run)],
        "compare": [str(run), str(run), "--reps", "20"],
        "sts": [str(run), "--out", fresh],
        "cost": [str(run), "--out", fresh],
    }[path[0]]
    return [*path, *base]


@st.composite
def argvs(draw, world: Path, small_run: Path):
    path = draw(st.sampled_from(FUZZED_COMMANDS))
    flags = LEAVES[path]
    values = _values(world, small_run)
    argv = list(path)
    if draw(st.booleans()):
        fresh = str(world / "out" / f"v{draw(st.integers(0, 10**9))}")
        argv = _valid_argv(path, world, small_run, fresh)
    for _ in range(draw(st.integers(0, 6 if len(argv) == len(path) else 2))):
        kind = draw(st.sampled_from(["flag", "flag", "flag", "value", "junk_flag"]))
        if kind == "flag":
            opt, takes_value = draw(st.sampled_from(flags))
            argv.append(opt)
            if takes_value and draw(st.integers(0, 9)):
                argv.append(draw(values))
        elif kind == "value":
            argv.append(draw(values))
        else:
            argv.append(draw(st.sampled_from(["--nope", "-x", "--out=", "--gamma=3", "-"])))
    if path[0] in ("ingest", "sts", "cost", "run", "serve") and draw(st.booleans()):
        # a fresh output path most of the time, so that the commands get past "--out exists"
        argv += ["--out", str(world / "out" / f"o{draw(st.integers(0, 10**9))}")]
    if draw(st.integers(0, 19)) == 0:
        argv.insert(0, "--debug")
    return argv


@contextlib.contextmanager
def _patched_heavy_work():
    """Stop valid commands where their real work would begin; everything before runs for real."""
    from dspark_obs.calibration.sts import StsCalibration as Cal
    from dspark_obs.cli import ingest_cmd, run_cmd, runtime_server_cmd
    from dspark_obs.runtime import sts_warmup
    from dspark_obs.service import serving as serve

    def reached(*args, **kwargs):
        raise _Reached

    saved = [
        (run_cmd, "record_reference_run", run_cmd.record_reference_run),
        (sts_warmup, "warmup_sts", sts_warmup.warmup_sts),
        (serve, "Exporter", serve.Exporter),
        (runtime_server_cmd, "RuntimeFrontend", runtime_server_cmd.RuntimeFrontend),
        (ingest_cmd, "follow_file", ingest_cmd.follow_file),
    ]
    run_cmd.record_reference_run = reached
    sts_warmup.warmup_sts = lambda config, steps, **_: Cal(temperatures=[1.0] * config.gamma)
    serve.Exporter = reached
    runtime_server_cmd.RuntimeFrontend = reached
    ingest_cmd.follow_file = reached
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


@contextlib.contextmanager
def _time_limit(seconds: float):
    """A generated command that does not come back is a finding too (a hang, not a crash)."""
    import signal

    def expired(signum, frame):
        raise TimeoutError(f"command still running after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv: list[str], cwd: Path) -> tuple[int | str, str, str]:
    """main(argv) in process: (exit status or 'reached', stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)  # a default runs/... directory must never land in the checkout
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _patched_heavy_work(),
            _time_limit(20),
        ):
            try:
                status: int | str = cli_main(argv)
            except SystemExit as exc:  # argparse: 2 for usage errors, 0 for --help
                status = exc.code if isinstance(exc.code, int) else 2
            except _Reached:
                status = "reached"
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def _check_cli_outcome(argv: list[str], world: Path, fuzzing: bool = True) -> None:
    debug = "--debug" in argv
    status, _, err = run_cli(argv, world)
    if fuzzing:
        event(f"{argv[0] if not debug else argv[1]}: {status}")
    assert status in (0, 2, "reached"), (argv, status, err)
    if debug and status == 2 and "Traceback" in err:
        # --debug prints the traceback above the same one-line message and status
        err = err[err.rindex("\ndspark-obs ") + 1 :]
    assert "Traceback" not in err, (argv, err)
    if status == 2 and "usage:" not in err:
        lines = [line for line in err.split("\n") if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("dspark-obs"), (argv, err)
        assert lines[0].isprintable(), (argv, err)  # no raw control characters


@fuzz(400)
@given(data=st.data())
def test_cli_arguments_exit_0_or_2_without_traceback(cli_world, small_run, data):
    _check_cli_outcome(data.draw(argvs(cli_world, small_run)), cli_world)


@pytest.mark.parametrize(
    "argv",
    [
        ["summary", "\x85"],  # a control character in a path split the one-line error
        ["summary", "a\nb\x1b[31m"],
        ["--debug", "summary", "nowhere"],  # --debug: a traceback above the same line
    ],
)
def test_cli_regressions(cli_world, argv):
    """Inputs that broke the contract (a crash, a split error line), kept as found."""
    _check_cli_outcome(argv, cli_world, fuzzing=False)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--sts", "{world}/bad.json", "--out", "{world}/out/s"], "STS calibration"),
        (["run", "--sts", "{world}/empty", "--out", "{world}/out/s2"], "STS calibration"),
        (["run", "--cost-table", "{world}/bad.json", "--out", "{world}/out/c"], "cost table"),
        (["run", "--cost-table", "{world}/dir", "--out", "{world}/out/c2"], "cost table"),
        (["summary", "{world}/damaged_run"], "part-000001.parquet"),
        (["ingest", "{world}/empty", "--out", "{world}/out/i"], "empty"),
    ],
)
def test_cli_bad_files_in_a_real_process(cli_world, argv, needle):
    """As a user runs it: exit 2, one line on stderr naming the problem, no traceback."""
    proc = cli(*(a.format(world=cli_world) for a in argv), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr

"""`/server_info` files with hostile values: what is wrong is named, only it is refused.

A NaN, an Infinity or invalid UTF-8 in one record costs that record; more ranks than any
server has cost the extra ranks; a gamma nothing runs, or nesting beyond the decoders'
limit, is named in the error; a step counter near 2**64 or jumping near 2**53 never
becomes missing steps.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.ingest import IngestError, ingest_files
from dspark_obs.ingest.server_info_reader import ServerInfoReader
from dspark_obs.sources.workloads import workload_rule
from dspark_obs.telemetry import server_info_raw

from .conftest import cli

SAMPLE = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def sample() -> dict:
    return _sample()


@functools.cache
def _sample() -> dict:
    return json.loads(SAMPLE.read_text())


def _records(doc: dict) -> list[dict]:
    return doc["internal_states"][0]["dspark_info_record"]["records"]


#: How one value of a record is spoilt, in the file's text, and the reason it is refused for.
DAMAGE = {
    "NaN": (b'"prefix_len": ', b'"prefix_len": NaN, "x": ', "non_finite_number"),
    "Infinity": (b'"lag_steps": ', b'"lag_steps": Infinity, "x": ', "non_finite_number"),
    "-Infinity": (b'"bs": ', b'"y": -Infinity, "bs": ', "non_finite_number"),
    "utf8": (b'"rid": "', b'"rid": "\xff\xfe', "invalid_utf8"),
}


def _damaged(doc: dict, index: int, kind: str, pretty: bool) -> bytes:
    """The document with record `index` spoilt in its text (the others untouched)."""
    marker = f'"MARK{index}": 0, '
    doc = copy.deepcopy(doc)
    _records(doc)[index] = {"__mark__": None, **_records(doc)[index]}
    text = json.dumps(doc, indent=1 if pretty else None).encode()
    text = text.replace(b'"__mark__": null,', marker.encode())
    head, _, tail = text.partition(marker.encode())
    old, new, _ = DAMAGE[kind]
    assert old in tail
    return head + tail.replace(old, new, 1)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_one_spoilt_value_costs_its_record_only(data):
    sample = _sample()
    n = len(_records(sample))
    index = data.draw(st.integers(0, n - 1))
    kind = data.draw(st.sampled_from(sorted(DAMAGE)))
    pretty = data.draw(st.booleans())
    reader = ServerInfoReader(workload_rule())
    assert reader.add_document(_damaged(sample, index, kind, pretty))
    got = [b.forward_ct for b in reader.take_batches()]
    fcts = [r["forward_ct"] for r in _records(sample)]
    assert got == sorted(fcts[:index] + fcts[index + 1 :])
    reason = DAMAGE[kind][2]
    assert dict(reader.bad) == {reason: 1}
    assert f"forward_ct {fcts[index]}" in reader.problems[reason]


def test_more_ranks_than_any_server_cost_the_extra_ranks(sample, tmp_path):
    doc = copy.deepcopy(sample)
    del _records(doc)[2:]  # two steps a rank: the ranks are the point
    doc["internal_states"] = doc["internal_states"] * 258
    path = tmp_path / "ranks.json"
    path.write_text(json.dumps(doc))
    _, stats = ingest_files([path], tmp_path / "run", workload_rule())
    assert stats["ranks"] == list(range(256))
    assert stats["bad_records"] == {"too_many_ranks": 2}
    assert stats["ingested_steps"] == 256 * 2


@pytest.mark.parametrize("gamma", [0, -1, 10**9])
def test_a_gamma_nothing_runs_is_named(sample, tmp_path, gamma):
    doc = copy.deepcopy(sample)
    doc["internal_states"][0]["dspark_info_record"]["gamma"] = gamma
    path = tmp_path / "gamma.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(IngestError, match=rf"rank 0: gamma {gamma} outside 1\.\.64"):
        ingest_files([path], tmp_path / "run", workload_rule())
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["top", "record"])
def test_nesting_beyond_the_limit_is_a_clear_error(sample, tmp_path, where):
    text = json.dumps(sample)
    text = (
        f'{{"x": {DEEP}, ' + text[1:]
        if where == "top"
        else text.replace('"bs": ', f'"zz": {DEEP}, "bs": ', 1)
    )
    path = tmp_path / "deep.json"
    path.write_text(text)
    proc = cli("ingest", str(path), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"dspark-obs ingest: error: {path}: JSON nested deeper than 1,000 levels"
    )


def test_a_deeply_nested_line_costs_that_line(sample, tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text(json.dumps(sample) + "\n" + f'{{"internal_states": {DEEP}}}\n')
    _, stats = ingest_files([path], tmp_path / "run", workload_rule())
    assert stats["bad_records"] == {"too_deep": 1}
    assert stats["ingested_steps"] == len(_records(sample))


def test_step_counters_near_2_64_or_jumping_near_2_53_are_not_gaps(sample, tmp_path):
    doc = copy.deepcopy(sample)
    records = _records(doc)
    records[-1]["forward_ct"] = 2**64 - 5  # refused: outside 0..2**53
    records[-2]["forward_ct"] = 2**53 - 1  # valid, but no rank gets there step by step
    path = tmp_path / "fct.json"
    path.write_text(json.dumps(doc))
    _, stats = ingest_files([path], tmp_path / "run", workload_rule())
    assert stats["missing_steps"] == 0 and stats["forward_ct_jumps"] == 1
    assert stats["bad_records"] == {"malformed": 1}
    assert stats["ingested_steps"] == len(records) - 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 6), st.integers(1, 400))
def test_chunks_cover_every_record_once_within_their_limits(sizes, most, limit):
    records = [b"x" * n for n in sizes]
    order = np.arange(len(records))[::-1].copy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server_info_raw, "CHUNK_RECORDS", most)
        mp.setattr(server_info_raw, "CHUNK_BYTES", limit)
        cut = list(server_info_raw.chunks(records, order))
    assert (np.concatenate(cut).tolist() if cut else []) == order.tolist()
    for chunk in cut:
        total = sum(sizes[i] for i in chunk)
        assert 1 <= len(chunk) <= most
        assert total <= limit or len(chunk) == 1

"""Hostile and unlucky inputs at every reader: refused by name, counted, never a traceback.

- run directories tampered with (a part deleted, replaced by a FIFO or a link, a stray
  part, a changed count) are refused naming the part, by the library and by every
  command that reads runs (real subprocesses, one per command);
- `run.json` is validated once: bad values and deep nesting name the file and the key;
- JSON nesting is measured exactly (checked against a recursive count on generated
  documents) and limited;
- step times that are not finite times are rejected at the gate under their own reason;
  every `--json` output is strict JSON whatever floats it holds;
- SGLang's block-accept JSONL: long lines skipped in bounded memory, lines that are no
  log-probabilities or contradict gamma counted with their line number;
- the runtime-server answers 400 with a message for values its engine cannot hold, and
  stops requests whose client went away;
- `/metrics?name[]=...` serves the families named and no other.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from dspark_obs.exporters.collector import Collector
from dspark_obs.exporters.exposition import asked_names
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs import strict_json
from dspark_obs.json_files import MAX_DEPTH, check_nesting, nesting_depth
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.external import MAX_NEW_TOKENS
from dspark_obs.runtime_server import RuntimeFrontend
from dspark_obs.store import RunStoreError, open_run
from dspark_obs.telemetry.batch import InvalidBatch
from dspark_obs.telemetry.block_accept_log import MAX_LINE_BYTES, read_block_accept_jsonl

from .conftest import cli
from .test_collector import pipeline, snapshots  # noqa: F401  (a module fixture)
from .test_store import make_batches, totals, write_run

# -- run directories ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list]:
    """A closed run of 5 flushes (parts 0..4 in steps and requests)."""
    run = tmp_path_factory.mktemp("tamper") / "run"
    batches = make_batches(31, steps=30)
    write_run(run, batches)
    return run, batches


def _manifest(run: Path, **values) -> None:
    m = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**m, **values}))


def _deleted(run: Path) -> str:
    (run / "steps" / "part-000002.parquet").unlink()
    return r"steps/part-000002\.parquet: missing part: its checksum record exists"


def _deleted_with_records(run: Path) -> str:
    for table in ("steps", "requests"):
        (run / table / "part-000002.parquet").unlink()
        (run / "_checksums" / table / "part-000002.parquet.json").unlink()
    return r"missing part: part-000002\.parquet is in no table, though parts run to part-000004"


def _fifo(run: Path) -> str:
    part = run / "steps" / "part-000001.parquet"
    part.unlink()
    os.mkfifo(part)
    return r"steps/part-000001\.parquet: is a FIFO"


def _dev_zero(run: Path) -> str:
    part = run / "requests" / "part-000003.parquet"
    part.unlink()
    part.symlink_to("/dev/zero")
    return r"requests/part-000003\.parquet: is a symbolic link"


def _link_outside(run: Path) -> str:
    # a link to a byte-identical copy outside the run: its record would even match
    part = run / "steps" / "part-000000.parquet"
    outside = run.parent / "outside.parquet"
    shutil.copyfile(part, outside)
    part.unlink()
    part.symlink_to(outside)
    return r"steps/part-000000\.parquet: is a symbolic link"


def _stray(run: Path) -> str:
    for table in ("steps", "requests"):
        shutil.copyfile(run / table / "part-000001.parquet", run / table / "part-000005.parquet")
    return r"requests/part-000005\.parquet: extra part: it has no checksum record"


def _stray_with_records(run: Path) -> str:
    for table in ("steps", "requests"):
        shutil.copyfile(run / table / "part-000001.parquet", run / table / "part-000005.parquet")
        records = run / "_checksums" / table
        shutil.copyfile(records / "part-000001.parquet.json", records / "part-000005.parquet.json")
    return r"6 parts on disk, but run\.json says the run has 5: parts added"


def _record_removed(run: Path) -> str:
    (run / "_checksums" / "requests" / "part-000004.parquet.json").unlink()
    return r"requests/part-000004\.parquet: extra part"


def _table_linked(run: Path) -> str:
    shutil.move(run / "requests", run.parent / "requests-elsewhere")
    (run / "requests").symlink_to(run.parent / "requests-elsewhere")
    return r"/requests: is a symbolic link"


def _counts_changed(run: Path) -> str:
    m = json.loads((run / "run.json").read_text())
    _manifest(run, steps=m["steps"] - 1, request_steps=m["request_steps"] + 1)
    return r"/(steps|requests): \d+ rows, but run\.json says the run stored \d+: parts changed"


TAMPERING = [
    _deleted,
    _deleted_with_records,
    _fifo,
    _dev_zero,
    _link_outside,
    _stray,
    _stray_with_records,
    _record_removed,
    _table_linked,
    _counts_changed,
]


@pytest.mark.parametrize("tamper", TAMPERING, ids=lambda f: f.__name__.strip("_"))
def test_tampered_run_is_refused_naming_the_part(written, tmp_path, tamper):
    run = tmp_path / "run"
    shutil.copytree(written[0], run)
    want = tamper(run)
    r = open_run(run)
    for read in (lambda: r.steps(), lambda: r.requests(), lambda: list(r.batches())):
        with pytest.raises(RunStoreError, match=want):
            read()


def test_interrupted_flush_at_the_end_of_a_live_run_is_not_a_missing_part(written, tmp_path):
    """A writer killed mid-flush leaves records (and a requests part) of its last number."""
    run = tmp_path / "run"
    shutil.copytree(written[0], run)
    _manifest(run, complete=False)
    for table in ("steps", "requests"):
        records = run / "_checksums" / table
        shutil.copyfile(records / "part-000000.parquet.json", records / "part-000005.parquet.json")
    shutil.copyfile(run / "requests/part-000000.parquet", run / "requests/part-000005.parquet")
    r = open_run(run)
    assert r.steps().collect().height == 30
    assert r.requests().collect().height == totals(written[1])["request_steps"]
    assert len(list(r.batches())) == 30
    (run / "steps/part-000001.parquet").unlink()  # not at the end: missing, live or not
    with pytest.raises(RunStoreError, match=r"steps/part-000001\.parquet: missing part"):
        open_run(run).steps()


BAD_MANIFESTS = [
    ({"gamma": -1}, "gamma is -1, expected an integer in 1..64"),
    ({"gamma": 0}, "gamma is 0"),
    ({"gamma": 65}, "gamma is 65"),
    ({"gamma": 7.0}, "gamma is 7.0"),
    ({"gamma": True}, "gamma is True"),
    ({"gamma": "7"}, "gamma is '7'"),
    ({"steps": -1}, "steps is -1, expected a whole number >= 0"),
    ({"parts": 2**70 * 1.0}, "parts is"),
    ({"complete": "yes"}, "complete is 'yes', expected true or false"),
    ({"mode": ["compact"]}, "mode is ['compact'], expected a string"),
    ({"workloads": [1, 2]}, "workloads is not a list of names"),
    ({"config": []}, "config is list, expected an object"),
]


@pytest.mark.parametrize(("values", "message"), BAD_MANIFESTS)
def test_run_json_is_validated_once_naming_the_key(written, tmp_path, values, message):
    run = tmp_path / "run"
    shutil.copytree(written[0], run)
    _manifest(run, **values)
    with pytest.raises(RunStoreError) as err:
        open_run(run)
    assert str(err.value).startswith(f"{run / 'run.json'}: invalid run manifest: {message}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested 100000 levels deep, more than the 64"),
        (b'{"a": ' * 65 + b"1" + b"}" * 65, "JSON nested 65 levels deep"),
        (b"\xff\xfe{}", "corrupt run manifest"),
        (b"[1, 2]", "run manifest is not a JSON object"),
        ("fifo", r"run\.json: is a FIFO"),
    ],
)
def test_unusable_run_json_names_the_file(written, tmp_path, content, message):
    run = tmp_path / "run"
    shutil.copytree(written[0], run)
    (run / "run.json").unlink()
    if content == "fifo":
        os.mkfifo(run / "run.json")  # opened without blocking, refused by its type
    else:
        (run / "run.json").write_bytes(content)
    with pytest.raises(RunStoreError, match=message):
        open_run(run)


@pytest.fixture(scope="module")
def hostile_runs(compact_run, tmp_path_factory) -> dict[str, Path]:
    """The session's CLI run, copied and damaged three ways for the commands below."""
    base = tmp_path_factory.mktemp("hostile")
    runs = {name: base / name for name in ("fifo", "stray", "gamma")}
    for run in runs.values():
        shutil.copytree(compact_run[0], run)
    (runs["fifo"] / "steps" / "part-000000.parquet").unlink()
    os.mkfifo(runs["fifo"] / "steps" / "part-000000.parquet")
    shutil.copyfile(
        runs["stray"] / "requests" / "part-000000.parquet",
        runs["stray"] / "requests" / "part-000009.parquet",
    )
    _manifest(runs["gamma"], gamma=-1)
    return runs


COMMANDS = [
    ("summary", "{fifo}", r"steps/part-000000\.parquet: is a FIFO"),
    ("calibration", "{gamma}", r"run\.json: invalid run manifest: gamma is -1"),
    ("compare {ok} {stray}", None, r"requests/part-000009\.parquet: extra part"),
    ("estimate", "{stray}", r"requests/part-000009\.parquet: extra part"),
    ("report --out {out}", "{fifo}", r"is a FIFO"),
    ("sts fit --out {out}/sts.json", "{gamma}", r"gamma is -1"),
    ("cost fit --out {out}/cost.json", "{fifo}", r"is a FIFO"),
]


@pytest.mark.parametrize(("command", "run", "message"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_refuses_a_damaged_run_in_one_line(
    hostile_runs, compact_run, tmp_path, command, run, message
):
    names = {**{k: str(v) for k, v in hostile_runs.items()}, "ok": str(compact_run[0])}
    names["out"] = str(tmp_path)
    args = command.format(**names).split() + ([run.format(**names)] if run else [])
    proc = cli(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"dspark-obs {args[0]}")
    assert re.search(message, proc.stderr), proc.stderr


# -- JSON nesting ------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=30,
)


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_nesting_depth_is_the_documents_depth(value):
    """Brackets inside strings (escaped quotes included) do not count."""
    text = json.dumps(value).encode()
    assert nesting_depth(text) == _depth(value)


def test_nesting_limit_and_long_strings():
    check_nesting(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    with pytest.raises(ValueError, match=f"nested {MAX_DEPTH + 1} levels deep"):
        check_nesting(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    long = json.dumps(["[" * 100_000 + '\\"' * 1000]).encode()
    assert nesting_depth(long) == 1


# -- values: step times and strict JSON --------------------------------------------------


@pytest.mark.parametrize("value", [-1e308, -2.0, -1e-9, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["step_gpu_ms", "step_cpu_ms", "predicted_step_ms"])
def test_step_times_that_are_no_times_are_rejected(field, value):
    batch = make_batches(32, steps=1)[0]
    setattr(batch, field, value)
    with pytest.raises(InvalidBatch) as err:
        batch.validate()
    assert err.value.reason == "time_out_of_range" and field in str(err.value)
    setattr(batch, field, 0.0)
    batch.validate()


@pytest.mark.parametrize("value", [-1, -1.0])
@pytest.mark.parametrize("field", ["step_gpu_ms", "draft_gpu_ms", "predicted_step_ms"])
def test_sglangs_minus_one_is_no_value_not_a_bad_time(field, value):
    """SGLang writes -1 in a field its components do not cover (SGLANG_DSPARK.md): the
    step is kept, the field absent."""
    batch = make_batches(32, steps=1)[0]
    setattr(batch, field, value)
    batch.validate()
    assert getattr(batch, field) is None


def _strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.floats() | st.integers() | st.builds(np.float64, st.floats()),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
        max_leaves=20,
    )
)
def test_strict_json_output_parses_strictly(value):
    def expected(v):
        if isinstance(v, float):  # np.float64 included
            return float(v) if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: expected(x) for k, x in v.items()}
        if isinstance(v, list):
            return [expected(x) for x in v]
        return v

    assert _strict_loads(strict_json.dumps(value)) == expected(value)


def test_ingested_negative_time_is_counted_and_summary_is_strict(tmp_path):
    sample = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"
    dump = json.loads(sample.read_text())
    records = dump["internal_states"][0]["dspark_info_record"]["records"]
    for r in records[:5]:
        r["step_gpu_ms"] = -1e308
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(dump))
    ingest = cli("ingest", str(path), "--out", str(tmp_path / "run"))
    assert "bad records 5 (time_out_of_range 5)" in ingest.stdout, ingest.stdout
    summary = cli("summary", str(tmp_path / "run"), "--json").stdout
    assert _strict_loads(summary)["overall"]["steps"] == len(records) - 5


# -- block-accept JSONL --------------------------------------------------------------------


def _row(rid, fct, w, tail, pg=None, q=None):
    return json.dumps(
        {
            "rid": rid,
            "fct": fct,
            "w": w,
            "cl": w,
            "ct": 0,
            "trimmed_tokens": tail,
            "q_lp": q or [-0.5] * len(tail),
            **({"pg": pg} if pg else {}),
        }
    )


def test_block_accept_lines_that_lie_are_counted_by_line(tmp_path):
    gamma = 4
    lines = [
        _row("a-0", 1, 1, [5, 6, 7]),
        _row("a-1", 1, 2, [5, 6], pg=[[1, 3, math.nan, 5, 5]]),
        _row("a-2", 1, 2, [5, 6], pg=[[1, 3, 1e308, 5, 5]]),
        _row("a-3", 1, 2, [5, 6], q=[math.nan, -1.0]),
        _row("a-4", 1, 9, [5, 6, 7]),  # window past gamma: implies gamma 12
        _row("a-5", 1, 0, [5, 6, 7, 8], pg=[[1, 1, -0.1, 5, 5]]),
        '{"rid": "a-6", ' + '"x": ' + "[" * 5000 + "]" * 5000 + "}",
    ]
    path = tmp_path / "log.jsonl"
    with open(path, "w") as f:
        f.write("\n".join(lines[:3]) + "\n")
        f.write('{"rid": "big", "pad": "' + "x" * (3 * MAX_LINE_BYTES) + '"}\n')
        f.write("\n".join(lines[3:]) + "\n")
    log = read_block_accept_jsonl(path)
    assert log.gamma == gamma and log.n_blocks == 2 and log.n_lines == 8
    reasons = dict(log.bad_line_samples)
    assert log.bad_lines == 6 == len(reasons)
    assert "p_lp is NaN" in reasons[2] and "p_lp is NaN or above 0" in reasons[3]
    assert reasons[4].startswith(f"line longer than {MAX_LINE_BYTES} bytes")
    assert "q_lp is NaN" in reasons[5]
    assert reasons[6] == f"window w=9 exceeds gamma={gamma}"
    assert reasons[8] == "JSON nested too deeply"
    # the same file with gamma given: every line implying another gamma is refused too
    assert read_block_accept_jsonl(path, 3).n_blocks == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no block-accept rows in 0 lines (0 bad)"),
        ("garbage\n", "1 bad; line 1: DecodeError"),
        ("sample", "line 1: ValidationError: Object missing required field `rid`"),
    ],
)
def test_estimate_refuses_a_file_with_no_usable_line(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    if content == "sample":
        sample = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"
        path.write_bytes(json.dumps(json.loads(sample.read_text())).encode())
    else:
        path.write_text(content)
    proc = cli("estimate", "--sglang-jsonl", str(path), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr and "dspark-obs ingest" in proc.stderr


# -- runtime-server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def front():
    config = RuntimeConfig(seed=3, concurrency=[8], steps_per_level=1, max_new_tokens=256)
    with RuntimeFrontend(config, port=0, rate_limit=0) as f:
        yield f


def _post(front, body: dict) -> tuple[int, dict]:
    host, port = front.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, answer = resp.status, json.loads(resp.read())
    conn.close()
    return status, answer


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 2**64}}, "max_new_tokens"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS + 1}},
            f"outside 1..{MAX_NEW_TOKENS}",
        ),
        ({"input_ids": [2**70]}, "input_ids must be a list of integers in 0..2**63-1"),
        ({"input_ids": [[1], [2**63]]}, "input_ids"),
        ({"input_ids": [1], "rid": {"a": 1}}, "rid must be a string, got dict"),
        ({"input_ids": [[1], [2]], "rid": [["x"], "y"]}, "rid must be a string, got list"),
    ],
)
def test_values_the_engine_cannot_hold_are_400(front, body, message):
    status, answer = _post(front, body)
    assert status == 400 and message in answer["error"]["message"], answer
    status, answer = _post(front, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"input_ids": [1], "rid": "a", "rid": "b"}', "rid"),
        (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "max_new_tokens": 9}}',
         "max_new_tokens"),
    ],
    ids=["top-level", "nested"],
)  # fmt: skip
def test_a_body_giving_a_key_twice_is_400_naming_the_key(front, raw, key):
    """JSON parsers keep the first or the last of two values silently; which one a proxy in
    front kept is unknowable, so the body is refused whole, naming the key."""
    host, port = front.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/generate", raw, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    status, answer = resp.status, json.loads(resp.read())
    conn.close()
    assert status == 400, answer
    message = answer["error"]["message"]
    assert message.startswith("invalid JSON body") and f"key '{key}' given twice" in message
    status, answer = _post(front, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 4


def test_a_request_whose_client_left_is_stopped(front):
    rank = front.ranks[0]
    before = rank.aborted
    host, port = front.httpd.server_address[:2]
    body = json.dumps(
        {
            "input_ids": [3, 4],
            "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
        }
    ).encode()
    with socket.create_connection((host, port)) as sock:
        sock.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        while rank.running() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rank.running() == 1
    deadline = time.monotonic() + 30  # generous: the front checks every 0.25 s
    while (rank.running() or rank.engine.active.any()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rank.aborted == before + 1 and rank.running() == 0
    assert not rank.engine.active.any() and not rank.engine.pending


# -- /metrics?name[]= ----------------------------------------------------------------------


def _families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_name_filter_serves_the_named_families_only(pipeline):  # noqa: F811
    snaps = snapshots(pipeline)
    full = Collector().collect(*snaps).decode()
    every = sorted(_families(full))
    counter = next(n for n in every if n.endswith("_total"))
    histogram = next(n for n in every if f"{n}_bucket" in full)
    names = asked_names(
        f"name[]={every[0]}&name[]={histogram}_bucket&name[]={counter}&name[]=nope&x=1"
    )
    text = Collector().collect(*snaps, names=names).decode()
    assert _families(text) == {every[0], histogram, counter}
    for line in full.splitlines():  # the families kept are whole, byte for byte
        name = line.split()[2] if line.startswith("#") else line.split("{")[0].split()[0]
        if name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") in (
            every[0],
            histogram,
            counter,
        ):
            assert line in text
    assert asked_names("x=1") is None
    assert Collector().collect(*snaps, names=frozenset({"nope"})) == b""

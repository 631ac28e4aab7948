"""Run directories whose checksums are valid but whose Parquet is hostile.

Every part here is republished the way the writer publishes one (`publish_part`: its
checksum record matches), so only what is inside the Parquet is hostile:

- a value the gate would refuse (hypothesis: one value of one stored step, any column the
  gate checks, any value): the step is left out of every scan and of replay exactly when
  `StepBatch.validate` (the gate) refuses the same step, counted under the gate's reason;
- names longer than any client may send, a column of the wrong type, a dictionary bomb, a
  footer declaring more rows than a part may hold or more than its bytes can decode to:
  refused before decoding, by name;
- the CLI (real subprocesses): `summary`, `compare` and `estimate` leave the hostile steps
  out and say so on stderr; a part of the wrong type is one line and exit 2.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_obs.analysis.summary import summarize_run_dir
from dspark_obs.store import RunStoreError, open_run
from dspark_obs.store.layout import in_memory, on_disk
from dspark_obs.store.part_bounds import (
    MAX_PART_ROWS,
    MAX_STRING_BYTES,
    _Malformed,
    _Thrift,
    check_part_bounds,
)
from dspark_obs.store.tables import STEP_KEY, frames_to_batches
from dspark_obs.store.validate import clean
from dspark_obs.store.writer import publish_part
from dspark_obs.telemetry.batch import MODE_CODE, InvalidBatch, ceiling_rule

from .conftest import cli
from .test_store import GAMMA, make_batches, write_run

PART = "part-000001.parquet"


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("honest") / "run"
    write_run(run, make_batches(38, steps=24))
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _rewrite(run: Path, table: str, change, part: str = PART) -> None:
    """Republish `table`'s `part` as `change` makes it, with a valid checksum record."""
    path = run / table / part
    publish_part(path, change(in_memory(pl.read_parquet(path))))


def _derive(df: pl.DataFrame) -> pl.DataFrame:
    """The request table's derived columns, recomputed as the writer computes them."""
    code = np.array([MODE_CODE[m or ""] for m in df["mode"]])
    ceiling = ceiling_rule(code, df["correct_drafts"].fill_null(-1).to_numpy(), df["cap_trim"])
    return df.with_columns(
        (pl.col("verify_len") - 1).alias("window"),
        pl.Series("ceiling", ceiling).replace(-1, None),
    )


def _gate(steps: pl.DataFrame, requests: pl.DataFrame, key) -> str | None:
    """What the pipeline's gate says of the stored step `key` (None: accepted)."""
    one = steps.filter((pl.col("rank") == key[0]) & (pl.col("forward_ct") == key[1]))
    rows = requests.filter((pl.col("rank") == key[0]) & (pl.col("forward_ct") == key[1]))
    try:
        (batch,) = frames_to_batches(one, rows)
        if batch.gamma != GAMMA:
            return "gamma_mismatch"
        batch.validate()
    except InvalidBatch as exc:
        return exc.reason
    return None


REQUEST_INTS = ("req_pool_index", "verify_len", "correct_drafts", "acc_len", "cap_trim")
STEP_FLOATS = ("step_cpu_ms", "predicted_step_ms", "draft_gpu_ms", "predicted_theta")
_EDGES = [-(2**62), -(2**31), -2, -1, 0, 1, GAMMA, GAMMA + 1, GAMMA + 2, 2**31, 2**62]
_FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, -0.5, 1e15, 3.6e6, 3.7e6, 1e308]


@st.composite
def hostile_values(draw):
    table = draw(st.sampled_from(["requests", "steps", "matrix"]))
    if table == "requests":
        column = draw(st.sampled_from([*REQUEST_INTS, "shadow_ceiling"]))
        value = draw(st.sampled_from(_EDGES) | st.integers(-(2**62), 2**62))
    elif table == "steps":
        column = draw(st.sampled_from([*STEP_FLOATS, "gamma"]))
        if column == "gamma":
            value = draw(st.sampled_from(_EDGES))
        else:
            value = draw(st.sampled_from(_FLOATS) | st.floats(allow_nan=True))
    else:
        column = draw(st.sampled_from(["confidence", "survival"]))
        value = draw(st.sampled_from(_FLOATS) | st.floats(allow_nan=True))
    return table, column, value, draw(st.integers(0, 10**6))


def _mutate(df: pl.DataFrame, column: str, value, pick: int, table: str):
    """`df` with one value of one row changed; the key of the step it belongs to."""
    if table == "matrix":
        candidates = np.flatnonzero(df[column].is_not_null().to_numpy())
        if not len(candidates):
            return None, None
        row = int(candidates[pick % len(candidates)])
        mat = df[column].to_numpy().copy()
        mat[row, pick % GAMMA] = value
        changed = pl.Series(column, mat, dtype=df.schema[column])
        new = df.with_columns(  # numpy has no null rows: keep the null ones null
            pl.when(pl.col(column).is_null()).then(None).otherwise(changed).alias(column)
        )
    else:
        if table == "requests":
            candidates = np.arange(df.height)
        else:  # a step with rows, so that the gate sees the step's rows too
            candidates = np.flatnonzero(df["has_reqs"].to_numpy())
        row = int(candidates[pick % len(candidates)])
        values = df[column].to_list()
        values[row] = value
        new = df.with_columns(pl.Series(column, values, dtype=df.schema[column]))
        if table == "requests":
            new = _derive(new)
    return new, tuple(df.row(row, named=True)[k] for k in STEP_KEY)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile_values())
def test_a_stored_step_is_read_exactly_when_the_gate_accepts_it(honest, tmp_path_factory, case):
    table, column, value, pick = case
    run = _copy(honest, tmp_path_factory.mktemp("h"))
    on_disk = "requests" if table == "matrix" else table
    original = in_memory(pl.read_parquet(run / on_disk / PART))
    changed, key = _mutate(original, column, value, pick, table)
    if changed is None:
        return
    publish_part(run / on_disk / PART, changed)
    steps = pl.read_parquet(run / "steps" / PART)
    requests = in_memory(pl.read_parquet(run / "requests" / PART))
    reason = _gate(steps, requests, key)
    honest_run, r = open_run(honest), open_run(run)
    n_rows = requests.filter((pl.col("rank") == key[0]) & (pl.col("forward_ct") == key[1])).height

    # replay: every invariant, the matrices' too, as the gate
    want = [b for b in honest_run.batches() if (b.rank, b.forward_ct) != key or reason is None]
    got = list(r.batches())
    assert [(b.rank, b.forward_ct) for b in got] == [(b.rank, b.forward_ct) for b in want]

    # scans: the same steps, less the matrices, whose bad rows read as not recorded
    scan_reason = None if table == "matrix" else reason
    # the whole-run screen passes exactly the runs with nothing to leave out (so an honest
    # run's scan is one pass; a failing one is then checked flush by flush)
    parts = [in_memory(pl.scan_parquet(run / t / PART)) for t in ("steps", "requests")]
    screened = all(f.item() for f in pl.collect_all(clean(*parts, GAMMA)))
    assert screened == (scan_reason is None)
    rejected = r.rejections()
    assert dict(rejected.steps) == ({scan_reason: 1} if scan_reason else {})
    assert rejected.request_rows == (n_rows if scan_reason else 0)
    total = honest_run.requests().select(pl.len()).collect().item()
    assert r.requests().select(pl.len()).collect().item() == total - (n_rows if scan_reason else 0)
    # a part at a time (the estimator's replay) reads what the one scan reads
    assert pl.concat(r.scan_parts("requests")).collect().equals(r.requests().collect())
    # and windows of a few parts (the calibration pass) too
    windows = r.scan_windows("requests", max(1, total // 3))
    assert pl.concat(windows).collect().equals(r.requests().collect())
    assert r.steps().select(pl.len()).collect().item() == honest_run.steps().select(
        pl.len()
    ).collect().item() - (1 if scan_reason else 0)
    if table == "matrix":
        nulls = r.requests().select(pl.col(column).null_count()).collect().item()
        before = honest_run.requests().select(pl.col(column).null_count()).collect().item()
        assert nulls == before + (reason is not None)


def test_out_of_range_values_are_counted_logged_and_left_out_of_the_summary(
    honest, tmp_path, caplog
):
    run = _copy(honest, tmp_path)

    def hostile(df: pl.DataFrame) -> pl.DataFrame:
        accepted = df["correct_drafts"].to_list()
        accepted[0] = 50  # accepted > window
        committed = df["acc_len"].to_list()
        committed[-1] = -9_200_000_000_000_000_000  # another step's row
        return _derive(
            df.with_columns(pl.Series("correct_drafts", accepted), pl.Series("acc_len", committed))
        )

    _rewrite(run, "requests", hostile)
    bad = pl.read_parquet(run / "requests" / PART)
    keys = {tuple(bad.row(i, named=True)[k] for k in STEP_KEY) for i in (0, bad.height - 1)}
    assert len(keys) == 2
    with caplog.at_level(logging.WARNING, logger="dspark_obs.store.validate"):
        summary = summarize_run_dir(run)
    assert "2 stored steps and their" in caplog.text
    assert "accepted_out_of_range 1" in caplog.text and "committed_out_of_range 1" in caplog.text
    # the summary equals one computed on the honest run less those steps
    keep = ~pl.struct(STEP_KEY).is_in([dict(zip(STEP_KEY, k, strict=True)) for k in keys])
    req = open_run(honest).requests().filter(keep).collect()
    overall = summary["overall"]
    assert overall["request_steps"] == req.height
    assert overall["committed_tokens"] == req["acc_len"].sum()
    assert 0 <= overall["mean_accepted"] <= overall["mean_window"] <= GAMMA


def _long_rid(run: Path, length: int) -> None:
    def hostile(df):
        rid = df["rid"].to_list()
        rid[1] = "r" * length
        return df.with_columns(pl.Series("rid", rid, dtype=pl.String))

    _rewrite(run, "requests", hostile)


def test_a_name_longer_than_any_client_sends_rejects_its_step(honest, tmp_path):
    run = _copy(honest, tmp_path)
    _long_rid(run, 20_000)  # passes the part's bounds (its dictionary averages far less)
    r = open_run(run)
    assert dict(r.rejections().steps) == {"name_too_long": 1}
    longest = r.requests().select(pl.col("rid").str.len_bytes().max()).collect().item()
    assert longest <= MAX_STRING_BYTES
    assert all(len(x) <= MAX_STRING_BYTES for b in r.batches() for x in b.rid if x is not None)


def test_a_ten_megabyte_name_refuses_its_part_before_decoding(honest, tmp_path):
    run = _copy(honest, tmp_path)
    _long_rid(run, 10 << 20)  # compressed, a few kilobytes on disk
    assert (run / "requests" / PART).stat().st_size < 1 << 20
    message = (
        r"requests/part-000001\.parquet: malformed Parquet metadata: "
        r"a dictionary of \d+ strings inflating to \d+ bytes"
    )
    with pytest.raises(RunStoreError, match=message):
        open_run(run).requests()
    for command in ("summary", "estimate"):
        proc = cli(command, str(run), check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert re.search(message, proc.stderr), proc.stderr


def test_a_column_of_the_wrong_type_is_refused_naming_the_part(honest, tmp_path):
    run = _copy(honest, tmp_path)
    _rewrite(run, "requests", lambda df: df.with_columns(pl.col("acc_len").cast(pl.Float64)))
    with pytest.raises(
        RunStoreError, match=r"requests/part-000001\.parquet: column acc_len is Float64"
    ):
        open_run(run).requests()
    proc = cli("summary", str(run), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(
        r"requests/part-000001\.parquet: column acc_len is Float64, expected Int64", proc.stderr
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (  # one position's column of another type: the matrix has no type
            lambda df: on_disk(df).with_columns(pl.col("confidence_3").cast(pl.Int64)),
            r"column confidence is Struct\(\{.*'confidence_3': Int64.*\}\), "
            r"expected Array\(Float64",
        ),
        (  # a position short
            lambda df: on_disk(df).drop("survival_6"),
            r"column survival is Array\(Float64, shape=\(6,\)\), "
            r"expected Array\(Float64, shape=\(7,\)\)",
        ),
    ],
)
def test_a_matrix_of_the_wrong_columns_is_refused_naming_the_part(
    honest, tmp_path, change, message
):
    """A part of the new layout (a column a matrix position, `store/layout.py`) whose
    columns make no matrix of the table's type and width."""
    run = _copy(honest, tmp_path)
    assert open_run(run).gamma == 7
    _rewrite(run, "requests", change)
    with pytest.raises(RunStoreError, match=rf"requests/part-000001\.parquet: {message}"):
        open_run(run).requests()
    proc = cli("summary", str(run), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(message, proc.stderr), proc.stderr


def test_a_dictionary_bomb_is_refused_before_decoding(honest, tmp_path):
    run = _copy(honest, tmp_path)
    bomb = "w" * (2 << 20)  # one entry of 2 MiB; every row refers to it

    _rewrite(run, "requests", lambda df: df.with_columns(pl.lit(bomb).alias("workload")))
    part = run / "requests" / PART
    assert part.stat().st_size < 256 << 10
    message = (
        r"requests/part-000001\.parquet: malformed Parquet metadata: a dictionary of 1 "
        r"strings inflating to \d+ bytes, more than 4096 bytes a string"
    )
    with pytest.raises(RunStoreError, match=message):
        check_part_bounds(part)
    proc = cli("summary", str(run), check=False)
    assert proc.returncode == 2 and "a dictionary of 1 strings" in proc.stderr, proc.stderr


def _declare_rows(part: Path, rows: int) -> None:
    """Rewrite `part`'s footer so that it and its one row group declare `rows` rows."""
    data = part.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]
    old = _Thrift(footer).struct()[3]

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    # the file's and the row group's row counts: an i64 field (type 6) one after the last
    new = footer.replace(b"\x16" + varint(2 * old), b"\x16" + varint(2 * rows))
    meta = _Thrift(new).struct()
    assert meta[3] == rows and [g[3] for g in meta[4]] == [rows]
    body = data[: -8 - length] + new + len(new).to_bytes(4, "little") + b"PAR1"
    part.unlink()
    publish_part_bytes(part, body)


def publish_part_bytes(part: Path, body: bytes) -> None:
    """Publish `body` as `part` with its checksum record, as the writer publishes a part."""
    from dspark_obs.store.checksums import checksum_path, checksum_record

    checksum_path(part).write_bytes(checksum_record(body))
    part.write_bytes(body)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (7_000_000_000, rf"declares 7000000000 rows, more than the {MAX_PART_ROWS} a part may"),
        (MAX_PART_ROWS // 2, r"would take \d+ bytes to decode from \d+ bytes, more than the"),
    ],
    ids=["more-than-a-part-holds", "more-than-its-bytes-decode-to"],
)
def test_a_declared_row_count_is_bounded_before_decoding(honest, tmp_path, rows, message):
    run = _copy(honest, tmp_path)
    _declare_rows(run / "steps" / PART, rows)
    with pytest.raises(RunStoreError, match=r"steps/part-000001\.parquet: " + message):
        list(open_run(run).batches())
    proc = cli("estimate", str(run), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(message, proc.stderr), proc.stderr


# -- the CLI -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_cli_run(compact_run, tmp_path_factory) -> tuple[Path, set]:
    """The session's CLI run with accepted > window in one step and committed -9.2e18 in
    another; the keys of those steps."""
    run = tmp_path_factory.mktemp("hostile-cli") / "run"
    shutil.copytree(compact_run[0], run)
    part = sorted((run / "requests").glob("part-*.parquet"))[0]
    df = pl.read_parquet(part)
    accepted, committed = df["correct_drafts"].to_list(), df["acc_len"].to_list()
    accepted[0] = 40
    last = df.height - 1
    committed[last] = -9_200_000_000_000_000_000
    publish_part(
        part,
        _derive(
            df.with_columns(pl.Series("correct_drafts", accepted), pl.Series("acc_len", committed))
        ),
    )
    keys = {tuple(df.row(i, named=True)[k] for k in STEP_KEY) for i in (0, last)}
    return run, keys


def test_summary_and_compare_leave_hostile_steps_out_and_say_so(compact_run, hostile_cli_run):
    run, keys = hostile_cli_run
    proc = cli("summary", str(run), "--json")
    assert f"{len(keys)} stored steps and their" in proc.stderr
    assert "accepted_out_of_range 1" in proc.stderr and "committed_out_of_range 1" in proc.stderr
    overall = json.loads(proc.stdout)["overall"]
    assert 0 <= overall["mean_accepted"] <= overall["mean_window"]
    assert overall["utilisation"] is None or overall["utilisation"] <= 1
    assert overall["committed_tokens"] >= 0
    honest = json.loads(cli("summary", str(compact_run[0]), "--json").stdout)["overall"]
    rows = (
        pl.scan_parquet(str(compact_run[0] / "requests" / "*.parquet"))
        .filter(pl.struct(STEP_KEY).is_in([dict(zip(STEP_KEY, k, strict=True)) for k in keys]))
        .collect()
    )
    assert overall["request_steps"] == honest["request_steps"] - rows.height
    assert overall["committed_tokens"] == honest["committed_tokens"] - rows["acc_len"].sum()
    proc = cli("compare", str(compact_run[0]), str(run), "--json")
    assert "accepted_out_of_range 1" in proc.stderr and "Traceback" not in proc.stderr


def test_estimate_replays_without_the_hostile_steps(hostile_cli_run):
    run, _ = hostile_cli_run
    proc = cli("estimate", str(run), "--json", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "accepted_out_of_range 1" in proc.stderr and "Traceback" not in proc.stderr


# -- the metadata reader: compiled and Python forms alike, bounded on any bytes ---------------


def _footer_of(part: Path) -> bytes:
    data = part.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length : -8]


def _both_forms(data: bytes) -> list[tuple[str, object]]:
    """What the compiled reader (where built) and the Python one make of `data`."""
    out = []
    for read in (lambda t: t.struct(), lambda t: t.read_struct()):
        try:
            out.append(("ok", read(_Thrift(data))))
        except _Malformed as exc:
            out.append(("malformed", str(exc)))
    return out


def test_the_compiled_metadata_reader_is_the_python_one(honest):
    for table in ("steps", "requests"):
        footer = _footer_of(honest / table / PART)
        compiled, python = _both_forms(footer)
        assert compiled == python and compiled[0] == "ok"
        assert python[1][3] == pl.read_parquet(honest / table / PART).height


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_mutated_metadata_reads_alike_in_both_forms_or_is_malformed(honest, data):
    footer = bytearray(_footer_of(honest / "requests" / PART))
    cut = data.draw(st.integers(1, len(footer)))
    footer = footer[:cut]
    for _ in range(data.draw(st.integers(0, 8))):
        footer[data.draw(st.integers(0, len(footer) - 1))] = data.draw(st.integers(0, 255))
    compiled, python = _both_forms(bytes(footer))
    assert compiled == python


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes([0x19]) * 100_000 + b"\x00", "metadata nested too deeply"),  # lists of lists
        (b"\x1c" * 100 + b"\x00", "metadata nested too deeply"),  # structs in structs
        (b"\x15" + b"\xff" * 9 + b"\x02" + b"\x00", "varint too long"),  # past 64 bits
        (b"\x15" + b"\x80" * 11 + b"\x00", "varint too long"),
        (b"\x05" + b"\x80\x80\x04" + b"\x00\x00", "field id out of range"),
        (b"\x18\x7f", "string longer than the metadata"),
        (b"\x19\xf5\xff\xff\x03", "list longer than the metadata"),
        (b"\x1d", "unknown field type 13"),
        (b"\x15\x02", "metadata ends early"),
    ],
    ids=["nested-lists", "nested-structs", "varint-bits", "varint-bytes", "field-id",
         "string", "list", "type", "short"],
)  # fmt: skip
def test_metadata_that_is_no_struct_is_malformed_in_both_forms(data, message):
    """Each is `malformed Parquet metadata` naming the part; a list of lists nested 100,000
    deep was a RecursionError (a traceback from every reader) before lists counted depth."""
    assert _both_forms(data) == [("malformed", message)] * 2

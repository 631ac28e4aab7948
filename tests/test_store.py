"""The run store must hand every consumer exactly what the producer appended.

Numbers are checked against totals computed straight from the numpy batches,
through three independent readers (polars, pandas/pyarrow, DuckDB), and the
full batches -> Parquet -> batches round trip is compared field by field.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from dspark_obs.store import Run, RunStoreError, RunWriter, checksums, open_run
from dspark_obs.store import writer as writer_module
from dspark_obs.store.layout import in_memory
from dspark_obs.store.tables import batches_to_frames, frames_to_batches, requests_schema
from dspark_obs.store.writer import STORE_VERSION
from dspark_obs.telemetry.batch import (
    MATRIX_COLUMNS,
    MODES,
    REQUEST_COLUMNS,
    StepBatch,
)

GAMMA = 7


def make_batch(
    rng: np.random.Generator,
    forward_ct: int,
    *,
    rank: int = 0,
    mode: str = "compact",
    bs: int = 4,
    has_reqs: bool = True,
    missing: frozenset[str] = frozenset(),
    gamma: int = GAMMA,
) -> StepBatch:
    """A valid random step; `missing` names matrices the 'source' did not record."""
    n = bs if has_reqs else 0
    verify_len = rng.integers(1, gamma + 2, n)
    window = verify_len - 1
    correct = (rng.random(n) * (window + 1)).astype(np.int64)
    if mode == "cap-accept":
        cap_trim = (rng.random(n) * (gamma - correct + 1)).astype(np.int64)
    else:
        cap_trim = np.zeros(n, np.int64)
    temperature = rng.choice([0.0, 0.7, 1.0, np.nan], n)
    bonus_lp = np.where(rng.random(n) < 0.3, np.nan, -rng.random(n))
    shadow = np.where(rng.random(n) < 0.5, -1, rng.integers(0, gamma + 1, n))
    rid = np.array([f"r{forward_ct}-{i}" if i % 5 else None for i in range(n)], dtype=object)
    workload = np.array(
        [["gsm8k", "arena-hard", "poetry", None][i % 4] for i in range(n)], dtype=object
    )
    opt = rng.random() < 0.5
    b = StepBatch(
        forward_ct=forward_ct,
        gamma=gamma,
        mode=mode,
        rank=rank,
        bs=bs if rng.random() < 0.8 else -1,
        budget=int(rng.integers(0, 64)) if opt else None,
        lag_steps=int(rng.integers(0, 3)) if opt else None,
        num_running_reqs=bs,
        num_verify_tokens=int(verify_len.sum()),
        verify_tokens_local=int(verify_len.sum()),
        predicted_step_ms=float(rng.random() * 20) if opt else None,
        predicted_theta=float(rng.random()) if rng.random() < 0.5 else None,
        step_cpu_ms=float(rng.random()),
        step_gpu_ms=None,
        draft_gpu_ms=float(rng.random()) if opt else None,
        has_reqs=has_reqs,
        rid=rid,
        workload=workload,
        req_pool_index=rng.integers(0, 512, n),
        prefix_len=rng.integers(10, 4000, n),
        verify_len=verify_len,
        correct_drafts=correct,
        acc_len=correct + 1,
        cap_trim=cap_trim,
        bonus_token=rng.integers(0, 150_000, n),
        greedy=rng.integers(-1, 2, n).astype(np.int8),
        temperature=temperature,
        shadow_ceiling=shadow,
        bonus_logprob=bonus_lp,
    )
    for name, dtype in MATRIX_COLUMNS.items():
        if name in missing or n == 0:  # no rows: on disk nothing tells empty from missing
            continue
        if dtype is np.int64:
            mat = rng.integers(0, 150_000, (n, gamma))
        else:
            mat = rng.random((n, gamma))
            if name not in ("confidence", "survival"):  # probabilities must be numbers
                mat[rng.random((n, gamma)) < 0.05] = np.nan  # recorded NaN, distinct from null
        setattr(b, name, mat)
    b.validate()
    return b


def make_batches(seed: int = 0, steps: int = 40) -> list[StepBatch]:
    """A mixed run: two ranks, all modes, step-only records, zero-row steps, missing matrices."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(steps):
        kind = i % 10
        missing = frozenset(n for n in MATRIX_COLUMNS if rng.random() < 0.3)
        if kind == 3:  # a step the source recorded without its requests
            b = make_batch(rng, i // 2, rank=i % 2, bs=int(rng.integers(0, 9)), has_reqs=False)
        elif kind == 7:  # a step that really had no requests
            b = make_batch(rng, i // 2, rank=i % 2, bs=0, missing=frozenset(MATRIX_COLUMNS))
        else:
            b = make_batch(
                rng,
                i // 2,
                rank=i % 2,
                mode=MODES[i % 3],
                bs=int(rng.integers(1, 33)),
                missing=missing,
            )
        out.append(b)
    return out


def assert_batches_equal(got: list[StepBatch], want: list[StepBatch]) -> None:
    """Field-by-field equality, dtype included, NaN equal to NaN."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for f in fields(StepBatch):
            a, b = getattr(g, f.name), getattr(w, f.name)
            where = f"batch {i} (forward_ct={w.forward_ct}) field {f.name}"
            if isinstance(b, np.ndarray):
                assert isinstance(a, np.ndarray), where
                assert a.dtype == b.dtype, f"{where}: {a.dtype} != {b.dtype}"
                assert a.shape == b.shape, where
                if b.dtype == object:
                    assert a.tolist() == b.tolist(), where
                else:
                    assert np.array_equal(a, b, equal_nan=b.dtype.kind == "f"), where
            elif b is None:
                assert a is None, f"{where}: {a!r} is not None"
            elif isinstance(b, float) and np.isnan(b):
                assert isinstance(a, float) and np.isnan(a), where
            else:
                assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def totals(batches: list[StepBatch]) -> dict[str, int]:
    """The independent answer every reader must reproduce."""
    return {
        "request_steps": sum(b.num_reqs for b in batches),
        "correct_drafts": int(sum(b.correct_drafts.sum() for b in batches)),
        "greedy_null": int(sum((b.greedy == -1).sum() for b in batches)),
        "shadow_null": int(sum((b.shadow_ceiling == -1).sum() for b in batches)),
        "window": int(sum((b.verify_len - 1).sum() for b in batches)),
        "ceiling": int(sum(np.where(b.ceiling >= 0, b.ceiling, 0).sum() for b in batches)),
        "draft_null": sum(b.num_reqs for b in batches if b.draft_tokens is None),
        "draft_sum": int(sum(b.draft_tokens.sum() for b in batches if b.draft_tokens is not None)),
    }


def write_run(path: Path, batches: list[StepBatch], **kw) -> None:
    with RunWriter(path, {"gamma": GAMMA, "mode": "mixed"}, flush_steps=6, **kw) as w:
        for b in batches:
            w.append(b)


# -- tables -------------------------------------------------------------------------


def test_frames_use_nulls_not_sentinels():
    batches = make_batches(1)
    steps, reqs = batches_to_frames(batches)
    t = totals(batches)
    assert steps.height == len(batches)
    assert steps.columns[:5] == ["rank", "forward_ct", "mode", "gamma", "has_reqs"]
    assert steps["budget"].null_count() == sum(b.budget is None for b in batches)
    assert steps["step_gpu_ms"].null_count() == len(batches)
    assert reqs.height == t["request_steps"]
    assert reqs.schema == requests_schema(GAMMA)
    assert reqs.schema["draft_tokens"] == pl.Array(pl.Int64, GAMMA)
    assert reqs.schema["greedy"] == pl.Boolean
    assert reqs["greedy"].null_count() == t["greedy_null"]
    assert reqs["shadow_ceiling"].null_count() == t["shadow_null"]
    assert reqs["temperature"].null_count() == sum(np.isnan(b.temperature).sum() for b in batches)
    assert reqs["temperature"].is_nan().sum() == 0
    assert reqs["window"].sum() == t["window"]
    # compact censors the ceiling: null there, observed elsewhere
    compact_rows = sum(b.num_reqs for b in batches if b.mode == "compact")
    assert reqs["ceiling"].null_count() == compact_rows
    assert reqs["ceiling"].sum() == t["ceiling"]
    # a missing matrix is null rows, and a recorded NaN stays NaN inside the array
    assert reqs["draft_tokens"].null_count() == t["draft_null"]
    assert reqs["draft_tokens"].explode().drop_nulls().sum() == t["draft_sum"]
    lp_nans = sum(
        np.isnan(b.target_logprobs).sum() for b in batches if b.target_logprobs is not None
    )
    assert lp_nans > 0
    assert reqs["target_logprobs"].explode().is_nan().sum() == lp_nans


def test_frames_round_trip_in_memory():
    batches = make_batches(2)
    steps, reqs = batches_to_frames(batches)
    assert_batches_equal(frames_to_batches(steps, reqs), batches)


def test_round_trip_regroups_interleaved_request_rows():
    """Other writers (a DuckDB export, a sort) may interleave steps; regrouping must not care."""
    batches = make_batches(3)
    steps, reqs = batches_to_frames(batches)
    perm = np.random.default_rng(0).permutation(reqs.height)
    interleaved = (
        reqs.with_columns(pos=pl.Series(perm))
        # rows of one step keep their relative order, steps are mixed together
        .with_columns(pl.col("pos").sort().over(["rank", "forward_ct"]))
        .sort("pos")
        .drop("pos")
    )
    assert not interleaved["forward_ct"].equals(reqs["forward_ct"])
    assert_batches_equal(frames_to_batches(steps, interleaved), batches)


def test_orphan_request_rows_are_an_error():
    batches = make_batches(4, steps=6)
    steps, reqs = batches_to_frames(batches)
    with pytest.raises(RunStoreError, match="no matching step"):
        frames_to_batches(steps.head(1), reqs)


# -- writer + readers ---------------------------------------------------------------


def test_written_run_reads_back_through_polars_pandas_duckdb(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(5, steps=50)
    write_run(run, batches)
    t = totals(batches)

    steps_parts = sorted((run / "steps").glob("part-*.parquet"))
    req_parts = sorted((run / "requests").glob("part-*.parquet"))
    assert len(steps_parts) == len(req_parts) == -(-len(batches) // 6)  # ceil
    assert not list(run.rglob("*.tmp"))

    manifest = json.loads((run / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["gamma"] == GAMMA and manifest["mode"] == "mixed"
    assert manifest["steps"] == len(batches)
    assert manifest["request_steps"] == t["request_steps"]
    assert manifest["parts"] == len(steps_parts)

    # polars, straight from the files
    reqs = pl.scan_parquet(str(run / "requests" / "*.parquet")).collect()
    assert reqs.height == t["request_steps"]
    assert reqs["correct_drafts"].sum() == t["correct_drafts"]
    assert reqs["greedy"].null_count() == t["greedy_null"]
    # a matrix is a column a position (docs/store.md), null in every one where not recorded
    assert [c for c in reqs.columns if c.startswith("draft_tokens")] == [
        f"draft_tokens_{j}" for j in range(GAMMA)
    ]
    for j in range(GAMMA):
        assert reqs[f"draft_tokens_{j}"].null_count() == t["draft_null"]
    assert pl.scan_parquet(str(run / "steps" / "*.parquet")).collect().height == len(batches)

    # pandas via pyarrow
    pdf = pd.read_parquet(run / "requests")
    assert len(pdf) == t["request_steps"]
    assert int(pdf["correct_drafts"].sum()) == t["correct_drafts"]
    assert int(pdf["shadow_ceiling"].isna().sum()) == t["shadow_null"]
    assert int(pdf["draft_tokens_0"].isna().sum()) == t["draft_null"]

    # duckdb
    count, total = duckdb.sql(
        f"select count(*), sum(correct_drafts) from '{run}/requests/*.parquet'"
    ).fetchall()[0]
    assert (count, int(total)) == (t["request_steps"], t["correct_drafts"])
    (null_greedy,) = duckdb.sql(
        f"select count(*) from '{run}/requests/*.parquet' where greedy is null"
    ).fetchall()[0]
    assert null_greedy == t["greedy_null"]

    # our reader
    r = open_run(run)
    assert isinstance(r, Run) and r.complete and r.path == run
    assert (
        r.requests().select(pl.col("correct_drafts").sum()).collect().item() == t["correct_drafts"]
    )
    assert r.steps().select(pl.len()).collect().item() == len(batches)
    assert r.tables() == ["requests", "steps"]


def test_full_round_trip_through_parquet(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(6, steps=60)
    write_run(run, batches)
    assert_batches_equal(list(open_run(run).batches()), batches)


def test_second_writer_refuses_then_resumes_numbering(tmp_path):
    run = tmp_path / "run"
    first, second = make_batches(7, steps=20), make_batches(8, steps=20)
    for b in second:  # later steps of the same run
        b.forward_ct += 1000
    write_run(run, first)
    before = sorted(p.name for p in (run / "steps").glob("part-*.parquet"))
    assert before[-1] == "part-000003.parquet"

    with pytest.raises(RunStoreError, match="already holds a run"):
        RunWriter(run, {"gamma": GAMMA})
    assert sorted(p.name for p in (run / "steps").glob("part-*.parquet")) == before

    write_run(run, second, resume=True)
    after = sorted(p.name for p in (run / "steps").glob("part-*.parquet"))
    assert after[: len(before)] == before
    assert after[len(before)] == "part-000004.parquet"
    assert after[-1] == "part-000007.parquet"

    manifest = json.loads((run / "run.json").read_text())
    assert manifest["complete"] is True
    assert manifest["steps"] == 40
    assert manifest["request_steps"] == totals(first + second)["request_steps"]
    assert manifest["parts"] == 8
    assert_batches_equal(list(open_run(run).batches()), first + second)


def test_resume_discards_debris_of_a_crashed_flush(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(9, steps=12)
    write_run(run, batches)
    # a writer killed in a flush after publishing requests but before steps, plus a half file
    _set_manifest(run, complete=False)
    (run / "requests" / "part-000002.parquet").write_bytes(
        (run / "requests" / "part-000000.parquet").read_bytes()
    )
    (run / "_checksums" / "requests" / "part-000002.parquet.json").write_bytes(
        (run / "_checksums" / "requests" / "part-000000.parquet.json").read_bytes()
    )
    (run / "steps" / "part-000002.parquet.tmp").write_bytes(b"PAR1 half a file")
    r = open_run(run)
    assert r.requests().select(pl.len()).collect().item() == totals(batches)["request_steps"]
    assert_batches_equal(list(r.batches()), batches)

    with RunWriter(run, {}, resume=True) as w:
        assert w.counts["steps"] == len(batches)
    assert not list(run.rglob("*.tmp"))
    assert not (run / "requests" / "part-000002.parquet").exists()


def test_reader_ignores_stray_tmp_part(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(10, steps=20)
    write_run(run, batches)
    for table in ("steps", "requests"):
        (run / table / "part-999999.parquet.tmp").write_bytes(b"not parquet at all")
    r = open_run(run)
    assert r.steps().select(pl.len()).collect().item() == len(batches)
    assert (
        r.requests().select(pl.col("correct_drafts").sum()).collect().item()
        == totals(batches)["correct_drafts"]
    )
    assert_batches_equal(list(r.batches()), batches)
    count, _ = duckdb.sql(
        f"select count(*), sum(correct_drafts) from '{run}/requests/*.parquet'"
    ).fetchall()[0]
    assert count == totals(batches)["request_steps"]


def test_time_bound_flushes_without_reaching_step_bound(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(11, steps=5)
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=1000, flush_seconds=0.0) as w:
        for i, b in enumerate(batches):
            w.append(b)
            assert w.buffered_steps == 0
            assert len(list((run / "steps").glob("part-*.parquet"))) == i + 1
            # readable while still being written, and marked incomplete
            assert open_run(run).complete is False
    assert json.loads((run / "run.json").read_text())["parts"] == 5


def test_time_bound_is_the_age_of_the_oldest_buffered_step(tmp_path, monkeypatch):
    """`flush_seconds` on a clock the test moves: a part exactly when the oldest buffered
    step is S old (checked as steps arrive), never before, whatever the machine's pace."""
    now = [100.0]
    monkeypatch.setattr(writer_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    run = tmp_path / "run"

    def parts() -> int:
        return len(list((run / "steps").glob("part-*.parquet")))

    batches = make_batches(13, steps=6)
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=1000, flush_seconds=5.0) as w:
        w.append(batches[0])  # the oldest buffered step, at t = 100
        for b, t in zip(batches[1:3], (102.0, 104.999), strict=True):
            now[0] = t
            w.append(b)
            assert parts() == 0 and w.buffered_steps > 0
        now[0] = 105.0  # S after the oldest: this step's arrival publishes all four
        w.append(batches[3])
        assert parts() == 1 and w.buffered_steps == 0
        now[0] = 109.0  # the next oldest arrives 4 s later: its clock starts then
        w.append(batches[4])
        now[0] = 113.9
        w.append(batches[5])
        assert parts() == 1
    assert open_run(run).complete and parts() == 2


def test_exception_flushes_but_leaves_run_incomplete(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(12, steps=9)
    with pytest.raises(RuntimeError, match="producer died"):
        with RunWriter(run, {"gamma": GAMMA}, flush_steps=100) as w:
            for b in batches:
                w.append(b)
            raise RuntimeError("producer died")
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["complete"] is False
    assert manifest["steps"] == len(batches)
    assert_batches_equal(list(open_run(run).batches()), batches)


def test_extra_table_and_close_manifest(tmp_path):
    run = tmp_path / "run"
    batches = make_batches(13, steps=10)
    est = pl.DataFrame({"rid": ["a", "b", "c"], "lo": [1.0, 2.0, 3.0], "hi": [2.0, 3.0, 4.0]})
    w = RunWriter(run, {"gamma": GAMMA}, flush_steps=4)
    for b in batches:
        w.append(b)
    w.write_rows("estimates", est.head(2))
    w.write_rows("estimates", est.tail(1))
    with pytest.raises(RunStoreError, match="schema"):
        w.write_rows("estimates", est.select("rid"))
    with pytest.raises(RunStoreError):
        w.write_rows("steps", est)
    with pytest.raises(RunStoreError):
        w.write_rows("../escape", est)
    w.close({"workloads": ["gsm8k"], "note": "done"})
    w.close()  # idempotent
    with pytest.raises(RunStoreError, match="closed"):
        w.append(batches[0])

    r = open_run(run)
    assert r.manifest["workloads"] == ["gsm8k"] and r.manifest["complete"] is True
    assert r.scan("estimates").collect().equals(est)
    assert r.tables() == ["estimates", "requests", "steps"]


def test_append_refuses_bad_batches_without_losing_the_buffer(tmp_path):
    run = tmp_path / "run"
    rng = np.random.default_rng(14)
    good = [make_batch(rng, i) for i in range(3)]
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=100) as w:
        w.append(good[0])
        with pytest.raises(RunStoreError, match="gamma"):
            w.append(make_batch(rng, 50, gamma=5))
        bad = make_batch(rng, 51)
        bad.correct_drafts = bad.correct_drafts[:-1]
        with pytest.raises(RunStoreError, match="correct_drafts"):
            w.append(bad)
        w.append(good[1])
        w.append(good[2])
    assert_batches_equal(list(open_run(run).batches()), good)


def test_unconvertible_batch_is_dropped_and_counted(tmp_path):
    run = tmp_path / "run"
    rng = np.random.default_rng(15)
    batches = [make_batch(rng, i) for i in range(4)]
    batches[2].rid = np.array([1, 2, 3, 4], dtype=object)  # not strings
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=100) as w:
        for b in batches:
            w.append(b)
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["dropped_steps"] == 1 and manifest["steps"] == 3
    assert_batches_equal(list(open_run(run).batches()), [batches[i] for i in (0, 1, 3)])


def test_repeated_step_key_goes_to_next_part(tmp_path):
    run = tmp_path / "run"
    rng = np.random.default_rng(16)
    a, b = make_batch(rng, 5), make_batch(rng, 5)
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=100) as w:
        w.append(a)
        w.append(b)
    assert len(open_run(run).parts("steps")) == 2
    assert_batches_equal(list(open_run(run).batches()), [a, b])


def test_open_run_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(RunStoreError, match=str(missing)):
        open_run(missing)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunStoreError, match="missing run manifest"):
        open_run(empty)

    (empty / "run.json").write_text("{not json")
    with pytest.raises(RunStoreError, match="corrupt"):
        open_run(empty)
    (empty / "run.json").write_text("[1, 2]")
    with pytest.raises(RunStoreError, match="not a JSON object"):
        open_run(empty)

    run = tmp_path / "run"
    RunWriter(run, {"gamma": GAMMA}).close()
    r = open_run(run)
    assert r.manifest["steps"] == 0
    with pytest.raises(RunStoreError, match="no parts") as err:
        r.steps()
    assert str(run / "steps") in str(err.value)
    with pytest.raises(RunStoreError, match="no parts"):
        r.scan("estimates")
    assert isinstance(err.value, ValueError)


def test_writer_refuses_parts_without_manifest(tmp_path):
    run = tmp_path / "run"
    write_run(run, make_batches(17, steps=4))
    os.remove(run / "run.json")
    with pytest.raises(RunStoreError, match=r"no run\.json"):
        RunWriter(run, {})


def test_step_only_run_has_empty_requests_table(tmp_path):
    run = tmp_path / "run"
    rng = np.random.default_rng(18)
    batches = [make_batch(rng, i, bs=8, has_reqs=False) for i in range(5)]
    write_run(run, batches)
    r = open_run(run)
    assert r.requests().collect().height == 0
    assert r.requests().collect_schema() == requests_schema(GAMMA)
    assert_batches_equal(list(r.batches()), batches)


@pytest.mark.parametrize("rows", [7, 50, 120, 10_000])
def test_windows_are_the_scan_in_order_each_within_its_rows(tmp_path, rows):
    """Whole parts together while they fit, a larger part in slices, an empty part
    anywhere: the windows, one after another, are the table's one scan."""
    run = tmp_path / "run"
    rng = np.random.default_rng(19)
    batches = [make_batch(rng, i, bs=int(rng.integers(1, 30)), has_reqs=not 12 <= i < 18)
               for i in range(40)]  # fmt: skip
    write_run(run, batches)
    r = open_run(run)
    sizes = [pl.scan_parquet(p).select(pl.len()).collect().item() for p in r.parts("requests")]
    assert 0 in sizes and max(sizes) > 50  # an empty part, and parts that 50 rows cut
    windows = [w.collect() for w in r.scan_windows("requests", rows)]
    assert all(0 < w.height <= rows for w in windows[:-1]) and windows[-1].height <= rows
    assert pl.concat(windows).equals(r.requests().collect())
    whole = sum(sizes) <= rows
    assert len(windows) == 1 if whole else len(windows) >= sum(sizes) // rows


@pytest.mark.parametrize("name", sorted(REQUEST_COLUMNS))
def test_restored_request_dtypes(name):
    batches = make_batches(19, steps=10)
    back = frames_to_batches(*batches_to_frames(batches))
    for b in back:
        if b.num_reqs:
            want = np.dtype(REQUEST_COLUMNS[name])
            assert getattr(b, name).dtype == want


# -- part checksums ---------------------------------------------------------------------


def _records(run: Path) -> dict[str, dict]:
    return {
        f"{p.parent.name}/{p.name}": json.loads(p.read_text())
        for p in (run / "_checksums").glob("*/*")
    }


def _written_with_extra_table(run: Path) -> list[StepBatch]:
    batches = make_batches(20, steps=20)
    with RunWriter(run, {"gamma": GAMMA}, flush_steps=6) as w:
        for i, b in enumerate(batches):
            w.append(b)
            w.write_rows("estimates", pl.DataFrame({"forward_ct": [b.forward_ct], "i": [i]}))
    return batches


def test_every_part_has_a_checksum_record(tmp_path):
    run = tmp_path / "run"
    _written_with_extra_table(run)
    parts = sorted(run.glob("*/part-*.parquet"))
    assert len(parts) == 3 * 4  # three tables, a part per flush of 6 of the 20 steps
    want = {
        f"{p.parent.name}/{p.name}.json": {
            "size": p.stat().st_size,
            "crc32": zlib.crc32(p.read_bytes()),
        }
        for p in parts
    }
    assert _records(run) == want
    assert not list(run.rglob("*.tmp"))
    # table directories hold nothing but parts: any tool reads one as a Parquet dataset
    for table in ("steps", "requests", "estimates"):
        assert {p.suffix for p in (run / table).iterdir()} == {".parquet"}
        assert (
            pl.scan_parquet(run / table).collect().height == pd.read_parquet(run / table).shape[0]
        )
    assert open_run(run).tables() == ["estimates", "requests", "steps"]


def _set_manifest(run: Path, **values) -> None:
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**manifest, **values}))


@pytest.mark.parametrize("keep", ["none", "some"])
def test_parts_without_checksum_records_still_read(tmp_path, keep):
    """Runs written before every part had a checksum record read unverified."""
    run = tmp_path / "run"
    batches = _written_with_extra_table(run)
    _set_manifest(run, store_version=1)
    if keep == "none":
        shutil.rmtree(run / "_checksums")
    else:
        for record in (run / "_checksums").glob("*/part-00000[13].parquet.json"):
            record.unlink()
    r = open_run(run)
    assert_batches_equal(list(r.batches()), batches)
    assert r.scan("estimates").select(pl.col("i").sum()).collect().item() == sum(range(20))


def test_truncated_replaced_or_flipped_part_is_damaged(tmp_path):
    run = tmp_path / "run"
    write_run(run, make_batches(21, steps=20))
    part1 = run / "requests" / "part-000001.parquet"
    original = part1.read_bytes()

    def damaged(match: str) -> None:
        r = open_run(run)
        with pytest.raises(RunStoreError, match=match) as err:
            r.requests()
        assert str(err.value).startswith(f"{part1}: damaged: ")
        with pytest.raises(RunStoreError, match=match):
            list(open_run(run).batches())

    part1.write_bytes(original[: len(original) // 2])
    damaged(rf"{len(original) // 2} bytes, its checksum record says {len(original)} ")
    part1.write_bytes((run / "requests" / "part-000000.parquet").read_bytes())  # valid Parquet
    damaged("truncated or replaced")
    flipped = bytearray(original)
    flipped[len(flipped) // 3] ^= 0x10
    part1.write_bytes(bytes(flipped))
    damaged(
        f"CRC-32 {zlib.crc32(flipped):08x}, its checksum record says {zlib.crc32(original):08x}"
    )
    part1.write_bytes(original)
    assert (
        open_run(run).requests().collect().height == totals(make_batches(21, 20))["request_steps"]
    )


def test_first_damaged_part_in_order_is_reported(tmp_path):
    run = tmp_path / "run"
    write_run(run, make_batches(22, steps=30))
    for n in (3, 1, 4):
        part = run / "steps" / f"part-00000{n}.parquet"
        part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(RunStoreError, match=r"steps/part-000001\.parquet: damaged"):
        open_run(run).steps()


def test_damaged_checksum_record_names_the_record(tmp_path):
    run = tmp_path / "run"
    write_run(run, make_batches(23, steps=10))
    record = run / "_checksums" / "steps" / "part-000001.parquet.json"
    for text in (b"", b"{", b'{"size": -1, "crc32": 0}', b'{"size": 1}', b"[1]", b"x" * 10_000):
        record.write_bytes(text)
        with pytest.raises(RunStoreError, match="damaged checksum record") as err:
            open_run(run).steps()
        assert str(err.value).startswith(str(record))


def test_part_crc32_is_zlibs_with_or_without_isal(tmp_path):
    # the fast CRC-32 (ISA-L, where installed) must give zlib's values: records written
    # with one are verified with the other
    data = bytes(range(256)) * 9000 + b"tail"
    assert checksums.crc32(data) == zlib.crc32(data)
    assert checksums.crc32(data[5000:], checksums.crc32(data[:5000])) == zlib.crc32(data)
    assert checksums.crc32(b"") == zlib.crc32(b"") == 0
    part = tmp_path / "part"
    part.write_bytes(data * 3)  # several read chunks
    assert checksums._crc32_file(part) == zlib.crc32(data * 3)


def test_each_part_is_verified_once_per_run_until_it_changes(tmp_path, monkeypatch):
    run = tmp_path / "run"
    write_run(run, make_batches(24, steps=18))
    read: list[str] = []
    original = checksums._crc32_file
    monkeypatch.setattr(
        checksums, "_crc32_file", lambda p: read.append(f"{p.parent.name}/{p.name}") or original(p)
    )
    r = open_run(run)
    for _ in range(3):
        r.requests().select(pl.len()).collect()
    # the steps parts too: a request row is held to its step's invariants (store/validate.py)
    assert sorted(read) == [
        f"{t}/part-00000{n}.parquet" for t in ("requests", "steps") for n in range(3)
    ]
    part = run / "requests" / "part-000002.parquet"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(RunStoreError, match="damaged"):
        r.requests()


def test_resume_verifies_parts_and_cleans_checksum_debris(tmp_path):
    run = tmp_path / "run"
    first, second = make_batches(25, steps=12), make_batches(26, steps=12)
    for b in second:
        b.forward_ct += 1000
    write_run(run, first)
    # a flush that died after its record and before its part, and a half-written record
    orphan = run / "_checksums" / "steps" / "part-000009.parquet.json"
    orphan.write_text('{"size": 1, "crc32": 1}')
    (run / "_checksums" / "requests" / "part-000009.parquet.json.tmp").write_text("{")
    write_run(run, second, resume=True)
    assert not orphan.exists() and not list(run.rglob("*.tmp"))
    assert set(_records(run)) == {f"{p.parent.name}/{p.name}.json" for p in run.glob("*/*.parquet")}
    assert_batches_equal(list(open_run(run).batches()), first + second)

    part = run / "steps" / "part-000001.parquet"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(RunStoreError, match=rf"{part}: damaged"):
        RunWriter(run, {}, resume=True)


def test_resumed_old_run_gets_records_for_its_new_parts(tmp_path):
    run = tmp_path / "run"
    first, second = make_batches(27, steps=12), make_batches(28, steps=12)
    for b in second:
        b.forward_ct += 1000
    write_run(run, first)
    shutil.rmtree(run / "_checksums")
    _set_manifest(run, store_version=1)
    old = sorted((run / "requests").glob("part-*.parquet"))
    for part in old:  # as the writers of store_version 1 and 2 laid out the matrices
        in_memory(pl.read_parquet(part)).write_parquet(part, compression="zstd")
    assert "draft_tokens" in pl.read_parquet_schema(old[0])
    write_run(run, second, resume=True)
    # the old parts are adopted as they are: the resumed run has a record for every part
    assert set(_records(run)) == {f"{p.parent.name}/{p.name}.json" for p in run.glob("*/*.parquet")}
    assert json.loads((run / "run.json").read_text())["store_version"] == STORE_VERSION
    new = sorted(set((run / "requests").glob("part-*.parquet")) - set(old))
    assert new and "draft_tokens_0" in pl.read_parquet_schema(new[0])
    # a table of both layouts reads as one, in every form
    assert_batches_equal(list(open_run(run).batches()), first + second)
    _, expected = batches_to_frames(first + second, GAMMA)
    r = open_run(run)
    assert_frame_equal(r.requests().collect(), expected)
    assert_frame_equal(pl.concat([p.collect() for p in r.scan_parts("requests")]), expected)


def test_checksum_directory_is_not_a_table_name(tmp_path):
    with RunWriter(tmp_path / "run", {"gamma": GAMMA}) as w, pytest.raises(RunStoreError):
        w.write_rows("_checksums", pl.DataFrame({"a": [1]}))

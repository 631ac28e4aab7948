"""Smaller hostile inputs: files that are no files, keys given twice, glob characters in
run directory names, times that are no times, an ingest that rejects everything.

Each is driven the way a user meets it (the CLI as a subprocess, real files, a FIFO,
`/dev/zero`, DuckDB running the script `summary --sql` prints) and each asserts the
message and the exit status, not only that nothing crashed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import duckdb
import pytest

from dspark_obs.json_files import decode_document, load_json_file
from dspark_obs.telemetry.batch import MAX_STEP_MS, InvalidBatch, StepBatch

from .conftest import cli
from .serving import wait_until
from .test_serve_cli import Child

SAMPLE = Path(__file__).parent / "data" / "sglang" / "server_info.compact.greedy.json"


def _workload_files(tmp: Path) -> dict[str, tuple[str, str]]:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    deep = tmp / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    dup = tmp / "dup.jsonl"
    dup.write_text(
        '{"rid": "gsm8k-0", "workload": "a"}\n{"rid": "x", "workload": "b", "rid": "y"}\n'
    )
    return {
        "fifo": (str(fifo), "is a FIFO, not a regular file"),
        "dev-zero": ("/dev/zero", "is a device, not a regular file"),
        "deep": (str(deep), "line 1: .*JSON nested 100000 levels deep, more than the 64 allowed"),
        "duplicate": (str(dup), "line 2: .*key 'rid' given twice in one object"),
    }


@pytest.mark.parametrize("case", ["fifo", "dev-zero", "deep", "duplicate"])
def test_a_workload_file_that_is_no_table_is_one_line_and_exit_2(tmp_path, case):
    path, message = _workload_files(tmp_path)[case]
    out = tmp_path / "run"
    proc = cli("ingest", str(SAMPLE), "--out", str(out), "--workload-file", path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

    assert re.search(f"workload file {re.escape(path)}.*{message}", proc.stderr), proc.stderr
    assert not out.exists()


def test_json_input_refuses_a_key_given_twice(tmp_path):
    with pytest.raises(ValueError, match="key 'a' given twice in one object"):
        decode_document(b'{"x": {"a": 1, "b": 2, "a": 3}}')
    assert decode_document(b'{"x": {"a": 1, "b": 2}}') == {"x": {"a": 1, "b": 2}}
    table = tmp_path / "cost.json"
    table.write_text('{"gamma": 4, "gamma": 5}')
    with pytest.raises(ValueError, match=rf"cost table {table}: key 'gamma' given twice"):
        load_json_file(table, dict, "cost table")


def _every_record_bad() -> tuple[dict, int]:
    """The sample answer with every step's requests accepting past their window; its steps."""
    doc = json.loads(SAMPLE.read_text())
    records = doc["internal_states"][0]["dspark_info_record"]["records"]
    for record in records:
        for req in record.get("reqs") or []:
            req["correct_drafts"] = 99  # accepted beyond any window
    return doc, sum(1 for r in records if r.get("reqs"))


def test_ingest_that_rejects_every_record_exits_2_and_writes_nothing(tmp_path):
    doc, steps = _every_record_bad()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "run"
    proc = cli("ingest", str(bad), "--out", str(out), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"every record of {bad} was rejected" in proc.stderr
    assert f"'accepted_out_of_range': {steps}" in proc.stderr and "no run written" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("case", ["all-rejected", "empty"])
def test_ingest_follow_that_ingested_nothing_exits_2_when_it_stops(tmp_path, case):
    """As without --follow: a run of no steps is not written, and the exit says why."""
    live = tmp_path / "live.jsonl"
    doc, steps = _every_record_bad()
    live.write_text(json.dumps(doc) + "\n" if case == "all-rejected" else "")
    out = tmp_path / "run"
    with Child("ingest", str(live), "--out", str(out), "--follow", workdir=tmp_path) as child:
        # the signal handlers are set before the file is opened, so once it is open (and,
        # with records, once they made a run) a signal stops it cleanly
        fds = Path(f"/proc/{child.proc.pid}/fd")
        wait_until(
            lambda: (
                (out / "run.json").exists()
                if case == "all-rejected"
                else any(p.resolve() == live for p in fds.iterdir())
            ),
            "ingest --follow reading its file",
            child,
        )
        rc = child.stop(signal.SIGTERM, timeout=60)
    stderr = child.stderr
    assert rc == 2 and "Traceback" not in stderr, stderr
    if case == "all-rejected":
        assert f"every record of {live} was rejected" in stderr
        assert f"'accepted_out_of_range': {steps}" in stderr and "no run written" in stderr
    else:
        assert f"nothing ingested from {live} before the stop; no run written" in stderr
    assert not out.exists()


def test_summary_sql_reads_a_run_directory_named_with_glob_characters(compact_run, tmp_path):
    for name in ("ra", "rb", "r[ab]", "x*?"):
        shutil.copytree(compact_run[0], tmp_path / name)
    script = cli("summary", "--sql", str(tmp_path / "r[ab]"), str(tmp_path / "x*?")).stdout
    con = duckdb.connect()
    con.execute(script.rsplit(";\n", 2)[0] + ";")  # the views only
    runs = {r[0] for r in con.execute("SELECT DISTINCT run FROM requests").fetchall()}
    assert runs == {str(tmp_path / "r[ab]"), str(tmp_path / "x*?")}
    (rows,) = con.execute("SELECT count(*) FROM requests").fetchone()
    manifest = json.loads((compact_run[0] / "run.json").read_text())
    assert rows == 2 * manifest["request_steps"]


@pytest.mark.parametrize("value", [1e15, MAX_STEP_MS * 1.0001, 1e308])
def test_a_step_time_past_an_hour_is_rejected_at_the_gate(value):
    batch = StepBatch(forward_ct=0, gamma=4, step_gpu_ms=value)
    with pytest.raises(
        InvalidBatch, match=r"step_gpu_ms=.* is not a finite time in 0\.\.3600000 ms"
    ) as exc:
        batch.validate()
    assert exc.value.reason == "time_out_of_range"
    StepBatch(forward_ct=0, gamma=4, step_gpu_ms=MAX_STEP_MS).validate()

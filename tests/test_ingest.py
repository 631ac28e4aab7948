"""`dspark-obs ingest` end to end: real files, a real subprocess, the run store read back.

Expected numbers are computed from the sample JSON with plain Python, never
through the project's own converters, so a shared bug cannot hide.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path

import polars as pl

from .conftest import cli
from .serving import wait_until
from .test_serve_cli import Child

SAMPLES = Path(__file__).parent / "data" / "sglang"
GREEDY = SAMPLES / "server_info.compact.greedy.json"
BLOCKS = SAMPLES / "block_accept.sampled.jsonl"
RID_RULE = ["--workload-from-rid", "^(?P<workload>[a-z0-9]+)-"]


def _greedy() -> dict:
    return json.loads(GREEDY.read_text())


def _records(payload: dict) -> list[dict]:
    return payload["internal_states"][0]["dspark_info_record"]["records"]


def _with_records(payload: dict, records: list[dict]) -> dict:
    out = json.loads(json.dumps(payload))
    out["internal_states"][0]["dspark_info_record"]["records"] = records
    return out


def _manifest(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _ingest(tmp_path: Path, *files: Path, name: str = "run") -> tuple[Path, dict]:
    out = tmp_path / name
    proc = cli("ingest", *map(str, files), "--out", str(out), *RID_RULE, "--assume", "greedy")
    assert "ingested" in proc.stdout
    return out, _manifest(out)


def test_greedy_sample_matches_plain_python(tmp_path):
    out, manifest = _ingest(tmp_path, GREEDY)
    per_wl: dict[str, list[int]] = defaultdict(list)
    for rec in _records(_greedy()):
        for r in rec.get("reqs") or []:
            per_wl[r["rid"].rsplit("-", 1)[0]].append(r["verify_len"] - 1)
    summary = json.loads(cli("summary", str(out), "--json").stdout)
    assert set(summary["workloads"]) == set(per_wl)
    for wl, windows in per_wl.items():
        entry = summary["workloads"][wl]
        assert entry["request_steps"] == len(windows)
        assert abs(entry["mean_window"] - sum(windows) / len(windows)) < 1e-9
    assert manifest["source"] == "ingest"
    assert manifest["gamma"] == 7 and manifest["mode"] == "compact"
    assert manifest["components"] == ["core", "reqs"]
    assert manifest["timing"] is None
    assert manifest["workloads"] == sorted(per_wl)
    assert manifest["steps"] == len(_records(_greedy()))
    assert manifest["missing_steps"] == 0 and manifest["bad_records"] == {}
    assert manifest["complete"] is True


def test_duplicates_across_files_and_overlapping_snapshots(tmp_path):
    n = len(_records(_greedy()))
    _, once = _ingest(tmp_path, GREEDY, name="once")
    _, twice = _ingest(tmp_path, GREEDY, GREEDY, name="twice")
    assert (twice["steps"], twice["request_steps"]) == (once["steps"], once["request_steps"])
    assert twice["duplicates_skipped"] == n

    recs = _records(_greedy())
    snaps = tmp_path / "poll.jsonl"
    lines = [_with_records(_greedy(), recs[:150]), _with_records(_greedy(), recs[100:])]
    snaps.write_text("".join(json.dumps(s) + "\n" for s in lines))
    _, polled = _ingest(tmp_path, snaps, name="polled")
    assert (polled["steps"], polled["request_steps"]) == (once["steps"], once["request_steps"])
    assert polled["duplicates_skipped"] == 50 and polled["snapshots"] == 2


def test_gap_is_reported(tmp_path):
    recs = [r for r in _records(_greedy()) if not 10 <= r["forward_ct"] < 15]
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(_with_records(_greedy(), recs)))
    out = tmp_path / "run"
    proc = cli("ingest", str(path), "--out", str(out))
    manifest = _manifest(out)
    assert manifest["missing_steps"] == 5 and manifest["missing_steps_by_rank"] == {"0": 5}
    assert "missing steps (gaps) 5" in proc.stdout


def test_corrupted_record_is_counted_and_skipped(tmp_path):
    payload = _greedy()
    recs = _records(payload)
    recs[3]["bs"] = "six"  # wrong type: the record, not the file, is bad
    del recs[7]["reqs"][0]["verify_len"]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(payload) + "\n" + '{"internal_states": [{"dspark_info_r\n')
    out = tmp_path / "run"
    cli("ingest", str(path), "--out", str(out))
    manifest = _manifest(out)
    assert manifest["steps"] == len(recs) - 2
    assert manifest["bad_records"] == {"bad_record": 2, "bad_snapshot_line": 1}
    # the skipped forward_cts are holes in the sequence, reported as such
    assert manifest["missing_steps"] == 2


def test_not_a_server_info_is_refused_before_writing(tmp_path):
    for i, text in enumerate(['{"hello": 1}\n', "not json at all\n", '{"internal_states": 3}']):
        path = tmp_path / f"x{i}.json"
        path.write_text(text)
        out = tmp_path / f"run{i}"
        proc = cli("ingest", str(path), "--out", str(out), check=False)
        assert proc.returncode == 2, proc.stderr
        assert "error" in proc.stderr and str(path) in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not out.exists()
    proc = cli("ingest", str(tmp_path / "missing.json"), "--out", str(tmp_path / "r"), check=False)
    assert proc.returncode == 2 and "missing.json" in proc.stderr
    assert not (tmp_path / "r").exists()


def _stored_keys(ceilings: Path) -> set[tuple[str, int]]:
    """(rid, forward_ct) of the ceilings published so far."""
    return {
        key
        for part in ceilings.glob("part-*.parquet")
        for key in pl.read_parquet(part).select("rid", "forward_ct").iter_rows()
    }


def _opening_rows(lines: list[str]) -> set[tuple[str, int]]:
    out = set()
    for line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "trimmed_tokens" in obj:
            out.add((obj["rid"], obj["fct"]))
    return out


def test_block_accept_jsonl_one_ceiling_row_per_block(tmp_path):
    out = tmp_path / "run"
    proc = cli("ingest", str(BLOCKS), "--out", str(out), *RID_RULE)
    ceilings = pl.read_parquet(out / "ceilings" / "*.parquet")
    expected = _opening_rows(BLOCKS.read_text().splitlines())
    assert ceilings.height == len(expected)
    assert set(zip(ceilings["rid"], ceilings["forward_ct"], strict=True)) == expected
    assert set(ceilings["method"]) == {"sampled"} and set(ceilings["mode"]) == {"compact"}
    assert (ceilings["lo"] <= ceilings["point"]).all() and (
        ceilings["point"] <= ceilings["hi"]
    ).all()
    manifest = _manifest(out)
    assert manifest["blocks"] == len(expected) and manifest["gamma"] == 7
    assert manifest["input_kind"] == "block_accept" and manifest["complete"]
    assert "gsm8k: blocks" in proc.stdout and "point" in proc.stdout


def test_follow_survives_partial_lines_and_rotation(tmp_path):
    lines = BLOCKS.read_text().splitlines(keepends=True)
    third = len(lines) // 3
    live = tmp_path / "ba.jsonl"
    # chunk 1 ends in the middle of a line
    head = "".join(lines[:third])
    live.write_text(head + lines[third][:10])
    out = tmp_path / "run"
    with Child("ingest", str(live), "--out", str(out), "--follow", workdir=tmp_path) as child:
        # the first flush proves handlers are set
        wait_until((out / "run.json").exists, "ingest --follow writing its run", child)
        with live.open("a") as fh:
            fh.write(lines[third][10:] + "".join(lines[third + 1 : 2 * third]))
        # rotation: the old file moves away, a new one takes its name (the follower drains
        # the old descriptor first, so what was appended above is read either way)
        live.rename(tmp_path / "ba.jsonl.1")
        live.write_text("".join(lines[2 * third :]) + '{"rid": "gsm8k-0", "fct": 99')
        # the new file read before the signal, however busy the machine: one of its blocks
        # is published (a flush every 2 s; blocks still open at the end wait for the close)
        new = _opening_rows(lines[2 * third :]) - _opening_rows(lines[: 2 * third])
        wait_until(lambda: new & _stored_keys(out / "ceilings"), "the new file read", child)
        assert child.stop(signal.SIGINT, timeout=30) == 0, child.describe()
    stdout = child.stdout
    manifest = _manifest(out)
    assert manifest["complete"] is True and manifest["rotations"] == 1
    ceilings = pl.read_parquet(out / "ceilings" / "*.parquet")
    expected = _opening_rows(lines)
    assert ceilings.height == len(expected)
    assert set(zip(ceilings["rid"], ceilings["forward_ct"], strict=True)) == expected
    assert "blocks" in stdout

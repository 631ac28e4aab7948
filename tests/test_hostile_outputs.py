"""Outputs under hostile names: links planted at a study's JSON Lines or among a report's
files, FIFOs, labels near the 255-byte limit of a file name, and a JSON body's lone
surrogate. Each is refused with its one line and exit 2 (nothing changed), or written
whole under a bounded name."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys

import polars as pl
import pytest

from dspark_obs import names, outputs
from dspark_obs.recording.workers import jsonl_sink
from dspark_obs.report.figure_queue import LABEL_BYTES, _slug
from dspark_obs.runtime_server.protocol import invalid_json, lone_surrogate
from dspark_obs.store.writer import publish_part
from tests.conftest import cli

# -- a study's --out: appended to, never through a link --------------------------------------


def test_a_study_sink_appends_to_a_file_and_refuses_a_link_or_a_fifo(tmp_path):
    out = tmp_path / "records.jsonl"
    out.write_text('[{"seed": 0}]\n')
    with jsonl_sink(str(out)) as sink:
        sink([{"seed": 1}])
        sink([{"seed": 2}, {"seed": 3}])
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        [{"seed": 0}],
        [{"seed": 1}],
        [{"seed": 2}, {"seed": 3}],
    ]
    victim, link = tmp_path / "victim", tmp_path / "link.jsonl"
    victim.write_text("keep me")
    link.symlink_to(victim)
    with pytest.raises(outputs.OutputRefused, match=r"link\.jsonl: is a symbolic link"):
        with jsonl_sink(str(link)):
            pass
    assert victim.read_text() == "keep me"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nothing reads it: an open for writing would wait for good
    with pytest.raises(outputs.OutputRefused, match="fifo: is not a regular file"):
        with jsonl_sink(str(fifo)):
            pass


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["dspark_obs.recording.study", "--seeds", "1", "--steps", "5", "--out", "LINK"],
        ["dspark_obs.whatif.study", "--seeds", "1", "--steps", "5", "--out", "LINK"],
        ["dspark_obs.whatif.study", "--seeds", "1", "--steps", "5", "--keep", "LINK"],
    ],
    ids=["study-out", "whatif-study-out", "whatif-study-keep"],
)
def test_a_study_refuses_a_planted_link_before_running_anything(tmp_path, argv):
    victim = tmp_path / "victim"
    keep = "--keep" in argv
    if keep:
        victim.mkdir()
    else:
        victim.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(victim)
    proc = _module(*(str(link) if a == "LINK" else a for a in argv))
    assert proc.returncode == 2, proc.stderr
    flag = "--keep" if keep else "--out"
    assert f"error: {flag} {link}: is a symbolic link; refusing to write through it" in (
        proc.stderr
    )
    if keep:
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "keep me"


# -- a report: every name checked before anything is written ---------------------------------


def _listing(directory) -> dict[str, bytes | str]:
    return {
        p.name: os.readlink(p) if p.is_symlink() else p.read_bytes()
        for p in sorted(directory.iterdir())
    }


@pytest.fixture(scope="module")
def figure_names(compact_run, tmp_path_factory) -> list[str]:
    """The figure files a report of the compact run writes."""
    out = tmp_path_factory.mktemp("report") / "out"
    cli("report", str(compact_run[0]), "--out", str(out), "--quiet")
    found = sorted(p.name for p in out.glob("*.png"))
    assert found and not list(out.glob(".figures.*"))
    return found


@pytest.mark.parametrize("planted", ["summary.md", "report.json", "FIGURE"])
def test_a_link_at_any_name_of_a_report_leaves_its_directory_as_it_was(
    compact_run, figure_names, tmp_path, planted
):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"keep me")
    name = figure_names[-1] if planted == "FIGURE" else planted
    (out / name).symlink_to(victim)
    (out / "1.png").write_bytes(b"the user's own")
    before = _listing(out)
    proc = cli("report", str(compact_run[0]), "--out", str(out), "--quiet", check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"--out {out / name}: is a symbolic link; refusing to write through it" in proc.stderr
    assert "Traceback" not in proc.stderr
    # no figure drawn into it, no staging left, the link's target untouched
    assert _listing(out) == before
    assert victim.read_bytes() == b"keep me"


def test_a_label_near_the_file_name_limit_gives_bounded_distinct_figure_names(
    compact_run, tmp_path
):
    runs = tmp_path / "runs"
    runs.mkdir()
    long_a = "é" * 110 + "-a"  # 222 bytes of UTF-8: with a figure's stem, over 255
    long_b = "é" * 110 + "-b"
    for label in (long_a, long_b):
        shutil.copytree(compact_run[0], runs / label)
    out = tmp_path / "out"
    proc = cli(
        "report", str(runs / long_a), str(runs / long_b), "--arms", "--out", str(out), "--quiet"
    )
    assert "Traceback" not in proc.stderr
    pngs = [p.name for p in out.glob("*.png")]
    per_arm = {label: [n for n in pngs if _slug(label) in n] for label in (long_a, long_b)}
    assert per_arm[long_a] and len(per_arm[long_a]) == len(per_arm[long_b])
    assert not set(per_arm[long_a]) & set(per_arm[long_b])
    assert max(len(n.encode()) for n in pngs) <= 255
    summary = (out / "summary.md").read_text()
    assert all(n in summary for n in pngs)


def test_a_slug_is_bounded_in_bytes_and_two_labels_keep_two_slugs():
    a, b = "x/" * 200, "x?" * 200  # the same slug, cut, for two labels
    assert len(_slug(a).encode()) <= LABEL_BYTES and _slug(a) != _slug(b)
    assert _slug("run-a") == "run-a"  # a short label's files keep their names
    cjk = "漢" * 100  # 300 bytes in 100 characters
    assert len(_slug(cjk).encode()) <= LABEL_BYTES and _slug(cjk).startswith("漢" * 38)
    assert names.fit_bytes("abc", 3) == "abc" and len(names.fit_bytes("abcd" * 9, 20)) == 20


# -- runtime-server: a lone surrogate escape is named as such --------------------------------


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (rb'{"rid": "evil\ud800"}', (13, r"\ud800")),
        (rb'{"rid": "\udc00x"}', (9, r"\udc00")),
        (rb'{"rid": "\ud800\u0041"}', (9, r"\ud800")),
        (rb'{"rid": "\ud83d\ude00\ud800"}', (21, r"\ud800")),
        (rb'{"rid": "\ud83d\ude00"}', None),  # a pair: one character
        (rb'{"rid": "\\ud800"}', None),  # an escaped backslash, then text
        (rb'{"rid": "\\\ud800"}', (11, r"\ud800")),
    ],
)
def test_a_lone_surrogate_escape_is_found_and_named(body, found):
    assert lone_surrogate(body) == found
    if found is not None:
        message = invalid_json(body, ValueError("Input data was truncated"))
        assert f"lone UTF-16 surrogate escape {found[1]} at byte {found[0]}" in message
        assert "truncated" not in message


# -- a full disk: the error names the file --------------------------------------------------


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    """A write or an fsync that fails for want of space says so without a file name;
    `write_file` (every --out file, every part of a run) adds the file it was writing and
    leaves no temporary file."""

    def full(_f):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "summary.md"
    with pytest.raises(OSError, match=r"No space left on device: '.*summary\.md'") as caught:
        outputs.write_file(target, full)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    monkeypatch.setattr(os, "fsync", full)
    part = tmp_path / "run" / "steps" / "part-000001.parquet"
    with pytest.raises(
        OSError, match=r"No space left on device: '.*steps/part-000001\.parquet(\.json)?'"
    ):
        publish_part(part, pl.DataFrame({"x": [1, 2, 3]}))
    assert not list(tmp_path.rglob("*.tmp")) and not target.exists() and not part.exists()


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounts a tmpfs (root)"
)
def test_a_run_into_a_full_filesystem_is_one_line_naming_the_part(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(tiny)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        proc = cli(
            "run", "--concurrency", "8", "--steps-per-level", "200", "--quiet",
            "--out", str(tiny / "run"), check=False,
        )  # fmt: skip
    finally:
        subprocess.run(["umount", str(tiny)], check=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
    assert re.search(r"No space left on device: '.*tiny/run/\w+/part-\d+\.parquet'", lines[0])

"""Names from clients (rids, workloads) and `--out` paths, as an attacker or an unlucky
operator gives them: one rule for names (`names.py`, applied at the pipeline's gate and at
runtime-server's entry, escaped for each output) and one safe way to write `--out`
(`outputs.py`). Each test asserts the counter or the message, not only that nothing broke."""

from __future__ import annotations

import json
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from dspark_obs.exporters.collector import Collector
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs import names, outputs
from dspark_obs.aggregates.groups import OTHER, GroupIndex
from dspark_obs.pipeline import build_pipeline
from dspark_obs.pipeline.core import NAME_CLEANED
from dspark_obs.runtime_server import RuntimeFrontend
from tests.conftest import cli
from tests.test_runtime_server import _call, _config, _gen
from tests.test_store import GAMMA, make_batch

HOSTILE = ["[/bold]-3", "$x^{$-3", "<script>alert(1)</script>", "<img onerror>"]


# -- the rule ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=400))
def test_a_cleaned_name_is_printable_bounded_stable_and_clean_names_pass_unchanged(name):
    kept = names.clean(name)
    assert kept.isprintable() and len(kept) <= names.MAX_LEN
    kept.encode("utf-8")  # no lone surrogate left (strict: it would raise)
    assert names.clean(kept) == kept
    if name.isprintable() and len(name) <= names.MAX_LEN:
        assert kept is name


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=50), st.text(min_size=1, max_size=50))
def test_two_long_names_stay_two(a, b):
    base = "w" * names.MAX_LEN
    if a != b:
        assert names.clean(base + a) != names.clean(base + b)
    assert re.fullmatch(r".*~[0-9a-f]{12}", names.clean(base + a))


def test_outputs_escape_what_each_reads():
    assert names.markdown("<script>x</script>|[a](javascript:b)") == (
        "&lt;script&gt;x&lt;/script&gt;\\|[a]\\(javascript:b)"
    )
    from rich.text import Text

    for name in ("[/bold]\x1b[2J", "[red]x[/red]", "a\\[b]"):
        assert Text.from_markup(names.terminal(name)).plain == names.printable(name)
    assert names.printable("a\nb") == "a\\nb"


# -- the gate: every source's names --------------------------------------------------------


def _batch(forward_ct, rids, workloads):
    b = make_batch(np.random.default_rng(forward_ct), forward_ct, bs=len(rids))
    b.rid = np.array(rids, dtype=object)
    b.workload = np.array(workloads, dtype=object)
    b.workload_codes = b.workload_names = None
    return b


def _exposition(pipeline) -> str:
    est = pipeline.estimator
    est.close()
    snap = (pipeline.aggregates.snapshot(), pipeline.stats.snapshot(), est.snapshot())
    return Collector().collect(*snap).decode()


def test_the_gate_keeps_rows_with_bad_names_under_cleaned_names_and_counts_them(caplog):
    pipeline = build_pipeline(GAMMA)
    huge = "w" * 1_000_000
    rows = [
        (["ok-1", "bad\n2", "evil\ud800", "ok-4"], ["chat", "chat", "chat", "chat"]),
        (["ok-5", "ok-6", "ok-7", "ok-8"], [huge, huge, "chat", "\x1b[31mred"]),
    ]
    for i, (rids, workloads) in enumerate(rows, 1):
        assert pipeline.ingest(_batch(i, rids, workloads), "sglang")
    snap = pipeline.stats.snapshot()
    assert snap.records["sglang"] == 2
    assert snap.errors[("sglang", NAME_CLEANED)] == 2 + 3  # rows changed, not batches
    assert "is kept as 'bad\ufffd2'" in caplog.text
    text = _exposition(pipeline)
    assert len(text) < 2_000_000 and huge not in text
    labels = set(re.findall(r'workload="([^"]*)"', text))
    assert names.clean(huge) in labels and "\ufffd[31mred" in labels
    assert max(map(len, labels)) <= names.MAX_LEN
    assert 'reason="name_cleaned"} 5' in text


def test_groups_past_the_cap_are_counted_under_each_ranks_other():
    index = GroupIndex(workload_cap=17, group_cap=20)
    for rank in range(64):
        for w in range(17):
            index.group(f"w{w}", "compact", rank)
    named = [g for g in index.groups if g[0] != OTHER]
    assert len(named) == 20
    assert {g[2] for g in index.groups if g[0] == OTHER} == set(range(1, 64))
    assert len(index.overflow_names) == 17

    pipeline = build_pipeline(GAMMA, workload_cap=4)
    for i in range(8):
        b = _batch(i + 1, [f"r{i}"] * 2, [f"load{i}", f"load{i}"])
        assert pipeline.ingest(b, "x")
    assert pipeline.aggregates.snapshot().overflow_rows == 8  # the last four batches' rows


# -- the SGLang hook: a rid with a newline or a lone surrogate -----------------------------


def test_the_hook_keeps_every_step_whose_rids_hold_newlines_or_lone_surrogates():
    pytest.importorskip("torch")
    from dspark_obs.hooks.sglang_worker import SOURCE, attach
    from tests.hook_reference import FakeObservers, StepStream

    stream = StepStream(seed=4, requests=6)
    worker = SimpleNamespace(_observers=FakeObservers())
    hook = attach(worker, gamma=stream.g, consumer="inline", pool_slots=64)
    seen = []
    ingest = hook.pipeline.ingest
    hook.pipeline.ingest = lambda b, s, g: (seen.append(b), ingest(b, s, g))[1]
    steps, bad = 19, 0
    for i in range(steps):
        kw = stream.step()
        reqs = [SimpleNamespace(rid=f"r{i}-{j}") for j in range(kw["bs"])]
        reqs[0].rid, reqs[-1].rid = f"a\nb{i}", f"evil\ud800{i}"
        bad += 2 if kw["bs"] > 1 else 1
        kw["reqs"] = reqs
        worker._observers.observe_verify_step(**kw)
        hook.drain()
    stats = hook.pipeline.stats.snapshot()
    assert stats.records[SOURCE] == steps and hook.failures == 0
    assert stats.errors[(SOURCE, NAME_CLEANED)] == bad
    assert all(str(b.rid[0]).startswith("a\ufffdb") for b in seen)
    hook.close()


# -- runtime-server: names cleaned at entry ------------------------------------------------


def test_runtime_server_cleans_names_at_entry_and_server_info_stays_whole(caplog):
    with RuntimeFrontend(_config(), port=0) as front:
        url = front.url
        # a JSON lone surrogate (`"evil\\ud800"`) is refused by the strict JSON reader
        status, out = _call(url, "/generate", {"text": "hi", "rid": "evil\ud800"})
        message = out["error"]["message"]
        assert status == 400 and "truncated" not in message
        assert re.search(r"lone UTF-16 surrogate escape \\ud800 at byte \d+ is not", message)
        out = _gen(url, "hello", rid="evil\n\x1b[2J", max_new=4)
        assert out["meta_info"]["id"] == "evil\ufffd\ufffd[2J"
        long_rid = "r" * 5_000
        out = _gen(url, "hello", rid=long_rid, max_new=4)
        assert out["meta_info"]["id"] == names.clean(long_rid)
        status, info = _call(url, "/server_info")
        assert status == 200 and info["internal_states"]
        assert front.names_cleaned == 2
    assert "cleaned to be kept" in caplog.text


# -- the CLI: reports, tables and --out ----------------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "run"
    presets = ["gsm8k", "arena", "poetry", "gsm8k"]
    workloads = ",".join(f"{w}={p}" for w, p in zip(HOSTILE, presets, strict=True))
    cli(
        "run", "--mode", "compact", "--workloads", workloads + ",\x1b[2Jesc=arena",
        "--concurrency", "4", "--steps-per-level", "40", "--sts-warmup-steps", "40",
        "--max-new-tokens", "120", "--quiet", "--out", str(out),
    )  # fmt: skip
    return out


def test_report_shows_hostile_names_as_text_everywhere(hostile_run, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "1.png").write_bytes(b"the user's own file")
    (out / "2.01-throughput.png").write_bytes(b"the user's too")
    # as an earlier report left it: a figure of ours it recorded, which this one does not draw
    stale = out / "9.01-gone.png"
    stale.write_bytes(b"ours")
    (out / outputs.WRITTEN).write_text(json.dumps({stale.name: outputs._sha256(stale)}))
    proc = cli("report", str(hostile_run), "--out", str(out), "--tables")
    assert "Traceback" not in proc.stderr and "\x1b[2J" not in proc.stdout
    assert "[/bold]-3" in proc.stdout and "\ufffd[2Jesc" in proc.stdout
    md = (out / "summary.md").read_text()
    assert "<script>" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "$x^{$-3" in md
    page = (out / "report.html").read_text()
    assert "<script>alert" not in page and "<img onerror" not in page
    assert (out / "1.png").read_bytes() == b"the user's own file"
    record = json.loads((out / outputs.WRITTEN).read_text())
    assert "1.png" not in record and "summary.md" in record and stale.name not in record
    # the stale figure of ours went; the user's files, never ours, stayed
    assert not stale.exists() and (out / "1.png").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["report", "RUN", "--quiet", "--out", "LINK"],
        ["sts", "fit", "RUN", "--out", "LINK"],
        ["run", "--concurrency", "2", "--steps-per-level", "5", "--quiet", "--out", "LINK"],
        ["dashboards", "export", "LINK"],
    ],
    ids=["report", "sts-fit", "run", "dashboards-export"],
)
def test_out_through_a_planted_symlink_is_refused(hostile_run, tmp_path, command):
    victim = tmp_path / "victim"
    victim.mkdir()
    link = tmp_path / "link"
    link.symlink_to(victim if command[0] in ("report", "run", "dashboards") else victim / "x")
    argv = [str(hostile_run) if a == "RUN" else str(link) if a == "LINK" else a for a in command]
    proc = cli(*argv, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{link}: is a symbolic link; refusing to write through it" in proc.stderr
    assert list(victim.iterdir()) == []


def test_a_planted_link_inside_out_is_refused_and_not_followed(hostile_run, tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim.md"
    out.mkdir()
    victim.write_text("keep me")
    (out / "summary.md").symlink_to(victim)
    proc = cli("report", str(hostile_run), "--out", str(out), "--quiet", check=False)
    assert proc.returncode == 2 and "summary.md: is a symbolic link" in proc.stderr
    assert victim.read_text() == "keep me"


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "run.json"
    bodies = [bytes([65 + i]) * 200_000 for i in range(8)]
    errors = []

    def write(body):
        try:
            for _ in range(20):
                outputs.write_file(target, body)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in bodies  # one writer's bytes, whole
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary left

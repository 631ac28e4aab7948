"""What the CLI tells a user where the first hour used to go wrong: set-up, busy ports,
unreachable or misconfigured servers, dropped steps, ingested runs in summaries and compares.

Each case runs the real `dspark-obs` in a subprocess and checks the message and exit status.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from dspark_obs.numbers import bracket
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend

from .conftest import cli
from .test_serve_cli import Child
from .test_sglang_poller import SAMPLE, Stub, serve_polling, stop_serving

ROOT = Path(__file__).resolve().parents[1]


def test_dashboards_export_writes_the_committed_json_without_the_grafana_sdk(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "grafana_foundation_sdk.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    out = tmp_path / "dash"
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "dashboards", "export", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "dashboards" / "dspark.json").read_text(encoding="utf-8")
    assert (out / "dspark.json").read_text(encoding="utf-8") == committed
    assert str(out / "provisioning" / "datasources.yml") in proc.stdout.splitlines()


DEMO = ["demo", "--concurrency", "4", "--steps-per-level", "20", "--sts", "none", "--quiet"]


def _listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_demo_on_a_chosen_busy_port_fails_naming_it(tmp_path):
    with _listening_socket() as busy:
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = cli(*DEMO, "--listen", listen, "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert f"error: cannot listen on {listen}: Address already in use" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_demo_moves_off_a_busy_default_port_and_says_so(tmp_path):
    """The default port (9464) is held here, by this test or by whatever else holds it."""
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 9464))
        held.listen()
    except OSError:
        held.close()  # taken already: the case under test all the same
    with held:
        proc = cli(*DEMO, "--out", str(tmp_path / "run"))
    note = "note: 127.0.0.1:9464 is taken (Address already in use), so the demo serves on a free"
    assert note in proc.stdout
    url = re.search(r"serving live metrics at http://127\.0\.0\.1:(\d+)/metrics", proc.stdout)
    assert url is not None and url.group(1) != "9464", proc.stdout


def test_auroc_help_states_the_bins_the_code_uses():
    """The live gauge's histogram (15 ECE bins x 68) and the post-hoc command's (1,024)."""
    from dspark_obs.exporters.catalog import CATALOG

    from dspark_obs.aggregates.confidence import FINE_BINS
    from dspark_obs.calibration.metrics import histogram_auroc

    help_text = next(m for m in CATALOG if m.name == "dspark_confidence_auroc").help
    post_hoc = inspect.signature(histogram_auroc).parameters["num_bins"].default
    assert f"from a {FINE_BINS:,}-bin histogram" in help_text
    assert f"`dspark-obs calibration` uses {post_hoc:,} bins" in help_text
    doc = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert f"AUROC ({post_hoc:,}-bin histogram" in doc and f"uses {FINE_BINS:,} bins" in doc


# -- shadow, against two SGLang-protocol fronts over real HTTP -----------------------------


@pytest.fixture(scope="module")
def fronts():
    """A compact production front, a cap-accept twin and a compact front posing as one."""
    servers = [
        RuntimeFrontend(RuntimeConfig(mode=mode, seed=4), port=0, dp_size=1)
        for mode in ("compact", "cap-accept", "compact")
    ]
    for server in servers:
        server.start()
    yield servers
    for server in servers:
        server.stop()


def _requests_file(path: Path, n: int) -> Path:
    names = ("gsm8k", "arena", "poetry")
    lines = [
        {
            "rid": f"{names[i % 3]}-{i}",
            "text": f"prompt {i}",
            "sampling_params": {"max_new_tokens": 40},
        }
        for i in range(n)
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines))
    return path


def _shadow(production: str, shadow: str, tmp_path: Path, *extra: str):
    requests = _requests_file(tmp_path / "requests.jsonl", 12)
    out = tmp_path / "shadow"
    args = ("--production", production, "--shadow", shadow, "--requests", str(requests))
    return cli("shadow", *args, "--out", str(out), *extra, check=False), out


def test_shadow_names_workloads_from_name_n_rids_and_hints_at_the_sample(fronts, tmp_path):
    prod, twin, _ = fronts
    proc, out = _shadow(prod.url, twin.url, tmp_path, "--sample", "0.5")
    assert proc.returncode == 0, proc.stderr
    replayed = int(re.search(r"replayed (\d+) of 12 requests \(--sample 0.5\)", proc.stdout)[1])
    assert 0 < replayed < 12
    assert f"note: {replayed} requests give loose per-workload estimates" in proc.stdout
    assert "--sample 1 replays all 12" in proc.stdout
    summary = json.loads(cli("summary", str(out), "--json").stdout)
    assert set(summary["workloads"]) <= {"gsm8k", "arena", "poetry"}
    assert summary["workloads"], "no workload named from the rids"


def test_shadow_refuses_a_twin_that_is_not_cap_accept(fronts, tmp_path):
    prod, _, compact = fronts
    proc, out = _shadow(prod.url, compact.url, tmp_path, "--sample", "1")
    assert proc.returncode == 2
    assert f"error: {compact.url} verifies in compact mode, not cap-accept" in proc.stderr
    assert not (out / "run.json").exists()


def test_shadow_names_the_server_it_cannot_reach(fronts, tmp_path):
    with _listening_socket() as closed:
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    proc, _ = _shadow(fronts[0].url, dead, tmp_path)
    assert proc.returncode == 2
    assert f"error: cannot reach {dead}/" in proc.stderr


# -- serve: what became of the steps -------------------------------------------------------


def test_serve_says_steps_the_server_dropped_were_dropped_not_rejected(tmp_path, request):
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    info["records"] = info["records"][:10] + info["records"][15:20]  # five steps never read
    child, _ = serve_polling(Stub(info), 15, tmp_path / "run", tmp_path, request)
    stop_serving(child)
    assert (
        "stopped: 15 steps ingested, 0 rejected, "
        "5 dropped by the server before a poll read them (dropped_steps); run stored in"
    ) in child.stderr


# -- summary and compare of a run ingested from SGLang ---------------------------------------


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ingested") / "run"
    proc = cli("ingest", str(SAMPLE), "--out", str(out))
    assert "timing none (no step times recorded)" in proc.stdout
    return out


def test_summary_of_an_ingested_run_says_it_has_no_step_times(ingested, tmp_path):
    """Piped, a header line stays whole however long the run's path (it once broke at
    120 columns, mid-phrase)."""
    deep = tmp_path / ("a-run-directory-with-a-long-name-" * 4) / "run"
    shutil.copytree(ingested, deep)
    for run in (ingested, deep):
        proc = cli("summary", str(run))
        header = proc.stdout.splitlines()[0]
        assert header.startswith(f"{run}  mode=compact"), header
        assert header.endswith("timing=none (no step times recorded)"), header
        assert "None" not in proc.stdout


def test_compare_with_an_ingested_run_notes_the_missing_configuration(compact_run, ingested):
    run, _ = compact_run
    args = ("compare", str(run), str(ingested), "--allow-mismatch", "--reps", "200")
    text = cli(*args).stdout
    assert "None" not in text and "null" not in text
    assert "run B records no runtime configuration (not a reference run)" in text
    assert "configuration A -> B" not in text and "no key differs" not in text
    b_line = next(line for line in text.splitlines() if line.startswith("B: "))
    assert "seed=" not in b_line and "timing=none (no step times recorded)" in b_line
    result = json.loads(cli(*args, "--json").stdout)
    assert result["config_compared"] is False and result["config_diff"] == []
    rows = [r for r in result["rows"] if r["ci_holm"] is not None]
    assert rows
    for r in rows:  # the verdict and the interval beside it agree
        lo, hi = r["ci_holm"]
        assert r["significant"] == (lo > 0 or hi < 0), r
        assert ("no significant difference" in r["verdict"]) == (not r["significant"]), r
        assert f"Holm 95% CI {bracket(*r['ci_holm'])}" in r["verdict"] or r["verdict"] == (
            "no difference"
        )


def test_serve_says_polls_of_an_unreachable_server_failed(tmp_path, request):
    with _listening_socket() as closed:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    args = ("serve", "--source", f"sglang:{url}", "--poll-interval", "0.1", "--gamma", "7")
    child = Child(*args, "--listen", "127.0.0.1:0", workdir=tmp_path / "child")
    request.addfinalizer(child.kill)
    deadline = time.monotonic() + 60
    while "connect_failed" not in child.stderr and time.monotonic() < deadline:
        time.sleep(0.1)
    stop_serving(child)
    assert f"source sglang:{url}: connect_failed: " in child.stderr
    assert "rejected a step" not in child.stderr
    assert re.search(
        r"stopped: 0 steps ingested, 0 rejected, (\d+) failed polls \(connect_failed \1\)",
        child.stderr,
    ), child.stderr


def test_hook_consumer_on_a_busy_port_fails_naming_it():
    from dspark_obs.hooks.rendezvous import ring_name
    from dspark_obs.hooks.shared_ring import SharedRing

    with _listening_socket() as busy:
        port = busy.getsockname()[1]
        listen = f"127.0.0.1:{port}"
        ring = SharedRing(ring_name(port), slots=2, max_bs=4, gamma=7)
        try:
            proc = cli("hook-consumer", "--listen", listen, check=False)
        finally:
            ring.close()
    assert proc.returncode == 2
    assert f"error: cannot listen on {listen}: Address already in use" in proc.stderr


def test_the_default_workload_rule_takes_name_n_rids_and_leaves_uuids_as_other():
    from dspark_obs.sources.workloads import workload_rule

    rids = ["gsm8k-17", "long_ctx.v2-3", uuid.uuid4().hex, str(uuid.uuid4()), "a-b-3", "7-3"]
    names = workload_rule()(np.array(rids, dtype=object)).tolist()
    assert names == ["gsm8k", "long_ctx.v2", "other", "other", "other", "other"]
    # hex UUIDs that happen to start with a letter and end in digits stay `other` too
    assert workload_rule()(np.array(["abcdef12-abcd-ef12-abcd-123456789012"])).tolist() == ["other"]


@pytest.mark.parametrize(
    "argv, wanted",
    [(["sumary", "x"], "did you mean 'summary'?"), (["run", "--mode", "compct"], "'compact'?")],
)
def test_a_mistyped_command_or_choice_gets_the_nearest_one(argv, wanted):
    proc = cli(*argv, check=False)
    assert proc.returncode == 2 and wanted in proc.stderr, proc.stderr
    far = cli("zzzzzz", check=False)
    assert far.returncode == 2 and "did you mean" not in far.stderr


def test_debug_adds_the_traceback_and_keeps_the_exit_status(tmp_path):
    """A file given where a run directory goes: said as such, exit 2 with or without
    --debug (scripts test the status); --debug adds the traceback above the same line."""
    path = tmp_path / "README.md"
    path.write_text("# not a run\n")
    plain = cli("summary", str(path), check=False)
    debug = cli("--debug", "summary", str(path), check=False)
    assert plain.returncode == debug.returncode == 2
    assert "is a file, not a run directory" in plain.stderr and "Traceback" not in plain.stderr
    assert "Traceback" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]
    missing = cli("summary", str(tmp_path / "nope"), check=False)
    assert missing.returncode == 2 and "no such run directory" in missing.stderr


def test_every_help_prints_its_percent_signs_once():
    """argparse %-formats help strings but not descriptions: neither may print `%%`."""
    from dspark_obs.cli.main import COMMANDS, build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    subparsers = {n: p for a in actions for n, p in a.choices.items()}
    assert set(COMMANDS) <= set(subparsers)
    pending = list(subparsers.values())
    while pending:
        p = pending.pop()
        text = p.format_help()
        assert "%%" not in text, p.prog
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                pending += a.choices.values()

"""A saved `/server_info` file ingests to the same numbers as the live poll of the same server.

The payload is SGLang 0.5.23's exact format (tests/data/sglang, written with
SGLang's own record types); the live path polls it over real HTTP from the
stub server of test_sglang_poller.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.sglang_load import RID

from .conftest import cli
from .test_sglang_poller import SAMPLE, Stub, serve_polling, stop_serving


def _drop_run_path(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "run"}


def _close(a, b, path=""):
    """Exact for counts and strings; floats to 1e-3 relative, because the extrapolated part of
    a censored block uses the population model as last taught, and a live scrape teaches it at
    its own moments."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-3), path
    else:
        assert a == b, path


def test_file_and_live_poll_agree(tmp_path, request):
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    n = len(info["records"])
    stub = Stub(copy.deepcopy(info))
    live = tmp_path / "live"
    child, _ = serve_polling(stub, n, live, tmp_path, request)
    stop_serving(child)
    stub.close()

    saved = tmp_path / "saved"
    cli(
        "ingest", str(SAMPLE), "--out", str(saved), "--assume", "greedy", "--workload-from-rid", RID
    )

    for command in (["summary"], ["calibration"], ["estimate"]):
        a = json.loads(cli(*command, str(live), "--json").stdout)
        b = json.loads(cli(*command, str(saved), "--json").stdout)
        _close(_drop_run_path(a), _drop_run_path(b), command[0])
    rows = [cli("summary", str(p), "--json").stdout for p in (live, saved)]
    assert json.loads(rows[0])["overall"]["request_steps"] == sum(
        len(r["reqs"]) for r in info["records"]
    )
    assert Path(live / "run.json").exists() and Path(saved / "run.json").exists()

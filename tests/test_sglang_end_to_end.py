"""End to end over HTTP, the way a deployment runs, on the SGLang-protocol front.

Two `runtime-server`s speak SGLang's protocol (a compact one with two DP ranks,
and a cap-accept twin); `serve` polls both into a real Prometheus while traffic
arrives through `/generate`; `shadow` replays requests on production and the
twin and joins the twin's ceilings to production's request-steps. No GPU
SGLang server runs here; the fronts emit SGLang 0.5.23's exact record format.
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.request

import pytest

from bench.sglang_load import RID, polling_args
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend

from .conftest import cli
from .prometheus_harness import WAIT, PrometheusServer, prometheus_available
from .test_serve_cli import Child


def _post(url: str, body: dict):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _requests(n: int) -> list[dict]:
    names = ("gsm8k", "arena", "poetry")
    return [
        {
            "rid": f"{names[i % 3]}-{i}",
            "text": f"prompt number {i}",
            "sampling_params": {"temperature": 0, "max_new_tokens": 60},
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def fronts():
    prod = RuntimeFrontend(RuntimeConfig(mode="compact", seed=4), port=0, dp_size=2)
    twin = RuntimeFrontend(RuntimeConfig(mode="cap-accept", seed=4), port=0, dp_size=1)
    prod.start()
    twin.start()
    yield prod, twin
    prod.stop()
    twin.stop()


def test_poller_counts_every_record_once_per_rank_in_prometheus(fronts, tmp_path, request):
    if not prometheus_available():
        pytest.skip("prometheus not installed")
    prod, twin = fronts
    child = Child(
        *polling_args(prod.url, twin.url, poll_interval=0.2, out=tmp_path / "run"),
        # without draining nothing is lost to the read/clear race (documented): every record a
        # rank keeps is served, and the overlapping reads must not double-count
        "--no-clear",
        workdir=tmp_path / "child",
    )
    request.addfinalizer(child.kill)
    metrics = child.url()
    hostport = metrics.split("//")[1].split("/")[0]
    reqs = _requests(24)
    threads = [
        threading.Thread(target=_post, args=(f"{url}/generate", r))
        for url in (prod.url, twin.url)
        for r in reqs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with PrometheusServer({"dspark": [hostport]}, scrape_interval="1s") as prom:
        prom.wait_until_up("dspark")
        served = {}  # the records each rank's /server_info holds (nothing drains them here)
        for offset, front in ((0, prod), (1000, twin)):
            info = json.loads(urllib.request.urlopen(f"{front.url}/server_info").read())
            for dp_rank, state in enumerate(info["internal_states"]):
                served[offset + dp_rank] = len(state["dspark_info_record"]["records"])

        def counted_once(result) -> bool:
            got = {int(r["metric"]["rank"]): float(r["value"][1]) for r in result}
            return got == {k: float(v) for k, v in served.items()}

        try:
            result = prom.wait_for('sum by (rank) (dspark_steps_total{job="dspark"})', counted_once)
        except Exception as exc:
            raise AssertionError(f"served {served}: {exc}") from None
        assert counted_once(result)
        errors = prom.query('dspark_ingest_errors_total{job="dspark"}')
        assert not errors, errors
        rows = prom.query_value(
            'sum(dspark_request_steps_total{job="dspark",rank="0"}) '
            '+ sum(dspark_request_steps_total{job="dspark",rank="1"})'
        )
        assert rows > 0
    child.proc.send_signal(signal.SIGINT)
    assert child.proc.wait(WAIT) == 0, child.describe()


def test_shadow_join_agrees_with_the_greedy_walk(fronts, tmp_path):
    prod, twin = fronts
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(json.dumps(r) for r in _requests(30)))
    out = tmp_path / "shadow"
    proc = cli(
        "shadow",
        "--production",
        prod.url,
        "--shadow",
        twin.url,
        "--requests",
        str(requests),
        "--sample",
        "1.0",
        "--out",
        str(out),
        "--workload-from-rid",
        RID,
    )
    assert "joined" in proc.stdout
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["joined_rows"] == manifest["production_rows"] > 0
    report = json.loads(cli("estimate", str(out), "--json").stdout)
    walked = 0
    for entry in report["workloads"].values():
        greedy = entry["greedy"]
        if greedy.get("blocks"):
            walked += greedy["blocks"]
            assert greedy["exact_agreement"] == 1.0
            assert greedy["censored_never_above_truth"] is True
    assert walked > 0

"""End to end against a real Prometheus 2.42: scrape a prometheus_client exporter, ask PromQL.

These pin down the harness itself (so later exporter tests can trust it) and the basic promise
that what a process records is what a stock Prometheus ends up storing. Without the binaries
the tests skip on a workstation but fail under CI, where their absence means tools/test.sh
lost its install step and a green run would be hollow.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)

from .prometheus_harness import (
    PrometheusError,
    PrometheusServer,
    free_port,
    promtool_check_metrics,
    require_prometheus,
    scrape_job,
)

require_prometheus()

BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OBSERVATIONS = (0.05, 0.2, 0.3, 0.7, 3.0)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("dspark_test", "Harness self-test counter.", registry=registry)
    counter.inc(40)
    counter.inc(2)
    hist = Histogram(
        "dspark_test_seconds", "Harness self-test histogram.", buckets=BUCKETS, registry=registry
    )
    for v in OBSERVATIONS:
        hist.observe(v)
    return registry


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return _registry()


def _basic_auth_exporter(
    registry: CollectorRegistry, user: str, password: str
) -> ThreadingHTTPServer:
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return cert, key


@pytest.fixture(scope="module")
def scraped(
    registry: CollectorRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """One server for the whole module: Prometheus 2.42 waits ~5 s before its first scrape.

    Jobs: `exporter` (plain prometheus_client), `auth_ok`/`auth_bad` (basic auth, right and
    wrong password) and, where openssl exists to mint a certificate, `tls` (https + ca_file).
    """
    tmp = tmp_path_factory.mktemp("prom")
    stops = []
    try:
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        stops.append(lambda: (server.shutdown(), server.server_close(), thread.join(5)))
        auth = _basic_auth_exporter(registry, "prom", "s3cret")
        stops.append(lambda: (auth.shutdown(), auth.server_close()))
        auth_target = f"127.0.0.1:{auth.server_address[1]}"
        jobs = [
            scrape_job("exporter", [f"127.0.0.1:{port}"]),
            scrape_job(
                "auth_ok", [auth_target], basic_auth={"username": "prom", "password": "s3cret"}
            ),
            scrape_job(
                "auth_bad", [auth_target], basic_auth={"username": "prom", "password": "nope"}
            ),
        ]
        if shutil.which("openssl") is not None:
            cert, key = _self_signed(tmp)
            tls_port = free_port()
            tls, tls_thread = start_http_server(
                tls_port, addr="127.0.0.1", registry=registry, certfile=str(cert), keyfile=str(key)
            )
            stops.append(lambda: (tls.shutdown(), tls.server_close(), tls_thread.join(5)))
            jobs.append(
                scrape_job(
                    "tls",
                    [f"127.0.0.1:{tls_port}"],
                    scheme="https",
                    tls_config={"ca_file": str(cert)},
                )
            )
        with PrometheusServer(jobs, workdir=tmp / "server") as prom:
            prom.wait_until_up("exporter")
            yield prom
    finally:
        for stop in reversed(stops):
            stop()


def test_counter_reaches_promql(scraped: PrometheusServer) -> None:
    scraped.wait_for('dspark_test_total{job="exporter"}', lambda r: len(r) == 1)
    assert scraped.query_value('dspark_test_total{job="exporter"}') == 42
    assert scraped.query_value('up{job="exporter"}') == 1


def test_histogram_reaches_promql(scraped: PrometheusServer) -> None:
    sel = '{job="exporter"}'
    scraped.wait_for(f"dspark_test_seconds_count{sel}", lambda r: len(r) == 1)
    assert scraped.query_value(f"dspark_test_seconds_count{sel}") == len(OBSERVATIONS)
    assert scraped.query_value(f"dspark_test_seconds_sum{sel}") == pytest.approx(sum(OBSERVATIONS))
    # Cumulative buckets: le=0.1:1, 0.25:2, 0.5:3, 1:4, 2.5:4, 5:5, +Inf:5, and Prometheus
    # interpolates linearly inside the bucket holding rank q*count:
    #   q=0.5 -> rank 2.5 in (0.25, 0.5] going 2->3: 0.25 + 0.25 * 0.5 = 0.375
    #   q=0.9 -> rank 4.5 in (2.5, 5]    going 4->5: 2.5  + 2.5  * 0.5 = 3.75
    q = 'histogram_quantile({}, dspark_test_seconds_bucket{{job="exporter"}})'
    assert scraped.query_value(q.format(0.5)) == pytest.approx(0.375)
    assert scraped.query_value(q.format(0.9)) == pytest.approx(3.75)
    assert scraped.query_value('dspark_test_seconds_bucket{job="exporter",le="0.25"}') == 2


def test_query_errors_carry_prometheus_message(scraped: PrometheusServer) -> None:
    with pytest.raises(PrometheusError, match="parse error"):
        scraped.query("sum(")
    with pytest.raises(PrometheusError, match="expected one sample, got 0"):
        scraped.query_value("no_such_metric_anywhere")
    (t,) = [t for t in scraped.targets() if t["labels"]["job"] == "exporter"]
    assert t["health"] == "up"
    assert t["scrapeUrl"] == f"http://{t['labels']['instance']}/metrics"


def test_promtool_accepts_client_exposition(registry: CollectorRegistry) -> None:
    proc = promtool_check_metrics(generate_latest(registry))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("text", "code", "complaint"),
    [
        # Lint finding (exit 3): counters must end in _total.
        (
            "# HELP foo A counter.\n# TYPE foo counter\nfoo 1\n",
            3,
            'should have "_total" suffix',
        ),
        # Parse error (exit 1): a label value that never closes.
        ('# TYPE bar_total counter\nbar_total{a="b 1\n', 1, "parsing error"),
    ],
    ids=["counter-without-total", "malformed-line"],
)
def test_promtool_rejects_bad_exposition(text: str, code: int, complaint: str) -> None:
    proc = promtool_check_metrics(text)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert complaint in proc.stdout + proc.stderr


def test_config_is_valid_for_promtool(scraped: PrometheusServer) -> None:
    check = subprocess.run(
        ["promtool", "check", "config", str(scraped.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_basic_auth_passes_through(scraped: PrometheusServer) -> None:
    scraped.wait_until_up("auth_ok")
    assert scraped.query_value('dspark_test_total{job="auth_ok"}') == 42
    # The wrong password must be a visible scrape failure, not a silent success.
    scraped.wait_for('up{job="auth_bad"}', lambda r: len(r) == 1)
    assert scraped.query_value('up{job="auth_bad"}') == 0
    (bad,) = [t for t in scraped.targets() if t["labels"]["job"] == "auth_bad"]
    assert "401" in bad["lastError"]
    with pytest.raises(TimeoutError, match="401"):
        scraped.wait_until_up("auth_bad", timeout=0.5)


def test_https_tls_config_passes_through(scraped: PrometheusServer) -> None:
    if not any(job["job_name"] == "tls" for job in scraped.jobs):
        pytest.skip("openssl CLI needed to mint a test certificate")
    (target,) = scraped.wait_until_up("tls")
    assert target["scrapeUrl"].startswith("https://")
    assert scraped.query_value('dspark_test_total{job="tls"}') == 42

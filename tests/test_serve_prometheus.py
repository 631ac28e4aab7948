"""Acceptance: a stock Prometheus scrapes `dspark-obs serve` and PromQL sees the run's numbers.

The expected values are computed here, straight from the run's Parquet files with polars and
numpy, and never through the package's aggregates: comparing the exporter with its own
arithmetic would only prove it agrees with itself. The served process replays the same run
the expectations are read from, so every counter, ratio and per-position ECE must match to
float64 precision after the round trip through exposition text, Prometheus' TSDB and its
query API.

The second half runs the same service behind TLS, client certificates and basic auth, and
checks both a plain client and a real Prometheus job configured the way docs/security.md
tells operators to.

One Prometheus serves the whole module: 2.42 waits several seconds before its first scrape,
and paying that once keeps the suite fast.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import polars as pl
import pytest
from dspark_obs.exporters.web_config import hash_password

from bench.serve_child import serve_args
from dspark_obs.store.layout import in_memory

from .pki import PKI, make_pki
from .prometheus_harness import (
    WAIT,
    PrometheusServer,
    promtool_check_metrics,
    require_prometheus,
    scrape_job,
)
from .test_serve_cli import OPENER, Child

require_prometheus()

JOB = "dspark"
MTLS_JOB = "dspark_mtls"
BAD_AUTH_JOB = "dspark_mtls_wrong_password"
USER = "prometheus"
PASSWORD = "scrape me, not my secrets"
# SGLang's calibration table: clamp, 15 equal-width bins on [0, 1].
EPS = 1e-8
ECE_BINS = 15


# --- expectations, from Parquet alone -------------------------------------------------------


def ece15(pred: np.ndarray, label: np.ndarray) -> float:
    """SGLang's ECE: sum over bins of rows * |mean prediction - observed rate|, over all rows."""
    p = np.clip(np.asarray(pred, dtype=np.float64), EPS, 1.0 - EPS)
    b = np.minimum(np.floor(p * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    rows = np.bincount(b, minlength=ECE_BINS)
    p_sum = np.bincount(b, weights=p, minlength=ECE_BINS)
    y_sum = np.bincount(b, weights=np.asarray(label, dtype=np.float64), minlength=ECE_BINS)
    used = rows > 0
    gap = np.abs(p_sum[used] / rows[used] - y_sum[used] / rows[used])
    return float((rows[used] * gap).sum() / rows.sum())


@dataclass(frozen=True)
class Expected:
    steps: int
    batch_size_sum: int
    rows: dict[str, int]
    window_sum: dict[str, int]
    window_le3: dict[str, int]
    shadow_ceiling_sum: dict[str, int]
    utilisation: dict[str, float]
    ece: dict[tuple[str, str], float]
    cost_steps: int
    cost_abs_error_mean_s: float


@pytest.fixture(scope="module")
def expected(compact_run) -> Expected:
    run_dir, _ = compact_run
    steps = pl.read_parquet(str(run_dir / "steps" / "part-*.parquet"))
    reqs = in_memory(pl.read_parquet(str(run_dir / "requests" / "part-*.parquet")))
    # What makes the arithmetic below the whole truth: one mode and rank (so workload alone
    # keys a series), a complete shadow ceiling on every row (so every position is labelled)
    # and finite survival everywhere.
    assert reqs["mode"].unique().to_list() == ["compact"]
    assert reqs["rank"].unique().to_list() == [0]
    assert reqs["shadow_ceiling"].null_count() == 0
    survival_all = reqs["survival"].to_numpy()
    gamma = survival_all.shape[1]
    assert survival_all.shape == (reqs.height, gamma) and np.isfinite(survival_all).all()

    window = pl.col("verify_len") - 1  # SGLang: drafts verified = verify_len - 1
    per = (
        reqs.group_by("workload")
        .agg(
            rows=pl.len(),
            window_sum=window.sum(),
            window_le3=(window <= 3).sum(),
            ceiling_sum=pl.col("shadow_ceiling").sum(),
            accepted_sum=pl.col("correct_drafts").sum(),
        )
        .sort("workload")
    )
    ece: dict[tuple[str, str], float] = {}
    for (workload,), group in reqs.group_by(["workload"]):
        survival = group["survival"].to_numpy()
        ceiling = group["shadow_ceiling"].to_numpy()
        labels = np.arange(gamma)[None, :] < ceiling[:, None]  # first j+1 drafts accepted
        for j in range(gamma):
            ece[(workload, str(j))] = ece15(survival[:, j], labels[:, j])

    assert steps["step_gpu_ms"].null_count() == 0
    assert steps["predicted_step_ms"].null_count() == 0
    abs_err = (steps["step_gpu_ms"] - steps["predicted_step_ms"]).abs().to_numpy() / 1e3

    def col(name: str) -> dict[str, int]:
        return dict(zip(per["workload"].to_list(), per[name].to_list(), strict=True))

    accepted, ceiling = col("accepted_sum"), col("ceiling_sum")
    return Expected(
        steps=steps.height,
        batch_size_sum=int(steps["bs"].sum()),
        rows=col("rows"),
        window_sum=col("window_sum"),
        window_le3=col("window_le3"),
        shadow_ceiling_sum=ceiling,
        utilisation={w: accepted[w] / ceiling[w] for w in accepted},
        ece=ece,
        cost_steps=steps.height,
        cost_abs_error_mean_s=float(abs_err.mean()),
    )


# --- the served exporters -------------------------------------------------------------------


def _hostport(url: str) -> str:
    return urlsplit(url).netloc


@pytest.fixture(scope="module")
def plain_url(compact_run, tmp_path_factory) -> Iterator[str]:
    run_dir, _ = compact_run
    child = Child(
        *serve_args(f"run:{run_dir}", speed=0), workdir=tmp_path_factory.mktemp("serve-plain")
    )
    try:
        yield child.url()
        assert child.stop() == 0, child.describe()
    finally:
        child.kill()


@dataclass(frozen=True)
class Secured:
    url: str
    pki: PKI
    password_file: Path


@pytest.fixture(scope="module")
def secured(compact_run, tmp_path_factory) -> Iterator[Secured]:
    run_dir, _ = compact_run
    d = tmp_path_factory.mktemp("serve-mtls")
    pki = make_pki(d)
    web_config = d / "web-config.json"
    # Relative paths, next to the certs, as an operator's file would have them; JSON so the
    # test does not depend on PyYAML. Cost 4: the tests exercise the logic, not the work
    # factor, and the wrong-password job pays one bcrypt check per scrape.
    web_config.write_text(
        json.dumps(
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": "ca.crt",
                },
                "basic_auth_users": {USER: hash_password(PASSWORD, rounds=4)},
            }
        )
    )
    password_file = d / "password"
    password_file.write_text(PASSWORD)
    child = Child(
        *serve_args(f"run:{run_dir}", speed=0), "--web-config", str(web_config), workdir=d / "proc"
    )
    try:
        url = child.url()
        assert url.startswith("https://127.0.0.1:")
        yield Secured(url, pki, password_file)
        assert child.stop() == 0, child.describe()
    finally:
        child.kill()


@pytest.fixture(scope="module")
def prom(plain_url, secured, expected) -> Iterator[PrometheusServer]:
    tls_config = {
        "ca_file": str(secured.pki.ca),
        "cert_file": str(secured.pki.client_cert),
        "key_file": str(secured.pki.client_key),
    }
    target = [_hostport(secured.url)]
    jobs = [
        scrape_job(JOB, [_hostport(plain_url)]),
        scrape_job(
            MTLS_JOB,
            target,
            scheme="https",
            tls_config=tls_config,
            basic_auth={"username": USER, "password_file": str(secured.password_file)},
        ),
        scrape_job(
            BAD_AUTH_JOB,
            target,
            scheme="https",
            tls_config=tls_config,
            basic_auth={"username": USER, "password": PASSWORD + "!"},
        ),
    ]
    with PrometheusServer(jobs, scrape_interval="1s") as server:
        server.wait_until_up(JOB)
        # The replay may still be running at the first scrape; wait for its final values.
        server.wait_for(
            f'dspark_ingest_records_total{{job="{JOB}"}}',
            lambda r: len(r) == 1 and float(r[0]["value"][1]) == expected.steps,
        )
        yield server


def by_workload(prom: PrometheusServer, promql: str) -> dict[str, float]:
    result = prom.query(promql)
    out: dict[str, float] = {}
    for sample in result:
        labels = sample["metric"]
        assert labels.get("mode") == "compact" and labels.get("rank") == "0", labels
        assert labels["workload"] not in out, f"{promql}: two series for one workload: {result}"
        out[labels["workload"]] = float(sample["value"][1])
    return out


def assert_close(got: dict, want: dict, rel: float = 0.0, abs_tol: float = 0.0) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=abs_tol), key


# --- plain HTTP: what Prometheus stored ------------------------------------------------------


def test_promtool_accepts_a_raw_scrape(plain_url, prom):
    """After the replay is in (`prom` waits for it), so every family has samples."""
    with OPENER.open(plain_url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        body = resp.read()
    checked = promtool_check_metrics(body)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert b"# TYPE dspark_confidence_ece_cumulative gauge" in body


def test_request_steps_and_windows_per_workload(prom, expected):
    sel = f'job="{JOB}"'
    assert by_workload(prom, f"dspark_request_steps_total{{{sel}}}") == expected.rows
    mean_window = by_workload(
        prom, f"dspark_window_tokens_sum{{{sel}}} / dspark_window_tokens_count{{{sel}}}"
    )
    want = {w: expected.window_sum[w] / expected.rows[w] for w in expected.rows}
    assert_close(mean_window, want, rel=1e-12)
    # Prometheus 2.x keeps `le` as exposed; the integer buckets are written as "3".
    le3 = by_workload(prom, f'dspark_window_tokens_bucket{{{sel},le="3"}}')
    assert le3 == expected.window_le3


def test_shadow_ceiling_and_utilisation(prom, expected):
    sel = f'job="{JOB}"'
    ceiling = by_workload(prom, f'dspark_ceiling_tokens_sum{{{sel},source="shadow"}}')
    assert ceiling == expected.shadow_ceiling_sum
    # Compact rows never observe their own ceiling; only the shadow twin provides it.
    assert prom.query(f'dspark_ceiling_tokens_count{{{sel},source="observed"}}') == []
    utilisation = by_workload(prom, f"dspark_utilisation_cumulative_ratio{{{sel}}}")
    assert_close(utilisation, expected.utilisation, rel=1e-9)


def test_cumulative_ece_for_every_position(prom, expected):
    result = prom.query(f'dspark_confidence_ece_cumulative{{job="{JOB}"}}')
    got = {(s["metric"]["workload"], s["metric"]["position"]): float(s["value"][1]) for s in result}
    assert len(got) == len(result)
    assert_close(got, expected.ece, abs_tol=1e-9)
    # Every row is labelled at every position, since the shadow ceiling is always known.
    labelled = prom.query(f'dspark_confidence_labelled_total{{job="{JOB}"}}')
    assert {
        (s["metric"]["workload"], s["metric"]["position"]): float(s["value"][1]) for s in labelled
    } == {(w, j): expected.rows[w] for w, j in expected.ece}


def test_cost_model_mean_absolute_error(prom, expected):
    sel = f'job="{JOB}"'
    assert prom.query_value(f"dspark_cost_model_steps_total{{{sel}}}") == expected.cost_steps
    mae = prom.query_value(
        f"dspark_cost_model_abs_error_seconds_total{{{sel}}}"
        f" / dspark_cost_model_steps_total{{{sel}}}"
    )
    assert mae == pytest.approx(expected.cost_abs_error_mean_s, rel=1e-9)


def test_cost_model_error_by_context_bucket(prom, compact_run):
    """Per context bucket (mean prefix_len per request, power-of-two lower bounds from 64),
    the counters' sums from the Parquet files, after Prometheus' round trip."""
    run_dir, _ = compact_run
    steps = pl.read_parquet(str(run_dir / "steps" / "part-*.parquet"))
    reqs = in_memory(pl.read_parquet(str(run_dir / "requests" / "part-*.parquet")))
    mean = reqs.group_by("forward_ct").agg(mean=pl.col("prefix_len").mean())
    joined = steps.join(mean, on="forward_ct").sort("forward_ct")
    ctx = joined["mean"].to_numpy()
    p = joined["predicted_step_ms"].to_numpy() / 1e3
    y = joined["step_gpu_ms"].to_numpy() / 1e3
    lower = np.where(ctx < 64, 0, 2 ** np.floor(np.log2(np.maximum(ctx, 1)))).astype(int)
    columns = {
        "steps": np.ones_like(p),
        "predicted_seconds": p,
        "measured_seconds": y,
        "squared_error": (y - p) ** 2,
        "relative_error": np.abs(y - p) / y,
        "tokens": ctx,
    }
    for name, values in columns.items():
        result = prom.query(f'dspark_cost_model_context_{name}_total{{job="{JOB}"}}')
        got = {int(r["metric"]["context"]): float(r["value"][1]) for r in result}
        want = {int(k): float(values[lower == k].sum()) for k in np.unique(lower)}
        assert got.keys() == want.keys(), name
        assert_close(got, want, rel=1e-9)


def test_step_counters(prom, expected):
    sel = f'job="{JOB}"'
    assert prom.query_value(f"dspark_steps_total{{{sel}}}") == expected.steps
    assert prom.query_value(f"dspark_batch_size_count{{{sel}}}") == expected.steps
    assert prom.query_value(f"dspark_batch_size_sum{{{sel}}}") == expected.batch_size_sum
    assert prom.query_value(f"sum(dspark_ingest_errors_total{{{sel}}}) or vector(0)") == 0


# --- TLS, client certificates and basic auth -------------------------------------------------


def _opener(secured: Secured, *, client_cert: bool = True, max_tls12: bool = False):
    ctx = ssl.create_default_context(cafile=str(secured.pki.ca))
    if client_cert:
        ctx.load_cert_chain(secured.pki.client_cert, secured.pki.client_key)
    if max_tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )


def _get(opener, url: str, auth: tuple[str, str] | None):
    req = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    return opener.open(req, timeout=10)


def test_mtls_scrape_with_right_credentials(secured, expected):
    with _get(_opener(secured), secured.url, (USER, PASSWORD)) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("dspark_ingest_records_total{"))
    assert 0 < float(line.rsplit(" ", 1)[1]) <= expected.steps


@pytest.mark.parametrize("auth", [None, (USER, "wrong"), ("nobody", PASSWORD)])
def test_mtls_scrape_without_right_credentials_is_401(secured, auth):
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(_opener(secured), secured.url, auth)
    assert err.value.code == 401
    assert err.value.headers["WWW-Authenticate"] == 'Basic realm="dspark-obs"'


def test_no_client_certificate_fails_the_handshake(secured):
    # Under TLS 1.2 the server's refusal is part of the handshake itself.
    with pytest.raises(urllib.error.URLError) as err:
        _get(_opener(secured, client_cert=False, max_tls12=True), secured.url, (USER, PASSWORD))
    assert isinstance(err.value.reason, ssl.SSLError), err.value.reason
    # Under TLS 1.3 the client finishes first and learns of the refusal on its first read;
    # either way no response is ever served.
    with pytest.raises((OSError, http.client.HTTPException)):
        _get(_opener(secured, client_cert=False), secured.url, (USER, PASSWORD)).read()


def test_prometheus_scrapes_through_mtls_and_basic_auth(prom, expected):
    prom.wait_until_up(MTLS_JOB)
    assert prom.query_value(f'up{{job="{MTLS_JOB}"}}') == 1
    prom.wait_for(
        f'dspark_ingest_records_total{{job="{MTLS_JOB}"}}',
        lambda r: len(r) == 1 and float(r[0]["value"][1]) == expected.steps,
    )


def test_prometheus_with_a_wrong_password_is_refused(prom):
    deadline = time.monotonic() + WAIT
    while True:
        mine = [t for t in prom.targets() if t["labels"]["job"] == BAD_AUTH_JOB]
        if mine and mine[0]["health"] == "down":
            break
        assert time.monotonic() < deadline, f"never scraped and refused: {mine}"
        time.sleep(0.2)
    assert "401" in mine[0]["lastError"], mine[0]
    assert prom.query_value(f'up{{job="{BAD_AUTH_JOB}"}}') == 0

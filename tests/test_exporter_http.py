"""The exporter's HTTP side over real loopback sockets: plain, TLS, mTLS and basic auth.

Certificates are minted once per session with `cryptography`; nothing is mocked, because the
failure modes that matter (handshakes, ragged closes, a port left bound) only show up on a
real socket.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import importlib.util
import json
import socket
import ssl
from pathlib import Path

import pytest
from dspark_obs.exporters import MetricsServer, hash_password, load_web_config
from prometheus_client import CollectorRegistry, Counter

from .pki import PKI, make_pki

PASSWORD = "correct horse"
# Cost 4 is bcrypt's minimum: the tests exercise the logic, not the work factor.
USERS = {"prom": hash_password(PASSWORD, rounds=4)}


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("dspark_test_scrapes", "Counter the tests expect to see.", registry=reg).inc(3)
    return reg


def _config(pki: PKI, name: str, body: dict) -> Path:
    """Web configs live next to the certs and use relative paths, as an operator's would."""
    path = pki.dir / f"{name}.json"
    path.write_text(json.dumps(body))
    return path


def _tls(**extra) -> dict:
    return {"cert_file": "server.crt", "key_file": "server.key", **extra}


def _client_ctx(pki: PKI, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def fetch(
    port: int,
    path: str = "/metrics",
    *,
    ctx: ssl.SSLContext | None = None,
    method: str = "GET",
    headers: dict | None = None,
    auth: tuple[str, str] | None = None,
    body: bytes | None = None,
):
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    headers = dict(headers or {})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


# --- plain HTTP -------------------------------------------------------------------------------


def test_plain_scrape_pages_and_health(registry):
    with MetricsServer(registry, port=0) as srv:
        host, port = srv.address
        assert host == "127.0.0.1" and port > 0
        status, headers, body = fetch(port)
        assert status == 200
        assert b"dspark_test_scrapes_total 3.0" in body
        assert headers["Content-Type"].startswith("text/plain")
        assert "Python" not in headers["Server"]

        status, headers, body = fetch(port, "/")
        assert status == 200 and b'href="/metrics"' in body
        assert headers["Content-Type"].startswith("text/html")
        assert fetch(port, "/-/healthy")[::2] == (200, b"OK")
        assert fetch(port, "/nope")[0] == 404


def test_gzip_and_openmetrics_negotiation(registry):
    with MetricsServer(registry, port=0) as srv:
        port = srv.address[1]
        status, headers, body = fetch(port, headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert b"dspark_test_scrapes_total 3.0" in gzip.decompress(body)

        status, headers, body = fetch(port, headers={"Accept": "application/openmetrics-text"})
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith(b"# EOF")


def test_non_get_and_oversized_bodies_are_rejected(registry):
    with MetricsServer(registry, port=0) as srv:
        port = srv.address[1]
        status, headers, _ = fetch(port, method="POST", body=b"x" * 1000)
        assert status == 405 and headers["Allow"] == "GET"
        assert fetch(port, method="DELETE")[0] == 405

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.putrequest("GET", "/metrics")
        conn.putheader("Content-Length", str(64 * 1024 + 1))
        conn.endheaders()  # no body sent: the server must answer without reading it
        assert conn.getresponse().status == 413
        conn.close()
        assert fetch(port)[0] == 200


def test_port_zero_and_stop_frees_the_port(registry):
    srv = MetricsServer(registry, port=0)
    _, port = srv.start()
    with pytest.raises(RuntimeError):
        srv.start()
    assert fetch(port)[0] == 200
    srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    # The same port can be taken again at once, by us or anyone.
    with MetricsServer(registry, port=port) as again:
        assert again.address[1] == port
        assert fetch(port)[0] == 200


# --- basic auth -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(pki, registry):
    with MetricsServer(
        registry, port=0, web_config=_config(pki, "auth", {"basic_auth_users": USERS})
    ) as srv:
        yield srv.address[1]


def test_basic_auth_rejects_missing_and_wrong_credentials(auth_server):
    status, headers, _ = fetch(auth_server)
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Basic realm="dspark-obs"'
    assert fetch(auth_server, auth=("prom", "wrong"))[0] == 401
    assert fetch(auth_server, auth=("prometheus", PASSWORD))[0] == 401
    assert fetch(auth_server, auth=("prom", PASSWORD + "x" * 80))[0] == 401
    assert fetch(auth_server, headers={"Authorization": "Basic !!!not-base64"})[0] == 401
    assert fetch(auth_server, headers={"Authorization": "Bearer abc"})[0] == 401
    # Every path is protected, health included.
    assert fetch(auth_server, "/-/healthy")[0] == 401
    assert fetch(auth_server, "/")[0] == 401


def test_basic_auth_accepts_right_credentials_repeatedly(auth_server):
    for _ in range(3):  # later rounds hit the verification cache
        status, _, body = fetch(auth_server, auth=("prom", PASSWORD))
        assert status == 200 and b"dspark_test_scrapes_total 3.0" in body
    # A cached success must not make a wrong password pass.
    assert fetch(auth_server, auth=("prom", "wrong"))[0] == 401


# --- TLS and mTLS -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(pki, registry):
    with MetricsServer(
        registry, port=0, web_config=_config(pki, "tls", {"tls_server_config": _tls()})
    ) as srv:
        yield srv


def test_tls_scrape_verified_against_ca(pki, tls_server):
    assert tls_server.url.startswith("https://127.0.0.1:")
    status, _, body = fetch(tls_server.address[1], ctx=_client_ctx(pki))
    assert status == 200 and b"dspark_test_scrapes_total 3.0" in body


def test_tls_port_refuses_plain_http(tls_server):
    with pytest.raises((OSError, http.client.HTTPException)):
        fetch(tls_server.address[1])


def test_tls_server_survives_bad_handshakes_and_idle_clients(pki, tls_server):
    port = tls_server.address[1]
    untrusting = ssl.create_default_context()  # does not know our CA
    with pytest.raises(ssl.SSLError):
        fetch(port, ctx=untrusting)
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"\x16\x03\x01 garbage that is not a ClientHello")
    # A client that connects and never speaks must not block others' handshakes.
    with socket.create_connection(("127.0.0.1", port)):
        for _ in range(2):
            assert fetch(port, ctx=_client_ctx(pki))[0] == 200


def test_tls13_minimum_refuses_tls12_clients(pki, registry):
    cfg = _config(pki, "tls13", {"tls_server_config": _tls(min_version="TLS13")})
    with MetricsServer(registry, port=0, web_config=cfg) as srv:
        old = _client_ctx(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            fetch(srv.address[1], ctx=old)
        assert fetch(srv.address[1], ctx=_client_ctx(pki))[0] == 200


@pytest.fixture(scope="module")
def mtls_server(pki, registry):
    tls = _tls(client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt")
    cfg = _config(pki, "mtls", {"tls_server_config": tls})
    with MetricsServer(registry, port=0, web_config=cfg) as srv:
        yield srv.address[1]


def test_mtls_requires_a_client_cert_from_the_ca(pki, mtls_server):
    # Under TLS 1.3 the rejection can surface at the handshake or at the first read.
    with pytest.raises((OSError, http.client.HTTPException)):
        fetch(mtls_server, ctx=_client_ctx(pki))
    with pytest.raises((OSError, http.client.HTTPException)):
        fetch(mtls_server, ctx=_client_ctx(pki, pki.rogue_cert, pki.rogue_key))
    status, _, body = fetch(mtls_server, ctx=_client_ctx(pki, pki.client_cert, pki.client_key))
    assert status == 200 and b"dspark_test_scrapes_total 3.0" in body


def test_tls_and_basic_auth_together(pki, registry):
    cfg = _config(pki, "tls_auth", {"tls_server_config": _tls(), "basic_auth_users": USERS})
    with MetricsServer(registry, port=0, web_config=cfg) as srv:
        port, ctx = srv.address[1], _client_ctx(pki)
        assert fetch(port, ctx=ctx)[0] == 401
        assert fetch(port, ctx=ctx, auth=("prom", "nope"))[0] == 401
        assert fetch(port, ctx=ctx, auth=("prom", PASSWORD))[0] == 200


# --- web config -------------------------------------------------------------------------------


def test_web_config_resolves_relative_paths(pki):
    tls = _tls(client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt")
    cfg = load_web_config(_config(pki, "ok", {"tls_server_config": tls, "basic_auth_users": USERS}))
    assert cfg.tls is not None
    assert cfg.tls.cert_file == pki.server_cert.resolve()
    assert cfg.tls.client_ca_file == pki.ca.resolve()
    assert cfg.tls.requires_client_cert and cfg.tls.min_version == "TLS12"
    assert dict(cfg.basic_auth_users) == USERS


def test_empty_web_config_means_no_tls_no_auth(pki):
    path = pki.dir / "empty.yml"
    path.write_text("\n")
    cfg = load_web_config(path)
    assert cfg.tls is None and not cfg.basic_auth_users


MTLS = "RequireAndVerifyClientCert"
BAD_CONFIGS = [
    ({"tls_server_cfg": {}}, "tls_server_cfg"),
    ({"http_server_config": {"http2": True}}, "http_server_config"),
    ({"tls_server_config": {"cert_file": "server.crt"}}, "key_file"),
    ({"tls_server_config": _tls(cipher_suites="x")}, "cipher_suites"),
    ({"tls_server_config": _tls(cert_file="missing.crt")}, "cert_file"),
    ({"tls_server_config": _tls(key_file="ca.crt")}, "key_file"),
    ({"tls_server_config": _tls(client_auth_type=MTLS)}, "client_ca_file"),
    ({"tls_server_config": _tls(client_ca_file="ca.crt")}, "client_ca_file"),
    ({"tls_server_config": _tls(client_auth_type="RequestClientCert")}, "client_auth_type"),
    ({"tls_server_config": _tls(min_version="TLS11")}, "min_version"),
    ({"tls_server_config": _tls(client_auth_type=MTLS, client_ca_file="server.key")}, "client_ca"),
    ({"tls_server_config": ["server.crt"]}, "tls_server_config"),
    ({"basic_auth_users": {"prom": "plaintext"}}, "basic_auth_users.prom"),
    ({"basic_auth_users": {"prom": "$1$abc$" + "x" * 22}}, "basic_auth_users.prom"),
    ({"basic_auth_users": {"a:b": USERS["prom"]}}, "basic_auth_users"),
    ({"basic_auth_users": ["prom"]}, "basic_auth_users"),
    # a key meant to turn authentication on that would leave /metrics open
    ({"basic_auth_users": {}}, "basic_auth_users names no user"),
    ({"basic_auth_users": None}, "basic_auth_users names no user"),
    (
        {"basic_auth_users": {"a": json.loads("[" * 70 + "1" + "]" * 70)}},
        "nested 72 levels",
    ),  # the two outer objects count
    (["tls_server_config"], "mapping"),
]


@pytest.mark.parametrize(("body", "key"), BAD_CONFIGS)
def test_bad_web_configs_name_file_and_key(pki, body, key):
    path = _config(pki, "bad", body)
    with pytest.raises(ValueError) as err:
        load_web_config(path)
    assert str(path) in str(err.value)
    assert key in str(err.value)


def test_unparseable_web_config_explains_itself(pki):
    path = pki.dir / "broken.yml"
    path.write_text("tls_server_config: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yml") as err:
        load_web_config(path)
    if importlib.util.find_spec("yaml") is None:
        assert "PyYAML" in str(err.value)
    else:
        assert "YAML" in str(err.value)


def test_missing_web_config_file(pki):
    with pytest.raises(ValueError, match=r"nowhere\.json"):
        MetricsServer(CollectorRegistry(), port=0, web_config=pki.dir / "nowhere.json")


def test_hash_password_rejects_what_bcrypt_would_truncate():
    with pytest.raises(ValueError, match="72"):
        hash_password("x" * 73)
    with pytest.raises(ValueError, match="empty"):
        hash_password("")
    assert USERS["prom"].startswith("$2b$04$")

"""Hostile configs, secrets, Prometheus and Grafana answers, and ring slots: each refused or
skipped with its message and its count, never a traceback, a hang or plain HTTP."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from dspark_obs.exporters.http_server import MetricsServer
from dspark_obs.exporters.web_config import MAX_BCRYPT_COST, load_web_config

from dspark_obs.cli.main import main as cli_main
from dspark_obs.secret_text import check_secret, redact

x509 = pytest.importorskip("cryptography.x509")


def make_cert(tmp: Path, *, days=(-1, 30), names=("localhost",)) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now + dt.timedelta(days=days[0]))
        .not_valid_after(now + dt.timedelta(days=days[1]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    c, k = tmp / "cert.pem", tmp / "key.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return c, k


# -- class 6: TLS config and secrets -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["tls_server_config:\n", "tls_server_config: {}\n", '{"tls_server_config": null}'],
    ids=["empty", "empty-mapping", "json-null"],
)
def test_an_empty_tls_server_config_refuses_to_start(tmp_path, text):
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"tls_server_config is empty.*plain HTTP"):
        load_web_config(path)


def test_a_repeated_key_refuses_to_start(tmp_path):
    cert, key = make_cert(tmp_path)
    yml = tmp_path / "web.yml"
    yml.write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\ntls_server_config:\n"
    )
    with pytest.raises(ValueError, match="key 'tls_server_config' given twice"):
        load_web_config(yml)
    js = tmp_path / "web.json"
    js.write_text('{"basic_auth_users": {"a": "x"}, "basic_auth_users": null}')
    with pytest.raises(ValueError, match="given twice"):
        load_web_config(js)


def test_a_bcrypt_cost_over_the_cap_is_refused(tmp_path):
    # a well-formed cost-31 hash: checking it would take days, so it is never checked
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  u: $2b$31$" + "a" * 53 + "\n")
    with pytest.raises(ValueError, match=f"bcrypt cost 31 is over {MAX_BCRYPT_COST}"):
        load_web_config(path)


@pytest.mark.parametrize(
    ("days", "names", "host", "problem"),
    [
        ((-30, -1), ("localhost",), "localhost", "expired on"),
        ((2, 30), ("localhost",), "localhost", "not valid until"),
        ((-1, 30), ("other.example",), "127.0.0.1", "does not name '127.0.0.1'"),
    ],
    ids=["expired", "not-yet-valid", "wrong-host"],
)
def test_certificate_problems_are_warned_by_name(tmp_path, caplog, days, names, host, problem):
    cert, key = make_cert(tmp_path, days=days, names=names)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    with caplog.at_level(logging.WARNING, "dspark_obs.exporters.http_server"):
        MetricsServer(metrics_app=lambda e, s: [], host=host, port=0, web_config=web)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and problem in warned[0], warned


def test_a_good_certificate_warns_nothing(tmp_path, caplog):
    cert, key = make_cert(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    with caplog.at_level(logging.WARNING):
        MetricsServer(metrics_app=lambda e, s: [], host="localhost", port=0, web_config=web)
    assert not caplog.records


SECRET = "abcd1234\nTOPSECRETTAIL"


def test_check_secret_names_the_character_never_the_key():
    with pytest.raises(ValueError) as err:
        check_secret(SECRET, "--token-file t")
    msg = str(err.value)
    assert "character 9 of 22 is a line break" in msg
    assert "abcd" not in msg and "TOPSECRET" not in msg
    assert redact(f"header {SECRET!s} bad", SECRET) == "header <redacted> bad"


@pytest.mark.parametrize(
    "argv",
    [
        ["runtime-server", "--port", "0", "--api-key-file", "{key}"],
        ["dashboards", "push", "--grafana-url", "http://127.0.0.1:9", "--token-file", "{key}"],
        ["shadow", "--production", "http://127.0.0.1:9", "--shadow", "http://127.0.0.1:9",
         "--requests", "4", "--out", "{out}", "--sglang-api-key-file", "{key}"],
    ],
    ids=["runtime-server", "dashboards-push", "shadow"],
)  # fmt: skip
def test_a_key_with_a_newline_is_refused_and_never_printed(tmp_path, argv):
    key = tmp_path / "key"
    key.write_text(SECRET + "\n")
    argv = [a.format(key=key, out=tmp_path / "out") for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "TOPSECRET" not in proc.stderr + proc.stdout
    assert "abcd1234" not in proc.stderr + proc.stdout
    assert "a line break" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- class 7: hostile Prometheus and Grafana -----------------------------------------------


class Hostile(BaseHTTPRequestHandler):
    mode = "deep"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.mode == "trickle":
            self.end_headers()
            try:
                for _ in range(400):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    threading.Event().wait(0.05)
            except OSError:
                pass
            return
        if self.mode == "huge":
            self.send_header("Content-Length", str(400 << 20))
            self.end_headers()
            try:
                for _ in range(400):
                    self.wfile.write(b" " * (1 << 20))
            except OSError:
                pass
            return
        body = {
            "deep": b"[" * 100_000 + b"]" * 100_000,
            "status": json.dumps({"status": ["success"]}).encode(),
            "metric": json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": 5}]}}
            ).encode(),
            "values": json.dumps(
                {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1]]}]},
                }
            ).encode(),
        }[self.mode]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@pytest.fixture
def hostile():
    handler = type("H", (Hostile,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("deep", "nested 100000 levels deep"),
        ("status", "not an API answer"),
        ("metric", "not a range answer"),
        ("values", "not a range answer"),
        ("trickle", "no whole answer within 1 s"),
        ("huge", "over the 33,554,432 limit"),
    ],
)
def test_render_refuses_a_hostile_prometheus_in_one_line(hostile, tmp_path, capsys, mode, message):
    url, handler = hostile
    handler.mode = mode
    if mode in ("metric", "values"):  # the check query passes; the panels' answers are bad
        answers = iter(["ok"])
        real = Hostile.do_GET

        def do_get(self):
            if next(answers, None) == "ok":
                body = b'{"status":"success","data":{"resultType":"scalar","result":[0,"1"]}}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            real(self)

        handler.do_GET = do_get
    code = cli_main(["dashboards", "render", "--prometheus", url, "--out", str(tmp_path / "r"),
                     "--timeout", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err


def test_push_escapes_grafana_url_and_refuses_a_bad_answer(tmp_path, capsys):
    class Grafana(BaseHTTPRequestHandler):
        answer: ClassVar[dict] = {"url": "/d/x\x1b[31mRED"}

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.dumps(self.answer).encode()
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Grafana)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "t"
    token.write_text("glsa_x")
    argv = ["dashboards", "push", "--grafana-url", f"http://127.0.0.1:{server.server_address[1]}",
            "--token-file", str(token)]  # fmt: skip
    try:
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "/d/x\\x1b[31mRED" in out
        Grafana.answer = {"url": ["not", "a", "string"]}
        assert cli_main(argv) == 2
        assert "not the API's answer" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()

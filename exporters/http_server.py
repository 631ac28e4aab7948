"""HTTP(S) endpoint that serves /metrics behind optional TLS and basic auth.

prometheus_client's own `start_http_server` cannot do basic auth, performs TLS handshakes on the
accepting thread (one silent client stalls every scrape) and prints to stderr on every error, so
we run our own small threading WSGI server and reuse only its exposition app.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import socket
import socketserver
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

import bcrypt
from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

from dspark_obs.http_strict import SOCKET_TIMEOUT, BoundedThreadingServer, StrictRequestHandler

from .web_config import WebConfig, certificate_problems, load_web_config

__all__ = ["MAX_BODY_BYTES", "REALM", "MetricsServer"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
REALM = "dspark-obs"
# serve_forever only notices shutdown() between polls, so this bounds how long stop() takes.
_POLL_INTERVAL = 0.1
_AUTH_CACHE_SIZE = 256
_BCRYPT_MAX_BYTES = 72
_INDEX = (
    b"<!doctype html>\n<html><head><title>dspark-obs exporter</title></head>\n"
    b'<body><h1>dspark-obs exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>\n'
)

App = Callable[[dict, Callable], Iterable[bytes]]


def _reply(start_response: Callable, status: str, body: bytes, headers=()) -> list[bytes]:
    start_response(
        status,
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            *headers,
        ],
    )
    return [body]


def _router(metrics_app: App) -> App:
    def route(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/":
            start_response(
                "200 OK",
                [
                    ("Content-Type", "text/html; charset=utf-8"),
                    ("Content-Length", str(len(_INDEX))),
                ],
            )
            return [_INDEX]
        if path == "/-/healthy":
            return _reply(start_response, "200 OK", b"OK")
        return _reply(start_response, "404 Not Found", b"Not Found\n")

    return route


def _guard(app: App) -> App:
    """Outermost layer: cheap rejections happen before anyone pays for bcrypt."""

    def guarded(environ, start_response):
        def with_server_header(status, headers, exc_info=None):
            # Replaces wsgiref's default, which advertises the exact Python version.
            return start_response(status, [*headers, ("Server", REALM)], exc_info)

        # the request was read strictly (http_strict): no Transfer-Encoding, digits only here
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length > MAX_BODY_BYTES:
            return _reply(with_server_header, "413 Content Too Large", b"Body too large\n")
        if length:
            # Unread bytes make the kernel answer our close() with RST, which can destroy
            # the response before the client reads it.
            try:
                environ["wsgi.input"].read(length)
            except OSError:
                pass
        if environ.get("REQUEST_METHOD") != "GET":
            return _reply(
                with_server_header, "405 Method Not Allowed", b"Only GET\n", [("Allow", "GET")]
            )
        return app(environ, with_server_header)

    return guarded


def _parse_basic(header: str) -> tuple[bytes, bytes] | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    return (user, password) if sep else None


class _BasicAuth:
    """Basic-auth middleware. Prometheus re-sends the same credentials every scrape, and a
    bcrypt check costs tens of milliseconds, so successes are remembered in a bounded cache
    keyed by an HMAC of the password (never the password itself)."""

    def __init__(self, app: App, users: Mapping[str, str]):
        self._app = app
        self._users = [(u.encode("utf-8"), h.encode("ascii")) for u, h in users.items()]
        # Unknown users are checked against a dummy hash of the same cost, so response time
        # does not reveal which usernames exist.
        cost = max(int(h[4:6]) for _, h in self._users)
        self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=cost))
        self._cache_key = secrets.token_bytes(32)
        self._cache: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        creds = _parse_basic(environ.get("HTTP_AUTHORIZATION", ""))
        if creds is not None and self._verify(*creds):
            return self._app(environ, start_response)
        return _reply(
            start_response,
            "401 Unauthorized",
            b"Unauthorized\n",
            [("WWW-Authenticate", f'Basic realm="{REALM}"')],
        )

    def _verify(self, user: bytes, password: bytes) -> bool:
        hashed, known = self._dummy, False
        for name, candidate in self._users:  # no early exit: constant time over users
            if hmac.compare_digest(name, user):
                hashed, known = candidate, True
        key = (user, hmac.new(self._cache_key, password, hashlib.sha256).digest())
        with self._lock:
            if known and key in self._cache:
                self._cache.move_to_end(key)
                return True
        if len(password) > _BCRYPT_MAX_BYTES:
            return False  # bcrypt would compare only a prefix (or raise, in bcrypt>=5)
        ok = bcrypt.checkpw(password, hashed) and known
        if ok:
            with self._lock:
                self._cache[key] = None
                while len(self._cache) > _AUTH_CACHE_SIZE:
                    self._cache.popitem(last=False)
        else:
            log.debug("basic auth failed for user %r", user)
        return ok


class _LogStream:
    """Stands in for stderr so wsgiref's tracebacks go to logging, one record per error."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> None:
        self._parts.append(text)

    def flush(self) -> None:
        if self._parts:
            log.error("error in metrics handler:\n%s", "".join(self._parts).rstrip())
            self._parts.clear()


class _QuietHandler(StrictRequestHandler, WSGIRequestHandler):
    server_version = REALM
    sys_version = ""

    def handle(self) -> None:
        self.handle_one_request()  # wsgiref answers one request a connection

    def respond(self) -> None:
        handler = ServerHandler(
            self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=False
        )
        handler.request_handler = self
        handler.run(self.server.get_app())

    def log_message(self, format, *args):  # a scrape per second must not flood stderr
        log.debug("%s %s", self.client_address[0], format % args)

    def get_stderr(self):
        return _LogStream()


class _Server(BoundedThreadingServer, WSGIServer):
    label = "metrics server"

    def __init__(self, address, family: int, ssl_context: ssl.SSLContext | None):
        self.address_family = family
        self.ssl_context = ssl_context
        self.busy_reply = ssl_context is None  # no plain-text answer inside a TLS port
        super().__init__(address, _QuietHandler)

    def server_bind(self):
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup that can stall startup.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()

    def finish_request(self, request, client_address):
        """Handshake here, on the per-connection thread, so a failing or silent TLS client
        costs only its own thread rather than the accept loop."""
        if self.ssl_context is None:
            return super().finish_request(request, client_address)
        request.settimeout(SOCKET_TIMEOUT)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            return None
        try:
            return super().finish_request(tls, client_address)
        finally:
            self.shutdown_request(tls)


def _resolve(host: str, port: int) -> tuple[int, str]:
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, sockaddr[0]


class MetricsServer:
    """Serves `/metrics`, `/` and `/-/healthy` on a background daemon thread.

    TLS and client-certificate settings are loaded in the constructor, so a broken web config
    fails before anything is bound.
    """

    def __init__(
        self,
        registry: Collector | None = None,
        host: str = "127.0.0.1",
        port: int = 9464,
        web_config: WebConfig | str | os.PathLike | None = None,
        metrics_app: App | None = None,
    ):
        """Serve `registry` through prometheus_client, or any WSGI `metrics_app` at /metrics."""
        if (registry is None) == (metrics_app is None):
            raise ValueError("give exactly one of registry and metrics_app")
        if isinstance(web_config, (str, os.PathLike)):
            web_config = load_web_config(web_config)
        self.web_config = web_config or WebConfig()
        self.host, self.port = host, port
        tls = self.web_config.tls
        self._ssl_context = tls.ssl_context() if tls is not None else None
        if tls is not None:
            for problem in certificate_problems(tls.cert_file, host):
                log.warning("tls_server_config.cert_file %s: %s", tls.cert_file, problem)
        app: App = _router(metrics_app or make_wsgi_app(registry))
        if self.web_config.basic_auth_users:
            if tls is None:
                log.warning("basic auth is configured without TLS: passwords cross the network")
            app = _BasicAuth(app, self.web_config.basic_auth_users)
        self._app = _guard(app)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound address, which is how callers learn a port-0 port."""
        with self._lock:
            if self._httpd is not None:
                raise RuntimeError("MetricsServer is already running")
            family, addr = _resolve(self.host, self.port)
            httpd = _Server((addr, self.port), family, self._ssl_context)
            httpd.set_app(self._app)
            thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": _POLL_INTERVAL},
                name=f"dspark-obs-metrics-{httpd.server_address[1]}",
                daemon=True,
            )
            thread.start()
            self._httpd, self._thread = httpd, thread
            #: requests and connections refused, by reason (http_strict)
            self.refusals = httpd.refusals
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        httpd = self._httpd
        if httpd is None:
            raise RuntimeError("MetricsServer is not running")
        host, port = httpd.server_address[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"

    def stop(self) -> None:
        """Stop accepting and close the listening socket; safe to call twice."""
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""The few HTTP calls dspark-obs makes to an SGLang server, with SGLang's bearer token
(and to Prometheus and Grafana for `dashboards render` and `push`, with the same bounds).

Two promises rest here. The key goes to the configured origin only (scheme, host and
port): a redirect within it is followed, one elsewhere is refused before anything is
sent there (`http_origin`). And a call ends within its timeout whatever the server
does, connect, TLS, headers and body together, or at once when the caller's stop is
set: a watchdog shuts the socket down at the deadline, so a server dripping a byte at
a time cannot hold a poll (or a SIGTERM) open. urllib bounds each socket read
instead, and follows redirects with every header, so the calls use http.client.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from urllib.parse import urljoin, urlsplit

from ..http_origin import RedirectRefused, refuse_cross_origin

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Cancelled",
    "HTTPStatusError",
    "RedirectRefused",
    "ResponseTooLarge",
    "SGLangClient",
    "read_limited",
]

#: Default cap on one answer: far above what a drained record buffer holds between polls,
#: far below what would exhaust the memory of the machine running the exporter.
DEFAULT_MAX_BYTES = 256 << 20
_CHUNK = 1 << 20
#: Same-origin redirects followed before a call fails.
MAX_REDIRECTS = 3
#: How often the watchdog looks at the caller's stop event (seconds).
_WATCH_EVERY = 0.05


class ResponseTooLarge(ValueError):
    """An answer over the byte limit; refused before more than the limit was read."""

    reason = "oversized"


#: Bytes of an error answer's body kept for its message.
ERROR_BODY_BYTES = 64 << 10


class HTTPStatusError(OSError):
    """An answer with a status other than 2xx (and not a redirect that was followed); `body`
    holds at most `ERROR_BODY_BYTES` of what came with it."""

    def __init__(self, url: str, code: int, body: bytes = b"") -> None:
        super().__init__(f"{url}: HTTP {code}")
        self.code = code
        self.body = body


class Cancelled(Exception):
    """The caller's stop event was set while the call was under way; nothing was failed."""


class _Watchdog:
    """Shuts the call's socket down at its deadline or once `cancel` is set.

    The socket is named by its descriptor: TLS moves it into another socket object,
    and a shutdown reaches the connection through any descriptor of it. `fired` says
    why it acted; once `close` has run it never touches a descriptor again (the
    number may by then belong to something else).
    """

    def __init__(self, seconds: float, cancel: threading.Event | None) -> None:
        self.deadline = time.monotonic() + seconds
        self.cancel = cancel
        self.fired: str | None = None
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="http-deadline").start()

    def watch(self, fd: int | None) -> None:
        with self._lock:
            self._fd = fd
            if self.fired is not None and fd is not None:
                self._shutdown()

    def _why(self) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            return "cancelled"
        return "timeout" if time.monotonic() >= self.deadline else None

    def _run(self) -> None:
        while not self._done.wait(min(_WATCH_EVERY, max(0.0, self.deadline - time.monotonic()))):
            why = self._why()
            if why is not None:
                with self._lock:
                    if not self._done.is_set():
                        self.fired = why
                        self._shutdown()
                return

    def _shutdown(self) -> None:
        if self._fd is None:
            return
        try:
            with socket.socket(fileno=socket.dup(self._fd)) as dup:
                dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed or never connected: the call ends on its own

    def close(self) -> None:
        with self._lock:
            self._done.set()
            self._fd = None


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection whose socket the watchdog can shut down from the start."""

    def __init__(self, url: str, timeout: float, watchdog: _Watchdog) -> None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        port = parts.port or (http.client.HTTPS_PORT if tls else http.client.HTTP_PORT)
        super().__init__(parts.hostname, port, timeout=timeout)
        self.tls = ssl.create_default_context() if tls else None
        self.watchdog = watchdog

    def connect(self) -> None:
        error: OSError | None = None
        for family, kind, proto, _, address in socket.getaddrinfo(
            self.host, self.port, 0, socket.SOCK_STREAM
        ):
            sock = socket.socket(family, kind, proto)
            self.watchdog.watch(sock.fileno())
            try:
                sock.settimeout(self.timeout)
                sock.connect(address)
            except OSError as exc:
                self.watchdog.watch(None)
                sock.close()
                error = exc
                continue
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            self.sock = sock
            return
        raise error or OSError(f"{self.host}: no address")


def read_limited(resp, limit: int) -> bytes | bytearray:
    """The body of `resp`, or ResponseTooLarge once it passes `limit` bytes.

    A declared Content-Length over the limit is refused without reading the
    body; otherwise the body is read in chunks and abandoned at limit + 1
    bytes, so a server that lies about (or omits) its length cannot make us
    hold more than the limit. The chunks go into one growing buffer, never
    joined at the end: the answer is held once, not twice.
    """
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise ResponseTooLarge(f"answer of {int(declared):,} bytes, over the {limit:,} limit")
    body = bytearray()
    while chunk := resp.read(min(_CHUNK, limit + 1 - len(body))):
        body += chunk
        if len(body) > limit:
            raise ResponseTooLarge(f"answer over the {limit:,} byte limit")
    if declared is not None and declared.strip().isdigit() and len(body) != int(declared):
        raise ValueError(f"truncated answer: {len(body):,} of {int(declared):,} bytes")
    return body


class SGLangClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r}: expected an http:// or https:// URL")
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def request(
        self, path: str, body: dict | None = None, cancel: threading.Event | None = None
    ) -> bytes | bytearray:
        """GET `path`, or POST `body` as JSON; the raw answer (at most `max_bytes`).

        The whole call, redirects included, ends within `timeout` seconds
        (TimeoutError) or, once `cancel` is set, at once (Cancelled).
        """
        data = None if body is None else json.dumps(body).encode()
        watchdog = _Watchdog(self.timeout, cancel)
        try:
            answer = self._follow(self.url + path, data, watchdog)
        except Exception as exc:  # whatever a shut-down socket made of it, the deadline says why
            self._check(watchdog, path)
            if isinstance(exc, http.client.HTTPException):
                raise OSError(f"{path}: broken HTTP answer ({type(exc).__name__})") from None
            raise
        finally:
            watchdog.close()
        self._check(watchdog, path)  # a shut-down socket can read as a short answer
        return answer

    def _check(self, watchdog: _Watchdog, path: str) -> None:
        if watchdog.fired == "cancelled":
            raise Cancelled(path)
        if watchdog.fired == "timeout":
            raise TimeoutError(f"{path}: no whole answer within {self.timeout:g} s")

    def _follow(self, url: str, data: bytes | None, watchdog: _Watchdog) -> bytes | bytearray:
        for _ in range(MAX_REDIRECTS + 1):
            conn = _Connection(url, self.timeout, watchdog)
            try:
                target = urlsplit(url)
                path = (target.path or "/") + (f"?{target.query}" if target.query else "")
                conn.request("GET" if data is None else "POST", path, data, self.headers)
                resp = conn.getresponse()
                if resp.status in (301, 302, 303, 307, 308):
                    location = urljoin(url, resp.getheader("Location") or "")
                    refuse_cross_origin(self.url, location, resp.status)
                    if data is not None and resp.status not in (307, 308):
                        raise HTTPStatusError(url, resp.status)  # it would lose its body
                    url = location
                    continue
                if not 200 <= resp.status < 300:
                    try:
                        body = bytes(read_limited(resp, ERROR_BODY_BYTES))
                    except (ValueError, OSError, http.client.HTTPException):
                        body = b""
                    raise HTTPStatusError(url, resp.status, body)
                return read_limited(resp, self.max_bytes)
            finally:
                watchdog.watch(None)
                conn.close()
        raise OSError(f"{url}: more than {MAX_REDIRECTS} redirects")

    def clear_records(self, cancel: threading.Event | None = None) -> None:
        self.request(
            "/set_internal_state", {"server_args": {"dspark_clear_info_records": True}}, cancel
        )

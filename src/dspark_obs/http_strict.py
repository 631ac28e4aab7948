"""The request reading and connection bounds every HTTP server of the package shares.

The standard library's `BaseHTTPRequestHandler` reads up to 100 headers of 64 KiB each
(6.4 MB held by one unauthenticated connection), takes `int()` of `Content-Length` (so
`+36`, `3_6` and non-ASCII digits pass), keeps the last of two `Content-Length`s, accepts
folded header lines and whitespace before the colon, and waits as long as a client trickles
bytes. Each of those is a request-smuggling or exhaustion form behind a proxy that reads
the request differently. Here a request is read the one strict way of RFC 9112:

- the request line and every header within `REQUEST_DEADLINE` seconds in all (a slow
  client is cut whatever its pace), each line at most `MAX_LINE` bytes, the headers at most
  `MAX_HEADERS` lines and `MAX_HEADER_BYTES` bytes;
- `Content-Length` once at most, ASCII digits only; `Transfer-Encoding` refused (no server
  here takes a chunked body); one `Host`; no folded line, no space before a colon, no
  control or non-ASCII byte in a header;
- at most `MAX_CONNECTIONS` connections served at once; one more is answered 503 and
  closed at once, never queued behind a thread;
- a client that hangs up or times out costs a debug line, never a traceback.

Every refusal is counted by reason on the server (`Refusals`) and logged once per reason.
"""

from __future__ import annotations

import http.client
import logging
import re
import socketserver
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus

log = logging.getLogger(__name__)

#: seconds between two bytes before a connection is dropped
SOCKET_TIMEOUT = 10.0
#: seconds for the request line and all headers, however the client paces them
REQUEST_DEADLINE = 10.0
#: bytes of one request or header line (CRLF included)
MAX_LINE = 8192
#: header lines of one request
MAX_HEADERS = 64
#: bytes of all header lines of one request
MAX_HEADER_BYTES = 16384
#: connections served at once by one server
MAX_CONNECTIONS = 64

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/1\.[01]")
# field-name ":" OWS field-value OWS, the value visible ASCII with inner spaces and tabs
_HEADER = re.compile(
    rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?)"
    rb"[ \t]*\r?\n"
)
_TARGET = re.compile(rb"/[\x21-\x7e]*")
_LENGTH = re.compile(r"[0-9]{1,18}")
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)


class Refusals:
    """Requests and connections refused, by reason; the first of each reason is logged."""

    def __init__(self, server: str) -> None:
        self.server = server
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def count(self, reason: str, message: str, client: str) -> None:
        with self._lock:
            first = reason not in self.counts
            self.counts[reason] += 1
        level = logging.WARNING if first else logging.DEBUG
        more = " (further ones are counted)" if first else ""
        log.log(level, "%s refused a request from %s: %s%s", self.server, client, message, more)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class Refused(Exception):
    """A request read no further: its status, the reason it is counted under, and why."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class StrictRequestHandler:
    """Mixed in before `BaseHTTPRequestHandler` (or a subclass): reads each request through
    `read_request`; the subclass answers it in `respond()`."""

    timeout = SOCKET_TIMEOUT

    def handle_one_request(self) -> None:
        try:
            ok = self.read_request()
        except Refused as exc:
            self.close_connection = True
            self.server.refusals.count(exc.reason, str(exc), self.client_address[0])
            self._refuse(exc.status, str(exc))
            return
        except (TimeoutError, ConnectionError) as exc:  # idle keep-alive, or a client gone
            self.close_connection = True
            log.debug("connection from %s ended: %r", self.client_address[0], exc)
            return
        if ok:
            self.respond()
            self.wfile.flush()

    def respond(self) -> None:
        """Answer the request read: `do_<METHOD>`, as the standard library does."""
        method = getattr(self, f"do_{self.command}", None)
        if method is None:
            self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"unsupported method {self.command}")
            return
        method()

    def _refuse(self, status: int, message: str) -> None:
        try:
            self.send_error(status, message)
        except OSError:
            pass  # the client is gone already

    def _line(self, deadline: float, too_long: Refused, headers: bool = False) -> bytes:
        """One line, ending in LF, or what came before the client closed (b"" at once).

        `peek` makes at most one read on the socket, so the deadline is looked at between
        any two of the client's packets, and each wait is cut to what is left of it."""
        buf = bytearray()
        slow = Refused(
            HTTPStatus.REQUEST_TIMEOUT,
            "slow_request",
            f"request line and headers not complete within {REQUEST_DEADLINE:g} s",
        )
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise slow
            self.connection.settimeout(min(left, self.timeout))
            try:
                chunk = self.rfile.peek(1)
            except TimeoutError:
                # silence before a request began is an idle connection, closed uncounted
                if (buf or headers) and time.monotonic() >= deadline:
                    raise slow from None
                raise
            if not chunk:
                return bytes(buf)
            room = MAX_LINE - len(buf)
            end = chunk.find(b"\n", 0, room)
            buf += self.rfile.read(min(len(chunk), room) if end < 0 else end + 1)
            if end >= 0:
                return bytes(buf)
            if len(buf) >= MAX_LINE:
                raise too_long

    def read_request(self) -> bool:
        """Read and check one request's line and headers; False where the client closed
        before a request began. Refused for anything that is not strict HTTP/1.1."""
        self.command, self.request_version, self.close_connection = None, "HTTP/1.0", True
        self.requestline = ""
        deadline = time.monotonic() + REQUEST_DEADLINE
        line = self._line(
            deadline,
            Refused(HTTPStatus.REQUEST_URI_TOO_LONG, "line_too_long", "request line too long"),
        )
        if not line:
            return False
        self.raw_requestline = line
        if not line.endswith(b"\n"):
            raise ConnectionError("closed inside the request line")
        parts = line.rstrip(b"\r\n").split(b" ")
        self.requestline = line.rstrip(b"\r\n").decode("latin-1")
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
            raise Refused(HTTPStatus.BAD_REQUEST, "bad_request_line", "malformed request line")
        method, target, version = parts
        if not _VERSION.fullmatch(version):
            raise Refused(
                HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "bad_version", "only HTTP/1.0 and 1.1"
            )
        if not _TARGET.fullmatch(target):
            raise Refused(HTTPStatus.BAD_REQUEST, "bad_target", "the target must be a path")
        self.command, self.path = method.decode("ascii"), target.decode("ascii")
        self.request_version = version.decode("ascii")
        self.headers = headers = self._headers(deadline)
        self._check_framing(headers)
        conn = (headers.get("Connection") or "").lower()
        if self.request_version == "HTTP/1.1":
            self.close_connection = "close" in conn
        else:
            self.close_connection = "keep-alive" not in conn
        expect = headers.get("Expect")
        if expect is not None:
            if expect.lower() != "100-continue" or self.request_version != "HTTP/1.1":
                raise Refused(HTTPStatus.EXPECTATION_FAILED, "bad_expect", "unknown Expect")
            self.handle_expect_100()
        return True

    def _headers(self, deadline: float) -> http.client.HTTPMessage:
        msg = http.client.HTTPMessage()
        total = 0
        too_big = Refused(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            f"headers over {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} lines",
        )
        for _ in range(MAX_HEADERS + 1):
            line = self._line(deadline, too_big, headers=True)
            if not line.endswith(b"\n"):
                raise ConnectionError("closed inside the headers")
            if line in (b"\r\n", b"\n"):
                return msg
            total += len(line)
            if total > MAX_HEADER_BYTES:
                raise too_big
            m = _HEADER.fullmatch(line)
            if m is None:
                folded = line[:1] in (b" ", b"\t")
                raise Refused(
                    HTTPStatus.BAD_REQUEST,
                    "folded_header" if folded else "bad_header",
                    "folded header line" if folded else "malformed header line",
                )
            msg[m.group(1).decode("ascii")] = m.group(2).decode("ascii")
        raise too_big

    @staticmethod
    def _check_framing(headers: http.client.HTTPMessage) -> None:
        if headers.get("Transfer-Encoding") is not None:
            if headers.get("Content-Length") is not None:
                raise Refused(
                    HTTPStatus.BAD_REQUEST,
                    "bad_content_length",
                    "Transfer-Encoding with Content-Length",
                )
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "chunked", "chunked bodies are not accepted")
        lengths = headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad_content_length", "repeated Content-Length")
        if lengths and not _LENGTH.fullmatch(lengths[0]):
            raise Refused(
                HTTPStatus.BAD_REQUEST,
                "bad_content_length",
                "Content-Length must be ASCII digits",
            )
        if len(headers.get_all("Host") or []) > 1:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad_header", "repeated Host")

    def content_length(self) -> int:
        """The body's length, already checked to be digits."""
        return int(self.headers.get("Content-Length") or 0)


class BoundedThreadingServer(socketserver.ThreadingMixIn):
    """A thread per connection, at most `max_connections` at once; hang-ups logged quietly."""

    daemon_threads = True
    block_on_close = False
    max_connections = MAX_CONNECTIONS
    #: the server's name in its log lines
    label = "HTTP server"
    #: whether a connection over the bound can be answered in plain text (not TLS)
    busy_reply = True

    def __init__(self, *args, **kwargs) -> None:
        self.refusals = Refusals(self.label)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.refusals.count(
                "too_many_connections",
                f"{self.max_connections} connections are open already",
                client_address[0],
            )
            if self.busy_reply:
                try:
                    request.sendall(_BUSY)
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("connection from %s ended: %r", client_address[0], exc)
        else:  # a bug: one line, the traceback only at debug level
            log.error("connection from %s failed: %r", client_address[0], exc)
            log.debug("traceback", exc_info=True)

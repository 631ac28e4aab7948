"""The HTTP side of the front: routing, authentication, body limits and JSON answers.

Everything a client can get wrong on the wire (a missing key, a chunked or oversized body,
bad JSON, an unknown path, too many requests) is answered here with its status, so the
front's endpoints only ever see a parsed body.
"""

from __future__ import annotations

import hmac
import logging
import math
import select
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

import msgspec

from .. import __version__
from ..http_strict import StrictRequestHandler
from ..json_files import decode_document
from .protocol import ClientGone, RequestError, invalid_json

if TYPE_CHECKING:
    from .server import RuntimeFrontend

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20


def make_handler(front: RuntimeFrontend) -> type[BaseHTTPRequestHandler]:
    class Handler(StrictRequestHandler, BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"dspark-obs-runtime-server/{__version__}"

        def log_message(self, format, *args) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, payload) -> None:
            data = msgspec.json.encode(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:  # a body left unread: tell the client, then hang up
                self.send_header("Connection", "close")
            if status == HTTPStatus.UNAUTHORIZED:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "code": int(status)}})

        def _authorized(self) -> bool:
            if front.api_key is None or self.path.split("?")[0] == "/health":
                return True
            got = self.headers.get("Authorization", "")
            return hmac.compare_digest(got.encode(), f"Bearer {front.api_key}".encode())

        def _body(self):
            n = self.content_length()  # framing checked when the request was read
            if n > MAX_BODY:
                self.close_connection = True  # the body stays unread
                raise RequestError(
                    f"body over {MAX_BODY} bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
                )
            raw = self.rfile.read(n) if n > 0 else b""
            if len(raw) < n:
                raise ClientGone("closed inside the body")
            try:  # nesting bounded before decoding (json_files.MAX_DEPTH): a 400, never a 500
                return decode_document(raw)  # no key given twice either
            except ValueError as exc:
                raise RequestError(invalid_json(raw, exc)) from None

        def _client_gone(self) -> bool:
            """Whether the client closed its end (readable with nothing to read)."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def _limited(self, method: str) -> bool:
            """Answer 429 (with Retry-After) when this client is over --rate-limit."""
            wait = front.limiter.wait(self.client_address[0])
            if not wait:
                return False
            data = msgspec.json.encode(
                {"error": {"message": "too many requests", "code": HTTPStatus.TOO_MANY_REQUESTS}}
            )
            self.send_response(HTTPStatus.TOO_MANY_REQUESTS)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Retry-After", str(max(1, math.ceil(wait))))
            if method == "POST":  # its body stays unread: the connection cannot be reused
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            return True

        def _dispatch(self, method: str) -> None:
            path = self.path.split("?")[0]
            try:
                # before authentication, so that a key-guessing loop is slowed down as well
                if self._limited(method):
                    return
                if not self._authorized():
                    if method == "POST":
                        self.close_connection = True
                    self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong API key")
                    return
                if method == "GET" and path in ("/health", "/health_generate"):
                    self._send(HTTPStatus.OK, {})
                elif method == "GET" and path in ("/server_info", "/get_server_info"):
                    self._send(HTTPStatus.OK, front.server_info())
                elif method == "POST" and path == "/generate":
                    self._send(HTTPStatus.OK, front.generate(self._body(), self._client_gone))
                elif method == "POST" and path == "/set_internal_state":
                    self._send(HTTPStatus.OK, front.set_internal_state(self._body()))
                else:
                    self._error(HTTPStatus.NOT_FOUND, f"no {method} {path}")
            except RequestError as exc:
                self._error(exc.status, str(exc))
            except (ClientGone, ConnectionError, TimeoutError) as exc:  # nobody to answer
                self.close_connection = True
                log.info("%s %s: client gone: %s", method, path, exc)
            except Exception as exc:  # a bug answers 500; the server stays up
                log.exception("%s %s failed", method, path)
                try:
                    self._error(HTTPStatus.INTERNAL_SERVER_ERROR, repr(exc))
                except OSError:
                    self.close_connection = True

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

    return Handler

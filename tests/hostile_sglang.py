"""A loopback HTTP server that answers like an SGLang server, or like a hostile one.

`mode` switches how `GET /server_info` is answered: `normal` (the records held, cleared
by `POST /set_internal_state` as SGLang does), `redirect` (to `redirect_to`), `drip`
(a declared body sent one byte every `drip_every` seconds), `silent` (the request read,
nothing ever sent) or `payload` (the bytes in `payload`, whatever they are, replaced by
`after_clear` once a clear arrives). Every
`Authorization` header received is kept in `auth_seen`, so a test can see where a key
went.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HostileServer:
    def __init__(self, info: dict | None = None) -> None:
        self.info = info
        self.records = list(info["records"]) if info else []
        self.mode = "normal"
        self.redirect_to = ""
        self.redirect_status = 302
        self.redirect_from = ("/server_info",)  # the GET paths redirected, query aside
        self.drip_every = 0.5
        self.payload = b""
        self.after_clear: bytes | None = None  # what `payload` becomes once cleared
        self.auth_seen: list[str | None] = []
        self.paths: list[str] = []
        self.clears = 0
        self.served = 0  # records handed out in answers that a clear then emptied
        self.lock = threading.Lock()
        self.closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, body: bytes, status: int = 200, headers: dict | None = None):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                with server.lock:
                    server.auth_seen.append(self.headers.get("Authorization"))
                    server.paths.append(self.path)
                mode = server.mode
                if mode == "redirect" and self.path.split("?")[0] in server.redirect_from:
                    self._send(b"", server.redirect_status, {"Location": server.redirect_to})
                elif mode == "drip":
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 20))
                    self.end_headers()
                    try:
                        while not server.closed.wait(server.drip_every):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    except OSError:
                        pass  # the client gave up, as it should
                elif mode == "silent":
                    server.closed.wait()
                elif mode == "payload":
                    self._send(server.payload)
                else:
                    self._send(server.answer())

            def do_POST(self):
                with server.lock:
                    server.auth_seen.append(self.headers.get("Authorization"))
                    server.paths.append(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if server.mode == "redirect":
                    self._send(b"", server.redirect_status, {"Location": server.redirect_to})
                    return
                if b"dspark_clear_info_records" in body:
                    with server.lock:
                        if server.mode == "payload" and server.after_clear is not None:
                            server.payload = server.after_clear
                        server.served += server._answered
                        server.records = server.records[server._answered :]
                        server._answered = 0
                        server.clears += 1
                self._send(json.dumps([{"updated": True}]).encode())

        self._answered = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self) -> bytes:
        """The records held, as one rank's `/server_info`; a clear then removes exactly these."""
        with self.lock:
            records = list(self.records)
            self._answered = len(records)
        record = dict(self.info, records=records) if self.info else None
        return json.dumps({"internal_states": [{"dspark_info_record": record}]}).encode()

    def add(self, records: list[dict]) -> None:
        with self.lock:
            self.records.extend(records)

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


def wait_for(condition, timeout: float = 60.0, every: float = 0.05) -> bool:
    """Poll `condition` until it holds or `timeout` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()

"""The few HTTP calls dspark-obs makes to an SGLang server, with SGLang's bearer token."""

from __future__ import annotations

import json
import urllib.request

#: Default cap on one answer: far above what a drained record buffer holds between polls,
#: far below what would exhaust the memory of the machine running the exporter.
DEFAULT_MAX_BYTES = 256 << 20
_CHUNK = 1 << 20


class ResponseTooLarge(ValueError):
    """An answer over the byte limit; refused before more than the limit was read."""

    reason = "oversized"


def read_limited(resp, limit: int) -> bytes:
    """The body of `resp`, or ResponseTooLarge once it passes `limit` bytes.

    A declared Content-Length over the limit is refused without reading the
    body; otherwise the body is read in chunks and abandoned at limit + 1
    bytes, so a server that lies about (or omits) its length cannot make us
    hold more than the limit.
    """
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise ResponseTooLarge(f"answer of {int(declared):,} bytes, over the {limit:,} limit")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise ResponseTooLarge(f"answer over the {limit:,} byte limit")


class SGLangClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            # urllib would also open file:// and other schemes; only HTTP(S) is an SGLang server
            raise ValueError(f"{url!r}: expected an http:// or https:// URL")
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def request(self, path: str, body: dict | None = None) -> bytes:
        """GET `path`, or POST `body` as JSON; the raw answer (at most `max_bytes`)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            headers=self.headers,
            method="GET" if body is None else "POST",
        )
        # the scheme was checked to be http(s) in __init__, so urlopen cannot read a file:// URL
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # nosec B310
            return read_limited(resp, self.max_bytes)

    def clear_records(self) -> None:
        self.request("/set_internal_state", {"server_args": {"dspark_clear_info_records": True}})

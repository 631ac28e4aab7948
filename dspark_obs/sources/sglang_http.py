"""The few HTTP calls dspark-obs makes to an SGLang server, with SGLang's bearer token."""

from __future__ import annotations

import json
import urllib.request


class SGLangClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def request(self, path: str, body: dict | None = None) -> bytes:
        """GET `path`, or POST `body` as JSON; the raw answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            headers=self.headers,
            method="GET" if body is None else "POST",
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return resp.read()

    def clear_records(self) -> None:
        self.request("/set_internal_state", {"server_args": {"dspark_clear_info_records": True}})

"""The dashboard uploaded through Grafana's HTTP API (POST /api/dashboards/db, overwrite).

Three calls at most (find the folder, create it, post the dashboard), each through the
package's bounded client (`sources.sglang_http`): the token goes to Grafana's origin only,
each call ends within `timeout` seconds in all however Grafana paces its answer, reads at
most `MAX_ANSWER_BYTES`, and every answer is checked against the shape the API documents
before it is used, so a broken or hostile Grafana is one `PushError`, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlparse

import msgspec

from ..json_files import decode_json
from ..names import printable
from ..secret_text import redact
from ..sources.sglang_http import HTTPStatusError, SGLangClient

#: Bytes of one Grafana answer (a folder list, or the few fields a saved dashboard returns).
MAX_ANSWER_BYTES = 8 << 20


class PushError(ValueError):
    """Grafana could not be reached or refused the dashboard; the message says which."""


class _Folder(msgspec.Struct):
    uid: str
    title: str = ""


class _Saved(msgspec.Struct):
    url: str = ""


class _Refusal(msgspec.Struct):
    message: str = ""


class _Grafana:
    def __init__(self, url: str, token: str, timeout: float) -> None:
        self.url, self.token = url.rstrip("/"), token
        self.client = SGLangClient(self.url, api_key=token, timeout=timeout,
                                   max_bytes=MAX_ANSWER_BYTES)  # fmt: skip

    def call(self, path: str, type_, body: dict | None = None):
        try:
            raw = self.client.request(path, body)
        except HTTPStatusError as exc:
            try:
                detail = decode_json(exc.body, _Refusal).message
            except ValueError:
                detail = ""
            raise PushError(
                f"Grafana at {self.url} refused the dashboard (HTTP {exc.code}): "
                f"{redact(detail, self.token)[:500]}"
            ) from None
        except (OSError, ValueError) as exc:  # connection refused, TLS, DNS, timeout, size
            raise PushError(
                f"cannot reach Grafana at {self.url}: {redact(str(exc), self.token)}"
            ) from None
        try:
            return decode_json(bytes(raw), type_)
        except ValueError as exc:
            raise PushError(
                f"Grafana at {self.url}: {path}: not the API's answer: {str(exc)[:200]}"
            ) from None


def _folder_uid(api: _Grafana, name: str) -> str:
    for folder in api.call("/api/folders", list[_Folder]):
        if folder.title == name:
            return folder.uid
    return api.call("/api/folders", _Folder, {"title": name}).uid


def push_dashboard(
    url: str,
    token: Callable[[], str],
    *,
    folder: str | None,
    timeout: float,
    dashboard: str = "main",
) -> str:
    """Upload (overwriting) the dashboard; the line to print: what went where.

    `token` is read only once the URL is known to be one Grafana could answer at.
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PushError(f"--grafana-url must be an http(s) URL, got {url!r}")
    from .provisioning import shipped_dashboard

    api = _Grafana(url, token(), timeout)
    payload: dict = {
        "dashboard": {**shipped_dashboard(dashboard), "id": None},
        "overwrite": True,
        "message": "dspark-obs dashboards push",
    }
    if folder:
        payload["folderUid"] = _folder_uid(api, folder)
    where = api.call("/api/dashboards/db", _Saved, payload).url
    # Grafana's answer reaches the terminal: shown escaped, never acted on
    return printable(f"pushed {payload['dashboard']['uid']} to {url.rstrip('/')}{where}")

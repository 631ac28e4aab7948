"""The dashboard uploaded through Grafana's HTTP API (POST /api/dashboards/db, overwrite).

grafana-client is imported only here and only when pushing: exporting or rendering the
shipped JSON needs no Grafana package at all.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlparse


class PushError(ValueError):
    """Grafana could not be reached or refused the dashboard; the message says which."""


def _folder_uid(api, name: str) -> str:
    for folder in api.folder.get_all_folders():
        if folder.get("title") == name:
            return folder["uid"]
    return api.folder.create_folder(name)["uid"]


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
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    from .provisioning import shipped_dashboard

    api = GrafanaApi.from_url(url, credential=token(), timeout=timeout)
    try:
        payload: dict = {
            "dashboard": {**shipped_dashboard(dashboard), "id": None},
            "overwrite": True,
            "message": "dspark-obs dashboards push",
        }
        if folder:
            payload["folderUid"] = _folder_uid(api, folder)
        result = api.dashboard.update_dashboard(payload)
    except GrafanaException as exc:
        status = getattr(exc, "status_code", None)
        detail = getattr(exc, "message", None) or str(exc)
        raise PushError(
            f"Grafana at {url} refused the dashboard (HTTP {status}): {detail}"
        ) from None
    except Exception as exc:  # connection refused, TLS, DNS: niquests' own exception types
        raise PushError(f"cannot reach Grafana at {url}: {exc}") from None
    where = result.get("url", "") if isinstance(result, dict) else ""
    return f"pushed {payload['dashboard']['uid']} to {url.rstrip('/')}{where}"

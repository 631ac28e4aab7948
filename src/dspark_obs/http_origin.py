"""Where an HTTP client may send what it was given for one server: that server's origin only.

A redirect names any URL it likes. urllib follows it with every header of the request,
so a server (or whoever answers for it) could collect an API key, or steer a request to
another scheme or port. An origin is (scheme, host, port); every client in the package
follows a redirect only within the origin it was configured with, and refuses the rest
by name.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


class RedirectRefused(OSError):
    """A redirect to another origin, refused before anything was sent there."""

    reason = "redirect_refused"


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an absolute http(s) URL, the port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1  # a malformed port is an origin of its own, never the configured one
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme, -1)


def origin_text(url: str) -> str:
    """An origin as people write it; never the path or query, which may carry secrets."""
    scheme, host, port = origin(url)
    return f"{scheme}://{host}:{port}"


def refuse_cross_origin(configured: str, target: str, status: int) -> None:
    """RedirectRefused unless `target` has the origin of `configured`."""
    if origin(target) != origin(configured):
        raise RedirectRefused(
            f"{origin_text(configured)} answered HTTP {status} redirecting to "
            f"{origin_text(target)}, another origin: refused (requests go to the configured "
            "origin only)"
        )


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handling, refusing any redirect that leaves the request's origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        refuse_cross_origin(req.full_url, newurl, code)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

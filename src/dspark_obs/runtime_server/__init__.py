"""Fronts that make the reference runtime look like a real serving engine."""

from .protocol import RequestError
from .ranks import COMPONENTS, MAX_RECORDS
from .rate_limit import DEFAULT_RATE_LIMIT, RateLimiter
from .server import RuntimeFrontend

__all__ = [
    "COMPONENTS",
    "DEFAULT_RATE_LIMIT",
    "MAX_RECORDS",
    "RateLimiter",
    "RequestError",
    "RuntimeFrontend",
]

"""Fronts that make the reference runtime look like a real serving engine."""

from .server import (
    COMPONENTS,
    DEFAULT_RATE_LIMIT,
    MAX_RECORDS,
    RateLimiter,
    RequestError,
    RuntimeFrontend,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_RATE_LIMIT",
    "MAX_RECORDS",
    "RateLimiter",
    "RequestError",
    "RuntimeFrontend",
]

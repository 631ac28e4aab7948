"""Fronts that make the reference runtime look like a real serving engine."""

from .sglang_server import COMPONENTS, MAX_RECORDS, RequestError, RuntimeFrontend

__all__ = ["COMPONENTS", "MAX_RECORDS", "RequestError", "RuntimeFrontend"]

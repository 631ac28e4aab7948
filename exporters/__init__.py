"""Prometheus exporter for dspark-obs: the HTTP(S) side that serves any prometheus_client
registry, with optional TLS, mTLS and basic auth configured the exporter-toolkit way."""

from .http_server import MetricsServer
from .web_config import TLSServerConfig, WebConfig, hash_password, load_web_config

__all__ = ["MetricsServer", "TLSServerConfig", "WebConfig", "hash_password", "load_web_config"]

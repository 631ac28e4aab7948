"""The true ceiling for a sample of production traffic: the same requests replayed on
production and on a cap-accept twin, their steps joined (`replay`)."""

from .replay import Server, ShadowStats, load_requests, run_shadow

__all__ = ["Server", "ShadowStats", "load_requests", "run_shadow"]

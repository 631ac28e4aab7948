"""The true ceiling for a sample of production traffic: the same requests replayed on
production and on a cap-accept twin, their steps joined (`replay`) and stored as a run
(`record`)."""

from .record import record_shadow_run
from .replay import Server, ShadowStats, load_requests, run_shadow

__all__ = ["Server", "ShadowStats", "load_requests", "record_shadow_run", "run_shadow"]

"""The gate every StepBatch passes: validated once, then folded into the live aggregates,
the ceiling estimator and, when one is open, the run store (`core`); sources fed into it
on threads until they end or are stopped (`feed`)."""

from .core import Pipeline, StoreFailed, build_pipeline
from .feed import SourceFailed, run_source, run_sources

__all__ = [
    "Pipeline",
    "SourceFailed",
    "StoreFailed",
    "build_pipeline",
    "run_source",
    "run_sources",
]

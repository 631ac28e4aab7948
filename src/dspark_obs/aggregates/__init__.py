"""Live aggregates: what the exporter publishes, kept per workload, mode and rank.

Each concern has its own module (tokens, confidence, load, cost model) over a
shared windowed-sums store; `Aggregates` folds StepBatches into all of them.
"""

from .aggregates import Aggregates, Snapshot

__all__ = ["Aggregates", "Snapshot"]

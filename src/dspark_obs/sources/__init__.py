"""Where StepBatches come from: the embedded runtime, a stored run, (later) SGLang.

Every source yields the same StepBatch, paced as its data says steps happened,
and stops when the caller's stop event is set.
"""

from .base import Source, parse_source
from .pacing import Pacer

__all__ = ["Pacer", "Source", "parse_source"]

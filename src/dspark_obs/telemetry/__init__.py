"""The telemetry model: what a DSpark verify step reports, and SGLang's wire form of it."""

from .batch import MATRIX_COLUMNS, MODES, REQUEST_COLUMNS, StepBatch

__all__ = ["MATRIX_COLUMNS", "MODES", "REQUEST_COLUMNS", "StepBatch"]

"""Run directories recorded from the reference runtime (`dspark-obs run`, and `demo`)."""

from .block_accept import write_block_accept_step
from .reference import default_run_dir, record_reference_run, runtime_manifest

__all__ = [
    "default_run_dir",
    "record_reference_run",
    "runtime_manifest",
    "write_block_accept_step",
]

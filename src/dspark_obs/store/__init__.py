"""The run store: a run directory is the interchange format between commands.

Producers (`run`, `serve`, `ingest`) and consumers (`summary`, `report`, the
estimator's evaluation, anyone with polars, pandas or DuckDB) never talk to
each other directly; they meet at a directory:

    RUN_DIR/run.json                       manifest (versions, gamma, mode, counts, complete)
    RUN_DIR/steps/part-000000.parquet      one row per step (StepBatch scalars)
    RUN_DIR/requests/part-000000.parquet   one row per request-step
    RUN_DIR/<table>/part-*.parquet         further tables (e.g. estimates), same mechanism
    RUN_DIR/_checksums/<table>/part-*.parquet.json   each part's size and CRC-32, verified on read

That keeps a long-running producer decoupled from analysis that may run later,
elsewhere, or while the run is still being written (parts are published by
atomic rename, so a reader never sees half a file), and it keeps the data
usable by ordinary tools: sentinels become nulls, matrices become fixed-size
arrays, and the round trip back to `StepBatch` is exact.
"""

from .errors import RunStoreError
from .reader import Run, check_new_run_dir, open_run
from .writer import RunWriter

__all__ = ["Run", "RunStoreError", "RunWriter", "check_new_run_dir", "open_run"]

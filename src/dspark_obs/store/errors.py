"""The one error the run store raises for a run directory it cannot use.

It subclasses ValueError so that callers who already treat bad input as a
ValueError (the CLI, the ingest loop) handle it without a special case, while
code that wants to tell "this run directory is unusable" apart can catch it
precisely. Messages always name the path, because the operator's next step is
to look at that file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import polars as pl


class RunStoreError(ValueError):
    """A run directory (or a table or manifest in it) is missing, corrupt or misused."""


#: What reading a damaged Parquet part can raise. polars panics (a BaseException, with the
#: panic's own message on stderr) on some corrupted data pages instead of raising an error.
READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    pl.exceptions.PolarsError,
    pl.exceptions.PanicException,
)


def unreadable(path, exc: BaseException) -> RunStoreError:
    """A RunStoreError for data polars or the OS could not read, on one line.

    Library messages (polars' especially) span several lines with hints; the
    first line says what failed, and the CLI prints errors as one line.
    """
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return RunStoreError(f"{path}: unreadable: {first}")


@contextmanager
def reading(*runs) -> Iterator[None]:
    """Turn what reading a run's parts raises inside a query into a RunStoreError.

    A part with no checksum record (a run written before parts had them) can pass
    every check of `Run.scan` and still be damaged inside a data page, which polars
    only finds when a query reads that page: the error then names the run(s) read.
    """
    try:
        yield
    except READ_ERRORS as exc:
        raise unreadable(" or ".join(str(getattr(r, "path", r)) for r in runs), exc) from exc

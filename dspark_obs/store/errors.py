"""The one error the run store raises for a run directory it cannot use.

It subclasses ValueError so that callers who already treat bad input as a
ValueError (the CLI, the ingest loop) handle it without a special case, while
code that wants to tell "this run directory is unusable" apart can catch it
precisely. Messages always name the path, because the operator's next step is
to look at that file.
"""

from __future__ import annotations


class RunStoreError(ValueError):
    """A run directory (or a table or manifest in it) is missing, corrupt or misused."""

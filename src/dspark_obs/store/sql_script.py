"""The run store as SQL: the per-workload summary query, and DuckDB's views to run it.

The query (`sql/summary.sql`) is standard SQL over two relations, `requests` and `steps`;
only how those are defined over the Parquet parts depends on the engine, so that part is
generated here for DuckDB and documented for Spark and Trino (docs/store.md).
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from .tables import REQUESTS, STEPS


def summary_sql() -> str:
    """The shipped query, as the package holds it."""
    return files("dspark_obs.store").joinpath("sql", "summary.sql").read_text(encoding="utf-8")


_RUN_OF_PART = "regexp_replace(filename, '/[^/]*/[^/]*$', '')"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_GLOB_CHARS = re.compile(r"([\[*?])")


def glob_escape(path: str) -> str:
    """`path` matching itself only in a DuckDB glob: `[`, `*` and `?` each as a one-character
    class (a run directory named `r[ab]` would otherwise read runs `ra` and `rb`)."""
    return _GLOB_CHARS.sub(r"[\1]", path)


def duckdb_views(run_dirs: list[Path]) -> str:
    """`requests` and `steps` as DuckDB views over the runs' published parts.

    Each row gets its run directory as `run` (its part's file name less the table folder
    and the part), which the query needs to tell the steps of different runs apart (every
    run numbers its steps from its own ranks) and to pair a run's rows with its step time.
    """
    out = []
    for table in (REQUESTS, STEPS):
        globs = ", ".join(
            _literal(glob_escape(str(Path(d) / table)) + "/part-*.parquet") for d in run_dirs
        )
        # The view name is one of the store's two table constants and every path is a
        # quoted SQL literal, so nothing a user passes can end the statement.
        # by name: a resumed older run's parts hold the matrices as lists (`layout.py`)
        source = f"read_parquet([{globs}], filename = true, union_by_name = true)"
        out.append(
            f"CREATE OR REPLACE VIEW {table} AS SELECT *, {_RUN_OF_PART} AS run "  # nosec B608
            f"FROM {source};"
        )
    return "\n".join(out)


def duckdb_summary_script(run_dirs: list[Path]) -> str:
    """A whole DuckDB script: the views, then the query (`duckdb < script` runs it)."""
    return f"{duckdb_views(run_dirs)}\n{summary_sql().rstrip()};\n"

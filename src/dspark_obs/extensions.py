"""The optional compiled extensions, and the switch that turns them all off.

Five parts of the package have a C twin, built by `pip install` where a compiler is
present (setup.py, `optional=True`) and checked against the Python form by parity
tests; the Python form gives the same results everywhere (README, "C extensions"):

- `telemetry._server_info_parser`: SGLang's `dspark_info_record` JSON, in one pass
  (Python form: msgspec and numpy, `telemetry/server_info_columnar.py`);
- `aggregates._rowfold`: the live aggregates' request-row fold (numpy form in
  `aggregates/tokens.py` and `aggregates/confidence.py`), and the same kind of loop over
  a stored run's request rows into the report's calibration histograms (numpy form in
  `analysis/reliability.py`);
- `estimator._tailwalk`: the tail walker's per-step pass (numpy form in
  `estimator/tails.py`);
- `store._thrift_compact`: a Parquet part's footer and page headers, read before it is
  decoded (Python form: `store/part_bounds.py`'s `_Thrift`);
- `runtime._hashing`: the embedded runtime's `[rows, vocab]` tables of keyed normals
  (numpy form in `runtime/hashing.py`).

`DSPARK_OBS_NO_EXTENSIONS=1` in the environment makes every one of them use its
Python form, decided at import, so that the fallbacks can be run (and tested) on an
install that has the extensions built. `DSPARK_OBS_REQUIRE_EXTENSIONS=1` makes the
tests that check each extension is built fail instead of skip (CI sets it).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: Set to 1 (any value but empty or 0): every compiled part is left unused.
DISABLE = "DSPARK_OBS_NO_EXTENSIONS"
#: Set to 1: the tests of tests/test_extensions.py fail when an extension is not built.
REQUIRE = "DSPARK_OBS_REQUIRE_EXTENSIONS"

#: Every compiled extension, by module name.
MODULES = (
    "dspark_obs.telemetry._server_info_parser",
    "dspark_obs.aggregates._rowfold",
    "dspark_obs.estimator._tailwalk",
    "dspark_obs.store._thrift_compact",
    "dspark_obs.runtime._hashing",
)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def disabled() -> bool:
    """True when `DSPARK_OBS_NO_EXTENSIONS` switches the compiled parts off."""
    return _flag(DISABLE)


def required() -> bool:
    """True when `DSPARK_OBS_REQUIRE_EXTENSIONS` asks the tests to insist on them."""
    return _flag(REQUIRE)


def load(name: str) -> ModuleType | None:
    """The compiled module `name` (one of MODULES), or None where it was not built or the
    switch turns the extensions off; the caller falls back to its Python form."""
    if name not in MODULES:
        raise ValueError(f"{name} is not one of the compiled extensions {MODULES}")
    if disabled():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None

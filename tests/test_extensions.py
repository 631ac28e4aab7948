"""The C-extension policy (README, "C extensions"): each extension is built where CI
requires it, is the one its Python side uses, and one switch turns them all off.

With `DSPARK_OBS_REQUIRE_EXTENSIONS=1` (tools/test.sh sets it for the main run) a
missing or unused extension fails here; without it these checks skip, as an install
without a C compiler is valid. Parity with the Python forms is tested beside each one:
tests/test_sglang_compiled.py, tests/test_rowfold.py, tests/test_tails_compiled.py,
tests/test_hostile_parquet.py, tests/test_runtime_hashing.py.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_obs import extensions

#: Each extension and where its Python side holds it (None there: the fallback runs).
PYTHON_SIDE = {
    "dspark_obs.telemetry._server_info_parser": (
        "dspark_obs.telemetry.server_info_columnar",
        "_compiled",
    ),
    "dspark_obs.aggregates._rowfold": ("dspark_obs.aggregates.rows", "_rowfold"),
    "dspark_obs.estimator._tailwalk": ("dspark_obs.estimator.tails", "_tailwalk"),
    "dspark_obs.store._thrift_compact": ("dspark_obs.store.part_bounds", "_compiled"),
    "dspark_obs.runtime._hashing": ("dspark_obs.runtime.hashing", "_compiled"),
}
SETUP = Path(__file__).parent.parent / "setup.py"


def test_every_extension_setup_builds_is_known():
    assert set(PYTHON_SIDE) == set(extensions.MODULES)
    if SETUP.exists():  # a checkout (an installed package has no setup.py)
        built = set(re.findall(r'Extension\(\s*"([\w.]+)"', SETUP.read_text()))
        assert built == set(extensions.MODULES)


@pytest.mark.parametrize("name", extensions.MODULES)
def test_the_extension_is_built_and_used(name):
    if not extensions.required():
        pytest.skip(
            f"{extensions.REQUIRE} is not 1: an install without a C compiler runs without "
            f"{name} (CI sets it, so that a silently missing build fails)"
        )
    module = importlib.import_module(name)  # ImportError: not built
    side, attr = PYTHON_SIDE[name]
    held = getattr(importlib.import_module(side), attr)
    if extensions.disabled():
        assert held is None, f"{extensions.DISABLE} is set, yet {side} uses {name}"
    else:
        assert held is module, f"{name} is built but {side} does not use it"


_PROBE = """
import json
from dspark_obs.aggregates import rows
from dspark_obs.aggregates.aggregates import Aggregates
from dspark_obs.estimator import tails
from dspark_obs.runtime import hashing
from dspark_obs.store import part_bounds
from dspark_obs.telemetry import server_info_columnar
refused = []
for make in (lambda: tails.TailWalker(4, compiled=True), lambda: Aggregates(4, compiled=True)):
    try:
        make()
    except RuntimeError:
        refused.append(True)
print(json.dumps({"held": [server_info_columnar._compiled is None, rows._rowfold is None,
                           tails._tailwalk is None, part_bounds._compiled is None,
                  hashing._compiled is None],
                  "refused": refused}))
"""


def probe(value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != extensions.DISABLE}
    if value is not None:
        env[extensions.DISABLE] = value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_the_switch_turns_every_extension_off():
    """`DSPARK_OBS_NO_EXTENSIONS=1`: every Python side take their fallback at import,
    and asking for a compiled form explicitly is refused."""
    off = probe("1")
    assert off == {"held": [True] * len(extensions.MODULES), "refused": [True, True]}
    # empty or 0 leaves them as built
    built = [importlib.util.find_spec(name) is None for name in extensions.MODULES]
    for value in ("0", ""):
        assert probe(value)["held"] == built


def test_load_knows_only_the_extensions():
    with pytest.raises(ValueError, match="not one of the compiled extensions"):
        extensions.load("dspark_obs.telemetry.server_info")

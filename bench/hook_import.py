"""What turning the hook on adds to a serving process's start: modules and import time.

A scheduler process has torch and numpy loaded before SGLang calls the hook factory, so
each measurement is a fresh interpreter that imports those first, then, timed, what the
factory imports (`dspark_obs.hooks.sglang_plugin` and the hook's serving side). The
baseline, alternated in the same run, is what the hook imported before it was split
from its consumer: the pipeline (and with it polars and the estimator), timed the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .common import record, with_baseline

NAME = "hook_import"
#: what the factory imports once it runs, and what `attach` imported before
FLAG = ("dspark_obs.hooks.sglang_plugin", "dspark_obs.hooks.sglang_worker")
BEFORE = ("dspark_obs.hooks.sglang_worker", "dspark_obs.pipeline")
_PROBE = """
import sys, time, json
import numpy, torch
before = set(sys.modules)
t = time.perf_counter()
for name in {names!r}:
    __import__(name)
seconds = time.perf_counter() - t
added = sorted(set(sys.modules) - before)
print(json.dumps({{"seconds": seconds, "modules": len(added),
                  "ours": len([m for m in added if m.startswith("dspark_obs")]),
                  "polars": "polars" in sys.modules}}))
"""


def _probe(names: tuple[str, ...]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(names=names)], check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def run(quick: bool) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return [{"name": NAME, "skipped": "no torch (a serving process has it)"}]
    n = 1 if quick else 15
    flag, before = [], []
    for _ in range(n):
        flag.append(_probe(FLAG))
        before.append(_probe(BEFORE))
    last, old = flag[-1], before[-1]
    rec = record(
        NAME,
        {"imports": list(FLAG), "preloaded": ["numpy", "torch"]},
        "s",
        [f["seconds"] for f in flag],
        1.0,
        modules_added=last["modules"],
        dspark_obs_modules=last["ours"],
        polars_imported=last["polars"],
    )
    return [
        with_baseline(
            rec,
            [b["seconds"] for b in before],
            1.0,
            baseline="the hook with the pipeline, as attach imported it before the flag",
            baseline_modules_added=old["modules"],
            baseline_dspark_obs_modules=old["ours"],
            baseline_polars_imported=old["polars"],
        )
    ]

"""STS calibrations of the real world fitted once, at build, and shipped: `--sts auto` reads
one instead of running its warm-up when the warm-up would be the same run.

A warm-up's fit is a function of the warm-up run's configuration and the networks' weights
alone (the engine is seeded; a row's numbers do not depend on its batch), so a fit is keyed
by both: every field where the configuration departs from the defaults (the seed and the
cost table included; the weights named by their content, not their path) and the weights
file's SHA-256. The default demo's and `run`'s warm-up is shipped; any other configuration, seed
or weights file misses and runs its warm-up as before. `tests/test_real_world.py` runs
the shipped warm-up again and checks that its fit is the shipped one, bit for bit.

`python -m dspark_obs.runtime.real.shipped_sts` fits the default warm-up and writes the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from functools import cache
from pathlib import Path

import msgspec

from ...calibration import StsCalibration
from ..config import STS_WARMUP_STEPS, RuntimeConfig
from . import DEFAULT_WEIGHTS

SHIPPED_STS = Path(__file__).parent / "data" / "real-sts.json"


@cache
def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def warmup_key(warm: RuntimeConfig) -> str:
    """What a warm-up's fit depends on: its configuration and its weights' bytes.

    The configuration is keyed by the fields where it departs from `RuntimeConfig()`, each
    by its `repr`: an option added later keeps the old behaviour by default, and so keeps
    the key (keyed by the whole `repr`, each new field missed the shipped fit, and the demo
    ran its warm-up again). What a default changes is caught by the test that fits the
    shipped warm-up again.
    """
    weights = Path(warm.real_weights) if warm.real_weights else DEFAULT_WEIGHTS
    defaults = RuntimeConfig()
    departs = [
        f"{f.name}={getattr(warm, f.name)!r}"
        for f in fields(warm)
        if f.name != "real_weights" and getattr(warm, f.name) != getattr(defaults, f.name)
    ]
    text = ",".join(departs) + _file_sha256(weights.resolve())
    return hashlib.sha256(text.encode()).hexdigest()


def shipped_sts(warm: RuntimeConfig) -> StsCalibration | None:
    """The shipped fit of the warm-up run `warm`, or None where none was shipped."""
    try:
        entries = json.loads(SHIPPED_STS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    key = warmup_key(warm)
    for entry in entries:
        if entry["key"] == key:
            return StsCalibration(**entry["calibration"])
    return None


def default_demo_config() -> RuntimeConfig:
    """The real world's configuration as `demo` and `run` build it with no other options
    (what the warm-up reads of it: the sweep's own concurrency and steps it replaces)."""
    return RuntimeConfig(world="real", shadow="cap-accept")


def main() -> int:
    from ..sts_warmup import warmup_config, warmup_sts

    config = default_demo_config()
    cal = warmup_sts(config, STS_WARMUP_STEPS, use_shipped=False)
    key = warmup_key(warmup_config(config, STS_WARMUP_STEPS))
    entry = {"key": key, "calibration": msgspec.to_builtins(cal)}
    SHIPPED_STS.write_text(json.dumps([entry], indent=1) + "\n", encoding="utf-8")
    print(json.dumps(cal.temperatures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

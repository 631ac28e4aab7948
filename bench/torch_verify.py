"""P8: the torch target's measured verify time grows with the verify size (CPU build in CI).

The reference runtime with `target="torch"` runs real forwards and records their
times (`target_verify_gpu_ms`). A verify of 128 requests should cost more than one
of a single request: this reports the median verify time at batch sizes 1 and 128
and their ratio (`growth`, large / small; target above 2), a speed claim that
belongs here and not in a unit test, since a loaded machine stretches either side
at random.
tests/test_torch_target.py keeps the functional part: the times are measured
(positive, on every step) and compact and cap-accept stay in lockstep.
"""

from __future__ import annotations

import statistics

from .common import record

GROWTH_TARGET = 2.0


def run(quick: bool) -> list[dict]:
    try:
        import torch  # noqa: F401  (the target's forwards need it)
    except ImportError:
        return [{**record("P8_torch_verify", {}, "ms", [0.0], 1.0), "skipped": "no torch"}]
    from dspark_obs.runtime.config import RuntimeConfig
    from dspark_obs.runtime.engine import DSparkRuntime

    params = {
        "torch_hidden": 256,
        "concurrency": [1, 128],
        "steps_per_level": 15 if quick else 60,
        "max_new_tokens": 400,
    }
    cfg = RuntimeConfig(seed=2, mode="compact", target="torch", **params)
    batches = list(DSparkRuntime(cfg).run())
    small = [b.target_verify_gpu_ms for b in batches if b.bs == 1]
    large = [b.target_verify_gpu_ms for b in batches if b.bs == 128]
    rec = record("P8_torch_verify", params, "ms_per_verify_at_128", large, 1.0)
    growth = statistics.median(large) / statistics.median(small)
    rec.update(
        median_at_1=statistics.median(small),
        growth=growth,
        growth_target=GROWTH_TARGET,
        meets_growth_target=growth > GROWTH_TARGET,
    )
    rec["machine"] = rec.pop("machine")
    return [rec]

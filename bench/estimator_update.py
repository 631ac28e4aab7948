"""P2: per-step ceiling estimator update (walks + population model) at B = 256, gamma 7.

Steps come from a compact run whose requests are half greedy, half sampled, so
both walks and the confidence-stratified population model do their real work;
the sampled walk gathers from recorded verify distributions, as in band.
"""

from __future__ import annotations

import numpy as np
from dspark_obs.estimator.online import CeilingEstimator

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

from .common import record, repeat

TARGET_US = 100.0


def run(quick: bool) -> list[dict]:
    steps = 150 if quick else 1000
    config = RuntimeConfig(mode="compact", concurrency=[256], steps_per_level=steps, seed=2)
    runtime = DSparkRuntime(config)
    data, verified = [], []
    for batch in runtime.run():
        data.append(batch)
        verified.append(runtime._verified)

    def feed():
        est = CeilingEstimator(7)
        for batch, p in zip(data, verified, strict=True):
            est.update(batch, lambda r, j, t, p=p: np.log(p[r, j, t]))

    times = repeat(feed, 3 if quick else 7)
    return [
        record(
            "P2_estimator_update",
            {"bs": 256, "gamma": 7, "steps": steps},
            "us_per_step",
            times,
            1e6 / steps,
            target=TARGET_US,
        )
    ]

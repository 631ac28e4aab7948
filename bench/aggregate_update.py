"""P1: per-step aggregate update (all live metrics) at batch sizes 1, 64, 256, gamma 7."""

from __future__ import annotations

from dspark_obs.aggregates import Aggregates
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

from .common import record, repeat

TARGET_US = 40.0


def batches(bs: int, steps: int, gamma: int = 7):
    config = RuntimeConfig(
        mode="compact",
        shadow="cap-accept",
        concurrency=[bs],
        steps_per_level=steps,
        gamma=gamma,
        seed=1,
    )
    return list(DSparkRuntime(config).run())


def run(quick: bool) -> list[dict]:
    out = []
    steps = 200 if quick else 2000
    for bs in (1, 64, 256):
        data = batches(bs, steps)

        def feed(data=data):
            agg = Aggregates(7)
            for b in data:
                agg.update(b)
            agg.flush()

        times = repeat(feed, 3 if quick else 7)
        out.append(
            record(
                "P1_aggregate_update",
                {"bs": bs, "gamma": 7, "steps": steps},
                "us_per_step",
                times,
                1e6 / steps,
                target=TARGET_US if bs == 256 else None,
            )
        )
    return out

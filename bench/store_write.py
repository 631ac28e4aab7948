"""P12: how fast the production store writes steps, beside the rate a node feeds it.

Steps of B = 256 (a compact run with a cap-accept shadow, every column present) appended
to a `ProductionStore` and flushed as the store flushes (its parts by count here, so the
figure is the writing and not the clock), timed in one process on one core: steps per
second, against the consumer's target of 30 steps a second per rank, and a node of 8 ranks
(240). The baseline, alternated in the same run, is the same steps into one run directory
(`RunWriter`), what `serve --out` does: what the partitioning by rank and hour costs.

`python -m bench.store_write [--json] [--quick]`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .aggregate_update import batches
from .common import record, repeat_pair, run_alone, with_baseline

NAME = "P12_store_write"
B = 256
TARGET_PER_RANK = 30.0
RANKS = 8


def run(quick: bool) -> list[dict]:
    from dspark_obs.store import RunWriter
    from dspark_obs.store.production import ProductionStore

    steps = batches(B, 40 if quick else 200)
    root = Path(tempfile.mkdtemp(prefix="dspark-store-bench-"))
    counter = {"n": 0}
    t = {"now": 1_796_000_000.0}

    def fresh() -> Path:
        counter["n"] += 1
        return root / str(counter["n"])

    def store() -> None:
        path = fresh()
        s = ProductionStore(path, {"format": 1, "gamma": 7}, node="bench", flush_steps=100,
                            clock=lambda: t["now"])  # fmt: skip
        for b in steps:
            s.append(b)
            t["now"] += 1 / 30
        s.close()
        shutil.rmtree(path)

    def one_run() -> None:
        path = fresh()
        with RunWriter(path, {"format": 1, "gamma": 7}, flush_steps=100) as w:
            for b in steps:
                w.append(b)
        shutil.rmtree(path)

    n = 1 if quick else 5
    try:
        times, base = repeat_pair(store, one_run, n, n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_step = [s / len(steps) for s in times]
    rate = 1.0 / sorted(per_step)[len(per_step) // 2]
    rec = record(NAME, {"B": B, "steps": len(steps), "flush_steps": 100}, "ms/step", per_step,
                 1e3, steps_per_s=round(rate, 1), target_steps_per_s=TARGET_PER_RANK,
                 margin_per_rank=round(rate / TARGET_PER_RANK, 1),
                 margin_node_of_8=round(rate / (TARGET_PER_RANK * RANKS), 2),
                 meets_target=rate >= TARGET_PER_RANK * RANKS)  # fmt: skip
    base_per_step = [s / len(steps) for s in base]
    baseline = "the same steps into one run directory (RunWriter)"
    return [with_baseline(rec, base_per_step, 1e3, baseline=baseline)]


if __name__ == "__main__":
    run_alone(run)

"""P1: per-step aggregate update (all live metrics) at batch sizes 1, 64, 256, gamma 7.

Two inputs, each against the SGLang-style baseline (`baselines.SGLangStyleAggregates`)
on the same steps, in the same run:

- `P1_aggregate_update`: from a `StepBatch` (`Aggregates.update` per step); the
  baseline `.tolist()`s each step into per-request records and loops over them.
- `P1_aggregate_update_from_json`: from SGLang's `dspark_info_record` JSON. The
  steps are encoded once, untimed, with our converters into SGLang's form
  (confidence and survival rounded to 4 digits as the server does; one payload
  per `JSON_STEPS_PER_PAYLOAD` steps, like one poll). Ours times decode to
  `StepBatch` (`info_record_to_batches`, workload from the rid) plus the update;
  the baseline times `json.loads` plus its per-request loop.

Before timing, both sides are fed once and the baseline's totals are checked
against ours (`baselines.check_totals`), so the baseline computes the same numbers.
Ours and the baseline are timed alternately, so both see the same machine load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec
import numpy as np

from dspark_obs.aggregates import Aggregates
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.sources.workloads import workload_rule
from dspark_obs.telemetry.server_info import batches_to_info_record, info_record_to_batches

from .baselines import RID_WORKLOAD, SGLangStyleAggregates, check_totals
from .common import record, repeat_pair, with_baseline

TARGET_US = 40.0
RATIO_TARGET = 20.0
JSON_STEPS_PER_PAYLOAD = 50


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


def sglang_payloads(data: list, gamma: int = 7) -> list[bytes]:
    """The steps as SGLang's `dspark_info_record` JSON, one payload per poll's worth."""
    rounded = [
        dataclasses.replace(
            b,
            confidence=None if b.confidence is None else np.round(b.confidence, 4),
            survival=None if b.survival is None else np.round(b.survival, 4),
        )
        for b in data
    ]
    return [
        msgspec.json.encode(
            batches_to_info_record(
                rounded[i : i + JSON_STEPS_PER_PAYLOAD], mode=data[0].mode, gamma=gamma
            )
        )
        for i in range(0, len(rounded), JSON_STEPS_PER_PAYLOAD)
    ]


def compare(
    name: str,
    parameters: dict,
    items: list,
    steps: int,
    ours_feed: Callable[[Aggregates, object], object],
    baseline_feed: Callable[[SGLangStyleAggregates, object], object],
    baseline: str,
    quick: bool,
    **extra,
) -> dict:
    """One figure: `items` (steps or payloads) fed to ours and to the baseline, totals
    checked equal, then both timed alternately."""
    repeats, base_repeats = (1, 1) if quick else (7, 5)

    def ours() -> Aggregates:
        agg = Aggregates(7)
        for item in items:
            ours_feed(agg, item)
        agg.flush()
        return agg

    def theirs() -> SGLangStyleAggregates:
        base = SGLangStyleAggregates(7)
        for item in items:
            baseline_feed(base, item)
        return base

    checked = check_totals(ours(), theirs())
    times, base_times = repeat_pair(ours, theirs, repeats, base_repeats)
    at_256 = parameters["bs"] == 256
    target = {"target": TARGET_US} if at_256 and parameters["input"] == "StepBatch" else {}
    rec = record(name, parameters, "us_per_step", times, 1e6 / steps, **target, **extra)
    return with_baseline(
        rec,
        base_times,
        1e6 / steps,
        RATIO_TARGET if at_256 else None,
        baseline=baseline,
        baseline_check=checked,
    )


def run(quick: bool) -> list[dict]:
    out = []
    steps = 200 if quick else 2000
    workload_of = workload_rule(RID_WORKLOAD.pattern)

    def from_json(agg: Aggregates, payload: bytes) -> None:
        for b in info_record_to_batches(payload, workload_of=workload_of):
            agg.update(b)

    for bs in (1, 64, 256):
        data = batches(bs, steps)
        parameters = {"bs": bs, "gamma": 7, "steps": steps}
        out.append(
            compare(
                "P1_aggregate_update",
                {**parameters, "input": "StepBatch"},
                data,
                steps,
                Aggregates.update,
                SGLangStyleAggregates.update_batch,
                "SGLang-style: .tolist() per step into per-request records, "
                "Python loop updating the same counters and histograms",
                quick,
            )
        )
        payloads = sglang_payloads(data)
        out.append(
            compare(
                "P1_aggregate_update_from_json",
                {
                    **parameters,
                    "input": "dspark_info_record JSON",
                    "steps_per_payload": JSON_STEPS_PER_PAYLOAD,
                },
                payloads,
                steps,
                from_json,
                SGLangStyleAggregates.update_json,
                "SGLang-style: json.loads, then a Python loop over each record's reqs "
                "updating the same counters and histograms",
                quick,
                json_bytes_per_step=sum(map(len, payloads)) / steps,
            )
        )
    return out

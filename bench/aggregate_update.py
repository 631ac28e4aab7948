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

import msgspec
import numpy as np

from dspark_obs.aggregates import Aggregates
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.sources.workloads import workload_rule
from dspark_obs.telemetry.sglang import batches_to_info_record, info_record_to_batches

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


def run(quick: bool) -> list[dict]:
    out = []
    steps = 200 if quick else 2000
    repeats, base_repeats = (3, 3) if quick else (7, 5)
    for bs in (1, 64, 256):
        data = batches(bs, steps)
        targets = {"target": TARGET_US} if bs == 256 else {}
        ratio_target = RATIO_TARGET if bs == 256 else None

        # (a) from StepBatches
        def ours(data=data) -> Aggregates:
            agg = Aggregates(7)
            for b in data:
                agg.update(b)
            agg.flush()
            return agg

        def baseline(data=data) -> SGLangStyleAggregates:
            base = SGLangStyleAggregates(7)
            for b in data:
                base.update_batch(b)
            return base

        checked = check_totals(ours(), baseline())
        times, base_times = repeat_pair(ours, baseline, repeats, base_repeats)
        rec = record(
            "P1_aggregate_update",
            {"bs": bs, "gamma": 7, "steps": steps, "input": "StepBatch"},
            "us_per_step",
            times,
            1e6 / steps,
            **targets,
        )
        out.append(
            with_baseline(
                rec,
                base_times,
                1e6 / steps,
                ratio_target,
                baseline="SGLang-style: .tolist() per step into per-request records, "
                "Python loop updating the same counters and histograms",
                baseline_check=checked,
            )
        )

        # (b) from SGLang's dspark_info_record JSON
        payloads = sglang_payloads(data)
        workload_of = workload_rule(RID_WORKLOAD.pattern)

        def ours_json(payloads=payloads, workload_of=workload_of) -> Aggregates:
            agg = Aggregates(7)
            for p in payloads:
                for b in info_record_to_batches(p, workload_of=workload_of):
                    agg.update(b)
            agg.flush()
            return agg

        def baseline_json(payloads=payloads) -> SGLangStyleAggregates:
            base = SGLangStyleAggregates(7)
            for p in payloads:
                base.update_json(p)
            return base

        checked = check_totals(ours_json(), baseline_json())
        times, base_times = repeat_pair(ours_json, baseline_json, repeats, base_repeats)
        rec = record(
            "P1_aggregate_update_from_json",
            {
                "bs": bs,
                "gamma": 7,
                "steps": steps,
                "input": "dspark_info_record JSON",
                "steps_per_payload": JSON_STEPS_PER_PAYLOAD,
            },
            "us_per_step",
            times,
            1e6 / steps,
            json_bytes_per_step=sum(map(len, payloads)) / steps,
        )
        out.append(
            with_baseline(
                rec,
                base_times,
                1e6 / steps,
                ratio_target,
                baseline="SGLang-style: json.loads, then a Python loop over each record's reqs "
                "updating the same counters and histograms",
                baseline_check=checked,
            )
        )
    return out

"""The embedded runtime's verify step at 256 requests: the traffic behind `demo`, `serve
--source runtime` and the test command's soak, which serves a million request-steps.

Ours fills the keyed normal tables with the compiled pass (`runtime/_hashing.c`); the
baseline, alternated in the same run, is the same runtime with every extension off
(`DSPARK_OBS_NO_EXTENSIONS=1`), which fills them with numpy's hash chain. Each repeat is a
fresh process that steps one level of 256 requests and reports its CPU time a step after a
warm-up, and a digest of every step's drafts, confidence logits, draft log-probabilities,
accept lengths and windows: the two forms must give the same bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dspark_obs import extensions

from .common import record, with_baseline

NAME = "runtime_step"
CONCURRENCY = 256
_CHILD = """
import hashlib, json, time
import numpy as np
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
warm, steps = {warm}, {steps}
rt = DSparkRuntime(RuntimeConfig(seed=3, concurrency=[{concurrency}], steps_per_level=warm + steps,
                                 max_new_tokens=64))
digest = hashlib.sha256()
for n, b in enumerate(rt.run()):
    if n == warm:
        start = time.process_time()
    for col in (b.draft_tokens, b.confidence_logits, b.draft_logprobs, b.acc_len, b.verify_len):
        digest.update(np.ascontiguousarray(col).tobytes())
seconds = time.process_time() - start
print(json.dumps({{"seconds_per_step": seconds / steps, "rows": int(b.num_reqs),
                  "gamma": rt.config.gamma, "vocab": rt.config.vocab_size,
                  "digest": digest.hexdigest()}}))
"""


def _child(off: bool, warm: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != extensions.DISABLE}
    if off:
        env[extensions.DISABLE] = "1"
    code = _CHILD.format(warm=warm, steps=steps, concurrency=CONCURRENCY)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


def run(quick: bool) -> list[dict]:
    if extensions.load("dspark_obs.runtime._hashing") is None:
        return [{"name": NAME, "skipped": "runtime._hashing is not built or is switched off"}]
    repeats, warm, steps = (1, 10, 30) if quick else (7, 30, 200)
    ours, numpy_form = [], []
    for _ in range(repeats):
        ours.append(_child(False, warm, steps))
        numpy_form.append(_child(True, warm, steps))
    digests = {r["digest"] for r in ours + numpy_form}
    if len(digests) != 1:
        raise RuntimeError(f"the two forms' streams differ: {sorted(digests)}")
    rec = record(
        NAME,
        {
            "concurrency": CONCURRENCY,
            "gamma": ours[-1]["gamma"],
            "vocab": ours[-1]["vocab"],
            "steps": steps,
            "warm_up": warm,
        },
        "ms",
        [r["seconds_per_step"] for r in ours],
        1e3,
        rows_last_step=ours[-1]["rows"],
        streams_equal=True,
    )
    return [
        with_baseline(
            rec,
            [r["seconds_per_step"] for r in numpy_form],
            1e3,
            baseline="the same runtime with every extension off (numpy's hash chain)",
        )
    ]

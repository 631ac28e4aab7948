"""The torch target: real forwards, measured step times, lockstep preserved (CPU build in CI)."""

from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("torch")

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime, committed_tokens


def _run(mode: str, **kw):
    cfg = RuntimeConfig(
        seed=2,
        mode=mode,
        target="torch",
        torch_hidden=64,
        concurrency=[12],
        steps_per_level=40,
        max_new_tokens=120,
        **kw,
    )
    return list(DSparkRuntime(cfg).run())


def test_compact_and_cap_accept_stay_in_lockstep_on_the_torch_target():
    streams = {}
    for mode in ("compact", "cap-accept"):
        out = defaultdict(list)
        for b in _run(mode):
            for rid, toks in zip(b.rid, committed_tokens(b), strict=True):
                out[rid].extend(toks)
        streams[mode] = out
    assert streams["compact"] == streams["cap-accept"]
    assert sum(map(len, streams["compact"].values())) > 1000


def test_step_times_are_measured_and_grow_with_the_verify_size():
    cfg = RuntimeConfig(
        seed=2,
        mode="compact",
        target="torch",
        torch_hidden=256,
        concurrency=[1, 128],
        steps_per_level=15,
        max_new_tokens=400,
    )
    assert cfg.timing == "measured"
    batches = list(DSparkRuntime(cfg).run())
    small = np.median([b.target_verify_gpu_ms for b in batches if b.bs == 1])
    large = np.median([b.target_verify_gpu_ms for b in batches if b.bs == 128])
    assert all(b.step_gpu_ms > 0 and b.draft_gpu_ms > 0 for b in batches)
    assert large > 2 * small

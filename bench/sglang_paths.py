"""H2: what SGLang's own DSpark collection paths cost a serving step, on a GPU.

The same stand-in step as H1 (bench/hook_step.py): the LM head GEMM [B·8, 7168] ×
[7168, 129,280] bf16, an accept and one sync, with SGLang 0.5.23's real
`DsparkStepObservers.observe_verify_step` called where SGLang calls it, its inputs
SGLang's own types (tests/sglang_real.py). Arms, interleaved round by round, medians:

- `off`: SGLang's observers with every collection path off (what a server runs with no
  debug setting; the base the others are measured against);
- `server_info_dumper`: `SGLANG_DSPARK_DEBUG_DUMP=core,reqs`, what polling
  `/server_info` needs; the records are taken (`dump_info_records`, what a poll does)
  once per round, outside the timed steps;
- `block_accept_recorder`: `SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`, the JSONL of
  block-accept estimates.

Every request samples (temperature 0.6 to 1.0), windows and acceptance as in H1, and
every step is an eager proposal, so the recorder records every step (it skips folded
ones). Needs CUDA and the `sglang` package; skipped without either.

`python -m bench.sglang_paths [--json] [--quick]`.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from .common import record, run_alone, skipped_without
from .hook_step import BATCHES, GAMMA, StandInStep, V, _steps, interleave

NAME = "H2_sglang_paths"
ARMS = {
    "off": {},
    "server_info_dumper": {"SGLANG_DSPARK_DEBUG_DUMP": "core,reqs"},
    "block_accept_recorder": {"SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH": "{tmp}/ba.jsonl"},
}


def run(quick: bool) -> list[dict]:
    skipped = skipped_without(NAME, "sglang")
    if skipped is not None:
        return skipped
    return [_record(b, quick) for b in ((16, 256) if quick else BATCHES)]


def _sglang_real():
    """tests/sglang_real.py, loaded as on a CPU: with a GPU in sight, SGLang's package
    imports CUDA-only kernel packages (sgl_kernel) at module level, which the observer
    types never use; CUDA is hidden while it loads, and SGLang's cached device check is
    cleared afterwards so that nothing it decides later sees a CPU."""
    import torch

    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        from tests import sglang_real
    finally:
        torch.cuda.is_available = available
    from sglang.srt.utils.common import is_cuda

    is_cuda.cache_clear()
    return sglang_real


def _observers(env: dict, tmp: str):
    """SGLang reads its collection settings when the observers are built."""
    observers = _sglang_real().observers
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v.format(tmp=tmp) for k, v in env.items()})
    try:
        return observers(GAMMA, "cuda")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _record(b: int, quick: bool) -> dict:
    import torch

    as_sglang = _sglang_real().as_sglang
    step = StandInStep(b)
    steps = [as_sglang(kw) for kw in _steps(b, "cuda", V)]
    tmp = tempfile.mkdtemp()
    arms = {name: _observers(env, tmp) for name, env in ARMS.items()}
    per_step = interleave(
        step,
        steps,
        {name: (lambda kw, obs=obs: obs.observe_verify_step(**kw)) for name, obs in arms.items()},
        quick,
        prepare=lambda kw, i: dict(kw, forward_ct=i, proposal_folded=False),
        after_arm=lambda name: arms[name].dump_info_records(),  # a /server_info poll, untimed
    )
    torch.cuda.synchronize()
    med = {k: statistics.median(v) for k, v in per_step.items()}
    rec = record(NAME, {"B": b, "gamma": GAMMA, "V": V, "steps_per_arm": len(per_step["off"])},
                 "ms", per_step["off"], 1e3)  # fmt: skip
    rec.update(
        step_ms={k: round(v * 1e3, 3) for k, v in med.items()},
        added_pct={k: round(100 * (med[k] / med["off"] - 1), 2) for k in arms if k != "off"},
        device=torch.cuda.get_device_name(),
    )
    return rec


if __name__ == "__main__":
    run_alone(run)

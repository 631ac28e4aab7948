"""One serving process of a node, as a test drives it: a DP rank whose DSpark observers
the hook is attached to, stepped on command.

`python -m tests.hook_rank --rank R --listen HOST:PORT --model NAME --seed S` attaches the
hook (with `--sglang`: the way `launch_server` turns it on, through SGLang 0.5.23's own
`register_forward_hooks` with the spec `dspark-obs sglang-flag` printed, passed in
`--spec`, and SGLang's own `DsparkStepObservers` built afterwards; without: to an observer
with SGLang's signature), then reads commands from standard input:

- `run N [SECONDS]`: N steps of `hook_reference.StepStream` (SECONDS apart, as a server
  steps), then `ran N MAX_CALL_SECONDS` on standard output (the longest observer call so
  far: serving never waits on the hook);
- `close`: the hook's close, then `closed`; end of input: exit as a killed process would.

Each stream's request ids start with `r{rank}s{seed}`, so no two processes share one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

#: the stream every rank process plays (gamma 4, as tests/test_sglang_hook.py's)
GAMMA = 4


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sglang", action="store_true")
    p.add_argument("--spec", default=None, help="the --forward-hooks JSON (with --sglang)")
    p.add_argument("--check-seconds", type=float, default=0.5)
    args = p.parse_args()

    from dspark_obs.hooks import sglang_worker

    sglang_worker.CONSUMER_CHECK_SECONDS = args.check_seconds
    from tests.hook_reference import StepStream

    stream = StepStream(gamma=GAMMA, seed=args.seed, rid_prefix=f"r{args.rank}s{args.seed}")
    if args.sglang:
        observers, hook, adapt = _sglang(args)
    else:
        from tests.hook_reference import FakeObservers

        observers = FakeObservers()
        hook = sglang_worker.attach_observers(
            observers, gamma=GAMMA, pool_slots=64, rank=args.rank, model_name=args.model,
            listen=args.listen,
        )  # fmt: skip
        adapt = dict
    print("attached", flush=True)
    longest = 0.0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "run":
            n, pause = int(rest[0]), float(rest[1]) if len(rest) > 1 else 0.0
            for _ in range(n):
                time.sleep(pause)
                kw = adapt(stream.step())
                t0 = time.perf_counter()
                observers.observe_verify_step(**kw)
                longest = max(longest, time.perf_counter() - t0)
            print(f"ran {n} {longest:.6f}", flush=True)
        elif cmd == "close":
            hook.close()
            print("closed", flush=True)
            return 0
    return 0


def _sglang(args):
    """The hook as `--forward-hooks` installs it in a scheduler process of DP rank `rank`."""
    import importlib

    import torch

    # first: it makes SGLang's modules load on a CPU-only torch
    sglang_real = importlib.import_module("tests.sglang_real")
    from sglang.srt.model_executor.hook_manager import register_forward_hooks
    from sglang.srt.runtime_context import get_parallel

    from dspark_obs.hooks import sglang_plugin

    # the placement the launcher publishes for the first TP rank of DP replica `rank`
    get_parallel().override_permanently(
        tp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0, dp_rank=args.rank, pp_rank=0
    )
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    # the target's and the draft's model runners each call the factory
    register_forward_hooks(model, json.loads(args.spec))
    register_forward_hooks(model, json.loads(args.spec))
    if model._forward_hooks or any(m._forward_hooks for m in model.modules()):
        raise AssertionError("a forward hook was registered on the model")
    observers = sglang_real.observers(GAMMA)  # built after the factory ran, as it may be
    hook = sglang_plugin.attached
    if hook is None:
        raise AssertionError("the factory attached no hook to SGLang's observers")
    return observers, hook, sglang_real.as_sglang


if __name__ == "__main__":
    sys.exit(main())

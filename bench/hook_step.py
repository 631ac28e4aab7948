"""H1: what the in-process SGLang hook costs a serving step, on a GPU.

A verify step stood in by its largest part, the LM head: one bf16 GEMM
[B·8, 7168] × [7168, 129,280], then an accept (argmax against the drafts) and
one synchronising copy of its result, as SGLang's worker does once a step. The
hook is called between the accept and the sync, where SGLang calls its observers.
Three measured arms, interleaved round by round (with a fourth, below, that times the
GPU), medians over every step of each:

- `none`: no hook;
- `old`: the synchronous hook this one replaced (every log-probability of every
  request gathered and copied to the host, then the whole pipeline on the serving
  thread), as kept in tests/hook_reference.py;
- `new`: `attach()` as users call it, its consumer in a `dspark-obs hook-consumer`
  process that keeps up (the record says how many steps it dropped: none, when it does).

Per batch the record gives each arm's step time, the added time in percent of the
bare step, the serving thread's time inside the new hook's call (median and p99),
and the GPU time the new hook adds against the bandwidth floor of exactly the rows
it must read. The GPU time is taken in a fourth arm, `timed` (the new hook between
two CUDA events), whose step times count for nothing: the events are stream
operations of their own, and the `new` arm is the hook as users run it. The rows:
each sampled request's target rows inside its window (the bonus row included), and
the draft rows of trimmed sampled requests' tails. Every request samples here
(temperature 0.6 to 1.0), which maximises those rows; windows 2..7 and acceptance
drawn as a compact server's. The floor is given at the read bandwidth measured in the
same run (`amax` over 4 GiB of bf16) and at the H200's nominal 4.8e12 B/s.

`consumer` measures the consumer process's work on one core: steps of B = 256
packed by the torch form, drained from the ring into a pipeline; its figure is
steps per second, against the target of 30 per rank. It runs everywhere (CPU
too); the step arms need CUDA and are skipped without it.

`python -m bench.hook_step [--json] [--quick]`.
"""

from __future__ import annotations

import statistics
import threading
import time

from .common import record, run_alone

NAME = "H1_hook_step"
GAMMA, V, HIDDEN = 7, 129_280, 7168
BATCHES = (16, 64, 256)
HBM_BYTES_PER_S = 4.8e12
VARIANTS = 16


def _steps(b: int, device: str, vocab: int, seed: int = 0):
    """VARIANTS observer keyword sets of B sampled requests (logits filled in per step)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    draft_logits = torch.randn(b, GAMMA, vocab, device=device).mul_(3).to(torch.bfloat16)
    reqs = [SimpleNamespace(rid=f"{i:032x}") for i in range(b)]  # one running batch
    out = []
    for k in range(VARIANTS):
        w = rng.integers(2, GAMMA + 1, b)
        a = np.minimum(w, rng.geometric(0.3, b) - 1)
        temps = torch.tensor(rng.uniform(0.6, 1.0, b), dtype=torch.float32, device=device)
        t = lambda x, dt=torch.int64: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        draft = t(rng.integers(0, vocab, (b, GAMMA)))
        out.append(
            dict(
                forward_ct=k,
                reqs=reqs,
                bs=b,
                proposal_folded=True,
                verify_ids_2d=None,
                target_logits=None,
                layout=SimpleNamespace(verify_lens=t(w + 1, torch.int32)),
                confidence=torch.rand(b, GAMMA, device=device),
                confidence_raw=torch.randn(b, GAMMA, device=device).to(torch.bfloat16),
                prefix_lens=t(1000 + np.arange(b) * 4096 + k * 8),
                draft_tokens=draft,
                draft_block=SimpleNamespace(
                    draft_tokens=draft,
                    corrected_logits=draft_logits,
                    greedy_mask=t(np.zeros(b), torch.bool),
                    temperatures=temps,
                    greedy_draft=False,
                ),
                sampling_info=SimpleNamespace(temperatures=temps[:, None]),
                correct_len=t(a),
                cap_trim_lens=t(np.zeros(b)),
                bonus=t(rng.integers(0, vocab, b)),
                commit_lens=t(a + 1),
                verify_token_budget=int(w.sum()),
                req_pool_indices=t(np.arange(b)),
                verify_tier_num_tokens=int((w + 1).sum()),
                dp_tier_num_tokens=None,
            )
        )
    return out


class StandInStep:
    """A verify step's largest part on the GPU: the LM head GEMM, an accept, one sync."""

    def __init__(self, b: int) -> None:
        import torch

        gen = torch.Generator(device="cuda").manual_seed(0)
        self.b = b
        self.weight = torch.randn(HIDDEN, V, generator=gen, device="cuda", dtype=torch.bfloat16)
        self.hidden = torch.randn(b * (GAMMA + 1), HIDDEN, generator=gen, device="cuda",
                                  dtype=torch.bfloat16)  # fmt: skip

    def __call__(self, kw: dict, observe) -> float:
        """Wall seconds of one step, `observe(kw)` called where SGLang calls its observers."""
        import torch

        start = time.perf_counter()
        logits = self.hidden @ self.weight
        pred = logits.view(self.b, GAMMA + 1, V)[:, :GAMMA].argmax(-1)
        acc = (pred == kw["draft_tokens"]).to(torch.int32).cumprod(1).sum(1)
        if observe is not None:
            kw["target_logits"] = logits
            observe(kw)
        acc.cpu()  # the step's one sync
        return time.perf_counter() - start


def needed_rows(kw: dict) -> tuple[list[int], list[tuple[int, int]]]:
    """The logit rows this step's numbers need (every request samples here): each request's
    target rows inside its window and its bonus row, as rows of the step's target logits;
    the draft rows of the tails of trimmed requests (accepted all of a window shorter than
    gamma), as (request, position) of its draft logits."""
    w = kw["layout"].verify_lens.cpu().numpy().astype(int) - 1
    a = kw["correct_len"].cpu().numpy()
    target = [i * (GAMMA + 1) + r for i in range(len(w)) for r in range(w[i] + 1)]
    draft = [(i, j) for i in range(len(w)) if a[i] == w[i] < GAMMA for j in range(w[i], GAMMA)]
    return target, draft


def _floor_bytes(kw: dict) -> int:
    """Bytes of the logit rows this step's numbers need."""
    target, draft = needed_rows(kw)
    return (len(target) + len(draft)) * V * 2


def consumer_record(quick: bool) -> dict:
    import torch

    from dspark_obs.hooks.consumer import HookConsumer
    from dspark_obs.hooks.observed_step import ObservedStep
    from dspark_obs.hooks.pack_torch import TorchPacker
    from dspark_obs.hooks.shared_ring import SharedRing
    from dspark_obs.hooks.step_layout import StepLayout
    from dspark_obs.pipeline import build_pipeline

    b, vocab, slots = 256, 64, 32
    layout = StepLayout(GAMMA)
    ring = SharedRing(slots=slots, max_bs=b, width=layout.width, gamma=GAMMA,
                      entries=layout.entries)  # fmt: skip
    packer = TorchPacker(layout, b, "cpu")
    consumer = HookConsumer(ring, build_pipeline(GAMMA))
    steps = _steps(b, "cpu", vocab)
    gen = torch.Generator().manual_seed(1)
    rounds = 2 if quick else 8
    times, seq = [], 0
    for _ in range(rounds):
        for k in range(slots):
            kw = dict(steps[k % VARIANTS])
            kw["target_logits"] = torch.randn(b * (GAMMA + 1), vocab, generator=gen)
            step = ObservedStep.from_observer(kw)
            seq += 1
            slot = ring.slot_for(seq)
            packer.pack(step, seq, 0, torch.from_numpy(ring.packed[slot]), 0)
            rids = "\n".join(r.rid for r in kw["reqs"]).encode()
            ring.write_meta(slot, (0, b, 0, 0, 1 | 2 | 4), rids)
            ring.stamps[slot][0] = seq
        start = time.perf_counter()
        n = consumer.drain()
        times.append((time.perf_counter() - start) / n)
    consumer.pipeline.estimator.close()
    ring.close()
    rate = 1.0 / statistics.median(times)
    return {
        **record(f"{NAME}_consumer", {"B": b, "gamma": GAMMA}, "ms/step", times, 1e3),
        "steps_per_s": round(rate, 1),
        "target_steps_per_s": 30,
        "margin": round(rate / 30, 1),
        "meets_target": rate >= 30,
    }


def run(quick: bool) -> list[dict]:
    out = [consumer_record(quick)]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        skipped = {**record(NAME, {}, "ms", [0.0], 1.0), "repeats": 0, "skipped": "no CUDA"}
        return [*out, skipped]
    for b in (16, 256) if quick else BATCHES:
        out.append(_step_record(b, quick))
    return out


def _step_record(b: int, quick: bool) -> dict:
    from types import SimpleNamespace

    import torch

    from dspark_obs.hooks.sglang_worker import SOURCE, attach
    from dspark_obs.hooks.token_logprobs import token_logprobs
    from dspark_obs.pipeline import build_pipeline
    from tests.hook_reference import reference_batch
    from tests.prometheus_harness import free_port

    dev = "cuda"
    step = StandInStep(b)
    steps = _steps(b, dev, V)
    old_pipeline = build_pipeline(GAMMA)

    def old(kw):
        batch, gather = reference_batch(kw, GAMMA, logprobs=token_logprobs)
        old_pipeline.ingest(batch, SOURCE, gather)

    class Observers:
        def observe_verify_step(self, **kw):
            pass

    Observers.observe_verify_step.__signature__ = _sglang_signature()
    worker = SimpleNamespace(_observers=Observers())
    threads = threading.active_count()
    listen = f"127.0.0.1:{free_port()}"
    hook = attach(worker, gamma=GAMMA, listen=listen, pool_slots=max(b, 64), ring_slots=64)
    threads_added = threading.active_count() - threads
    hook_us, gpu_ms, floors = [], [], []

    # Taken before the timed steps: reading a step's windows to the host inside one would
    # wait for the GPU and charge the hook with a sync it does not make.
    floor_of = {id(kw["layout"]): _floor_bytes(kw) for kw in steps}

    def new(kw):
        t0 = time.perf_counter_ns()
        hook.observe(kw)
        hook_us.append((time.perf_counter_ns() - t0) / 1e3)

    def timed(kw):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        hook.observe(kw)
        e1.record()
        gpu_ms.append((e0, e1))
        floors.append(floor_of[id(kw["layout"])])

    state = {}

    def settled() -> None:
        hook_us.clear()
        gpu_ms.clear()
        floors.clear()
        _catch_up(hook)  # the consumer process has started and drained the warm-up
        state["dropped_before"] = hook.ring.counters()["dropped_full"]

    per_step = interleave(step, steps, {"none": None, "old": old, "new": new, "timed": timed},
                          quick, after_warmup=settled)  # fmt: skip
    del per_step["timed"]
    torch.cuda.synchronize()
    gpu = [s.elapsed_time(e) / 1e3 for s, e in gpu_ms]
    _catch_up(hook)
    counters = hook.ring.counters()
    hook.close()
    bandwidth = _read_bandwidth()
    med = {k: statistics.median(v) for k, v in per_step.items()}
    floor_s = statistics.median(floors) / bandwidth
    gpu_med = statistics.median(gpu)
    rec = record(NAME, {"B": b, "gamma": GAMMA, "V": V, "steps_per_arm": len(per_step["none"])},
                 "ms", per_step["new"], 1e3)  # fmt: skip
    rec.update(
        step_ms={k: round(v * 1e3, 3) for k, v in med.items()},
        added_pct={k: round(100 * (med[k] / med["none"] - 1), 2) for k in ("old", "new")},
        target_added_pct=3.0 if b <= 16 else 2.0,
        hook_call_us={
            "median": round(statistics.median(hook_us), 1),
            "p99": round(sorted(hook_us)[int(0.99 * (len(hook_us) - 1))], 1),
            "target": 50,
        },
        gpu_us={
            "median": round(gpu_med * 1e6, 1),
            "floor_measured_bw": round(floor_s * 1e6, 1),
            "floor_nominal_bw": round(statistics.median(floors) / HBM_BYTES_PER_S * 1e6, 1),
            "ratio_to_floor": round(gpu_med / floor_s, 2),
            "target_ratio": 1.3,
            "read_bandwidth_TBps": round(bandwidth / 1e12, 2),
        },
        dropped=counters["dropped_full"] - state["dropped_before"],
        failed=counters["failed"],
        threads_added_to_serving_process=threads_added,
        device=torch.cuda.get_device_name(),
    )
    return rec


def interleave(step, steps, arms: dict, quick: bool, *, prepare=lambda kw, i: dict(kw),
               after_arm=None, after_warmup=None) -> dict[str, list[float]]:  # fmt: skip
    """Wall seconds per step of each arm: the arms take turns, `n` steps each, for a few
    rounds after a warm-up round that is not counted, so that drift in the machine's
    speed (clocks, other work) falls on every arm alike. `prepare(kw, i)` adapts the
    i-th step's inputs; `after_arm(name)` runs after each arm's turn, outside its steps."""
    per_step = {name: [] for name in arms}
    n_steps = 40 if quick else 100
    rounds = 3 if quick else 6
    i = 0
    for r in range(rounds + 1):
        for name, call in arms.items():
            for _ in range(n_steps):
                kw = prepare(steps[i % VARIANTS], i)
                i += 1
                seconds = step(kw, call)
                if r > 0:
                    per_step[name].append(seconds)
            if after_arm is not None:
                after_arm(name)
        if r == 0 and after_warmup is not None:
            after_warmup()
    return per_step


def _catch_up(hook, timeout: float = 30.0) -> None:
    """Wait until the consumer process has released every step the hook submitted."""
    from dspark_obs.hooks.shared_ring import H_CONSUMED

    deadline = time.monotonic() + timeout
    while hook.ring.header[H_CONSUMED] < hook.seq and time.monotonic() < deadline:
        time.sleep(0.05)


def _read_bandwidth() -> float:
    """Bytes per second of a plain read (amax over 4 GiB of bf16), CUDA events."""
    import torch

    x = torch.ones(2 << 30, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x.amax()
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        x.amax()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del x
    return (4 << 30) / statistics.median(times)


def _sglang_signature():
    """The keyword-only signature of SGLang 0.5.23's observer, which attach() checks."""
    import inspect

    from dspark_obs.hooks.sglang_worker import OBSERVER_PARAMETERS

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in sorted(OBSERVER_PARAMETERS)
    ]
    return inspect.Signature(params)


if __name__ == "__main__":
    run_alone(run)

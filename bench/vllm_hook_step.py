"""What the vLLM hook costs a serving step, on a GPU.

The step is stood in by its largest part, as bench/hook_step.py does for SGLang: one bf16
LM-head GEMM [B·8, 7168] × [7168, 129,280] and one synchronising copy; the hook is called
after it, where vLLM's `sample` returns, with the tensors vLLM holds there (a request-state
table of 512 slots, gamma 7, every request verifying drafts, windows trimmed as a top-k
admission trims them). Arms, interleaved round by round, medians over each:

- `none`: no hook;
- `triton`: `VLLMHook.observe` as the plugin calls it on a GPU (one Triton launch into the
  ring's slot; its ring released after each step, as a consumer that keeps up does);
- `torch`: the same hook held to the torch form (`triton=False`), the pass it replaced;
- `timed_triton`, `timed_torch`: each between two CUDA events, for the GPU time of its
  pass (their step times count for nothing: the events are stream operations of their own).

Per batch: the step time with the hook, the added time in percent of the bare step, the
serving thread's time inside the hook's call, and the pass's GPU time, for each form.
Before timing, one step's ring slot as each form wrote it on the GPU is held to the torch
pass run on the CPU over the same tensors (`matches_cpu`). Needs CUDA;
`python -m bench.vllm_hook_step [--json] [--quick]`.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import numpy as np

from .common import record, run_alone, skipped_without

NAME = "vllm_hook_step"

GAMMA, SLOTS, HIDDEN, VOCAB = 7, 512, 7168, 129_280


def _runner(torch, device):
    rng = np.random.default_rng(0)
    return SimpleNamespace(
        req_states=SimpleNamespace(
            max_num_reqs=SLOTS,
            draft_tokens=torch.from_numpy(rng.integers(0, VOCAB, (SLOTS, GAMMA))).to(device),
        ),
        sampler=SimpleNamespace(
            sampling_states=SimpleNamespace(
                temperature=SimpleNamespace(np=rng.choice([0.0, 0.7], SLOTS).astype(np.float32))
            )
        ),
        adaptive_verification=SimpleNamespace(
            _confidence_probs=torch.from_numpy(rng.uniform(0.1, 1, (SLOTS, GAMMA)))
            .float()
            .to(device)
        ),
    )


def _step(torch, bs: int, device, seed: int):
    rng = np.random.default_rng(seed)
    slots = rng.permutation(SLOTS)[:bs]
    admitted = rng.integers(0, GAMMA + 1, bs)
    accepted = np.minimum(rng.geometric(0.3, bs) - 1, admitted)
    scheduled = np.full(bs, GAMMA, np.int32)
    batch = SimpleNamespace(
        req_ids=[f"{seed:08x}{s:024x}" for s in slots],
        idx_mapping=torch.from_numpy(slots.astype(np.int32)).to(device),
        idx_mapping_np=slots.astype(np.intp),
        num_draft_tokens_per_req=scheduled,
        num_computed_tokens_np=rng.integers(100, 4000, bs).astype(np.int32),
        num_draft_tokens=int(admitted.sum()),
    )
    out = SimpleNamespace(
        sampled_token_ids=torch.from_numpy(rng.integers(0, VOCAB, (bs, GAMMA + 1))).to(device),
        num_sampled=torch.from_numpy((accepted + 1).astype(np.int32)).to(device),
        num_rejected=torch.from_numpy((admitted - accepted).astype(np.int32)).to(device),
    )
    return batch, out


def _hook(runner, triton: bool | None, ring_slots: int = 64):
    from dspark_obs.hooks import shared_ring as sr
    from dspark_obs.hooks.step_layout import StepLayout
    from dspark_obs.hooks.vllm_worker import VLLMHook

    layout = StepLayout(GAMMA)
    ring = sr.SharedRing(
        slots=ring_slots, max_bs=SLOTS, width=layout.width, gamma=GAMMA,
        entries=layout.entries, engine="vllm",
    )  # fmt: skip
    return VLLMHook(layout, ring, runner, triton=triton)


def matches_cpu(torch) -> bool:
    """One step through each CUDA form, its slot held to the torch pass on the CPU."""
    cuda = _runner(torch, "cuda")
    host = SimpleNamespace(
        req_states=SimpleNamespace(
            max_num_reqs=SLOTS, draft_tokens=cuda.req_states.draft_tokens.cpu()
        ),
        sampler=cuda.sampler,
        adaptive_verification=SimpleNamespace(
            _confidence_probs=cuda.adaptive_verification._confidence_probs.cpu()
        ),
    )
    blocks = []
    for runner, device, triton in ((host, "cpu", False), (cuda, "cuda", None),
                                   (cuda, "cuda", False)):  # fmt: skip
        hook = _hook(runner, triton)
        batch, out = _step(torch, 48, device, seed=1)
        hook.observe((runner, batch, out))
        torch.cuda.synchronize()
        slot = 1 % hook.ring.slots
        assert hook.ring.ready(1) and hook.failures == 0
        blocks.append(hook.ring.packed[slot][:48].copy())
        hook.ring.close()
    return all(np.array_equal(blocks[0], b, equal_nan=True) for b in blocks[1:])


FORMS = {"triton": None, "torch": False}


def run(quick: bool = False) -> list[dict]:
    skipped = skipped_without(NAME)
    if skipped is not None:
        return skipped
    import torch

    from dspark_obs.hooks import shared_ring as sr

    same = matches_cpu(torch)
    device = torch.device("cuda")
    runner = _runner(torch, device)
    head = torch.randn(HIDDEN, VOCAB, dtype=torch.bfloat16, device=device) * 0.02
    records = []
    rounds = 20 if quick else 200
    arms = ("none", *FORMS, *(f"timed_{f}" for f in FORMS))
    for bs in (16, 64, 256):
        hidden = torch.randn(bs * 8, HIDDEN, dtype=torch.bfloat16, device=device)
        hooks = {f: _hook(runner, triton) for f, triton in FORMS.items()}
        steps = [_step(torch, bs, device, seed=s) for s in range(8)]
        times = {arm: [] for arm in arms}
        inside = {f: [] for f in FORMS}
        gpu = {f: [] for f in FORMS}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(rounds + 5):
            for arm in arms:
                form = arm.removeprefix("timed_")
                timed = arm != form
                batch, out = steps[r % len(steps)]
                t0 = time.perf_counter()
                logits = hidden @ head
                t1 = t2 = 0.0
                if arm != "none":
                    hook = hooks[form]
                    if timed:
                        start.record()
                    t1 = time.perf_counter()
                    hook.observe((runner, batch, out))
                    t2 = time.perf_counter()
                    if timed:
                        end.record()
                logits[:1, :1].item()  # the step's one synchronising copy
                t3 = time.perf_counter()
                if arm != "none":
                    hook.ring.header[sr.H_CONSUMED] = hook.seq  # a consumer that keeps up
                if r < 5:
                    continue
                times[arm].append(t3 - t0)
                if arm in inside:
                    inside[arm].append(t2 - t1)
                if timed:
                    gpu[form].append(start.elapsed_time(end) * 1e-3)
        bare = statistics.median(times["none"])
        extra = {"device": torch.cuda.get_device_name(), "matches_cpu": same, "rounds": rounds,
                 "step_ms_none": bare * 1e3}  # fmt: skip
        for form, hook in hooks.items():
            step = statistics.median(times[form])
            extra |= {
                f"step_ms_{form}": step * 1e3,
                f"added_percent_{form}": 100 * (step / bare - 1),
                f"hook_call_us_median_{form}": statistics.median(inside[form]) * 1e6,
                f"hook_call_us_p99_{form}": float(np.quantile(inside[form], 0.99)) * 1e6,
                f"hook_gpu_us_median_{form}": statistics.median(gpu[form]) * 1e6,
                f"failures_{form}": hook.failures,
                f"dropped_{form}": hook.ring.counters()["dropped_full"],
            }
            hook.ring.close()
        extra["hook_call_ratio_torch_to_triton"] = (
            extra["hook_call_us_median_torch"] / extra["hook_call_us_median_triton"]
        )
        records.append(
            record(NAME, {"B": bs, "gamma": GAMMA}, "ms/step", times["triton"], 1e3, **extra)
        )
    return records


if __name__ == "__main__":
    run_alone(run)

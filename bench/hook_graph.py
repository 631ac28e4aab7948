"""H1 under CUDA graphs: the hook as one launch flag turns it on, in the decode path's shape.

In SGLang 0.5.23 the decode step's GPU work runs as captured graphs: the target's verify
forward (its LM head included) is a graph replay, and the accept is one too where it is
folded into that graph or the sampled-accept region qualifies. The observers are not in
any graph. `DsparkWorkerV2._forward_decode` calls `observe_verify_step` eagerly, after
the replays, the accept and the commits, with `target_logits=logits_output.next_token_logits`.
That tensor is a view of the verify graph's static output, which the next replay
overwrites. `--forward-hooks` factories run in `finalize_cuda_graph_capture`, after every
graph has been captured and after the DSpark worker built its observers.

This bench keeps that order. It builds SGLang's own `DsparkStepObservers` (tests/sglang_real.py)
and captures H1's stand-in step (bench/hook_step.py: the LM head GEMM
[B·8, 7168] × [7168, 129,280] bf16 and an accept) as one CUDA graph per batch size. The
graph reads static input buffers (the rows of hidden states that stand for the step's
tokens, and the drafts) and writes a static logits buffer. Each variant of the step
feeds it other rows, so consecutive steps have different logits. Only then is the hook
installed through SGLang's own `register_forward_hooks` with the spec `dspark-obs
sglang-flag --json` prints, and the plugin attaches it to the observers it finds. A step
copies its inputs into the graph's buffers, replays the graph and calls the observers
with the static logits where SGLang calls them. Then comes the step's one synchronising
copy. Three arms are interleaved round by round (hook_step.interleave), with medians over
every step:

- `off`: SGLang's observers with every collection path off and no hook, which is what a
  server without the flag runs;
- `hook`: the observers the flag's hook is attached to;
- `timed`: the same, with two CUDA events around the observer call for the GPU time it
  adds. Its step times count for nothing, because the events are stream operations of
  their own.

Request positions advance by each step's commits, so tails opened in one step are walked
in the next. After each batch size, the node consumer's `/metrics` is read once and
compared with a CPU reference. The reference gets the same steps: each variant's logits
replayed from the graph and copied to the host, and every step the hook handed to the
ring, in order. They go through tests/hook_reference.py's synchronous form into a
pipeline of their own. Every counter and histogram series must agree, up to float32
summation order (relative 1e-5).

Needs CUDA and the `sglang` package; skipped without either.

`python -m bench.hook_graph [--json] [--quick]`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request

from .common import record, run_alone, skipped_without
from .hook_step import (
    BATCHES,
    GAMMA,
    HIDDEN,
    VARIANTS,
    StandInStep,
    V,
    _catch_up,
    _steps,
    interleave,
)

NAME = "H1_hook_graph"
MODEL = "stand-in"
#: H1's fourth round on an H200 (bench/RESULTS.md): the added step time in its five runs,
#: and the GPU time the hook adds, per batch size
H1_ADDED_PCT = {16: (1.85, 5.38), 64: (-3.24, 1.31), 256: (0.46, 2.31)}
H1_GPU_US = {16: (17.9, 18.5), 64: (47.6, 48.9), 256: (152.6, 154.1)}
#: float32 sums in another order (GPU kernel against the CPU's torch form)
REL_TOLERANCE = 1e-5
#: a counter or histogram sample of the exposition
SUMMED = re.compile(r"^(dspark_\w+?(?:_total|_bucket|_sum|_count))(?:\{(.*)\})? (\S+)$")


def run(quick: bool) -> list[dict]:
    skipped = skipped_without(NAME, "sglang")
    if skipped is not None:
        return skipped
    return measure((16, 256) if quick else BATCHES, quick)


class GraphStep(StandInStep):
    """H1's stand-in step, its GPU work captured once and replayed as SGLang's decode does.

    `weight` and `hidden` replace the stand-in's (a smaller vocabulary, or a CPU, where the
    step is run eagerly: there is no graph to capture there)."""

    def __init__(self, b: int, *, weight=None, hidden=None) -> None:
        import torch

        if weight is None:
            super().__init__(b)
        else:
            self.b, self.weight, self.hidden = b, weight, hidden
        dev = self.weight.device
        # the graph's input buffers, which SGLang's replay fills before each replay
        self.rows = torch.zeros(b * (GAMMA + 1), dtype=torch.int64, device=dev)
        self.drafts = torch.zeros(b, GAMMA, dtype=torch.int64, device=dev)
        self.inputs: dict[int, object] = {}
        self.graph = None
        if dev.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._forward()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits, self.accepted = self._forward()
        else:
            self.logits, self.accepted = self._forward()

    def _forward(self):
        import torch

        logits = self.hidden.index_select(0, self.rows) @ self.weight
        pred = logits.view(self.b, GAMMA + 1, -1)[:, :GAMMA].argmax(-1)
        return logits, (pred == self.drafts).to(torch.int32).cumprod(1).sum(1)

    def bind(self, steps: list[dict], seed: int = 0) -> None:
        """Each variant's hidden rows: other logits for every variant."""
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed)
        n = self.rows.numel()
        for kw in steps:
            rows = torch.randint(0, self.hidden.shape[0], (n,), generator=gen)
            self.inputs[id(kw["layout"])] = rows.to(self.rows.device)

    def replay(self, kw: dict) -> None:
        self.rows.copy_(self.inputs[id(kw["layout"])])
        self.drafts.copy_(kw["draft_tokens"])
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits, self.accepted = self._forward()

    def __call__(self, kw: dict, observe) -> float:
        """Wall seconds of one step, `observe(kw)` called after the replay, on its outputs."""
        start = time.perf_counter()
        self.replay(kw)
        if observe is not None:
            kw["target_logits"] = self.logits
            observe(kw)
        self.accepted.cpu()  # the step's one sync
        return time.perf_counter() - start

    def variant_logits(self, steps: list[dict]) -> list:
        """Each variant's logits as a replay writes them, on the host (bf16)."""
        out = []
        for kw in steps:
            self.replay(kw)
            out.append(self.logits.to("cpu", copy=True))
        return out


def measure(batches, quick: bool, *, device: str = "cuda", vocab: int = V,
            hidden: int = HIDDEN) -> list[dict]:  # fmt: skip
    """One record per batch size; `vocab` and `hidden` other than H1's for tests."""
    import torch

    from dspark_obs.hooks import sglang_plugin
    from dspark_obs.pipeline import build_pipeline
    from tests.prometheus_harness import free_port

    from .sglang_paths import _sglang_real

    sglang_real = _sglang_real()
    from sglang.srt.model_executor.hook_manager import register_forward_hooks
    from sglang.srt.runtime_context import get_parallel

    if sglang_plugin.attached is not None or sglang_plugin._done:
        raise RuntimeError("the hook was already installed in this process")
    # the placement the launcher publishes for DP rank 0's first TP rank
    get_parallel().override_permanently(
        tp_rank=0, attn_tp_rank=0, attn_dp_rank=0, attn_cp_rank=0, dp_rank=0, pp_rank=0
    )
    served = sglang_real.observers(GAMMA, device)  # the DSpark worker's, built before capture
    steps_of = {}
    for b in batches:  # every batch size's graph is captured before the factories run
        gen = torch.Generator(device=device).manual_seed(b)
        if vocab == V and hidden == HIDDEN and device == "cuda":
            step = GraphStep(b)
        else:
            step = GraphStep(
                b,
                weight=torch.randn(hidden, vocab, generator=gen, device=device).to(torch.bfloat16),
                hidden=torch.randn(b * (GAMMA + 1), hidden, generator=gen, device=device).to(
                    torch.bfloat16
                ),
            )
        steps_of[b] = step
    listen = f"127.0.0.1:{free_port()}"
    spec = json.loads(_flag(listen, pool_slots=max(max(batches), 64)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    for _ in ("target", "draft"):  # each model runner calls the factory
        register_forward_hooks(model, spec)
    if any(m._forward_hooks for m in model.modules()):
        raise AssertionError("a forward hook was registered on the model")
    hook = sglang_plugin.attached
    if hook is None:
        raise AssertionError("the factory attached no hook to SGLang's observers")
    bare = sglang_real.observers(GAMMA, device)  # a server started without the flag
    reference = build_pipeline(GAMMA)
    out = []
    try:
        for b in batches:
            out.append(_record(b, steps_of.pop(b), served, bare, hook, reference, quick,
                               device, vocab, listen))  # fmt: skip
    finally:
        hook.close()
        if hook.process is not None:  # the consumer this process started, not left behind
            hook.process.terminate()
            hook.process.wait(30)
        reference.estimator.close()
    return out


def _flag(listen: str, pool_slots: int) -> str:
    """The `--forward-hooks` value, as `dspark-obs sglang-flag --json` prints it; the ring
    and slots H1 ran with."""
    cmd = [sys.executable, "-m", "dspark_obs", "sglang-flag", "--json", "--listen", listen,
           "--model", MODEL, "--ring-slots", "64", "--pool-slots", str(pool_slots)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def _record(b, step, served, bare, hook, reference, quick, device, vocab, listen) -> dict:
    import numpy as np
    import torch

    from tests.sglang_real import as_sglang

    plain = _steps(b, device, vocab)  # H1's keyword sets; SGLang's types below
    steps = [as_sglang(kw) for kw in plain]
    step.bind(steps)
    cuda = device == "cuda"
    # positions advance by each step's commits, whichever arm takes it
    commits = np.stack([kw["commit_lens"].cpu().numpy() for kw in plain])
    prefix = plain[0]["prefix_lens"].cpu().numpy()
    prefixes = []
    for i in range(_steps_in(quick) * (3 if cuda else 2)):
        prefixes.append(prefix)
        prefix = prefix + commits[i % VARIANTS]
    prefix_t = [torch.as_tensor(p, device=device) for p in prefixes]  # made before any step

    hooked: list[int] = []  # the steps the hook handed to the ring, in order
    state = {"i": -1, "seq": hook.seq}
    call_ns = {"off": [], "hook": []}
    events = []

    def note() -> None:
        if hook.seq != state["seq"]:
            hooked.append(state["i"])
            state["seq"] = hook.seq

    def prepare(kw, i):
        note()  # the previous step's, outside any timed step
        state["i"] = i
        return dict(kw, forward_ct=i, prefix_lens=prefix_t[i])

    def observed(obs, times):
        def call(kw):
            t0 = time.perf_counter_ns()
            obs.observe_verify_step(**kw)
            times.append(time.perf_counter_ns() - t0)

        return call

    def timed(kw):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        served.observe_verify_step(**kw)
        e1.record()
        events.append((e0, e1))

    def after_arm(name):
        note()

    def settled():
        for v in call_ns.values():
            v.clear()
        events.clear()
        _catch_up(hook)
        state["dropped_before"] = hook.ring.counters()["dropped_full"]

    arms = {"off": observed(bare, call_ns["off"]), "hook": observed(served, call_ns["hook"])}
    if cuda:
        arms["timed"] = timed
    failed_before = hook.ring.counters()["failed"]
    per_step = interleave(step, steps, arms, quick, prepare=prepare, after_arm=after_arm,
                          after_warmup=settled)  # fmt: skip
    per_step.pop("timed", None)
    if cuda:
        torch.cuda.synchronize()
    gpu = [s.elapsed_time(e) / 1e3 for s, e in events]
    _catch_up(hook)
    counters = hook.ring.counters()
    check = _check(b, step, plain, steps, hooked, prefixes, reference, counters, listen, hook)
    med = {k: statistics.median(v) for k, v in per_step.items()}
    added = round(100 * (med["hook"] / med["off"] - 1), 2)
    call_med = {k: statistics.median(v) / 1e3 for k, v in call_ns.items()}
    rec = record(NAME, {"B": b, "gamma": GAMMA, "V": vocab, "steps_per_arm": len(per_step["off"])},
                 "ms", per_step["hook"], 1e3)  # fmt: skip
    rec.update(
        step_ms={k: round(v * 1e3, 3) for k, v in med.items()},
        added_pct=added,
        target_added_pct=3.0 if b <= 16 else 2.0,
        h1_added_pct=H1_ADDED_PCT.get(b),
        within_h1=b in H1_ADDED_PCT and added <= H1_ADDED_PCT[b][1],
        observer_call_us={
            "off_median": round(call_med["off"], 1),
            "hook_median": round(call_med["hook"], 1),
            "hook_p99": round(_p99(call_ns["hook"]) / 1e3, 1),
            "added_median": round(call_med["hook"] - call_med["off"], 1),
        },
        gpu_us={"median": round(statistics.median(gpu) * 1e6, 1), "h1": H1_GPU_US.get(b)}
        if gpu
        else None,
        steps_hooked=len(hooked),
        dropped=counters["dropped_full"] - state["dropped_before"],
        failed=counters["failed"] - failed_before,
        metrics=check,
        metrics_match=check["match"],
        graph=step.graph is not None,
        device=torch.cuda.get_device_name() if cuda else "cpu",
    )
    return rec


def _steps_in(quick: bool) -> int:
    """Steps one arm takes in `interleave`, the warm-up round included."""
    return (1 + (3 if quick else 6)) * (40 if quick else 100)


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def _check(b, step, plain, steps, hooked, prefixes, reference, counters, listen, hook) -> dict:
    """The consumer's `/metrics` against the CPU reference fed the same steps so far."""
    import numpy as np
    from dspark_obs.exporters.collector import Collector

    from dspark_obs.hooks.sglang_worker import SOURCE
    from dspark_obs.hooks.token_logprobs import token_logprobs_reference
    from tests.hook_reference import reference_batch
    from tests.test_sglang_hook import rows_the_hook_reads

    logits = step.variant_logits(steps)
    again = step.variant_logits(steps[:2])
    deterministic = all(a.equal(c) for a, c in zip(again, logits, strict=False))
    memo: dict[int, object] = {}
    cached = []
    gathered = [0]

    def counted(gather):
        def read(rows, positions, tokens):
            gathered[0] += len(rows)
            return gather(rows, positions, tokens)

        return read

    for kw, lg in zip(plain, logits, strict=True):
        cpu_kw = _on_cpu(kw, memo)
        cpu_kw["target_logits"] = lg
        # the naive form: the torch form's index_select is slow on a CPU at this width
        batch, gather = reference_batch(cpu_kw, GAMMA, logprobs=token_logprobs_reference)
        cached.append((batch, counted(gather)))
    for i in hooked:
        batch, gather = cached[i % VARIANTS]
        arrays = {f.name: getattr(batch, f.name).copy() for f in dataclasses.fields(batch)
                  if isinstance(getattr(batch, f.name), np.ndarray)}  # fmt: skip
        arrays["prefix_len"] = prefixes[i].astype(np.int64)
        batch = dataclasses.replace(batch, forward_ct=i, **arrays)
        reference.ingest(rows_the_hook_reads(batch), SOURCE, gather)
    reference.stats.set_dropped("hook_ring_full", counters["dropped_full"])
    reference.stats.set_dropped("hook_slot_too_small", counters["dropped_other"])
    want = _summed(
        Collector(const_labels=(("engine", "sglang"), ("model_name", MODEL)))
        .collect(
            reference.aggregates.snapshot(),
            reference.stats.snapshot(),
            reference.estimator.snapshot(),
        )
        .decode()
    )
    got, scrapes = _scrape(listen, hook.seq)
    diff, worst = [], 0.0
    for key in sorted(set(want) | set(got)):
        a, c = want.get(key), got.get(key)
        if a is None or c is None:
            diff.append((key, a, c))
            continue
        rel = abs(a - c) / max(abs(a), abs(c), 1e-12)
        worst = max(worst, rel)
        if rel > REL_TOLERANCE:
            diff.append((key, a, c))
    return {
        "match": not diff and deterministic,
        "series": len(want),
        "families": len({k[0] for k in want}),
        "differing": len(diff),
        "examples": [[k[0], dict(k[1]), a, c] for k, a, c in diff[:8]],
        "max_rel_difference": worst,
        "steps_published": sum(v for k, v in got.items() if k[0] == "dspark_steps_total"),
        "scrapes": scrapes,
        "tails_opened_so_far": int(reference.estimator.walker.opened),
        "positions_gathered": gathered[0],
        "replay_deterministic": deterministic,
    }


def _on_cpu(value, memo: dict):
    """The step's inputs on the host (each tensor copied once)."""
    from types import SimpleNamespace

    import torch

    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = value.cpu()
        return memo[id(value)]
    if isinstance(value, SimpleNamespace):
        return SimpleNamespace(**{k: _on_cpu(v, memo) for k, v in vars(value).items()})
    if isinstance(value, dict):
        return {k: _on_cpu(v, memo) for k, v in value.items()}
    return value


def _scrape(listen: str, steps: int, timeout: float = 60.0) -> tuple[dict, int]:
    """The consumer's series once it has ingested `steps` steps. Each scrape folds the walk
    (as the reference's one collect does), so one is taken after the ring is drained, and
    more only while the last steps are still being ingested."""
    deadline = time.monotonic() + timeout
    scrapes = 0
    time.sleep(0.5)
    while True:
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as r:
            got = _summed(r.read().decode())
        scrapes += 1
        published = sum(v for k, v in got.items() if k[0] == "dspark_steps_total")
        if published >= steps or time.monotonic() > deadline:
            return got, scrapes
        time.sleep(0.5)


def _summed(text: str) -> dict[tuple, float]:
    out = {}
    for line in text.splitlines():
        m = SUMMED.match(line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


if __name__ == "__main__":
    run_alone(run)

"""The vLLM hook on vLLM 0.33.0's own classes and call-site types, on CPU.

vLLM's `GPUModelRunner`, `RequestState` and `AdaptiveVerificationManager` cannot be built
on a CPU (page-locked buffers, CUDA streams and events), so the runner here is an instance
of a subclass of vLLM's real `GPUModelRunner` made without its constructor, holding the
tensors the model runner holds at `sample`'s call site in the shapes and dtypes vLLM
allocates them: `req_states.draft_tokens` [max_reqs, gamma] int64, the manager's
`_confidence_probs` [max_reqs, gamma] float32, the sampler's temperature with its host
view. The step's budget comes from vLLM's own `AdaptiveVerificationManager.get_num_tokens`
(its host code, on the previous step's confidences, with cost tables from vLLM's
`build_cost_tables_from_curves`) and the admission from vLLM's own
`_assign_draft_token_budget`; the sampler's verdict is handed over in vLLM's real
`InputBatch` and `SamplerOutput`, with `num_rejected` as vLLM's
`get_num_sampled_and_rejected` defines it (the logits of the request less its sampled
tokens). The hook's StepBatches are held to a reference computed here from those inputs.

The file needs the `vllm` package, which pins a torch the rest of the suite does not use:
tools/test.sh installs it without its dependencies in a third environment (`.venv-vllm`)
and runs this file there; in the main environment it skips.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
model_runner = pytest.importorskip("vllm.v1.worker.gpu.model_runner")

from vllm.v1.worker.gpu.input_batch import InputBatch  # noqa: E402
from vllm.v1.worker.gpu.sample.output import SamplerOutput  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av  # noqa: E402

from dspark_obs.hooks import shared_ring as sr  # noqa: E402
from dspark_obs.hooks import vllm_plugin  # noqa: E402
from dspark_obs.hooks.vllm_worker import attach_runner, knows_interface  # noqa: E402
from dspark_obs.pipeline import build_pipeline  # noqa: E402

GAMMA, MAX_REQS, VOCAB = 5, 16, 50


class Runner(model_runner.GPUModelRunner):
    """vLLM's runner with the model's sampling replaced by the step the test prepared."""

    def sample(self, hidden_states, input_batch, grammar_output):
        return self.prepared, self.prepared.num_sampled, self.prepared.num_rejected


def make_runner(adaptive: bool = True) -> Runner:
    runner = object.__new__(Runner)
    runner.num_speculative_steps = GAMMA
    runner.speculator = object()
    runner.is_last_pp_rank = True
    runner.req_states = SimpleNamespace(
        max_num_reqs=MAX_REQS,
        draft_tokens=torch.zeros(MAX_REQS, GAMMA, dtype=torch.int64),
    )
    runner.sampler = SimpleNamespace(
        sampling_states=SimpleNamespace(
            temperature=SimpleNamespace(np=np.zeros(MAX_REQS, np.float32))
        )
    )
    runner.adaptive_verification = (
        SimpleNamespace(
            _confidence_probs=torch.ones(MAX_REQS, GAMMA, dtype=torch.float32),
            num_speculative_steps=GAMMA,
        )
        if adaptive
        else None
    )
    return runner


def budget_manager(stale: np.ndarray, computed: np.ndarray, prefill: np.ndarray, ids: dict):
    """The fields vLLM's `get_num_tokens` reads, around its real host code."""
    draft_curve = [(1, 1.0), (4, 1.2), (16, 2.0)]
    verify_curve = [(1, 2.0), (16, 2.5), (64, 4.0), (256, 9.0)]
    tables = av.build_cost_tables_from_curves(draft_curve, verify_curve, MAX_REQS, 512, 64)
    return SimpleNamespace(
        cost_tables=tables,
        req_states=SimpleNamespace(
            req_id_to_index=ids, num_computed_tokens_np=computed,
            prefill_len=SimpleNamespace(np=prefill),
        ),
        _stale_confidences=[SimpleNamespace(np=stale)],
        _stale_idx=0,
        num_speculative_steps=GAMMA,
        _max_total_logits=4096,
        num_bonus_tokens=1,
        _batch_budget=None,
    )  # fmt: skip


def input_batch(**values) -> InputBatch:
    names = [f.name for f in dataclasses.fields(InputBatch)]
    return InputBatch(**{n: values.get(n) for n in names})


class Traffic:
    """Steps of a batch whose requests come and go, as vLLM's runner would hold them."""

    def __init__(self, runner: Runner, seed: int, adaptive: bool = True) -> None:
        self.runner, self.adaptive = runner, adaptive
        self.rng = np.random.default_rng(seed)
        self.stale = np.ones((MAX_REQS, GAMMA), np.float32)  # last step's confidences
        self.computed = self.rng.integers(10, 400, MAX_REQS).astype(np.int32)
        self.prefill = np.full(MAX_REQS, 5, np.int32)
        self.step_no = 0

    def step(self, n_verify: int, n_prefill: int = 1):
        rng, runner, g = self.rng, self.runner, GAMMA
        self.step_no += 1
        n = n_verify + n_prefill
        slots = rng.permutation(MAX_REQS)[:n]
        req_ids = [f"req-{self.step_no}-{s}" for s in slots]
        ids = dict(zip(req_ids, slots.tolist(), strict=True))
        scheduled = np.zeros(n, np.int32)
        scheduled[:n_verify] = rng.integers(1, g + 1, n_verify)
        scheduled[: n_verify // 2] = g
        draft = torch.from_numpy(rng.integers(0, VOCAB, (MAX_REQS, g)))
        draft[torch.from_numpy(slots[n_verify:])] = -1
        runner.req_states.draft_tokens.copy_(draft)
        temps = rng.choice([0.0, 0.7, 1.0], MAX_REQS).astype(np.float32)
        runner.sampler.sampling_states.temperature.np[:] = temps
        conf = torch.from_numpy(rng.uniform(0.05, 1.0, (MAX_REQS, g)).astype(np.float32))
        idx = torch.from_numpy(slots.astype(np.int64))
        tokens = {r: [0] * int(s) + [0] for r, s in zip(req_ids, scheduled, strict=True)}
        per_req = {r: len(t) for r, t in tokens.items()}
        drafts = {r: [1] * int(s) for r, s in zip(req_ids, scheduled, strict=True) if s}
        if self.adaptive:
            runner.adaptive_verification._confidence_probs.copy_(conf)
            manager = budget_manager(self.stale, self.computed, self.prefill, ids)
            av.AdaptiveVerificationManager.get_num_tokens(manager, per_req, drafts)
            budget = manager._batch_budget[2]
            capacities = torch.from_numpy(scheduled.astype(np.int32))
            if 0 < budget < int(scheduled.sum()):
                av._assign_draft_token_budget(conf, idx, capacities, budget, g)
            elif budget == 0:
                capacities.zero_()
            admitted = capacities.numpy().astype(np.int64)
            self.stale = conf.numpy().copy()
        else:
            admitted = scheduled.astype(np.int64)
            budget = int(admitted.sum())
        accepted = np.array([rng.integers(0, w + 1) for w in admitted])
        sampled_n = np.where(scheduled > 0, accepted + 1, rng.integers(0, 2, n))
        accepted = np.where(scheduled > 0, accepted, 0)
        num_logits = np.where(scheduled > 0, admitted + 1, sampled_n)
        sampled = torch.from_numpy(rng.integers(0, VOCAB, (n, g + 1)))
        for b in range(n_verify):
            sampled[b, : accepted[b]] = draft[slots[b], : accepted[b]]
        cu = np.concatenate(([0], np.cumsum(num_logits))).astype(np.int32)
        batch = input_batch(
            req_ids=req_ids, num_reqs=n, idx_mapping=idx, idx_mapping_np=slots.astype(np.intp),
            num_draft_tokens=int(admitted[:n_verify].sum()), num_draft_tokens_per_req=scheduled,
            num_computed_tokens_np=self.computed[slots], cu_num_logits=torch.from_numpy(cu),
            cu_num_logits_np=cu,
        )  # fmt: skip
        num_sampled = torch.from_numpy(sampled_n.astype(np.int32))
        runner.prepared = SamplerOutput(
            sampled_token_ids=sampled, logprobs_tensors=None, num_nans=None,
            num_sampled=num_sampled,
            num_rejected=torch.from_numpy((num_logits - sampled_n).astype(np.int32)),
        )  # fmt: skip
        v = slice(0, n_verify)
        masked = draft[slots[v]].numpy().copy()
        masked[np.arange(g)[None, :] >= scheduled[v, None]] = -1
        reference = dict(
            rid=req_ids[:n_verify], req_pool_index=slots[v], prefix_len=self.computed[slots[v]],
            verify_len=admitted[v] + 1, correct_drafts=accepted[v], acc_len=accepted[v] + 1,
            cap_trim=np.zeros(n_verify), bonus_token=sampled[np.arange(n_verify), accepted[v]],
            greedy=temps[slots[v]] == 0, temperature=np.where(temps[slots[v]] == 0, 0.0,
                                                              temps[slots[v]]),
            draft_tokens=masked,
        )  # fmt: skip
        if self.adaptive:
            reference["confidence"] = conf.numpy()[slots[v]].astype(np.float64)
            reference["survival"] = np.cumprod(reference["confidence"], axis=1)
        self.computed[slots] += sampled_n.astype(np.int32)
        return batch, reference, budget


def recording(pipeline):
    seen = []
    ingest = pipeline.ingest

    def record(batch, source="runtime", gather=None):
        seen.append((batch, source))
        return ingest(batch, source, gather)

    pipeline.ingest = record
    return seen


@pytest.mark.parametrize("adaptive", [True, False], ids=["adaptive", "fixed"])
def test_every_step_equals_the_reference(adaptive):
    runner = make_runner(adaptive)
    pipeline = build_pipeline(GAMMA)
    seen = recording(pipeline)
    hook = attach_runner(runner, consumer="inline", pipeline=pipeline, model_name="m")
    assert hook is not None and hook.ring.engine == "vllm"
    assert hook.ring.mode == ("compact" if adaptive else "static")
    traffic = Traffic(runner, seed=3, adaptive=adaptive)
    expected = []
    for k in range(12):
        batch, reference, budget = traffic.step(n_verify=1 + k % 9, n_prefill=k % 3)
        out = runner.sample(None, batch, None)
        assert out[0] is runner.prepared  # vLLM gets its own result back, untouched
        expected.append((reference, budget))
        if k % 4 == 3:
            hook.drain()
    hook.drain()
    assert len(seen) == len(expected)
    counts = pipeline.stats.snapshot()
    assert counts.errors == {} and counts.records == {"vllm-hook": len(expected)}
    for (got, source), (reference, budget) in zip(seen, expected, strict=True):
        assert source == "vllm-hook"
        assert got.mode == ("compact" if adaptive else "static")
        assert got.budget == (budget if adaptive else None)
        for name, want in reference.items():
            have = getattr(got, name)
            if name == "rid":
                assert list(have) == want
            else:
                np.testing.assert_array_equal(
                    np.asarray(have, dtype=np.float64),
                    np.asarray(want, dtype=np.float64),
                    err_msg=name,
                )
        if not adaptive:
            assert got.confidence is None
    assert hook.failures == 0
    hook.close()


def test_the_budget_binds_somewhere():
    """The traffic exercises vLLM's admission: some steps admit fewer drafts than scheduled
    (the windows then differ from the scheduled counts), so the test above checks a trim."""
    runner = make_runner()
    traffic = Traffic(runner, seed=3)
    trimmed = 0
    for k in range(12):
        batch, _, budget = traffic.step(n_verify=1 + k % 9, n_prefill=k % 3)
        trimmed += int(budget < batch.num_draft_tokens_per_req.sum())
    assert trimmed > 0


def test_a_full_ring_drops_whole_steps_and_counts_them():
    runner = make_runner()
    hook = attach_runner(runner, consumer="inline", pipeline=build_pipeline(GAMMA), ring_slots=2)
    traffic = Traffic(runner, seed=5)
    for _ in range(5):
        batch, _, _ = traffic.step(n_verify=3)
        runner.sample(None, batch, None)
    assert hook.ring.counters()["dropped_full"] == 3
    assert hook.drain() == 2
    hook.close()


def test_a_failure_inside_the_hook_is_counted_and_never_raised(caplog):
    runner = make_runner()
    hook = attach_runner(runner, consumer="inline", pipeline=build_pipeline(GAMMA))
    traffic = Traffic(runner, seed=7)
    batch, _, _ = traffic.step(n_verify=3)
    runner.prepared.num_sampled = None  # a verdict the pass cannot read
    with caplog.at_level(logging.ERROR):
        runner.sample(None, batch, None)
        runner.sample(None, batch, None)
    assert hook.failures == 2
    assert sum("a step failed" in r.message for r in caplog.records) == 1
    hook.close()


def test_the_hook_knows_vllms_own_call_site():
    assert knows_interface(model_runner.GPUModelRunner, InputBatch, SamplerOutput)
    for name in ("_confidence_probs", "num_speculative_steps"):
        assert name in av.AdaptiveVerificationManager.__init__.__code__.co_names or hasattr(
            av.AdaptiveVerificationManager, name
        )


def test_another_interface_is_one_warning_and_nothing_else(caplog):
    class Other(model_runner.GPUModelRunner):
        def sample(self, hidden_states, input_batch):  # not 0.33.0's
            raise AssertionError("never called by the hook")

    runner = object.__new__(Other)
    runner.num_speculative_steps = GAMMA
    runner.speculator = object()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert attach_runner(runner, consumer="inline") is None
    assert len(caught) == 1 and "not one the hook knows" in str(caught[0].message)
    assert "sample" not in runner.__dict__
    module = SimpleNamespace(GPUModelRunner=Other, InputBatch=InputBatch)
    with caplog.at_level(logging.WARNING):
        vllm_plugin.wrap_runner_class(module, "127.0.0.1:1")
    assert Other.__dict__["sample"].__name__ == "sample" and not hasattr(
        Other.__dict__["sample"], "__wrapped__"
    )
    assert sum("not 0.33.0's" in r.message for r in caplog.records) == 1


def test_off_without_the_environment_variable(monkeypatch):
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    before = list(__import__("sys").meta_path)
    vllm_plugin.register()
    assert __import__("sys").meta_path == before


def test_the_plugin_attaches_on_the_first_step(monkeypatch):
    """Through the entry point's own wrapping of the runner class (a subclass, so vLLM's
    class is left as it was): the first `sample` of a runner attaches, that step and the
    next go through the hook, and the runner's result is returned unchanged."""

    class Wrapped(Runner):
        pass

    runner = make_runner()
    runner.__class__ = Wrapped
    runner.parallel_config = SimpleNamespace(data_parallel_rank=1)
    made = []

    def attach(runner, **options):
        options.update(consumer="inline", pipeline=build_pipeline(GAMMA))
        made.append(attach_runner(runner, **options))
        return made[-1]

    monkeypatch.setattr("dspark_obs.hooks.vllm_worker.attach_runner", attach)
    vllm_plugin.wrap_runner_class(SimpleNamespace(GPUModelRunner=Wrapped), "127.0.0.1:9")
    traffic = Traffic(runner, seed=11)
    for _ in range(2):
        batch, _, _ = traffic.step(n_verify=4)
        assert runner.sample(None, batch, None)[0] is runner.prepared
    (hook,) = made
    assert hook.ring.rank == 1 and hook.seq == 2
    assert hook.drain() == 2
    hook.close()
    vllm_plugin.attached.clear()


def test_the_ring_names_the_engine():
    runner = make_runner()
    hook = attach_runner(runner, consumer="inline", pipeline=build_pipeline(GAMMA))
    assert sr.ENGINES[int(hook.ring.header[sr.H_ENGINE])] == "vllm"
    hook.close()


def test_a_bad_setting_is_one_warning_and_the_hook_stays_off(monkeypatch, caplog):
    import sys

    monkeypatch.setenv(vllm_plugin.ENV, "127.0.0.1:9464")
    monkeypatch.setenv(vllm_plugin.ENV_SLOTS, "many")
    before = list(sys.meta_path)
    with caplog.at_level(logging.WARNING):
        vllm_plugin.register()
    assert sys.meta_path == before
    assert [r.message for r in caplog.records if "dspark-obs" in r.message] == [
        "dspark-obs: the vLLM hook is off in this process: DSPARK_OBS_VLLM_RING_SLOTS must "
        "be a whole number of steps in 1..65536, not 'many'"
    ]
    assert vllm_plugin.ring_slots({vllm_plugin.ENV_SLOTS: "4"}) == 4


def test_the_node_consumer_process_serves_the_steps_as_engine_vllm():
    """The deployment's path: the hook starts the node's `dspark-obs hook-consumer` process
    on its port, which finds the ring and serves the steps on `/metrics` under
    `engine="vllm"`, the model's name and the DP rank."""
    import re
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = make_runner()
    hook = attach_runner(runner, rank=2, model_name="m-v", listen=f"127.0.0.1:{port}")
    assert hook.process is not None
    try:
        traffic = Traffic(runner, seed=13)
        rows = 0
        for k in range(6):
            batch, reference, _ = traffic.step(n_verify=2 + k, n_prefill=1)
            runner.sample(None, batch, None)
            rows += len(reference["rid"])
        line = re.compile(r"^dspark_request_steps_total\{([^}]*)\} (\S+)$", re.M)
        deadline, total, labels = time.monotonic() + 60, 0.0, ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    found = line.findall(r.read().decode())
            except OSError:
                found = []
            total = sum(float(v) for _, v in found)
            if total == rows:
                labels = found[0][0]
                break
            time.sleep(0.2)
        assert total == rows
        assert 'engine="vllm"' in labels and 'model_name="m-v"' in labels
        assert 'rank="2"' in labels and 'mode="compact"' in labels
    finally:
        hook.close()
        hook.process.terminate()
        hook.process.wait(30)

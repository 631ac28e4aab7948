"""dspark-obs inside a vLLM DSpark worker: every verify step, by the SGLang hook's rules.

vLLM 0.33.0's GPU model runner samples each step in `GPUModelRunner.sample`; `attach_runner`
wraps that call on one runner (`vllm_plugin` does it for every runner of a process).
After vLLM's own sampling returns, the hook enqueues one device pass (`vllm_pack`) that
packs the step's verification rows into a slot of the same shared-memory ring the SGLang
hook writes, with `engine="vllm"` in its header, and the node's `dspark-obs hook-consumer`
process turns the ring's steps into StepBatches and serves `/metrics`: one packed copy,
nothing waited on, drops counted (`dspark_dropped_steps_total{reason="hook_ring_full"}`),
a failure counted and logged once, never raised into vLLM.

vllm is never imported here: the hook checks the names it reads on the runner, its input
batch and its sampler output against vLLM 0.33.0's, and where one differs it does nothing
and warns once.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np

from . import rendezvous
from . import shared_ring as sr
from .sglang_worker import SGLangHook, _make_ring
from .step_layout import HAS_BUDGET, HAS_CONFIDENCE, StepLayout
from .submit import StepSubmitter
from .vllm_pack import VLLMPacker, VLLMStep

SOURCE = sr.source_name("vllm")
#: `GPUModelRunner.sample`'s parameters in vLLM 0.33.0
SAMPLE_PARAMETERS = ("self", "hidden_states", "input_batch", "grammar_output")
#: what the hook reads, in vLLM 0.33.0: InputBatch fields, SamplerOutput fields, and the
#: runner's attributes (with the manager's, where adaptive verification is on)
BATCH_FIELDS = frozenset(
    {"req_ids", "num_reqs", "idx_mapping", "idx_mapping_np", "num_draft_tokens_per_req",
     "num_computed_tokens_np"}
)  # fmt: skip
SAMPLER_FIELDS = frozenset({"sampled_token_ids", "num_sampled", "num_rejected"})
MANAGER_ATTRIBUTES = ("_confidence_probs", "num_speculative_steps")

__all__ = ["SOURCE", "VLLMHook", "attach_runner", "knows_interface"]


def knows_interface(runner_cls, batch_cls=None, output_cls=None) -> bool:
    """Whether the runner's `sample` (and, where given, the input batch's and the sampler
    output's fields) are vLLM 0.33.0's."""
    method = getattr(runner_cls, "sample", None)
    try:
        names = tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return False
    if names != SAMPLE_PARAMETERS:
        return False
    for cls, wanted in ((batch_cls, BATCH_FIELDS), (output_cls, SAMPLER_FIELDS)):
        if cls is None:
            continue
        fields = getattr(cls, "__dataclass_fields__", None)
        if fields is None or not wanted <= set(fields):
            return False
    return True


class VLLMHook(SGLangHook):
    """The serving-thread side for vLLM: `observe((runner, input_batch, output))` packs the
    step's verification rows into the ring and returns. The ring, the consumer (process or
    inline), the drops and the failure count are the SGLang hook's."""

    def __init__(self, layout: StepLayout, ring: sr.SharedRing, runner, **options) -> None:
        super().__init__(layout, ring, ring.max_bs, **options)
        self.requests = runner.req_states
        self.temperature = runner.sampler.sampling_states.temperature
        manager = runner.adaptive_verification
        self.confidence = None if manager is None else manager._confidence_probs
        self.forward_ct = 0

    def _observe(self, call) -> None:
        _, batch, output = call
        scheduled = batch.num_draft_tokens_per_req
        self.forward_ct += 1
        if scheduled is None:
            return  # no request verifies drafts: a prefill or plain decode step
        # vLLM keeps the verification requests first (sort_batch_req_ids)
        bs = int(np.count_nonzero(scheduled))
        if bs == 0:
            return
        claimed = self._claim(bs)
        if claimed is None:
            return
        ring, seq, slot = claimed
        pool = batch.idx_mapping_np[:bs]
        host = np.empty((bs, 5), dtype=np.float64)
        host[:, 0] = batch.num_computed_tokens_np[:bs]
        host[:, 1] = pool
        temperature = self.temperature.np[pool]
        host[:, 2] = temperature == 0.0
        host[:, 3] = temperature
        host[:, 4] = scheduled[:bs]
        flags = HAS_CONFIDENCE | HAS_BUDGET if self.confidence is not None else 0
        admitted = int(batch.num_draft_tokens)
        verify_tokens = bs + admitted
        meta = (self.forward_ct, bs, admitted, verify_tokens, flags)
        if not ring.write_meta(slot, meta, _rid_bytes(batch.req_ids[:bs])):
            return
        step = VLLMStep(
            bs, slot, batch.idx_mapping, output.num_sampled, output.num_rejected,
            output.sampled_token_ids, self.requests.draft_tokens, self.confidence, host,
        )  # fmt: skip
        if self.submitter is None:
            device = batch.idx_mapping.device
            self.submitter = StepSubmitter(
                self.layout, ring, device, self.pool_slots, triton=self.triton,
                forms=(_triton_form, _torch_form),
            )  # fmt: skip
        self.submitter.submit(step, slot, seq)
        self.seq = seq


def _triton_form(submitter: StepSubmitter):
    """One Triton launch a step (ImportError without Triton: the submitter falls back)."""
    from .vllm_pack_triton import VLLMTritonPacker

    return VLLMTritonPacker(submitter.layout, submitter.device, submitter.ring.slots,
                            submitter.ring.max_bs)  # fmt: skip


def _torch_form(submitter: StepSubmitter) -> VLLMPacker:
    return VLLMPacker(submitter.layout, submitter.device, submitter.ring.slots,
                      submitter.ring.max_bs)  # fmt: skip


def _rid_bytes(ids: list[str]) -> bytes:
    """The ids newline-joined as the ring carries them (the SGLang hook's rule: a newline
    inside an id travels as `\r`, a lone surrogate as its bytes)."""
    joined = "\n".join(ids)
    if joined.count("\n") != max(len(ids) - 1, 0):
        joined = "\n".join(i.replace("\n", "\r") for i in ids)
    return joined.encode("utf-8", "surrogatepass")


def attach_runner(
    runner,
    *,
    rank: int = 0,
    model_name: str = "",
    listen: str | None = "127.0.0.1:9464",
    consumer: str = "process",
    ring_slots: int = 16,
    pipeline=None,
    consumer_args: tuple[str, ...] = (),
) -> VLLMHook | None:
    """Observe every step `runner` (vLLM's `GPUModelRunner`, its KV cache initialised: the
    adaptive verification manager is built there) samples, by wrapping its `sample`; None,
    with one warning,
    where its interface is not vLLM 0.33.0's or it runs no speculative decoding.

    The verify mode is `compact` with adaptive verification (vLLM's global top-k admission
    trims windows) and `static` without (every scheduled draft is verified). `consumer`,
    `listen`, `pipeline` and `consumer_args` are as for the SGLang hook's `attach_observers`.
    """
    gamma = int(getattr(runner, "num_speculative_steps", 0) or 0)
    if not knows_interface(type(runner)) or gamma < 1 or runner.speculator is None:
        warnings.warn(
            "dspark-obs: this vLLM model runner is not one the hook knows (vLLM 0.33.0's "
            "GPUModelRunner with speculative decoding); the hook is not attached",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    manager = runner.adaptive_verification
    if manager is not None and not all(hasattr(manager, a) for a in MANAGER_ATTRIBUTES):
        warnings.warn(
            "dspark-obs: vLLM's AdaptiveVerificationManager is not 0.33.0's; hook not attached",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    port = rendezvous.consumer_port(consumer, listen)
    layout = StepLayout(gamma)
    mode = "static" if manager is None else "compact"
    max_bs = int(runner.req_states.max_num_reqs)
    ring = _make_ring(
        port, slots=ring_slots, max_bs=max_bs, width=layout.width, gamma=gamma,
        entries=layout.entries, rank=rank, engine="vllm", mode=mode, model_name=model_name,
    )  # fmt: skip
    hook = VLLMHook(
        layout, ring, runner, listen=None if port is None else listen,
        consumer_args=consumer_args,
    )  # fmt: skip
    rendezvous.join_consumer(hook, ring, consumer, port, listen, pipeline, gamma)
    method = runner.sample

    def sample(hidden_states, input_batch, grammar_output):
        out = method(hidden_states, input_batch, grammar_output)
        hook.observe((runner, input_batch, out[0]))
        return out

    runner.sample = sample
    return hook

"""dspark-obs inside an SGLang DSpark worker: every verify step, in band, at almost no cost.

SGLang's DSpark worker reports each verify step to its observers
(`DsparkStepObservers.observe_verify_step`) with the tensors the step produced.
`attach(worker)` wraps that call. After SGLang's own observers run, the hook
enqueues one device pass that packs the step (its columns, the log-probabilities
the estimator needs, the tail walk's gathers) and copies it, without waiting,
into a shared-memory ring; a separate `dspark-obs hook-consumer` process turns
the ring's steps into StepBatches, feeds the pipeline and serves `/metrics`. The
serving thread never waits on the GPU and shares no GIL with our work.

sglang is never imported here: the hook checks the observer's keyword signature
against the one it was written for (SGLang 0.5.23) and, where it differs, does
nothing and warns once. A failure inside the hook is counted and logged once; it
never reaches the serving path. A step the consumer has no room for is dropped
whole and counted (`dspark_dropped_steps_total{reason="hook_ring_full"}`).
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess  # nosec B404
import sys
import warnings
from operator import attrgetter
from typing import Any

from ..pipeline import Pipeline, build_pipeline
from . import shared_ring as sr
from .consumer import SOURCE, HookConsumer
from .observed_step import ObservedStep
from .step_layout import StepLayout
from .submit import StepSubmitter

log = logging.getLogger(__name__)

#: Keyword parameters of SGLang 0.5.23's `DsparkStepObservers.observe_verify_step`.
OBSERVER_PARAMETERS = frozenset(
    {
        "forward_ct",
        "reqs",
        "bs",
        "proposal_folded",
        "verify_ids_2d",
        "target_logits",
        "layout",
        "confidence",
        "confidence_raw",
        "prefix_lens",
        "draft_tokens",
        "draft_block",
        "sampling_info",
        "correct_len",
        "cap_trim_lens",
        "bonus",
        "commit_lens",
        "verify_token_budget",
        "req_pool_indices",
        "verify_tier_num_tokens",
        "dp_tier_num_tokens",
    }
)
_RID = attrgetter("rid")
#: Request slots when the worker does not say (its `req_to_token_pool`).
DEFAULT_POOL_SLOTS = 4096

__all__ = ["OBSERVER_PARAMETERS", "SOURCE", "SGLangHook", "attach"]


class SGLangHook:
    """The serving-thread side: `observe` packs a step into the ring and returns.

    `consumer` is the in-process consumer (`drain()` feeds its pipeline) when the
    hook was attached with `consumer="inline"`; `process` the consumer process
    otherwise.
    """

    def __init__(self, layout: StepLayout, ring: sr.SharedRing, pool_slots: int, *,
                 triton: bool | None = None) -> None:  # fmt: skip
        self.gamma = layout.gamma
        self.layout = layout
        self.ring = ring
        self.pool_slots = pool_slots
        self.triton = triton
        self.seq = 0
        self.submitter: StepSubmitter | None = None
        self.consumer: HookConsumer | None = None
        self.process: subprocess.Popen | None = None
        self._warned = False
        self._held: tuple = (None, None, None, None)
        self._rid_bytes = b""

    @property
    def pipeline(self) -> Pipeline | None:
        return None if self.consumer is None else self.consumer.pipeline

    @property
    def failures(self) -> int:
        return int(self.ring.header[sr.H_FAILED])

    def observe(self, kw: dict[str, Any]) -> None:
        try:
            self._observe(kw)
        except Exception as exc:  # the serving path must never see the hook fail
            self.ring.header[sr.H_FAILED] += 1
            if not self._warned:
                self._warned = True
                log.exception("dspark-obs hook: a step failed (%r); further ones are counted", exc)

    def _observe(self, kw: dict[str, Any]) -> None:
        bs = int(kw["bs"])
        if bs <= 0:
            return  # an idle DP rank: nothing verified
        ring = self.ring
        if bs > ring.max_bs:
            ring.header[sr.H_DROPPED_OTHER] += 1
            return
        seq = self.seq + 1
        slot = ring.slot_for(seq)
        if slot is None:
            return
        step = ObservedStep.from_observer(kw)
        flags = (
            (sr.HAS_CONFIDENCE if step.confidence is not None else 0)
            | (sr.HAS_RAW if step.confidence_raw is not None else 0)
            | (sr.HAS_TARGET if step.target_logits is not None else 0)
            | (sr.HAS_BUDGET if step.budget is not None else 0)
            | (sr.GREEDY_DRAFT if step.greedy_draft else 0)
        )
        meta = (step.forward_ct, bs, step.budget or 0, step.verify_tokens, flags)
        if not ring.write_meta(slot, meta, self._rids(kw["reqs"], bs)):
            return
        if self.submitter is None:
            self.submitter = StepSubmitter(
                self.layout, ring, step.draft.device, self.pool_slots, triton=self.triton
            )
        self.submitter.submit(step, slot, seq)
        self.seq = seq

    def _rids(self, reqs, bs: int) -> bytes:
        """The batch's request ids, newline-joined; taken again only when the batch changed.

        SGLang keeps a running batch's `reqs` list from step to step and replaces it
        (filter) or grows it (merge) when requests leave or join, so the same list at the
        same length, with the same first and last request, holds the same requests. The
        list and its end requests are held, so no new object can take their identities.
        """
        n = min(len(reqs), bs)
        first, last = (reqs[0], reqs[n - 1]) if n else (None, None)
        held, shape = self._held, (len(reqs), bs)
        if reqs is not held[0] or shape != held[1] or first is not held[2] or last is not held[3]:
            self._held = (reqs, shape, first, last)
            try:  # SGLang's rids are str; anything else is taken through str()
                joined = "\n".join(map(_RID, reqs[:n]))
            except TypeError:
                joined = "\n".join(map(str, map(_RID, reqs[:n])))
            self._rid_bytes = joined.encode()
        return self._rid_bytes

    def drain(self) -> int:
        """Feed the in-process consumer every step the device has delivered."""
        self._wait_for_device()
        return self.consumer.drain()

    def _wait_for_device(self) -> None:
        """Off the serving path only (drain, close): every copy enqueued so far has landed."""
        if self.submitter is not None and self.submitter.cuda:
            import torch

            torch.cuda.current_stream(self.submitter.device).synchronize()

    def close(self, timeout: float = 10.0) -> None:
        """Stop: the consumer drains what is left and exits; the ring is removed."""
        if self.ring.header is None:
            return
        self._wait_for_device()
        self.ring.header[sr.H_CLOSED] = 1
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self.submitter is not None:
            self.submitter.close()
        self.ring.close()


def _pool_slots(worker) -> int | None:
    pool = getattr(getattr(worker, "model_runner", None), "req_to_token_pool", None)
    table = getattr(pool, "req_to_token", None)
    return None if table is None else int(table.shape[0])


def attach(
    worker,
    *,
    gamma: int,
    mode: str = "compact",
    rank: int = 0,
    listen: str | None = "127.0.0.1:9464",
    consumer: str = "process",
    pool_slots: int | None = None,
    ring_slots: int = 16,
    pipeline: Pipeline | None = None,
    triton: bool | None = None,
) -> SGLangHook | None:
    """Wrap the worker's DSpark observers; None (one warning) where their interface differs.

    `consumer="process"` starts `dspark-obs hook-consumer`, which serves `/metrics` on
    `listen` (None: no endpoint); `"inline"` keeps the consumer in this process, fed by
    `hook.drain()` (tests, notebooks), on `pipeline` or a new one.
    """
    observers = getattr(worker, "_observers", None)
    method = getattr(observers, "observe_verify_step", None)
    params = None
    if method is not None:
        params = {
            n for n, p in inspect.signature(method).parameters.items() if p.kind is p.KEYWORD_ONLY
        }
    if params != OBSERVER_PARAMETERS:
        warnings.warn(
            "dspark-obs: this SGLang worker's DSpark observer interface is not the one the hook "
            "knows (SGLang 0.5.23); the hook is not attached, poll /server_info instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if consumer not in ("process", "inline"):
        raise ValueError(f"consumer must be 'process' or 'inline', not {consumer!r}")
    slots = pool_slots or _pool_slots(worker) or DEFAULT_POOL_SLOTS
    layout = StepLayout(gamma)
    ring = sr.SharedRing(
        slots=ring_slots, max_bs=slots, width=layout.width, gamma=gamma, entries=layout.entries
    )
    hook = SGLangHook(layout, ring, slots, triton=triton)
    if consumer == "inline":
        hook.consumer = HookConsumer(ring, pipeline or build_pipeline(gamma), mode=mode, rank=rank)
    else:
        cmd = [sys.executable, "-m", "dspark_obs", "hook-consumer", "--ring", ring.name,
               "--mode", mode, "--rank", str(rank), "--parent", str(os.getpid())]  # fmt: skip
        if listen is not None:
            cmd += ["--listen", listen]
        hook.process = subprocess.Popen(cmd)  # nosec B603

    def observe_verify_step(**kw):
        method(**kw)
        hook.observe(kw)

    observers.observe_verify_step = observe_verify_step
    return hook

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
import time
import warnings
from operator import attrgetter
from typing import Any

from . import rendezvous
from . import shared_ring as sr
from .observed_step import ObservedStep
from .step_layout import StepLayout, step_flags
from .submit import StepSubmitter

log = logging.getLogger(__name__)

SOURCE = sr.source_name("sglang")
#: Seconds between two looks for a gone consumer, taken only when a step is dropped.
CONSUMER_CHECK_SECONDS = 10.0

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
    hook was attached with `consumer="inline"`; otherwise the node's consumer process
    serving `listen` takes the ring, and `process` is that process where this hook
    started it.
    """

    def __init__(self, layout: StepLayout, ring: sr.SharedRing, pool_slots: int, *,
                 triton: bool | None = None, listen: str | None = None,
                 consumer_args: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.gamma = layout.gamma
        self.layout = layout
        self.ring = ring
        self.pool_slots = pool_slots
        self.triton = triton
        self.listen = listen
        self.port = None if listen is None else int(listen.rpartition(":")[2])
        #: what the node's consumer is started with, by whichever hook starts it
        self.consumer_args = list(consumer_args)
        self.seq = 0
        self.submitter: StepSubmitter | None = None
        self.consumer = None  # hooks.node_consumer.NodeConsumer, inline only
        self.process = None
        self._warned = False
        self._held: tuple = (None, None, None, None)
        self._rid_bytes = b""
        self._next_check = 0.0

    @property
    def pipeline(self):
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
        claimed = self._claim(bs)
        if claimed is None:
            return
        ring, seq, slot = claimed
        step = ObservedStep.from_observer(kw)
        meta = (step.forward_ct, bs, step.budget or 0, step.verify_tokens, step_flags(step))
        if not ring.write_meta(slot, meta, self._rids(kw["reqs"], bs)):
            return
        if self.submitter is None:
            self.submitter = StepSubmitter(
                self.layout, ring, step.draft.device, self.pool_slots, triton=self.triton
            )
        self.submitter.submit(step, slot, seq)
        self.seq = seq

    def _claim(self, bs: int):
        """The ring, the next step's sequence number and its free slot; None where the step
        is dropped: more rows than a slot holds (counted), or no slot free (the consumer
        lags or is gone: looked for)."""
        ring = self.ring
        if bs > ring.max_bs:
            ring.header[sr.H_DROPPED_OTHER] += 1
            return None
        seq = self.seq + 1
        slot = ring.slot_for(seq)
        if slot is None:
            self._look_for_consumer()
            return None
        return ring, seq, slot

    def _look_for_consumer(self) -> None:
        """A step was dropped: the consumer lags, or it is gone. At most once every
        `CONSUMER_CHECK_SECONDS`, see whether one holds the node's lock, and start one if
        none does (one non-blocking lock attempt; starting a process does not wait for it)."""
        if self.port is None or (now := time.monotonic()) < self._next_check:
            return
        self._next_check = now + CONSUMER_CHECK_SECONDS
        if self.process is not None:
            self.process.poll()  # reap the one this hook started, if it ended
        if not rendezvous.consumer_running(self.port):
            log.warning(
                "dspark-obs hook: no consumer serves %s; starting one (dropped steps are counted)",
                self.listen,
            )
            self.process = rendezvous.start_consumer(self.listen, self.consumer_args)

    def _rids(self, reqs, bs: int) -> bytes:
        """The batch's request ids, newline-joined; taken again only when the batch changed.

        A rid's newline travels as `\r` and a lone surrogate as its bytes, so the consumer
        reads one rid a row and its gate cleans (`names.clean`) and counts them.

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
            try:
                data = joined.encode() if joined.count("\n") == max(n - 1, 0) else None
            except UnicodeEncodeError:  # a lone surrogate
                data = None
            if data is None:  # a rid with a newline would split into two rows of the step
                rids = (str(r.rid).replace("\n", "\r") for r in reqs[:n])
                data = "\n".join(rids).encode("utf-8", "surrogatepass")
            self._rid_bytes = data
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
        """Stop: mark the ring closed and, while the node's consumer runs, give it up to
        `timeout` seconds to take the steps still in it; the ring is then removed (the
        consumer keeps its own mapping until it has drained it)."""
        if self.ring.header is None:
            return
        self._wait_for_device()
        self.ring.header[sr.H_CLOSED] = 1
        if self.port is not None:
            deadline = time.monotonic() + timeout
            while (
                int(self.ring.header[sr.H_CONSUMED]) < self.seq
                and time.monotonic() < deadline
                and rendezvous.consumer_running(self.port)
            ):
                time.sleep(0.01)
        if self.submitter is not None:
            self.submitter.close()
        self.ring.close()


def _pool_slots(worker) -> int | None:
    pool = getattr(getattr(worker, "model_runner", None), "req_to_token_pool", None)
    table = getattr(pool, "req_to_token", None)
    return None if table is None else int(table.shape[0])


def knows_interface(observers) -> bool:
    """Whether `observers` has SGLang 0.5.23's `observe_verify_step` keyword interface."""
    method = getattr(observers, "observe_verify_step", None)
    if method is None:
        return False
    try:
        params = inspect.signature(method).parameters.items()
    except (TypeError, ValueError):
        return False
    return {n for n, p in params if p.kind is p.KEYWORD_ONLY} == OBSERVER_PARAMETERS


def attach(worker, *, gamma: int, pool_slots: int | None = None, **options) -> SGLangHook | None:
    """Wrap the worker's DSpark observers; None (one warning) where their interface differs.

    The request slots come from the worker's `req_to_token_pool` when not given; the
    other options are `attach_observers`'.
    """
    observers = getattr(worker, "_observers", None)
    if not knows_interface(observers):
        warnings.warn(
            "dspark-obs: this SGLang worker's DSpark observer interface is not the one the hook "
            "knows (SGLang 0.5.23); the hook is not attached, poll /server_info instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    slots = pool_slots or _pool_slots(worker) or DEFAULT_POOL_SLOTS
    return attach_observers(observers, gamma=gamma, pool_slots=slots, **options)


def attach_observers(
    observers,
    *,
    gamma: int,
    pool_slots: int = DEFAULT_POOL_SLOTS,
    mode: str = "compact",
    rank: int = 0,
    model_name: str = "",
    listen: str | None = "127.0.0.1:9464",
    consumer: str = "process",
    ring_slots: int = 16,
    pipeline=None,
    triton: bool | None = None,
    consumer_args: tuple[str, ...] = (),
) -> SGLangHook:
    """Wrap `observers.observe_verify_step` (SGLang's `DsparkStepObservers`, whose interface
    the caller checked) so that each step also goes to the hook.

    `consumer="process"`: the ring joins the node's consumer process serving `/metrics` on
    `listen` (every rank of a node on one port, under `rank` labels), started here if none
    runs. `"inline"`: the consumer lives in this process, fed by `hook.drain()` (tests,
    notebooks), on `pipeline` or a new one. `consumer_args`: the node consumer's options,
    for the hook that starts it (`sglang_plugin.consumer_args`).
    """
    port = rendezvous.consumer_port(consumer, listen)
    layout = StepLayout(gamma)
    ring = _make_ring(
        port, slots=ring_slots, max_bs=pool_slots, width=layout.width, gamma=gamma,
        entries=layout.entries, rank=rank, mode=mode, model_name=model_name,
    )  # fmt: skip
    hook = SGLangHook(
        layout, ring, pool_slots, triton=triton, listen=None if port is None else listen,
        consumer_args=consumer_args,
    )  # fmt: skip
    rendezvous.join_consumer(hook, ring, consumer, port, listen, pipeline, gamma)
    method = observers.observe_verify_step

    def observe_verify_step(**kw):
        method(**kw)
        hook.observe(kw)

    observers.observe_verify_step = observe_verify_step
    return hook


def _make_ring(port: int | None, **spec) -> sr.SharedRing:
    """This process's ring: named for the node consumer's port (a name the process used
    before gets a suffix), or anonymous for an inline consumer."""
    if port is None:
        return sr.SharedRing(**spec)
    name = rendezvous.ring_name(port)
    for k in range(64):
        try:
            return sr.SharedRing(name if k == 0 else f"{name}.{k}", **spec)
        except FileExistsError:
            continue
    raise FileExistsError(f"every hook ring name of this process for port {port} is taken")

"""The reference DSpark runtime: draft, score, schedule, verify, commit, one step at a time.

State lives in arrays over request slots, and each step is a handful of numpy
operations over the batch with one loop over the gamma block positions (the
drafter is semi-autoregressive, so position j needs draft j-1).

Modes follow SGLang: `static` verifies the whole block; `compact` verifies only
the scheduled window; `cap-accept` verifies the whole block but commits only up
to the window. Acceptance at a position depends only on the positions before
it, so the accept chain is computed over the whole block once and each mode
reads it up to its own verify length: verifying a window and truncating a full
verification give the same tokens, which is the property cap-accept relies on.
A `--shadow cap-accept` twin reads the same chain to the end: the ceiling a
cap-accept server with the same seed would report for that request-step.

A world (`worlds.py`) may plan the budget on the confidence of two steps before, as
SGLang's relay does, and may retract decoding requests and re-admit them later into
another slot, as SGLang does under memory pressure; a retracted request keeps its
state, so its committed stream continues where it stopped.

Besides the closed-loop traffic of `step(level)`, requests can come from
outside (`submit`, then `step_external`): the SGLang-protocol front serves them
over HTTP. The two kinds of admission are not meant to be mixed on one engine.

The engine stays one module (the request types it exchanges with a front are in
`external`): every phase of a step (admission, draft and verify, scheduling, timing,
commit) reads and writes the same per-slot arrays, so cutting the class apart would scatter
one state machine over several files without making any part of it independent.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from ..domain.cost_table import attention_seconds, round_to_tier
from ..telemetry.batch import StepBatch
from .acceptance import accept_probability, leading_run, log_softmax, residual, sample
from .config import RuntimeConfig
from .drafter import BlockDrafter
from .external import (
    MAX_NEW_TOKENS,
    MAX_RID_CHARS,
    MAX_TOKEN_ID,
    RID_WORKLOAD,
    ExternalRequest,
    ExternalStep,
    FinishedRequest,
)
from .hashing import extend, mix, uniform, unit
from .language import EOS_TOKEN, SyntheticTarget
from .scheduler import schedule, topk_schedule
from .traffic import Traffic
from .worlds import World

#: per-slot state a retracted request takes with it and brings back to its new slot
_SLOT_STATE = (
    "salt",
    "workload",
    "greedy",
    "temperature",
    "prefix",
    "prev2",
    "prev1",
    "generated",
    "max_new",
    "shadowed",
    "rid",
    "ignore_eos",
    "verify_ct",
    "prompt_tokens",
)

_TAG_DRAFT = 41
_TAG_ACCEPT = 42
_TAG_BONUS = 43
_TAG_SHADOW = 44
_TAG_LEN = 45
_TAG_EXTERNAL_SALT = 46
_TAG_RETRACT = 47
_TAG_GAP = 48
_DRAW_TAGS = np.array([_TAG_DRAFT, _TAG_ACCEPT], dtype=np.uint64)[:, None, None]


def make_target(config: RuntimeConfig) -> SyntheticTarget:
    if config.target == "torch":
        from .torch_target import TorchTarget

        return TorchTarget(
            config.workloads,
            config.vocab_size,
            config.seed,
            hidden=config.torch_hidden,
            device=config.device,
        )
    return SyntheticTarget(config.workloads, config.vocab_size, config.seed)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class DSparkRuntime:
    #: the world target this class runs (the real world's is `real.runtime.RealRuntime`)
    world_target = "synthetic"
    #: whether token ids are bytes of text (a front then answers with the text they spell)
    byte_vocabulary = False

    def __init__(self, config: RuntimeConfig) -> None:
        config.validate()
        self.config = c = config
        self.world: World = c.world_spec
        if self.world.target != self.world_target:
            raise ValueError(
                f"the {c.world} world runs on its own engine: build it with "
                "runtime.factory.make_runtime"
            )
        self.gamma = c.gamma
        #: steps between the confidences a budget is planned on and the step's own: the
        #: world's relay, or vLLM's one step under the topk scheduler (in any world)
        self.relay_lag = 1 if c.scheduler == "topk" else self.world.lag_steps
        self.traffic = Traffic(
            seed=c.seed,
            mix_weights=c.mix,
            greedy_fraction=c.greedy_fraction,
            temperature=c.temperature,
            prompt_lens=np.array([w.prompt_len for w in c.workloads]),
            vocab_size=c.vocab_size,
        )
        self.sts = (
            np.ones(c.gamma) if c.sts_temperatures is None else np.asarray(c.sts_temperatures)
        )
        self.names = np.array([w.name for w in c.workloads], dtype=object)
        self.workload_names = tuple(self.names.tolist())
        self.seed = np.uint64(c.seed)
        self.timing_rng = np.random.default_rng(c.seed)
        # a spare slot lets every returning request find one other than the slot it left
        cap = max(c.concurrency) + (self.world.retract_rate > 0)
        self.active = np.zeros(cap, dtype=bool)
        self._build_models(c, cap)
        self.salt = np.zeros(cap, dtype=np.uint64)
        self.workload = np.zeros(cap, dtype=np.int64)
        self.greedy = np.zeros(cap, dtype=bool)
        self.temperature = np.ones(cap)
        self.prefix = np.zeros(cap, dtype=np.int64)
        self.prev2 = np.zeros(cap, dtype=np.int64)
        self.prev1 = np.zeros(cap, dtype=np.int64)
        self.generated = np.zeros(cap, dtype=np.int64)
        self.max_new = np.zeros(cap, dtype=np.int64)
        self.shadowed = np.zeros(cap, dtype=bool)
        self.rid = np.full(cap, None, dtype=object)
        self.ignore_eos = np.zeros(cap, dtype=bool)
        self.verify_ct = np.zeros(cap, dtype=np.int64)
        self.prompt_tokens = np.zeros(cap, dtype=np.int64)
        self.outputs: list[list[int]] = [[] for _ in range(cap)]
        # SGLang's req_generation: counts admissions into a slot, so a relayed value can
        # tell whether the request it came from still holds the slot
        self.generation = np.zeros(cap, dtype=np.int64)
        lag = self.relay_lag
        self._relay_confidence = np.ones((lag, cap, c.gamma))
        self._relay_generation = np.full((lag, cap), -1, dtype=np.int64)
        self._conf_buf = np.ones((cap, c.gamma))
        # retracted requests: (step they return at, their slot state), in retraction order
        self.parked: list[tuple[int, dict]] = []
        self.retracted = 0
        # the verify distributions, reused every step: `gather` reads only the last step's
        self._p_all = np.empty((cap, c.gamma + 1, c.vocab_size))
        self._q_all = np.empty((cap, c.gamma, c.vocab_size))
        self._positions = np.arange(c.gamma)
        self._block = np.arange(c.gamma + 1)
        self.pending: deque[ExternalRequest] = deque()
        self.arrived = 0
        self.finished = 0
        self.forward_ct = 0
        self._finished_rows = np.zeros(0, dtype=np.int64)
        self._natural_stop = np.zeros(0, dtype=bool)

    def run(self) -> Iterator[StepBatch]:
        """Every step of the concurrency sweep, in order."""
        for level, steps in zip(self.config.concurrency, self.config.steps_at(), strict=True):
            for _ in range(steps):
                yield self.step(level)

    def run_forever(self) -> Iterator[StepBatch]:
        """The concurrency sweep, repeated until the caller stops iterating."""
        while True:
            yield from self.run()

    def _admit(self, level: int) -> np.ndarray:
        """Fill free slots up to `level` requests from the traffic; the slots filled."""
        free = np.flatnonzero(~self.active)
        n = min(level - int(self.active.sum()) - len(self.parked), len(free))
        if n <= 0:
            return free[:0]
        slots = free[:n]
        new = self.traffic.arrivals(self.arrived, n)
        self.arrived += n
        self.active[slots] = True
        self.generation[slots] += 1
        self.salt[slots] = new.salt
        self.workload[slots] = new.workload
        self.greedy[slots] = new.greedy
        self.temperature[slots] = new.temperature
        self.prefix[slots] = new.prompt_len
        self.prev2[slots] = new.prev2
        self.prev1[slots] = new.prev1
        self.generated[slots] = 0
        cap = self.config.max_new_tokens
        self.max_new[slots] = np.maximum(
            1, (cap * uniform(new.salt, _TAG_LEN)).astype(np.int64) + 1
        )
        self.max_new[slots] = np.minimum(self.max_new[slots], cap)
        self.shadowed[slots] = uniform(new.salt, _TAG_SHADOW) < self.config.shadow_fraction
        names = self.names[new.workload]
        self.rid[slots] = [f"{w}-{i}" for w, i in zip(names, new.index.tolist(), strict=True)]
        return slots

    def _block_uniforms(self, block: np.ndarray) -> np.ndarray:
        """`[2, rows, gamma]`: the keyed uniforms that draw each drafted token (sampled rows)
        and decide its acceptance, from the block's hash prefix."""
        return unit(extend(block[:, None], self._positions, _DRAW_TAGS))

    def _build_models(self, c: RuntimeConfig, slots: int) -> None:
        """The target and drafter this world's blocks come from (the real world overrides it
        with its trained networks, so the synthetic ones are never built there)."""
        self.target = make_target(c)
        self.measured = getattr(self.target, "measured", False)
        self.drafter = BlockDrafter(
            c.drafter,
            c.gamma,
            c.vocab_size,
            c.seed ^ 0x5EED,
            self.world,
            np.array([w.draft_fidelity for w in c.workloads]),
        )

    def _draft_and_verify(self, slots, salt, wl, prefix, prev2, prev1, greedy, temp, block):
        """Draft one block per row, score it, and run the full accept chain against the target.

        The draws that depend only on the request and block position (`block`
        is their shared hash prefix) are made for the whole block up front, and
        sampling work is done for the sampled rows only, greedy rows taking the
        argmax: per position, what remains is the `[rows, vocab]` work that
        needs the previous draft.
        """
        b, g = len(salt), self.gamma
        rows = np.arange(b)
        sampled = np.flatnonzero(~greedy)
        u_draft, u_accept = self._block_uniforms(block)
        draft_keys = self.drafter.block_keys(salt, prefix, prev1)
        fidelity = self.drafter.fidelity_factor(salt, wl)
        # [g + 1, b]: row j is position j of every block, contiguous for the per-position hashes
        pos_keys = self.target.position_keys(salt, prefix + self._block[:, None])
        draft = np.empty((b, g), dtype=np.int64)
        q_lp = np.empty((b, g))
        p_lp = np.empty((b, g))
        accepted = np.empty((b, g), dtype=bool)
        accept_prob = np.empty((b, g))
        p_all = self._p_all[:b]
        q_all = self._q_all[:b]
        ctx = np.empty((2, b, g + 1), dtype=np.int64)
        c2, c1, prev_draft = prev2, prev1, prev1
        for j in range(g):
            ctx[:, :, j] = c2, c1
            lt = self.target.logits_at(pos_keys[j], c2, c1, wl)
            ld = self.drafter.logits(lt, draft_keys[:, j], prev_draft, j, fidelity)
            lp, lq = log_softmax(lt, temp), log_softmax(ld, temp)
            p, q = np.exp(lp, out=p_all[:, j]), np.exp(lq, out=q_all[:, j])
            d = ld.argmax(axis=1)
            d[sampled] = sample(q[sampled], u_draft[sampled, j])
            draft[:, j] = d
            q_lp[:, j], p_lp[:, j] = lq[rows, d], lp[rows, d]
            ap = accept_probability(p_lp[:, j], q_lp[:, j])
            accepted[:, j] = np.where(greedy, d == lt.argmax(axis=1), u_accept[:, j] < ap)
            accept_prob[:, j] = np.where(greedy, self.drafter.greedy_accept_signal(p[rows, d]), ap)
            c2, c1, prev_draft = c1, d, d
        ctx[:, :, g] = c2, c1
        lt = self.target.logits_at(pos_keys[g], c2, c1, wl)
        np.exp(log_softmax(lt, temp), out=p_all[:, g])
        if self.world.confidence == "draft-probability":
            conf_logits = self.drafter.draft_probability_logits(q_lp)
        else:
            conf_logits = self.drafter.confidence_logits(accept_prob, salt, prefix)
        return draft, q_lp, p_lp, accepted, conf_logits, p_all, q_all, (pos_keys.T, *ctx)

    def step(self, level: int) -> StepBatch:
        self._retract()
        self._readmit()
        self._admit(level)
        return self._advance()

    def _retract(self) -> None:
        """Take some decoding requests out of the batch, each for a keyed gap of steps.

        SGLang retracts decoding requests when KV memory runs short and re-admits them
        later; which ones, and for how long, is keyed on (request, prefix) here, so every
        verify mode retracts the same requests at the same points of their streams.
        """
        rate = self.world.retract_rate
        if rate == 0.0:
            return
        slots = np.flatnonzero(self.active & (self.generated > 0))
        salt, prefix = self.salt[slots], self.prefix[slots]
        out = slots[uniform(self.seed, salt, prefix, _TAG_RETRACT) < rate]
        if len(out) == 0:
            return
        draw = uniform(self.seed, self.salt[out], self.prefix[out], _TAG_GAP)
        gaps = 1 + (self.world.max_gap_steps * draw).astype(np.int64)
        for s, gap in zip(out.tolist(), gaps.tolist(), strict=True):
            state = {name: getattr(self, name)[s] for name in _SLOT_STATE}
            state["slot"], state["outputs"] = s, self.outputs[s]
            self.parked.append((self.forward_ct + gap, state))
            self.outputs[s] = []
        self.active[out] = False
        self.retracted += len(out)

    def _readmit(self) -> None:
        """Bring back the retracted requests whose gap is over, each into a free slot other
        than the one it left (the lowest such); one with none free waits a step."""
        waiting = []
        for due, state in self.parked:
            free = np.flatnonzero(~self.active) if due <= self.forward_ct else []
            free = free[free != state["slot"]] if len(free) else free
            if len(free) == 0:
                waiting.append((due, state))
                continue
            s = int(free[0])
            for name in _SLOT_STATE:
                getattr(self, name)[s] = state[name]
            self.outputs[s] = state["outputs"]
            self.active[s] = True
            self.generation[s] += 1
        self.parked = waiting

    def external_request(
        self,
        rid: str,
        *,
        input_ids: Sequence[int] | None = None,
        text: str | None = None,
        temperature: float = 1.0,
        max_new_tokens: int = 128,
        workload: str | None = None,
        ignore_eos: bool = False,
    ) -> ExternalRequest:
        """Reduce an SGLang-style request to engine terms, or raise ValueError.

        The request's randomness is keyed by (seed, prompt), not by rid or
        arrival order, so one prompt gives one token stream whatever the
        traffic around it; text prompts count as their UTF-8 bytes.
        """
        if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_RID_CHARS:
            raise ValueError(f"rid must be a string of 1..{MAX_RID_CHARS} characters")
        if (input_ids is None) == (text is None):
            raise ValueError("give exactly one of text or input_ids")
        if text is not None:
            if not isinstance(text, str):
                raise ValueError("text must be a string")
            ids = list(text.encode())
        else:
            if not isinstance(input_ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
                for t in input_ids
            ):
                raise ValueError("input_ids must be a list of integers in 0..2**63-1")
            ids = list(input_ids)
        if not ids:
            raise ValueError("the prompt is empty")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError("temperature must be a number")
        if not (np.isfinite(temperature) and temperature >= 0):
            raise ValueError("temperature must be >= 0")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ValueError("max_new_tokens must be an integer")
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens {max_new_tokens} outside 1..{MAX_NEW_TOKENS}")
        if workload is None:
            m = RID_WORKLOAD.match(rid)
            name = m["workload"] if m and m["workload"] in self.workload_names else None
            index = 0 if name is None else self.workload_names.index(name)
        elif workload in self.workload_names:
            index = self.workload_names.index(workload)
        else:
            raise ValueError(f"unknown workload {workload!r}; configured: {self.workload_names}")
        digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8)
        key = np.uint64(int.from_bytes(digest.digest(), "little"))
        vocab = self.config.vocab_size - 1
        greedy = temperature <= 1e-5
        return ExternalRequest(
            rid=rid,
            salt=int(mix(self.seed, key, _TAG_EXTERNAL_SALT)),
            workload=index,
            greedy=greedy,
            temperature=1.0 if greedy else float(temperature),
            max_new_tokens=max_new_tokens,
            ignore_eos=bool(ignore_eos),
            prompt_len=max(2, len(ids)),
            prev2=1 + ids[-2] % vocab if len(ids) > 1 else 1,
            prev1=1 + ids[-1] % vocab,
        )

    def submit(self, rid: str, **request) -> ExternalRequest:
        """Queue an external request; it joins the batch when `step_external` finds a free slot."""
        req = self.external_request(rid, **request)
        self.pending.append(req)
        return req

    def abort_external(self, rids: set[str]) -> int:
        """Stop requests nobody waits for any more; how many were queued or running.

        A queued one is dropped; a running one ends at its next step as if it had
        reached `max_new_tokens` (its slot is freed the usual way, its output unread).
        """
        queued = len(self.pending)
        self.pending = deque(r for r in self.pending if r.rid not in rids)
        slots = [s for s in np.flatnonzero(self.active).tolist() if self.rid[s] in rids]
        self.max_new[slots] = np.maximum(self.generated[slots], 1)
        self.ignore_eos[slots] = False
        return queued - len(self.pending) + len(slots)

    @property
    def has_external_work(self) -> bool:
        return bool(self.pending) or bool(self.active.any()) or bool(self.parked)

    def _admit_external(self) -> tuple[np.ndarray, list[ExternalRequest]]:
        """Queued requests into free slots: the slots filled and the requests, in order."""
        free = np.flatnonzero(~self.active)
        n = min(len(free), len(self.pending))
        if n <= 0:
            return free[:0], []
        slots = free[:n]
        new = [self.pending.popleft() for _ in range(n)]

        def col(name, dtype):
            return np.array([getattr(r, name) for r in new], dtype=dtype)

        salt = col("salt", np.uint64)
        self.active[slots] = True
        self.generation[slots] += 1
        self.salt[slots] = salt
        self.workload[slots] = col("workload", np.int64)
        self.greedy[slots] = col("greedy", bool)
        self.temperature[slots] = col("temperature", np.float64)
        self.prefix[slots] = self.prompt_tokens[slots] = col("prompt_len", np.int64)
        self.prev2[slots] = col("prev2", np.int64)
        self.prev1[slots] = col("prev1", np.int64)
        self.generated[slots] = 0
        self.max_new[slots] = col("max_new_tokens", np.int64)
        self.ignore_eos[slots] = col("ignore_eos", bool)
        self.verify_ct[slots] = 0
        self.shadowed[slots] = uniform(salt, _TAG_SHADOW) < self.config.shadow_fraction
        self.rid[slots] = col("rid", object)
        for s in slots.tolist():
            self.outputs[s] = []
        self.arrived += n
        return slots, new

    def step_external(self) -> ExternalStep | None:
        """One step over externally submitted requests only (None when there are none).

        Output is cut the way SGLang cuts it: at the first EOS (kept) unless
        `ignore_eos`, and at `max_new_tokens`, although the step itself may
        have committed a few tokens past either.
        """
        self._retract()
        self._readmit()
        self._admit_external()
        slots = np.flatnonzero(self.active)
        if len(slots) == 0:
            return None
        batch = self._advance()
        self.verify_ct[slots] += 1
        a = batch.correct_drafts
        rows = np.arange(len(slots))
        committed = np.concatenate([batch.draft_tokens, np.zeros((len(slots), 1), np.int64)], 1)
        committed[rows, a] = batch.bonus_token
        for s, toks, n in zip(slots.tolist(), committed.tolist(), (a + 1).tolist(), strict=True):
            self.outputs[s].extend(toks[:n])
        finished = []
        for s in slots[~self.active[slots]].tolist():
            out = self.outputs[s]
            cap = int(self.max_new[s])
            eos = -1 if self.ignore_eos[s] or EOS_TOKEN not in out else out.index(EOS_TOKEN)
            if 0 <= eos < cap:
                out, reason = out[: eos + 1], {"type": "stop", "matched": EOS_TOKEN}
            else:
                out, reason = out[:cap], {"type": "length", "length": cap}
            finished.append(
                FinishedRequest(
                    rid=str(self.rid[s]),
                    output_ids=out,
                    finish_reason=reason,
                    prompt_tokens=int(self.prompt_tokens[s]),
                    verify_ct=int(self.verify_ct[s]),
                )
            )
            self.outputs[s] = []
        return ExternalStep(batch, finished)

    def _advance(self) -> StepBatch:
        """Draft, verify and commit over the requests now active."""
        c, g = self.config, self.gamma
        slots = np.flatnonzero(self.active)
        b = len(slots)
        rows = np.arange(b)
        salt, wl, prefix = self.salt[slots], self.workload[slots], self.prefix[slots]
        greedy, temp = self.greedy[slots], self.temperature[slots]
        start = time.perf_counter()
        block = mix(self.seed, salt, prefix)
        draft, q_lp, p_lp, acc, conf_logits, p_all, q_all, ctx = self._draft_and_verify(
            slots, salt, wl, prefix, self.prev2[slots], self.prev1[slots], greedy, temp, block
        )
        self._verified = p_all
        confidence = _sigmoid(conf_logits / self.sts[None, :])
        survival = np.cumprod(confidence, axis=1)
        budget_survival = self._relay(slots, confidence)

        if c.mode == "static":
            windows = np.full(b, g, dtype=np.int64)
            budget = predicted = theta = None
        else:
            plan = (
                topk_schedule(survival, c.cost_table, budget_survival)
                if c.scheduler == "topk"
                else schedule(survival, c.cost_table, budget_survival, c.budget_scale)
            )
            windows = plan.windows
            budget, predicted, theta = plan.budget, plan.predicted_seconds * 1e3, plan.objective
        chain = leading_run(acc)
        accepted = np.minimum(chain, windows)
        # the bonus: the target's argmax for greedy rows; sampled rows draw it from the target,
        # or from the residual where a draft inside the window was rejected
        target_at = p_all[rows, accepted]
        bonus = target_at.argmax(axis=1)
        sampled = np.flatnonzero(~greedy)
        bonus_dist = target_at[sampled]
        redraw = np.flatnonzero(accepted[sampled] < windows[sampled])
        if len(redraw):
            at = sampled[redraw]
            bonus_dist[redraw] = residual(bonus_dist[redraw], q_all[at, accepted[at]])
        bonus[sampled] = sample(bonus_dist, unit(extend(block[sampled], _TAG_BONUS)))
        bonus_logprob = np.log(p_all[rows, accepted, bonus])

        verify_full = c.mode != "compact"
        verified = np.full(b, g) if verify_full else windows
        target_lp = np.where(np.arange(g)[None, :] < verified[:, None], p_lp, np.nan)
        cap_trim = chain - accepted if c.mode == "cap-accept" else np.zeros(b, dtype=np.int64)
        shadow = np.where(self.shadowed[slots], chain, -1) if c.shadow else np.full(b, -1)

        batch = StepBatch(
            forward_ct=self.forward_ct,
            gamma=g,
            mode=c.mode,
            rank=0,
            bs=b,
            budget=budget,
            lag_steps=self.relay_lag,
            num_running_reqs=b,
            predicted_step_ms=predicted,
            predicted_theta=theta,
            rid=self.rid[slots].copy(),
            workload=self.names[wl],
            workload_codes=wl.copy(),
            workload_names=self.workload_names,
            req_pool_index=slots.astype(np.int64),
            prefix_len=prefix.copy(),
            verify_len=windows + 1,
            correct_drafts=accepted,
            acc_len=accepted + 1,
            cap_trim=cap_trim,
            bonus_token=bonus,
            greedy=greedy.astype(np.int8),
            temperature=np.where(greedy, 0.0, temp),
            shadow_ceiling=shadow.astype(np.int64),
            bonus_logprob=bonus_logprob,
            draft_tokens=draft,
            confidence=confidence,
            survival=survival,
            confidence_logits=conf_logits,
            draft_logprobs=q_lp,
            target_logprobs=target_lp,
        )
        draft_seconds = time.perf_counter() - start
        self._time(batch, ctx, verified, draft_seconds, start)
        self._commit(slots, draft, accepted, bonus)
        self.forward_ct += 1
        return batch

    def _relay(self, slots: np.ndarray, confidence: np.ndarray) -> np.ndarray | None:
        """The survivals the budget is planned on under a relay lag (None: no lag).

        As SGLang's relay: each step the per-slot confidence buffer is snapshotted with
        the slots' generations, and a step reads the snapshot of `lag` steps before; a row
        whose slot has changed hands since (or that was not there) plans on survival 1.
        """
        lag = self.relay_lag
        if lag == 0:
            return None
        ring = self.forward_ct % lag
        lagged = self._relay_confidence[ring, slots]
        fresh = self._relay_generation[ring, slots] == self.generation[slots]
        self._conf_buf[slots] = confidence
        self._relay_confidence[ring] = self._conf_buf
        self._relay_generation[ring] = self.generation
        return np.where(fresh[:, None], np.cumprod(lagged, axis=1), 1.0)

    def gather_target_logprobs(
        self, rows: np.ndarray, positions: np.ndarray, tokens: np.ndarray
    ) -> np.ndarray:
        """Target log-probabilities of `tokens` at block positions of the last step's rows.

        What an in-band estimator gathers from the verify logits in SGLang; here
        the exact distributions of the last verified step (at each request's
        temperature). Positions beyond a compact window were not verified and
        must not be asked for.
        """
        return np.log(self._verified[rows, positions, tokens])

    def last_distributions(self) -> tuple[np.ndarray, np.ndarray]:
        """The last step's target `[rows, gamma + 1, vocab]` and draft `[rows, gamma, vocab]`
        probabilities at each request's temperature (views, overwritten by the next step):
        what a verify forward's logits and a drafter's corrected logits hold in SGLang."""
        return self._verified, self._q_all[: len(self._verified)]

    def finished_in_last_step(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the last step whose request finished in it, and whether each stopped
        naturally (SGLang's FINISH_MATCHED_TOKEN: an EOS within max_new_tokens) rather
        than at the length cap."""
        return self._finished_rows, self._natural_stop

    def _time(self, batch, ctx, verified, draft_seconds, start) -> None:
        """Step timings: measured where the engine times its verify forward (a torch target,
        the real world on a named device), else the cost table (plus the context's attention,
        `cost_table.attention_seconds`) with noise.

        Either way the verify size is the packed tokens (anchor plus window per
        request) rounded up to the captured tier.
        """
        c = self.config
        bs = len(verified)
        tokens = bs + int(verified.sum())
        tier = round_to_tier(tokens, c.capture_tiers)
        batch.verify_tokens_local = tokens
        batch.num_verify_tokens = tier
        batch.verify_tokens_graph_key = tier
        table = c.cost_table
        if self.measured:
            draft_seconds, verify_s = self._measured_seconds(ctx, verified, tier, draft_seconds)
            batch.draft_gpu_ms = draft_seconds * 1e3
            batch.target_verify_gpu_ms = verify_s * 1e3
            batch.step_gpu_ms = (draft_seconds + verify_s) * 1e3
            batch.step_cpu_ms = (time.perf_counter() - start) * 1e3
            return
        n = np.exp(c.step_noise * self.timing_rng.standard_normal(3))
        attn = attention_seconds(c.context_cost, batch.prefix_len, verified + 1)
        gpu_s = (table.bias_seconds + table.alpha(bs) + table.theta(tier) + attn) * n[2]
        batch.draft_gpu_ms = table.alpha(bs) * n[0] * 1e3
        batch.target_verify_gpu_ms = (table.theta(tier) + attn) * n[1] * 1e3
        batch.step_gpu_ms = gpu_s * 1e3
        batch.step_cpu_ms = gpu_s * 1e3 + 0.05

    def _measured_seconds(self, ctx, verified: np.ndarray, tier: int, draft_seconds: float):
        """`(draft, verify)` seconds of a measured step: the step's work until its batch was
        built, and a verify forward over each row's anchor and verified drafts."""
        keep = self._block[None, :] <= verified[:, None]
        verify = self.target.timed_verify(ctx[0][keep], ctx[1][keep], ctx[2][keep], tier)
        return draft_seconds, verify

    def _commit(self, slots, draft, accepted, bonus) -> None:
        b, g = draft.shape
        rows = np.arange(b)
        committed = np.concatenate([draft, np.zeros((b, 1), dtype=np.int64)], axis=1)
        committed[rows, accepted] = bonus
        valid = np.arange(g + 1)[None, :] <= accepted[:, None]
        hit = (committed == EOS_TOKEN) & valid & ~self.ignore_eos[slots][:, None]
        eos = hit.any(axis=1)
        natural = eos & (self.generated[slots] + hit.argmax(axis=1) < self.max_new[slots])
        last2 = np.where(accepted >= 1, draft[rows, np.maximum(accepted - 1, 0)], self.prev1[slots])
        self.prev2[slots] = last2
        self.prev1[slots] = bonus
        self.prefix[slots] += accepted + 1
        self.generated[slots] += accepted + 1
        done = eos | (self.generated[slots] >= self.max_new[slots])
        self.active[slots[done]] = False
        self._finished_rows, self._natural_stop = np.flatnonzero(done), natural[done]
        self.finished += int(done.sum())


def committed_tokens(batch: StepBatch) -> list[list[int]]:
    """Tokens each request committed in a step (accepted drafts, then the bonus)."""
    a = batch.correct_drafts
    return [
        [*batch.draft_tokens[i, : a[i]].tolist(), int(batch.bonus_token[i])]
        for i in range(batch.num_reqs)
    ]

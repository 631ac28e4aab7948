"""The reference runtime in the real world: real text, the trained networks, the same engine.

Everything the engine does around a step stays as it is (traffic, the SPS scheduler, the
modes reading one accept chain, the bonus token, the lockstep shadow, timing, commit);
what changes is where a block comes from. A closed-loop request's prompt is cut from its
workload's committed held-out sample at an offset keyed by the request's salt, so every
mode and every run with one seed reads the same prompts; an external request's prompt is
its bytes. The prompt but its last byte is prefilled into the request's slot; each step
the trained drafter proposes the block from the target's hidden state, the trained head
scores it, and one target forward over the anchor and the whole block gives the full accept
chain (`session.RealSession`), which every mode reads up to its own verify length. Nothing
loops over a step's requests: each network runs once per step over all of them.

The world keeps retraction and the confidence relay off: a request keeps its slot and its
KV cache row for life, and the budget is planned on the step's own confidence.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..acceptance import accept_probability, log_softmax
from ..config import RuntimeConfig
from ..engine import DSparkRuntime
from ..external import ExternalRequest
from .corpus import committed_heldout
from .model import EOT, VOCAB
from .session import RealSession
from .timed_verify import timed_verify
from .weights import DEFAULT_WEIGHTS, RealModels, load


def load_models(config: RuntimeConfig) -> RealModels:
    """The networks `config` names on its device (CPU when none), or ValueError saying why not."""
    path = Path(config.real_weights) if config.real_weights else DEFAULT_WEIGHTS
    if not path.is_file():
        raise ValueError(f"{path}: no such weights file (the real world's trained networks)")
    try:
        device = torch.device(config.device or "cpu")
    except RuntimeError as exc:
        raise ValueError(f"device {config.device!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {config.device!r}: no CUDA device is available")
    if device.type == "cpu":
        # one thread: torch's pool spins while it waits, and against other processes on a
        # 2-core host a run with two threads took 9 times as long as with one
        torch.set_num_threads(1)
    # float32 on a CPU, float64 elsewhere: how each keeps a row's numbers batch-invariant
    # (model.py)
    dtype = torch.float32 if device.type == "cpu" else torch.float64
    models = load(path, device=device, dtype=dtype)
    if models.config.gamma != config.gamma:
        raise ValueError(
            f"{path}: the drafter proposes {models.config.gamma} tokens, the run asks for "
            f"gamma {config.gamma}"
        )
    return models


def _rows_log_softmax(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis of `[rows, positions, vocab]` at each row's temperature."""
    rows, positions, vocab = logits.shape
    flat = log_softmax(logits.reshape(-1, vocab), np.repeat(temperature, positions))
    return flat.reshape(rows, positions, vocab)


def prompt_at(text: bytes, salt: int, length: int) -> bytes:
    """`length` bytes of `text` (at least 2, at most all of it) from an offset keyed by `salt`."""
    length = min(max(2, length), len(text))
    return text[salt % (len(text) - length + 1) :][:length]


class RealRuntime(DSparkRuntime):
    world_target = "real"
    byte_vocabulary = True

    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__(config)
        self._texts = [committed_heldout(w.name) for w in config.workloads]

    def _build_models(self, c: RuntimeConfig, slots: int) -> None:
        self.session = RealSession(load_models(c), slots)
        self.measured = c.timing == "measured"
        if self.measured:
            self._warm_up()

    def _warm_up(self) -> None:
        """One throwaway draft and timed verify in slot 0 before the first step (admission
        prefills the slot afresh). A device loads its kernels and builds its library handles
        on first use: the first step of an H200 run took 67 ms against 9 ms for the next
        ones, a start-up cost that a server pays in its own warm-up, not a step's."""
        session, slot, g = self.session, np.zeros(1, dtype=np.int64), self.gamma
        session.prefill(slot, [b"warm-up"])
        drafted = session.draft(slot, np.ones(1), np.full((1, g), 0.5))
        anchored = np.concatenate([session.last[slot][:, None], drafted.tokens], axis=1)
        timed_verify(session, slot, session.lengths(slot), anchored, np.full(1, g), g + 1)

    def _start(self, slots: np.ndarray, prompts: list[bytes]) -> None:
        """Set the slots' context to their prompts and prefill their cache rows."""
        if len(slots) == 0:
            return
        self.prefix[slots] = [len(p) for p in prompts]
        self.prev2[slots] = [p[-2] for p in prompts]
        self.prev1[slots] = [p[-1] for p in prompts]
        self.session.prefill(slots, prompts)

    def _admit(self, level: int) -> np.ndarray:
        slots = super()._admit(level)
        prompts = [
            prompt_at(self._texts[w], int(s), int(n))
            for w, s, n in zip(
                self.workload[slots].tolist(),
                self.salt[slots].tolist(),
                self.prefix[slots].tolist(),
                strict=True,
            )
        ]
        self._start(slots, prompts)
        return slots

    def _admit_external(self) -> tuple[np.ndarray, list[ExternalRequest]]:
        slots, new = super()._admit_external()
        self._start(slots, [r.prompt for r in new])
        return slots, new

    def external_request(self, rid: str, **request) -> ExternalRequest:
        """As the engine's, with the prompt's bytes kept: token ids are bytes here, and a
        one-byte prompt is read after an end of text, as a document's first byte is."""
        req = super().external_request(rid, **request)
        text, ids = request.get("text"), request.get("input_ids")
        prompt = text.encode() if text is not None else ids
        if text is None and max(ids) >= VOCAB:
            raise ValueError(f"input_ids are bytes in the real world: each within 0..{VOCAB - 1}")
        prompt = bytes(prompt) if len(prompt) > 1 else bytes([EOT, *prompt])
        return replace(
            req, prompt=prompt, prompt_len=len(prompt), prev2=prompt[-2], prev1=prompt[-1]
        )

    def _draft_and_verify(self, slots, salt, wl, prefix, prev2, prev1, greedy, temp, block):
        """Draft (greedy rows: argmax; sampled: the keyed uniforms), score, and verify the
        whole block: greedy rows accept a draft iff it is the target's argmax, sampled rows
        where `u_accept < min(1, p / q)`, both at the row's temperature (greedy: 1)."""
        b, g = len(slots), self.gamma
        u_draft, u_accept = self._block_uniforms(block)
        session = self.session
        began = time.perf_counter()
        # numpy out: the draft's device work is done when it returns
        drafted = session.draft(slots, np.where(greedy, 0.0, temp), u_draft)
        draft_seconds = time.perf_counter() - began
        draft = drafted.tokens
        start = session.lengths(slots) if self.measured else None
        anchored = np.concatenate([session.last[slots][:, None], draft], axis=1)
        timed = (draft_seconds, slots, start, anchored)
        lt = session.verify(slots, draft, np.full(b, g))
        lp = _rows_log_softmax(lt, temp)
        # the draft's rounded log-probabilities, normalised again
        lq = _rows_log_softmax(drafted.logprobs, np.ones(b))
        p_all, q_all = np.exp(lp, out=self._p_all[:b]), np.exp(lq, out=self._q_all[:b])
        pick = draft[:, :, None]
        q_lp = np.take_along_axis(lq, pick, axis=2)[:, :, 0]
        p_lp = np.take_along_axis(lp[:, :g], pick, axis=2)[:, :, 0]
        hit = draft == lt[:, :g].argmax(axis=2)
        accepted = np.where(greedy[:, None], hit, u_accept < accept_probability(p_lp, q_lp))
        return draft, q_lp, p_lp, accepted, drafted.confidence_logits, p_all, q_all, timed

    def _measured_seconds(self, ctx, verified: np.ndarray, tier: int, draft_seconds: float):
        """The drafter's and confidence head's forwards as timed, and a verify forward over
        each row's verified window, packed to the step's tier (`timed_verify`)."""
        return ctx[0], timed_verify(self.session, *ctx[1:], verified, tier)

    def _commit(self, slots, draft, accepted, bonus) -> None:
        """Commit, and free the caches of the requests that finished at once: a slot's next
        request may come steps later, or (a server's) never."""
        super()._commit(slots, draft, accepted, bonus)
        self.session.commit(slots, accepted, bonus)
        self.session.release(slots[self._finished_rows])

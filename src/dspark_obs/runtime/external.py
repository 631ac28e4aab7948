"""Requests from outside the closed-loop traffic, in the terms the engine and a front share.

A front that serves requests (the SGLang-protocol server) hands the engine
`ExternalRequest`s and gets back `FinishedRequest`s in SGLang's shape with each
`ExternalStep`; these types live apart from the step loop so that a front can name what it
exchanges with the engine without depending on how a step is computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..telemetry.batch import StepBatch

#: The workload of an external request named like SGLang benchmark rids (`gsm8k-17`).
RID_WORKLOAD = re.compile(r"^(?P<workload>[^-]+)-")
#: Most tokens one request may ask for: past any model's context, and small enough that
#: counts stay exact in every array (a request for 2**64 tokens overflowed a rank's step).
MAX_NEW_TOKENS = 1 << 16
#: Longest rid accepted (SGLang's are uuid hex, 32 characters).
MAX_RID_CHARS = 256
#: Token ids are int64 in every array.
MAX_TOKEN_ID = 2**63 - 1


@dataclass(frozen=True)
class ExternalRequest:
    """A request admitted from outside, already reduced to the engine's terms."""

    rid: str
    salt: int
    workload: int
    greedy: bool
    temperature: float
    max_new_tokens: int
    ignore_eos: bool
    prompt_len: int
    prev2: int
    prev1: int
    #: the prompt itself, where the engine reads it (the real world's bytes)
    prompt: bytes = b""


@dataclass(frozen=True)
class FinishedRequest:
    rid: str
    output_ids: list[int]
    #: SGLang's shape: `{"type": "stop", "matched": EOS}` or `{"type": "length", "length": n}`
    finish_reason: dict
    prompt_tokens: int
    #: verify steps the request took part in (SGLang's `spec_verify_ct`)
    verify_ct: int


@dataclass(frozen=True)
class ExternalStep:
    batch: StepBatch
    finished: list[FinishedRequest]

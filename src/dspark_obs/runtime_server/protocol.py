"""SGLang's `/generate` request body, read the way SGLang reads it, and the errors it earns.

The front accepts what a real SGLang server accepts (one prompt or a batch, text or token
ids, one value or one per prompt) and refuses the rest with an HTTP status; that reading,
and the stand-in tokenizer that spells the answers, are kept here, apart from the threads
and sockets, so they can be checked without a server.
"""

from __future__ import annotations

import re
import uuid
from http import HTTPStatus

from .. import names
from ..runtime.language import EOS_TOKEN

#: SGLang's default when `sampling_params` gives none.
DEFAULT_MAX_NEW_TOKENS = 128
#: Prompts in one `/generate` body. A batch is validated, queued and waited on as one, so
#: its size bounds the work one request (and one client that hangs up) can start.
MAX_BATCH = 256
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'-()\n"


#: A backslash escape in JSON text: `\uXXXX` (its four hex digits grouped) or any other, so
#: that an escaped backslash (`\\u...`) is never read as the start of a `\u` escape.
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def lone_surrogate(raw: bytes) -> tuple[int, str] | None:
    """The first `\ud800`..`\udfff` escape of `raw` that is not half of a surrogate pair:
    its byte offset and text; None where there is none.

    No encoder takes such a string, and msgspec refuses a lone high one by saying the input
    "was truncated", which sends a client looking for a framing fault."""
    pending: re.Match | None = None  # a high surrogate awaiting its low half
    for m in _ESCAPE.finditer(raw):
        code = int(m.group(1), 16) if m.group(1) else -1
        low = 0xDC00 <= code <= 0xDFFF
        if pending is not None:
            if low and m.start() == pending.end():
                pending = None
                continue
            break
        if 0xD800 <= code <= 0xDBFF:
            pending = m
        elif low:
            return m.start(), m.group().decode("ascii")
    if pending is not None:
        return pending.start(), pending.group().decode("ascii")
    return None


def invalid_json(raw: bytes, exc: ValueError) -> str:
    """What is wrong with a body that is not JSON, in words a client can act on."""
    lone = lone_surrogate(raw)
    if lone is not None:
        at, escape = lone
        return (
            f"invalid JSON body: a lone UTF-16 surrogate escape {escape} at byte {at} is not "
            "a character (send the text as UTF-8, or a character beyond U+FFFF as a pair "
            "of escapes)"
        )
    return f"invalid JSON body: {exc}"


class RequestError(ValueError):
    """A client mistake, answered with its HTTP status and never raised past the handler."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent back."""


def detokenize(ids: list[int]) -> str:
    """A stand-in for the tokenizer: synthetic tokens have no text, only a stable spelling."""
    return "".join(_ALPHABET[t % len(_ALPHABET)] for t in ids)


def byte_text(ids: list[int]) -> str:
    """Byte tokens as the text they spell, without the EOS that stopped them (as SGLang skips
    special tokens); a cut inside a character becomes U+FFFD."""
    end = len(ids) - (bool(ids) and ids[-1] == EOS_TOKEN)
    return bytes(ids[:end]).decode("utf-8", errors="replace")


def _as_list(value, n: int, what: str) -> list:
    """Broadcast a per-request field of a batch request (SGLang lets one value serve all)."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{what}: {len(value)} values for {n} prompts")
        return value
    return [value] * n


def parse_generate(body: dict) -> tuple[list[dict], bool, int]:
    """SGLang's `/generate` body as per-request keyword sets, whether it was a batch, and
    how many of its rids and workload names were cleaned (`names.clean`) to be kept."""
    if body.get("stream"):
        raise RequestError("streaming is not supported by the reference front")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of text or input_ids")
    if text is not None:
        batched = isinstance(text, list)
        prompts = [{"text": t} for t in (text if batched else [text])]
    else:
        batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = [{"input_ids": t} for t in (input_ids if batched else [input_ids])]
    n = len(prompts)
    if n == 0:
        raise RequestError("empty batch")
    if n > MAX_BATCH:
        raise RequestError(
            f"{n} prompts in one batch; at most {MAX_BATCH}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        )
    params = _as_list(body.get("sampling_params") or {}, n, "sampling_params")
    rids = body.get("rid")
    rids = [uuid.uuid4().hex for _ in range(n)] if rids is None else _as_list(rids, n, "rid")
    workloads = _as_list(body.get("workload"), n, "workload")
    out = []
    for prompt, sp, rid, wl in zip(prompts, params, rids, workloads, strict=True):
        if not isinstance(sp, dict):
            raise RequestError("sampling_params must be an object")
        if wl is not None and not isinstance(wl, str):
            raise RequestError("workload must be a string")
        out.append(
            {
                **prompt,
                "rid": rid,
                "temperature": sp.get("temperature", 1.0),
                "max_new_tokens": sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
                "ignore_eos": bool(sp.get("ignore_eos", False)),
                "workload": wl,
            }
        )
    cleaned = 0
    for r in out:  # checked here so that the duplicate test below can hash them
        if not isinstance(r["rid"], str):
            raise RequestError(f"rid must be a string, got {type(r['rid']).__name__}")
        # names.clean: a lone surrogate or a newline in a rid would otherwise reach
        # /server_info's JSON and every consumer of it, and a huge one every label
        for key in ("rid", "workload"):
            if r[key] is not None and not names.is_clean(r[key]):
                r[key] = names.clean(r[key])
                cleaned += 1
    if len({r["rid"] for r in out}) != n:
        raise RequestError("rids repeat within the batch")
    return out, batched, cleaned

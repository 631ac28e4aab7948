"""A verify forward over each row's verified window, timed, and undone afterwards.

The accept chain comes from one forward over the whole block (every mode reads it, and the
shadow reads it to the end), but a server's verify runs over the window the scheduler
chose, its tokens packed and padded to a captured tier: that is the forward whose time a
measured run records (`TargetLM.extend_packed`). It runs into the slots' KV cache rows past
the committed tokens and is undone (keys, values, lengths), so what the request commits is
the whole-block forward's, bit for bit, whether steps are timed or not.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .session import RealSession


@torch.inference_mode()
def timed_verify(
    session: RealSession,
    slots: np.ndarray,
    start: np.ndarray,
    tokens: np.ndarray,
    verified: np.ndarray,
    tier: int,
) -> float:
    """Seconds of the target's forward over `tokens [rows, gamma + 1]` (the anchor, then the
    drafts) up to each row's `verified` drafts, packed and padded to `tier` tokens, from the
    cache lengths `start`; the session's cache is left as it was."""
    device = session.device
    cache = session.cache
    saved = cache.save(slots, start, tokens.shape[1])
    cache.truncate(slots, start)
    batch = torch.as_tensor(tokens[:, : int(verified.max()) + 1], device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    begin = time.perf_counter()
    session.models.target.extend_packed(cache, slots, batch, verified + 1, tier)
    sync()
    seconds = time.perf_counter() - begin
    cache.restore(saved)
    return seconds

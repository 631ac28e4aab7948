"""A ring of packed steps in shared memory, between SGLang's process and ours.

The serving thread must never wait and must not share its GIL with our work, so
the consumer runs in another process and the ring lives in a shared-memory
segment both map. On a GPU the segment is page-locked and mapped into the device's
address space (`cudaHostRegister`), so the hook's kernel writes a step's packed block
straight into its slot and the stream then writes the slot's stamp behind a
system-scope memory barrier (or, without that, two copies on one stream, which
complete in order): a consumer that sees the stamp sees the block. There is no event
to wait on across processes and no thread in SGLang's process.

Only the producer writes a slot whose step the consumer has released
(`consumed`); when the consumer lags that far, the step is dropped whole and
counted (`dropped`), and serving goes on.

Segment: a header of int64 counters and the producer's identity (its process, rank,
engine, verify mode and model name, so that one consumer can serve every rank of a
node), then per slot a stamp, the step's scalars, its request ids (UTF-8,
newline-separated) and the `[max_bs, width]` float64 block.
"""

from __future__ import annotations

import contextlib
import struct

import numpy as np

MAGIC = 0x6473706B6F6273  # "dspkobs"
# header fields (int64)
(
    H_MAGIC,
    H_SLOTS,
    H_MAX_BS,
    H_WIDTH,
    H_RID_BYTES,
    H_GAMMA,
    H_ENTRIES,
    H_CONSUMED,  # the last step the consumer released
    H_DROPPED_FULL,  # steps dropped because the ring was full
    H_DROPPED_OTHER,  # steps dropped for a batch or request ids larger than a slot
    H_FAILED,  # observer calls that raised inside the hook
    H_CLOSED,  # the producer has stopped
    H_PID,  # the producer's process
    H_RANK,  # the DP rank it observes
    H_ENGINE,  # ENGINES index of the serving engine
    H_MODE,  # MODES index of the server's verify mode
) = range(16)
HEADER = 16
#: the serving engines a producer may name (H_ENGINE)
ENGINES = ("sglang", "vllm")
#: bytes after the header for the served model's name (UTF-8), the first 8 its length
MODEL_BYTES = 256
# per-slot scalars (int64)
# (M_FLAGS holds the step's flag bits, as `step_layout` defines them)
(M_FORWARD_CT, M_BS, M_BUDGET, M_VERIFY_TOKENS, M_FLAGS, M_RID_LEN) = range(6)
META = 8
#: a slot's scalars as write_meta stores them, M_FORWARD_CT to M_RID_LEN
_META = struct.Struct("<6q")
#: request-id bytes per batch row a slot holds (SGLang's rids are 32 hex digits)
RID_BYTES_PER_ROW = 64
#: cudaHostRegisterMapped
_REGISTER_MAPPED = 2


def source_name(engine: str) -> str:
    """The ingest source a hook's steps are counted under (`dspark_ingest_records_total`)."""
    return f"{engine}-hook"


def _align(n: int, to: int = 64) -> int:
    return -(-n // to) * to


class RingNotReady(ValueError):
    """A segment without a finished ring header: not yet written, or not a ring at all."""


class SharedRing:
    """The segment and typed views of it; `create` makes one, else it maps `name`."""

    def __init__(
        self,
        name: str | None = None,
        *,
        slots: int = 16,
        max_bs: int = 1024,
        width: int = 1,
        gamma: int = 0,
        entries: int = 0,
        create: bool = True,
        rank: int = 0,
        engine: str = "sglang",
        mode: str = "compact",
        model_name: str = "",
    ) -> None:
        import os
        from multiprocessing import shared_memory

        from ..telemetry.batch import MODES

        if create:
            rid_bytes = RID_BYTES_PER_ROW * max_bs
            size = self._size(slots, max_bs, width, rid_bytes)
            self.shm = shared_memory.SharedMemory(name=name, create=True, size=size)
            self.header = np.ndarray((HEADER,), np.int64, self.shm.buf)
            self.header[:] = 0
            model = model_name.encode("utf-8", "replace")[: MODEL_BYTES - 8]
            self.header[[H_SLOTS, H_MAX_BS, H_WIDTH, H_RID_BYTES, H_GAMMA, H_ENTRIES, H_PID,
                         H_RANK, H_ENGINE, H_MODE]] = (
                slots, max_bs, width, rid_bytes, gamma, entries, os.getpid(),
                rank, ENGINES.index(engine), MODES.index(mode),
            )  # fmt: skip
            at = _align(HEADER * 8)
            struct.pack_into("<q", self.shm.buf, at, len(model))
            self.shm.buf[at + 8 : at + 8 + len(model)] = model
            self.header[H_MAGIC] = MAGIC  # last: a consumer maps only a finished header
        else:
            try:
                self.shm = shared_memory.SharedMemory(name=name, create=False)
            except ValueError:  # an empty segment: its producer has not sized it yet
                raise RingNotReady(f"hook ring {name!r} is not written yet") from None
            _untrack(self.shm)
            if self.shm.size < _align(HEADER * 8) + MODEL_BYTES:
                self.shm.close()
                raise RingNotReady(f"hook ring {name!r} is not written yet")
            self.header = np.ndarray((HEADER,), np.int64, self.shm.buf)
            if int(self.header[H_MAGIC]) != MAGIC:
                self.header = None
                self.shm.close()
                raise RingNotReady(f"shared memory {name!r} is not (yet) a dspark-obs hook ring")
            try:
                self._check_header(name)
            except ValueError:
                self.header = None
                self.shm.close()
                raise
        h = self.header
        self.owner = create
        self.slots, self.max_bs, self.width = int(h[H_SLOTS]), int(h[H_MAX_BS]), int(h[H_WIDTH])
        self.rid_bytes = int(h[H_RID_BYTES])
        self.gamma, self.entries = int(h[H_GAMMA]), int(h[H_ENTRIES])
        self.pid, self.rank = int(h[H_PID]), int(h[H_RANK])
        self.engine, self.mode = ENGINES[int(h[H_ENGINE])], MODES[int(h[H_MODE])]
        at = _align(HEADER * 8)
        (n,) = struct.unpack_from("<q", self.shm.buf, at)
        self.model_name = bytes(self.shm.buf[at + 8 : at + 8 + n]).decode("utf-8", "replace")
        self._slot_bytes = self._slot_size(self.max_bs, self.width, self.rid_bytes)
        self.stamps, self.metas, self.rids, self.packed = [], [], [], []
        self._meta_at: list[int] = []
        self._rids_at: list[int] = []
        # the request-id bytes each slot holds, kept so that the same ids are not copied again
        self._rids_in: list[bytes | None] = [None] * self.slots
        for s in range(self.slots):
            at = _align(HEADER * 8) + MODEL_BYTES + s * self._slot_bytes
            self.stamps.append(np.ndarray((1,), np.int64, self.shm.buf, at))
            self.metas.append(np.ndarray((META,), np.int64, self.shm.buf, at + 64))
            self._meta_at.append(at + 64)
            at += 64 + _align(META * 8)
            self.rids.append(np.ndarray((self.rid_bytes,), np.uint8, self.shm.buf, at))
            self._rids_at.append(at)
            at += _align(self.rid_bytes)
            self.packed.append(np.ndarray((self.max_bs, self.width), np.float64, self.shm.buf, at))
        self._registered = False

    def _check_header(self, name: str | None) -> None:
        """A mapped segment's header describes a segment of its size, with known codes: the
        consumer maps whatever carries the magic, and must refuse what would not fit."""
        from ..telemetry.batch import MODES

        h = [int(v) for v in self.header]
        slots, max_bs, width, rid_bytes = h[H_SLOTS], h[H_MAX_BS], h[H_WIDTH], h[H_RID_BYTES]
        sane = (
            1 <= slots <= 1 << 16
            and 1 <= max_bs <= 1 << 20
            and 1 <= width <= 1 << 12
            and 0 <= rid_bytes <= 1 << 30
            and 1 <= h[H_GAMMA] <= 64
            and 0 <= h[H_ENTRIES] <= 64
            and 0 <= h[H_ENGINE] < len(ENGINES)
            and 0 <= h[H_MODE] < len(MODES)
        )
        if sane:
            (n,) = struct.unpack_from("<q", self.shm.buf, _align(HEADER * 8))
            sane = 0 <= n <= MODEL_BYTES - 8
        if not sane or self._size(slots, max_bs, width, rid_bytes) > self.shm.size:
            raise ValueError(f"hook ring {name!r}: its header does not describe this segment")

    @staticmethod
    def _slot_size(max_bs: int, width: int, rid_bytes: int) -> int:
        return 64 + _align(META * 8) + _align(rid_bytes) + _align(max_bs * width * 8)

    @classmethod
    def _size(cls, slots: int, max_bs: int, width: int, rid_bytes: int) -> int:
        return _align(HEADER * 8) + MODEL_BYTES + slots * cls._slot_size(max_bs, width, rid_bytes)

    @property
    def name(self) -> str:
        return self.shm.name

    # -- producer ---------------------------------------------------------------

    def slot_for(self, seq: int) -> int | None:
        """The slot step `seq` goes to, or None (counted) when the consumer is a ring behind."""
        if seq - int(self.header[H_CONSUMED]) > self.slots:
            self.header[H_DROPPED_FULL] += 1
            return None
        return seq % self.slots

    def write_meta(self, slot: int, values: tuple[int, ...], rids: bytes) -> bool:
        """The step's scalars (M_FORWARD_CT to M_FLAGS, in order) and request ids; False
        (counted) when the ids do not fit."""
        n = len(rids)
        if n > self.rid_bytes:
            self.header[H_DROPPED_OTHER] += 1
            return False
        if self._rids_in[slot] is not rids:  # the same batch's ids: the slot has them
            at = self._rids_at[slot]
            self.shm.buf[at : at + n] = rids
            self._rids_in[slot] = rids
        _META.pack_into(self.shm.buf, self._meta_at[slot], *values, n)
        return True

    def register_with_cuda(self) -> None:
        """Page-lock the segment, so that device copies into it are asynchronous, and map it
        into the device's address space, so that a kernel and the stream can write it."""
        import torch

        if self._registered:
            return
        ptr = self.header.ctypes.data
        err = torch.cuda.cudart().cudaHostRegister(ptr, self.shm.size, _REGISTER_MAPPED)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the hook ring failed (error {int(err)})")
        self._registered = True

    # -- consumer ---------------------------------------------------------------

    def ready(self, seq: int) -> bool:
        return int(self.stamps[seq % self.slots][0]) == seq

    def release(self, seq: int) -> None:
        self.header[H_CONSUMED] = seq

    def counters(self) -> dict[str, int]:
        h = self.header
        return {
            "dropped_full": int(h[H_DROPPED_FULL]),
            "dropped_other": int(h[H_DROPPED_OTHER]),
            "failed": int(h[H_FAILED]),
            "closed": int(h[H_CLOSED]),
        }

    def close(self) -> None:
        """Unmap (and, for the owner, unregister and remove) the segment."""
        if self._registered:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.header.ctypes.data)
            self._registered = False
        self.stamps = self.metas = self.rids = self.packed = []
        self.header = None
        self.shm.close()
        if self.owner:
            self.shm.unlink()


def _untrack(shm) -> None:
    """A mapping process must not remove the segment at its exit: Python's resource tracker
    would (it tracks every SharedMemory it opens, bpo-39959); only the creator unlinks."""
    from multiprocessing import resource_tracker

    # a tracker that never saw the segment has nothing to forget
    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")

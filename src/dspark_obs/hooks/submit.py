"""From an observed step to a ring slot, without waiting for the device.

Every packer has one interface (`Packer`): it fills the first `bs` rows of a
`[max_bs, width]` block on the caller's stream. Where the block goes:

- on a GPU with Triton, the fused kernel writes it straight into the ring slot, through
  the device's mapping of the page-locked segment, and the stream then writes the slot's
  stamp (`cuStreamWriteValue64`, through `device_copy`): the stream runs it once the
  kernel is done, behind a system-scope memory barrier, so a consumer that sees the stamp
  sees the whole block. One launch and one driver call; no copy;
- without that stream operation, or with a torch packer (no Triton, or vLLM's pass), the
  pass writes a preallocated device buffer, and one copy moves its rows into the slot and
  a second the stamp (copies on one stream complete in order). The kernel writes the
  device stamp itself; a torch packer's stamp is filled after it;
- on a CPU the torch form writes the slot directly and the stamp is stored last.

Everything is enqueued on the caller's current stream and nothing synchronises; nothing
is allocated per step on the Triton path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .observed_step import ObservedStep
from .pack_torch import TorchPacker
from .shared_ring import SharedRing
from .step_layout import StepLayout

log = logging.getLogger(__name__)


class Packer(Protocol):
    """A step's device pass, as `StepSubmitter` calls it (`TorchPacker`, `TritonPacker`,
    `vllm_pack.VLLMPacker`, `vllm_pack_triton.VLLMTritonPacker`). One that launches by
    address (`by_address`, a Triton kernel) can write the ring's slot itself; one that
    `writes_stamp` also sets the device stamp to the step's number."""

    by_address: bool
    writes_stamp: bool

    def pack(self, step, seq: int, stream: int, out, out_at: int) -> None:
        """Enqueue the filling of `out[:step.bs]` on `stream` (the current one; 0 on a CPU).
        `out` is a `[max_bs, width]` float64 tensor; `out_at` its device address, for a
        packer that launches by address (0 where there is none)."""


#: A packer made for a submitter (its layout, ring, device and device stamp are set).
PackerForm = Callable[["StepSubmitter"], Packer]


def sglang_triton(submitter: StepSubmitter) -> Packer:
    from .pack_triton import TritonPacker

    return TritonPacker(submitter.layout, submitter.pool_slots, submitter.device,
                        submitter.ring.max_bs, submitter.stamp)  # fmt: skip


def sglang_torch(submitter: StepSubmitter) -> Packer:
    return TorchPacker(submitter.layout, submitter.pool_slots, submitter.device)


class StepSubmitter:
    def __init__(self, layout: StepLayout, ring: SharedRing, device, pool_slots: int, *,
                 triton: bool | None = None,
                 forms: tuple[PackerForm, PackerForm] = (sglang_triton, sglang_torch),
                 ) -> None:  # fmt: skip
        """`forms`: the engine's Triton and torch packers (SGLang's by default; vLLM's hook
        passes its own). The Triton one on a GPU where Triton imports (`triton=None`) or
        must (`True`), the torch one otherwise."""
        import torch

        self.layout, self.ring, self.pool_slots = layout, ring, pool_slots
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host_slots = [torch.from_numpy(b) for b in ring.packed]
        triton_form, torch_form = forms
        packer = None
        #: the packer writes straight into the ring's slots (a kernel launched by address)
        self.direct = False
        if self.cuda:
            from .device_copy import DeviceCopy

            ring.register_with_cuda()
            self.copy = DeviceCopy()
            self.stamp = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.index = self.device.index if self.device.index is not None else 0
            self.raw_stream = torch._C._cuda_getCurrentRawStream
            if triton is not False:
                packer = self._triton_packer(triton_form, raise_missing=bool(triton))
            self.direct = packer is not None and packer.by_address and self._map_ring()
            if not self.direct:
                self.packed = torch.empty((ring.max_bs, layout.width), dtype=torch.float64,
                                          device=self.device)  # fmt: skip
                self.slot_at = [b.ctypes.data for b in ring.packed]
                self.stamp_at = [s.ctypes.data for s in ring.stamps]
                self.packed_at, self.stamp_from = self.packed.data_ptr(), self.stamp.data_ptr()
        self.packer = packer or torch_form(self)

    def _triton_packer(self, form: PackerForm, *, raise_missing: bool) -> Packer | None:
        """The Triton packer; None where Triton does not import (unless asked for)."""
        try:
            return form(self)
        except ImportError as exc:
            if raise_missing:
                raise
            log.warning("hook: Triton unavailable (%r); packing steps with torch", exc)
            return None

    def _map_ring(self) -> bool:
        """The slots' device addresses, where the stream can write the stamps; False (the
        copies instead) where it cannot."""
        ring, copy = self.ring, self.copy
        if not copy.can_write_values():
            return False
        host = ring.header.ctypes.data
        try:
            base = copy.device_pointer(host)
            self.slot_dev = [base + b.ctypes.data - host for b in ring.packed]
            self.stamp_dev = [base + s.ctypes.data - host for s in ring.stamps]
            # no step is out yet: every stamp is 0, and this one is written 0 again
            copy.write_value(self.stamp_dev[0], 0, self.raw_stream(self.index))
        except RuntimeError as exc:
            log.warning("hook: the ring cannot be written by the stream (%s); copying", exc)
            return False
        return True

    def submit(self, step: ObservedStep, slot: int, seq: int) -> None:
        if not self.cuda:
            self.packer.pack(step, seq, 0, self.host_slots[slot], 0)
            self.ring.stamps[slot][0] = seq
            return
        stream = self.raw_stream(self.index)
        if self.direct:
            self.packer.pack(step, seq, stream, self.host_slots[slot], self.slot_dev[slot])
            self.copy.write_value(self.stamp_dev[slot], seq, stream)
            return
        self.packer.pack(step, seq, stream, self.packed, self.packed_at)
        if not self.packer.writes_stamp:
            self.stamp.fill_(seq)
        bs = step.bs
        self.copy.to_host(self.slot_at[slot], self.packed_at, bs * self.layout.width * 8, stream)
        self.copy.to_host(self.stamp_at[slot], self.stamp_from, 8, stream)

    def close(self) -> None:
        self.host_slots = []

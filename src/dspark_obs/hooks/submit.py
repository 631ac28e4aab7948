"""From an observed step to a ring slot, without waiting for the device.

On a GPU with Triton: the fused kernel writes the packed block straight into the ring
slot, through the device's mapping of the page-locked segment, and the stream then
writes the slot's stamp (`cuStreamWriteValue64`, through `device_copy`): the stream
runs it once the kernel is done, behind a system-scope memory barrier, so a consumer
that sees the stamp sees the whole block. One launch and one driver call; no copy.
Without that stream operation, or with the torch form (no Triton), the pass writes a
preallocated device buffer, and one copy moves its rows into the slot and a second
the stamp (copies on one stream complete in order). Either way everything is enqueued
on the caller's current stream and nothing synchronises; nothing is allocated per step
on the Triton path. On a CPU the torch form writes the slot directly and the stamp is
stored last.
"""

from __future__ import annotations

import logging

from .observed_step import ObservedStep
from .pack_torch import TorchPacker
from .shared_ring import SharedRing
from .step_layout import StepLayout

log = logging.getLogger(__name__)


class StepSubmitter:
    def __init__(self, layout: StepLayout, ring: SharedRing, device, pool_slots: int, *,
                 triton: bool | None = None, packer=None) -> None:  # fmt: skip
        """`packer`: a pass of the torch form's interface (`pack(step, out)`) for an engine
        whose step the Triton kernel does not read (vLLM's); Triton is then not used."""
        import torch

        self.layout, self.ring = layout, ring
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host_blocks = [torch.from_numpy(b) for b in ring.blocks]
        self.packer = None
        self.direct = False
        if self.cuda:
            from .device_copy import DeviceCopy

            ring.register_with_cuda()
            self.copy = DeviceCopy()
            self.stamp = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.index = self.device.index if self.device.index is not None else 0
            self.raw_stream = torch._C._cuda_getCurrentRawStream
            if triton is not False and packer is None:
                try:
                    from .pack_triton import TritonPacker

                    self.packer = TritonPacker(layout, pool_slots, self.device, ring.max_bs,
                                               self.stamp)  # fmt: skip
                except ImportError as exc:
                    if triton:
                        raise
                    log.warning("hook: Triton unavailable (%r); packing steps with torch", exc)
            if self.packer is not None:
                self.direct = self._map_ring()
            if not self.direct:
                self.packed = torch.empty((ring.max_bs, layout.width), dtype=torch.float64,
                                          device=self.device)  # fmt: skip
                self.block_at = [b.ctypes.data for b in ring.blocks]
                self.stamp_at = [s.ctypes.data for s in ring.stamps]
                self.packed_at, self.stamp_from = self.packed.data_ptr(), self.stamp.data_ptr()
        self.fused = self.packer is not None
        if self.packer is None:
            self.packer = packer or TorchPacker(layout, pool_slots, self.device)

    def _map_ring(self) -> bool:
        """The slots' device addresses, where the stream can write the stamps; False (the
        copies instead) where it cannot."""
        ring, copy = self.ring, self.copy
        if not copy.can_write_values():
            return False
        host = ring.header.ctypes.data
        try:
            base = copy.device_pointer(host)
            self.block_dev = [base + b.ctypes.data - host for b in ring.blocks]
            self.stamp_dev = [base + s.ctypes.data - host for s in ring.stamps]
            # no step is out yet: every stamp is 0, and this one is written 0 again
            copy.write_value(self.stamp_dev[0], 0, self.raw_stream(self.index))
        except RuntimeError as exc:
            log.warning("hook: the ring cannot be written by the stream (%s); copying", exc)
            return False
        return True

    def submit(self, step: ObservedStep, slot: int, seq: int) -> None:
        bs = step.bs
        if not self.cuda:
            self.packer.pack(step, self.host_blocks[slot][:bs])
            self.ring.stamps[slot][0] = seq
            return
        stream = self.raw_stream(self.index)
        if self.direct:
            self.packer.pack(step, seq, stream, self.host_blocks[slot], self.block_dev[slot])
            self.copy.write_value(self.stamp_dev[slot], seq, stream)
            return
        if self.fused:
            self.packer.pack(step, seq, stream, self.packed, self.packed_at)
        else:
            self.packer.pack(step, self.packed[:bs])
            self.stamp.fill_(seq)
        self.copy.to_host(self.block_at[slot], self.packed_at, bs * self.layout.width * 8, stream)
        self.copy.to_host(self.stamp_at[slot], self.stamp_from, 8, stream)

    def close(self) -> None:
        self.host_blocks = []

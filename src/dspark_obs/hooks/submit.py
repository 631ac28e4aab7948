"""From an observed step to a ring slot, without waiting for the device.

On a GPU: the device pass (the fused Triton kernel, or the torch form where Triton
is missing) writes the packed block into a preallocated device buffer; one copy
moves the step's rows into the page-locked ring slot and a second the slot's stamp,
both enqueued on the caller's current stream through the CUDA driver
(`device_copy`), so the consumer sees the stamp only after the block has landed.
Nothing is allocated per step on the Triton path and nothing synchronises. On a CPU
the torch form writes the slot directly and the stamp is stored last.
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
                 triton: bool | None = None) -> None:  # fmt: skip
        import torch

        self.layout, self.ring = layout, ring
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.host_blocks = [torch.from_numpy(b) for b in ring.blocks]
        self.packer = None
        if self.cuda:
            from .device_copy import DeviceCopy

            ring.register_with_cuda()
            self.copy = DeviceCopy()
            self.packed = torch.empty((ring.max_bs, layout.width), dtype=torch.float64,
                                      device=self.device)  # fmt: skip
            self.stamp = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.index = self.device.index if self.device.index is not None else 0
            self.raw_stream = torch._C._cuda_getCurrentRawStream
            self.block_at = [b.ctypes.data for b in ring.blocks]
            self.stamp_at = [s.ctypes.data for s in ring.stamps]
            self.packed_at, self.stamp_from = self.packed.data_ptr(), self.stamp.data_ptr()
            if triton is not False:
                try:
                    from .pack_triton import TritonPacker

                    self.packer = TritonPacker(layout, pool_slots, self.device, self.packed,
                                               self.stamp)  # fmt: skip
                except ImportError as exc:
                    if triton:
                        raise
                    log.warning("hook: Triton unavailable (%r); packing steps with torch", exc)
        self.fused = self.packer is not None
        if self.packer is None:
            self.packer = TorchPacker(layout, pool_slots, self.device)

    def submit(self, step: ObservedStep, slot: int, seq: int) -> None:
        bs = step.bs
        if not self.cuda:
            self.packer.pack(step, self.host_blocks[slot][:bs])
            self.ring.stamps[slot][0] = seq
            return
        stream = self.raw_stream(self.index)
        if self.fused:
            self.packer.pack(step, seq, stream)
        else:
            self.packer.pack(step, self.packed[:bs])
            self.stamp.fill_(seq)
        self.copy.to_host(self.block_at[slot], self.packed_at, bs * self.layout.width * 8, stream)
        self.copy.to_host(self.stamp_at[slot], self.stamp_from, 8, stream)

    def close(self) -> None:
        self.host_blocks = []

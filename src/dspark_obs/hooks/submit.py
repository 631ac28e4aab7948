"""From an observed step to a ring slot, without waiting for the device.

On a GPU with Triton: the fused kernel writes the packed block straight into the ring
slot, through the device's mapping of the page-locked segment, and the launch's last
program writes the slot's stamp behind a system-scope release of every program's stores
(`pack_triton.py`), so a consumer that sees the stamp sees the whole block: one launch,
nothing else. Before compute capability 7.0 (no scoped release) the stream writes the
stamp instead (`cuStreamWriteValue64`, through `device_copy`), once the kernel is done,
behind a system-scope memory barrier. Without either, or with the torch form (no
Triton), the pass writes a preallocated device buffer, and one copy moves its rows into
the slot and a second the stamp (copies on one stream complete in order). Either way
everything is enqueued on the caller's current stream and nothing synchronises; nothing
is allocated per step on the Triton path. On a CPU the torch form writes the slot
directly and the stamp is stored last.
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
        self.direct = self.kernel_stamps = False
        if self.cuda:
            from .device_copy import DeviceCopy

            ring.register_with_cuda()
            self.copy = DeviceCopy()
            self.stamp = torch.zeros(1, dtype=torch.int64, device=self.device)
            self.stamp_from = self.stamp.data_ptr()
            self.index = self.device.index if self.device.index is not None else 0
            self.raw_stream = torch._C._cuda_getCurrentRawStream
            if triton is not False:
                try:
                    from .pack_triton import TritonPacker

                    self.packer = TritonPacker(layout, pool_slots, self.device, ring.max_bs)
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
                self.packed_at = self.packed.data_ptr()
        self.fused = self.packer is not None
        if self.packer is None:
            self.packer = TorchPacker(layout, pool_slots, self.device)

    def _map_ring(self) -> bool:
        """The slots' device addresses, where the kernel or else the stream can write the
        stamps; False (the copies instead) where neither can."""
        import torch

        ring, copy = self.ring, self.copy
        self.kernel_stamps = _kernel_stamps(self.device)
        if not self.kernel_stamps and not copy.can_write_values():
            return False
        host = ring.header.ctypes.data
        try:
            base = copy.device_pointer(host)
            self.block_dev = [base + b.ctypes.data - host for b in ring.blocks]
            self.stamp_dev = [base + s.ctypes.data - host for s in ring.stamps]
            if not self.kernel_stamps:
                # no step is out yet: every stamp is 0, and this one is written 0 again
                copy.write_value(self.stamp_dev[0], 0, self.raw_stream(self.index))
        except RuntimeError as exc:
            log.warning("hook: the ring cannot be written by the device (%s); copying", exc)
            self.kernel_stamps = False
            return False
        self.host_stamps = [torch.from_numpy(s) for s in ring.stamps]
        return True

    def submit(self, step: ObservedStep, slot: int, seq: int) -> None:
        bs = step.bs
        if not self.cuda:
            self.packer.pack(step, self.host_blocks[slot][:bs])
            self.ring.stamps[slot][0] = seq
            return
        stream = self.raw_stream(self.index)
        if self.kernel_stamps:
            self.packer.pack(step, seq, stream, self.host_blocks[slot], self.block_dev[slot],
                             self.host_stamps[slot], self.stamp_dev[slot],
                             stamp_last=True)  # fmt: skip
            return
        if self.direct:
            self.packer.pack(step, seq, stream, self.host_blocks[slot], self.block_dev[slot],
                             self.stamp, self.stamp_from)  # fmt: skip
            self.copy.write_value(self.stamp_dev[slot], seq, stream)
            return
        if self.fused:
            self.packer.pack(step, seq, stream, self.packed, self.packed_at, self.stamp,
                             self.stamp_from)  # fmt: skip
        else:
            self.packer.pack(step, self.packed[:bs])
            self.stamp.fill_(seq)
        self.copy.to_host(self.block_at[slot], self.packed_at, bs * self.layout.width * 8, stream)
        self.copy.to_host(self.stamp_at[slot], self.stamp_from, 8, stream)

    def close(self) -> None:
        self.host_blocks = self.host_stamps = []


def _kernel_stamps(device) -> bool:
    """Whether the kernel can release the stamp at system scope itself (`st.release.sys`
    and scoped atomics: compute capability 7.0 and later)."""
    import torch

    return torch.cuda.get_device_capability(device) >= (7, 0)

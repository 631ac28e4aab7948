"""The CUDA driver's stream operations the hook enqueues, at a call's cost.

A torch `copy_` costs the serving thread its dispatcher (several microseconds on a
busy host), so the hook calls the CUDA driver directly: `cuMemcpyDtoHAsync` for a copy
into page-locked host memory (the hook's ring is registered with CUDA, so the copy never
blocks the host), and `cuStreamWriteValue64` for a slot's stamp, a value written by the
stream itself once the work before it is done, behind a memory barrier of system scope
(the driver's default), so a host that reads the value sees that work's writes. Both
are enqueued on the caller's stream for about a microsecond of Python.
"""

from __future__ import annotations

import ctypes


class DeviceCopy:
    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size, ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
        self._d2h = lib.cuMemcpyDtoHAsync_v2
        self._d2h.argtypes = (ptr, u64, size, ptr)
        self._d2h.restype = ctypes.c_int
        self._mapped = lib.cuMemHostGetDevicePointer_v2
        self._mapped.argtypes = (ctypes.POINTER(u64), ptr, ctypes.c_uint)
        self._mapped.restype = ctypes.c_int
        # the stream memory operations' v2 entry point (CUDA 11.7 and later)
        self._write = getattr(lib, "cuStreamWriteValue64_v2", None)
        if self._write is not None:
            self._write.argtypes = (ptr, u64, u64, ctypes.c_uint)
            self._write.restype = ctypes.c_int

    def to_host(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        _check(self._d2h(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def device_pointer(self, host: int) -> int:
        """The device's address of registered, mapped host memory."""
        out = ctypes.c_uint64()
        _check(self._mapped(ctypes.byref(out), host, 0), "cuMemHostGetDevicePointer")
        return out.value

    def can_write_values(self) -> bool:
        return self._write is not None

    def write_value(self, dst: int, value: int, stream: int) -> None:
        """`*dst = value` (8 bytes, device address) once the stream's earlier work is done."""
        _check(self._write(stream, dst, value, 0), "cuStreamWriteValue64")


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed (CUresult {err})")

"""Asynchronous copies from the device into page-locked host memory, at a call's cost.

A torch `copy_` costs the serving thread its dispatcher (several microseconds on a
busy host); the hook makes two copies a step, so it calls the CUDA driver's
`cuMemcpyDtoHAsync` directly instead: the same copy engine, enqueued on the caller's
stream, for about a microsecond of Python. The host side must be page-locked (the
hook's ring is registered with CUDA), so the copies never block the host.
"""

from __future__ import annotations

import ctypes


class DeviceCopy:
    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        u64, size = ctypes.c_uint64, ctypes.c_size_t
        self._d2h = lib.cuMemcpyDtoHAsync_v2
        self._d2h.argtypes = (ctypes.c_void_p, u64, size, ctypes.c_void_p)
        self._d2h.restype = ctypes.c_int

    def to_host(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        _check(self._d2h(dst, src, nbytes, stream), "device to host")


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"cuMemcpy {what} failed (CUresult {err})")

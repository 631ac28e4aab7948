"""Keep glibc from handing the per-step numpy temporaries back to the kernel.

Why: every step (or every few) allocates and frees the same temporaries of a few
hundred KiB to a few MiB: at B = 256 the `[rows, gamma]` columns the estimator
and the aggregates work on. glibc serves a block above its mmap threshold with a
fresh mapping, and trims the top of its heap once more than its trim threshold
lies free there; in both cases the next step's temporary faults its pages in
again, one kernel trap per 4 KiB, which costs more than the arithmetic on it (the
estimator's update at B = 256: about 9 % of its time, `bench/RESULTS.md`). With
both thresholds raised, freed blocks stay in the heap and are reused.

The price is memory that is not given back: at most `TRIM_BYTES` of free heap
stays mapped. Only dspark-obs's own processes ask for it (`dspark-obs ...` and
the benchmarks that stand for them); importing the package changes nothing,
since the SGLang hook runs inside SGLang's process.
"""

from __future__ import annotations

import ctypes
import sys

#: glibc's `mallopt` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks below this come from the heap: above the per-step temporaries at B = 256
#: (at most about 1 MiB each).
MMAP_BYTES = 4 << 20
#: Free heap kept before trimming: a few steps' worth of temporaries. Four times this
#: kept the quick soak's resident size climbing for its whole minute (tests/test_soak.py).
TRIM_BYTES = 16 << 20


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc; musl and others have no mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)
    )

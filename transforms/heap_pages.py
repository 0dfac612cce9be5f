"""Keep freed heap pages in the worker process (glibc only).

Every block the workers touch makes numpy temporaries of several MB (a
4096 x 384 float64 block is 12.6 MB). glibc's default heap returns its top
to the kernel once more than ~2x the largest recent allocation is free,
so the next block's temporaries fault every page in again: at 1M rows that
was ~1.5M page faults and ~8 s of kernel time per job, the workers'
largest single overhead after the arithmetic. Keeping up to
``TOP_PAD_BYTES`` of freed heap (M_TOP_PAD) removes almost all of them; the
cost is at most that much resident memory per worker process.

There is no Python or numpy API for this (numpy allocates through the C
heap), hence ctypes. Other C libraries (macOS, musl) keep their defaults.
"""
import ctypes
import os

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3  # glibc <malloc.h>
TOP_PAD_BYTES = 256 << 20
# glibc's largest allowed threshold (64-bit): blocks' temporaries (a few
# MB) come from the heap, not from fresh mappings. Set at run time, the
# pad alone is not enough: glibc then stops adapting the threshold.
MMAP_THRESHOLD_BYTES = 32 << 20

_done = False


def keep_heap_pages(top_pad: int = TOP_PAD_BYTES) -> bool:
    """Once per process: ask glibc to keep ``top_pad`` bytes of freed heap,
    here and (through the environment) in the worker processes this one
    starts, where it then holds from their first allocation. Returns
    whether the setting was applied (False off glibc)."""
    global _done
    if _done:
        return True
    os.environ.setdefault("MALLOC_TOP_PAD_", str(int(top_pad)))
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD_BYTES))
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        libc = ctypes.CDLL("libc.so.6")
        _done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                     and libc.mallopt(M_TOP_PAD, int(top_pad)))
    except (OSError, ValueError, AttributeError):
        return False
    return _done

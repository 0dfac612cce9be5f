"""Workers keep freed heap pages: block temporaries stop faulting."""
import os
import subprocess
import sys

import pytest

from dpsynth.transforms import heap_pages

GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") \
    if hasattr(os, "confstr") and "CS_GNU_LIBC_VERSION" in getattr(
        os, "confstr_names", {}) else False

# 300 blocks' worth of 12.6 MB float64 temporaries, as a worker makes them
LOOP = """
import resource, sys, numpy as np
sys.path.insert(0, {root!r})
if {tuned}:
    from dpsynth.transforms import heap_pages
    assert heap_pages.keep_heap_pages()
x = np.ones((4096, 384))  # calloc'd: the case the pad alone misses
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(300):
    a = x * 2.0
    b = a + 1.0
    del a, b
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(tuned: bool) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c",
                          LOOP.format(root=root, tuned=tuned)],
                         env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_keep_heap_pages_is_idempotent():
    first = heap_pages.keep_heap_pages()
    assert heap_pages.keep_heap_pages() == first
    assert first == GLIBC


@pytest.mark.skipif(not GLIBC, reason="glibc-only allocator setting")
def test_temporaries_stop_faulting_and_child_processes_inherit_it():
    assert _faults(True) * 20 < _faults(False)
    heap_pages.keep_heap_pages()
    assert os.environ["MALLOC_TOP_PAD_"] == str(heap_pages.TOP_PAD_BYTES)
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(
        heap_pages.MMAP_THRESHOLD_BYTES)

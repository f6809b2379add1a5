"""storaged.heap.trim gives the allocator's free pages back to the kernel: memory freed inside the heap
(below a block still in use, where glibc keeps it for reuse) leaves the process's RSS."""
from __future__ import annotations

import pytest

from storaged import heap

pytestmark = pytest.mark.unit


def _anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not heap.available(), reason="no malloc_trim (not glibc)")
def test_memory_freed_inside_the_heap_leaves_the_rss():
    heap.trim()
    # blocks under glibc's mmap threshold (128 KiB) come from the heap; the last one, kept, pins its top
    blocks = [bytearray(b"x" * 100_000) for _ in range(1500)]
    keep = bytearray(b"y" * 100_000)
    full = _anon_kib()
    del blocks
    freed = _anon_kib()
    assert freed > full - 50_000   # glibc kept the ~146 MiB freed below the block in use
    assert heap.trim()
    assert _anon_kib() < freed - 100_000
    assert keep[0] == ord("y")

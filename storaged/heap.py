"""Giving the C allocator's free memory back to the kernel (glibc's ``malloc_trim``).

Why: a daemon that has imported millions of events has freed most of what the import built (the search
index's live lists once written as a segment, the batches' decoded messages), but glibc keeps freed
memory inside its heap for reuse: only a free run at the very top of the heap is returned by itself, so
the process's RSS stays near its peak. ``malloc_trim(0)`` advises the kernel to take back every whole
free page anywhere in the heap (glibc 2.8+). Measured on a daemon after a 300k-event import: 49-60 MiB of
380-570 MiB of anonymous memory given back (bench/SPIKES.md, part 15). Elsewhere (musl, macOS) there is no
such call and ``trim`` does nothing.
"""
from __future__ import annotations

import ctypes

try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
except (OSError, AttributeError):
    _malloc_trim = None


def available() -> bool:
    return _malloc_trim is not None


def trim() -> bool:
    """Give the allocator's free pages back; True if any was (False where the call does not exist)."""
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False

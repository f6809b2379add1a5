"""Reading transcript files from where the last run stopped, safely.

A checkpoint says which file (device, inode), how far (byte offset after the last complete line), and
what the bytes just before that offset were (a fingerprint). A file is resumed only when all three
still hold; a file that was truncated, rewritten in place or replaced (rotated) is read again from
the start — the message ids are derived from the transcript itself, so reading twice stores nothing
twice. Whole-document files (Gemini CLI rewrites its JSON in place) are re-parsed when their size,
modification time or digest changed.

Only regular files are read (a FIFO or device planted where a transcript should be is skipped, never
opened for a blocking read), lines are streamed in chunks with a per-line cap (a 150 MB line is
skipped and counted, not loaded), and a last line without its newline is left for the next run: it
is still being written.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Iterator

CHUNK = 1 << 20
LINE_CAP = 32 << 20          # a JSON line longer than this is skipped and counted as malformed
DOCUMENT_CAP = 256 << 20     # a whole-document transcript larger than this is skipped
FINGERPRINT_BYTES = 64


class NotRegular(OSError):
    pass


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """An fd of ``path`` if it is a regular file (symlinks followed), without ever blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(f"{path} is not a regular file")
    return fd, st


def fingerprint(fd: int, offset: int) -> str:
    start = max(0, offset - FINGERPRINT_BYTES)
    return hashlib.sha256(os.pread(fd, offset - start, start)).hexdigest()[:16]


@dataclass
class Line:
    offset: int                  # where the line starts
    end: int                     # offset after its newline (the checkpoint after this line)
    obj: Any                     # the decoded JSON value, or None when malformed
    malformed: bool


def resume_offset(cp: dict[str, Any] | None, fd: int, st: os.stat_result) -> int:
    """Where to continue ``fd`` from its checkpoint: the saved offset if the file is the same one and
    was only appended to, else 0."""
    if not isinstance(cp, dict):
        return 0
    offset = cp.get("offset")
    if cp.get("file") != [st.st_dev, st.st_ino] or not isinstance(offset, int) or not 0 <= offset <= st.st_size:
        return 0
    if offset and cp.get("fp") != fingerprint(fd, offset):
        return 0  # rewritten in place: the bytes before the offset are not the ones we read
    return offset


def read_lines(fd: int, start: int, size: int) -> Iterator[Line]:
    """Complete lines of ``fd`` from ``start`` up to ``size`` (the size seen when the read began)."""
    pos = start
    pieces: list[bytes] = []   # the current line's bytes before this chunk
    pending = 0                # their length
    line_start = start
    skipping = False           # inside an over-long line: its bytes are dropped until its newline
    while pos < size:
        chunk = os.pread(fd, min(CHUNK, size - pos), pos)
        if not chunk:
            break
        i = 0
        while True:
            nl = chunk.find(b"\n", i)
            if nl < 0:
                break
            end = pos + nl + 1
            if skipping:
                yield Line(line_start, end, None, True)
                skipping = False
            else:
                raw = chunk[i:nl] if not pieces else b"".join((*pieces, chunk[i:nl]))
                yield _decode(raw, line_start, end)
            pieces, pending = [], 0
            line_start = end
            i = nl + 1
        if not skipping and i < len(chunk):
            pending += len(chunk) - i
            if pending > LINE_CAP:
                skipping, pieces, pending = True, [], 0
            else:
                pieces.append(chunk[i:])
        pos += len(chunk)
    # whatever is left has no newline yet: it is still being written


def _decode(raw: bytes, offset: int, end: int) -> Line:
    if not raw.strip():
        return Line(offset, end, None, False)
    try:
        return Line(offset, end, json.loads(raw), False)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Line(offset, end, None, True)


def jsonl_checkpoint(fd: int, st: os.stat_result, offset: int, **extra: Any) -> dict[str, Any]:
    return {"file": [st.st_dev, st.st_ino], "offset": offset, "fp": fingerprint(fd, offset) if offset else "",
            "bytes": offset, **extra}


def document_state(fd: int, st: os.stat_result) -> tuple[bytes | None, str]:
    """(the document's bytes, their digest); bytes None when over the cap."""
    if st.st_size > DOCUMENT_CAP:
        return None, ""
    data = os.pread(fd, st.st_size, 0)
    return data, hashlib.sha256(data).hexdigest()[:32]


def document_unchanged(cp: dict[str, Any] | None, st: os.stat_result) -> bool:
    return isinstance(cp, dict) and cp.get("file") == [st.st_dev, st.st_ino] and cp.get("size") == st.st_size \
        and cp.get("mtime_ns") == st.st_mtime_ns

"""Message text on disk: read back by offset from the log, never kept in memory.

The log already holds every message's text, inside the msgpack payload of the record that wrote its
current state, as the raw UTF-8 bytes of a msgpack str. So memory keeps only where those bytes are:
one int per message, ``offset << TEXT_LEN_BITS | length`` (a *text location*), and a read is one
``pread`` and a UTF-8 decode. Tool outputs of up to 64 KB are most of an agent transcript's bytes;
holding them on the heap made memory grow 4-5× faster than the text.

The offset of the text inside a record follows from the record itself: msgpack packs an array as its
header then its elements, each in the shortest form, so the bytes before field 5 (``content``) of a
``w``/``u`` record are the packing of the elements before it, which ``locate`` measures by packing
them (a few dozen bytes) rather than the whole text. ``tests/unit/test_text.py`` checks the
location against the bytes for texts at every msgpack header boundary.

A location is valid for the log file it was taken in. A compaction writes a new log: it computes the
new locations as it writes and ``LogText.switch`` moves the reader to the new file in the same step
as the store takes them (``storaged/compaction.py``).
"""
from __future__ import annotations

import errno
from typing import Any

import msgpack

from protocol import limits as L

from .fileio import FileIO
from .log import FRAME_SIZE
from .records import CONTENT

TEXT_LEN_BITS = 24
_LEN_MASK = (1 << TEXT_LEN_BITS) - 1
assert L.CONTENT_MAX_BYTES <= _LEN_MASK, "a text's length must fit its location's length bits"

_pack = msgpack.Packer(use_bin_type=True).pack


def _str_header(n: int) -> int:
    return 1 if n < 32 else 2 if n < 256 else 3 if n < 65536 else 5


def _array_header(n: int) -> int:
    return 1 if n < 16 else 3 if n < 65536 else 5


def utf8_length(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def locate(record_pos: int, record: list[Any], text: str) -> int:
    """The location of ``text``, the content of the message record (``w`` or ``u``: the message's
    fields are its last element) framed at ``record_pos`` in the log."""
    fields = record[-1]
    head = len(_pack([*record[:-1], fields[:CONTENT]])) - 1 + _array_header(len(fields))
    n = utf8_length(text)
    return (record_pos + FRAME_SIZE + head + _str_header(n)) << TEXT_LEN_BITS | n


def span(loc: int) -> tuple[int, int]:
    """(file offset, byte length) of a location."""
    return loc >> TEXT_LEN_BITS, loc & _LEN_MASK


class LogText:
    """Reads message text from one log file by location. One per store; every stored message points
    at it, so a compaction moves every message to the new file by switching this one reader."""

    __slots__ = ("io", "fd")

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self.fd: int | None = None

    def open(self, path: str) -> None:
        self.switch(self.io.open_read(path))

    def switch(self, fd: int) -> None:
        """Read from ``fd`` from now on (the old file's descriptor is closed)."""
        old, self.fd = self.fd, fd
        if old is not None:
            self.io.close(old)

    def read(self, loc: int) -> str:
        return self.read_utf8(loc).decode("utf-8")

    def read_utf8(self, loc: int) -> bytes:
        if self.fd is None:
            raise OSError(errno.EBADF, "the log is not open for reading")
        offset, length = span(loc)
        data = self.io.pread(self.fd, length, offset)
        if len(data) != length:
            raise OSError(errno.EIO, f"the log ends before the message text at byte {offset}")
        return data

    def close(self) -> None:
        if self.fd is not None:
            self.io.close(self.fd)
            self.fd = None

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
location against the bytes for texts at every msgpack header boundary, and every read checks the str
header in front of the text, so a wrong location fails (EIO, answered IO_ERROR) instead of returning
other bytes.

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


def _str_head(n: int) -> bytes:
    """msgpack's shortest str header for ``n`` bytes (fixstr, str8, str16, str32)."""
    if n < 32:
        return bytes((0xA0 | n,))
    if n < 256:
        return b"\xd9" + n.to_bytes(1, "big")
    if n < 65536:
        return b"\xda" + n.to_bytes(2, "big")
    return b"\xdb" + n.to_bytes(4, "big")


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
    return (record_pos + FRAME_SIZE + head + len(_str_head(n))) << TEXT_LEN_BITS | n


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
        """The text's bytes, read with the msgpack str header in front of them, which must be the
        one its length packs to: a location that does not point at a text fails, never returns other
        bytes."""
        if self.fd is None:
            raise OSError(errno.EBADF, "the log is not open for reading")
        offset, length = span(loc)
        head = _str_head(length)
        data = self.io.pread(self.fd, len(head) + length, offset - len(head))
        if len(data) != len(head) + length or not data.startswith(head):
            raise OSError(errno.EIO, f"no message text of {length} bytes at byte {offset} of the log")
        return data[len(head):]

    def close(self) -> None:
        if self.fd is not None:
            self.io.close(self.fd)
            self.fd = None

"""Message text on disk: read back from the log by position, checked, never kept in memory.

The log already holds every message's text, inside the msgpack payload of the record that wrote its
current state, as the raw UTF-8 bytes of a msgpack str. So memory keeps only where those bytes are:
one int per message (a *text location*: the record's position in the log, the text's offset inside
the framed record, and its length), and a read is one ``pread`` of the record. Tool outputs of up to
64 KB are most of an agent transcript's bytes; holding them on the heap made memory grow 4-5× faster
than the text.

Every read verifies the record's frame and salted checksum, as the scan at start does, and the msgpack
str header in front of the text: bytes that rotted on disk after the start (or before the snapshot's
position, which a start does not re-read) are never served, nor copied into a compacted log under a
fresh checksum. A failed check raises ``TextDamaged`` (an EIO, which the server answers CORRUPT_STORE) and tells the store,
which then refuses mutations as for damage found at start, until ``--salvage`` repairs the log.

The offset of the text inside a record follows from the record itself: msgpack packs an array as its
header then its elements, each in the shortest form, so the bytes before field 5 (``content``) of a
``w``/``u`` record are the packing of the elements before it, which ``locate`` measures by packing
them (a few dozen bytes) rather than the whole text. ``tests/unit/test_text.py`` checks the
location against the bytes for texts at every msgpack header boundary.

A location is valid for the log file it was taken in, read through that file's ``LogText`` (the
message's ``src``). A compaction writes a new log and computes the new locations as it writes; the
store then reads new texts through a second reader of the new file, and moves each message to its new
location and reader in steps between requests (``Store.relocate_step``), the old reader open until the
last has moved (``storaged/compaction.py``).
"""
from __future__ import annotations

import errno
import zlib
from array import array
from typing import Any, Callable

import msgpack

from protocol import limits as L

from .fileio import FileIO
from .log import FRAME_SIZE, record_at
from . import records
from .records import CONTENT

TEXT_LEN_BITS = 24        # the text's length in bytes
TEXT_OFF_BITS = 16        # the text's offset inside its framed record
_LEN_MASK = (1 << TEXT_LEN_BITS) - 1
_OFF_MASK = (1 << TEXT_OFF_BITS) - 1
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
    n = utf8_length(text)
    off = (FRAME_SIZE + len(_pack([*record[:-1], fields[:CONTENT]])) - 1 + _array_header(len(fields))
           + len(_str_head(n)))
    if off > _OFF_MASK:  # ids and session ids are bounded far below this (protocol.limits)
        raise ValueError("the fields before a message's text are too long to locate it")
    return ((record_pos << TEXT_OFF_BITS) | off) << TEXT_LEN_BITS | n


def location_parts(loc: int) -> list[int]:
    """[record position, text offset in the record, text length]: a location as the snapshot stores it
    (a location of a log beyond 16 MiB needs more than msgpack's 64-bit ints)."""
    head = loc >> TEXT_LEN_BITS
    return [head >> TEXT_OFF_BITS, head & _OFF_MASK, loc & _LEN_MASK]


def location_from_parts(parts: list[int]) -> int:
    pos, off, length = parts
    return ((pos << TEXT_OFF_BITS) | off) << TEXT_LEN_BITS | length


class PackedLocations:
    """A list of locations as two arrays of u64 (a location is wider than 64 bits once the log is
    beyond 16 MiB): how a rebuild's forked worker hands the new locations to the daemon as bytes,
    read back one by one as messages move (``Store.relocate_step``), never all at once."""

    __slots__ = ("_pos", "_rest")
    _SHIFT = TEXT_OFF_BITS + TEXT_LEN_BITS

    def __init__(self, pos: bytes, rest: bytes) -> None:
        # views of the bytes given, not copies (each copy of fresh memory is first touches: a cost)
        self._pos, self._rest = memoryview(pos).cast("Q"), memoryview(rest).cast("Q")
        if len(self._pos) != len(self._rest):
            raise ValueError("the two halves of packed locations differ in length")

    @classmethod
    def pack(cls, locs: list[int]) -> tuple[bytes, bytes]:
        shift, mask = cls._SHIFT, (1 << cls._SHIFT) - 1
        return array("Q", [loc >> shift for loc in locs]).tobytes(), array("Q", [loc & mask for loc in locs]).tobytes()

    def __len__(self) -> int:
        return len(self._pos)

    def __getitem__(self, i: int) -> int:
        return self._pos[i] << self._SHIFT | self._rest[i]


def span(loc: int) -> tuple[int, int]:
    """(file offset, byte length) of a location's text."""
    head = loc >> TEXT_LEN_BITS
    return (head >> TEXT_OFF_BITS) + (head & _OFF_MASK), loc & _LEN_MASK


class TextDamaged(OSError):
    """A message's record no longer passes its checksum (or its text is not where it was)."""


class LogText:
    """Reads message text from one log file by location. The store has one for its log, which every
    message it stores points at; after a compaction, the old log's reader serves the messages not yet
    moved to the new one (``Store.relocate_step``)."""

    __slots__ = ("io", "fd", "salt_crc", "on_damage")

    def __init__(self, io: FileIO, on_damage: Callable[[int, int], None] | None = None) -> None:
        self.io = io
        self.fd: int | None = None
        self.salt_crc = 0
        self.on_damage = on_damage  # (record position, record size) of a record that failed a check

    def open(self, path: str, salt: bytes) -> None:
        self.switch(self.io.open_read(path), salt)

    def switch(self, fd: int, salt: bytes) -> None:
        """Read from ``fd``, a log with ``salt``, from now on (the old descriptor is closed)."""
        old, self.fd, self.salt_crc = self.fd, fd, zlib.crc32(salt)
        if old is not None:
            self.io.close(old)

    def read(self, loc: int, rec_size: int) -> str:
        try:
            return self.read_utf8(loc, rec_size).decode("utf-8")
        except UnicodeDecodeError:  # cannot pass the checks below; kept an I/O error all the same
            raise TextDamaged(errno.EIO, "a message text in the log is not UTF-8") from None

    def read_utf8(self, loc: int, rec_size: int) -> bytes:
        """The text's bytes, from its record (``rec_size`` framed bytes) once its frame, salted
        checksum and the str header in front of the text are verified."""
        data, _payload, _pos, off, length = self._checked(loc, rec_size)
        return data[off:off + length]

    def read_record(self, loc: int, rec_size: int) -> list[Any]:
        """The whole record holding the text at ``loc``, decoded, with the same checks as ``read_utf8``
        and the record's shape (``records.check``); TextDamaged if any fails."""
        _data, payload, pos, _off, _length = self._checked(loc, rec_size)
        try:
            record = msgpack.unpackb(payload, raw=False, use_list=True)
        except Exception:
            record = None
        if records.check(record) is not None:
            if self.on_damage is not None:
                self.on_damage(pos, rec_size)
            raise TextDamaged(errno.EIO, f"the log record at byte {pos} holding a message is damaged")
        return record

    def _checked(self, loc: int, rec_size: int) -> tuple[bytes, memoryview, int, int, int]:
        """(the record's bytes, its payload, its position, the text's offset in it and its length), once
        the frame, salted checksum and the text's str header hold; TextDamaged if one does not."""
        if self.fd is None:
            raise OSError(errno.EBADF, "the log is not open for reading")
        head, length = loc >> TEXT_LEN_BITS, loc & _LEN_MASK
        pos, off = head >> TEXT_OFF_BITS, head & _OFF_MASK
        data = self.io.pread(self.fd, rec_size, pos)
        str_head = _str_head(length)
        payload = record_at(data, self.salt_crc, 0, len(data))
        if (payload is None or len(payload) != rec_size - FRAME_SIZE or off + length > rec_size
                or data[off - len(str_head):off] != str_head):
            if self.on_damage is not None:
                self.on_damage(pos, rec_size)
            raise TextDamaged(errno.EIO, f"the log record at byte {pos} holding a message text is damaged")
        return data, payload, pos, off, length

    def close(self) -> None:
        if self.fd is not None:
            self.io.close(self.fd)
            self.fd = None

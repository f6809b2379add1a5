"""The append-only log: a salted header, then length- and checksum-framed msgpack records.

Header (32 bytes): magic, format version, 16 random salt bytes, CRC32 of the above.
Record: ``u32 length | u32 crc32(salt + length + payload) | payload``. The checksum covers the
length, so a zero-filled tail never passes; it covers the salt, so a log (or a record) stored as
text inside a message can never be mistaken for a record of this log.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgpack

from protocol import limits as L

from . import layout, records
from .fileio import FileIO

MAGIC = b"CVMEMLOG"
FORMAT_VERSION = 2
SALT_BYTES = 16
HEADER = struct.Struct(f"<8sHH{SALT_BYTES}s")  # magic, version, reserved, salt
HEADER_SIZE = HEADER.size + 4               # + crc
FRAME = struct.Struct("<II")                # length, crc
FRAME_SIZE = FRAME.size
MAX_PAYLOAD = L.CONTENT_MAX_BYTES * 2 + 256 * 1024  # a 1 MiB message, its metadata, and slack


class LogCorrupt(Exception):
    pass


def new_salt() -> bytes:
    """The salt of a new log file (a first start, a rebuild's compacted log)."""
    return os.urandom(SALT_BYTES)


def make_header(salt: bytes) -> bytes:
    head = HEADER.pack(MAGIC, FORMAT_VERSION, 0, salt)
    return head + struct.pack("<I", zlib.crc32(head))


def parse_header(buf) -> bytes:
    """Return the salt, or raise LogCorrupt."""
    if len(buf) < HEADER_SIZE:
        raise LogCorrupt("log header is incomplete")
    head = bytes(buf[:HEADER.size])
    (crc,) = struct.unpack_from("<I", buf, HEADER.size)
    magic, version, _, salt = HEADER.unpack(head)
    if magic != MAGIC or zlib.crc32(head) != crc:
        raise LogCorrupt("log header is damaged (bad magic or checksum)")
    if version != FORMAT_VERSION:
        raise LogCorrupt(f"log format version {version} is not supported (expected {FORMAT_VERSION})")
    return salt


def frame(salt: bytes, payload: bytes) -> bytes:
    length = struct.pack("<I", len(payload))
    crc = zlib.crc32(payload, zlib.crc32(length, zlib.crc32(salt)))
    return length + struct.pack("<I", crc) + payload


def encode_record(salt: bytes, record: list[Any]) -> bytes:
    return frame(salt, msgpack.packb(record, use_bin_type=True))


def record_at(buf, salt_crc: int, pos: int, end: int):
    """The payload view of a record at ``pos`` whose frame and checksum hold, or None."""
    if pos + FRAME_SIZE > end:
        return None
    length, crc = FRAME.unpack_from(buf, pos)
    if length == 0 or length > MAX_PAYLOAD or pos + FRAME_SIZE + length > end:
        return None
    payload = memoryview(buf)[pos + FRAME_SIZE: pos + FRAME_SIZE + length]
    if zlib.crc32(payload, zlib.crc32(buf[pos:pos + 4], salt_crc)) != crc:
        return None
    return payload


def _valid_at(buf, salt_crc: int, pos: int, end: int):
    """``(framed size, record)`` of a valid record at ``pos``, or None: the one validity rule of the
    in-order scan and of the resync. Valid means the frame and checksum hold, the payload decodes,
    and ``records.check`` accepts its shape (an unknown tag or a wrong shape is damage, not a
    record to skip or to apply half-way)."""
    payload = record_at(buf, salt_crc, pos, end)
    if payload is None:
        return None
    try:
        record = msgpack.unpackb(payload, raw=False, use_list=True)
    except Exception:
        return None
    if records.check(record) is not None:
        return None
    return FRAME_SIZE + len(payload), record


@dataclass
class ScanResult:
    """Where a scan of the log stopped and why."""
    end: int = HEADER_SIZE              # offset after the last good record read in order
    torn_tail: bool = False             # unreadable bytes at the very end (safe to cut off)
    records: int = 0
    # (start, resume) of each unreadable stretch followed by good records; a salvage skips them all
    damage_ranges: list[tuple[int, int]] = field(default_factory=list)

    @property
    def damage(self) -> tuple[int, int] | None:
        return self.damage_ranges[0] if self.damage_ranges else None


def next_valid(buf, salt: bytes, start: int, end: int) -> int | None:
    """The first offset after ``start`` at which a valid record begins (the resync a salvage needs)."""
    salt_crc = zlib.crc32(salt)
    for pos in range(start + 1, end - FRAME_SIZE + 1):
        if _valid_at(buf, salt_crc, pos, end) is not None:
            return pos
    return None


def scan(buf, salt: bytes, start: int, result: ScanResult, resync: bool = False) -> Iterator[tuple[int, int, Any]]:
    """Yield (offset, framed size, decoded record) from ``start``. Fills ``result`` as it goes.

    Without ``resync`` the scan stops at the first bad record: if nothing valid follows it, it is a
    torn tail; if a valid record follows, the log is damaged in the middle and nothing after the
    damage is guessed over. With ``resync`` (salvage) it skips the damage and goes on.
    """
    end = len(buf)
    salt_crc = zlib.crc32(salt)
    pos = start
    result.end = pos
    while pos < end:
        valid = _valid_at(buf, salt_crc, pos, end)
        if valid is None:
            resume = next_valid(buf, salt, pos, end)
            if resume is None:
                result.torn_tail = True
                return
            result.damage_ranges.append((pos, resume))
            if not resync:
                return
            pos = resume
            continue
        size, record = valid
        yield pos, size, record
        pos += size
        result.records += 1
        result.end = pos


class LogWriter:
    """Appends records durably: a reply is sent only after ``append`` returned."""

    def __init__(self, io: FileIO, path: str, salt: bytes, size: int) -> None:
        self.io = io
        self.path = path
        self.salt = salt
        self.size = size
        self.fd = io.open_append(path)

    @classmethod
    def create(cls, io: FileIO, path: str) -> "LogWriter":
        """A new, empty log with a fresh salt, made durable before it is used."""
        salt = new_salt()
        tmp = path + layout.NEW_SUFFIX
        fd = io.open_new(tmp)
        try:
            io.write(fd, make_header(salt))
            io.sync(fd)
        finally:
            io.close(fd)
        io.replace(tmp, path)  # a crash before this leaves no log at all, never half a header
        io.sync_dir(os.path.dirname(path) or ".")
        return cls(io, path, salt, HEADER_SIZE)

    def append(self, data: bytes, sync: bool = True) -> int:
        """Write and fdatasync; on failure cut the file back so no partial record stays behind.

        Returns the offset the record was written at. Raises OSError if the write or the sync
        failed (the record is then not in the log); raises LogWriterBroken if even the cut-back
        failed, after which nothing more may be appended. ``sync=False`` (group commit) leaves the
        fdatasync to a later ``sync()`` that covers every record appended since.
        """
        offset = self.size
        try:
            self.io.write(self.fd, data)
            if sync:
                self.io.sync(self.fd)
        except OSError:
            try:
                self.io.truncate(self.fd, offset)
                self.io.sync(self.fd)
            except OSError as exc:
                raise LogWriterBroken(f"log could not be restored after a failed append: {exc}") from exc
            raise
        self.size = offset + len(data)
        return offset

    def sync(self) -> None:
        self.io.sync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            self.io.close(self.fd)
            self.fd = None


class LogWriterBroken(OSError):
    pass

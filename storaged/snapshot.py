"""The snapshot: the whole in-memory state at one log position, so start-up need not replay it all.

It is only an accelerator — the log alone always holds the full state — so a snapshot that fails
its checksum, or that belongs to another log (a different salt), is ignored and the log replayed.

Layout: ``magic | version`` then a stream of msgpack objects (meta, message chunks, search index),
then a trailer ``u64 body length | u32 crc32(body) | end magic``. Written in chunks (so a rebuild
worker never holds the GIL for long) to a temporary file, fsync'ed, renamed into place.
"""
from __future__ import annotations

import itertools
import os
import struct
import zlib
from typing import Any, Iterable, Iterator

import msgpack

from . import layout
from .fileio import FileIO, Paced

MAGIC = b"CVMEMSNP"
END_MAGIC = b"CVMEMEND"
# 4: a message row holds its text's location in the log (storaged/text.py) in place of the text.
# 3 (rows with the text, event fields, session metadata, checkpoints) and 2 (release 0.1: rows of 16
# fields) cannot be used: they do not say where each text lies in the log. A store that has one
# replays its log once and writes a current one (Store._migrate_snapshot): that is the migration.
# 5: the search index dump names the segment files that hold most postings (storaged/segment.py); a
# 4 is read as one without segments (its dump holds every posting), so it needs no migration, but a
# daemon of the release before refuses a 5 (it would read an index without the segments' postings).
VERSION = 5
READABLE_VERSIONS = (4, 5)
OUTDATED_VERSIONS = (2, 3)
HEAD = struct.Struct("<8sHH")
TRAILER = struct.Struct("<QI8s")
CHUNK = 4096
WRITE_AT = 1 << 20  # bytes gathered before a write (each write lets the GIL go)


class SnapshotInvalid(Exception):
    pass


class SnapshotOutdated(SnapshotInvalid):
    """A sound snapshot of an earlier format: replay the log instead, then write the current one."""


def write(io: FileIO, path: str, meta: dict[str, Any], messages: Iterable[list[Any]], search_dump: Any) -> int:
    """Write atomically (temporary file, fsync, rename, fsync the directory); returns the size."""
    tmp = path + layout.TMP_SUFFIX
    size = write_file(io, tmp, meta, messages, search_dump)
    io.replace(tmp, path)
    io.sync_dir(os.path.dirname(path) or ".")
    return size


def write_file(io: FileIO, tmp: str, meta: dict[str, Any], messages: Iterable[list[Any]], search_dump: Any) -> int:
    """Write and fsync ``tmp`` (not yet in place). ``meta`` gains ``chunks``."""
    packer = msgpack.Packer(use_bin_type=True)
    chunks: list[bytes] = []
    batch: list[list[Any]] = []
    for fields in messages:
        batch.append(fields)
        if len(batch) >= CHUNK:
            chunks.append(packer.pack(batch))
            batch = []
    if batch:
        chunks.append(packer.pack(batch))
    meta = dict(meta, chunks=len(chunks))
    fd = io.open_new(tmp)
    crc = 0
    length = 0
    try:
        out = Paced(io, fd)
        out.write(HEAD.pack(MAGIC, VERSION, 0))
        pending: list[bytes | memoryview] = []
        pending_len = 0
        for part in itertools.chain((packer.pack(meta), *chunks), pack_pieces(packer, search_dump)):
            crc = zlib.crc32(part, crc)
            length += len(part)
            pending.append(part)
            pending_len += len(part)
            if pending_len >= WRITE_AT:
                out.write(pending[0] if len(pending) == 1 else b"".join(pending))
                pending, pending_len = [], 0
        pending.append(TRAILER.pack(length, crc, END_MAGIC))
        out.write(b"".join(pending))
        io.sync(fd)
    finally:
        io.close(fd)
    return HEAD.size + length + TRAILER.size


def pack_pieces(packer: msgpack.Packer, obj: Any) -> Iterator[bytes | memoryview]:
    """``packer.pack(obj)``'s bytes in pieces of at most about WRITE_AT, the big binary values not
    copied: a search index's dump holds hundreds of MiB of them, and packing it whole was one C call
    that held the GIL for seconds while a rebuild's worker wrote its snapshot beside the request loop
    (and needed a copy of it all in memory)."""
    if isinstance(obj, dict):
        yield packer.pack_map_header(len(obj))
        for key, value in obj.items():
            yield packer.pack(key)
            yield from pack_pieces(packer, value)
    elif isinstance(obj, (list, tuple)):
        yield packer.pack_array_header(len(obj))
        for item in obj:
            yield from pack_pieces(packer, item)
    elif isinstance(obj, (bytes, bytearray, memoryview)) and memoryview(obj).nbytes > WRITE_AT:
        view = memoryview(obj).cast("B")
        n = len(view)
        yield b"\xc6" + n.to_bytes(4, "big")  # msgpack's bin 32 header (n > WRITE_AT > 0xFFFF)
        for at in range(0, n, WRITE_AT):
            yield view[at:at + WRITE_AT]
    elif isinstance(obj, str) and len(obj) > WRITE_AT:  # the index's terms: ~30 MB at 200k messages
        step = WRITE_AT // 4  # characters: at most 4 bytes each
        pieces = [obj[at:at + step].encode("utf-8") for at in range(0, len(obj), step)]
        yield b"\xdb" + sum(map(len, pieces)).to_bytes(4, "big")  # msgpack's str 32 header
        yield from pieces
    else:
        yield packer.pack(obj)


class Reader:
    """An open, verified snapshot, decoded on demand: ``meta`` and ``search_dump`` at once, the
    message rows a chunk at a time (``chunks``). At 275k messages, decoding every row into one list
    before building the messages held 440 MiB of msgpack objects at the peak, and the allocator kept
    most of it after they were freed (they lay between the messages built from them): one chunk at a
    time, the garbage of each is reused by the next. The file is mapped, not copied into an Unpacker's
    buffer. Close it (or use ``with``) when done."""

    def __init__(self, io: FileIO, path: str) -> None:
        self._buf = io.read_all(path)
        try:
            self._body = _verified_body(self._buf)
            self._offset = 0
            unpacker = self._unpacker()
            self.meta: dict[str, Any] = unpacker.unpack()
            self._rows_at = unpacker.tell()
            for _ in range(self.meta["chunks"]):
                unpacker.skip()
            self.search_dump: Any = unpacker.unpack()
        except SnapshotInvalid:
            self.close()
            raise
        except Exception as exc:  # a checksum collision or a bug must not stop the start: replay instead
            self.close()
            raise SnapshotInvalid(f"snapshot could not be decoded: {type(exc).__name__}") from None

    def _unpacker(self, at: int = 0) -> msgpack.Unpacker:
        limit = len(self._body) + 1
        return msgpack.Unpacker(_Slices(self._body, at), raw=False, use_list=True,
                                read_size=min(WRITE_AT, limit), max_buffer_size=limit)

    def chunks(self) -> Iterator[list[list[Any]]]:
        """The message rows (field lists, in creation order), a chunk (at most CHUNK rows) at a time;
        raises SnapshotInvalid if one cannot be decoded."""
        unpacker = self._unpacker(self._rows_at)
        for _ in range(self.meta["chunks"]):
            try:
                chunk = unpacker.unpack()
            except Exception as exc:
                raise SnapshotInvalid(f"snapshot could not be decoded: {type(exc).__name__}") from None
            if not isinstance(chunk, list):
                raise SnapshotInvalid("snapshot message chunk is not a list")
            yield chunk

    def close(self) -> None:
        body, self._body = getattr(self, "_body", None), None
        if body is not None:
            body.release()
        if hasattr(self._buf, "close"):
            self._buf.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Slices:
    """A read-only file over a buffer, for msgpack's streaming Unpacker: each ``read`` copies only
    what it returns (``Unpacker.feed`` copies the whole buffer)."""

    def __init__(self, view: memoryview, at: int) -> None:
        self._view = view
        self._at = at

    def read(self, n: int = -1) -> bytes:
        at = self._at
        end = len(self._view) if n < 0 else min(len(self._view), at + n)
        self._at = end
        return bytes(self._view[at:end])


def _verified_body(buf) -> memoryview:
    """The body between head and trailer, once its magic numbers, version, length and checksum hold."""
    if len(buf) < HEAD.size + TRAILER.size:
        raise SnapshotInvalid("snapshot is too short")
    magic, version, _ = HEAD.unpack_from(buf, 0)
    length, crc, end_magic = TRAILER.unpack_from(buf, len(buf) - TRAILER.size)
    if magic != MAGIC or end_magic != END_MAGIC:
        raise SnapshotInvalid("snapshot has a bad magic number")
    if version in OUTDATED_VERSIONS:
        raise SnapshotOutdated(f"snapshot format {version} predates text read from the log")
    if version not in READABLE_VERSIONS:
        raise SnapshotInvalid(f"snapshot format {version} is not known")
    if HEAD.size + length + TRAILER.size != len(buf):
        raise SnapshotInvalid("snapshot length does not match its trailer")
    body = memoryview(buf)[HEAD.size: HEAD.size + length]
    if zlib.crc32(body) != crc:
        body.release()
        raise SnapshotInvalid("snapshot checksum does not match")
    return body


def read(io: FileIO, path: str) -> tuple[dict[str, Any], list[list[Any]], Any]:
    """(meta, every message's field list, search dump) at once, for tools and tests; raises
    SnapshotInvalid. The store streams its rows instead (``Reader``)."""
    with Reader(io, path) as reader:
        messages = [row for chunk in reader.chunks() for row in chunk]
        return reader.meta, messages, reader.search_dump

"""The snapshot: the whole in-memory state at one log position, so start-up need not replay it all.

It is only an accelerator — the log alone always holds the full state — so a snapshot that fails
its checksum, or that belongs to another log (a different salt), is ignored and the log replayed.

Layout: ``magic | version`` then a stream of msgpack objects (meta, message chunks, search index),
then a trailer ``u64 body length | u32 crc32(body) | end magic``. Written in chunks (so a rebuild
worker never holds the GIL for long) to a temporary file, fsync'ed, renamed into place.

Since version 6 the snapshot is a manifest: its message rows are in row segments
(``rows.<16 hex>.seg``, ``write_rows``), immutable files it names in ``meta["rows"]``, oldest first.
The first holds every row of its time (a base); each later one only the rows written or changed
since the one before it and the seqs deleted since (a delta). A snapshot therefore writes what
changed, not every row: at 5M messages a full rewrite is over a gigabyte, and that is what kept
snapshots rare and the tail a start after a crash replays long. A reader merges them by seq, the
newest row of a seq winning (``Reader.rows``).
"""
from __future__ import annotations

import heapq
import itertools
import os
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, NamedTuple

import msgpack
import numpy as np

from . import layout, packedmap
from .fileio import FileIO, Paced
from .segment import is_rows_segment_name, new_name as new_segment_name

MAGIC = b"CVMEMSNP"
END_MAGIC = b"CVMEMEND"
# 4: a message row holds its text's location in the log (storaged/text.py) in place of the text.
# 3 (rows with the text, event fields, session metadata, checkpoints) and 2 (release 0.1: rows of 16
# fields) cannot be used: they do not say where each text lies in the log. A store that has one
# replays its log once and writes a current one (Store._migrate_snapshot): that is the migration.
# 5: the search index dump names the segment files that hold most postings (storaged/segment.py); a
# 4 is read as one without segments (its dump holds every posting), so it needs no migration, but a
# daemon of the release before refuses a 5 (it would read an index without the segments' postings).
# 6: the rows are in row segments the manifest names (``meta["rows"]``); a 6 may still hold its rows
# inline (tools and tests write those), read as a 5 is. A daemon of the release before refuses a 6.
VERSION = 6
READABLE_VERSIONS = (4, 5, 6)
ROWS_MAGIC = b"CVMEMROW"
# Row segments: 1 holds msgpack rows (Message.row); 2 holds the message table's packed rows as they
# are in memory (storaged/columns.py), loaded by a few numpy copies instead of a Python call a row; 3
# holds the narrower row of 85 bytes (the id as its 128-bit number, a 32-bit revision and record size,
# an 8-bit importance; what does not fit in the sparse ``wide``); 4 holds the exts with files as raw
# sections of packed entries (storaged/extfiles.py) where 3 had them as lists in its head. All are read;
# 4 is written. A snapshot with a version 1 segment is loaded row by row, a version 2 one converted in
# numpy (columns.segment_rows), a version 3 one's exts taken from its head; either way the next snapshot
# writes a base of the current version (Store.rows_legacy).
ROWS_VERSION = 4
ROWS_VERSION_3 = 3
ROWS_VERSION_2 = 2
ROWS_VERSION_1 = 1
ROWS_VERSIONS = (ROWS_VERSION_1, ROWS_VERSION_2, ROWS_VERSION_3, ROWS_VERSION)
# raw bytes after the head, in this order (version 2 and 3: the first six)
_COLUMN_SECTIONS = ("seqs", "rows", "etype", "tcid", "keys", "key_seqs", "ext_seqs", "ext_ends", "ext_values")
_SECTIONS_V3 = _COLUMN_SECTIONS[:6]
SECTION_ALIGN = 8   # version 4: each section begins at a file offset that is a multiple of this
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
    """Write and fsync ``tmp`` (not yet in place). ``meta`` gains ``chunks``. The store writes
    manifests (no ``messages``; ``meta["rows"]`` names the row segments); rows given here are
    inline, and ``meta["rows"]`` is then dropped."""
    packer = msgpack.Packer(use_bin_type=True)
    chunks = list(_chunks(packer, messages))
    meta = dict(meta, chunks=len(chunks))
    if chunks:
        meta.pop("rows", None)
    return _write_framed(io, tmp, MAGIC, VERSION, itertools.chain(
        (packer.pack(meta), *chunks), pack_pieces(packer, search_dump)))


def _chunks(packer: msgpack.Packer, rows: Iterable[list[Any]]) -> Iterator[bytes]:
    batch: list[list[Any]] = []
    for fields in rows:
        batch.append(fields)
        if len(batch) >= CHUNK:
            yield packer.pack(batch)
            batch = []
    if batch:
        yield packer.pack(batch)


def rows_name() -> str:
    """A fresh row segment's name (segment.new_name's rule)."""
    return new_segment_name(layout.ROWS_PREFIX)


def _section_offsets(at: int, lengths: dict[str, Any], names: Iterable[str], aligned: bool) -> tuple[dict[str, int], int]:
    """Where a row segment's raw sections ``names`` begin in its body, the head ending at ``at`` (body
    offsets; ``lengths``: the head's ``<name>_bytes``), and where the last ends: each after the one
    before, from version 4 on (``aligned``) at a file offset that is a multiple of SECTION_ALIGN.
    KeyError / TypeError if the head does not say how long one is."""
    offsets = {}
    for name in names:
        n = lengths[f"{name}_bytes"]
        if not isinstance(n, int) or n < 0:
            raise TypeError(f"{name}_bytes is {n!r}")
        if aligned:
            at += -(HEAD.size + at) % SECTION_ALIGN
        offsets[name] = at
        at += n
    return offsets, at


class RowsSections(NamedTuple):
    """Where a base's rows and id keys lie in its file (rows_sections_at)."""
    identity: tuple[int, int, int]   # the file's (st_dev, st_ino, st_size)
    rows_at: int                     # file offsets of the rows, the keys and their seqs sections
    own: bool                        # numbered as the table that wrote it (columns.OWN_NUMBERING)
    keys_at: int
    key_seqs_at: int
    keys: int                        # how many keys


def rows_sections_at(io: FileIO, path: str, first: int, end: int) -> RowsSections:
    """Where the sections lie in the current version's row segment at ``path`` of the seqs ``first`` to
    ``end`` without a gap (its seqs section's ends say so), and whether it is numbered as the table
    that wrote it (its head's first entry: ``columns.OWN_NUMBERING``), found by skipping the rest of its
    head but the sections' lengths (not decoding it: a base's head lists every session id). What the
    daemon that had the base written needs to map its rows and id keys (MessageTable.rebase_open);
    SnapshotInvalid if the file cannot be that segment."""
    from .columns import OWN_NUMBERING, ROW_DTYPE
    name = os.path.basename(path)
    buf = io.read_all(path)
    body = None
    try:
        st = os.stat(path)
        version, body, _ = _framed_body(buf, ROWS_MAGIC, ROWS_VERSIONS)
        count = end - first
        if version != ROWS_VERSION or count <= 0:
            raise SnapshotInvalid(f"row segment {name} is not of version {ROWS_VERSION}")
        unpacker = msgpack.Unpacker(_Slices(body, 0), read_size=min(WRITE_AT, len(body) + 1),
                                    max_buffer_size=len(body) + 1)
        own = False
        lengths: dict[str, Any] = {}
        sized = {f"{section}_bytes" for section in _COLUMN_SECTIONS}
        try:
            entries = unpacker.read_map_header()
            for i in range(entries):
                key = unpacker.unpack()
                if i == 0 and key == OWN_NUMBERING:
                    own = unpacker.unpack() is True
                elif key in sized:
                    lengths[key] = unpacker.unpack()
                else:
                    unpacker.skip()
        except Exception as exc:
            raise SnapshotInvalid(f"row segment {name} has a bad head: {type(exc).__name__}") from None
        at = unpacker.tell()
        del unpacker
        try:
            offsets, end_at = _section_offsets(at, lengths, _COLUMN_SECTIONS, aligned=True)
        except (KeyError, TypeError):
            raise SnapshotInvalid(f"row segment {name} does not say how long its sections are") from None
        seqs_at, rows_at = offsets["seqs"], offsets["rows"]
        if end_at > len(body) or lengths["seqs_bytes"] != 8 * count or lengths["rows_bytes"] != count * ROW_DTYPE.itemsize \
                or lengths["keys_bytes"] != lengths["key_seqs_bytes"] or lengths["keys_bytes"] % 8:
            raise SnapshotInvalid(f"row segment {name}'s sections are not those of {count} rows")
        ends = (int.from_bytes(body[seqs_at:seqs_at + 8], "little"),
                int.from_bytes(body[seqs_at + 8 * (count - 1):seqs_at + 8 * count], "little"))
        if ends != (first, end - 1):   # (each row is then compared with the table's: MessageTable.rebase_step)
            raise SnapshotInvalid(f"row segment {name} does not hold seqs {first} to {end - 1}")
        nkeys = lengths["keys_bytes"] // 8
        return RowsSections((st.st_dev, st.st_ino, st.st_size), HEAD.size + rows_at, own,
                            HEAD.size + offsets["keys"], HEAD.size + offsets["key_seqs"], nkeys)
    finally:
        if body is not None:
            body.release()
        if hasattr(buf, "close"):
            try:
                buf.close()
            except BufferError:   # (a traceback's frame holds a view: the mapping goes with it)
                pass


def write_rows(io: FileIO, path: str, rows: Iterable[list[Any]], dead: Iterable[int], base: bool,
               session_meta: Iterable[list[Any]] = (), checkpoints: Iterable[list[Any]] = ()) -> int:
    """Write and fsync a version 1 row segment at ``path`` (a new name; the directory's fsync is the
    caller's) — what the release before wrote; the store writes version 2 (``write_row_columns``), and
    this stays so that the tests can make the older form a start must still read:
    ``rows`` in seq order, then ``dead``, the seqs deleted since the segment before it. A delta
    (not ``base``) also lists its rows' seqs, so that a reader knows which rows of older segments it
    replaces before decoding any. Streamed: a base at 5M rows is never in memory at once. Returns
    the number of rows. ``session_meta`` ([sid, fields, rec_size]) and ``checkpoints`` ([source, key,
    value, rec_size], value nil: forgotten) go in the tail too: every one in a base, in a delta those
    that changed since the segment before (a reader applies them in order).

    Body: ``chunk* [] tail`` — the chunks, an empty one ending them, and ``tail = {"rows": n,
    "dead": [seq*], "seqs": [seq*] | nil, "session_meta": [...], "checkpoints": [...]}``; framed like a
    snapshot with ``ROWS_MAGIC``."""
    packer = msgpack.Packer(use_bin_type=True)
    seqs: list[int] = []
    count = 0

    def counted() -> Iterator[list[Any]]:
        nonlocal count
        for row in rows:
            count += 1
            if not base:
                seqs.append(row[2])
            yield row

    def parts() -> Iterator[bytes]:
        yield from _chunks(packer, counted())
        yield packer.pack([])
        yield packer.pack({"rows": count, "dead": list(dead), "seqs": None if base else seqs,
                           "session_meta": list(session_meta), "checkpoints": list(checkpoints)})

    _write_framed(io, path, ROWS_MAGIC, ROWS_VERSION_1, parts())
    return count


def _packed(value: Any) -> bytes:
    """A tail value as msgpack bytes (PackedMap's form; bytes given are taken as packed already)."""
    return value if value.__class__ is bytes else packedmap.pack(value)


def write_row_columns(io: FileIO, path: str, columns: dict[str, Any], dead: Iterable[int],
                      session_meta: Iterable[list[Any]] = (), checkpoints: Iterable[list[Any]] = ()) -> int:
    """Write and fsync a row segment of the current version at ``path``: the rows ``MessageTable.segment_columns``
    gave, then the tail (as ``write_rows``'; its ``seqs`` is nil: they are a column). Returns the
    number of rows.

    Body: ``head seqs rows etype tcid keys key_seqs ext_seqs ext_ends ext_values tail`` — ``head`` a
    msgpack map of every column that is not raw bytes plus each raw section's length (``<name>_bytes``);
    the sections raw, each at a file offset that is a multiple of 8 (zero bytes pad the gaps), so a reader
    maps them in place and the 64-bit ones are aligned arrays; ``tail`` as in version 1."""
    packer = msgpack.Packer(use_bin_type=True)
    count = len(columns["seqs"]) // 8
    # the tail's values as msgpack bytes (version 3): a start keeps them packed (storaged/packedmap.py)
    # instead of building a dict of each to pack it again
    session_meta = [[sid, _packed(fields), size, *hot] for sid, fields, size, *hot in session_meta]
    checkpoints = [[src, key, None if value is None else _packed(value), size] for src, key, value, size in checkpoints]
    head = {key: value for key, value in columns.items() if key not in _COLUMN_SECTIONS}
    head.update({f"{name}_bytes": len(columns[name]) for name in _COLUMN_SECTIONS})

    def parts() -> Iterator[bytes | memoryview]:
        packed = packer.pack(head)
        yield packed
        pos = HEAD.size + len(packed)
        for name in _COLUMN_SECTIONS:
            if pos % SECTION_ALIGN:
                yield bytes(SECTION_ALIGN - pos % SECTION_ALIGN)
                pos += SECTION_ALIGN - pos % SECTION_ALIGN
            view = memoryview(columns[name]).cast("B")
            for at in range(0, len(view), WRITE_AT):
                yield view[at:at + WRITE_AT]
            pos += len(view)
        yield packer.pack({"rows": count, "dead": list(dead), "seqs": None,
                           "session_meta": list(session_meta), "checkpoints": list(checkpoints)})

    _write_framed(io, path, ROWS_MAGIC, ROWS_VERSION, parts())
    return count


def _write_framed(io: FileIO, path: str, magic: bytes, version: int, parts: Iterable[bytes | memoryview]) -> int:
    """``head body trailer`` to a new file ``path``, paced and fsynced; returns its size."""
    fd = io.open_new(path)
    crc = 0
    length = 0
    try:
        out = Paced(io, fd)
        out.write(HEAD.pack(magic, version, 0))
        pending: list[bytes | memoryview] = []
        pending_len = 0
        for part in parts:
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
    message rows one at a time (``rows``). At 275k messages, decoding every row into one list
    before building the messages held 440 MiB of msgpack objects at the peak, and the allocator kept
    most of it after they were freed (they lay between the messages built from them): a chunk at a
    time, the garbage of each is reused by the next. The files are mapped, not copied into an
    Unpacker's buffer. Every row segment the manifest names is opened here and its checksum begun
    on another thread; the rows wait for it (``_rows_checked``), so a missing or damaged one makes
    the whole snapshot invalid before any row is read. Close it (or use ``with``) when done."""

    def __init__(self, io: FileIO, path: str) -> None:
        self._file = _Framed(io, path, MAGIC)
        self.segments: list[_RowSegment] = []
        try:
            unpacker = self._file.unpacker()
            self.meta: dict[str, Any] = unpacker.unpack()
            self._rows_at = unpacker.tell()
            for _ in range(self.meta["chunks"]):
                unpacker.skip()
            self.search_dump: Any = unpacker.unpack()
            # [[name, rows, dead], ...] oldest first (a base, then deltas); None: the rows are inline
            self.row_segments: list[list[Any]] | None = None
            if self._file.version >= 6 and not self.meta["chunks"] and "rows" in self.meta:
                self.row_segments = [[str(name), int(n), int(dead)] for name, n, dead in self.meta["rows"]]
                if not self.row_segments:
                    raise SnapshotInvalid("snapshot names no row segment")
                directory = os.path.dirname(path) or "."
                for name, n, dead in self.row_segments:
                    if not is_rows_segment_name(name) or os.sep in name:
                        raise SnapshotInvalid(f"snapshot names a row segment {name!r} outside the directory")
                    segment = _RowSegment(io, os.path.join(directory, name))
                    self.segments.append(segment)
                    if segment.tail["rows"] != n or len(segment.tail["dead"]) != dead:
                        raise SnapshotInvalid(f"row segment {name} holds {segment.tail['rows']} rows and "
                                              f"{len(segment.tail['dead'])} dead seqs, not {n} and {dead}")
        except SnapshotInvalid:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise SnapshotInvalid(f"a row segment could not be read ({exc.strerror or exc})") from None
        except Exception as exc:  # a checksum collision or a bug must not stop the start: replay instead
            self.close()
            raise SnapshotInvalid(f"snapshot could not be decoded: {type(exc).__name__}") from None

    def rows(self) -> Iterator[list[Any]]:
        """The message rows (field lists) in seq order, the newest of each seq; raises
        SnapshotInvalid if one cannot be decoded (or a row segment fails its checksum)."""
        self._rows_checked()
        if self.row_segments is None:
            for chunk in _decoded(self._file.unpacker(self._rows_at), self.meta["chunks"]):
                yield from chunk
            return
        base, deltas = self.segments[0], self.segments[1:]
        # which delta holds each seq's newest row, and after which segment a seq is deleted: deltas
        # are small (at most half the base), so this is cheap
        newest: dict[int, int] = {}
        killed: dict[int, int] = {}
        for i, segment in enumerate(deltas, 1):
            for seq in segment.seqs():
                newest[seq] = i
            for seq in segment.tail["dead"]:
                killed[seq] = i
        if not newest and not killed:  # a base alone (a start after a rebuild or a fold)
            for chunk in base.chunks():
                yield from chunk
            return

        def winners(i: int, segment: _RowSegment) -> Iterator[list[Any]]:
            for chunk in segment.chunks():
                for row in chunk:
                    seq = row[2]
                    if newest[seq] == i and killed.get(seq, -1) < i:
                        yield row

        # The base a chunk at a time, less the seqs a delta replaces or deletes (a set test per row, in
        # a comprehension); the deltas' rows, merged by seq among themselves, are sorted into the chunk
        # whose seqs they fall among. Merging every base row through heapq cost ~2 µs a row.
        drop = newest.keys() | killed.keys()
        extra = heapq.merge(*(winners(i, segment) for i, segment in enumerate(deltas, 1)), key=_seq_of)
        pending = next(extra, None)
        for chunk in base.chunks():
            rows = [row for row in chunk if row[2] not in drop]
            if not rows:
                continue
            last = rows[-1][2]
            if pending is not None and pending[2] <= last:
                while pending is not None and pending[2] <= last:
                    rows.append(pending)
                    pending = next(extra, None)
                rows.sort(key=_seq_of)
            yield from rows
        while pending is not None:
            yield pending
            pending = next(extra, None)

    def columnar(self) -> bool:
        """Every row is in row segments of version 2 or later: ``column_segments`` can load them without rows."""
        return self.row_segments is not None and all(segment.columns is not None for segment in self.segments)

    def rows_outdated(self) -> bool:
        """A row segment of an earlier version is in use (the next snapshot writes a current base)."""
        return self.row_segments is not None and any(s._file.version != ROWS_VERSION for s in self.segments)

    def base_gapped(self) -> bool:
        """The base lists its live rows only, with a gap before or between them (its first seq past 1:
        the store never uses seq 0): written before bases held their dead rows (docs/format.md §4.1), or
        of a store mostly deleted. A start copies its rows (or, for a gap before them alone, maps them
        only while the bytes before its rows section cover the first seq's rows)."""
        if not self.segments or self.segments[0].columns is None:
            return False
        seqs = self.segments[0].columns["seqs"]
        n = len(seqs) // 8
        if not n:
            return False
        first, last = int.from_bytes(seqs[:8], "little"), int.from_bytes(seqs[8 * (n - 1):8 * n], "little")
        return first > 1 or last - first + 1 != n

    def _rows_checked(self) -> None:
        """Wait for the row segments' checksums (begun at open, on other threads); SnapshotInvalid if
        one fails. Their heads and tails were decoded before (``session_meta``, ``checkpoints`` may be
        read meanwhile): whoever applied them starts again from a fresh state on that error, as the
        store does (``Store._load_snapshot``)."""
        for segment in self.segments:
            segment._file.checked()

    def column_segments(self) -> list[tuple[dict[str, Any], list[int]]]:
        """(columns, dead seqs) of each row segment, oldest first, for ``MessageTable.load_segments``;
        the raw columns are views of the mapped files, valid until ``close``. SnapshotInvalid if a
        row segment fails its checksum."""
        self._rows_checked()
        return [(segment.columns, segment.tail["dead"]) for segment in self.segments]

    def session_meta(self) -> list[list[Any]]:
        """[sid, fields, rec_size] of every session's metadata, to apply in order (a later one of a
        sid replaces an earlier one): the row segments' tails oldest first, or the manifest's own."""
        if self.row_segments is None:
            return self.meta.get("session_meta", [])
        return [entry for segment in self.segments for entry in segment.tail.get("session_meta", ())]

    def checkpoints(self) -> list[list[Any]]:
        """[source, key, value, rec_size] of the ingesters' checkpoints, to apply in order (value nil:
        forgotten), from the same place as ``session_meta``."""
        if self.row_segments is None:
            return self.meta.get("checkpoints", [])
        return [entry for segment in self.segments for entry in segment.tail.get("checkpoints", ())]

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self._file.close()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seq_of(row: list[Any]) -> int:
    return row[2]


class _RowSegment:
    """One row segment (``write_rows``, ``write_row_columns``), verified and its tail read at open.
    A version 1 segment's chunks are skipped, not decoded (decoding a base's millions of rows here,
    and again when they are loaded, doubled the start's decoding); a version 2 segment's head is
    decoded and its raw sections become views of the mapping (``columns``)."""

    def __init__(self, io: FileIO, path: str) -> None:
        self._file = _Framed(io, path, ROWS_MAGIC, ROWS_VERSIONS, crc_later=True)
        self.columns: dict[str, Any] | None = None
        try:
            unpacker = self._file.unpacker()
            if self._file.version == 1:
                while n := unpacker.read_array_header():
                    for _ in range(n):
                        unpacker.skip()
            else:
                head = unpacker.unpack()
                at = unpacker.tell()
                # self's at once, so that close releases whatever views of the mapping were made
                self.columns = dict(head)
                self.columns["version"] = self._file.version   # the row's layout (columns.segment_rows)
                aligned = self._file.version >= ROWS_VERSION
                names = _COLUMN_SECTIONS if aligned else _SECTIONS_V3
                starts, at = _section_offsets(at, head, names, aligned)
                offsets = {}
                for name in names:
                    self.columns[name] = self._file.view(starts[name], head[f"{name}_bytes"])
                    offsets[name] = HEAD.size + starts[name]
                if self._file.version >= ROWS_VERSION_3:
                    # which file this is and where its sections lie: the table may map some (columns.py)
                    st = os.stat(path)
                    self.columns["file"] = (path, (st.st_dev, st.st_ino, st.st_size), offsets)
                unpacker = self._file.unpacker(at)
            self.tail: dict[str, Any] = unpacker.unpack()
            if not isinstance(self.tail.get("rows"), int) or not isinstance(self.tail.get("dead"), list):
                raise SnapshotInvalid(f"row segment {os.path.basename(path)} has a bad tail")
        except SnapshotInvalid:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise SnapshotInvalid(f"row segment {os.path.basename(path)} could not be decoded: "
                                  f"{type(exc).__name__}") from None

    def chunks(self) -> Iterator[list[list[Any]]]:
        if self.columns is not None:
            from .columns import rows_from_columns
            rows = rows_from_columns(self.columns)
            for at in range(0, len(rows), CHUNK):
                yield rows[at:at + CHUNK]
            return
        yield from _decoded(self._file.unpacker(), None)

    def seqs(self) -> list[int]:
        """The seqs of the rows it holds (a version 1 base does not list them: only a delta asks)."""
        if self.columns is not None:
            return np.frombuffer(self.columns["seqs"], "<u8").tolist()
        return self.tail["seqs"]

    def close(self) -> None:
        # the column views share the mapping's export: released first, or closing the mapping fails
        columns, self.columns = self.columns, None
        for value in (columns or {}).values():
            if isinstance(value, memoryview):
                try:
                    value.release()
                except BufferError:  # an array made of it still lives: it goes with that array
                    pass
        self._file.close()


def _decoded(unpacker: msgpack.Unpacker, chunks: int | None) -> Iterator[list[list[Any]]]:
    """``chunks`` chunks of rows (None: until the empty chunk that ends a row segment's)."""
    done = 0
    while chunks is None or done < chunks:
        try:
            chunk = unpacker.unpack()
        except Exception as exc:
            raise SnapshotInvalid(f"snapshot could not be decoded: {type(exc).__name__}") from None
        if not isinstance(chunk, list):
            raise SnapshotInvalid("snapshot message chunk is not a list")
        if chunks is None and not chunk:
            return
        done += 1
        yield chunk


class _Framed:
    """A mapped file in the snapshot's framing, its head, length and checksum verified — the checksum
    on another thread when ``crc_later`` (``checked`` waits for it): zlib's CRC lets go of the GIL, so
    a start checks a 728 MB row base (0.4 s at five million events) while it decodes the rest."""

    def __init__(self, io: FileIO, path: str, magic: bytes, versions: tuple[int, ...] = READABLE_VERSIONS,
                 crc_later: bool = False) -> None:
        self._buf = io.read_all(path)
        self._body: memoryview | None = None
        self._crc: Future | None = None
        try:
            self.version, self._body, crc = _framed_body(self._buf, magic, versions)
            if not crc_later:
                _check_crc(self._body, crc)
            else:
                pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-crc")
                self._crc = pool.submit(_check_crc, self._body, crc)
                pool.shutdown(wait=False)
        except BaseException:
            self.close()
            raise

    def checked(self) -> None:
        """Wait for the checksum begun at open (``crc_later``); raises SnapshotInvalid if it fails."""
        if self._crc is not None:
            self._crc.result()
            self._crc = None

    def unpacker(self, at: int = 0) -> msgpack.Unpacker:
        limit = len(self._body) + 1
        return msgpack.Unpacker(_Slices(self._body, at), raw=False, use_list=True,
                                read_size=min(WRITE_AT, limit), max_buffer_size=limit)

    def view(self, at: int, n: int) -> memoryview:
        """``n`` bytes of the body from ``at``, in place (released with the file)."""
        if at < 0 or n < 0 or at + n > len(self._body):
            raise SnapshotInvalid("a row segment's section runs past its body")
        return self._body[at:at + n]

    def close(self) -> None:
        if self._crc is not None:   # it reads the body: it ends before the mapping goes
            self._crc.exception()
            self._crc = None
        body, self._body = self._body, None
        if body is not None:
            body.release()
        if hasattr(self._buf, "close"):
            try:
                self._buf.close()
            except BufferError:
                # a view of a row segment's section still lives (a traceback holding a frame that
                # read it, say): the mapping goes with the last view instead
                pass


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


def _framed_body(buf, magic: bytes, versions: tuple[int, ...]) -> tuple[int, memoryview, int]:
    """(version, the body between head and trailer, its CRC as the trailer says), once the magic
    numbers, version and length hold (the CRC: ``_check_crc``)."""
    if len(buf) < HEAD.size + TRAILER.size:
        raise SnapshotInvalid("snapshot is too short")
    got_magic, version, _ = HEAD.unpack_from(buf, 0)
    length, crc, end_magic = TRAILER.unpack_from(buf, len(buf) - TRAILER.size)
    if got_magic != magic or end_magic != END_MAGIC:
        raise SnapshotInvalid("snapshot has a bad magic number")
    if magic == MAGIC and version in OUTDATED_VERSIONS:
        raise SnapshotOutdated(f"snapshot format {version} predates text read from the log")
    if version not in versions:
        raise SnapshotInvalid(f"snapshot format {version} is not known")
    if HEAD.size + length + TRAILER.size != len(buf):
        raise SnapshotInvalid("snapshot length does not match its trailer")
    return version, memoryview(buf)[HEAD.size: HEAD.size + length], crc


def _check_crc(body: memoryview, crc: int) -> None:
    if zlib.crc32(body) != crc:
        raise SnapshotInvalid("snapshot checksum does not match")


def read(io: FileIO, path: str) -> tuple[dict[str, Any], list[list[Any]], Any]:
    """(meta, every message's field list, search dump) at once, for tools and tests; raises
    SnapshotInvalid. The store streams its rows instead (``Reader``)."""
    with Reader(io, path) as reader:
        return reader.meta, list(reader.rows()), reader.search_dump

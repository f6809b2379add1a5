"""Immutable search-index segments: the postings of a range of slots in one file, mapped into memory.

Why: an index held as Python objects costs ~1.8 KB per message at 200k agent-history events (1.5M
terms: tool outputs are full of hashes, paths and numbers) and seconds to rebuild at every start.
A segment is written once (at a snapshot, from the index's in-memory part) and then only read, as
LevelDB's sorted tables are: the start maps it instead of rebuilding anything, its pages are the
kernel's page cache rather than the daemon's heap, and it holds no object per term or posting.
Segments are merged (``SearchIndex.plan``: a new one replaces the run it was merged from), which
also drops the postings of deleted docs. The format (docs/format.md §6):

    header      HEAD (little-endian): magic, format version, byte order, fields, terms, chars, slot
                range, then SECTIONS pairs (offset, length), then the CRC-32 of the body and of the
                header before it
    term_off    u64[terms + 1]   term t is term_bytes[term_off[t]:term_off[t + 1]] (UTF-8)
    term_bytes                   the terms, sorted by their UTF-8 bytes (= code point order)
    char_cp     u32[chars]       each CJK character of a two-character term, sorted ...
    char_term   u32[chars]       ... beside the term holding it (one-character queries expand to them)
    per field:  post_off u64[terms + 1], slots u32[...], keys u16[...], maxtf u8[terms]
                term t's postings in the field are slots/keys[post_off[t]:post_off[t + 1]], slots
                ascending, keys as storaged/search.py packs them; maxtf its highest tf bucket there
    slot_doc    u64[slot_hi - slot_lo]   the doc of each slot of the range (version 2)
    per field:  lens u32[slot_hi - slot_lo]   each slot's length in terms in the field (version 2)
    win_meta    f64[1 + fields]  the window shift, then per field the average length its bounds
                                 were computed at (version 3)
    per field:  bterm u32[m]     the terms (ascending) whose list holds bounds, ...
                bmax f32[m]      ... each one's highest impact (BM25's tf part, rounded up) ...
                bval u8[m * windows]  ... its highest in each window of 2**shift slots the range
                                 touches, in 255ths of bmax, rounded up, ...
                bcnt u8[m * windows]  ... and its postings there (version 3)

    term_hash   u32[terms + terms // 3 + 1]  an open-addressing table of the terms (version 3): the
                                 slot of CRC-32(term) modulo its size, or the next ones in turn (linear
                                 probing), holds the term's index + 1; 0 is empty

The term table makes a lookup one CRC and a probe or two (~2 µs) where a bisection of the sorted terms
took 9-15 µs: a query looks up each of its terms in every segment, and a 5M-event store has ~20 of them.
The window bounds let a query skip the parts of long lists that cannot reach its best docs (block-max
pruning: storaged/search.py's window kernel); they are what the search index computed, the segment
only keeps them.

The per-slot tables are fixed once a slot is made, like the postings, so they belong here rather
than in the snapshot's manifest, which is rewritten whole at every snapshot: there they and the doc
map they imply cost ~25 bytes a message at each one (~120 MB at 5M messages, most of a manifest). A
version 1 segment (the release before) has no per-slot tables; the search dump then carries that
range's itself.

Every section starts 8-byte aligned; the numbers after the head are in the writer's native byte
order (a segment of the other order is refused: the index is then rebuilt from the log). Each section
is checked against the file's size at open; the whole file, head included, against its CRC — at open
(``verify=True``), or, for a store's start, after it (``verify=DEFERRED``, then ``SegmentCheck``): at
five million events the segments are 3.8 GB, ~2 s of CRC on a core, which a start that checked them
first spent before its first search. LevelDB checks a table's blocks only as reads need them, and
only if asked; here every byte is still checked, on a low-priority thread while the store serves, and
a segment that fails is never merged into another meanwhile (``SearchIndex.plan``), so its damage
cannot be copied under a fresh CRC: the store then drops the index and builds it again from the log
(``Store.discard_index``). A file that passes the CRC was written by write(), whose tables are sound;
which file belongs to which snapshot is the snapshot's business (its manifest).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
import sys
import threading
import zlib
from bisect import bisect_left
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from . import layout
from .fileio import FileIO, Paced, drop_pages, page_count

__all__ = ["Segment", "SegmentCheck", "SegmentInvalid", "DEFERRED", "write", "new_name", "is_segment_name", "is_index_segment_name",
           "is_rows_segment_name"]

MAGIC = b"CMSEG\x00\x00\x01"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
NFIELDS = 3
# magic, version, little-endian flag, fields, terms, chars, slot_lo, slot_hi
HEAD = struct.Struct("<8sIIIQQQQ")
# sections by version: the term and character tables, each field's postings; then (2) the per-slot
# tables; then (3) the window bounds and the term hash table
N_SECTIONS = {1: 4 + 4 * NFIELDS, 2: 4 + 4 * NFIELDS + 1 + NFIELDS, 3: 4 + 4 * NFIELDS + 1 + NFIELDS + 1 + 4 * NFIELDS + 1}
SECTIONS = {v: struct.Struct("<" + "QQ" * n) for v, n in N_SECTIONS.items()}
CRC = struct.Struct("<I")
MAX_WINDOW_SHIFT = 7  # windows of at most 128 slots: a window's count of a list's postings fits a byte
SAMPLE = 128  # a lookup's first bisection is of every SAMPLE-th term (Segment._lower_bound)
SAMPLE_STEP = 1024  # samples made per idle step (~1.5 ms)
HEADER_SIZE = {v: HEAD.size + sec.size + CRC.size for v, sec in SECTIONS.items()}
_LITTLE = 1 if sys.byteorder == "little" else 0


# Segment(verify=DEFERRED): the CRC is not checked at open but by ``check_body``, later
DEFERRED = "deferred"
# the nice value the deferred checks run at (their thread's own: the request loop keeps its priority)
CHECK_NICE = 10


class SegmentInvalid(ValueError):
    """A segment file that is missing, torn, rotten or of another format."""


def new_name(prefix: str = layout.SEGMENT_PREFIX) -> str:
    """A fresh segment file name (an index segment's, or with ``layout.ROWS_PREFIX`` a row
    segment's): random, so a new file never takes the name of one a snapshot on disk still lists
    (FileIO.open_new then creates it O_EXCL|O_NOFOLLOW after unlinking whatever a crash or a planted
    link left at that path)."""
    return prefix + os.urandom(8).hex() + layout.SEGMENT_SUFFIX


def is_segment_name(name: str) -> bool:
    """An index segment's or a row segment's name (both kept while a snapshot or the index names them)."""
    return name.startswith((layout.SEGMENT_PREFIX, layout.ROWS_PREFIX)) and name.endswith(layout.SEGMENT_SUFFIX)


def is_index_segment_name(name: str) -> bool:
    return name.startswith(layout.SEGMENT_PREFIX) and name.endswith(layout.SEGMENT_SUFFIX)


def is_rows_segment_name(name: str) -> bool:
    return name.startswith(layout.ROWS_PREFIX) and name.endswith(layout.SEGMENT_SUFFIX)


def _always(_term: str) -> bool:
    return True


def window_range(slot_lo: int, slot_hi: int, shift: int) -> tuple[int, int]:
    """[first, end) of the windows of 2**shift slots that the slot range [slot_lo, slot_hi) touches."""
    if slot_hi <= slot_lo:
        return slot_lo >> shift, slot_lo >> shift
    return slot_lo >> shift, ((slot_hi - 1) >> shift) + 1


def hash_size(n_terms: int) -> int:
    """Slots of the term hash table of a segment of n_terms terms (a load of at most 3/4)."""
    return n_terms + n_terms // 3 + 1


def _term_hash(raw_terms: list[bytes]) -> np.ndarray:
    """The term hash table (see the module docstring), filled in numpy: each round, every term not
    yet placed tries its next slot, and of those trying one free slot the first in term order wins;
    a term moves on only past a taken slot, so every lookup's probe reaches it."""
    n = len(raw_terms)
    size = hash_size(n)
    table = np.zeros(size, np.uint32)
    pending = np.arange(n, dtype=np.int64)
    pos = np.fromiter(map(zlib.crc32, raw_terms), np.int64, n) % size
    while len(pending):
        free = np.flatnonzero(table[pos] == 0)
        spots, first = np.unique(pos[free], return_index=True)
        won = free[first]
        table[spots] = pending[won] + 1
        keep = np.ones(len(pending), bool)
        keep[won] = False
        pending, pos = pending[keep], (pos[keep] + 1) % size
    return table


def write(io: FileIO, path: str, slot_lo: int, slot_hi: int, terms: list[str], fields: Sequence,
          chars_of: Callable[[str], Iterable[str]], slot_doc: np.ndarray, lens: Sequence[np.ndarray],
          windows: tuple[int, Sequence[float], Sequence] | None = None) -> int:
    """Write a segment file (new, 0600) and fsync it; the caller fsyncs the directory before anything
    names the file. ``terms``: sorted, unique; ``fields[f]``: (post_off u64[len(terms) + 1], slots
    u32, keys u16, maxtf u8[len(terms)]) as numpy arrays; ``chars_of(term)``: the characters a
    one-character query finds the term by (search.py's rule for CJK bigrams); ``slot_doc`` and
    ``lens[f]``: each slot's doc and length in field f, one per slot of the range; ``windows``:
    (shift, [average length per field], [(bterm u32[m], bmax f32[m], bval u8[m * windows],
    bcnt u8[m * windows]) per field]) — None writes no bounds (no term has any). Returns the size."""
    n_slots = slot_hi - slot_lo
    if len(slot_doc) != n_slots or len(lens) != NFIELDS or any(len(x) != n_slots for x in lens):
        raise ValueError("per-slot tables of a wrong length")
    if windows is None:
        none = (np.zeros(0, np.uint32), np.zeros(0, np.float32), np.zeros(0, np.uint8), np.zeros(0, np.uint8))
        windows = (0, [0.0] * NFIELDS, [none] * NFIELDS)
    shift, avgs, bounds = windows
    if not 0 <= shift <= MAX_WINDOW_SHIFT:
        raise ValueError("a window's count of postings must fit a byte")
    w_lo, w_hi = window_range(slot_lo, slot_hi, shift)
    if len(avgs) != NFIELDS or len(bounds) != NFIELDS or any(
            len(bm) != len(bt) or len(bv) != len(bt) * (w_hi - w_lo) or len(bc) != len(bv)
            for bt, bm, bv, bc in bounds):
        raise ValueError("window bounds of a wrong length")
    raw_terms = [t.encode("utf-8", "surrogatepass") for t in terms]
    term_off = np.zeros(len(terms) + 1, np.uint64)
    np.cumsum(np.fromiter(map(len, raw_terms), np.uint64, len(raw_terms)), out=term_off[1:])
    chars = sorted((ord(c), t) for t, term in enumerate(terms) if len(term) == 2 for c in chars_of(term))
    char_cp = np.array([c for c, _ in chars], np.uint32)
    char_term = np.array([t for _, t in chars], np.uint32)
    body = [term_off, b"".join(raw_terms), char_cp, char_term]
    for post_off, slots, keys, maxtf in fields:
        body += [np.asarray(post_off, np.uint64), np.asarray(slots, np.uint32), np.asarray(keys, np.uint16),
                 np.asarray(maxtf, np.uint8)]
    body += [np.asarray(slot_doc, np.uint64), *(np.asarray(x, np.uint32) for x in lens)]
    body.append(np.array([shift, *avgs], np.float64))
    for bterm, bmax, bval, bcnt in bounds:
        body += [np.asarray(bterm, np.uint32), np.asarray(bmax, np.float32), np.asarray(bval, np.uint8),
                 np.asarray(bcnt, np.uint8)]
    body.append(_term_hash(raw_terms))
    sections = []
    pos = HEADER_SIZE[VERSION]
    crc = 0
    for part in body:
        n = part.nbytes if isinstance(part, np.ndarray) else len(part)
        sections += [pos, n]
        pos += n + (-n % 8)
    fd = io.open_new(path)
    try:
        chunks = []
        for part in body:
            # a byte view of each table (no copy: a merge's tables are hundreds of MiB in the child)
            raw = memoryview(np.ascontiguousarray(part)).cast("B") if isinstance(part, np.ndarray) else part
            crc = zlib.crc32(raw, crc)
            pad = b"\0" * (-len(raw) % 8)
            crc = zlib.crc32(pad, crc)
            chunks.append((raw, pad))
        head = HEAD.pack(MAGIC, VERSION, _LITTLE, NFIELDS, len(terms), len(chars), slot_lo, slot_hi)
        head += SECTIONS[VERSION].pack(*sections)
        crc = zlib.crc32(head, crc)  # the head too (last, so the body's CRC can run as it is made)
        out = Paced(io, fd)
        out.write(head + CRC.pack(crc))
        for raw, pad in chunks:
            out.write(raw)
            if pad:
                out.write(pad)
        io.sync(fd)
    finally:
        io.close(fd)
    return pos


def _file_crc(io: FileIO, path: str, start: int, end: int, stop: threading.Event | None = None) -> int | None:
    """CRC-32 of the file's bytes [start, end), read with pread: the check reads the page cache, not
    the mapping, so it leaves nothing resident in the daemon. None if ``stop`` is set meanwhile (it is
    looked at between reads of 1 MiB)."""
    fd = io.open_read(path)
    try:
        crc = 0
        pos = start
        while pos < end:
            if stop is not None and stop.is_set():
                return None
            chunk = io.pread(fd, min(1 << 20, end - pos), pos)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            pos += len(chunk)
        return crc
    finally:
        io.close(fd)


class SegmentCheck:
    """The deferred CRC checks of a start's segments, one after another on a daemon thread at
    CHECK_NICE (the request loop, the catch-up child and the snapshot child keep their share of two
    cores). A daemon thread, and ``stop`` looked at between reads: a daemon stopped right after its
    start exits at once, not after gigabytes of checks (a supervisor's stop timeout is 10 s)."""

    def __init__(self, segments: Sequence["Segment"], io: FileIO) -> None:
        self._failed: list[tuple[Segment, str]] = []
        self._stop = threading.Event()
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(list(segments), io), name="segment-check",
                                       daemon=True)
        self.thread.start()

    def _run(self, segments: list["Segment"], io: FileIO) -> None:
        try:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CHECK_NICE)
            except (OSError, AttributeError):   # not Linux, or not allowed: at the loop's own priority
                pass
            for seg in segments:
                try:
                    seg.check_body(io, self._stop)
                except SegmentInvalid as exc:
                    self._failed.append((seg, str(exc)))
                if self._stop.is_set():
                    return
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[tuple["Segment", str]]:
        """(segment, what is wrong) of each that failed; waits up to ``timeout`` (TimeoutError)."""
        if not self._done.wait(timeout):
            raise TimeoutError("the segments' checks are still running")
        return list(self._failed)

    def stop(self) -> None:
        """End the checks soon (the segments not checked yet stay ``verified`` False)."""
        self._stop.set()


class WindowGroup(NamedTuple):
    """One field of a segment as the window kernel reads it (Segment.window_group): its windows
    (the first, how many), its long lists' bounds and counts a row each (u8, rows × windows), and
    all of the field's slots and keys, where a list's postings begin at its first posting."""
    w_lo: int
    n_win: int
    bval: np.ndarray
    bcnt: np.ndarray
    slots: np.ndarray
    keys: np.ndarray
    ident: tuple  # (segment name, size, field): what storaged/filterbounds.py keys its rows by


class Segment:
    """One segment file, mapped. Term lookups are binary searches in the sorted term table; the
    postings come back as memoryviews of the mapping (a one-posting list as a bare int, as the
    in-memory index keeps it), valid while the Segment lives."""

    __slots__ = ("name", "path", "size", "version", "verified", "_head_crc", "slot_lo", "slot_hi", "n_terms", "maxtf_all", "postings_count", "_buf",
                 "_toff", "_tbytes", "_char_cp", "_char_term", "_poff", "_slots", "_keys", "_maxtf", "_slot_doc", "_lens",
                 "_samples", "_sampling", "window_shift", "_w_lo", "_n_win", "_win_avg", "_bterm", "_bmax", "_bval",
                 "_bcnt", "_hash", "_groups")

    def __init__(self, path: str, io: FileIO | None = None, verify: bool | str = True) -> None:
        """``verify=False`` skips the CRC (reading the whole file): for a segment this process or its
        snapshot child has just written and fsynced, adopted on the request loop's thread.
        ``verify=DEFERRED``: a store's start, which checks it after it serves (``check_body``; until
        then ``verified`` is False)."""
        io = io or FileIO()
        self.path = path
        self.name = os.path.basename(path)
        try:
            buf = io.read_all(path)
        except OSError as exc:
            raise SegmentInvalid(f"segment {self.name} cannot be read ({exc.strerror or exc})") from None
        self.size = len(buf)
        if self.size < HEAD.size:
            raise SegmentInvalid(f"segment {self.name} is truncated")
        magic, version, little, nfields, n_terms, n_chars, lo, hi = HEAD.unpack_from(buf, 0)
        if magic != MAGIC or version not in READABLE_VERSIONS or nfields != NFIELDS:
            raise SegmentInvalid(f"segment {self.name} is not a segment of format {VERSION}")
        if little != _LITTLE:
            raise SegmentInvalid(f"segment {self.name} was written in the other byte order")
        header_size = HEADER_SIZE[version]
        if self.size < header_size:
            raise SegmentInvalid(f"segment {self.name} is truncated")
        sec = SECTIONS[version].unpack_from(buf, HEAD.size)
        (crc,) = CRC.unpack_from(buf, header_size - CRC.size)
        # the head before its CRC, and the CRC: checked with the body now (verify True), after the
        # start (DEFERRED), or never (False: a file this process or its child has just written)
        self._head_crc = (bytes(buf[:header_size - CRC.size]), crc)
        self.verified = verify is False
        if verify is True:
            self.check_body(io)
        mv = memoryview(buf)
        views = []
        for i in range(N_SECTIONS[version]):
            off, length = sec[2 * i], sec[2 * i + 1]
            if off % 8 or off < header_size or off + length > self.size:
                raise SegmentInvalid(f"segment {self.name} has a section out of bounds")
            views.append(mv[off:off + length])
        self._buf = buf
        self._samples: list[bytes] | None = None  # every SAMPLE-th term once all are made (sample_step)
        self._sampling: list[bytes] = []
        self.version = version
        self.slot_lo, self.slot_hi, self.n_terms = lo, hi, n_terms
        try:
            self._toff = views[0].cast("Q")
            self._tbytes = views[1]
            self._char_cp = views[2].cast("I")
            self._char_term = views[3].cast("I")
            self._poff, self._slots, self._keys, self._maxtf = [], [], [], []
            for f in range(NFIELDS):
                base = 4 + 4 * f
                self._poff.append(views[base].cast("Q"))
                self._slots.append(views[base + 1].cast("I"))
                self._keys.append(views[base + 2].cast("H"))
                self._maxtf.append(views[base + 3])
            per_slot = 4 + 4 * NFIELDS
            self._slot_doc = views[per_slot].cast("Q") if version >= 2 else None
            self._lens = [views[per_slot + 1 + f].cast("I") for f in range(NFIELDS)] if version >= 2 else None
            self.window_shift = None  # no bounds (a segment of an earlier version, or none written)
            self._bterm = self._bmax = self._bval = self._bcnt = self._hash = None
            self._groups: list[WindowGroup | None] = [None] * NFIELDS  # made on a query's first need
            if version >= 3:
                meta = views[per_slot + 1 + NFIELDS].cast("d")
                base = per_slot + 2 + NFIELDS
                self._bterm = [views[base + 4 * f].cast("I") for f in range(NFIELDS)]
                self._bmax = [views[base + 4 * f + 1].cast("f") for f in range(NFIELDS)]
                self._bval = [views[base + 4 * f + 2] for f in range(NFIELDS)]
                self._bcnt = [views[base + 4 * f + 3] for f in range(NFIELDS)]
                self._hash = views[base + 4 * NFIELDS].cast("I")
                if len(meta) != 1 + NFIELDS:
                    raise TypeError
                self._win_avg = list(meta[1:])
                if any(len(b) for b in self._bterm):
                    if not (all(0.0 < q < math.inf for q in self._win_avg) and meta[0] in range(MAX_WINDOW_SHIFT + 1)):
                        raise SegmentInvalid(f"segment {self.name}: window bounds of an impossible size or length")
                    self.window_shift = int(meta[0])
        except TypeError:
            raise SegmentInvalid(f"segment {self.name} has a section of a wrong length") from None
        self._check(n_chars)
        self.maxtf_all = [int(np.frombuffer(m, np.uint8).max()) if len(m) else 0 for m in self._maxtf]
        self.postings_count = sum(len(s) for s in self._slots)

    nbytes = 0  # on the heap: the mapping is the page cache's, not the daemon's

    def release_pages(self, first: int = 0, count: int | None = None) -> int:
        """Let the process's resident pages of the mapping go (pages ``first`` to ``first + count``; all by
        default): the page cache keeps them, so the next read maps them back without the disk. After a
        load has copied the per-slot tables out of it, or a rest. Bytes advised."""
        buf = self._buf
        return drop_pages(buf, False, first, count) if isinstance(buf, mmap.mmap) else 0

    def page_count(self) -> int:
        """Pages of its mapping (0: read into memory, not mapped)."""
        buf = self._buf
        return page_count(buf) if isinstance(buf, mmap.mmap) else 0

    def check_body(self, io: FileIO, stop: threading.Event | None = None) -> None:
        """The file's CRC, head and body, read through the page cache (pread, not the mapping): raises
        SegmentInvalid if the file fails it or cannot be read (an unreadable segment makes the snapshot
        unusable, not the start impossible); ``verified`` once it holds (not if ``stop`` is set first).
        Safe on another thread (a ``DEFERRED`` open's ``SegmentCheck``): it reads only what the open fixed."""
        if self.verified:
            return
        head, crc = self._head_crc
        try:
            body_crc = _file_crc(io, self.path, len(head) + CRC.size, self.size, stop)
        except OSError as exc:
            raise SegmentInvalid(f"segment {self.name} cannot be read ({exc.strerror or exc})") from None
        if body_crc is None:
            return
        if zlib.crc32(head, body_crc) != crc:
            raise SegmentInvalid(f"segment {self.name} fails its checksum")
        self.verified = True

    def _check(self, n_chars: int) -> None:
        """The sizes the header promises, and the last offset of each table: a file that passes its
        checksum was written by write(), whose tables are sound, so nothing here reads every page
        (the mapping's pages are only read as queries need them)."""
        def bad(what: str) -> SegmentInvalid:
            return SegmentInvalid(f"segment {self.name}: {what}")

        n = self.n_terms
        if len(self._toff) != n + 1 or self._toff[n] != len(self._tbytes):
            raise bad("term table of a wrong size")
        if len(self._char_cp) != n_chars or len(self._char_term) != n_chars:
            raise bad("character table of a wrong size")
        for f in range(NFIELDS):
            poff, slots = self._poff[f], self._slots[f]
            if len(poff) != n + 1 or poff[n] != len(slots) or len(self._keys[f]) != len(slots) or len(self._maxtf[f]) != n:
                raise bad("posting tables of a wrong size")
        if self.slot_hi < self.slot_lo:
            raise bad("a slot range that ends before it starts")
        if self._slot_doc is not None:
            n_slots = self.slot_hi - self.slot_lo
            if len(self._slot_doc) != n_slots or any(len(x) != n_slots for x in self._lens):
                raise bad("per-slot tables of a wrong size")
        if self._hash is not None and len(self._hash) != hash_size(n):
            raise bad("a term hash table of a wrong size")
        if self.window_shift is not None:
            self._w_lo, w_hi = window_range(self.slot_lo, self.slot_hi, self.window_shift)
            self._n_win = w_hi - self._w_lo
            for bt, bm, bv, bc in zip(self._bterm, self._bmax, self._bval, self._bcnt):
                if (len(bm) != len(bt) or len(bv) != len(bt) * self._n_win or len(bc) != len(bv)
                        or (len(bt) and bt[len(bt) - 1] >= n)):
                    raise bad("window bounds of a wrong size")
                top = np.frombuffer(bm, np.float32)  # one a long list: a few KB
                if not bool(np.all((top > 0) & (top < np.inf))):
                    raise bad("window bounds of an impossible value")

    def per_slot(self) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """(each slot's doc, [each slot's length in field f]) for the slot range, as numpy views of the
        mapping (what a load copies into the index's own tables), or None: a version 1 segment has none."""
        if self._slot_doc is None:
            return None
        return (np.frombuffer(self._slot_doc, np.uint64),
                [np.frombuffer(x, np.uint32) for x in self._lens])

    def export(self, f: int) -> tuple:
        """(term index of each non-empty list, its length, all slots, all keys) of field f as numpy
        arrays (views of the mapping): what a merge reads."""
        poff = np.frombuffer(self._poff[f], np.uint64).astype(np.int64)
        counts = np.diff(poff)
        tids = np.flatnonzero(counts)
        return tids, counts[tids], np.frombuffer(self._slots[f], np.uint32), np.frombuffer(self._keys[f], np.uint16)

    def term_list(self) -> list[str]:
        """Every term, by index (what a merge reads)."""
        raw = bytes(self._tbytes)
        toff = np.frombuffer(self._toff, np.uint64).tolist()
        return [raw[a:b].decode("utf-8", "surrogatepass") for a, b in zip(toff, toff[1:])]

    # --- reading -------------------------------------------------------------------------------

    def _term_bytes(self, t: int) -> bytes:
        return bytes(self._tbytes[self._toff[t]:self._toff[t + 1]])

    def lookup(self, term: str) -> int:
        """The term's index, or -1."""
        raw = term.encode("utf-8", "surrogatepass")
        table = self._hash
        if table is not None:  # version 3: the hash table (it has more slots than terms)
            size = len(table)
            i = zlib.crc32(raw) % size
            tb, toff, n = self._tbytes, self._toff, self.n_terms
            for _ in range(size):  # (bounded even for a table the writer could not have made)
                e = table[i]
                if not e or e > n:
                    return -1
                if tb[toff[e - 1]:toff[e]] == raw:
                    return e - 1
                i = i + 1 if i + 1 < size else 0
            return -1
        t = self._lower_bound(raw)
        if t < self.n_terms and self._term_bytes(t) == raw:
            return t
        return -1

    def _lower_bound(self, raw: bytes) -> int:
        """The first term index whose bytes are not below ``raw``. Once the samples are made
        (``sample_step``): a bisection of every SAMPLE-th term, then one within the block it leaves,
        both in C with the terms read from the mapping as keys. A query looks up each of its terms in
        every segment (~90 lookups a query at 200k events), and the plain bisection, ~21 steps in
        Python, was ~10% of a search: 20-24 us a lookup in a 1M-term segment, 9-15 us with the samples."""
        samples = self._samples
        tb, toff = self._tbytes, self._toff
        if samples is None:
            lo, hi = 0, self.n_terms
            while lo < hi:
                mid = (lo + hi) >> 1
                if bytes(tb[toff[mid]:toff[mid + 1]]) < raw:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
        j = bisect_left(samples, raw)
        if j == 0:
            return 0
        lo, hi = (j - 1) * SAMPLE + 1, min(j * SAMPLE, self.n_terms)
        return lo + bisect_left(range(lo, hi), raw, key=lambda t: bytes(tb[toff[t]:toff[t + 1]]))

    def sampled(self) -> bool:
        return self._samples is not None

    def sample_step(self, count: int = SAMPLE_STEP) -> bool:
        """Make up to ``count`` more of the samples ``_lower_bound`` bisects (every SAMPLE-th term, as
        bytes: ~0.8% of the terms); True once all are made. In steps, off the request path (the
        index's idle_step): a 1.3M-term segment's ~10k samples take ~11 ms, which the first query
        after a start or a merge would otherwise wait for."""
        if self._samples is not None:
            return True
        got = self._sampling
        start = len(got) * SAMPLE
        end = min(self.n_terms, start + count * SAMPLE)
        toff = np.frombuffer(self._toff, np.uint64)
        tb = self._tbytes
        got.extend(bytes(tb[a:b]) for a, b in zip(toff[start:end:SAMPLE].tolist(), toff[start + 1:end + 1:SAMPLE].tolist()))
        if end < self.n_terms:
            return False
        self._samples, self._sampling = got, []
        return True

    def postings(self, f: int, t: int):
        """(slots, keys, maxtf) of term t in field f, or None: slots and keys a bare int each for a
        single posting, else memoryviews of the mapping."""
        poff = self._poff[f]
        a, b = poff[t], poff[t + 1]
        if a == b:
            return None
        if b - a == 1:
            return self._slots[f][a], self._keys[f][a], self._maxtf[f][t]
        return self._slots[f][a:b], self._keys[f][a:b], self._maxtf[f][t]

    def bounds(self, f: int, t: int):
        """(first window, average length, highest impact, row, first posting, window group) of term
        t's list in field f — its highest impact at that average field length (the writer's); its
        row in the field's bound tables and where its postings begin in the field's arrays, both as
        ``window_group(f)`` holds them — or None (a short list, or no bounds)."""
        if self.window_shift is None:
            return None
        bt = self._bterm[f]
        i = bisect_left(bt, t)
        if i == len(bt) or bt[i] != t:
            return None
        return self._w_lo, self._win_avg[f], self._bmax[f][i], i, self._poff[f][t], self.window_group(f)

    def window_group(self, f: int) -> "WindowGroup":
        """Field f's bound tables and postings as numpy views of the mapping, made once: a query
        gathers all of its lists in this segment and field from them at once."""
        g = self._groups[f]
        if g is None:
            n = self._n_win
            m = len(self._bterm[f])
            g = self._groups[f] = WindowGroup(
                self._w_lo, n, np.frombuffer(self._bval[f], np.uint8).reshape(m, n),
                np.frombuffer(self._bcnt[f], np.uint8).reshape(m, n),
                np.frombuffer(self._slots[f], np.uint32), np.frombuffer(self._keys[f], np.uint16),
                (self.name, self.size, f))
        return g

    def df(self, t: int) -> int:
        return sum(p[t + 1] - p[t] for p in self._poff)

    def char_terms(self, ch: str) -> list[int]:
        """The two-character CJK terms holding ``ch``."""
        cp = ord(ch)
        i = bisect_left(self._char_cp, cp)
        out = []
        while i < len(self._char_cp) and self._char_cp[i] == cp:
            out.append(self._char_term[i])
            i += 1
        return out

    def terms_from(self, prefix: str, take: int) -> tuple[list[str], int]:
        """(up to ``take`` terms beginning with ``prefix``, in order; how many terms sort at or
        after ``prefix`` — what the prefix budget is charged, as for the in-memory list)."""
        raw = prefix.encode("utf-8", "surrogatepass")
        i = self._lower_bound(raw)
        out = []
        while i < self.n_terms and len(out) < take:
            t = self._term_bytes(i)
            if not t.startswith(raw):
                break
            out.append(t.decode("utf-8", "surrogatepass"))
            i += 1
        return out, self.n_terms - (i - len(out))

    def prefix_readers(self) -> list:
        """For search.py's prefix expansion: a reader of this segment's sorted terms, every term live."""
        return [(self._read_prefix, _always)]

    def _read_prefix(self, prefix: str, end: str, take: int) -> tuple[list[str], int, list[int]]:
        """terms_from, and each term's df here (so an expansion's df needs no lookup in each segment)."""
        out, n = self.terms_from(prefix, take)
        first = self.n_terms - n  # the first term at or after prefix
        return out, n, [self.df(first + j) for j in range(len(out))]

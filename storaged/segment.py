"""Immutable search-index segments: the postings of a range of slots in one file, mapped into memory.

Why: an index held as Python objects costs ~1.8 KB per message at 200k agent-history events (1.5M
terms: tool outputs are full of hashes, paths and numbers) and seconds to rebuild at every start.
A segment is written once (at a snapshot, from the index's in-memory part) and then only read, as
LevelDB's sorted tables are: the start maps it instead of rebuilding anything, its pages are the
kernel's page cache rather than the daemon's heap, and it holds no object per term or posting.
Segments are merged (``SearchIndex.plan``: a new one replaces the run it was merged from), which
also drops the postings of deleted docs. The format (docs/format.md §6):

    header      HEAD: magic, format version, byte order, fields, terms, chars, slot range,
                then SECTIONS pairs (offset, length), then the CRC-32 of every byte after the header
    term_off    u64[terms + 1]   term t is term_bytes[term_off[t]:term_off[t + 1]] (UTF-8)
    term_bytes                   the terms, sorted by their UTF-8 bytes (= code point order)
    char_cp     u32[chars]       each CJK character of a two-character term, sorted ...
    char_term   u32[chars]       ... beside the term holding it (one-character queries expand to them)
    per field:  post_off u64[terms + 1], slots u32[...], keys u16[...], maxtf u8[terms]
                term t's postings in the field are slots/keys[post_off[t]:post_off[t + 1]], slots
                ascending, keys as storaged/search.py packs them; maxtf its highest tf bucket there

Every section starts 8-byte aligned, in the writer's native byte order (a segment of the other
order is refused: the index is then rebuilt from the log). The whole body is checked against its
CRC and every offset against its section at open, so a torn or rotten file is refused, never read
out of bounds; which file belongs to which snapshot is the snapshot's business (its manifest).
"""
from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from bisect import bisect_left
from typing import Callable, Iterable, Sequence

import numpy as np

from . import layout
from .fileio import FileIO

__all__ = ["Segment", "SegmentBuilder", "SegmentInvalid", "new_name", "is_segment_name"]

MAGIC = b"CMSEG\x00\x00\x01"
VERSION = 1
NFIELDS = 3
# magic, version, little-endian flag, fields, terms, chars, slot_lo, slot_hi
HEAD = struct.Struct("<8sIIIQQQQ")
N_SECTIONS = 4 + 4 * NFIELDS
SECTIONS = struct.Struct("<" + "QQ" * N_SECTIONS)
CRC = struct.Struct("<I")
HEADER_SIZE = HEAD.size + SECTIONS.size + CRC.size
_LITTLE = 1 if sys.byteorder == "little" else 0


class SegmentInvalid(ValueError):
    """A segment file that is missing, torn, rotten or of another format."""


def new_name() -> str:
    """A fresh segment file name: random, so a new file never takes the name of one a snapshot on
    disk still lists (the file is created with O_EXCL all the same)."""
    return layout.SEGMENT_PREFIX + os.urandom(8).hex() + layout.SEGMENT_SUFFIX


def is_segment_name(name: str) -> bool:
    return name.startswith(layout.SEGMENT_PREFIX) and name.endswith(layout.SEGMENT_SUFFIX)


def _always(_term: str) -> bool:
    return True


class SegmentBuilder:
    """Collects terms in sorted order with their postings per field, then writes the file."""

    def __init__(self, slot_lo: int, slot_hi: int, chars_of: Callable[[str], Iterable[str]]) -> None:
        """``chars_of(term)``: the characters a one-character query finds the term by (search.py's
        rule for CJK bigrams), listed in the character table."""
        self.slot_lo, self.slot_hi = slot_lo, slot_hi
        self._chars_of = chars_of
        self.terms: list[bytes] = []
        self.term_off = array("Q", [0])
        self.post_off = [array("Q", [0]) for _ in range(NFIELDS)]
        self.slots = [array("I") for _ in range(NFIELDS)]
        self.keys = [array("H") for _ in range(NFIELDS)]
        self.maxtf = [bytearray() for _ in range(NFIELDS)]
        self.chars: list[tuple[int, int]] = []
        self._size = 0
        self._last = None

    def __len__(self) -> int:
        return len(self.terms)

    def add(self, term: str, lists: Sequence) -> None:
        """``lists[f]``: (slots, keys, maxtf) of the term in field f, or None; slots ascending
        within [slot_lo, slot_hi). A term with no posting in any field is not added."""
        if not any(lists):
            return
        raw = term.encode("utf-8", "surrogatepass")
        if self._last is not None and raw <= self._last:
            raise ValueError("segment terms must be added in ascending order")
        self._last = raw
        t = len(self.terms)
        self.terms.append(raw)
        self._size += len(raw)
        self.term_off.append(self._size)
        for f in range(NFIELDS):
            got = lists[f]
            if got:
                slots, keys, maxtf = got
                if type(slots) is int:
                    self.slots[f].append(slots)
                    self.keys[f].append(keys)
                else:
                    self.slots[f].extend(slots)
                    self.keys[f].extend(keys)
                self.maxtf[f].append(maxtf)
            else:
                self.maxtf[f].append(0)
            self.post_off[f].append(len(self.slots[f]))
        for c in self._chars_of(term):
            self.chars.append((ord(c), t))

    def write(self, io: FileIO, path: str) -> int:
        """Write the file (new, 0600), fsync it; the caller fsyncs the directory before anything
        names the file. Returns its size."""
        self.chars.sort()
        char_cp = array("I", (c for c, _ in self.chars))
        char_term = array("I", (t for _, t in self.chars))
        body = [self.term_off, b"".join(self.terms), char_cp, char_term]
        for f in range(NFIELDS):
            body += [self.post_off[f], self.slots[f], self.keys[f], self.maxtf[f]]
        sections = []
        chunks = []
        pos = HEADER_SIZE
        for part in body:
            raw = part.tobytes() if isinstance(part, array) else bytes(part)
            sections += [pos, len(raw)]
            pad = -len(raw) % 8
            chunks.append(raw + b"\0" * pad)
            pos += len(raw) + pad
        crc = 0
        for c in chunks:
            crc = zlib.crc32(c, crc)
        head = HEAD.pack(MAGIC, VERSION, _LITTLE, NFIELDS, len(self.terms), len(self.chars), self.slot_lo, self.slot_hi)
        head += SECTIONS.pack(*sections) + CRC.pack(crc)
        fd = io.open_new(path)
        try:
            io.write(fd, head)
            for c in chunks:
                io.write(fd, c)
            io.sync(fd)
        finally:
            io.close(fd)
        return pos


class Segment:
    """One segment file, mapped. Term lookups are binary searches in the sorted term table; the
    postings come back as memoryviews of the mapping (a one-posting list as a bare int, as the
    in-memory index keeps it), valid while the Segment lives."""

    __slots__ = ("name", "path", "size", "slot_lo", "slot_hi", "n_terms", "maxtf_all", "postings_count", "_buf", "_toff", "_tbytes",
                 "_char_cp", "_char_term", "_poff", "_slots", "_keys", "_maxtf")

    def __init__(self, path: str, io: FileIO | None = None) -> None:
        io = io or FileIO()
        self.path = path
        self.name = os.path.basename(path)
        try:
            buf = io.read_all(path)
        except OSError as exc:
            raise SegmentInvalid(f"segment {self.name} cannot be read ({exc.strerror or exc})") from None
        self.size = len(buf)
        if self.size < HEADER_SIZE:
            raise SegmentInvalid(f"segment {self.name} is truncated")
        magic, version, little, nfields, n_terms, n_chars, lo, hi = HEAD.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION or nfields != NFIELDS:
            raise SegmentInvalid(f"segment {self.name} is not a segment of format {VERSION}")
        if little != _LITTLE:
            raise SegmentInvalid(f"segment {self.name} was written in the other byte order")
        sec = SECTIONS.unpack_from(buf, HEAD.size)
        (crc,) = CRC.unpack_from(buf, HEAD.size + SECTIONS.size)
        if zlib.crc32(memoryview(buf)[HEADER_SIZE:]) != crc:
            raise SegmentInvalid(f"segment {self.name} fails its checksum")
        mv = memoryview(buf)
        views = []
        for i in range(N_SECTIONS):
            off, length = sec[2 * i], sec[2 * i + 1]
            if off % 8 or off < HEADER_SIZE or off + length > self.size:
                raise SegmentInvalid(f"segment {self.name} has a section out of bounds")
            views.append(mv[off:off + length])
        self._buf = buf
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
        except TypeError:
            raise SegmentInvalid(f"segment {self.name} has a section of a wrong length") from None
        self._check(n_chars)
        self.maxtf_all = [max(m, default=0) for m in self._maxtf]
        self.postings_count = sum(len(s) for s in self._slots)

    nbytes = 0  # on the heap: the mapping is the page cache's, not the daemon's

    def _check(self, n_chars: int) -> None:
        """Every offset within its section and ascending, every slot within the segment's range,
        each term's slots ascending: what lets lookups and the query code trust the file."""
        def bad(what: str) -> SegmentInvalid:
            return SegmentInvalid(f"segment {self.name}: {what}")

        n = self.n_terms
        toff = np.frombuffer(self._toff, np.uint64)
        if len(toff) != n + 1 or toff[0] != 0 or toff[-1] != len(self._tbytes) or np.any(np.diff(toff.astype(np.int64)) <= 0):
            raise bad("term offsets out of order")
        if len(self._char_cp) != n_chars or len(self._char_term) != n_chars:
            raise bad("character table of a wrong size")
        if n_chars and (int(max(self._char_term)) >= n or np.any(np.diff(np.frombuffer(self._char_cp, np.uint32).astype(np.int64)) < 0)):
            raise bad("character table out of order")
        for f in range(NFIELDS):
            poff = np.frombuffer(self._poff[f], np.uint64).astype(np.int64)
            slots = np.frombuffer(self._slots[f], np.uint32)
            if len(poff) != n + 1 or poff[0] != 0 or poff[-1] != len(slots) or len(self._keys[f]) != len(slots):
                raise bad("posting offsets of a wrong size")
            if len(self._maxtf[f]) != n or np.any(np.diff(poff) < 0):
                raise bad("posting offsets out of order")
            if len(slots):
                if int(slots.min()) < self.slot_lo or int(slots.max()) >= self.slot_hi:
                    raise bad("a posting outside the segment's slots")
                # ascending within each term: every step up, except where a new term starts
                down = np.flatnonzero(np.diff(slots.astype(np.int64)) <= 0) + 1
                if len(down) and not np.all(np.isin(down, poff)):
                    raise bad("postings out of order")

    # --- reading -------------------------------------------------------------------------------

    def _term_bytes(self, t: int) -> bytes:
        return bytes(self._tbytes[self._toff[t]:self._toff[t + 1]])

    def term(self, t: int) -> str:
        return self._term_bytes(t).decode("utf-8", "surrogatepass")

    def lookup(self, term: str) -> int:
        """The term's index, or -1."""
        raw = term.encode("utf-8", "surrogatepass")
        lo, hi = 0, self.n_terms
        tb, toff = self._tbytes, self._toff
        while lo < hi:
            mid = (lo + hi) >> 1
            if bytes(tb[toff[mid]:toff[mid + 1]]) < raw:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.n_terms and bytes(tb[toff[lo]:toff[lo + 1]]) == raw:
            return lo
        return -1

    def _lower_bound(self, raw: bytes) -> int:
        lo, hi = 0, self.n_terms
        tb, toff = self._tbytes, self._toff
        while lo < hi:
            mid = (lo + hi) >> 1
            if bytes(tb[toff[mid]:toff[mid + 1]]) < raw:
                lo = mid + 1
            else:
                hi = mid
        return lo

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

    def prefix_groups(self) -> list:
        """For search.py's prefix expansion: this segment's sorted terms as one group, every term live."""
        return [([self._read_prefix], _always)]

    def _read_prefix(self, prefix: str, end: str, take: int) -> tuple[list[str], int]:
        return self.terms_from(prefix, take)

    def items(self) -> Iterable[tuple[str, int]]:
        """(term, index) in sorted order: what a merge reads."""
        for t in range(self.n_terms):
            yield self.term(t), t


"""The live messages' metadata as packed rows indexed by seq; a ``Message`` is built only when asked for.

A slotted ``Message`` per live message cost ~600 bytes of heap (the object, its id string, its big
ints, two dict entries): 3 GB at five million events. Here each seq is one fixed-width row of one
bytearray (85 bytes: the id as its 128-bit number, times, a 32-bit revision and an 8-bit
importance, the text's location, small codes for the enum-like fields and for shared tag sets,
tools and exts) and one event-type byte, the rarer fields are kept in dicts by seq (a revision or
importance too wide for its field among them), and ``tool_call_id`` (half of an agent's events carry
one) is a slice of one growing byte string. The row was 110 bytes (version 2 segments) with the id's
26 characters and 64-bit revision, importance and record size: 25 bytes a message, 120 MB at five
million, for fields no message of ours fills. ``get`` builds the ``Message`` a view or a mutation works with;
nothing holds it after.

The id → seq map is a sorted numpy array of 60-bit keys (``id_key``) beside the seqs, plus a dict
of the ids put since it was last merged; a key's hit is confirmed against the row's id and
liveness, so colliding keys and dead seqs are never answered. Ids that are not canonical ULIDs (a
hand-made log) live in dicts of their own.

Rows are by seq, so iterating is in creation order, as the rebuild and the snapshot need. The
event-type byte is the one live flag: 0 at a seq with no live message (whatever its row holds).

A start maps the rows of the snapshot's base row segment instead of copying them, when they lie in the
file as the table holds them (the base's seqs without a gap, nothing to renumber): the first ``nbase``
rows are a copy-on-write mapping of the file (``base``), the rest a bytearray (``rows``). The mapped
pages are the page cache's — shared, clean, given back under pressure — until a row in them is written
(an update, a compaction's relocation), which makes that page the process's own; the file never changes.
At five million events that is 430 MB off the daemon's own memory and the copy off its start. Once a
later snapshot writes a new base, the mapped file is unlinked but not cut (``mapped_names``; cutting
it would fault the next read of a row in it): its blocks stay on the disk until the daemon stops.
"""
from __future__ import annotations

import bisect
import errno
import mmap
import os
import struct
import sys
from collections.abc import Iterator, Mapping
from sys import intern
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import limits as L
from protocol.history import EVENT_TYPES
from protocol.validation import ULID_RE

from .extfiles import ExtFiles, checked_sections, raw_entries
from .model import Message, ext_key, shared_ext_from, shared_tags, str_bytes
from .fileio import drop_pages, map_private
from .records import EXT, UPDATE, WRITE
from .text import (TEXT_LEN_BITS, TEXT_OFF_BITS, LogText, TextDamaged, location_from_parts,
                   location_parts)

if TYPE_CHECKING:
    from .snapshot import RowsSections

# codes of the enum-like fields; 0 is "none" (an etype code of 0 is a dead seq: Store.etype_filter)
ETYPE_CODE = {t: i + 1 for i, t in enumerate(EVENT_TYPES)}
_ETYPES = (None, *EVENT_TYPES)
_ROLES = tuple(L.ROLES)
_ROLE_CODE = {r: i for i, r in enumerate(_ROLES)}
_TIERS = tuple(L.MEMORY_TIERS)
_TIER_CODE = {t: i for i, t in enumerate(_TIERS)}
_KINDS = tuple(L.MEMORY_KINDS)
_KIND_CODE = {k: i for i, k in enumerate(_KINDS)}

ID_BYTES = L.ULID_LEN               # a canonical ULID's characters
ID_RAW = 16                         # ... as a row holds them: the 128-bit number, big-endian
# a canonical ULID is one ULID_RE matches exactly as written (upper case): 26 Crockford digits, the
# first at most 7 (130 bits, the top two zero); any other id is kept as it is, an odd id
_KEY_CHARS = 12                     # the id's last 12 characters: 60 random bits, the lookup key
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_INT32 = str.maketrans(_CROCKFORD, "0123456789abcdefghijklmnopqrstuv")
_DIGIT8 = np.zeros(256, np.uint8)
_VALID8 = np.zeros(256, bool)
for _i, _c in enumerate(_CROCKFORD):
    _DIGIT8[ord(_c)] = _i
    _VALID8[ord(_c)] = True

# ids put since the sorted keys were last merged; beyond this many they are merged (a copy of the
# key arrays: ~20 ms at five million messages, once every RECENT_MAX puts)
RECENT_MAX = 65536

_NO_STR = (1 << 64) - 1             # a string column's "None"
_STR_LEN_BITS = 24
_STR_LEN_MASK = (1 << _STR_LEN_BITS) - 1
_SHIFT = TEXT_OFF_BITS + TEXT_LEN_BITS
_LOW = (1 << _SHIFT) - 1
_EXT_SPARSE = (1 << 32) - 1         # an ext with files: in the sparse dict, not shared


_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]   # 10 bits -> two digits
_M60 = (1 << 60) - 1
_M64 = (1 << 64) - 1


def id_raw(mid: str) -> bytes:
    """A canonical id's 16 bytes (the row's ``id``)."""
    return int(mid.translate(_TO_INT32), 32).to_bytes(ID_RAW, "big")


def id_text(raw: bytes, P=_PAIRS) -> str:
    """The canonical id of 16 bytes: two digits a lookup, unrolled (1.0 µs; a loop over the shifts
    1.7; decoding the 26 characters a version 2 row held, 0.2)."""
    n = int.from_bytes(raw, "big")
    return (P[n >> 120] + P[n >> 110 & 1023] + P[n >> 100 & 1023] + P[n >> 90 & 1023] + P[n >> 80 & 1023]
            + P[n >> 70 & 1023] + P[n >> 60 & 1023] + P[n >> 50 & 1023] + P[n >> 40 & 1023]
            + P[n >> 30 & 1023] + P[n >> 20 & 1023] + P[n >> 10 & 1023] + P[n & 1023])


_MIX = 0x9E3779B97F4A7C15          # 2^64 / golden ratio: spreads the high characters over the key
_MASK64 = (1 << 64) - 1


def id_key(mid: str) -> int:
    """The lookup key of a canonical id (the same as ``_keys`` computes for a column of them): its last
    12 characters (the random part) mixed with the 12 before them (time and the rest), so that ids
    alike in either half (sequential imports, a monotonic generator's run) still spread."""
    low = int(mid[ID_BYTES - _KEY_CHARS:].translate(_TO_INT32), 32)
    high = int(mid[ID_BYTES - 2 * _KEY_CHARS:ID_BYTES - _KEY_CHARS].translate(_TO_INT32), 32)
    return low ^ (high * _MIX & _MASK64)


def _keys(ids: np.ndarray) -> np.ndarray:
    """The keys (``id_key``) of rows of raw ids (an (n, 16) uint8 array): the last 60 bits mixed with
    the 60 before them."""
    hi, lo = _halves(ids)
    low = lo & np.uint64(_M60)
    high = ((hi << np.uint64(4)) | (lo >> np.uint64(60))) & np.uint64(_M60)
    return low ^ (high * np.uint64(_MIX))


def _halves(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of (n, 16) raw ids."""
    both = np.ascontiguousarray(ids).view(">u8").reshape(-1, 2).astype(np.uint64)
    return both[:, 0], both[:, 1]


def raw_ids(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids as 26 ASCII characters (an (n, 26) uint8 array; a version 2 row's) as (n, 16) raw ids, and
    which of them are canonical (digits of Crockford's alphabet, the first at most 7)."""
    digits = _DIGIT8[text]
    ok = (_VALID8[text].all(axis=1)) & (digits[:, 0] <= 7) if len(text) else np.zeros(0, bool)
    hi = np.zeros(len(text), np.uint64)
    lo = np.zeros(len(text), np.uint64)
    for c in range(ID_BYTES):
        hi = (hi << np.uint64(5)) | (lo >> np.uint64(59))
        lo = (lo << np.uint64(5)) | digits[:, c].astype(np.uint64)
    raw = np.empty((len(text), 2), ">u8")
    raw[:, 0], raw[:, 1] = hi, lo
    return raw.view(np.uint8).reshape(-1, ID_RAW), ok


class _Interned:
    """Values shared between rows (tag sets, tool names, exts), each stored once, by number."""

    __slots__ = ("values", "number")

    def __init__(self, none: Any) -> None:
        self.values: list[Any] = [none]
        self.number: dict[Any, int] = {none: 0}

    def code(self, value: Any, key: Any = None) -> int:
        key = value if key is None else key
        n = self.number.get(key)
        if n is None:
            n = self.number[key] = len(self.values)
            self.values.append(value)
        return n


# The row (docs/format.md §4.1), as numpy sees it for what is asked of many rows at once, and as
# ``struct`` packs and unpacks one row (the same layout: derived from this, never written twice)
ROW_DTYPE = np.dtype([("id", "S16"), ("session", "<u4"), ("ts", "<i8"), ("upd", "<i8"), ("rev", "<u4"),
                      ("importance", "u1"), ("rec_pos", "<u8"), ("text_low", "<u8"), ("rec_size", "<u4"),
                      ("tcid", "<u8"), ("tags", "<u4"), ("tool", "<u4"), ("ext", "<u4"), ("codes", "<u4")])
# the row of version 2 segments (issue 15 part 7): the id's 26 characters, 64-bit revision, importance and
# record size; read by converting it (_rows_from_v2)
ROW_DTYPE_V2 = np.dtype([("id", "S26"), ("session", "<u4"), ("ts", "<i8"), ("upd", "<i8"), ("rev", "<i8"),
                         ("importance", "<i8"), ("rec_pos", "<u8"), ("text_low", "<u8"), ("rec_size", "<u8"),
                         ("tcid", "<u8"), ("tags", "<u4"), ("tool", "<u4"), ("ext", "<u4"), ("codes", "<u4")])
# A revision or importance the row's narrow fields cannot hold (a revision past 2^32 - 2, an importance
# outside 0-254: only a hand-made log has them) is in the sparse ``wide`` dict, the row saying so by
# both fields at their maximum.
_REV_WIDE, _IMP_WIDE = (1 << 32) - 1, 0xFF
_I64_MIN, _I64_END = -(1 << 63), 1 << 63
_STRUCT_CODE = {"S": "s", "u1": "B", "u4": "I", "i8": "q", "u8": "Q"}
_ROW = struct.Struct("<" + "".join(
    f"{t.itemsize}s" if t.kind == "S" else _STRUCT_CODE[f"{t.kind}{t.itemsize}"]
    for t in (ROW_DTYPE.fields[name][0] for name in ROW_DTYPE.names)))
_ROW_SIZE = _ROW.size
assert ROW_DTYPE.itemsize == _ROW_SIZE
# rows gathered and scattered as opaque records: ~15x faster in numpy than through the structured dtype
_RECORD = np.dtype((np.void, _ROW_SIZE))
# single fields read in place, for the lookups a search makes of every candidate (cheaper than a row)
_ID_AT, _SESSION_AT, _TS_AT = ROW_DTYPE.fields["id"][1], ROW_DTYPE.fields["session"][1], ROW_DTYPE.fields["ts"][1]
_IMPORTANCE_AT = ROW_DTYPE.fields["importance"][1]
_U32, _I64 = struct.Struct("<I"), struct.Struct("<q")
# the rows a mapped base took the place of are freed this many bytes a step (MessageTable.rebase_step)
REBASE_FREE_STEP = 16 << 20
# a base in the table's own numbering (MessageTable.segment_columns(own=True)) says so by this head entry,
# and is written only while what its whole tables hold that no row uses is at most this many times what
# its rows use (at least 1 MiB of tool_call_ids, 1,024 sessions)
OWN_NUMBERING = "own_numbering"
OWN_WASTE_MAX = 1
# A base lies in the file as the rows do in the table — one a seq, from seq 0 to its last live one — so
# that a start maps it, and the daemon that wrote it maps it in place of its rows, instead of copying
# every row to the heap (430 MB at five million events): the seqs deleted before and between the live ones
# (and seq 0, never used) are written as dead rows (etype 0, every byte zero). Before this, one message
# deleted between two others had every later start copy the rows; and a base of live seqs from the first
# one on can only be mapped where the bytes before its rows section (the head, the seqs) are at least its
# first seq's rows (the mapping begins that far before it): a store whose oldest ~10% were deleted was
# copied too. A base carries at most this many dead rows a live one (beyond that it lists the live ones
# only, and a start copies them: a store mostly deleted).
BASE_HOLES_MAX = 1


def holes_fit(live: int, end: int) -> bool:
    """Whether a base of ``live`` rows, the last of seq ``end - 1``, is written with the dead seqs before
    and between them (BASE_HOLES_MAX)."""
    return live > 0 and end - live <= BASE_HOLES_MAX * live


class MessageTable:
    """Every live message's fields, by seq. ``put`` stores a message (a new one, or a new revision
    at its seq), ``drop`` forgets one, ``get`` builds it back.

    The fixed-width fields of a seq are one packed row (``_ROW``) in ``rows``: one ``unpack_from``
    reads them all (a field-per-array layout cost fifteen lookups a message), and ``ROW_DTYPE``
    views the same bytes as numpy columns for whatever is asked of every row at once."""

    __slots__ = ("rows", "base", "nbase", "_base_map", "_rows_file", "_keys_file", "etype", "etype_epoch", "tcid_bytes", "summary",
                 "relations", "source_ids", "ext_files", "wide", "odd_id", "odd_seq", "sids", "sid_number", "tagsets", "tools", "exts", "sources", "generation", "count",
                 "keys", "key_seqs", "_keys_view", "_seqs_view", "base_keys", "base_key_seqs", "_bkeys_view",
                 "_bseqs_view", "recent", "by_seq", "by_id", "_rebase_end", "_rebase_keys", "held_bytes",
                 "_rebase_dirty", "_rebase_keyed", "_rebase", "_rows_retired", "_base_at", "_gen0_current")

    # id (16 bytes: the ULID's number; zeros for an odd id), session number (from 1), timestamp,
    # updated_at, revision (u32), importance (u8; both at their maximum: see ``wide``), the text's record
    # position and its offset | length (text.locate),
    # the record's size, tool_call_id (start << 24 | length in tcid_bytes, or _NO_STR), the numbers of
    # the tag set, tool and ext (_Interned), and role | tier << 8 | kind << 16 | source generation << 24

    def __init__(self) -> None:
        self.rows = bytearray()           # _ROW_SIZE bytes a seq, from seq nbase on
        # the rows of seqs below nbase: a copy-on-write mapping of a base row segment's rows (load_segments),
        # whose pages stay the page cache's until one is written (0: none, every row is in ``rows``)
        self.base = memoryview(b"")
        self.nbase = 0
        self._base_map = None
        self._base_at = 0                 # where ``base`` begins in ``_base_map``
        # the names of the files its rows and its id keys are mapped from (mapped_names: never cut under them)
        self._rows_file: str | None = None
        self._keys_file: str | None = None
        self.etype = bytearray()          # ETYPE_CODE (0: no live message), read in bulk by etype_filter
        self.etype_epoch = 0              # moves when a live row's type changes (filter bounds' key)
        self.tcid_bytes = bytearray()
        self.summary: dict[int, str] = {}
        self.relations: dict[int, tuple] = {}
        self.source_ids: dict[int, tuple] = {}
        self.ext_files = ExtFiles(self._ext_from_log)   # seq -> ext with files (packed as segments hold them)
        self.wide: dict[int, tuple[int, int]] = {}   # seq -> (revision, importance) the row cannot hold
        self.odd_id: dict[int, str] = {}  # seq -> an id that is not a canonical ULID
        self.odd_seq: dict[str, int] = {}
        self.sids: list[str] = []         # session number - 1 -> session id
        self.sid_number: dict[str, int] = {}
        self.tagsets = _Interned(())
        self.tools = _Interned(None)
        self.exts = _Interned(None)
        # the text's readers by generation (Store.start_relocation moves to a new one)
        self.sources: dict[int, LogText] = {}
        self.generation = 0
        # generation 0 names the current source: from the start until a compaction's relocation begins,
        # and again once it is over (``relocated``) — what a base mapped in place of the rows needs, its
        # codes' top byte being zero
        self._gen0_current = True
        self.count = 0
        # what the live messages hold beside their packed rows (``_held``): health's metadata_bytes
        self.held_bytes = 0
        # id -> seq, in three levels a lookup tries in turn: the ids put since the last merge (``recent``);
        # the sorted keys and seqs merged from them (``keys``, ``key_seqs``: in memory); and the sorted
        # keys and seqs of the base (``base_keys``, ``base_key_seqs``: read-only, mapped from the base's
        # file where they can be), which a merge never copies — at five million ids they are 80 MB, and a
        # merge into them made them the heap's, copying them every RECENT_MAX puts (~20 ms each). The
        # base's may name seqs since deleted: a lookup checks the row's liveness and its id anyway.
        # (The memoryviews are what bisect reads in C.)
        self.keys = np.zeros(0, np.uint64)
        self.key_seqs = np.zeros(0, np.int64)
        self._keys_view = memoryview(self.keys)
        self._seqs_view = memoryview(self.key_seqs)
        self.base_keys = self.keys
        self.base_key_seqs = self.key_seqs
        self._bkeys_view = self._keys_view
        self._bseqs_view = self._seqs_view
        self.recent: dict[str, int] = {}
        self.by_seq = BySeq(self)
        self.by_id = ById(self)
        # a base this process is having written of its own rows, to be mapped in their place once it is
        # (``rebase_track``): the seqs below _rebase_end written since the fork, and the mapping in steps
        self._rebase_end = 0
        self._rebase_keys = 0   # the id keys the base holds (one a live canonical id at the fork)
        self._rebase_dirty: set[int] | None = None
        # which seqs below _rebase_end held a live canonical id at the fork (one byte a seq): the rows whose
        # ids the base's keys must be the keys of (rebase_step)
        self._rebase_keyed: np.ndarray | None = None
        self._rebase: _Rebase | None = None
        self._rows_retired: list[bytearray] = []   # the rows mapped bases replaced, freed in steps

    # ------------------------------------------------------------------ rows
    def __len__(self) -> int:
        return self.count

    def _grow(self, n: int) -> None:
        """Rows up to seq ``n - 1`` exist (new ones zero: no message)."""
        k = n - len(self.etype)
        if k > 0 and not self.etype:  # fresh zeroed memory, not zeros copied in
            self.rows, self.etype = bytearray(n * _ROW_SIZE), bytearray(n)
        elif k > 0:
            self.rows.extend(bytes(k * _ROW_SIZE))
            self.etype.extend(bytes(k))

    def alive(self, seq: int) -> bool:
        return 0 <= seq < len(self.etype) and self.etype[seq] != 0

    def set_source(self, src: LogText) -> None:
        """Texts stored from now on are read by ``src`` (a new generation: Store.start_relocation).
        Generations go round 1 to 255, never back to 0, which ``relocated`` makes name the current
        source again (rows of a base mapped in place of the rows read generation 0)."""
        if self.sources and self.sources[self.generation] is not src:
            self.generation = self.generation % 255 + 1
            self._gen0_current = False
        self.sources[self.generation] = src

    def relocated(self, src: LogText) -> None:
        """Every live row reads ``src`` now (a compaction's relocation is over, each row rewritten: all of
        them on the heap, 430 MB at five million events): generation 0 names it too, so that a base
        written of the rows (whose codes' top byte is zero on disk) can be mapped in their place
        (``rebase_span``). Before, the rows stayed on the heap until a restart. (``src`` is given: with
        no live row to move, nothing made it a generation yet.)"""
        self.set_source(src)
        self.sources[0] = src
        self._gen0_current = True

    def source_of(self, seq: int) -> LogText:
        return self.sources[self.row(seq)[13] >> 24]

    def _at(self, seq: int) -> tuple[Any, int]:
        """The buffer holding ``seq``'s row and where in it."""
        nbase = self.nbase
        return (self.base, seq * _ROW_SIZE) if seq < nbase else (self.rows, (seq - nbase) * _ROW_SIZE)

    def row(self, seq: int) -> tuple:
        """The packed row of ``seq`` as a tuple (ROW_DTYPE's fields, in order)."""
        return _ROW.unpack_from(*self._at(seq))

    def put(self, msg: Message, src: LogText | None = None) -> None:
        """Store ``msg`` at its seq (a new revision replaces the row). Its text must be stored: its
        ``text`` a location (Store._store_text)."""
        self._put(msg.seq, msg.message_id, msg.session_id, msg.timestamp, msg.role, msg.text, msg.revision,
                  msg.updated_at, msg.tool_call_id, msg.tags, msg.tier, msg.kind, msg.importance, msg.summary,
                  msg.relations, msg.source_ids, msg.etype, msg.tool, msg.ext, msg.rec_size,
                  msg.src if src is None else src)

    def _put(self, seq: int, mid: str, sid: str, ts: int, role: str, loc: int, rev: int, upd: int,
             tcid: str | None, tags: tuple, tier: str, kind: str, importance: int, summary: str | None,
             relations: tuple, source_ids: tuple, etype: str, tool: str | None, ext: tuple | None,
             rec_size: int, src: LogText) -> None:
        if loc.__class__ is not int:
            raise ValueError("a message's text must be stored before the table holds it")
        canonical = len(mid) == ID_BYTES and ULID_RE.fullmatch(mid)
        raw = id_raw(mid) if canonical else b""
        wide = not (0 <= rev < _REV_WIDE and 0 <= importance < _IMP_WIDE)
        if wide and not (_I64_MIN <= rev < _I64_END and _I64_MIN <= importance < _I64_END):
            raise ValueError(f"message {mid!r} has a revision or importance the message table cannot hold")
        encoded = tcid.encode("utf-8") if tcid is not None else b""
        if len(encoded) > _STR_LEN_MASK:
            raise ValueError(f"message {mid!r} has a tool_call_id longer than the message table holds")
        tcid_at = _NO_STR if tcid is None else len(self.tcid_bytes) << _STR_LEN_BITS | len(encoded)
        if ext is None:
            ext_no = 0
        elif ext[3]:
            ext_no = _EXT_SPARSE
        else:
            ext_no = self.exts.code(ext, ext_key(ext))
        if src is not self.sources.get(self.generation):
            self.set_source(src)
        # packed before anything changes: a value the row cannot hold (a hand-made log's timestamp
        # of 2^63) leaves the table as it was
        try:
            packed = _ROW.pack(raw, self._sid_number(sid), ts, upd, _REV_WIDE if wide else rev,
                               _IMP_WIDE if wide else importance, loc >> _SHIFT,
                                   loc & _LOW, rec_size, tcid_at, self.tagsets.code(tags) if tags else 0,
                                   self.tools.code(tool) if tool is not None else 0, ext_no,
                                   _ROLE_CODE[role] | _TIER_CODE[tier] << 8 | _KIND_CODE[kind] << 16
                                   | self.generation << 24)
        except struct.error as exc:
            raise ValueError(f"message {mid!r} has a field the message table cannot hold ({exc})") from None
        if seq >= len(self.etype):
            self._grow(seq + 1 + (seq >> 4))
        if self.etype[seq]:
            self._forget(seq)
        else:
            self.count += 1
        if canonical:
            self.recent[mid] = seq
        else:
            self.odd_id[seq] = mid
            self.odd_seq[mid] = seq
        if tcid is not None:
            self.tcid_bytes += encoded
        if ext_no == _EXT_SPARSE:
            self.ext_files[seq] = ext
        if wide:
            self.wide[seq] = (rev, importance)
        if self._rebase_dirty is not None and seq < self._rebase_end:
            self._rebase_dirty.add(seq)
        buf, off = self._at(seq)
        buf[off:off + _ROW_SIZE] = packed
        code = ETYPE_CODE[etype]
        if self.etype[seq] not in (0, code):
            self.etype_epoch += 1
        self.etype[seq] = code
        if summary is not None:
            self.summary[seq] = summary
        if relations:
            self.relations[seq] = relations
        if source_ids:
            self.source_ids[seq] = source_ids
        self.held_bytes += self._held(seq)
        if len(self.recent) >= RECENT_MAX:
            self.merge_keys()

    def load_row(self, row: list[Any], src: LogText) -> None:
        """Store a snapshot row of the current length (``Message.row``) without building a Message."""
        (mid, sid, seq, ts, role, loc, rev, upd, tcid, tags, tier, kind, importance, summary,
         relations, source_ids, etype, tool, ext, rec_size) = row
        self._put(seq, mid, sid, ts, role, location_from_parts(loc), rev, upd, tcid,
                  shared_tags(tags) if tags else (), tier, kind, importance, summary,
                  tuple((r[0], r[1]) for r in relations) if relations else (),
                  tuple(source_ids) if source_ids else (), etype, intern(tool) if tool is not None else None,
                  shared_ext_from(ext) if ext is not None else None, rec_size, src)

    def _held(self, seq: int) -> int:
        """The bytes the live message at ``seq`` holds beside its packed row: its tool_call_id, summary,
        relations, source ids and files (tags, tool and a shared ext are numbers in the row). The same
        whether the row was put or loaded from a segment, so what a put adds its removal takes away
        and a start counts what a replay does."""
        row = self.row(seq)
        tcid, files = row[9], row[12] == _EXT_SPARSE
        return (0 if tcid == _NO_STR else tcid & _STR_LEN_MASK) + self._sparse_held(seq, files)

    def _sparse_held(self, seq: int, files: bool) -> int:
        """``_held`` but the tool_call_id: what the sparse fields hold for ``seq`` (``files``: it has an
        entry in ``ext_files``, which is only looked up then — a put is a hot path)."""
        n = self.ext_files.entry_bytes(seq) if files else 0
        summary = self.summary.get(seq)
        if summary is not None:
            n += str_bytes(summary)
        relations = self.relations.get(seq)
        if relations:
            n += sys.getsizeof(relations) + sum(sys.getsizeof(r) + sys.getsizeof(r[1]) for r in relations)
        source_ids = self.source_ids.get(seq)
        if source_ids:
            n += sys.getsizeof(source_ids) + sum(sys.getsizeof(x) for x in source_ids)
        return n

    def _held_all(self) -> int:
        """``_held`` summed over every live message at once (after a bulk load)."""
        seqs = self.live_seqs()
        if not len(seqs):
            return 0
        tcid = self._gather(seqs, "tcid")
        n = int((tcid[tcid != np.uint64(_NO_STR)] & np.uint64(_STR_LEN_MASK)).sum(dtype=np.uint64))
        with_files = set(self.ext_files)
        sparse = set(self.summary) | set(self.relations) | set(self.source_ids) | with_files
        return n + sum(self._sparse_held(seq, seq in with_files) for seq in sparse)

    def _forget(self, seq: int) -> None:
        """Drop what a row holds outside its packed bytes."""
        self.held_bytes -= self._held(seq)
        mid = self.odd_id.pop(seq, None)
        if mid is not None:
            if self.odd_seq.get(mid) == seq:
                del self.odd_seq[mid]
        else:
            mid = self.message_id(seq)
            if self.recent.get(mid) == seq:
                del self.recent[mid]
        self.summary.pop(seq, None)
        self.wide.pop(seq, None)
        self.relations.pop(seq, None)
        self.source_ids.pop(seq, None)
        self.ext_files.discard(seq)

    def drop(self, seq: int) -> None:
        if not self.alive(seq):
            raise KeyError(seq)
        self._forget(seq)
        self.etype[seq] = 0
        self.count -= 1

    def relocate(self, seq: int, loc: int, rec_size: int, src: LogText) -> None:
        """The message at ``seq`` reads its text at ``loc`` in ``src``'s log from now on."""
        if src is not self.sources.get(self.generation):
            self.set_source(src)
        fields = list(self.row(seq))
        fields[6], fields[7], fields[8] = loc >> _SHIFT, loc & _LOW, rec_size
        fields[13] = (fields[13] & 0xFFFFFF) | self.generation << 24
        if self._rebase_dirty is not None and seq < self._rebase_end:
            self._rebase_dirty.add(seq)
        _ROW.pack_into(*self._at(seq), *fields)

    # ------------------------------------------------------------------ fields without a Message
    def message_id(self, seq: int) -> str:
        odd = self.odd_id.get(seq) if self.odd_id else None
        if odd is not None:
            return odd
        buf, off = self._at(seq)
        return id_text(buf[off:off + ID_RAW])

    def session_id(self, seq: int) -> str:
        buf, off = self._at(seq)
        return self.sids[_U32.unpack_from(buf, off + _SESSION_AT)[0] - 1]

    def timestamp(self, seq: int) -> int:
        buf, off = self._at(seq)
        return _I64.unpack_from(buf, off + _TS_AT)[0]

    def importance(self, seq: int) -> int:
        """The importance of the live message at ``seq``, read in place (a search's tiebreak asks it of
        every doc of its pool: building each Message for it was ~1.7 ms of a 5M query's ~9)."""
        buf, off = self._at(seq)
        importance = buf[off + _IMPORTANCE_AT]
        return self.wide[seq][1] if importance == _IMP_WIDE else importance

    def importances(self, seqs: np.ndarray) -> np.ndarray:
        """``importance`` of each of ``seqs`` (live messages), as int64, read in C (a search's tiebreak
        over many docs tied at its cut: SearchIndex._tied_first)."""
        out = self._gather(seqs, "importance").astype(np.int64)
        for i in np.flatnonzero(out == _IMP_WIDE).tolist():
            out[i] = self.wide[int(seqs[i])][1]
        return out

    def etype_of(self, seq: int) -> str | None:
        """The event type of the message at ``seq`` (None: no live message there)."""
        return _ETYPES[self.etype[seq]] if 0 <= seq < len(self.etype) else None

    def rec_size(self, seq: int) -> int:
        return self.row(seq)[8]

    def get(self, seq: int, lenient: bool = False) -> Message | None:
        """The message at ``seq``, built from its row (None if there is none). ``lenient``: a message
        whose ext with files can be read from neither its packed entry nor its log record (both damaged)
        is built without it rather than failing (the store's own bookkeeping: Store._apply)."""
        seq = int(seq)
        if seq < 0 or seq >= len(self.etype):
            return None
        etype = self.etype[seq]
        if not etype:
            return None
        (raw, number, ts, upd, rev, importance, rec_pos, low, rec_size, tcid, tags, tool, ext,
         codes) = _ROW.unpack_from(*self._at(seq))
        if importance == _IMP_WIDE:
            rev, importance = self.wide[seq]
        if tcid != _NO_STR:
            start = tcid >> _STR_LEN_BITS
            tcid = self.tcid_bytes[start:start + (tcid & _STR_LEN_MASK)].decode("utf-8")
        else:
            tcid = None
        odd = self.odd_id.get(seq) if self.odd_id else None
        msg = Message(id_text(raw) if odd is None else odd, self.sids[number - 1], seq, ts,
                      _ROLES[codes & 0xFF], rec_pos << _SHIFT | low, rev, ts if upd == ts else upd,
                      tcid, self.tagsets.values[tags], _TIERS[codes >> 8 & 0xFF], _KINDS[codes >> 16 & 0xFF],
                      importance, self.summary.get(seq), self.relations.get(seq, ()), self.source_ids.get(seq, ()),
                      rec_size, _ETYPES[etype], self.tools.values[tool],
                      self._ext_at(seq, lenient) if ext == _EXT_SPARSE else self.exts.values[ext])
        msg.src = self.sources[codes >> 24]
        return msg

    # ------------------------------------------------------------------ ids
    def seq_of(self, mid: str) -> int | None:
        """The seq of the live message ``mid``, or None."""
        seq = self.recent.get(mid)
        if seq is not None:
            return seq
        if len(mid) != ID_BYTES or not ULID_RE.fullmatch(mid):
            return self.odd_seq.get(mid)
        key = id_key(mid)
        seq = self._seek(self._keys_view, self._seqs_view, key, mid)
        return seq if seq is not None else self._seek(self._bkeys_view, self._bseqs_view, key, mid)

    def _seek(self, keys: memoryview, seqs: memoryview, key: int, mid: str) -> int | None:
        """The live seq of the canonical id ``mid`` (lookup key ``key``) among sorted ``keys``, or None."""
        i = bisect.bisect_left(keys, key)
        n = len(keys)
        if i == n or keys[i] != key:
            return None
        raw = id_raw(mid)
        etype, odd = self.etype, self.odd_id
        while i < n and keys[i] == key:
            seq = seqs[i]
            if etype[seq]:
                buf, off = self._at(seq)
                if buf[off:off + ID_RAW] == raw and not (odd and seq in odd):
                    return seq
            i += 1
        return None

    def _set_keys(self, keys: np.ndarray, seqs: np.ndarray) -> None:
        self.keys, self.key_seqs = keys, seqs
        self._keys_view, self._seqs_view = memoryview(keys), memoryview(seqs)

    def _set_base_keys(self, keys: np.ndarray, seqs: np.ndarray, file: str | None) -> None:
        """The base level of the id lookup (``file``: the name of the file they are mapped from, if they are)."""
        self.base_keys, self.base_key_seqs = keys, seqs
        self._bkeys_view, self._bseqs_view = memoryview(keys), memoryview(seqs)
        self._keys_file = file

    def merge_keys(self) -> None:
        """Move the recent ids into the sorted keys (not the base's), and drop the keys of seqs no longer
        live."""
        if not self.recent:
            return
        seqs = np.fromiter(self.recent.values(), np.int64, len(self.recent))
        self.recent.clear()
        new_keys = _keys(self._id_rows(seqs))
        order = np.argsort(new_keys)  # equal keys need no order: a lookup tries each
        new_keys, seqs = new_keys[order], seqs[order]
        keys, key_seqs = self.keys, self.key_seqs
        if len(keys):
            live = np.frombuffer(self.etype, np.uint8)[key_seqs] != 0
            keys, key_seqs = keys[live], key_seqs[live]
            at = np.searchsorted(keys, new_keys)
            keys, key_seqs = np.insert(keys, at, new_keys), np.insert(key_seqs, at, seqs)
        else:
            keys, key_seqs = new_keys, seqs
        self._set_keys(keys, key_seqs)

    def _id_rows(self, seqs: np.ndarray) -> np.ndarray:
        """The raw ids of ``seqs`` as an (n, 16) uint8 array (a copy)."""
        return self._gather(seqs, "id").view(np.uint8).reshape(-1, ID_RAW)

    def _canonical(self, seqs: np.ndarray) -> np.ndarray:
        """Which of ``seqs`` hold a canonical id (not one of ``odd_id``'s)."""
        if not self.odd_id:
            return np.ones(len(seqs), bool)
        return ~np.isin(seqs, np.fromiter(self.odd_id, np.int64, len(self.odd_id)))

    def index_all_ids(self) -> None:
        """The sorted keys of every live canonical id, at once (after a bulk load)."""
        self.recent.clear()
        seqs = self.live_seqs()
        seqs = seqs[self._canonical(seqs)]
        keys = _keys(self._id_rows(seqs))
        order = np.argsort(keys)  # equal keys need no order: a lookup tries each
        self._set_base_keys(keys[order], seqs[order], None)
        empty = np.zeros(0, np.uint64)
        self._set_keys(empty, empty.view(np.int64))

    # ------------------------------------------------------------------ row segments (snapshot.py)
    def segment_columns(self, seqs: np.ndarray, locs: Any = None, rec_sizes: Any = None,
                        own: bool = False, holes: bool = False) -> dict[str, Any]:
        """The rows of ``seqs`` (live, ascending) as a row segment holds them (docs/format.md §4.1): the
        packed rows as they are here, but numbered against tables of the segment's own (session ids,
        tag sets, tools, exts) and with tool_call_ids in a byte string of its own, so a segment reads
        the same in any process; the rarer fields as [seq, value] pairs. ``locs`` / ``rec_sizes``
        (a compaction's): the texts' locations and record sizes in a new log, by position in ``seqs``.

        ``holes`` (a base): the dead seqs from 0 to the last of ``seqs`` are written too, as dead rows
        (every byte zero), where ``holes_fit`` (BASE_HOLES_MAX says why).

        ``own`` (a base of every row, ``rebase_span`` not None): where ``_own_numbering_fits``, the tables
        are this table's whole ones and the rows' bytes exactly this table's, the head's first entry
        saying so (OWN_NUMBERING), so the process that has it written can map the file in place of its
        rows (``rebase_open``); a start reads it as any base. Else numbered as ever (its planner then
        leaves its rows as they are)."""
        seqs = np.asarray(seqs, np.int64)
        if len(seqs) and (seqs.min() < 0 or seqs.max() >= len(self.etype)):
            raise ValueError("a row segment can only hold live rows")
        n_live = len(seqs)
        if holes and n_live and holes_fit(n_live, int(seqs[-1]) + 1):
            seqs = np.arange(int(seqs[-1]) + 1, dtype=np.int64)
        rows = self._gather(seqs, dtype=_RECORD).view(ROW_DTYPE)   # a copy
        etype = np.frombuffer(self.etype, np.uint8)[seqs]
        live = etype != 0
        if int(np.count_nonzero(live)) != n_live:
            raise ValueError("a row segment can only hold live rows")
        dead = None if n_live == len(seqs) else ~live
        if dead is not None:   # (what a deleted message's row held is not written again)
            rows.view(np.uint8).reshape(-1, _ROW_SIZE)[dead] = 0
        if locs is not None:
            at = slice(None) if dead is None else np.flatnonzero(live)
            rows["rec_pos"][at] = [loc >> _SHIFT for loc in locs]
            rows["text_low"][at] = [loc & _LOW for loc in locs]
            rows["rec_size"][at] = np.asarray(rec_sizes, np.uint32)
        rows["codes"] &= np.uint32(0xFFFFFF)   # the source generation is this process's own
        own = own and locs is None and self._own_numbering_fits(seqs, rows)
        if own:   # the tables whole, the rows as they lie here (but for that top byte: see ``relocated``)
            sids, tagsets, tools, exts = list(self.sids), self.tagsets.values, self.tools.values, self.exts.values
            tcid = bytes(self.tcid_bytes)
        elif dead is None:
            sids, tagsets, tools, exts, tcid = self._renumbered(rows)
        else:   # the live rows alone (a copy, put back): a dead row's zeros number nothing
            written = rows[live]
            sids, tagsets, tools, exts, tcid = self._renumbered(written)
            rows[live] = written
        canonical = self._canonical(seqs) & live
        ids = rows.view(np.uint8).reshape(-1, _ROW_SIZE)[:, :ID_RAW]
        keys, key_seqs = _keys(ids[canonical]), seqs[canonical]
        order = np.argsort(keys)
        wanted = set(seqs[live].tolist()) if n_live != self.count else None
        ext_sections = self.ext_files.sections(None if wanted is None else seqs[live])

        def pairs(values: dict[int, Any], form=lambda v: v) -> list[list[Any]]:
            return sorted([seq, form(v)] for seq, v in values.items() if wanted is None or seq in wanted)

        return {
            # (first: a reader of the head finds it without decoding the rest)
            **({OWN_NUMBERING: True} if own else {}),
            "seqs": seqs.astype("<u8").tobytes(), "rows": rows.tobytes(), "etype": etype.tobytes(),
            "tcid": tcid,
            # the canonical ids' lookup keys, sorted, and their seqs: a start merges them, not sorts them
            "keys": keys[order].astype("<u8").tobytes(), "key_seqs": key_seqs[order].astype("<u8").tobytes(),
            "sids": sids,
            "tagsets": [list(t) for t in tagsets], "tools": list(tools),
            "exts": [None if e is None else [e[0], e[1], e[2]] for e in exts],
            "summary": pairs(self.summary), "relations": pairs(self.relations, lambda v: [list(r) for r in v]),
            "source_ids": pairs(self.source_ids, list),
            "odd_ids": pairs(self.odd_id), "wide": pairs(self.wide, list),
            **ext_sections,
        }

    def _renumbered(self, rows: np.ndarray) -> tuple[list, list, list, list, bytes]:
        """Number ``rows`` (a copy, changed in place) against tables of their own: (session ids, tag
        sets, tools, exts, tool_call_ids' bytes) holding only what the rows use."""
        numbers, rows["session"] = np.unique(rows["session"], return_inverse=True)
        rows["session"] += np.uint32(1)
        sids = [self.sids[int(k) - 1] for k in numbers]
        tables = {}
        for name, interned in (("tags", self.tagsets), ("tool", self.tools)):
            numbers = np.union1d(np.zeros(1, np.uint32), rows[name])   # 0 (none) keeps number 0
            rows[name] = np.searchsorted(numbers, rows[name])
            tables[name] = [interned.values[int(k)] for k in numbers]
        shared = rows["ext"] != _EXT_SPARSE
        numbers = np.union1d(np.zeros(1, np.uint32), rows["ext"][shared])
        rows["ext"][shared] = np.searchsorted(numbers, rows["ext"][shared])
        exts = [self.exts.values[int(k)] for k in numbers]
        has = np.flatnonzero(rows["tcid"] != np.uint64(_NO_STR))
        pieces, at, blob = [], 0, self.tcid_bytes
        tcids = rows["tcid"][has].tolist()
        for i, value in enumerate(tcids):
            start, n = value >> _STR_LEN_BITS, value & _STR_LEN_MASK
            pieces.append(blob[start:start + n])
            tcids[i] = at << _STR_LEN_BITS | n
            at += n
        rows["tcid"][has] = np.asarray(tcids, np.uint64)
        return sids, tables["tags"], tables["tool"], exts, b"".join(pieces)

    def _own_numbering_fits(self, seqs: np.ndarray, rows: np.ndarray) -> bool:
        """Whether a base of ``rows`` (of ``seqs``; a dead one all zeros) may be written in the table's own
        numbering: every live row, lying as the rows do (``rebase_span``), reading the source generation 0
        names, and the whole tables holding no more that no row uses than
        OWN_WASTE_MAX allows (tool_call_ids that updates replaced, sessions whose messages were deleted:
        a base numbered as ever leaves them behind, and a start loads only what it names)."""
        if not len(seqs) or self.rebase_span() != (int(seqs[0]), int(seqs[-1]) + 1):
            return False
        tcid = rows["tcid"]
        live_tcid = int((tcid[tcid != np.uint64(_NO_STR)] & np.uint64(_STR_LEN_MASK)).sum(dtype=np.uint64))
        used_sids = int(np.count_nonzero(np.bincount(rows["session"], minlength=len(self.sids) + 1)[1:]))
        return (len(self.tcid_bytes) - live_tcid <= OWN_WASTE_MAX * max(live_tcid, 1 << 20)
                and len(self.sids) - used_sids <= OWN_WASTE_MAX * max(used_sids, 1024))

    # ------------------------------------------------------------------ a base mapped in place of the rows
    # A daemon that imports millions of events holds their rows in ``rows`` (85 bytes each: 430 MB at
    # five million) until a restart maps the base its snapshots wrote. Instead: a background snapshot's
    # base is written in the table's own numbering (``segment_columns(own=True)``), the seqs written from
    # its fork on are noted (``rebase_track``), and once it is installed the file is mapped copy-on-write
    # (``rebase_open``) and checked against the rows a step at a time (``rebase_step``: the noted rows are
    # written into the mapping, any other difference gives the mapping up); the last step puts the
    # mapping in place of the rows below its end and keeps only the rows above it.

    def live_span(self) -> tuple[int, int] | None:
        """(0, end) — ``end`` past the last live seq — when a base of the live rows lies as the rows do
        (the dead seqs before and between them within BASE_HOLES_MAX: ``holes_fit``); None if not, or
        none is live."""
        if not self.count:
            return None
        alive = np.frombuffer(self.etype, np.uint8) != 0
        end = len(alive) - int(alive[::-1].argmax())
        return (0, end) if holes_fit(self.count, end) else None

    def base_rows(self) -> int:
        """How many rows a base of the table holds (``segment_columns(holes=True)`` of the live seqs):
        one a seq over ``live_span``, else one a live seq."""
        span = self.live_span()
        return self.count if span is None else span[1] - span[0]

    def rebase_span(self) -> tuple[int, int] | None:
        """(0, end) of the live seqs (``live_span``) when a base of them can be mapped in place of the rows: it lies as
        the rows do (``live_span``) and generation 0 names the source they read (no compaction's
        relocation is under way: ``relocated``), and it reaches past the base mapped now (the newest
        messages deleted: a base ending below it cannot take its place; the next one will)."""
        span = self.live_span() if self._gen0_current else None
        return span if span is not None and span[1] >= self.nbase else None

    def rebase_track(self, end: int) -> None:
        """Note from now on the seqs below ``end`` whose rows are written (a base of them is being
        written by a forked child); any mapping of an earlier base not yet in place is given up. (And
        how many id keys the base holds: one a live canonical id.)"""
        self.rebase_abandon()
        self._rebase_end = end
        self._rebase_dirty = set()
        self._rebase_keys = self.count - len(self.odd_id)
        keyed = np.frombuffer(self.etype, np.uint8, min(end, len(self.etype))) != 0   # (a copy: ~1 ms at 5M)
        if self.odd_id:
            keyed[[seq for seq in self.odd_id if seq < len(keyed)]] = False
        self._rebase_keyed = keyed

    def rebase_abandon(self) -> None:
        self._rebase_dirty = None
        self._rebase_keyed = None
        self._rebase_end = 0
        self._rebase_keys = 0
        self._rebase = None

    @property
    def rows_file(self) -> str | None:
        """The name of the base file the rows below ``nbase`` are mapped from (None: none)."""
        return self._rows_file

    @property
    def rebase_checking(self) -> bool:
        """A base is mapped and being checked against the rows (not yet in their place)."""
        return self._rebase is not None

    @property
    def rebasing(self) -> bool:
        """A base is mapped and being checked against the rows, or the rows it replaced are being freed
        (``rebase_step`` has work)."""
        return self._rebase is not None or bool(self._rows_retired)

    def rebase_open(self, path: str, where: "RowsSections", first: int, end: int) -> None:
        """Map the rows of seqs ``first``..``end`` of the base at ``path`` (``where``: where its sections lie,
        snapshot.rows_sections_at) to be checked by ``rebase_step``, and its id keys (read-only) to be
        checked with them. OSError / ValueError (nothing changes but the tracking, which stops) if it is
        not the base ``rebase_track`` was told of or cannot be mapped."""
        dirty = self._rebase_dirty
        try:
            if dirty is None or end != self._rebase_end or not 0 <= first < end or end < self.nbase \
                    or where.rows_at < first * _ROW_SIZE:
                raise ValueError("the base is not the one whose rows were tracked")
            if where.keys != self._rebase_keys:
                raise ValueError(f"the base holds {where.keys} id keys where the table had {self._rebase_keys}")
            mm, at = map_private(path, where.rows_at - first * _ROW_SIZE, end * _ROW_SIZE, where.identity)
            keys = seqs = None
            if where.keys:
                n = where.keys * 8
                kmm, kat = map_private(path, where.keys_at, n, where.identity, writable=False)
                smm, sat = map_private(path, where.key_seqs_at, n, where.identity, writable=False)
                keys, seqs = np.frombuffer(kmm, np.uint64, where.keys, kat), np.frombuffer(smm, np.int64, where.keys, sat)
        except BaseException:
            self.rebase_abandon()
            raise
        self._rebase = _Rebase(mm, memoryview(mm)[at:at + end * _ROW_SIZE], at, first, end,
                               os.path.basename(path), first, keys, seqs)

    def rebase_step(self, rows: int) -> bool:
        """Check up to ``rows`` rows of the mapped base against the table's, the ones written since the
        fork written into it, and let the mapping's pages just read go (the page cache keeps them);
        after the last, put the mapping in place (and then free the rows it replaced, REBASE_FREE_STEP
        bytes a step). True while there is more to do; a row that differs
        unwritten (a base that is not these rows) gives the mapping up, logged by the caller
        (``RebaseMismatch``)."""
        rb = self._rebase
        if rb is None:
            retired = self._rows_retired
            if not retired:
                return False
            # from its end: no byte moves, and it is reallocated smaller (its pages unmapped) each time
            # it falls below half (freed at once, 430 MB of rows took ~25 ms)
            del retired[-1][-REBASE_FREE_STEP:]
            if not retired[-1]:
                retired.pop()
            return bool(retired)
        lo, hi = rb.next, min(rb.end, rb.next + rows)
        if lo < hi:
            mine = self._gather(np.arange(lo, hi, dtype=np.int64), dtype=_RECORD).view(np.uint8).reshape(-1, _ROW_SIZE)
            mine[:, _GENERATION_AT] = 0   # (a copy) as the base holds them: see ``relocated``
            if rb.keys is not None:   # the keys' share of these rows: their ids' keys, summed with their seqs
                keyed = np.flatnonzero(self._rebase_keyed[lo:hi])
                ids = np.ascontiguousarray(mine[keyed][:, _ID_AT:_ID_AT + ID_RAW])
                rb.rows_sum = (rb.rows_sum + _pair_sum(_keys(ids), keyed + lo)) & _M64
                rb.rows_keyed += len(keyed)
            theirs = np.frombuffer(rb.view, np.uint8, (hi - lo) * _ROW_SIZE, lo * _ROW_SIZE).reshape(-1, _ROW_SIZE)
            differ = np.flatnonzero((mine != theirs).any(axis=1))
            if len(differ):
                dirty, alive = self._rebase_dirty, self.etype
                for i in differ.tolist():
                    seq = lo + i
                    if seq in dirty or not alive[seq]:   # (a dead row is never read)
                        continue
                    self.rebase_abandon()
                    raise RebaseMismatch(f"row {seq} of the base {rb.name} differs from the table's")
                for i in differ.tolist():
                    rb.view[(lo + i) * _ROW_SIZE:(lo + i + 1) * _ROW_SIZE] = mine[i].tobytes()
            # the pages just read let go (the page cache keeps them), the base's and the current base's the
            # table's rows came from: during a bulk import no gap lets the mapped-page cap do it, and the
            # whole current base was resident over each check (~270 MB at 2.9M events) until the install
            _drop_rows(rb.mm, rb.at, lo, hi)
            if lo < self.nbase and self._base_map is not None:
                _drop_rows(self._base_map, self._base_at, lo, min(hi, self.nbase))
            rb.next = hi
        if rb.keys is not None and rb.keys_next < len(rb.keys):
            self._rebase_check_keys(rb, rows)
        if rb.next < rb.end or (rb.keys is not None and rb.keys_next < len(rb.keys)):
            return True
        if rb.keys is not None and (rb.rows_keyed != len(rb.keys) or rb.rows_sum != rb.keys_sum):
            name = rb.name
            self.rebase_abandon()
            raise RebaseMismatch(f"the id keys of the base {name} differ from the ids of the rows they name")
        self._rebase_install(rb)
        return False

    def _rebase_check_keys(self, rb: "_Rebase", n: int) -> None:
        """Check the next ``n`` of the base's id keys: sorted, each naming a seq of the base once, and add
        them up with their seqs (``_pair_sum``). That each is the key of the id of the row it names is
        checked once both passes are done: the rows pass adds up the keys of the ids of the rows that held
        a live canonical id at the fork, read in seq order, and the two sums and counts must agree — which
        reads no row at random (in key order, the keys' rows are anywhere in the base, and the pages read
        stayed resident: the whole current base, over each check of a bulk import). With their count
        (rebase_open), every live canonical id's key is then there. RebaseMismatch if not: the base is
        given up (the rows and keys stay in memory)."""
        lo = rb.keys_next
        hi = min(len(rb.keys), lo + n)
        k, q = rb.keys[max(0, lo - 1):hi], rb.key_seqs[lo:hi]
        why = None
        if len(k) > 1 and not (k[1:] >= k[:-1]).all():
            why = "are not sorted"
        elif len(q) and (int(q.min()) < rb.first or int(q.max()) >= rb.end):
            why = "name a seq beyond its rows"
        else:
            seen = rb.seen
            if seen[q].any() or len(np.unique(q)) != len(q):
                why = "name a seq twice"
            else:
                seen[q] = 1
                rb.keys_sum = (rb.keys_sum + _pair_sum(rb.keys[lo:hi], q)) & _M64
        if why is not None:
            name = rb.name
            self.rebase_abandon()
            raise RebaseMismatch(f"the id keys of the base {name} {why}")
        rb.keys_next = hi
        for arr in (rb.keys, rb.key_seqs):   # (the page cache keeps what was just read)
            drop_pages(_mapping_of(arr), False)

    def _rebase_install(self, rb: "_Rebase") -> None:
        """The checked base in place of the rows below its end: the rows written since their check first
        (seqs below the base's first row were dead at the fork: one written since gives it up)."""
        dirty = np.fromiter(self._rebase_dirty or (), np.int64)
        if len(dirty) and int(dirty.min()) < rb.first:
            self.rebase_abandon()
            raise RebaseMismatch(f"row {int(dirty.min())} below the base {rb.name}'s first was written")
        if len(dirty):
            np.frombuffer(rb.view, _RECORD)[dirty] = self._gather(dirty, dtype=_RECORD)
        keep = (rb.end - self.nbase) * _ROW_SIZE
        self._rows_retired.append(self.rows)
        self.rows = self.rows[keep:]   # (a copy of the rows above the base)
        self.base, self.nbase, self._base_map, self._base_at, self._rows_file = rb.view, rb.end, rb.mm, rb.at, rb.name
        if rb.keys is not None:   # its id keys in place of the base level's, the merged ones of its seqs dropped
            above = self.key_seqs >= rb.end
            self._set_keys(self.keys[above], self.key_seqs[above])
            self._set_base_keys(rb.keys, rb.key_seqs, rb.name)
        self.rebase_abandon()

    def load_segments(self, segments: list[tuple[dict[str, Any], list[int]]], src: LogText,
                      last_seq: int | None = None) -> None:
        """Fill an empty table from row segments, oldest first: ([the columns ``segment_columns``
        wrote], the seqs deleted since the segment before). A later segment's row of a seq replaces
        an earlier one's; a seq deleted in a segment is gone from it on. Raises ValueError on a
        segment that does not hold together (the caller then replays the log), or names a seq beyond
        ``last_seq`` (the snapshot's)."""
        if self.count or len(self.etype):
            raise ValueError("load_segments fills an empty table")
        try:
            self._load_segments(segments, src, last_seq)
        except (IndexError, TypeError, KeyError, OverflowError, struct.error) as exc:
            raise ValueError(f"a row segment does not hold together ({type(exc).__name__}: {exc})") from None

    def _load_segments(self, segments: list[tuple[dict[str, Any], list[int]]], src: LogText,
                       last_seq: int | None) -> None:
        self.set_source(src)
        all_seqs = [np.frombuffer(cols["seqs"], "<u8").astype(np.int64) for cols, _ in segments]
        for seqs, (_, dead) in zip(all_seqs, segments):
            # ascending and not negative (a seq of 2^64 - 1 reads as -1: numpy would take it from the end)
            if len(seqs) and (seqs[0] < 0 or not (seqs[1:] > seqs[:-1]).all()):
                raise ValueError("a row segment's seqs are not ascending")
            if dead and min(dead) < 0:
                raise ValueError("a row segment deletes a negative seq")
        top = max((int(s.max()) for s in all_seqs if len(s)), default=-1)
        top = max(top, max((max(dead) for _, dead in segments if dead), default=-1))
        if last_seq is not None and top > last_seq:
            raise ValueError("a row segment names a seq beyond the snapshot's last")
        self.etype = bytearray(top + 1)
        base = tail = None   # the views of the rows' two parts, once the first segment placed its rows
        alive = np.frombuffer(self.etype, np.uint8)
        owner = np.full(top + 1, -1, np.int32)
        extra: list[dict[str, list]] = []   # each segment's wide and odd ids, as [seq, value] pairs
        packed_exts: list[tuple[int, np.ndarray, np.ndarray]] = []   # (segment, ext seqs, ends) of version 4
        try:
            for i, ((cols, dead), seqs) in enumerate(zip(segments, all_seqs)):
                rows, sparse = segment_rows(cols, seqs)   # the mapping: copied only to be renumbered
                extra.append(sparse)
                etype = np.frombuffer(cols["etype"], np.uint8)
                if len(rows) != len(seqs) or len(etype) != len(seqs):
                    raise ValueError("a row segment's columns differ in length")
                live = None if etype.all() else etype != 0
                if live is not None:   # only a base lying as the rows do holds dead rows: zeros, before its last live one
                    if i or not live[-1] or seqs[0] != 0 or seqs[-1] + 1 != len(seqs) \
                            or rows.view(np.uint8).reshape(-1, _ROW_SIZE)[~live].any():
                        raise ValueError("a row segment holds a dead row")
                maps = {"session": [0, *(self._sid_number(sid) for sid in cols["sids"])],
                        "tags": [self.tagsets.code(shared_tags(t)) if t else 0 for t in cols["tagsets"]],
                        "tool": [self.tools.code(intern(t)) if t is not None else 0 for t in cols["tools"]],
                        "ext": [self._ext_number(e) for e in cols["exts"]]}
                shared = rows["ext"] != _EXT_SPARSE
                for field, numbers in maps.items():
                    values = rows[field][shared] if field == "ext" else rows[field]
                    if len(values) and int(values.max()) >= len(numbers):
                        raise ValueError(f"a row segment's {field} number is beyond its table")
                if len(rows) and not (rows["session"] if live is None else rows["session"][live]).all():
                    raise ValueError("a row segment's row names no session")
                if "ext_values" in cols:   # version 4: packed entries, exactly one a row that says it has one
                    ext_seqs, ext_ends = checked_sections(cols)
                    packed_exts.append((i, ext_seqs, ext_ends))
                    if len(ext_seqs) != int(np.count_nonzero(rows["ext"] == _EXT_SPARSE)):
                        raise ValueError("a row segment's ext entries are not its rows' with files")
                else:
                    ext_seqs = np.sort(_pair_seqs(cols["ext_files"]))
                _check_codes(rows, etype, len(cols["tcid"]), seqs, ext_seqs, sparse)
                renumber = {field: np.asarray(numbers, np.uint32) for field, numbers in maps.items()
                            if numbers != list(range(len(numbers)))}
                if renumber or self.tcid_bytes or self.generation:
                    rows = rows.copy()
                    for field, mapping in renumber.items():
                        if field == "ext":
                            rows["ext"][shared] = mapping[rows["ext"][shared]]
                        else:
                            rows[field] = mapping[rows[field]]
                    if self.tcid_bytes:
                        has = rows["tcid"] != np.uint64(_NO_STR)
                        rows["tcid"][has] += np.uint64(len(self.tcid_bytes) << _STR_LEN_BITS)
                    if self.generation:
                        rows["codes"] = (rows["codes"] & np.uint32(0xFFFFFF)) | np.uint32(self.generation << 24)
                self.tcid_bytes += cols["tcid"]
                # seqs without a gap (a base of a store that deleted nothing, most deltas' runs): copied
                # as one block, not scattered row by row (0.3 s of 5M rows)
                gapless = len(seqs) and seqs[-1] - seqs[0] + 1 == len(seqs)
                at = slice(int(seqs[0]), int(seqs[-1]) + 1) if gapless else seqs
                if i == 0:
                    # a base whose rows are the table's as they lie in the file is mapped, not copied
                    if gapless and rows.base is not None and not (renumber or self.generation) \
                            and self._map_base(cols.get("file"), int(seqs[0]), int(seqs[-1]) + 1):
                        base = np.frombuffer(self.base, _RECORD)
                    self.rows = bytearray((top + 1 - self.nbase) * _ROW_SIZE)
                    tail = np.frombuffer(self.rows, _RECORD)
                    if base is None:
                        tail[at] = rows.view(_RECORD)
                else:
                    _place(base, tail, self.nbase, at, rows.view(_RECORD))
                alive[at] = etype
                owner[at] = i if live is None else np.where(live, i, -1)   # (a dead row's seq owns no entry)
                if dead:
                    dead_seqs = np.asarray(dead, np.int64)
                    alive[dead_seqs] = 0
                    owner[dead_seqs] = -1
            if not segments:
                self.rows = bytearray((top + 1) * _ROW_SIZE)
            self.count = int(np.count_nonzero(alive))
        finally:
            del base, tail, alive
        for i, (cols, _) in enumerate(segments):
            if any(pair[0] < 0 for name in ("summary", "relations", "source_ids", "ext_files")
                   for pair in cols.get(name, ())) or any(pair[0] < 0 for pairs in extra[i].values() for pair in pairs):
                raise ValueError("a row segment's sparse field names a negative seq")
            for seq, value in cols["summary"]:
                if owner[seq] == i:
                    self.summary[seq] = value
            for seq, value in cols["relations"]:
                if owner[seq] == i:
                    self.relations[seq] = tuple((r[0], r[1]) for r in value)
            for seq, value in cols["source_ids"]:
                if owner[seq] == i:
                    self.source_ids[seq] = tuple(value)
            for seq, value in cols.get("ext_files", ()) if "ext_values" not in cols else ():   # version 3
                if owner[seq] == i:
                    self.ext_files[seq] = shared_ext_from(value)
            for seq, value in extra[i]["odd_ids"]:
                if owner[seq] == i:
                    self.odd_id[seq] = value
                    self.odd_seq[value] = seq
            for seq, (rev, importance) in extra[i]["wide"]:
                if owner[seq] == i:
                    self.wide[seq] = (rev, importance)
        # version 4: each segment's entries of the rows it still owns, kept packed
        self.ext_files.load_packed([(seqs, ends, owner[seqs] == i, segments[i][0]["ext_values"])
                                    for i, seqs, ends in packed_exts])
        self._merge_segment_keys(segments)
        self.held_bytes = self._held_all()

    def _map_base(self, where: tuple[str, tuple, dict[str, int]] | None, first: int, end: int) -> bool:
        """Map the rows of seqs ``first`` to ``end`` (a base's, gapless, in the file ``where`` says) as
        the table's first ``end`` rows: the bytes before the first lie before it in the file, rows of
        dead seqs that nothing reads (the etype byte says so). False if it cannot be mapped (a
        segment read from memory, a file replaced since it was read): the rows are copied then."""
        if where is None:
            return False
        path, identity, offsets = where
        offset = offsets["rows"]
        if offset < first * _ROW_SIZE:
            return False
        try:
            mm, at = map_private(path, offset - first * _ROW_SIZE, end * _ROW_SIZE, identity)
        except (OSError, ValueError):
            return False
        self._base_map, self._base_at = mm, at
        self._rows_file = os.path.basename(path)
        self.base = memoryview(mm)[at:at + end * _ROW_SIZE]
        self.nbase = end
        return True

    def mappings(self) -> list[tuple[mmap.mmap, bool]]:
        """The table's file mappings and whether each is private (copy-on-write: the rows', which keeps
        the rows written since the snapshot) or a read-only one (a base's id keys, ``_mapped``)."""
        out = [(self._base_map, True)] if self._base_map is not None else []
        out += [(mm, False) for mm in map(_mapping_of, (self.base_keys, self.base_key_seqs)) if mm is not None]
        return out

    def release_pages(self) -> int:
        """Let the process's resident pages of the table's file mappings go where they are the file's
        own (fileio.drop_pages), after a start read every row through them once: the page cache keeps
        them. Bytes advised."""
        return sum(drop_pages(mm, private) for mm, private in self.mappings())

    def _merge_segment_keys(self, segments: list[tuple[dict[str, Any], list[int]]]) -> None:
        """The id lookup from the segments' sorted keys: the first's (the base's) as the base level, kept
        mapped as they are — those of its seqs deleted since included (a lookup skips them) — and the
        later ones' merged into each other (a linear insert) as the level above it, the keys of seqs no
        longer live dropped from them."""
        empty = np.zeros(0, np.uint64)
        base, base_seqs, file = empty, empty.view(np.int64), None
        keys, key_seqs = empty, empty.view(np.int64)
        for i, (cols, _) in enumerate(segments):
            k, q = _mapped(cols, "keys", np.uint64), _mapped(cols, "key_seqs", np.int64)
            if len(k) != len(q) or (len(k) > 1 and not (k[1:] >= k[:-1]).all()):
                raise ValueError("a row segment's id keys are not sorted, or not one a seq")
            if len(q) and (int(q.max()) >= len(self.etype) or int(q.min()) < 0):
                raise ValueError("a row segment's id key names a seq beyond its rows")
            if i == 0:
                base, base_seqs = k, q
                if len(k) and not k.flags.writeable:
                    # the segment's mapped arrays themselves: its file must not be cut while they live
                    file = os.path.basename(cols["file"][0])
            elif len(keys):
                at = np.searchsorted(keys, k)
                keys, key_seqs = np.insert(keys, at, k), np.insert(key_seqs, at, q)
            else:
                keys, key_seqs = k.copy(), q.copy()
        alive = np.frombuffer(self.etype, np.uint8)
        if file is None and len(base_seqs):   # (read into memory: the dead ones need not stay)
            live = alive[base_seqs] != 0
            if not live.all():
                base, base_seqs = base[live], base_seqs[live]
        if len(key_seqs):
            live = alive[key_seqs] != 0
            if not live.all():
                keys, key_seqs = keys[live], key_seqs[live]
        self.recent.clear()
        self._set_base_keys(base, base_seqs, file)
        self._set_keys(keys, key_seqs)

    def _sid_number(self, sid: str) -> int:
        number = self.sid_number.get(sid)
        if number is None:
            self.sids.append(intern(sid))
            number = self.sid_number[sid] = len(self.sids)
        return number

    def _ext_number(self, raw: list[Any] | None) -> int:
        if raw is None:
            return 0
        ext = shared_ext_from([raw[0], raw[1], raw[2], []])
        return self.exts.code(ext, ext_key(ext))

    def _ext_at(self, seq: int, lenient: bool) -> tuple | None:
        try:
            return self.ext_files[seq]
        except TextDamaged:   # (the store is marked damaged: _ext_from_log)
            if not lenient:
                raise
            return None

    def _ext_from_log(self, seq: int) -> tuple:
        """The ext with files of the message at ``seq`` as its record in the log holds it (for a packed
        entry that does not unpack: extfiles.py); TextDamaged if the record does not hold one."""
        row = self.row(seq)
        rec_pos, low, rec_size, codes = row[6], row[7], row[8], row[13]
        src = self.sources[codes >> 24]
        record = src.read_record(rec_pos << _SHIFT | low, rec_size)
        fields = record[-1]
        ext = shared_ext_from(fields[EXT]) if record[0] in (WRITE, UPDATE) and len(fields) > EXT else None
        if ext is None or not ext[3]:
            if src.on_damage is not None:   # the store is marked damaged, as for a record that fails its check
                src.on_damage(rec_pos, rec_size)
            raise TextDamaged(errno.EIO, f"the log record at byte {rec_pos} does not hold the files of message "
                                         f"seq {seq}")
        return ext

    def mapped_names(self) -> frozenset[str]:
        """The names of the files this table maps, whose blocks must not be cut while it lives
        (Store.collect_segments: they are only unlinked)."""
        pending = self._rebase.name if self._rebase is not None else None
        return frozenset(name for name in (self._rows_file, self._keys_file, pending) if name is not None)

    def column(self, name: str, seqs: np.ndarray) -> np.ndarray:
        """One field (a ROW_DTYPE name) of ``seqs``' rows, as a new array."""
        return self._gather(seqs, name)

    def _gather(self, seqs: np.ndarray, name: str | None = None, dtype: np.dtype = ROW_DTYPE) -> np.ndarray:
        """The rows of ``seqs`` (one field of them: ``name``) as a new array, from either part (the views
        made of ``rows`` go before this returns: it may grow after)."""
        seqs = np.asarray(seqs, np.int64)
        nbase = self.nbase
        tail = np.frombuffer(self.rows, dtype)
        if name is not None:
            tail = tail[name]
        base = np.frombuffer(self.base, dtype)
        if name is not None:
            base = base[name]
        if (len(seqs) > 1 and seqs[-1] - seqs[0] + 1 == len(seqs) and 0 <= seqs[0] and seqs[-1] < len(self.etype)
                and (seqs[1:] > seqs[:-1]).all()):
            # a run of seqs (every live one of a store that deleted nothing): copied as slices, a third
            # of a gather's time over millions of rows
            a, b = int(seqs[0]), int(seqs[-1]) + 1
            if b <= nbase:
                return base[a:b].copy()
            if a >= nbase:
                return tail[a - nbase:b - nbase].copy()
            return np.concatenate([base[a:], tail[:b - nbase]])
        if not nbase:
            return tail[seqs]
        low = seqs < nbase
        if low.all():
            return base[seqs]
        out = np.empty(len(seqs), base.dtype)
        out[low] = base[seqs[low]]
        out[~low] = tail[seqs[~low] - nbase]
        return out

    # ------------------------------------------------------------------ iteration, memory
    def live_seqs(self) -> np.ndarray:
        """The live seqs, ascending (a copy: the table may change while the caller walks it)."""
        return np.flatnonzero(np.frombuffer(self.etype, np.uint8)).astype(np.int64)

    def entries_heap_bytes(self) -> int:
        """The rows, their etype bytes and the id keys this process holds on its heap: health's
        store_entries_bytes. The base a start or a rebase maps, and its id keys, are the page cache's
        (the kernel lets them go under pressure, and the daemon lets go of what it read), not counted —
        a count of rows times their size said 430 MB at five million events where the heap held none.
        (Nor are a mapped base's pages a change made private, which only /proc tells: the rows a
        relocation rewrote, until a base takes their place.)"""
        keys = self.keys.nbytes + self.key_seqs.nbytes
        if self._keys_file is None:
            keys += self.base_keys.nbytes + self.base_key_seqs.nbytes
        return len(self.rows) + sum(map(len, self._rows_retired)) + len(self.etype) + keys

    def memory_bytes(self) -> int:
        # (the mapped base and id keys are the page cache's, not counted)
        n = self.entries_heap_bytes() + len(self.tcid_bytes)
        return n + self.ext_files.memory_bytes() + sum(sys.getsizeof(d) for d in (
            self.recent, self.summary, self.relations, self.source_ids, self.odd_id, self.odd_seq))


class RebaseMismatch(ValueError):
    """A base mapped to take the rows' place is not the rows (MessageTable.rebase_step): given up."""


def _drop_rows(mm: mmap.mmap, at: int, lo: int, hi: int) -> None:
    """Let go of the pages of a private rows mapping that hold rows ``lo``..``hi`` (the view of row 0
    begins at ``at``); the pages written stay (fileio.drop_pages)."""
    page = mmap.PAGESIZE
    a, b = (at + lo * _ROW_SIZE) // page, (at + hi * _ROW_SIZE + page - 1) // page
    drop_pages(mm, True, a, b - a)


def _pair_sum(keys: np.ndarray, seqs: np.ndarray) -> int:
    """The sum mod 2^64 of a 64-bit mix (splitmix64's finalizer) of each (key, seq) pair: equal for the
    same pairs in any order, and for two sets that differ in any pair unequal but with chance 2^-64."""
    with np.errstate(over="ignore"):
        h = keys.astype(np.uint64) ^ (seqs.astype(np.uint64) * np.uint64(_MIX))
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
        return int(h.sum(dtype=np.uint64))


class _Rebase:
    """A base being checked against the table's rows (MessageTable.rebase_open): its mapping, the view
    of seqs 0..end's rows in it (``at``: where that view begins in the mapping), its live seqs' range,
    its file's name and the next seq to check."""

    __slots__ = ("mm", "view", "at", "first", "end", "name", "next", "keys", "key_seqs", "keys_next", "seen",
                 "keys_sum", "rows_sum", "rows_keyed")

    def __init__(self, mm: mmap.mmap, view: memoryview, at: int, first: int, end: int, name: str, nxt: int,
                 keys: np.ndarray | None = None, key_seqs: np.ndarray | None = None) -> None:
        self.mm, self.view, self.at, self.first, self.end, self.name, self.next = mm, view, at, first, end, name, nxt
        # its id keys and their seqs (mapped read-only), the next to check, and the seqs they named so far
        self.keys, self.key_seqs, self.keys_next = keys, key_seqs, 0
        self.seen = np.zeros(end if keys is not None else 0, np.uint8)
        # the two passes' sums of (key, seq) pairs (_pair_sum), and the rows the rows pass counted
        self.keys_sum = self.rows_sum = self.rows_keyed = 0


class BySeq(Mapping):
    """The live messages by seq, as a read-only mapping (each value built on access)."""

    __slots__ = ("_t",)

    def __init__(self, table: MessageTable) -> None:
        self._t = table

    def __getitem__(self, seq: int) -> Message:
        msg = self._t.get(seq)
        if msg is None:
            raise KeyError(seq)
        return msg

    def get(self, seq: int, default: Any = None) -> Any:
        msg = self._t.get(seq)
        return default if msg is None else msg

    def __contains__(self, seq: object) -> bool:
        try:
            return self._t.alive(seq)  # type: ignore[arg-type]
        except TypeError:
            return False

    def __len__(self) -> int:
        return self._t.count

    def __iter__(self) -> Iterator[int]:
        return map(int, self._t.live_seqs())

    def __reversed__(self) -> Iterator[int]:
        return map(int, self._t.live_seqs()[::-1])


class ById(Mapping):
    """The live messages by id, as a read-only mapping (each value built on access)."""

    __slots__ = ("_t",)

    def __init__(self, table: MessageTable) -> None:
        self._t = table

    def __getitem__(self, mid: str) -> Message:
        seq = self._t.seq_of(mid) if mid.__class__ is str else None
        if seq is None:
            raise KeyError(mid)
        return self._t.get(seq)  # type: ignore[return-value]

    def get(self, mid: str, default: Any = None) -> Any:
        seq = self._t.seq_of(mid) if mid.__class__ is str else None
        return default if seq is None else self._t.get(seq)

    def __contains__(self, mid: object) -> bool:
        return mid.__class__ is str and self._t.seq_of(mid) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._t.count

    def __iter__(self) -> Iterator[str]:
        message_id = self._t.message_id
        return (message_id(int(seq)) for seq in self._t.live_seqs())


# the row's fields from tcid on, as a record of their own (_check_codes)
_TAIL_AT = ROW_DTYPE.fields["tcid"][1]
_GENERATION_AT = ROW_DTYPE.fields["codes"][1] + 3   # the codes' top byte (little-endian): the source generation
_TAIL_DTYPE = np.dtype({"names": ROW_DTYPE.names[ROW_DTYPE.names.index("tcid"):],
                        "formats": [ROW_DTYPE.fields[n][0] for n in ROW_DTYPE.names[ROW_DTYPE.names.index("tcid"):]],
                        "offsets": [ROW_DTYPE.fields[n][1] - _TAIL_AT
                                    for n in ROW_DTYPE.names[ROW_DTYPE.names.index("tcid"):]],
                        "itemsize": _ROW_SIZE - _TAIL_AT})


def _mapping_of(arr: np.ndarray) -> mmap.mmap | None:
    """The file mapping ``arr`` is a view of (np.frombuffer over it, or over a memoryview of it), or None."""
    under = arr.base.obj if isinstance(arr.base, memoryview) else arr.base
    return under if isinstance(under, mmap.mmap) else None


def _mapped(cols: dict[str, Any], name: str, dtype: type) -> np.ndarray:
    """A segment's section of 64-bit integers as an array: read-only over a mapping of its file where
    it can be (the id keys of a base: 80 MB at five million events, never written in place — a merge
    makes new arrays), else a copy."""
    where = cols.get("file")
    n = len(cols[name])
    if where is not None and n and not n % 8 and sys.byteorder == "little" and where[2][name] % 8 == 0:
        path, identity, offsets = where
        try:
            mm, at = map_private(path, offsets[name], n, identity, writable=False)
            return np.frombuffer(mm, dtype, n // 8, at)
        except (OSError, ValueError):
            pass
    return np.frombuffer(cols[name], "<u8").astype(dtype)


def _place(base: np.ndarray | None, tail: np.ndarray, nbase: int, at: slice | np.ndarray, records: np.ndarray) -> None:
    """Put ``records`` at seqs ``at`` (a slice or ascending seqs) of a table's two parts."""
    if base is None:
        tail[at] = records
        return
    if isinstance(at, slice):
        cut = min(max(at.start, nbase), at.stop) - at.start   # how many of them lie in the base
        base[at.start:at.start + cut] = records[:cut]
        tail[max(at.start, nbase) - nbase:max(at.stop, nbase) - nbase] = records[cut:]
        return
    low = at < nbase
    base[at[low]] = records[low]
    tail[at[~low] - nbase] = records[~low]


def _check_codes(rows: np.ndarray, etype: np.ndarray, tcid_size: int, seqs: np.ndarray, ext_seqs: np.ndarray,
                 sparse: dict[str, list]) -> None:
    """A row segment's codes are ones ``get`` can read: an event type, role, tier and kind it knows, no
    source generation (a process's own), tool_call_ids inside the segment's bytes, and a sparse entry
    for each row that says it has one (an ext with files, a revision or importance in ``wide``), each
    odd id at a seq the segment holds, and ``wide``'s values two integers."""
    if not len(rows):
        return
    # the row's last fields (tcid, tags, tool, ext, codes) are adjacent: copied out in one pass over the
    # rows, then checked as plain arrays (each field read from the 85-byte rows is a pass of its own)
    tail = np.ascontiguousarray(rows.view(np.uint8).reshape(-1, _ROW_SIZE)[:, _TAIL_AT:]).view(_TAIL_DTYPE).ravel()
    codes = tail["codes"].copy()
    if (int(etype.max()) >= len(_ETYPES) or int((codes & 0xFF).max()) >= len(_ROLES)
            or int((codes >> 8 & 0xFF).max()) >= len(_TIERS) or int((codes >> 16 & 0xFF).max()) >= len(_KINDS)
            or int((codes >> 24).max()) != 0):
        raise ValueError("a row segment's row has a code beyond its table")
    tcid = tail["tcid"][tail["tcid"] != np.uint64(_NO_STR)]
    if len(tcid) and int(((tcid >> np.uint64(_STR_LEN_BITS)) + (tcid & np.uint64(_STR_LEN_MASK))).max()) > tcid_size:
        raise ValueError("a row segment's tool_call_id runs past its bytes")
    # (by bisection in numpy: sets of every seq cost ~0.5 s at five million rows, np.isin 0.17 s)
    for name, wanting, have in (("ext_files", tail["ext"] == _EXT_SPARSE, ext_seqs),
                                ("wide", rows["importance"] == _IMP_WIDE, np.sort(_pair_seqs(sparse["wide"])))):
        if not _all_in(seqs[wanting], have):
            raise ValueError(f"a row segment's row has no entry in its {name}")
    if not _all_in(_pair_seqs(sparse["odd_ids"]), seqs):
        raise ValueError("a row segment's odd id is at a seq it does not hold")
    if any(len(value) != 2 or not all(v.__class__ is int for v in value) for _, value in sparse["wide"]):
        raise ValueError("a row segment's wide entry is not a revision and an importance")


def _all_in(values: np.ndarray, ascending: np.ndarray) -> bool:
    """Every one of ``values`` is in ``ascending`` (sorted)."""
    if not len(values):
        return True
    at = np.searchsorted(ascending, values)
    return bool((at < len(ascending)).all() and (ascending[np.minimum(at, len(ascending) - 1)] == values).all())


def _pair_seqs(pairs: list) -> np.ndarray:
    """The seqs of [seq, value] pairs, as an array for the checks' bisections (numpy converts what it
    can — a float, a numeric string — and refuses the rest with TypeError or ValueError; the later
    steps, which use the seqs themselves, refuse whatever is not an int: a malformed segment)."""
    return np.fromiter((pair[0] for pair in pairs), np.int64, len(pairs))


def segment_rows(cols: dict[str, Any], seqs: np.ndarray) -> tuple[np.ndarray, dict[str, list]]:
    """A row segment's rows in the table's layout (a view of the mapping for the current version, a
    converted copy for version 2) and its rows' sparse ``odd_ids`` and ``wide`` ([seq, value] pairs)."""
    if cols.get("version", 3) >= 3:
        return (np.frombuffer(cols["rows"], ROW_DTYPE),
                {"odd_ids": list(cols["odd_ids"]), "wide": [[seq, tuple(v)] for seq, v in cols["wide"]]})
    return _rows_from_v2(np.frombuffer(cols["rows"], ROW_DTYPE_V2), seqs, cols["odd_ids"])


def _rows_from_v2(old: np.ndarray, seqs: np.ndarray, odd_ids: list) -> tuple[np.ndarray, dict[str, list]]:
    """Version 2 rows in the current layout: the ids' characters as their number (an id of 26 valid
    characters whose first is past 7 does not fit 128 bits: it becomes an odd id), revisions and
    importances that do not fit in ``wide``. A row's record size past 32 bits cannot be one the log
    frames: refused."""
    if len(old) != len(seqs):
        raise ValueError("a row segment's columns differ in length")
    new = np.zeros(len(old), ROW_DTYPE)
    for name in ROW_DTYPE.names:
        if name not in ("id", "rev", "importance", "rec_size"):
            new[name] = old[name]
    if len(old) and int(old["rec_size"].max()) > 0xFFFFFFFF:
        raise ValueError("a row segment's record size is beyond any the log frames")
    new["rec_size"] = old["rec_size"]
    text = np.ascontiguousarray(old["id"]).view(np.uint8).reshape(-1, ID_BYTES)
    raw, ok = raw_ids(text)
    new["id"] = np.where(ok[:, None], raw, 0).view("S16").ravel()
    odd = {int(seq): mid for seq, mid in odd_ids}
    for j in np.flatnonzero(~ok & (text[:, 0] != 0)).tolist():   # 26 characters that are not a number of 128 bits
        odd[int(seqs[j])] = bytes(text[j]).decode("ascii", "replace")
    rev, imp = old["rev"], old["importance"]
    wide = (rev < 0) | (rev >= _REV_WIDE) | (imp < 0) | (imp >= _IMP_WIDE)
    new["rev"] = np.where(wide, _REV_WIDE, rev)
    new["importance"] = np.where(wide, _IMP_WIDE, imp)
    pairs = [[int(seqs[j]), (int(rev[j]), int(imp[j]))] for j in np.flatnonzero(wide).tolist()]
    return new, {"odd_ids": sorted([seq, mid] for seq, mid in odd.items()), "wide": pairs}


def rows_from_columns(cols: dict[str, Any]) -> list[list[Any]]:
    """A row segment's rows (version 2 or later) as version 1 held them (``Message.row``), for whatever reads
    rows one by one (``snapshot.read``, a start whose segments are not all of version 2)."""
    array, extra = segment_rows(cols, np.frombuffer(cols["seqs"], "<u8").astype(np.int64))
    sparse = {name: dict(cols[name]) for name in ("summary", "relations", "source_ids")}
    sparse["ext_files"] = raw_entries(cols)
    sparse.update({name: dict(pairs) for name, pairs in extra.items()})
    seqs = np.frombuffer(cols["seqs"], "<u8").tolist()
    etypes = bytes(cols["etype"])
    tcid_bytes = bytes(cols["tcid"])
    sids, tagsets, tools, exts = cols["sids"], cols["tagsets"], cols["tools"], cols["exts"]
    rows = []
    for i, (raw, number, ts, upd, rev, importance, rec_pos, low, rec_size, tcid, tags, tool, ext,
            codes) in enumerate(_ROW.iter_unpack(array.tobytes())):
        if not etypes[i]:   # (a base's dead row: a seq deleted before or between its live ones)
            continue
        seq = seqs[i]
        if importance == _IMP_WIDE:
            rev, importance = sparse["wide"][seq]
        if tcid != _NO_STR:
            start = tcid >> _STR_LEN_BITS
            tcid = tcid_bytes[start:start + (tcid & _STR_LEN_MASK)].decode("utf-8")
        else:
            tcid = None
        loc = rec_pos << _SHIFT | low
        e = sparse["ext_files"][seq] if ext == _EXT_SPARSE else (None if exts[ext] is None else [*exts[ext], []])
        rows.append([sparse["odd_ids"][seq] if seq in sparse["odd_ids"] else id_text(raw), sids[number - 1], seq, ts,
                     _ROLES[codes & 0xFF], location_parts(loc), rev, upd, tcid, list(tagsets[tags]),
                     _TIERS[codes >> 8 & 0xFF], _KINDS[codes >> 16 & 0xFF], importance, sparse["summary"].get(seq),
                     sparse["relations"].get(seq, []), sparse["source_ids"].get(seq, []), _ETYPES[etypes[i]],
                     tools[tool], e, rec_size])
    return rows

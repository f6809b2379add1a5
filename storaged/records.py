"""The log's record kinds: their tags, their field orders, how each is built and what shape is valid.

This is the one place that names them (docs/format.md §3). The store, compaction and salvage build
records with the builders here and read them by the positions named here; ``log.scan`` runs
``check`` on every decoded record, so a record whose checksum holds but whose shape this daemon does
not understand (wrong arity, a wrong type, an unknown tag — say one written by a newer daemon) is
treated as damage, never applied half-way and never skipped without a word.

Pure: no I/O. A builder returns the list that is msgpack-packed into a log record's payload; the
bytes are the same the store wrote before this module existed (not a format change).

Every form ever written is accepted: 16-field messages (release 0.1) and 19-field ones, 4-element
``d`` records and rid entries (before 0.3) and 5-element ones. ``check`` runs on every record at
replay, so it is written for speed: the types of a message's fields are checked as one tuple lookup,
the lists inside it element by element only when they are not empty.
"""
from __future__ import annotations

from typing import Any

from protocol import limits as L
from protocol.history import EVENT_TYPES, FILE_FIELDS

# ---------------------------------------------------------------- tags (the first element of a record)
WRITE = "w"         # [WRITE, rid, message]
UPDATE = "u"        # [UPDATE, rid, seq, message]
DELETE = "d"        # [DELETE, rid, seq, message_id, seen_ms]   (before 0.3 without seen_ms)
CHECKPOINT = "c"    # [CHECKPOINT, last_seq, last_id, last_ms, rid entries]   (a compacted log's first record)
SESSION = "s"       # [SESSION, nil, session_id, fields]
INGEST = "k"        # [INGEST, nil, source, key, value]
TAGS = (WRITE, UPDATE, DELETE, CHECKPOINT, SESSION, INGEST)

# ---------------------------------------------------------------- positions inside a record
TAG = 0
RID = 1             # w, u, d: the request id (a ULID string) or nil; s, k: always nil
W_MESSAGE = 2
U_SEQ = 2           # a fresh sequence number the update consumed (not the message's own)
U_MESSAGE = 3
D_SEQ = 2
D_MESSAGE_ID = 3
D_SEEN_MS = 4       # absent before 0.3
C_LAST_SEQ = 1
C_LAST_ID = 2
C_LAST_MS = 3
C_RIDS = 4
S_SESSION_ID = 2
S_FIELDS = 3
K_SOURCE = 2
K_KEY = 3
K_VALUE = 4         # a map, or nil to forget the file

# ---------------------------------------------------------------- the message form (docs/format.md §3.1)
MESSAGE_FIELDS = (
    "message_id", "session_id", "seq", "timestamp", "role", "content", "revision", "updated_at",
    "tool_call_id", "tags", "tier", "kind", "importance", "summary", "relations", "source_ids",
    "etype", "tool", "ext",
)
MESSAGE_FIELDS_0_1 = MESSAGE_FIELDS[:16]    # release 0.1, before the event fields
RECORD_FIELDS = len(MESSAGE_FIELDS)         # a snapshot row adds rec_size after them
RECORD_FIELDS_0_1 = len(MESSAGE_FIELDS_0_1)
_at = MESSAGE_FIELDS.index
MESSAGE_ID = _at("message_id")
SESSION_ID = _at("session_id")
SEQ = _at("seq")
TIMESTAMP = _at("timestamp")
ROLE = _at("role")
CONTENT = _at("content")
REVISION = _at("revision")
UPDATED_AT = _at("updated_at")
TOOL_CALL_ID = _at("tool_call_id")
TAGS_FIELD = _at("tags")
TIER = _at("tier")
KIND = _at("kind")
IMPORTANCE = _at("importance")
SUMMARY = _at("summary")
RELATIONS = _at("relations")
SOURCE_IDS = _at("source_ids")
ETYPE = _at("etype")
TOOL = _at("tool")
EXT = _at("ext")
# ext = nil | [is_error, exit_code, model, files]; each file is FILE_FIELDS long
EXT_FIELDS = ("is_error", "exit_code", "model", "files")

# ---------------------------------------------------------------- request-id entries (c records, snapshot)
RID_ENTRY_FIELDS = ("rid", "op", "message_id", "revision", "seen_ms")
RID_ENTRY_FIELDS_0_2 = RID_ENTRY_FIELDS[:4]  # before 0.3, without seen_ms


# ---------------------------------------------------------------- builders
def write(rid: str | None, fields: list[Any]) -> list[Any]:
    """A message written (``rid`` as the request carried it) or imported / compacted (``rid`` nil)."""
    return [WRITE, rid, fields]


def update(rid: str | None, seq: int, fields: list[Any]) -> list[Any]:
    """A message's new revision: ``fields`` is its whole new state, ``seq`` the sequence number consumed."""
    return [UPDATE, rid, seq, fields]


def delete(rid: str | None, seq: int, message_id: str, seen_ms: int) -> list[Any]:
    return [DELETE, rid, seq, message_id, seen_ms]


def checkpoint(last_seq: int, last_id: str | None, last_ms: int, rids: list[list[Any]]) -> list[Any]:
    """What a compacted log's dropped records implied: the sequence, the id clock, the request-id window."""
    return [CHECKPOINT, last_seq, last_id, last_ms, rids]


def session(sid: str, fields: dict[str, Any]) -> list[Any]:
    """Session metadata, merged into what the session had at replay."""
    return [SESSION, None, sid, fields]


def ingest(source: str, key: str, value: dict[str, Any] | None) -> list[Any]:
    """An ingester's checkpoint for one file (``value`` nil forgets it)."""
    return [INGEST, None, source, key, value]


# ---------------------------------------------------------------- shape
_S, _I, _N, _LIST = str, int, type(None), list


def _message_type_tuples() -> tuple[frozenset, frozenset]:
    """Every valid tuple of element types of a 16- and a 19-field message (the nullable fields
    make a few combinations), so that a message's types check as one set lookup."""
    base = [(_S,), (_S,), (_I,), (_I,), (_S,), (_S,), (_I,), (_I,), (_S, _N), (_LIST,), (_S,), (_S,), (_I,),
            (_S, _N), (_LIST,), (_LIST,), (_S,), (_S, _N), (_LIST, _N)]
    combos: list[tuple] = [()]
    shapes = {}
    for n, choices in enumerate(base, 1):
        combos = [c + (t,) for c in combos for t in choices]
        shapes[n] = frozenset(combos)
    return shapes[RECORD_FIELDS_0_1], shapes[RECORD_FIELDS]


_TYPES_0_1, _TYPES = _message_type_tuples()
_ROLES = frozenset(L.ROLES)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_TIERS = frozenset(L.MEMORY_TIERS)
_KINDS = frozenset(L.MEMORY_KINDS)
_ETYPES = frozenset(EVENT_TYPES)
_OPTIONAL_STR = (str, type(None))
_FILE_TYPES = frozenset((_S, r, t, p, _S) for r in _OPTIONAL_STR for t in _OPTIONAL_STR for p in _OPTIONAL_STR)


def _strs(items: list[Any]) -> bool:
    for x in items:
        if type(x) is not str:
            return False
    return True


def check_message(f: Any) -> str | None:
    """None if ``f`` is a message's field list of a form ever written, else why not."""
    if type(f) is not list:
        return "message is not an array"
    types = tuple(map(type, f))
    if types not in (_TYPES if len(f) == RECORD_FIELDS else _TYPES_0_1):
        if len(f) not in (RECORD_FIELDS, RECORD_FIELDS_0_1):
            return f"message has {len(f)} fields (expected {RECORD_FIELDS_0_1} or {RECORD_FIELDS})"
        return "message has a field of the wrong type"
    if f[ROLE] not in _ROLES or f[TIER] not in _TIERS or f[KIND] not in _KINDS:
        return "message has an unknown role, tier or kind"
    if not (0 <= f[SEQ] <= _I64_MAX and _I64_MIN <= f[TIMESTAMP] <= _I64_MAX and _I64_MIN <= f[UPDATED_AT] <= _I64_MAX
            and _I64_MIN <= f[REVISION] <= _I64_MAX and _I64_MIN <= f[IMPORTANCE] <= _I64_MAX):
        # the message table holds them in 64 bits at most (storaged/columns.py: revision and importance in
        # narrower fields, or whole in its ``wide`` dict); no validated request
        # comes near (times are below 2^48, importance 0-100)
        return "message has a sequence number, time, revision or importance beyond 64 bits"
    if f[TAGS_FIELD] and not _strs(f[TAGS_FIELD]):
        return "message tags are not strings"
    if f[SOURCE_IDS] and not _strs(f[SOURCE_IDS]):
        return "message source ids are not strings"
    for r in f[RELATIONS]:
        if type(r) is not list or len(r) != 2 or type(r[0]) is not str or type(r[1]) is not str:
            return "message relation is not a [type, message_id] pair"
    if len(f) == RECORD_FIELDS:
        if f[ETYPE] not in _ETYPES:
            return "message has an unknown event type"
        ext = f[EXT]
        if ext is not None:
            return _check_ext(ext)
    return None


def _check_ext(ext: list[Any]) -> str | None:
    if len(ext) != len(EXT_FIELDS):
        return "message ext is not [is_error, exit_code, model, files]"
    is_error, exit_code, model, files = ext
    if (is_error is not None and type(is_error) is not bool) or (exit_code is not None and type(exit_code) is not int) \
            or (model is not None and type(model) is not str) or type(files) is not list:
        return "message ext has a field of the wrong type"
    for entry in files:
        if type(entry) is not list or tuple(map(type, entry)) not in _FILE_TYPES:
            return f"message file entry is not [{', '.join(FILE_FIELDS)}]"
    return None


def check_rid_entry(e: Any) -> str | None:
    """A request-id entry: [rid, op, message_id, revision] and, since 0.3, seen_ms."""
    if type(e) is not list or len(e) not in (len(RID_ENTRY_FIELDS), len(RID_ENTRY_FIELDS_0_2)):
        return "rid entry is not an array of 4 or 5 elements"
    if type(e[0]) is not str or type(e[1]) is not str or type(e[2]) is not str or type(e[3]) is not int \
            or (len(e) > 4 and type(e[4]) is not int):
        return "rid entry has an element of the wrong type"
    return None


def _rid(x: Any) -> bool:
    return x is None or type(x) is str


def _str_map(m: Any, values=None) -> bool:
    if type(m) is not dict:
        return False
    for k, v in m.items():
        if type(k) is not str or (values is not None and not isinstance(v, values)):
            return False
    return True


def check(rec: Any) -> str | None:
    """None if ``rec`` (a decoded payload) is a record of a kind and shape this daemon reads, else a
    short reason. ``log.scan`` treats a refused record exactly like one whose checksum failed."""
    if type(rec) is not list or not rec:
        return "record is not a non-empty array"
    tag = rec[0]
    n = len(rec)
    if tag == WRITE:
        if n != 3 or not _rid(rec[RID]):
            return "w record is not [w, rid, message]"
        return check_message(rec[W_MESSAGE])
    if tag == UPDATE:
        if n != 4 or not _rid(rec[RID]) or type(rec[U_SEQ]) is not int:
            return "u record is not [u, rid, seq, message]"
        return check_message(rec[U_MESSAGE])
    if tag == DELETE:
        if n not in (4, 5) or not _rid(rec[RID]) or type(rec[D_SEQ]) is not int or type(rec[D_MESSAGE_ID]) is not str \
                or (n == 5 and type(rec[D_SEEN_MS]) is not int):
            return "d record is not [d, rid, seq, message_id, seen_ms]"
        return None
    if tag == CHECKPOINT:
        if n != 5 or type(rec[C_LAST_SEQ]) is not int or not _rid(rec[C_LAST_ID]) or type(rec[C_LAST_MS]) is not int \
                or type(rec[C_RIDS]) is not list:
            return "c record is not [c, last_seq, last_id, last_ms, rids]"
        for entry in rec[C_RIDS]:
            reason = check_rid_entry(entry)
            if reason:
                return reason
        return None
    if tag == SESSION:
        if n != 4 or rec[RID] is not None or type(rec[S_SESSION_ID]) is not str \
                or not _str_map(rec[S_FIELDS], _OPTIONAL_STR):
            return "s record is not [s, nil, session_id, {str: str}]"
        return None
    if tag == INGEST:
        if n != 5 or rec[RID] is not None or type(rec[K_SOURCE]) is not str or type(rec[K_KEY]) is not str \
                or not (rec[K_VALUE] is None or type(rec[K_VALUE]) is dict):
            # any map: the wire and the checkpoint validator accept keys of any msgpack type, and a
            # record a daemon acknowledged must never read as damage later
            return "k record is not [k, nil, source, key, map|nil]"
        return None
    if type(tag) is not str:
        return "record tag is not a string"
    return f"unknown record kind {tag[:8]!r} (written by a newer daemon?)"

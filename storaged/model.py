"""A message as the code works with it: one slotted object, no per-message dict, no text.

The store does not keep these: it keeps every live message's fields as a packed row of its message
table (``storaged/columns.py``, ~140 bytes a message), which builds a ``Message`` for whatever asks
(a view, a mutation, the index). Its text stays in the log and ``content`` reads it back by offset
(``storaged/text.py``), so a million messages cost their metadata, not their text. ``to_dict``
builds the contract's Message object only when a reply needs it;
``fields`` / ``from_fields`` are its record form (``RECORD_FIELDS`` values), what a log record
holds; ``row`` / ``from_row`` its snapshot form, the same fields with the text's location in
place of the text.
"""
from __future__ import annotations

import sys
from sys import intern
from typing import Any

from protocol.history import FILE_FIELDS, ROLE_EVENT_TYPE
from protocol.requests import Event, Metadata

from .records import RECORD_FIELDS
from .text import LogText, location_from_parts, location_parts, span, utf8_length


class Message:
    """One stored message, which is also one event of the history interface: ``etype`` says which
    (from the role for a message written with write_message), ``tool`` names the tool of a call or
    result, and ``ext`` holds the rarer facts an agent transcript carried, as a tuple
    ``(is_error, exit_code, model, files)`` — None for plain messages, so memory costs nothing extra.
    ``files`` is a tuple of ``(path, root, tail, project, op)``: what a tool call read or changed."""

    __slots__ = (
        "message_id", "session_id", "seq", "timestamp", "role", "text", "revision", "updated_at",
        "tool_call_id", "tags", "tier", "kind", "importance", "summary", "relations", "source_ids",
        "etype", "tool", "ext", "rec_size", "src",
    )

    def __init__(self, message_id: str, session_id: str, seq: int, timestamp: int, role: str, content: str,
                 revision: int, updated_at: int, tool_call_id: str | None, tags: tuple, tier: str, kind: str,
                 importance: int, summary: str | None, relations: tuple, source_ids: tuple,
                 rec_size: int = 0, etype: str | None = None, tool: str | None = None,
                 ext: tuple | None = None) -> None:
        self.message_id = message_id
        self.session_id = session_id
        self.seq = seq
        self.timestamp = timestamp
        self.role = role
        # the text itself (a message not yet stored), or its location in the log that ``src`` reads
        self.text: str | int = content
        self.src: LogText | None = None
        self.revision = revision
        self.updated_at = updated_at
        self.tool_call_id = tool_call_id
        self.tags = tags
        self.tier = tier
        self.kind = kind
        self.importance = importance
        self.summary = summary
        self.relations = relations
        self.source_ids = source_ids
        self.etype = etype or ROLE_EVENT_TYPE[role]
        self.tool = tool
        self.ext = ext
        self.rec_size = rec_size  # bytes of the log record holding this message's current state

    @property
    def content(self) -> str:
        text = self.text
        return text if text.__class__ is str else self.src.read(text, self.rec_size)

    def utf8(self) -> bytes:
        """The text's UTF-8 bytes (read as they are stored, without a decode and encode)."""
        text = self.text
        return text.encode("utf-8") if text.__class__ is str else self.src.read_utf8(text, self.rec_size)

    def utf8_length(self) -> int:
        """Bytes of the text's UTF-8, known without reading it."""
        text = self.text
        return utf8_length(text) if text.__class__ is str else span(text)[1]

    def stored_at(self, src: LogText, loc: int) -> None:
        """The text is in the log at ``loc`` from now on: drop it from memory."""
        self.text = loc
        self.src = src

    # -- the record form: a flat list of RECORD_FIELDS values (a log record's fields) --
    def fields(self, text: str | int | None = None) -> list[Any]:
        """``text``: what field 5 holds — the text (read from the log when not given), or a location."""
        return [
            self.message_id, self.session_id, self.seq, self.timestamp, self.role,
            self.content if text is None else text,
            self.revision, self.updated_at, self.tool_call_id, list(self.tags), self.tier, self.kind,
            self.importance, self.summary, [list(r) for r in self.relations], list(self.source_ids),
            self.etype, self.tool, _ext_fields(self.ext),
        ]

    def row(self, loc: int | None = None, rec_size: int | None = None) -> list[Any]:
        """The snapshot form: the record form with the text's location (``location_parts``) in place of
        the text, then the record's size (a compaction gives the new log's; by default the current ones)."""
        return [*self.fields(location_parts(self.text if loc is None else loc)),
                self.rec_size if rec_size is None else rec_size]

    @classmethod
    def from_row(cls, row: list[Any], src: LogText) -> "Message":
        """From a snapshot row (``row``): the text stays where the row says it is. The start builds
        every message through here (~40% of a start at 275k messages), hence the one unpacking and
        no call of ``from_fields`` for a row of the current length."""
        if len(row) != RECORD_FIELDS + 1:
            msg = cls.from_fields(row, row[RECORD_FIELDS])
            msg.text = location_from_parts(msg.text)
            msg.src = src
            return msg
        (mid, sid, seq, ts, role, loc, rev, upd, tcid, tags, tier, kind, importance, summary,
         relations, source_ids, etype, tool, ext, rec_size) = row
        msg = cls(mid, sid, seq, ts, intern(role), location_from_parts(loc),
                  rev, ts if upd == ts else upd, tcid, shared_tags(tags) if tags else (), intern(tier),
                  intern(kind), importance, summary, tuple((r[0], r[1]) for r in relations) if relations else (),
                  tuple(source_ids) if source_ids else (), rec_size, intern(etype),
                  intern(tool) if tool is not None else None, shared_ext_from(ext) if ext is not None else None)
        msg.src = src
        return msg

    @classmethod
    def from_fields(cls, f: list[Any], rec_size: int = 0) -> "Message":
        """From a record's field list. Records written before events existed have the first 16 fields
        only: their event type follows from the role, as for a message written with write_message."""
        # enum-like strings are interned: a million messages share one "user", not a million copies
        if len(f) >= RECORD_FIELDS:
            etype, tool, ext = intern(f[16]), (intern(f[17]) if f[17] is not None else None), shared_ext_from(f[18])
        else:
            etype, tool, ext = None, None, None
        # an updated_at equal to the timestamp (never updated: most messages) is the same int object
        return cls(f[0], f[1], f[2], f[3], intern(f[4]), f[5], f[6], f[3] if f[7] == f[3] else f[7], f[8],
                   shared_tags(f[9]) if f[9] else (),
                   intern(f[10]), intern(f[11]), f[12], f[13], tuple((r[0], r[1]) for r in f[14]) if f[14] else (),
                   tuple(f[15]) if f[15] else (), rec_size, etype, tool, ext)

    def event_fields(self) -> dict[str, Any] | None:
        """The ``event`` object of an exported message (None when the role says it all)."""
        if self.tool is None and self.ext is None and self.etype == ROLE_EVENT_TYPE[self.role]:
            return None
        is_error, exit_code, model, files = self.ext or (None, None, None, ())
        return {"type": self.etype, "tool_name": self.tool, "is_error": is_error, "exit_code": exit_code,
                "model": model, "files": [dict(zip(FILE_FIELDS, f)) for f in files]}

    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {}
        if self.tool_call_id is not None:
            md["tool_call_id"] = self.tool_call_id
        md["tags"] = list(self.tags)
        md["memory_tier"] = self.tier
        md["memory_kind"] = self.kind
        md["importance"] = self.importance
        if self.summary is not None:
            md["summary"] = self.summary
        md["relations"] = [{"type": t, "message_id": m} for t, m in self.relations]
        md["source_message_ids"] = list(self.source_ids)
        return md

    def to_dict(self, content: str | None = None) -> dict[str, Any]:
        """The contract's Message; ``content``: the text, when the caller holds it already."""
        return {
            "message_id": self.message_id,
            "session_id": self.session_id,
            "timestamp": self.timestamp,
            "role": self.role,
            "content": self.content if content is None else content,
            "revision": self.revision,
            "updated_at": self.updated_at,
            "metadata": self.metadata(),
        }

    def metadata_values(self) -> Metadata:
        """The metadata as validation builds it, to merge a partial update into."""
        return Metadata(self.tool_call_id, self.tags, self.tier, self.kind, self.importance, self.summary,
                        self.relations, self.source_ids)

    def body_bytes(self) -> int:
        """Memory of the text: none once it is stored (it is read from the log)."""
        return str_bytes(self.text) if self.text.__class__ is str else 0

    def entry_bytes(self) -> int:
        return sys.getsizeof(self) + sys.getsizeof(self.message_id)


# A fresh non-ASCII str: header + (length + 1) code units of 1, 2 or 4 bytes.
_UNICODE_HEADER = sys.getsizeof(chr(0x100) * 2) - 3 * 2


def str_bytes(s: str) -> int:
    """Memory of ``s``, the same whenever it is asked (so that what ``_insert`` adds ``_remove`` takes
    away). ``sys.getsizeof`` is not: CPython attaches a cached UTF-8 copy to a non-ASCII str once
    something (msgpack packing, a rebuild) asks for it, and counts it from then on."""
    if s.isascii():
        return sys.getsizeof(s)
    n = len(s)
    if len(s.encode("latin-1", "ignore")) == n:
        kind = 1
    elif len(s.encode("utf-16-le", "surrogatepass")) == 2 * n:
        kind = 2
    else:
        kind = 4
    return _UNICODE_HEADER + (n + 1) * kind


def message_from_args(message_id: str, session_id: str, seq: int, ts: int, role: str, content: str,
                      md: Metadata, event: Event | None = None) -> Message:
    """A new message from a validated request's parts; ``event`` (imported transcripts) adds its event facts."""
    etype = tool = ext = None
    if event is not None:
        etype, tool = intern(event.etype), event.tool
        if tool is not None:
            tool = intern(tool)
        if event.is_error is not None or event.exit_code is not None or event.model is not None or event.files:
            ext = _shared_ext(event.is_error, event.exit_code, event.model, tuple(event.files))
    return Message(message_id, session_id, seq, ts, role, content, 1, ts, md.tool_call_id, shared_tags(md.tags),
                   md.tier, md.kind, md.importance, md.summary, tuple(md.relations), tuple(md.source_ids), 0,
                   etype, tool, ext)


def _ext_fields(ext: tuple | None) -> list[Any] | None:
    if ext is None:
        return None
    is_error, exit_code, model, files = ext
    return [is_error, exit_code, model, [list(f) for f in files]]


def shared_ext_from(raw: list[Any] | None) -> tuple | None:
    """A record's ext list as the (shared, where possible) tuple a Message holds."""
    if raw is None:
        return None
    is_error, exit_code, model, files = raw
    if not files:  # the common case, looked up without building the ext first
        shared = _EXTS.get((is_error.__class__, exit_code.__class__, (is_error, exit_code, model, ())))
        if shared is not None:
            return shared
    return _shared_ext(is_error, exit_code, model, tuple((f[0], f[1], f[2], f[3], intern(f[4])) for f in files))


_TAGS: dict[tuple, tuple] = {}
_TAGS_MAX = 4096


def shared_tags(tags) -> tuple:
    """The tags as a tuple, shared between the messages that have the same ones: an agent's events
    carry the same few (harness, project) on every message — 13 distinct tuples among 275k messages
    of the scale bench, which cost ~180 bytes a message as copies."""
    key = tuple(tags)
    shared = _TAGS.get(key)
    if shared is None:
        shared = tuple(intern(t) if t.__class__ is str else t for t in key)
        if len(_TAGS) < _TAGS_MAX:
            _TAGS[shared] = shared
    return shared


_EXTS: dict[tuple, tuple] = {}
_EXTS_MAX = 4096


def ext_key(ext: tuple) -> tuple:
    """What tells a shared ext from another: its values and the types of the flag and exit code
    (False == 0 and 1 == True: never shared across types)."""
    return type(ext[0]), type(ext[1]), ext


def _shared_ext(is_error: bool | None, exit_code: int | None, model: str | None, files: tuple) -> tuple:
    """The ext tuple, shared between the messages that have the same one: most tool results of a
    transcript have the same error flag, exit code and model and no files (72 bytes each otherwise)."""
    model = intern(model) if model is not None else None
    ext = (is_error, exit_code, model, files)
    if files:
        return ext
    key = ext_key(ext)
    shared = _EXTS.get(key)
    if shared is None and len(_EXTS) < _EXTS_MAX:
        shared = _EXTS[key] = ext
    return shared or ext

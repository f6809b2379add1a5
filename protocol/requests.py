"""Validated requests: one frozen, slotted dataclass per op, the only form in which the daemon's
handlers see a request.

Validation (``protocol.validation``, ``protocol.history``) reads a tool's untrusted arguments and
builds one of these; nothing else does. A field is named for what the store needs, not for the
contract's argument: the contract's ``memory_tier`` is ``tier``, ``source_message_ids`` is
``source_ids``, ``metadata_json`` is the parsed ``metadata``, an event's ``type`` is ``etype`` — the
names of ``storaged.model.Message``. A contract name becomes its field in one place, the
validator's constructor call (metadata's names: the ``METADATA_NAMES`` table), and goes back in one
place, the class's ``to_args``, which writes the arguments a client would send for the request;
validating them again gives the same request (tests/test_requests.py holds every op to that).

Like h11's events these are plain values: no I/O, no behaviour beyond building the other form. The
dicts some of them hold (an imported session's metadata, an ingester's checkpoint value, a history
tool's canonical ``echo``) are stored or echoed as they are; nothing modifies them.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generator, TypeVar

from . import limits as L


class _Request:
    """What every request class shares: ``to_args`` for a request whose fields have the contract's
    names (a class with other names writes its own)."""

    __slots__ = ()

    def to_args(self) -> dict[str, Any]:
        return _given({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


class _Echoed(_Request):
    """A history tool's request: its arguments are the canonical request it echoes."""

    __slots__ = ()
    echo: dict[str, Any]

    def to_args(self) -> dict[str, Any]:
        return _given(self.echo)


# --- message metadata ------------------------------------------------------------------------------

# metadata_json's field (the contract's, also a Message's ``metadata`` in replies) -> Metadata field.
# The order is the contract's: error messages list the allowed names in it.
METADATA_NAMES: dict[str, str] = {
    "tool_call_id": "tool_call_id", "tags": "tags", "memory_tier": "tier", "memory_kind": "kind",
    "importance": "importance", "summary": "summary", "relations": "relations", "source_message_ids": "source_ids",
}


@dataclass(frozen=True, slots=True)
class Metadata:
    """A message's whole metadata (the defaults are the contract's for a field not given)."""

    tool_call_id: str | None = None
    tags: tuple[str, ...] = ()
    tier: str = L.MEMORY_TIER_DEFAULT
    kind: str = L.MEMORY_KIND_DEFAULT
    importance: int = L.IMPORTANCE_DEFAULT
    summary: str | None = None
    relations: tuple[tuple[str, str], ...] = ()   # (relation type, target message id)
    source_ids: tuple[str, ...] = ()

    def to_json_obj(self) -> dict[str, Any]:
        return _metadata_obj(self)


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True, slots=True)
class MetadataPatch:
    """update_message's metadata: only the fields given (``UNSET`` for the others), merged into the
    message's current metadata."""

    tool_call_id: Any = UNSET
    tags: Any = UNSET
    tier: Any = UNSET
    kind: Any = UNSET
    importance: Any = UNSET
    summary: Any = UNSET
    relations: Any = UNSET
    source_ids: Any = UNSET

    def apply(self, md: Metadata) -> Metadata:
        """``md`` with this patch's fields replaced (``md`` itself when the patch is empty)."""
        given = {f: v for f in METADATA_NAMES.values() if (v := getattr(self, f)) is not UNSET}
        return Metadata(**{f: given.get(f, getattr(md, f)) for f in METADATA_NAMES.values()}) if given else md

    def to_json_obj(self) -> dict[str, Any]:
        return _metadata_obj(self)


def _metadata_obj(md: Metadata | MetadataPatch) -> dict[str, Any]:
    """metadata_json's object for ``md`` (a patch: its given fields only)."""
    out: dict[str, Any] = {}
    for name, attr in METADATA_NAMES.items():
        value = getattr(md, attr)
        if value is UNSET:
            continue
        if attr == "relations":
            value = [{"type": t, "message_id": m} for t, m in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


# --- the memory tools ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class WriteMessage(_Request):
    session_id: str
    role: str
    content: str
    metadata: Metadata

    def to_args(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "role": self.role, "content": self.content,
                "metadata_json": json.dumps(self.metadata.to_json_obj())}


@dataclass(frozen=True, slots=True)
class UpdateMessage(_Request):
    message_id: str
    content: str | None              # None: keep the message's content
    metadata: MetadataPatch | None   # None: keep its metadata
    expected_revision: int | None

    def to_args(self) -> dict[str, Any]:
        return _given({"message_id": self.message_id, "content": self.content,
                       "metadata_json": None if self.metadata is None else json.dumps(self.metadata.to_json_obj()),
                       "expected_revision": self.expected_revision})


@dataclass(frozen=True, slots=True)
class DeleteMessage(_Request):
    message_id: str
    session_id: str | None           # given: delete only if the message is in this session



@dataclass(frozen=True, slots=True)
class ReadMessages(_Request):
    """read_messages: one subclass per view (``VIEW``); every view takes limit and cursor."""

    VIEW: ClassVar[str] = ""
    limit: int
    cursor: str | None

    def to_args(self) -> dict[str, Any]:
        return {"view": self.VIEW, **_Request.to_args(self)}


@dataclass(frozen=True, slots=True)
class ReadHistory(ReadMessages):
    VIEW: ClassVar[str] = "history"
    session_id: str


@dataclass(frozen=True, slots=True)
class ReadSessions(ReadMessages):
    VIEW: ClassVar[str] = "sessions"
    since: int | None                # epoch ms
    until: int | None
    order: str


@dataclass(frozen=True, slots=True)
class _ReadOneMessage(ReadMessages):
    """The views about one message (content, context): the message named, live or NOT_FOUND."""

    message_id: str


@dataclass(frozen=True, slots=True)
class ReadContent(_ReadOneMessage):
    VIEW: ClassVar[str] = "content"
    content_offset: int
    content_limit: int
    expected_revision: int | None


@dataclass(frozen=True, slots=True)
class ReadContext(_ReadOneMessage):
    VIEW: ClassVar[str] = "context"
    before: int
    after: int
    relation_depth: int
    relation_types: tuple[str, ...]

    def to_args(self) -> dict[str, Any]:
        return _given({"view": self.VIEW, "limit": self.limit, "cursor": self.cursor, "message_id": self.message_id,
                       "before": self.before, "after": self.after, "relation_depth": self.relation_depth,
                       "relation_types_json": json.dumps(list(self.relation_types))})


READ_VIEWS: dict[str, type[ReadMessages]] = {c.VIEW: c for c in (ReadHistory, ReadSessions, ReadContent, ReadContext)}


@dataclass(frozen=True, slots=True)
class SearchMessages(_Request):
    """search_messages, its filters_json flattened: ``kinds``/``tiers`` None restrict nothing."""

    query: str
    session_id: str | None
    kinds: frozenset[str] | None
    tiers: frozenset[str] | None
    tags: tuple[str, ...]            # a message must carry every one
    min_importance: int
    context_size: int
    limit: int

    def to_args(self) -> dict[str, Any]:
        filters = {k: sorted(v) for k, v in (("kinds", self.kinds), ("tiers", self.tiers)) if v is not None}
        if self.tags:
            filters["tags"] = list(self.tags)
        return _given({"query": self.query, "session_id": self.session_id, "filters_json": json.dumps(filters),
                       "min_importance": self.min_importance, "context_size": self.context_size,
                       "limit": self.limit})


@dataclass(frozen=True, slots=True)
class RebuildIndex(_Request):
    """Takes no arguments; the request id names the rebuild (rebuild_status polls it)."""


@dataclass(frozen=True, slots=True)
class GetSystemHealth(_Request):
    """Takes no arguments."""


# --- the daemon's own ops --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ping(_Request):
    """Takes no arguments: a liveness probe that also says which store is served."""


@dataclass(frozen=True, slots=True)
class RebuildStatus(_Request):
    rebuild_id: str



@dataclass(frozen=True, slots=True)
class Event:
    """The event facts an imported message carries (an agent transcript's tool call, result, ...)."""

    etype: str                       # the contract's "type"
    tool: str | None                 # "tool_name"
    is_error: bool | None
    exit_code: int | None
    model: str | None
    files: tuple[tuple[str, str | None, str | None, str | None, str], ...]  # (path, root, tail, project, op)

    def to_json_obj(self) -> dict[str, Any]:
        from .history import FILE_FIELDS  # local: history builds on this module

        return {"type": self.etype, "tool_name": self.tool, "is_error": self.is_error, "exit_code": self.exit_code,
                "model": self.model, "files": [dict(zip(FILE_FIELDS, f)) for f in self.files]}


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    """A message as export writes it: every field kept (id, times, revision, metadata, event)."""

    message_id: str
    session_id: str
    timestamp: int
    role: str
    content: str
    revision: int
    updated_at: int
    metadata: Metadata
    event: Event | None

    def to_json_obj(self) -> dict[str, Any]:
        out = {"message_id": self.message_id, "session_id": self.session_id, "timestamp": self.timestamp,
               "role": self.role, "content": self.content, "revision": self.revision,
               "updated_at": self.updated_at, "metadata": self.metadata.to_json_obj()}
        if self.event is not None:
            out["event"] = self.event.to_json_obj()
        return out


@dataclass(frozen=True, slots=True)
class SessionMeta:
    """An imported session's metadata fields (absent ones are left as the session has them)."""

    session_id: str
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """An ingester's durable read position in one file; ``value`` None forgets it."""

    source: str
    key: str
    value: dict[str, Any] | None


_T = TypeVar("_T")


def run_steps(steps: Generator[None, None, _T]) -> _T:
    """The result of work written as steps (a generator that yields between them and returns its
    result: an import validated and stored in slices) when nothing needs to run between the steps."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def paused_at(steps: Generator) -> str:
    """Where work written as steps stopped last (the innermost generator it yields from): its function
    and line, so that a long step is told by the line that ends it (the daemon's notes, bench.loop_probe)."""
    while getattr(steps, "gi_yieldfrom", None) is not None:
        steps = steps.gi_yieldfrom
    frame = getattr(steps, "gi_frame", None)
    return f"{frame.f_code.co_name}:{frame.f_lineno}" if frame is not None else "its end"


@dataclass(frozen=True, slots=True)
class ImportMessages(_Request):
    messages: tuple[ImportedMessage, ...]
    sessions: tuple[SessionMeta, ...]
    checkpoints: tuple[Checkpoint, ...]

    def to_args(self) -> dict[str, Any]:
        return {"messages": [m.to_json_obj() for m in self.messages],
                "sessions": [{"session_id": s.session_id, **s.fields} for s in self.sessions],
                "checkpoints": [{"source": c.source, "key": c.key, "value": c.value} for c in self.checkpoints]}


@dataclass(frozen=True, slots=True)
class ExportMessages(_Request):
    after_seq: int
    limit: int
    session_id: str | None



@dataclass(frozen=True, slots=True)
class IngestHeartbeat(_Request):
    """An ingester's liveness and progress (``sources``: one dict of counters per source)."""

    instance: str
    started_at: int
    interval_ms: int
    sources: tuple[dict[str, Any], ...]
    final: bool                      # the ingester's last word: it is stopping

    def to_args(self) -> dict[str, Any]:
        return {"instance": self.instance, "started_at": self.started_at, "interval_ms": self.interval_ms,
                "sources": [dict(s) for s in self.sources], "final": self.final}


@dataclass(frozen=True, slots=True)
class IngestCheckpoints(_Request):
    source: str



# --- the history tools -----------------------------------------------------------------------------
# Each keeps ``echo``, the canonical request in the contract's own names (the reply repeats it), and
# beside it what the views need parsed: typed ids, window bounds in epoch ms, the launch context.

@dataclass(frozen=True, slots=True)
class SearchSessions(_Echoed):
    echo: dict[str, Any]
    within: tuple[str, str] | None   # (kind, token) of within_id


@dataclass(frozen=True, slots=True)
class Open(_Echoed):
    echo: dict[str, Any]
    target: tuple[str, str] | None   # (kind, token) of id; None when a cursor is given
    limit: int | None
    cursor: str | None


@dataclass(frozen=True, slots=True)
class ListSessions(_Echoed):
    echo: dict[str, Any]
    start: int                       # epoch ms, the window [start, end)
    end: int


@dataclass(frozen=True, slots=True)
class Launch:
    """Where the front-end was launched and what it found on disk about the requested path."""

    cwd: str | None = None
    project: str | None = None
    tail: str | None = None
    tail_is_absolute: bool = False
    stripped_root: str | None = None
    path_project: str | None = None


@dataclass(frozen=True, slots=True)
class FileAttention(_Echoed):
    echo: dict[str, Any]
    start: int | None                # epoch ms
    end: int | None
    launch: Launch = field(default_factory=Launch)   # set from the request's context, not the arguments


@dataclass(frozen=True, slots=True)
class GetIngestStatus(_Echoed):
    echo: dict[str, Any]


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """Arguments without the ones left out (None: the contract's "not given")."""
    return {k: v for k, v in args.items() if v is not None}


# Every op's request class (read_messages: the base of its four views).
REQUEST_TYPES: dict[str, type] = {
    "write_message": WriteMessage, "update_message": UpdateMessage, "read_messages": ReadMessages,
    "search_messages": SearchMessages, "delete_message": DeleteMessage, "rebuild_index": RebuildIndex,
    "get_system_health": GetSystemHealth, "ping": Ping, "rebuild_status": RebuildStatus,
    "import_messages": ImportMessages, "export_messages": ExportMessages, "ingest_heartbeat": IngestHeartbeat,
    "ingest_checkpoints": IngestCheckpoints, "search_sessions": SearchSessions, "open": Open,
    "list_sessions": ListSessions, "file_attention": FileAttention, "get_ingest_status": GetIngestStatus,
}

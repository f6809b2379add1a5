"""Validation of every tool's arguments: untrusted input in, the op's request (``protocol.requests``) out.

The daemon runs this on every request, so a front-end that forgets a check (or a client that
talks to the daemon directly) cannot get bad data into the store. Errors name the field and the
constraint and never contain the value that was sent. Each validator reads the contract's argument
names and builds the request with the store's field names: that constructor call is where the one
maps to the other.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Generator

from . import limits as L
from . import requests as R
from .errors import invalid

# a ULID in Crockford base32 upper case (no I, L, O, U), its first character at most 7 (48-bit time);
# \Z, not $: "$" would also match before a trailing newline
ULID_RE = re.compile(rf"[0-7][0-9A-HJKMNP-TV-Z]{{{L.ULID_LEN - 1}}}\Z")
_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_MISSING = object()


def utf8_len(s: str, field: str = "text") -> int:
    """Bytes of ``s`` as UTF-8; lone surrogates (which JSON can smuggle in) are refused."""
    if s.isascii():  # known without looking at the text (CPython keeps the flag): no copy of 64 KiB
        return len(s)
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise invalid(f"{field} must be valid Unicode (no lone surrogates)") from None


def _name(key: Any) -> str:
    return f"'{key}'" if isinstance(key, str) and _SAFE_NAME.match(key) else "(unprintable name)"


def is_ulid(value: Any) -> bool:
    # ASCII first: str.upper() maps some other characters onto base32 letters ("ß" -> "SS", "ſ" -> "S")
    return isinstance(value, str) and value.isascii() and ULID_RE.fullmatch(value.upper()) is not None


def canonical_ulid(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{field} must be a string (a 26-character ULID)")
    if not is_ulid(value):
        raise invalid(f"{field} must be a 26-character ULID (Crockford base32)")
    return value.upper()


# Mutating tools that take the host's own request id (``request_id``): a retry that carries the id of
# the first call — the one an outcome-unknown BUSY error hands back — is applied at most once.
HOST_REQUEST_ID_TOOLS = ("write_message", "update_message", "delete_message")
REQUEST_ID_PARAM = "request_id"


def take_request_id(tool: str, args: Any) -> tuple[Any, str | None]:
    """(the tool's arguments without ``request_id``, the canonical id or None). The id travels in the
    request envelope, not among the tool's arguments, so the daemon's validators never see it."""
    if tool not in HOST_REQUEST_ID_TOOLS or not isinstance(args, dict) or REQUEST_ID_PARAM not in args:
        return args, None
    rest = {k: v for k, v in args.items() if k != REQUEST_ID_PARAM}
    value = args[REQUEST_ID_PARAM]
    return rest, (None if value is None else canonical_ulid(value, REQUEST_ID_PARAM))


def check_text(value: Any, field: str, min_bytes: int, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise invalid(f"{field} must be a string")
    n = utf8_len(value, field)
    if n < min_bytes:
        raise invalid(f"{field} must be at least {min_bytes} UTF-8 byte(s)")
    if n > max_bytes:
        raise invalid(f"{field} must be at most {max_bytes} UTF-8 bytes")
    return value


def check_int(value: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise invalid(f"{field} must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise invalid(f"{field} must be an integer")
        value = int(value)
    if not isinstance(value, int):
        raise invalid(f"{field} must be an integer")
    if value < lo or value > hi:
        raise invalid(f"{field} must be between {lo} and {hi}")
    return value


def check_enum(value: Any, field: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise invalid(f"{field} must be one of: {', '.join(allowed)}")
    return value


def parse_json_text(value: Any, field: str, max_bytes: int, kind: type) -> Any:
    """Parse a JSON-in-a-string argument (``metadata_json`` and friends)."""
    if not isinstance(value, str):
        raise invalid(f"{field} must be a string containing JSON")
    if utf8_len(value, field) > max_bytes:
        raise invalid(f"{field} must be at most {max_bytes} UTF-8 bytes")
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        raise invalid(f"{field} must be valid JSON") from None
    if not isinstance(parsed, kind):
        raise invalid(f"{field} must be a JSON {'object' if kind is dict else 'array'}")
    return parsed


class _Args:
    """Reads one tool's arguments, remembering which were consumed so leftovers are refused."""

    def __init__(self, args: Any, tool: str) -> None:
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise invalid(f"{tool} arguments must be an object")
        for key in args:
            if not isinstance(key, str):
                raise invalid(f"{tool} argument names must be strings")
        self.args = args
        self.tool = tool
        self.used: set[str] = set()

    def get(self, name: str, check: Callable[[Any], Any], default: Any = _MISSING) -> Any:
        self.used.add(name)
        value = self.args.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise invalid(f"{name} is required")
            return default
        return check(value)

    def done(self, out: Any) -> Any:
        """``out`` (the request built), once no argument is left that the tool does not take."""
        for key in self.args:
            if key not in self.used:
                raise invalid(f"unknown parameter {_name(key)} for {self.tool}")
        return out


# --- metadata -----------------------------------------------------------------------------------

METADATA_FIELDS = tuple(R.METADATA_NAMES)


def _tags(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise invalid(f"{field} must be an array of strings")
    if len(value) > L.TAGS_MAX:
        raise invalid(f"{field} must have at most {L.TAGS_MAX} items")
    return tuple(check_text(t, f"{field} item", 1, L.TAG_MAX_BYTES) for t in value)


def _relations(value: Any, field: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        raise invalid(f"{field} must be an array of {{type, message_id}} objects")
    if len(value) > L.RELATIONS_MAX:
        raise invalid(f"{field} must have at most {L.RELATIONS_MAX} items")
    out = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"type", "message_id"}:
            raise invalid(f"{field} items must be objects with exactly 'type' and 'message_id'")
        rtype = check_enum(item["type"], f"{field} type", L.RELATION_TYPES)
        out.append((rtype, canonical_ulid(item["message_id"], f"{field} message_id")))
    return tuple(out)


def _source_ids(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise invalid(f"{field} must be an array of ULIDs")
    if len(value) > L.SOURCE_IDS_MAX:
        raise invalid(f"{field} must have at most {L.SOURCE_IDS_MAX} items")
    return tuple(canonical_ulid(v, f"{field} item") for v in value)


def _optional_text(value: Any, field: str, max_bytes: int) -> str | None:
    """``None`` or ``""`` unsets; the contract says an empty summary counts as not set."""
    if value is None:
        return None
    text = check_text(value, field, 0, max_bytes)
    return text or None


def parse_metadata(text: Any, partial: bool) -> R.Metadata | R.MetadataPatch:
    """Parse ``metadata_json``. ``partial`` (update): a patch of the fields given, else all with defaults."""
    obj = parse_json_text(text, "metadata_json", L.METADATA_JSON_MAX_BYTES, dict)
    return check_metadata(obj, partial, "metadata_json")


# metadata_json's field -> its check (what it accepts: the contract's limits)
_METADATA_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "tool_call_id": lambda v, f: _optional_text(v, f, L.TOOL_CALL_ID_MAX_BYTES),
    "summary": lambda v, f: _optional_text(v, f, L.SUMMARY_MAX_BYTES),
    "tags": _tags,
    "memory_tier": lambda v, f: check_enum(v, f, L.MEMORY_TIERS),
    "memory_kind": lambda v, f: check_enum(v, f, L.MEMORY_KINDS),
    "importance": lambda v, f: check_int(v, f, L.IMPORTANCE_MIN, L.IMPORTANCE_MAX),
    "relations": _relations,
    "source_message_ids": _source_ids,
}


def check_metadata(obj: dict[str, Any], partial: bool, where: str) -> R.Metadata | R.MetadataPatch:
    """Validate a metadata object (parsed from metadata_json, or an imported message's metadata)."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            raise invalid(f"{where} field names must be strings")
        field = f"{where}.{key}" if _SAFE_NAME.match(key) else where
        check = _METADATA_CHECKS.get(key)
        if check is None:
            raise invalid(f"{where} has an unknown field {_name(key)}; allowed: {', '.join(METADATA_FIELDS)}")
        out[R.METADATA_NAMES[key]] = check(value, field)
    return R.MetadataPatch(**out) if partial else R.Metadata(**out)


# --- tools --------------------------------------------------------------------------------------

def _session_id(v: Any) -> str:
    return check_text(v, "session_id", 1, L.SESSION_ID_MAX_BYTES)


def _message_id(v: Any) -> str:
    return canonical_ulid(v, "message_id")


def _revision(v: Any) -> int:
    return check_int(v, "expected_revision", L.EXPECTED_REVISION_MIN, L.REVISION_MAX)


def validate_write_message(raw: Any) -> R.WriteMessage:
    a = _Args(raw, "write_message")
    out = R.WriteMessage(
        session_id=a.get("session_id", _session_id),
        role=a.get("role", lambda v: check_enum(v, "role", L.ROLES)),
        content=a.get("content", lambda v: check_text(v, "content", 1, L.CONTENT_MAX_BYTES)),
        metadata=a.get("metadata_json", lambda v: parse_metadata(v, partial=False), R.Metadata()),
    )
    return a.done(out)


def validate_update_message(raw: Any) -> R.UpdateMessage:
    a = _Args(raw, "update_message")
    out = R.UpdateMessage(
        message_id=a.get("message_id", _message_id),
        content=a.get("content", lambda v: check_text(v, "content", 1, L.CONTENT_MAX_BYTES), None),
        metadata=a.get("metadata_json", lambda v: parse_metadata(v, partial=True), None),
        expected_revision=a.get("expected_revision", _revision, None),
    )
    if out.content is None and out.metadata is None:
        raise invalid("update_message needs content or metadata_json (at least one)")
    return a.done(out)


# Which parameters each view takes. view, limit and cursor are the contract's common inputs, so every
# view accepts them (content and context have no pages and ignore both); the sessions view accepts
# and ignores session_id, which the contract says it "does not use". Parameters of another view are
# refused, so that a mistaken call (message_id to history...) is told so instead of half-served.
_VIEW_PARAMS = {
    "history": {"session_id", "limit", "cursor"},
    "sessions": {"limit", "cursor", "since", "until", "order", "session_id"},
    "content": {"message_id", "content_offset", "content_limit", "expected_revision", "limit", "cursor"},
    "context": {"message_id", "before", "after", "relation_depth", "relation_types_json", "limit", "cursor"},
}


def _relation_types(v: Any) -> tuple[str, ...]:
    arr = parse_json_text(v, "relation_types_json", L.RELATION_TYPES_JSON_MAX_BYTES, list)
    return tuple(check_enum(t, "relation_types_json item", L.RELATION_TYPES) for t in arr)


def validate_read_messages(raw: Any) -> R.ReadMessages:
    a = _Args(raw, "read_messages")
    view = a.get("view", lambda v: check_enum(v, "view", L.VIEWS), L.VIEW_DEFAULT)
    allowed = _VIEW_PARAMS[view]
    for key in a.args:
        if key != "view" and key not in allowed and a.args[key] is not None and key in _ALL_READ_PARAMS:
            raise invalid(f"{key} is not used by the {view} view")
    limit = a.get("limit", lambda v: check_int(v, "limit", L.READ_LIMIT_MIN, L.READ_LIMIT_MAX), L.READ_LIMIT_DEFAULT)
    cursor = a.get("cursor", lambda v: check_text(v, "cursor", 1, L.CURSOR_MAX_BYTES), None)
    out: R.ReadMessages
    if view == "sessions":
        a.get("session_id", _session_id, None)  # checked, not used
        since = a.get("since", lambda v: check_time(v, "since"), None)
        until = a.get("until", lambda v: check_time(v, "until"), None)
        order = a.get("order", lambda v: check_enum(v, "order", L.SESSION_ORDERS), L.SESSION_ORDER_DEFAULT)
        if since is not None and until is not None and since > until:
            raise invalid("since must not be later than until")
        out = R.ReadSessions(limit=limit, cursor=cursor, since=since, until=until, order=order)
    elif view == "history":
        out = R.ReadHistory(limit=limit, cursor=cursor, session_id=a.get("session_id", _session_id))
    elif view == "content":
        out = R.ReadContent(
            limit=limit, cursor=cursor,
            message_id=a.get("message_id", _message_id),
            content_offset=a.get("content_offset", lambda v: check_int(v, "content_offset", 0, L.CONTENT_MAX_BYTES),
                                 0),
            content_limit=a.get(
                "content_limit", lambda v: check_int(v, "content_limit", L.CONTENT_LIMIT_MIN, L.CONTENT_LIMIT_MAX),
                L.CONTENT_LIMIT_DEFAULT),
            expected_revision=a.get("expected_revision", _revision, None),
        )
    else:
        out = R.ReadContext(
            limit=limit, cursor=cursor,
            message_id=a.get("message_id", _message_id),
            before=a.get("before", lambda v: check_int(v, "before", 0, L.CONTEXT_BEFORE_MAX),
                         L.CONTEXT_NEIGHBOURS_DEFAULT),
            after=a.get("after", lambda v: check_int(v, "after", 0, L.CONTEXT_AFTER_MAX),
                        L.CONTEXT_NEIGHBOURS_DEFAULT),
            relation_depth=a.get("relation_depth", lambda v: check_int(v, "relation_depth", 0, L.RELATION_DEPTH_MAX),
                                 L.RELATION_DEPTH_DEFAULT),
            relation_types=a.get("relation_types_json", _relation_types, L.RELATION_TYPES),
        )
    return a.done(out)


_ALL_READ_PARAMS = set().union(*_VIEW_PARAMS.values())


_NO_FILTERS: dict[str, Any] = {"kinds": None, "tiers": None, "tags": ()}


def _filters(v: Any) -> dict[str, Any]:
    obj = parse_json_text(v, "filters_json", L.FILTERS_JSON_MAX_BYTES, dict)
    out = dict(_NO_FILTERS)
    for key, value in obj.items():
        if key == "kinds" or key == "tiers":
            allowed = L.MEMORY_KINDS if key == "kinds" else L.MEMORY_TIERS
            if not isinstance(value, list):
                raise invalid(f"filters_json.{key} must be an array of strings")
            # an empty list restricts nothing, as an empty tags list does (not "match no kind")
            out[key] = frozenset(check_enum(x, f"filters_json.{key} item", allowed) for x in value) or None
        elif key == "tags":
            out["tags"] = _tags(value, "filters_json.tags")
        else:
            raise invalid(f"filters_json has an unknown field {_name(key)}; allowed: kinds, tiers, tags")
    return out


def validate_search_messages(raw: Any) -> R.SearchMessages:
    a = _Args(raw, "search_messages")
    query = a.get("query", lambda v: check_text(v, "query", L.QUERY_MIN_BYTES, L.QUERY_MAX_BYTES))
    session_id = a.get("session_id", _session_id, None)
    filters = a.get("filters_json", _filters, _NO_FILTERS)
    out = R.SearchMessages(
        query=query, session_id=session_id, kinds=filters["kinds"], tiers=filters["tiers"], tags=filters["tags"],
        min_importance=a.get(
            "min_importance", lambda v: check_int(v, "min_importance", L.IMPORTANCE_MIN, L.IMPORTANCE_MAX), 0),
        context_size=a.get("context_size", lambda v: check_int(v, "context_size", 0, L.CONTEXT_SIZE_MAX), 0),
        limit=a.get("limit", lambda v: check_int(v, "limit", L.SEARCH_LIMIT_MIN, L.SEARCH_LIMIT_MAX),
                    L.SEARCH_LIMIT_DEFAULT),
    )
    return a.done(out)


def validate_delete_message(raw: Any) -> R.DeleteMessage:
    a = _Args(raw, "delete_message")
    out = R.DeleteMessage(message_id=a.get("message_id", _message_id),
                          session_id=a.get("session_id", _session_id, None))
    return a.done(out)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_ms(dt: datetime) -> int:
    """Milliseconds since the epoch of an aware datetime, exactly (``timestamp() * 1000`` in floating
    point lands a millisecond early for some instants), sub-milliseconds floored."""
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def check_time(value: Any, field: str) -> int:
    """Epoch milliseconds, or RFC 3339 text with an explicit offset ("Z" or "+09:00")."""
    if isinstance(value, str):
        if utf8_len(value, field) > L.TIME_TEXT_MAX_BYTES:
            raise invalid(f"{field} must be at most {L.TIME_TEXT_MAX_BYTES} bytes")
        try:
            dt = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value)
        except ValueError:
            raise invalid(f"{field} must be epoch milliseconds or RFC 3339 date-time text") from None
        if dt.tzinfo is None or "T" not in value.upper():
            raise invalid(f"{field} must be an RFC 3339 date-time with an explicit offset (e.g. Z or +09:00)")
        value = epoch_ms(dt)
        if not 0 <= value <= L.TIME_MS_MAX:
            raise invalid(f"{field} must be between 1970 and the year 10889")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"{field} must be epoch milliseconds (an integer) or RFC 3339 date-time text")
    return check_int(value, field, 0, L.TIME_MS_MAX)


def validate_import_messages(raw: Any) -> R.ImportMessages:
    """A batch of messages as export writes them, and from transcript ingesters also the sessions'
    metadata and the read positions (checkpoints) the batch reaches."""
    return R.run_steps(import_messages_steps(raw))


def import_messages_steps(raw: Any) -> Generator[None, None, R.ImportMessages]:
    """``validate_import_messages`` one message at a time: a step per message, so that the daemon checks
    a batch of a thousand between other clients' requests instead of holding them all ~0.1 s. The whole
    batch is checked before the request is built (an invalid message anywhere changes nothing)."""
    from . import history as H  # local: history builds on this module

    a = _Args(raw, "import_messages")

    def message_list(v: Any) -> list[Any]:
        if not isinstance(v, list):
            raise invalid("messages must be an array of message objects")
        if len(v) > L.IMPORT_BATCH_MAX:
            raise invalid(f"messages must have at most {L.IMPORT_BATCH_MAX} items")
        return v

    def sessions(v: Any) -> tuple[R.SessionMeta, ...]:
        if not isinstance(v, list) or len(v) > H.SESSIONS_PER_BATCH_MAX:
            raise invalid(f"sessions must be an array of at most {H.SESSIONS_PER_BATCH_MAX} session objects")
        return tuple(R.SessionMeta(*_history_check(H.check_session_meta, s, f"sessions[{i}]"))
                     for i, s in enumerate(v))

    def checkpoints(v: Any) -> tuple[R.Checkpoint, ...]:
        if not isinstance(v, list) or len(v) > H.CHECKPOINTS_PER_BATCH_MAX:
            raise invalid(f"checkpoints must be an array of at most {H.CHECKPOINTS_PER_BATCH_MAX} objects")
        return tuple(R.Checkpoint(*_history_check(H.check_checkpoint, c, f"checkpoints[{i}]"))
                     for i, c in enumerate(v))

    messages = []
    for i, m in enumerate(a.get("messages", message_list, ())):
        messages.append(_imported_message(m, i))
        yield
    out = R.ImportMessages(messages=tuple(messages), sessions=a.get("sessions", sessions, ()),
                           checkpoints=a.get("checkpoints", checkpoints, ()))
    if not (out.messages or out.sessions or out.checkpoints):
        raise invalid("messages must be a non-empty array of message objects")
    return a.done(out)


def _history_check(check: Callable[[Any, str], Any], obj: Any, where: str) -> Any:
    """A history-family check inside a first-family op: its failure as a VALIDATION_ERROR."""
    from .history import HistoryError

    try:
        return check(obj, where)
    except HistoryError as exc:
        raise invalid(exc.message) from None


_IMPORT_FIELDS = frozenset({"message_id", "session_id", "timestamp", "role", "content", "revision", "updated_at",
                            "metadata", "event"})


def _imported_message(m: Any, i: int) -> R.ImportedMessage:
    """A Message object as export writes it: every field kept (id, times, revision, metadata)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise invalid(f"{where} must be a message object")
    unknown = set(m) - _IMPORT_FIELDS
    if unknown:
        raise invalid(f"{where} has an unknown field {_name(next(iter(unknown)))}")
    for key in ("message_id", "session_id", "timestamp", "role", "content"):
        if m.get(key) is None:
            raise invalid(f"{where}.{key} is required")
    message_id = canonical_ulid(m["message_id"], f"{where}.message_id")
    session_id = check_text(m["session_id"], f"{where}.session_id", 1, L.SESSION_ID_MAX_BYTES)
    timestamp = check_int(m["timestamp"], f"{where}.timestamp", 0, L.TIME_MS_MAX)
    role = check_enum(m["role"], f"{where}.role", L.ROLES)
    content = check_text(m["content"], f"{where}.content", 1, L.CONTENT_MAX_BYTES)
    revision = check_int(m.get("revision", 1), f"{where}.revision", 1, L.REVISION_MAX)
    updated_at = check_int(m.get("updated_at", timestamp), f"{where}.updated_at", timestamp, L.TIME_MS_MAX)
    md = m.get("metadata", {})
    if not isinstance(md, dict):
        raise invalid(f"{where}.metadata must be an object")
    metadata = check_metadata(md, False, f"{where}.metadata")
    event = None
    if m.get("event") is not None:
        from .history import check_event

        event = _history_check(check_event, m["event"], f"{where}.event")
    return R.ImportedMessage(message_id=message_id, session_id=session_id, timestamp=timestamp, role=role,
                             content=content, revision=revision, updated_at=updated_at, metadata=metadata,
                             event=event)


def validate_export_messages(raw: Any) -> R.ExportMessages:
    """A page of the store in creation order, every field (event facts and session metadata too):
    what ``convmem export`` writes, so that an import recreates the store, not only its text."""
    a = _Args(raw, "export_messages")
    return a.done(R.ExportMessages(
        after_seq=a.get("after_seq", lambda v: check_int(v, "after_seq", 0, 2**62), 0),
        limit=a.get("limit", lambda v: check_int(v, "limit", 1, L.IMPORT_BATCH_MAX), L.IMPORT_BATCH_MAX),
        session_id=a.get("session_id", _session_id, None),
    ))


def validate_no_args(tool: str, request: type) -> Callable[[Any], Any]:
    def check(raw: Any) -> Any:
        return _Args(raw, tool).done(request())
    return check


def validate_rebuild_status(raw: Any) -> R.RebuildStatus:
    a = _Args(raw, "rebuild_status")
    return a.done(R.RebuildStatus(rebuild_id=a.get("rebuild_id", lambda v: canonical_ulid(v, "rebuild_id"))))


VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "write_message": validate_write_message,
    "update_message": validate_update_message,
    "read_messages": validate_read_messages,
    "search_messages": validate_search_messages,
    "delete_message": validate_delete_message,
    "rebuild_index": validate_no_args("rebuild_index", R.RebuildIndex),
    "get_system_health": validate_no_args("get_system_health", R.GetSystemHealth),
    "ping": validate_no_args("ping", R.Ping),
    "rebuild_status": validate_rebuild_status,
    "import_messages": validate_import_messages,
    "export_messages": validate_export_messages,
}


def validate(op: str, args: Any) -> Any:
    """The request (``protocol.requests``) of a first-family op or a daemon op; raises ProtocolError."""
    return VALIDATORS[op](args)

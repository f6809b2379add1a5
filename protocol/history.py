"""The second interface (agent history): its vocabulary, limits, error shape and input validation.

Five read-only tools navigate the store as sessions → turns → events, narrow to wide: a search hit
is a pointer with a short snippet, ``open`` expands on demand. Everything both processes must agree
on lives here, once: event types and how the first interface's roles map onto them, the harness and
source names the ingesters write, every limit, the error codes of this family (which differ from
the first interface's, see ``FROM_MEMORY_CODE``), and the validation that turns a tool's untrusted
arguments into a canonical request. Pure: no I/O.

Validation returns the tool's request (``protocol.requests``): ``echo``, the canonical request the
response repeats, beside the parsed fields the views need; it raises ``HistoryError`` with the
contract's code and a message that names the field and the constraint, never the value.
"""
from __future__ import annotations

import dataclasses
import math
import re
from datetime import datetime, timezone
from typing import Any, Callable

import msgpack

from . import limits as L
from . import requests as R
from .validation import epoch_ms, utf8_len

# --- the record model ----------------------------------------------------------------------------

USER_INPUT = "user_input"
ASSISTANT_RESPONSE = "assistant_response"
REASONING = "reasoning"
TOOL_CALL = "tool_call"
TOOL_RESPONSE = "tool_response"
SYSTEM = "system"
# The normalised order: canonical requests list event types in this order, whatever the caller's.
EVENT_TYPES = (USER_INPUT, ASSISTANT_RESPONSE, REASONING, TOOL_CALL, TOOL_RESPONSE, SYSTEM)
DEFAULT_SEARCH_EVENT_TYPES = (USER_INPUT, ASSISTANT_RESPONSE)

# A message written through the first interface is an event too: its role says which.
ROLE_EVENT_TYPE = {"user": USER_INPUT, "assistant": ASSISTANT_RESPONSE, "system": SYSTEM}
# And an imported event is a message of the first interface with this role (tool results are sent
# back to the model in the user's turn, as the Messages APIs do it).
EVENT_ROLE = {USER_INPUT: "user", ASSISTANT_RESPONSE: "assistant", REASONING: "assistant", TOOL_CALL: "assistant",
              TOOL_RESPONSE: "user", SYSTEM: "system"}

ENCRYPTED_REASONING = "[encrypted reasoning omitted]"
# A turn ends (is completed) at its final assistant response, or at one of these harness notes (a user
# interrupt, an aborted turn), stored as system events beginning with the marker. Compaction notes and
# other system events after the final response do not reopen a turn.
REQUEST_INTERRUPTED = "[Request interrupted"   # Claude Code's own words, kept as the event text
TURN_ABORTED = "[turn aborted"                 # the Codex parser's note for a turn_aborted record
INTERRUPT_MARKERS = (REQUEST_INTERRUPTED, TURN_ABORTED)

# Harnesses (what wrote the transcript) and sources (which ingest stream it came from).
HARNESS_CLAUDE_CODE = "claude-code"
HARNESS_CODEX = "codex"
HARNESS_GEMINI = "gemini-cli"
HARNESS_CONVMEM = "convmem"          # messages written with write_message
SOURCE_CLAUDE = "claude"
SOURCE_CLAUDE_SUBAGENTS = "claude-subagents"
SOURCE_CODEX = "codex"
SOURCE_GEMINI = "gemini"
SOURCE_MEMORY = "memory"
HARNESSES = (HARNESS_CLAUDE_CODE, HARNESS_CODEX, HARNESS_GEMINI, HARNESS_CONVMEM)
SOURCES = (SOURCE_CLAUDE, SOURCE_CLAUDE_SUBAGENTS, SOURCE_CODEX, SOURCE_GEMINI, SOURCE_MEMORY)

MODES = ("web_search", "mcp_internal", "tool_calling", "chat")
SORTS = ("desc", "asc")
SCOPES = ("project", "all")
GRANULARITIES = ("sessions", "events")
# Tool calls that only search or fetch the web: a session whose every call is one of them is in
# web_search mode.
WEB_SEARCH_TOOLS = frozenset({"WebSearch", "WebFetch", "web_search", "web_fetch", "google_web_search",
                              "web_search_call"})
# What a tool call did to a file. Only "read" is a pure read (mutations_only drops it).
FILE_OPS = ("read", "write", "edit", "delete")

ID_KINDS = ("session", "turn", "event")

# --- limits --------------------------------------------------------------------------------------

QUERY_MAX_CHARS = 4096
N_HITS_MIN, N_HITS_MAX, N_HITS_DEFAULT = 1, 50, 10
OPEN_LIMIT_MIN, OPEN_LIMIT_MAX = 1, 100
LIST_LIMIT_MIN, LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT = 1, 100, 20
ATTENTION_LIMIT_MIN, ATTENTION_LIMIT_MAX, ATTENTION_LIMIT_DEFAULT = 1, 100, 50
ID_MAX_CHARS = 256
FILTER_MAX_BYTES = 128             # harness, source, tool
PATH_MAX_BYTES = 4096
SNIPPET_CHARS = 200                # a search hit's snippet
COMPACT_CHARS = 240                # user input / final response / event summaries in open
LABEL_PREVIEW_CHARS = 120          # display_label's first-prompt preview
TITLE_MAX_BYTES = 1024
META_TEXT_MAX_BYTES = 4096         # session summary, cwd, project identity...
TOOL_NAME_MAX_BYTES = 256
MODEL_MAX_BYTES = 256
FILES_PER_EVENT_MAX = 64
CHECKPOINTS_PER_BATCH_MAX = 64
SESSIONS_PER_BATCH_MAX = 1000
CHECKPOINT_KEY_MAX_BYTES = 4096
CHECKPOINT_VALUE_MAX_BYTES = 16 * L.KiB
HEARTBEAT_SOURCES_MAX = 32
# An open page or a listing is cut at this many bytes of JSON even before its limit, so that one call
# stays far below what hosts accept as a tool result (the event itself is always served whole).
PAGE_BUDGET_BYTES = 256 * L.KiB
# How far the file_attention scan goes before it reports scan_truncated.
ATTENTION_SCAN_MAX = 200_000
# A read-model refresh (the daemon still loading its store) asks callers to come back after this.
REFRESH_RETRY_AFTER_MS = 200

# --- errors --------------------------------------------------------------------------------------

INVALID_REQUEST = "invalid_request"
INVALID_ID = "invalid_id"
NOT_FOUND = "not_found"
UNSUPPORTED_EVENT_TYPE = "unsupported_event_type"
CANCELLED = "cancelled"
DEADLINE_EXCEEDED = "deadline_exceeded"
BUSY = "busy"
RESOURCE_EXHAUSTED = "resource_exhausted"
BACKEND_FAILURE = "backend_failure"
INTERNAL_ERROR = "internal_error"
ERROR_CODES = (INVALID_REQUEST, INVALID_ID, NOT_FOUND, UNSUPPORTED_EVENT_TYPE, CANCELLED, DEADLINE_EXCEEDED, BUSY,
               RESOURCE_EXHAUSTED, BACKEND_FAILURE, INTERNAL_ERROR)
READ_MODEL_REFRESH = "read_model_refresh"

# A failure reported in the first interface's codes (by the store, the wire, or the front-end's own
# "daemon unavailable") as this family reports it.
FROM_MEMORY_CODE = {
    "VALIDATION_ERROR": INVALID_REQUEST,
    "NOT_FOUND": NOT_FOUND,
    "CONFLICT": INVALID_REQUEST,
    "BUSY": BUSY,
    "IO_ERROR": BACKEND_FAILURE,
    "CORRUPT_STORE": BACKEND_FAILURE,
    "INTERNAL_ERROR": INTERNAL_ERROR,
}


class HistoryError(Exception):
    """A failure of a history tool, in this family's codes."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None,
                 retry_after_ms: int | None = None) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after_ms = retry_after_ms

    def reply(self) -> dict[str, Any]:
        return error_reply(self.code, self.message, self.details, self.retry_after_ms)


def error_reply(code: str, message: str, details: dict[str, Any] | None = None,
                retry_after_ms: int | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message, "details": dict(details or {})}
    if retry_after_ms is not None:
        err["retryable"] = True
        err["retry_after_ms"] = int(retry_after_ms)
    return {"status": "ERROR", "error": err}


def from_memory_error(reply: dict[str, Any]) -> dict[str, Any]:
    """A first-interface error reply as this family's error reply (retry hints kept)."""
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    code = FROM_MEMORY_CODE.get(err.get("code"), INTERNAL_ERROR)
    message = err.get("message") if isinstance(err.get("message"), str) else "request failed"
    retry = err.get("retry_after_ms")
    return error_reply(code, message, None, retry if isinstance(retry, int) else None)


def refresh_error(message: str = "the history read model is being refreshed (the storage daemon is loading); "
                                 "retry the same request after retry_after_ms") -> HistoryError:
    return HistoryError(INTERNAL_ERROR, message, {"reason": READ_MODEL_REFRESH}, REFRESH_RETRY_AFTER_MS)


def _invalid(message: str, field: str | None = None, **details: Any) -> HistoryError:
    d = dict(details)
    if field is not None:
        d["field"] = field
    return HistoryError(INVALID_REQUEST, message, d)


# --- times ---------------------------------------------------------------------------------------

_FRACTION = re.compile(r"\.(\d+)")


def parse_datetime(value: Any, field: str, ms_precision: bool = False) -> int:
    """RFC 3339 text with an explicit offset ("Z" or "+09:00") → epoch milliseconds."""
    if not isinstance(value, str):
        raise _invalid(f"{field} must be an RFC 3339 date-time string with an explicit timezone", field)
    if utf8_len(value, field) > L.TIME_TEXT_MAX_BYTES:
        raise _invalid(f"{field} must be at most {L.TIME_TEXT_MAX_BYTES} bytes", field)
    text = value.strip()
    if text != value or "T" not in text.upper():
        raise _invalid(f"{field} must be an RFC 3339 date-time such as 2026-05-08T09:00:00-04:00", field)
    m = _FRACTION.search(text)
    if ms_precision and m is not None and len(m.group(1)) > 3:
        raise _invalid(f"{field} must have at most millisecond precision", field)
    try:
        dt = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        raise _invalid(f"{field} must be an RFC 3339 date-time such as 2026-05-08T09:00:00-04:00", field) from None
    if dt.tzinfo is None:
        raise _invalid(f"{field} must include an explicit timezone offset (Z or +HH:MM)", field)
    ms = epoch_ms(dt)
    if not 0 <= ms <= L.TIME_MS_MAX:
        raise _invalid(f"{field} must be between 1970 and the year 10889", field)
    return ms


def iso_ms(ms: int | None) -> str | None:
    """Epoch milliseconds → RFC 3339 in UTC with milliseconds, the one time format of this family."""
    if ms is None:
        return None
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# --- argument reading ----------------------------------------------------------------------------

_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_MISSING = object()


class _Args:
    """A tool's arguments: typed getters, leftovers refused (invalid_request naming the field)."""

    def __init__(self, raw: Any, tool: str, allowed: tuple[str, ...]) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise _invalid(f"{tool} arguments must be a JSON object")
        for key in raw:
            if not isinstance(key, str) or key not in allowed:
                name = key if isinstance(key, str) and _SAFE_NAME.match(key) else "(unprintable name)"
                raise _invalid(f"unknown field {name!r} for {tool}; allowed: {', '.join(allowed)}",
                               name if name != "(unprintable name)" else None)
        self.raw = raw

    def has(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def get(self, name: str, check: Callable[[Any, str], Any], default: Any = _MISSING) -> Any:
        value = self.raw.get(name)
        if value is None:
            if default is _MISSING:
                raise _invalid(f"{name} is required", name)
            return default
        return check(value, name)


def _int(lo: int, hi: int) -> Callable[[Any, str], int]:
    def check(value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid(f"{field} must be an integer from {lo} to {hi}", field)
        if isinstance(value, float):
            if not math.isfinite(value) or not value.is_integer():
                raise _invalid(f"{field} must be an integer from {lo} to {hi}", field)
            value = int(value)
        if not lo <= value <= hi:
            raise _invalid(f"{field} must be an integer from {lo} to {hi}", field)
        return value
    return check


def _enum(values: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(value: Any, field: str) -> str:
        if not isinstance(value, str) or value not in values:
            raise _invalid(f"{field} must be one of: {', '.join(values)}", field, allowed=list(values))
        return value
    return check


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid(f"{field} must be true or false", field)
    return value


def _filter_name(value: Any, field: str) -> str:
    """harness / source / tool: exact, case-sensitive (tool: case-insensitive), never blank."""
    if not isinstance(value, str):
        raise _invalid(f"{field} must be a string", field)
    if not value.strip():
        raise _invalid(f"{field} must not be blank", field)
    if utf8_len(value, field) > FILTER_MAX_BYTES:
        raise _invalid(f"{field} must be at most {FILTER_MAX_BYTES} UTF-8 bytes", field)
    return value


_ID_TOKEN = re.compile(r"[A-Za-z0-9_-]{4,240}\Z")


def parse_typed_id(value: Any, field: str) -> tuple[str, str]:
    """(kind, opaque token) of a typed id. Blank → invalid_request; not of the typed form → invalid_id.
    Whether the token is genuine (and what it names) only the daemon can tell."""
    if not isinstance(value, str):
        kinds = "session:... or turn:..." if field == "within_id" else "session:..., turn:... or event:..."
        raise _invalid(f"{field} must be a string id such as {kinds}", field)
    if not value.strip():
        raise _invalid(f"{field} must not be blank", field)
    kind, sep, token = value.partition(":")
    if not sep or kind not in ID_KINDS or len(value) > ID_MAX_CHARS or not _ID_TOKEN.match(token):
        raise HistoryError(INVALID_ID, f"{field} is not a valid convmem id (pass an id exactly as a previous "
                                       "search_sessions, list_sessions, file_attention or open returned it)",
                           {"field": field})
    return kind, token


# --- the five tools ------------------------------------------------------------------------------

SEARCH_FIELDS = ("query", "within_id", "event_types", "harness", "source", "n_hits")
OPEN_FIELDS = ("id", "limit", "cursor")
LIST_FIELDS = ("start_datetime", "end_datetime", "limit", "cursor", "mode", "harness", "source", "sort")
ATTENTION_FIELDS = ("path", "scope", "granularity", "start_datetime", "end_datetime", "tool", "harness", "source",
                    "mutations_only", "limit")


def _event_types(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _invalid(f"{field} must be an array of event types", field)
    if not value:
        raise _invalid(f"{field} must name at least one event type", field)
    if len(value) > 4 * len(EVENT_TYPES):
        raise _invalid(f"{field} must have at most {4 * len(EVENT_TYPES)} items", field)
    for t in value:
        if not isinstance(t, str) or t not in EVENT_TYPES:
            shown = t if isinstance(t, str) and _SAFE_NAME.match(t) else None
            raise HistoryError(UNSUPPORTED_EVENT_TYPE,
                               f"unsupported event type{': ' + shown if shown else ''}; supported: "
                               f"{', '.join(EVENT_TYPES)}",
                               {"field": field, "supported": list(EVENT_TYPES)})
    wanted = set(value)
    return tuple(t for t in EVENT_TYPES if t in wanted)


def _query(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{field} must be a non-empty string", field)
    utf8_len(value, field)
    text = value.strip()
    if not text:
        raise _invalid(f"{field} must be a non-empty string", field)
    if len(text) > QUERY_MAX_CHARS:
        raise _invalid(f"{field} must be at most {QUERY_MAX_CHARS} characters", field)
    return text


def _cursor(value: Any, tool: str) -> str:
    """The shape of a next_cursor (whether it is genuine, the daemon's MAC tells)."""
    if not isinstance(value, str) or not value.strip() or len(value) > L.CURSOR_MAX_BYTES:
        raise _invalid(f"cursor must be the next_cursor string of a previous {tool}, unchanged", "cursor")
    return value


def validate_search_sessions(raw: Any) -> R.SearchSessions:
    a = _Args(raw, "search_sessions", SEARCH_FIELDS)
    request = {
        "query": a.get("query", _query),
        "within_id": None,
        "event_types": list(a.get("event_types", _event_types, DEFAULT_SEARCH_EVENT_TYPES)),
        "harness": a.get("harness", _filter_name, None),
        "source": a.get("source", _filter_name, None),
        "n_hits": a.get("n_hits", _int(N_HITS_MIN, N_HITS_MAX), N_HITS_DEFAULT),
    }
    within = None
    if a.has("within_id"):
        request["within_id"] = a.raw["within_id"]
        within = parse_typed_id(a.raw["within_id"], "within_id")
        if within[0] == "event":
            raise _invalid("within_id accepts session and turn IDs, not event IDs", "within_id")
    return R.SearchSessions(echo=request, within=within)


def validate_open(raw: Any) -> R.Open:
    a = _Args(raw, "open", OPEN_FIELDS)
    if a.has("cursor"):
        if a.has("id") or a.has("limit"):
            raise _invalid("cursor must be passed by itself (it carries the id and the page size); "
                           "to start over, pass id and limit without cursor", "cursor")
        cursor = _cursor(a.raw["cursor"], "open")
        return R.Open(echo={"cursor": cursor}, target=None, limit=None, cursor=cursor)
    if not a.has("id"):
        if a.has("limit"):
            raise _invalid("limit needs an id (a session or turn id) to expand", "limit")
        raise _invalid("open needs an id (or the cursor of a previous expanded open)", "id")
    kind, token = parse_typed_id(a.raw["id"], "id")
    request: dict[str, Any] = {"id": a.raw["id"]}
    limit = None
    if a.has("limit"):
        if kind == "event":
            raise _invalid("limit applies to session and turn ids; an event opens whole, without pages", "limit")
        limit = a.get("limit", _int(OPEN_LIMIT_MIN, OPEN_LIMIT_MAX))
        request["limit"] = limit
    return R.Open(echo=request, target=(kind, token), limit=limit, cursor=None)


def validate_list_sessions(raw: Any) -> R.ListSessions:
    a = _Args(raw, "list_sessions", LIST_FIELDS)
    start = a.get("start_datetime", parse_datetime)
    end = a.get("end_datetime", parse_datetime)
    if end <= start:
        raise _invalid("end_datetime must be later than start_datetime (the window is [start, end))",
                       "end_datetime")
    request = {
        "start_datetime": a.raw["start_datetime"],
        "end_datetime": a.raw["end_datetime"],
        "limit": a.get("limit", _int(LIST_LIMIT_MIN, LIST_LIMIT_MAX), LIST_LIMIT_DEFAULT),
        "cursor": None,
        "mode": a.get("mode", _enum(MODES), None),
        "harness": a.get("harness", _filter_name, None),
        "source": a.get("source", _filter_name, None),
        "sort": a.get("sort", _enum(SORTS), "desc"),
    }
    if a.has("cursor"):
        request["cursor"] = _cursor(a.raw["cursor"], "list_sessions")
    return R.ListSessions(echo=request, start=start, end=end)


def _path(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{field} must be a file path string", field)
    if not value.strip():
        raise _invalid(f"{field} must not be blank", field)
    if utf8_len(value, field) > PATH_MAX_BYTES:
        raise _invalid(f"{field} must be at most {PATH_MAX_BYTES} UTF-8 bytes", field)
    if value != value.strip():
        raise _invalid(f"{field} must not have leading or trailing whitespace", field)
    if value.lower().startswith("file:"):
        raise _invalid(f"{field} must be a path, not a file:// URI", field)
    if value.endswith("/") or value.endswith("/.") or value in (".", ".."):
        raise _invalid(f"{field} must name a file, not a directory (no trailing slash)", field)
    if any(c in value for c in "\x00\n\r\t"):
        raise _invalid(f"{field} must be a single path (no control characters or line breaks)", field)
    return value


def validate_file_attention(raw: Any) -> R.FileAttention:
    a = _Args(raw, "file_attention", ATTENTION_FIELDS)
    dt = lambda v, f: parse_datetime(v, f, ms_precision=True)  # noqa: E731
    start = a.get("start_datetime", dt, None)
    end = a.get("end_datetime", dt, None)
    if start is not None and end is not None and end <= start:
        raise _invalid("end_datetime must be later than start_datetime (the window is [start, end))",
                       "end_datetime")
    request = {
        "path": a.get("path", _path),
        "scope": a.get("scope", _enum(SCOPES), "project"),
        "granularity": a.get("granularity", _enum(GRANULARITIES), "sessions"),
        "start_datetime": a.raw.get("start_datetime"),
        "end_datetime": a.raw.get("end_datetime"),
        "tool": a.get("tool", _filter_name, None),
        "harness": a.get("harness", _filter_name, None),
        "source": a.get("source", _filter_name, None),
        "mutations_only": a.get("mutations_only", _bool, False),
        "limit": a.get("limit", _int(ATTENTION_LIMIT_MIN, ATTENTION_LIMIT_MAX), ATTENTION_LIMIT_DEFAULT),
    }
    return R.FileAttention(echo=request, start=start, end=end)


def validate_get_ingest_status(raw: Any) -> R.GetIngestStatus:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or raw:
        raise _invalid("get_ingest_status takes no arguments (pass an empty object)")
    return R.GetIngestStatus(echo={})


HISTORY_TOOLS = ("search_sessions", "open", "list_sessions", "file_attention", "get_ingest_status")
HISTORY_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "search_sessions": validate_search_sessions,
    "open": validate_open,
    "list_sessions": validate_list_sessions,
    "file_attention": validate_file_attention,
    "get_ingest_status": validate_get_ingest_status,
}
# Tools that also carry where the MCP client was launched (the front-end adds it; agents cannot).
LAUNCH_CONTEXT_TOOLS = frozenset({"file_attention"})


# --- the launch context file_attention is resolved against ---------------------------------------

_LAUNCH_FIELDS = tuple(f.name for f in dataclasses.fields(R.Launch))


def validate_launch(raw: Any) -> R.Launch:
    """What the front-end found on disk about its launch directory and the requested path:
    ``cwd`` (absolute), ``project`` (git common dir, or the canonical launch dir; None if unknown),
    ``tail`` (the path relative to its project root, or the absolute path when no root holds it),
    ``tail_is_absolute``, ``stripped_root`` and ``path_project`` (the path's own root and identity)."""
    if raw is None:
        return R.Launch()
    if not isinstance(raw, dict) or set(raw) - set(_LAUNCH_FIELDS):
        raise _invalid("request context must be an object with: " + ", ".join(_LAUNCH_FIELDS))
    out: dict[str, Any] = {}
    for key in _LAUNCH_FIELDS:
        value = raw.get(key)
        if key == "tail_is_absolute":
            out[key] = bool(value) if isinstance(value, bool) else False
            continue
        if value is not None and (not isinstance(value, str) or not value
                                  or utf8_len(value, "context") > PATH_MAX_BYTES):
            raise _invalid(f"request context {key} must be a non-empty path of at most {PATH_MAX_BYTES} bytes")
        out[key] = value
    return R.Launch(**out)


# --- what ingesters send with the messages they import -------------------------------------------

EVENT_FIELDS = ("type", "tool_name", "is_error", "exit_code", "model", "files")
FILE_FIELDS = ("path", "root", "tail", "project", "op")
SESSION_META_FIELDS = ("harness", "source", "title", "cwd", "root", "project", "branch", "mode", "slug", "summary",
                       "first_prompt", "parent_session_id", "model")
_META_LIMITS = {"title": TITLE_MAX_BYTES, "first_prompt": META_TEXT_MAX_BYTES, "summary": META_TEXT_MAX_BYTES,
                "parent_session_id": L.SESSION_ID_MAX_BYTES, "model": MODEL_MAX_BYTES}


def _text(value: Any, where: str, max_bytes: int, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise _invalid(f"{where} must be a non-empty string")
    if utf8_len(value, where) > max_bytes:
        raise _invalid(f"{where} must be at most {max_bytes} UTF-8 bytes")
    return value


def check_event(obj: Any, where: str) -> R.Event:
    """An imported message's ``event`` object: its type and the tool facts a transcript carried."""
    if not isinstance(obj, dict):
        raise _invalid(f"{where} must be an object")
    unknown = set(obj) - set(EVENT_FIELDS)
    if unknown:
        raise _invalid(f"{where} has an unknown field; allowed: {', '.join(EVENT_FIELDS)}")
    etype = obj.get("type")
    if etype not in EVENT_TYPES:
        raise HistoryError(UNSUPPORTED_EVENT_TYPE, f"{where}.type must be one of: {', '.join(EVENT_TYPES)}",
                           {"field": f"{where}.type", "supported": list(EVENT_TYPES)})
    tool = _text(obj.get("tool_name"), f"{where}.tool_name", TOOL_NAME_MAX_BYTES)
    model = _text(obj.get("model"), f"{where}.model", MODEL_MAX_BYTES)
    is_error = obj.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _invalid(f"{where}.is_error must be true or false")
    code = obj.get("exit_code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not -2**31 <= code < 2**31):
        raise _invalid(f"{where}.exit_code must be a 32-bit integer")
    files = obj.get("files") or []
    if not isinstance(files, list) or len(files) > FILES_PER_EVENT_MAX:
        raise _invalid(f"{where}.files must be an array of at most {FILES_PER_EVENT_MAX} file objects")
    return R.Event(etype=etype, tool=tool, is_error=is_error, exit_code=code, model=model,
                   files=tuple(_file(f, f"{where}.files[{i}]") for i, f in enumerate(files)))


def _file(obj: Any, where: str) -> tuple[str, str | None, str | None, str | None, str]:
    if not isinstance(obj, dict) or set(obj) - set(FILE_FIELDS):
        raise _invalid(f"{where} must be an object with: {', '.join(FILE_FIELDS)}")
    path = _text(obj.get("path"), f"{where}.path", PATH_MAX_BYTES, allow_none=False)
    root = _text(obj.get("root"), f"{where}.root", PATH_MAX_BYTES)
    tail = _text(obj.get("tail"), f"{where}.tail", PATH_MAX_BYTES)
    project = _text(obj.get("project"), f"{where}.project", PATH_MAX_BYTES)
    op = obj.get("op")
    if op not in FILE_OPS:
        raise _invalid(f"{where}.op must be one of: {', '.join(FILE_OPS)}")
    if (root is None) != (tail is None):
        raise _invalid(f"{where}: root and tail go together (both, or neither for an unknown root)")
    return path, root, tail, project, op


def check_session_meta(obj: Any, where: str) -> tuple[str, dict[str, Any]]:
    """(session_id, metadata fields) of an imported session record; absent fields are left as they are."""
    if not isinstance(obj, dict):
        raise _invalid(f"{where} must be an object")
    unknown = set(obj) - set(SESSION_META_FIELDS) - {"session_id"}
    if unknown:
        raise _invalid(f"{where} has an unknown field; allowed: session_id, {', '.join(SESSION_META_FIELDS)}")
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid or utf8_len(sid, f"{where}.session_id") > L.SESSION_ID_MAX_BYTES:
        raise _invalid(f"{where}.session_id must be 1-{L.SESSION_ID_MAX_BYTES} UTF-8 bytes")
    meta: dict[str, Any] = {}
    for key in SESSION_META_FIELDS:
        value = obj.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue  # absent, or blank: nothing to say (a blank title must not become a label)
        if key == "mode":
            meta[key] = _enum(MODES)(value, f"{where}.mode")
        elif key in ("harness", "source"):
            meta[key] = _filter_name(value, f"{where}.{key}")
        else:
            meta[key] = _text(value, f"{where}.{key}", _META_LIMITS.get(key, META_TEXT_MAX_BYTES))
    return sid, meta


def check_checkpoint(obj: Any, where: str) -> tuple[str, str, dict[str, Any] | None]:
    """(source, key, value or None to forget it): an ingester's durable read position for one file."""
    if not isinstance(obj, dict) or set(obj) - {"source", "key", "value"}:
        raise _invalid(f"{where} must be an object with source, key and value")
    source = _filter_name(obj.get("source"), f"{where}.source")
    key = _text(obj.get("key"), f"{where}.key", CHECKPOINT_KEY_MAX_BYTES, allow_none=False)
    value = obj.get("value")
    if value is not None:
        if not isinstance(value, dict):
            raise _invalid(f"{where}.value must be an object or null")
        if len(msgpack.packb(value, use_bin_type=True)) > CHECKPOINT_VALUE_MAX_BYTES:
            raise _invalid(f"{where}.value must encode to at most {CHECKPOINT_VALUE_MAX_BYTES} bytes")
    return source, key, value


_COUNTERS = ("files_total", "files_completed", "bytes_total", "bytes_completed", "files_watched", "files_active",
             "errors", "queue_depth")


def validate_ingest_heartbeat(raw: Any) -> R.IngestHeartbeat:
    """An ingester's liveness and progress report (kept in memory by the daemon, never in the log)."""
    if not isinstance(raw, dict) or set(raw) - {"instance", "started_at", "interval_ms", "sources", "final"}:
        raise _invalid("ingest_heartbeat takes instance, started_at, interval_ms, sources and final")
    instance = _text(raw.get("instance"), "instance", 64, allow_none=False)
    started = _int(0, L.TIME_MS_MAX)(raw.get("started_at"), "started_at")
    interval = _int(100, 3_600_000)(raw.get("interval_ms"), "interval_ms")
    sources = raw.get("sources")
    if not isinstance(sources, list) or len(sources) > HEARTBEAT_SOURCES_MAX:
        raise _invalid(f"sources must be an array of at most {HEARTBEAT_SOURCES_MAX} objects")
    out_sources = []
    for i, s in enumerate(sources):
        where = f"sources[{i}]"
        allowed = {"source", "harness", "discovery_complete", *_COUNTERS}
        if not isinstance(s, dict) or set(s) - allowed:
            raise _invalid(f"{where} must be an object with: {', '.join(sorted(allowed))}")
        item: dict[str, Any] = {"source": _filter_name(s.get("source"), f"{where}.source"),
                                "harness": _filter_name(s.get("harness"), f"{where}.harness"),
                                "discovery_complete": _bool(s.get("discovery_complete", False),
                                                            f"{where}.discovery_complete")}
        for key in _COUNTERS:
            item[key] = _int(0, 2**62)(s.get(key, 0), f"{where}.{key}")
        out_sources.append(item)
    final = _bool(raw.get("final", False), "final")   # the ingester's last word: it is stopping
    return R.IngestHeartbeat(instance=instance, started_at=started, interval_ms=interval, sources=tuple(out_sources),
                             final=final)


def validate_ingest_checkpoints(raw: Any) -> R.IngestCheckpoints:
    """Read back one source's checkpoints (an ingester resuming)."""
    if not isinstance(raw, dict) or set(raw) != {"source"}:
        raise _invalid("ingest_checkpoints takes exactly: source")
    return R.IngestCheckpoints(source=_filter_name(raw["source"], "source"))

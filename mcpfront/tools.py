"""The tools as MCP sees them: names, descriptions, input and output schemas, annotations.

Two families: the seven memory tools of the first interface (defined here) and the five read-only
history tools (``history_tools``). ``tool_list`` serves either family or both (``--tools``).

Everything numeric comes from ``protocol.limits``; nothing is restated here. The input schemas
describe the contract for the caller (types, ranges, enums, defaults); the daemon's validation in
``protocol.validation`` is what enforces it, so a schema that a host ignores costs nothing.

JSON Schema's ``maxLength`` counts characters while the contract counts UTF-8 bytes: a byte limit
N implies at most N characters, so ``maxLength`` N is a true (if loose) bound, and each such field's
description names the byte limit.

Input schemas avoid ``anyOf``/``oneOf`` at the top level: several hosts refuse tools whose input
schema has them, so "at least one of" rules are stated in the description and enforced by the daemon.
"""
from __future__ import annotations

from typing import Any

import mcp_types as types

from protocol import limits as L
from protocol.errors import ERROR_CODES
from protocol.wire import HISTORY_TOOLS, READ_ONLY_TOOLS, TOOLS

from . import history_tools as HT

# --- small schema builders -----------------------------------------------------------------------

_ULID_PATTERN = f"^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{{L.ULID_LEN - 1}}}$"


def _obj(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def _text(desc: str, max_bytes: int, min_bytes: int = 0, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": desc, "maxLength": max_bytes}
    if min_bytes:
        schema["minLength"] = min_bytes
    schema.update(extra)
    return schema


def _int(desc: str, lo: int, hi: int, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": desc, "minimum": lo, "maximum": hi}
    if default is not None:
        schema["default"] = default
    return schema


def _ulid(desc: str) -> dict[str, Any]:
    return {"type": "string", "description": desc, "minLength": L.ULID_LEN, "maxLength": L.ULID_LEN,
            "pattern": _ULID_PATTERN}


def _enum(desc: str, values: tuple[str, ...], default: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": desc, "enum": list(values)}
    if default is not None:
        schema["default"] = default
    return schema


def _input(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return _obj(properties, required, additionalProperties=False)


# epoch milliseconds or RFC 3339 text (minimum/maximum bind the integer form, maxLength the text form)
_TIME = {"type": ["integer", "string"], "minimum": 0, "maximum": L.TIME_MS_MAX, "minLength": 1,
         "maxLength": L.TIME_TEXT_MAX_BYTES}


# The host's own request id for a mutation (protocol.validation.take_request_id).
REQUEST_ID = _ulid(
    "Optional. Only to retry a call whose BUSY error said outcome_unknown: pass the request_id from that error "
    f"and the same arguments; the change is then applied at most once (ids are remembered "
    f"{L.REQUEST_ID_RETENTION_S // 3600} hours). Any ULID of your own also works.")


def _choices(values: tuple[str, ...]) -> str:
    return " / ".join(values)


# --- shared parameter descriptions ---------------------------------------------------------------

SESSION_ID = _text(f"Conversation/session identifier, 1-{L.SESSION_ID_MAX_BYTES} UTF-8 bytes.",
                   L.SESSION_ID_MAX_BYTES, 1)
MESSAGE_ID = _ulid(f"ID of the message: the {L.ULID_LEN}-character ULID returned by write_message, "
                   "search_messages or read_messages.")
EXPECTED_REVISION = _int("Optimistic-concurrency guard: the revision you last saw. If the message's current "
                         "revision differs, the call fails with CONFLICT and nothing changes.",
                         L.EXPECTED_REVISION_MIN, L.REVISION_MAX)

METADATA_DOC = (
    "JSON object encoded as a string (escape it: \"{\\\"tags\\\":[\\\"project\\\"],\\\"importance\\\":80}\"). "
    f"Fields: tool_call_id (string, <= {L.TOOL_CALL_ID_MAX_BYTES} bytes); "
    f"tags (array of <= {L.TAGS_MAX} non-empty strings, each <= {L.TAG_MAX_BYTES} bytes); "
    f"memory_tier ({_choices(L.MEMORY_TIERS)}; default {L.MEMORY_TIER_DEFAULT}); "
    f"memory_kind ({_choices(L.MEMORY_KINDS)}; default {L.MEMORY_KIND_DEFAULT}); "
    f"importance (integer {L.IMPORTANCE_MIN}-{L.IMPORTANCE_MAX}; default {L.IMPORTANCE_DEFAULT}); "
    f"summary (string, <= {L.SUMMARY_MAX_BYTES} bytes, empty = unset); "
    f"relations (array of <= {L.RELATIONS_MAX} {{\"type\": {_choices(L.RELATION_TYPES)}, \"message_id\": ULID}}); "
    f"source_message_ids (array of <= {L.SOURCE_IDS_MAX} ULIDs). Unknown fields are refused."
)

# --- output schemas ------------------------------------------------------------------------------

_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}
_STR_LIST = {"type": "array", "items": _STR}

METADATA_OUT = _obj({
    "tool_call_id": _STR,
    "tags": _STR_LIST,
    "memory_tier": {"type": "string", "enum": list(L.MEMORY_TIERS)},
    "memory_kind": {"type": "string", "enum": list(L.MEMORY_KINDS)},
    "importance": _INT,
    "summary": _STR,
    "relations": {"type": "array", "items": _obj({"type": _STR, "message_id": _STR}, ("type", "message_id"))},
    "source_message_ids": _STR_LIST,
}, ("tags", "memory_tier", "memory_kind", "importance", "relations", "source_message_ids"))

MESSAGE_FIELDS = {
    "message_id": _STR,
    "session_id": _STR,
    "timestamp": _INT,
    "role": {"type": "string", "enum": list(L.ROLES)},
    "content": _STR,
    "revision": _INT,
    "updated_at": _INT,
    "metadata": METADATA_OUT,
}
MESSAGE_REQUIRED = tuple(MESSAGE_FIELDS)
MESSAGE_OUT = _obj(MESSAGE_FIELDS, MESSAGE_REQUIRED)
MESSAGE_LIST = {"type": "array", "items": MESSAGE_OUT}
NEIGHBOURS = _obj({"before": MESSAGE_LIST, "after": MESSAGE_LIST}, ("before", "after"))
OK = {"type": "string", "const": "OK"}

WRITE_OUT = _obj({"status": OK, "message": MESSAGE_OUT}, ("status", "message"))
UPDATE_OUT = _obj({"status": OK, "changed": _BOOL, "message": MESSAGE_OUT}, ("status", "changed", "message"))

CONTENT_RANGE_OUT = _obj({
    "message_id": _STR, "revision": _INT, "total_bytes": _INT, "content_offset": _INT,
    "next_content_offset": _INT, "complete": _BOOL, "content": _STR,
}, ("message_id", "revision", "total_bytes", "content_offset", "next_content_offset", "complete", "content"))
RELATION_OUT = _obj({
    "type": {"type": "string", "enum": list(L.RELATION_TYPES)},
    "direction": {"type": "string", "enum": ["outgoing", "incoming"]},
    "depth": _INT,
    "message": MESSAGE_OUT,
    "message_id": _STR,
    "status": {"type": "string", "const": "deleted"},
}, ("type", "direction", "depth"))
SESSION_OUT = _obj({
    "session_id": _STR,
    "message_count": _INT,
    "kind_counts": _obj({k: _INT for k in L.MEMORY_KINDS}),
    "representative_summary": _STR,
    "started_at": _INT,
    "last_message_at": _INT,
}, ("session_id", "message_count"))
# One object whose properties cover all four views; anyOf says which keys make each view.
READ_OUT = _obj(
    {
        "history": MESSAGE_LIST,
        "nextCursor": _STR,
        "content_range": CONTENT_RANGE_OUT,
        "message": MESSAGE_OUT,
        "chronological_context": NEIGHBOURS,
        "relations": {"type": "array", "items": RELATION_OUT},
        "session": _obj({"session_id": _STR, "message_count": _INT}, ("session_id", "message_count")),
        "truncated": _BOOL,
        "sessions": {"type": "array", "items": SESSION_OUT},
    },
    anyOf=[
        {"required": ["history"]},
        {"required": ["content_range"]},
        {"required": ["message", "chronological_context", "relations", "session", "truncated"]},
        {"required": ["sessions"]},
    ],
)
SEARCH_RESULT_OUT = _obj(
    {
        **MESSAGE_FIELDS,
        "score": _NUM,
        "score_breakdown": _obj({part: _NUM for part in L.SEARCH_SCORE_PARTS}),
        "matched_fields": {"type": "array", "items": {"type": "string", "enum": list(L.SEARCH_SCORE_PARTS)}},
        "relation_count": _INT,
        "context_preview": NEIGHBOURS,
    },
    MESSAGE_REQUIRED + ("score", "score_breakdown", "matched_fields", "relation_count"),
)
SEARCH_OUT = _obj({"results": {"type": "array", "items": SEARCH_RESULT_OUT}}, ("results",))
DELETE_OUT = _obj({"status": {"type": "string", "enum": ["OK", "NOT_FOUND"]}}, ("status",))
REBUILD_FIGURES = ("messages_indexed", "records_removed", "bytes_before", "bytes_after")
REBUILD_OUT = _obj({"status": OK, **{k: _INT for k in REBUILD_FIGURES}}, ("status",) + REBUILD_FIGURES)
MEMORY_FIELDS = ("total_bytes", "store_entries_bytes", "body_bytes", "metadata_bytes", "search_index_bytes",
                 "history_index_bytes", "relation_index_bytes")
IO_FIELDS = ("write_bytes", "write_calls", "flush_calls", "truncate_calls", "replace_calls")
HEALTH_INTS = ("format_version", "log_size", "snapshot_size", "active_messages", "session_count",
               "deleted_messages", "last_sequence", "update_records", "dead_bytes")
HEALTH_OUT = _obj(
    {
        "status": {"type": "string", "enum": ["OK", "DEGRADED"]},
        **{k: _INT for k in HEALTH_INTS},
        "memory_estimate": _obj({k: _INT for k in MEMORY_FIELDS}, MEMORY_FIELDS),
        "io": _obj({k: _INT for k in IO_FIELDS}, IO_FIELDS),
        "recovered_tail": _BOOL,
        "snapshot_valid": _BOOL,
        "last_error": _STR,
    },
    ("status",) + HEALTH_INTS + ("memory_estimate", "io", "recovered_tail", "snapshot_valid", "last_error"),
)

# --- the tools -----------------------------------------------------------------------------------

_ERRORS = ("Failures come back as isError with {\"status\":\"ERROR\",\"error\":{\"code\",\"message\"}}; "
           "BUSY errors carry retryable and retry_after_ms: wait that long and call again.")
_OUTCOME = (" A BUSY error with outcome_unknown true means the change may or may not have been applied: call "
            "again with the same arguments plus the error's request_id, which applies it exactly once.")

WRITE_DESC = (
    "Store a new message in durable conversation memory (shared by every MCP host on this machine). "
    "Use it to remember a user/assistant/system turn, a decision, a fact or a summary. The message is "
    "flushed to disk before the call returns and is searchable at once. Returns "
    "{\"status\":\"OK\",\"message\":{message_id, session_id, timestamp, role, content, revision:1, updated_at, "
    "metadata}}; keep message_id to update, read, relate or delete it later. Optional metadata_json "
    "classifies the memory (tags, memory_kind, memory_tier, importance, summary, relations to earlier "
    "messages). " + _ERRORS + _OUTCOME
)
UPDATE_DESC = (
    "Change the content and/or metadata of an existing message; its id, session, role and creation time "
    "stay. Give content, metadata_json, or both (at least one is required). metadata_json is a partial "
    "update: fields you leave out keep their values. Pass expected_revision (the revision you read) to "
    "refuse the update with CONFLICT if someone changed the message meanwhile. Updating to identical "
    "values is a no-op (changed:false, revision unchanged). Returns {\"status\":\"OK\",\"changed\":bool,"
    "\"message\":{...}}. NOT_FOUND if the message does not exist or was deleted. " + _ERRORS + _OUTCOME
)
READ_DESC = (
    "Read stored memory, narrow to wide. view='history' (default, needs session_id): a session's messages "
    "in creation order, paged with limit and nextCursor. view='sessions': the list of sessions (message "
    "counts per kind, representative summary, first/last time), paged the same way, optionally only those "
    "with a message at or after since that started before until, and newest first (order='desc'): "
    "\"what did I work on yesterday\" is one call. view='context' (needs "
    "message_id): one message with its neighbours in the session (before/after) and its relation graph "
    "(relation_depth, relation_types_json) -- use it after search_messages to see what surrounds a hit. "
    "view='content' (needs message_id): one message's content as a UTF-8 byte range (content_offset, "
    "content_limit); when complete is false call again with next_content_offset and expected_revision set "
    "to the returned revision, to read a long message piece by piece. Parameters that do not belong to "
    "the chosen view are refused. Results: {history,nextCursor?} | {sessions,nextCursor?} | {message, "
    "chronological_context, relations, session, truncated} | {content_range}. Cursors are opaque: pass "
    "nextCursor back unchanged with the same view (and session_id). " + _ERRORS
)
SEARCH_DESC = (
    "Find stored messages by relevance: lexical search over content, summary and tags (English and "
    "Japanese, case- and width-insensitive), best first; ties go to higher importance, then newer. Start "
    "here when you need to recall something, then widen with read_messages view='context' (surroundings, "
    "relations) or view='content' (a long message in full). Optional filters: session_id, filters_json "
    f"(a JSON object as a string: kinds [{_choices(L.MEMORY_KINDS)}] and tiers [{_choices(L.MEMORY_TIERS)}] "
    "match any listed value, tags must all be present; categories combine with AND), min_importance, and "
    "context_size (neighbouring messages to attach to each hit). Returns {\"results\":[{...message fields, "
    "score, score_breakdown{content,summary,tags,context}, matched_fields, relation_count, context_preview?}]}. "
    "A message's score also takes in its neighbours in the same session (a reply like \"yes, twice\" is "
    "found through the question before it): that share is score_breakdown.context, and a message found only "
    "that way has matched_fields [\"context\"]. Search never changes stored state. " + _ERRORS
)
DELETE_DESC = (
    "Delete a message (logically): it disappears from reads and searches at once; its text is removed "
    "from disk by the next rebuild_index. Optional session_id is a guard: the message is deleted only if "
    "it belongs to that session. Returns {\"status\":\"OK\"} when deleted, or {\"status\":\"NOT_FOUND\"} "
    "(not an error) when there is no such live message or the guard does not match; deleting twice is "
    "therefore harmless. " + _ERRORS + _OUTCOME
)
REBUILD_DESC = (
    "Maintenance: compact the log to the live messages only (physically removing deleted and superseded "
    "text), rewrite the snapshot and rebuild the in-memory indexes. Takes no parameters and returns when "
    "it is done: {\"status\":\"OK\",\"messages_indexed\",\"records_removed\",\"bytes_before\",\"bytes_after\"}. "
    "While it runs, reads keep working and writes, updates and deletes are answered BUSY (retry after "
    "retry_after_ms). Rarely needed: use it after many deletes/updates (see dead_bytes in "
    "get_system_health) or when deleted text must be gone from disk. " + _ERRORS
)
HEALTH_DESC = (
    "Report the memory store's state: status (OK, or DEGRADED with a diagnostic in last_error), format "
    "version, log and snapshot sizes, live/deleted message and session counts, last sequence, update "
    "records, dead bytes (reclaimable by rebuild_index), a memory estimate by structure, logical I/O "
    "counters, and whether recovery cut a torn tail or found the snapshot invalid. Takes no parameters; "
    "changes nothing. " + _ERRORS
)

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "write_message": _input({
        "session_id": SESSION_ID,
        "role": _enum("Who spoke.", L.ROLES),
        "content": _text(f"The message text, 1 byte to {L.CONTENT_MAX_BYTES} UTF-8 bytes.", L.CONTENT_MAX_BYTES, 1),
        "metadata_json": _text("Optional metadata. " + METADATA_DOC, L.METADATA_JSON_MAX_BYTES, default="{}"),
        "request_id": REQUEST_ID,
    }, ("session_id", "role", "content")),
    "update_message": _input({
        "message_id": MESSAGE_ID,
        "content": _text(f"New content, 1 byte to {L.CONTENT_MAX_BYTES} UTF-8 bytes.", L.CONTENT_MAX_BYTES, 1),
        "metadata_json": _text("Metadata fields to change; fields not given are kept. " + METADATA_DOC,
                               L.METADATA_JSON_MAX_BYTES),
        "expected_revision": EXPECTED_REVISION,
        "request_id": REQUEST_ID,
    }, ("message_id",)),
    "read_messages": _input({
        "view": _enum("What to read: history | content | context | sessions.", L.VIEWS, L.VIEW_DEFAULT),
        "limit": _int("history/sessions: page size.", L.READ_LIMIT_MIN, L.READ_LIMIT_MAX, L.READ_LIMIT_DEFAULT),
        "cursor": _text("history/sessions: the nextCursor of the previous page, unchanged (opaque).",
                        L.CURSOR_MAX_BYTES, 1),
        "session_id": {**SESSION_ID, "description": "history (required): the session to read. "
                       + SESSION_ID["description"]},
        "message_id": {**MESSAGE_ID, "description": "content and context (required): the message. "
                       + MESSAGE_ID["description"]},
        "content_offset": _int("content: UTF-8 byte offset to start at (0, the end, or a code point boundary; "
                               "use next_content_offset from the previous chunk).", 0, L.CONTENT_MAX_BYTES, 0),
        "content_limit": _int("content: target chunk size in bytes (cut back to a code point boundary).",
                              L.CONTENT_LIMIT_MIN, L.CONTENT_LIMIT_MAX, L.CONTENT_LIMIT_DEFAULT),
        "expected_revision": {**EXPECTED_REVISION, "description": "content: the revision of the first chunk, "
                              "so that chunks of different revisions are never mixed (CONFLICT otherwise)."},
        "before": _int("context: messages before the target in its session.", 0, L.CONTEXT_BEFORE_MAX,
                       L.CONTEXT_NEIGHBOURS_DEFAULT),
        "after": _int("context: messages after the target in its session.", 0, L.CONTEXT_AFTER_MAX,
                      L.CONTEXT_NEIGHBOURS_DEFAULT),
        "relation_depth": _int("context: how many relation hops to follow (both directions).", 0,
                               L.RELATION_DEPTH_MAX, L.RELATION_DEPTH_DEFAULT),
        "since": {**_TIME, "description": "sessions: only sessions with a message at or "
                  "after this time (inclusive): epoch milliseconds, or RFC 3339 text with an explicit offset, "
                  "e.g. \"2026-11-28T00:00:00+09:00\"."},
        "until": {**_TIME, "description": "sessions: only sessions that started before "
                  "this time (exclusive); same forms as since. since+until = \"what was I doing then\"."},
        "order": _enum("sessions: by start time, then session_id.", L.SESSION_ORDERS, L.SESSION_ORDER_DEFAULT),
        "relation_types_json": _text(
            "context: JSON array (as a string) of relation types to follow, from "
            f"{_choices(L.RELATION_TYPES)}; default all. Example: \"[\\\"derived_from\\\"]\".",
            L.RELATION_TYPES_JSON_MAX_BYTES),
    }),
    "search_messages": _input({
        "query": _text(f"What to look for, {L.QUERY_MIN_BYTES}-{L.QUERY_MAX_BYTES} UTF-8 bytes.",
                       L.QUERY_MAX_BYTES, L.QUERY_MIN_BYTES),
        "session_id": {**SESSION_ID, "description": "Search only this session (default: all). "
                       + SESSION_ID["description"]},
        "filters_json": _text(
            "JSON object as a string: {\"kinds\":[...],\"tiers\":[...],\"tags\":[...]}, all optional; "
            "e.g. \"{\\\"kinds\\\":[\\\"semantic\\\"],\\\"tags\\\":[\\\"project\\\"]}\".",
            L.FILTERS_JSON_MAX_BYTES, default="{}"),
        "min_importance": _int("Only messages with at least this importance.", L.IMPORTANCE_MIN,
                               L.IMPORTANCE_MAX, 0),
        "context_size": _int("Neighbouring messages (each side) to attach to every result as context_preview.",
                             0, L.CONTEXT_SIZE_MAX, 0),
        "limit": _int("Maximum results.", L.SEARCH_LIMIT_MIN, L.SEARCH_LIMIT_MAX, L.SEARCH_LIMIT_DEFAULT),
    }, ("query",)),
    "delete_message": _input({
        "message_id": MESSAGE_ID,
        "session_id": {**SESSION_ID, "description": "Guard: delete only if the message belongs to this "
                       "session. " + SESSION_ID["description"]},
        "request_id": REQUEST_ID,
    }, ("message_id",)),
    "rebuild_index": _input({}),
    "get_system_health": _input({}),
}

# The contract's error object. Every output schema accepts it too: some clients (the MCP Inspector
# among them) check structuredContent against outputSchema even on isError results.
ERROR_OUT = _obj({
    "status": {"type": "string", "const": "ERROR"},
    "error": _obj({
        "code": {"type": "string", "enum": list(ERROR_CODES)},
        "message": _STR,
        "retryable": _BOOL,
        "retry_after_ms": _INT,
        "outcome_unknown": _BOOL,
        "request_id": _STR,
    }, ("code", "message")),
}, ("status", "error"))


def _result(success: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "anyOf": [success, ERROR_OUT]}


OUTPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "write_message": _result(WRITE_OUT),
    "update_message": _result(UPDATE_OUT),
    "read_messages": _result(READ_OUT),
    "search_messages": _result(SEARCH_OUT),
    "delete_message": _result(DELETE_OUT),
    "rebuild_index": _result(REBUILD_OUT),
    "get_system_health": _result(HEALTH_OUT),
}

DESCRIPTIONS = {
    "write_message": WRITE_DESC,
    "update_message": UPDATE_DESC,
    "read_messages": READ_DESC,
    "search_messages": SEARCH_DESC,
    "delete_message": DELETE_DESC,
    "rebuild_index": REBUILD_DESC,
    "get_system_health": HEALTH_DESC,
}

TITLES = {
    "write_message": "Write message",
    "update_message": "Update message",
    "read_messages": "Read messages",
    "search_messages": "Search messages",
    "delete_message": "Delete message",
    "rebuild_index": "Rebuild index (compact)",
    "get_system_health": "System health",
}

# destructive, idempotent (whether a tool only reads is protocol.wire.READ_ONLY_TOOLS). write/update are
# idempotent only when the host passes a request_id (a call with the same arguments and none writes again),
# so they say false. Delete is idempotent (a second delete answers NOT_FOUND and changes nothing); so is a
# rebuild.
HINTS: dict[str, tuple[bool, bool]] = {
    "write_message": (False, False),
    "update_message": (True, False),
    "read_messages": (False, True),
    "search_messages": (False, True),
    "delete_message": (True, True),
    "rebuild_index": (True, True),
    "get_system_health": (False, True),
}

FAMILIES = {"memory": TOOLS, "history": HISTORY_TOOLS, "all": TOOLS + HISTORY_TOOLS}
FAMILY_DEFAULT = "all"
ALL_TOOLS = FAMILIES["all"]

INPUT_SCHEMAS.update(HT.INPUT_SCHEMAS)
OUTPUT_SCHEMAS.update(HT.OUTPUT_SCHEMAS)
DESCRIPTIONS.update(HT.DESCRIPTIONS)
TITLES.update(HT.TITLES)
HINTS.update(HT.HINTS)
# read_only, destructive, idempotent: what each tool's MCP annotations say
ANNOTATIONS: dict[str, tuple[bool, bool, bool]] = {
    name: (name in READ_ONLY_TOOLS, destructive, idempotent) for name, (destructive, idempotent) in HINTS.items()}

assert set(INPUT_SCHEMAS) == set(OUTPUT_SCHEMAS) == set(DESCRIPTIONS) == set(ANNOTATIONS) == set(TITLES) \
    == set(ALL_TOOLS)


# With both families listed, the memory tools that recall say when the history family serves better.
CROSS_FAMILY = {
    name: (" With the history tools also listed: to find what happened in past agent sessions (what was asked, "
           "run, printed, which files were touched) prefer search_sessions and open, which return short "
           "snippets and ids instead of whole messages; use this tool for memories written on purpose.")
    for name in ("search_messages", "read_messages")
}


def tool_list(family: str = FAMILY_DEFAULT) -> list[types.Tool]:
    out = []
    for name in FAMILIES[family]:
        ro, destructive, idem = ANNOTATIONS[name]
        description = DESCRIPTIONS[name] + (CROSS_FAMILY.get(name, "") if family == "all" else "")
        out.append(types.Tool(
            name=name,
            title=TITLES[name],
            description=description,
            input_schema=INPUT_SCHEMAS[name],
            output_schema=OUTPUT_SCHEMAS[name],
            annotations=types.ToolAnnotations(
                title=TITLES[name], read_only_hint=ro, destructive_hint=destructive, idempotent_hint=idem,
                open_world_hint=False),
        ))
    return out

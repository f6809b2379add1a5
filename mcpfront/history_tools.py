"""The five history tools as MCP sees them, and the envelope their results travel in.

Schemas, descriptions and annotation hints are built from ``protocol.history`` (vocabulary, limits); the
daemon's validation is what enforces them. A result is the interface's envelope — ``schema_version``
(``convmem.mcp.<tool>.v1``, errors ``convmem.mcp.error.v1``), ``tool``, ``request``, ``data`` or
``error``, ``warnings``, ``performance.elapsed_ms`` — as ``structuredContent``, and as text a short
summary that still carries every id and snippet, so a host that shows the model only text content
loses nothing an agent needs to take the next step.
"""
from __future__ import annotations

from typing import Any

from protocol import history as H

SCHEMA_PREFIX = "convmem.mcp."
ERROR_SCHEMA = SCHEMA_PREFIX + "error.v1"
ECHO_MAX_CHARS = 512

_STR = {"type": "string"}
_NSTR = {"type": ["string", "null"]}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}


# Optional fields are declared with their plain type (the daemon also takes null for "not given"): a
# union such as ["integer", "null"] makes some clients (the MCP Inspector CLI among them) send "5".
def _int(desc: str, lo: int, hi: int, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": desc, "minimum": lo, "maximum": hi}
    if default is not None:
        schema["default"] = default
    return schema


def _filter(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": H.FILTER_MAX_BYTES,
            "description": f"Optional exact, case-sensitive {what} filter (blank is refused). "}


HARNESS = _filter("harness")
HARNESS["description"] += f"Harnesses: {', '.join(H.HARNESSES)} ({H.HARNESS_CONVMEM} = messages written with " \
                          "write_message)."
SOURCE = _filter("ingest source")
SOURCE["description"] += f"Sources: {', '.join(H.SOURCES)}. Harness and source together: both must match."
DATETIME = {"type": "string", "format": "date-time", "maxLength": 64,
            "description": "RFC 3339 date-time with an explicit timezone, e.g. 2026-05-08T09:00:00-04:00."}

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "search_sessions": {"type": "object", "additionalProperties": False, "required": ["query"], "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": H.QUERY_MAX_CHARS,
                  "description": "Keywords to find (English, Japanese and other languages; stemmed, case- and "
                                 "width-insensitive). Must not be blank."},
        "within_id": {"type": "string", "maxLength": H.ID_MAX_CHARS,
                      "description": "Optional session:... or turn:... id (as returned) to search inside. Event ids "
                                     "are not scopes."},
        "event_types": {"type": "array", "minItems": 1, "uniqueItems": False,
                        "items": {"type": "string", "enum": list(H.EVENT_TYPES)},
                        "description": "Event types to search. Default: user_input and assistant_response (what was "
                                       "asked and concluded). Add tool_call / tool_response for raw tool evidence "
                                       "(commands, file contents, error output), reasoning, system."},
        "harness": HARNESS,
        "source": SOURCE,
        "n_hits": _int("Maximum hits.", H.N_HITS_MIN, H.N_HITS_MAX, H.N_HITS_DEFAULT),
    }},
    "open": {"type": "object", "additionalProperties": False, "properties": {
        "id": {"type": "string", "maxLength": H.ID_MAX_CHARS,
               "description": "A session:..., turn:... or event:... id exactly as a previous result returned it."},
        "limit": {"type": "integer", "minimum": H.OPEN_LIMIT_MIN, "maximum": H.OPEN_LIMIT_MAX,
                  "description": "With a session or turn id: expand one page of this many compact turns/events. "
                                 "Omit for the summary only."},
        "cursor": {"type": "string", "maxLength": 1024,
                   "description": "next_cursor of a previous expanded open, passed alone (it carries the id and "
                                  "page size)."},
    }},
    "list_sessions": {"type": "object", "additionalProperties": False, "required": ["start_datetime", "end_datetime"],
                      "properties": {
        "start_datetime": {**DATETIME, "description": "Window start (inclusive): sessions updated at or after it. "
                           + DATETIME["description"]},
        "end_datetime": {**DATETIME, "description": "Window end (exclusive): sessions started before it. "
                         + DATETIME["description"]},
        "limit": _int("Sessions per page.", H.LIST_LIMIT_MIN, H.LIST_LIMIT_MAX, H.LIST_LIMIT_DEFAULT),
        "cursor": {"type": "string", "maxLength": 1024,
                   "description": "next_cursor of the previous page, with the same filters and sort."},
        "mode": {"type": "string", "enum": list(H.MODES), "description": "Optional session mode."},
        "harness": HARNESS,
        "source": SOURCE,
        "sort": {"type": "string", "enum": list(H.SORTS), "default": "desc",
                           "description": "By last update, then id: desc (newest first, default) or asc."},
    }},
    "file_attention": {"type": "object", "additionalProperties": False, "required": ["path"], "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": H.PATH_MAX_BYTES,
                 "description": "The file: project-relative (resolved from the directory the MCP client was "
                                "launched in) or absolute. No file:// URIs, no trailing slash."},
        "scope": {"type": "string", "enum": list(H.SCOPES), "default": "project",
                            "description": "project (default): only the launch project (all its git worktrees); "
                                           "all: every project."},
        "granularity": {"type": "string", "enum": list(H.GRANULARITIES), "default": "sessions",
                                  "description": "sessions (one rollup per session, default) or events (every touch)."},
        "start_datetime": {**DATETIME, "description": "Optional: touches at or after this time. "
                                     + DATETIME["description"]},
        "end_datetime": {**DATETIME, "description": "Optional: touches before this time."},
        "tool": {**_filter("tool name"), "description": "Optional tool name filter (case-insensitive), e.g. Edit."},
        "harness": HARNESS,
        "source": SOURCE,
        "mutations_only": {"type": "boolean", "default": False,
                           "description": "Only edits, writes and deletes (no reads)."},
        "limit": _int("Maximum rows.", H.ATTENTION_LIMIT_MIN, H.ATTENTION_LIMIT_MAX, H.ATTENTION_LIMIT_DEFAULT),
    }},
    "get_ingest_status": {"type": "object", "additionalProperties": False, "properties": {}},
}

_FAMILY = ("History family (agent transcripts and every stored message as sessions → turns → events; "
           "read-only; ids are opaque typed strings session:/turn:/event: to pass back unchanged). ")
_ERRORS = (" Errors: schema_version convmem.mcp.error.v1 with error.code "
           f"({', '.join(H.ERROR_CODES)}); busy and read_model_refresh errors carry retryable and retry_after_ms.")
_FOOT = (" Results: {schema_version, tool, request, data, warnings, performance}; data.coverage and a "
         "coverage_partial / coverage_unknown warning say when ingestion is incomplete, so a missing hit is not "
         "proof that something never happened." + _ERRORS)

DESCRIPTIONS = {
    "search_sessions": _FAMILY + (
        "Find where in past agent sessions something was asked, concluded, run or printed: ranked event hits, each a "
        "pointer with a short snippet around the matched words (not the whole record) and open handles "
        "(event_id, turn_id, session_id). Defaults to user_input + assistant_response; pass event_types "
        "['tool_response'] to search command output and error messages, ['tool_call'] for commands and file edits. "
        "Narrow with within_id (a session or turn), harness, source. Then call open on a hit's event_id for the exact "
        "text, or its turn_id for the surrounding exchange. Prefer this over search_messages when you want to "
        "navigate history without pulling whole messages into context." + _FOOT),
    "open": _FAMILY + (
        "Expand an id narrow-to-wide. event:... → the full event (exact text, tool arguments and output, exit code) "
        "with its turn/session and previous/next ids. turn:... or session:... alone → a bounded summary (user input, "
        "final response, tools called, counts, first/last/adjacent ids) with an empty page; add limit for one page of "
        "compact event or turn summaries; follow next_cursor (passed alone) until null to see them all. There is no "
        "whole-transcript mode on purpose: open single events for detail. A long event's text can also be read in "
        "byte ranges with read_messages view=content and the event's message_id." + _FOOT),
    "list_sessions": _FAMILY + (
        "Browse sessions by time: every session active in [start_datetime, end_datetime) (updated at or after the "
        "start, started before the end), newest first by default, with title/display label, harness, source, mode, "
        "turn and event counts — metadata only, no transcript text. Use it for temporal clues ('yesterday', 'last "
        "night's session'); then open a session id. Page with next_cursor (same filters)." + _FOOT),
    "file_attention": _FAMILY + (
        "Every session that read or changed a file, across all git worktrees of the project (main checkout, sibling "
        "and agent worktrees), including edits that never landed: matched by the project-relative path tail. "
        "granularity sessions (default) rolls touches up per session; events lists each touch (tool, read/edit/"
        "write/delete, time, worktree root). roots shows which worktrees matched; ambiguous/unknown roots are "
        "flagged. Filters: time window, tool, harness, source, mutations_only. Open a returned event id to see "
        "exactly what was done." + _FOOT),
    "get_ingest_status": _FAMILY + (
        "Is agent-history ingestion healthy and complete? Takes {}. Returns conditions (health, coverage, freshness, "
        "readiness: each state true/false/unknown with a reason code), the latest ingester heartbeat (files and bytes "
        "discovered vs done, backlog), per-source progress (events ingested, secrets redacted, malformed records), "
        "and a rate/ETA once enough progress has been seen. Never returns file paths or raw errors. Results: "
        "{schema_version, tool, request, data, warnings, performance}." + _ERRORS),
}

TITLES = {
    "search_sessions": "Search agent sessions",
    "open": "Open a session, turn or event",
    "list_sessions": "List sessions by time",
    "file_attention": "Sessions that touched a file",
    "get_ingest_status": "Ingestion status",
}

# --- output schemas ------------------------------------------------------------------------------

_ID_HANDLES = {"type": "object", "properties": {"event_id": _NSTR, "turn_id": _NSTR, "session_id": _NSTR}}


def _data(required: tuple[str, ...], properties: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": properties or {}}


_COVERAGE = {"type": "object", "required": ["state", "reason"],
             "properties": {"state": {"type": "string", "enum": ["complete", "partial", "unknown"]},
                            "reason": _STR, "observed_at_unix_ms": _INT}}
_HIT = {"type": "object", "required": ["rank", "score", "id", "event", "turn", "session", "snippet", "open"],
        "properties": {"rank": _INT, "score": _NUM, "id": _STR, "event": _OBJ, "turn": _OBJ, "session": _OBJ,
                       "snippet": {"type": "object", "required": ["text", "truncated"],
                                   "properties": {"text": _STR, "truncated": _BOOL}},
                       "open": _ID_HANDLES}}
DATA_SCHEMAS = {
    "search_sessions": _data(("result_count", "limit", "truncated", "results", "coverage"), {
        "result_count": _INT, "limit": _INT, "truncated": _BOOL, "results": {"type": "array", "items": _HIT},
        "coverage": _COVERAGE}),
    "open": _data(("kind", "coverage"), {"kind": {"type": "string", "enum": list(H.ID_KINDS)},
                                         "next_cursor": _NSTR, "coverage": _COVERAGE}),
    "list_sessions": _data(("result_count", "limit", "truncated", "sessions", "next_cursor", "coverage"), {
        "result_count": _INT, "limit": _INT, "truncated": _BOOL, "sessions": {"type": "array", "items": _OBJ},
        "next_cursor": _NSTR, "coverage": _COVERAGE}),
    "file_attention": _data(("path", "tail", "scope", "granularity", "summary", "roots", "result_count", "limit",
                             "truncated", "coverage"), {"summary": _OBJ, "roots": {"type": "array", "items": _OBJ},
                                                        "coverage": _COVERAGE}),
    "get_ingest_status": _data(("observed_at_unix_ms", "conditions", "sources"), {
        "conditions": {"type": "array", "items": {"type": "object", "required": ["condition_type", "state", "reason"],
                                                  "properties": {
                                                      "condition_type": {"type": "string", "enum": [
                                                          "health", "coverage", "freshness", "readiness"]},
                                                      "state": {"type": "string", "enum": ["true", "false", "unknown"]},
                                                      "reason": _STR}}},
        "sources": {"type": "array", "items": _OBJ}}),
}
_PERFORMANCE = {"type": "object", "required": ["elapsed_ms"], "properties": {"elapsed_ms": _NUM}}
_WARNINGS = {"type": "array", "items": _STR}
ERROR_OUT = {"type": "object", "required": ["schema_version", "tool", "request", "error", "warnings", "performance"],
             "properties": {
                 "schema_version": {"type": "string", "const": ERROR_SCHEMA},
                 "tool": _STR, "request": _OBJ,
                 "error": {"type": "object", "required": ["code", "message", "details"], "properties": {
                     "code": {"type": "string", "enum": list(H.ERROR_CODES)}, "message": _STR, "details": _OBJ,
                     "retryable": _BOOL, "retry_after_ms": _INT}},
                 "warnings": _WARNINGS, "performance": _PERFORMANCE}}


def schema_version(tool: str) -> str:
    return f"{SCHEMA_PREFIX}{tool}.v1"


def output_schema(tool: str) -> dict[str, Any]:
    success = {"type": "object", "required": ["schema_version", "tool", "request", "data", "warnings", "performance"],
               "properties": {"schema_version": {"type": "string", "const": schema_version(tool)},
                              "tool": {"type": "string", "const": tool}, "request": _OBJ,
                              "data": DATA_SCHEMAS[tool], "warnings": _WARNINGS, "performance": _PERFORMANCE}}
    return {"type": "object", "anyOf": [success, ERROR_OUT]}


OUTPUT_SCHEMAS = {tool: output_schema(tool) for tool in H.HISTORY_TOOLS}
# destructive, idempotent: all five only read (protocol.wire.READ_ONLY_TOOLS), so neither destroys nor
# changes anything when repeated
HINTS = {tool: (False, True) for tool in H.HISTORY_TOOLS}

assert set(INPUT_SCHEMAS) == set(DESCRIPTIONS) == set(TITLES) == set(OUTPUT_SCHEMAS) == set(H.HISTORY_TOOLS)


# --- the envelope --------------------------------------------------------------------------------

def echo(tool: str, args: Any) -> dict[str, Any]:
    """The caller's arguments as an error envelope's ``request``: only the tool's own parameter names,
    each value bounded (long strings cut, long lists shortened, deep structures summarised) so an error
    is never bigger than a few kilobytes; an unknown name is not quoted back."""
    if not isinstance(args, dict):
        return {}
    known = INPUT_SCHEMAS[tool]["properties"]
    return {key: _bounded(value, 3) for key, value in args.items() if key in known}


ECHO_ITEMS_MAX = 16


def _bounded(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return value[:ECHO_MAX_CHARS] + "…" if len(value) > ECHO_MAX_CHARS else value
    if isinstance(value, list):
        if depth <= 0:
            return f"[{len(value)} items]"
        out = [_bounded(v, depth - 1) for v in value[:ECHO_ITEMS_MAX]]
        return out + [f"… {len(value) - ECHO_ITEMS_MAX} more"] if len(value) > ECHO_ITEMS_MAX else out
    if isinstance(value, dict):
        if depth <= 0 or len(value) > ECHO_ITEMS_MAX:
            return f"{{{len(value)} fields}}"
        return {str(k)[:64]: _bounded(v, depth - 1) for k, v in value.items()}
    return value


def envelope(tool: str, args: Any, reply: dict[str, Any], elapsed_ms: float) -> dict[str, Any]:
    performance = {"elapsed_ms": round(elapsed_ms, 3)}
    if reply.get("status") == "OK" and isinstance(reply.get("data"), dict):
        return {"schema_version": schema_version(tool), "tool": tool, "request": reply.get("request") or {},
                "data": reply["data"], "warnings": list(reply.get("warnings") or []), "performance": performance}
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    if err.get("code") not in H.ERROR_CODES:  # a first-family error (the front-end's own, or the wire's)
        err = H.from_memory_error(reply)["error"]
    error = {"code": err["code"], "message": str(err.get("message") or "request failed"),
             "details": err.get("details") if isinstance(err.get("details"), dict) else {}}
    if isinstance(err.get("retry_after_ms"), int):
        error["retryable"] = True
        error["retry_after_ms"] = err["retry_after_ms"]
    return {"schema_version": ERROR_SCHEMA, "tool": tool, "request": echo(tool, args), "error": error,
            "warnings": [], "performance": performance}


def is_error(env: dict[str, Any]) -> bool:
    return "error" in env


# --- text for hosts that show the model only the text content -------------------------------------

def render_text(env: dict[str, Any]) -> str:
    tool = env["tool"]
    if is_error(env):
        err = env["error"]
        retry = f" Retry after {err['retry_after_ms']} ms." if err.get("retryable") else ""
        return f"{tool} error ({err['code']}): {err['message']}.{retry}".replace("..", ".")
    lines = _RENDER[tool](env["data"])
    lines.extend(f"Warning: {w}" for w in env["warnings"])
    return "\n".join(lines)


def _search_text(d: dict[str, Any]) -> list[str]:
    more = " (more may exist: narrow the query or raise n_hits)" if d["truncated"] else ""
    lines = [f"{d['result_count']} hit(s){more}; each: rank, type, time, harness, session title, then its "
             "event, turn and session ids to pass to open, then the snippet."]
    for r in d["results"]:
        ev, s = r["event"], r["session"]
        tool = f" {ev['tool_name']}" if ev.get("tool_name") else ""
        o = r["open"]
        lines.append(f"{r['rank']}. [{ev['type']}{tool}] {ev['timestamp'][:19]}Z {s['harness']} \"{s.get('title') or ''}\" "
                     f"{o['event_id']} {o['turn_id']} {o['session_id']}")
        lines.append(f"   {r['snippet']['text']}")
    return lines


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _ref(label: str, ref: dict[str, Any] | None) -> str:
    if not ref:
        return f"{label}: none"
    return f"{label} ({ref['event_id']}): {ref['text']}"


def _open_text(d: dict[str, Any]) -> list[str]:
    kind = d["kind"]
    if kind == "event":
        e, c, t = d["event"], d["content"], d["traversal"]
        head = f"event {e['id']} [{e['type']}{' ' + e['tool_name'] if e.get('tool_name') else ''}] {e['timestamp']} " \
               f"turn {d['turn']['ordinal']} of session \"{d['session'].get('display_label') or ''}\""
        extra = []
        if c.get("format") == "tool_response":
            extra.append(f"is_error={c.get('is_error')} exit_code={c.get('exit_code')}")
        return [head, *extra, "---", c["text"], "---",
                f"turn_id={t['turn_id']} session_id={t['session_id']} previous_event_id={t['previous_event_id']} "
                f"next_event_id={t['next_event_id']} previous_turn_id={t['previous_turn_id']} "
                f"next_turn_id={t['next_turn_id']}"]
    if kind == "turn":
        tr, sm, t = d["turn"], d["summary"], d["traversal"]
        lines = [f"turn {tr['id']} #{tr['ordinal']} of session {tr['session_id']}: {tr['event_count']} events, "
                 f"{'completed' if tr['completed'] else 'not completed'}, {tr['started_at']} .. {tr['updated_at']}",
                 _ref("user input", sm["user_input"]), _ref("final response", sm["final_response"]),
                 f"tools called: {', '.join(sm['tools_called']) or 'none'}; event types: {', '.join(sm['event_types'])}"]
        for e in d["events"]:
            lines.append(f"  {e['ordinal']}. [{e['type']}{' ' + e['tool_name'] if e.get('tool_name') else ''}] "
                         f"{e['summary']} ({e['id']})")
        lines.append(f"previous_turn_id={t['previous_turn_id']} next_turn_id={t['next_turn_id']} "
                     f"first_event_id={t['first_event_id']} last_event_id={t['last_event_id']}")
    else:
        s, t = d["session"], d["traversal"]
        lines = [f"session {s['id']} \"{s.get('display_label') or ''}\" ({s['harness']}/{s['source']}, {s['mode']}): "
                 f"{_n(s['turn_count'], 'turn')}, {_n(s['event_count'], 'event')}, {s['started_at']} .. {s['updated_at']}"]
        for tu in d["turns"]:
            ui = tu["user_input"]["text"] if tu["user_input"] else "(no user input)"
            lines.append(f"  turn {tu['ordinal']} ({tu['id']}): {ui}")
            if tu["final_response"]:
                lines.append(f"     → {tu['final_response']['text']}")
        lines.append(f"first_turn_id={t['first_turn_id']} last_turn_id={t['last_turn_id']} "
                     f"previous_session_id={t['previous_session_id']} next_session_id={t['next_session_id']}")
    if d.get("next_cursor"):
        lines.append(f"next_cursor={d['next_cursor']}")
    elif kind != "event" and not d.get(("events" if kind == "turn" else "turns")):
        lines.append("Summary only: call open with this id and a limit to expand.")
    return lines


def _list_text(d: dict[str, Any]) -> list[str]:
    lines = [f"{d['result_count']} session(s)."]
    for item in d["sessions"]:
        s = item["session"]
        lines.append(f"{item['rank']}. \"{s['display_label']}\" {s['harness']}/{s['source']} {s['mode']} "
                     f"{s['started_at']} .. {s['updated_at']}, {_n(s['turn_count'], 'turn')} (session_id={item['id']})")
    if d["next_cursor"]:
        lines.append(f"next_cursor={d['next_cursor']}")
    return lines


def _attention_text(d: dict[str, Any]) -> list[str]:
    sm = d["summary"]
    if not sm["total_touches"]:
        return [f"{d['tail']}: no recorded session touched this file"
                f"{' in this project (scope all searches every project)' if d['scope'] == 'project' else ''}."]
    lines = [f"{d['tail']}: {sm['total_touches']} touch(es) in {sm['distinct_sessions']} session(s), "
             f"{sm['distinct_known_roots']} known root(s), {sm['unknown_root_touches']} unknown-root touch(es)"
             f"{', ambiguous' if sm['ambiguous'] else ''}; last {sm['last_touch']}."]
    for r in d["roots"]:
        lines.append(f"  root {r['root']}: {r['touch_count']} touches, {r['session_count']} sessions")
    for row in d.get("sessions", []):
        s, o = row["session"], row["open"]
        lines.append(f"{row['rank']}. \"{s['display_label']}\" {', '.join(s['tools'])} ({', '.join(s['ops'])}) "
                     f"x{s['touch_count']}, last {s['last_touch']} (session_id={o['session_id']} "
                     f"event_id={o['event_id']})")
    for row in d.get("events", []):
        e = row["event"]
        lines.append(f"{row['rank']}. {e['timestamp']} {e['tool_name']} {e['op']} {e['path']} "
                     f"(event_id={e['id']} turn_id={row['open']['turn_id']})")
    return lines


def _status_text(d: dict[str, Any]) -> list[str]:
    conds = "; ".join(f"{c['condition_type']}={c['state']} ({c['reason']})" for c in d["conditions"])
    lines = [f"Ingestion: {conds}."]
    cur = d.get("current")
    if cur:
        p = cur["progress"]
        lines.append(f"Latest heartbeat: {p['files_completed']}/{p['files_total']} files, "
                     f"{p['bytes_completed']}/{p['bytes_total']} bytes, backlog {p['backlog_bytes']} bytes.")
    for s in d["sources"]:
        lines.append(f"  {s['source']}: {s['events_ingested']} events from {s['files_checkpointed']} files, "
                     f"{s['secrets_redacted']} secrets redacted, {s['malformed_records']} malformed records")
    if d.get("eta"):
        lines.append(f"ETA: {d['eta']['low_seconds']}-{d['eta']['high_seconds']} s.")
    return lines


_RENDER = {"search_sessions": _search_text, "open": _open_text, "list_sessions": _list_text,
           "file_attention": _attention_text, "get_ingest_status": _status_text}

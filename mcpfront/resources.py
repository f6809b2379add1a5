"""Past conversations as MCP resources, so a user can attach one in a host (an @-mention, an attach menu).

Why resources as well as tools: a tool is something the model decides to call; a resource is something
the *user* picks and hands to the model. Hosts list a server's resources and templates in their attach
UI and complete template arguments while the user types, so:

- ``resources/list``: the most recent sessions (at most ``LIST_MAX``), one resource each;
- ``resources/templates/list``: ``convmem://sessions/{session_id}`` for any session;
- ``resources/read``: the session's messages as Markdown, oldest first, read from the daemon through the
  same ``Backend`` as the tools (``read_messages`` view=history, page by page), cut at the contract's
  response budget with a note saying where it stopped and how to read on;
- ``completion/complete`` for ``session_id``: a prefix match over the recent sessions (bounded).

These are memory-family sessions (the ``session_id`` a host wrote with, or an ingester derived from a
transcript): plain strings a user can recognise and type, unlike the history family's opaque handles.
Every failure is a ``ResourceError`` whose message names the field and the constraint and never echoes
what the client sent; the server turns it into a JSON-RPC error.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any, Awaitable, Callable
from urllib.parse import quote, unquote

import mcp_types as types

from protocol import errors as E
from protocol import limits as L

SCHEME_PREFIX = "convmem://sessions/"
TEMPLATE = SCHEME_PREFIX + "{session_id}"
MIME = "text/markdown"
LIST_MAX = 50                 # sessions listed by resources/list
COMPLETION_SCAN = L.READ_LIMIT_MAX  # recent sessions a completion looks through
COMPLETION_MAX = 100          # MCP: at most 100 values per completion
PAGE = 200                    # messages per daemon read while rendering a session
TEXT_BUDGET_BYTES = L.RESPONSE_BUDGET_BYTES  # a resource's text, like a tool's result
NOTE_RESERVE_BYTES = 4096     # room kept for the closing note when the text is cut
SUMMARY_CHARS = 120

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class ResourceError(Exception):
    """A resource request that cannot be served: ``code`` is the JSON-RPC error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def uri_for(session_id: str) -> str:
    """RFC 6570 simple expansion: everything but unreserved characters is percent-encoded."""
    return SCHEME_PREFIX + quote(session_id, safe="")


def session_id_from_uri(uri: str) -> str:
    if not uri.startswith(SCHEME_PREFIX):
        raise ResourceError(types.INVALID_PARAMS,
                            "Unknown resource URI; resources/templates/list gives the template " + TEMPLATE)
    raw = uri[len(SCHEME_PREFIX):]
    if "/" in raw or "?" in raw or "#" in raw:
        raise ResourceError(types.INVALID_PARAMS, "session_id in the URI must be one percent-encoded path segment")
    try:
        session_id = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise ResourceError(types.INVALID_PARAMS, "session_id in the URI must be percent-encoded UTF-8") from None
    check_session_id(session_id, "session_id in the URI")
    return session_id


def check_session_id(value: str, field: str) -> None:
    n = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= n <= L.SESSION_ID_MAX_BYTES:
        raise ResourceError(types.INVALID_PARAMS, f"{field} must be 1-{L.SESSION_ID_MAX_BYTES} UTF-8 bytes")


def daemon_failure(reply: dict[str, Any]) -> ResourceError:
    """A contract error from the daemon as a JSON-RPC error. The daemon's messages name fields and
    limits, never the caller's input, so they can be passed on."""
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    code, message = err.get("code", E.INTERNAL_ERROR), err.get("message", "the storage daemon failed")
    hint = " (retry shortly)" if code in E.RETRYABLE else ""
    return ResourceError(types.INTERNAL_ERROR, f"storage daemon: {code}: {message}{hint}")


async def recent_sessions(call: Call, limit: int) -> list[dict[str, Any]]:
    """The newest sessions first (by start time), at most ``limit``."""
    reply = await call("read_messages", {"view": "sessions", "order": "desc", "limit": limit})
    if reply.get("status") == "ERROR" or not isinstance(reply.get("sessions"), list):
        raise daemon_failure(reply)
    return [s for s in reply["sessions"] if isinstance(s, dict) and isinstance(s.get("session_id"), str)]


def _when(ms: Any) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "?"
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return "?"


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def list_resources(call: Call) -> types.ListResourcesResult:
    out = []
    for s in await recent_sessions(call, LIST_MAX):
        sid = s["session_id"]
        count = s.get("message_count")
        summary = s.get("representative_summary")
        desc = f"{_count(count, 'message')}, {_when(s.get('started_at'))} to {_when(s.get('last_message_at'))}"
        if isinstance(summary, str) and summary.strip():
            desc += ": " + _one_line(summary, SUMMARY_CHARS)
        out.append(types.Resource(uri=uri_for(sid), name=sid, title=f"convmem session {_one_line(sid, 80)}",
                                  description=desc, mime_type=MIME))
    return types.ListResourcesResult(resources=out)


def list_templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
        uri_template=TEMPLATE, name="session", title="convmem session",
        description=("A stored conversation (memory session), oldest message first, as Markdown; bounded to "
                     f"{TEXT_BUDGET_BYTES // L.MiB} MiB with a note on how to read the rest. "
                     "session_id completes from the recent sessions."),
        mime_type=MIME)])


def _cut_utf8(text: str, max_bytes: int) -> tuple[str, int]:
    """The longest prefix of ``text`` within ``max_bytes`` UTF-8 bytes, and its byte length."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text, len(raw)
    cut = raw[:max(0, max_bytes)].decode("utf-8", "ignore")
    return cut, len(cut.encode("utf-8", "surrogatepass"))


async def read_session(call: Call, uri: str, budget: int = TEXT_BUDGET_BYTES) -> types.ReadResourceResult:
    """The session as Markdown. Pages through the history; stops at ``budget`` bytes and says how to
    continue (the page cursor for read_messages, or a byte offset into a message cut midway)."""
    session_id = session_id_from_uri(uri)
    parts: list[str] = [f"# convmem session `{session_id}`\n\n"]
    used = len(parts[0].encode("utf-8"))
    limit = budget - NOTE_RESERVE_BYTES
    cursor: str | None = None
    shown = 0
    while True:
        args: dict[str, Any] = {"view": "history", "session_id": session_id, "limit": PAGE}
        if cursor is not None:
            args["cursor"] = cursor
        reply = await call("read_messages", args)
        if reply.get("status") == "ERROR" or not isinstance(reply.get("history"), list):
            if reply.get("status") == "ERROR" and reply.get("error", {}).get("code") == E.NOT_FOUND:
                raise ResourceError(types.INVALID_PARAMS, "No session with this session_id")
            raise daemon_failure(reply)
        page = reply["history"]
        page_cursor = cursor
        for i, m in enumerate(page):
            head = (f"## {m.get('role', '?')} · {_when(m.get('timestamp'))} · `{m.get('message_id', '?')}`\n\n")
            body = m.get("content") if isinstance(m.get("content"), str) else ""
            block = head + body + "\n\n"
            size = len(block.encode("utf-8", "surrogatepass"))
            if used + size > limit:
                parts.append(_cut_note(session_id, m, head, body, limit - used, budget, shown, i, page_cursor))
                return _result(uri, parts)
            parts.append(block)
            used += size
            shown += 1
        cursor = reply.get("nextCursor") if isinstance(reply.get("nextCursor"), str) else None
        if cursor is None or not page:
            break
    if shown == 0:
        raise ResourceError(types.INVALID_PARAMS, "No session with this session_id")
    parts.append(f"_{_count(shown, 'message')}, complete._\n")
    return _result(uri, parts)


def _cut_note(session_id: str, m: dict[str, Any], head: str, body: str, room: int, budget: int, shown: int,
              index: int, page_cursor: str | None) -> str:
    """What fits of the message that overflows, then where the text stopped and how to read on: the rest
    of a message cut midway by byte offset, the rest of the session from the page it stopped in."""
    out = ""
    room -= len(head.encode("utf-8", "surrogatepass")) + 2
    mid = m.get("message_id")
    if room > 0 and body:
        cut, cut_bytes = _cut_utf8(body, room)
        out = head + cut + "\n\n"
        shown += 1
        index += 1
        cont = (f" Message `{mid}` is cut at byte {cut_bytes}: read_messages view=content message_id={mid} "
                f"content_offset={cut_bytes} reads the rest of it.")
    else:
        cont = ""
    where = f" cursor={page_cursor}" if page_cursor else ""
    shown_text = _count(shown, "message")
    return (out + f"> **Cut here**: this resource is bounded to {budget} bytes; {shown_text} shown.{cont} "
            f"The rest of the session: read_messages view=history session_id={json.dumps(session_id)} "
            f"limit={PAGE}{where}" + (f", skipping the first {index} messages of that page" if index else "")
            + ".\n")


def _result(uri: str, parts: list[str]) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=MIME,
                                                                         text="".join(parts))])


async def complete_session_id(call: Call, prefix: str) -> types.Completion:
    """Session ids among the recent ones that start with ``prefix`` (case-sensitive, as ids are)."""
    if len(prefix.encode("utf-8", "surrogatepass")) > L.SESSION_ID_MAX_BYTES:
        return types.Completion(values=[], total=0, has_more=False)
    matches = [s["session_id"] for s in await recent_sessions(call, COMPLETION_SCAN)
               if s["session_id"].startswith(prefix)]
    return types.Completion(values=matches[:COMPLETION_MAX], total=len(matches),
                            has_more=len(matches) > COMPLETION_MAX)

"""Gemini CLI chat recordings: one JSON document per session, rewritten in place as it grows.

Where: ``~/.gemini/tmp/<project>/chats/session-*.json`` (``<project>`` is the sha256 of the project
root in most versions, a short project name in newer ones; ``$GEMINI_CLI_HOME/.gemini`` too when that
variable is set).

The document: ``sessionId``, ``projectHash``, ``startTime``, ``lastUpdated``, ``summary`` (newer
versions) and ``messages[]``, each with ``id``, ``timestamp``, ``type`` (``user`` | ``gemini`` |
``info`` | ``error`` | ``warning``), ``content`` (a string, or a list of parts with ``text``), and
for ``gemini`` messages ``model``, ``thoughts[]`` (``subject``, ``description``, ``timestamp``) and
``toolCalls[]`` (``id``, ``name``, ``args``, ``result`` — a list of ``functionResponse`` parts, or a
string —, ``status`` success | error | cancelled, ``timestamp``, ``resultDisplay``).

``parse_document`` returns every message's events every time; the caller skips ids it already
stored, so keys are built from the message ids: ``<id>`` for the text, ``<id>#thought<i>``,
``<id>#call<i>`` and ``<id>#result<i>``; a message without an id uses ``@<index>`` (a later
duplicate id gets ``@<index>`` appended). Events per message, in this order: thoughts (reasoning:
subject and description on two lines), text (user_input / assistant_response with the model; a
list of parts is concatenated without separators, as Gemini CLI streams them),
then each tool call and its result (tool_call; tool_response with ``is_error`` for status
``error``; the text is the functionResponse's ``output`` / ``error``, or its response as compact
JSON, falling back to ``resultDisplay``, then ``[cancelled]``; ``exit_code`` from the
``Exit Code: N`` line ``run_shell_command`` writes near the end of its output). ``info`` /
``error`` / ``warning`` messages are system notes (error and warning prefixed ``[error]`` /
``[warning]``). Unknown message types yield nothing.

Times: a message's ``timestamp``, else the previous message's (else ``startTime``); a thought or
call without its own time takes its message's. A message with no usable time at all, and an entry
of ``messages`` that is not an object, are skipped (one bad entry must not hide a whole session);
a document that is not an object with a ``messages`` list is ``Malformed``. The file names no
working directory: ``info.cwd`` stays None.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Any, Mapping

from protocol import history as H

from .events import Event, Malformed, SessionInfo
from .tooltouch import args_text, blocks_text, compact_json, decode_args, int_or_none, time_ms, touches

HARNESS = H.HARNESS_GEMINI
SOURCES = (H.SOURCE_GEMINI,)

_NOTES = {"info": "", "error": "[error] ", "warning": "[warning] "}
_SHELL_EXIT = re.compile(r"^Exit Code: (-?\d{1,10})\s*$")


# --- files ---------------------------------------------------------------------------------------

def new_info(path: str) -> SessionInfo:
    """The file name only abbreviates the session id; the document's ``sessionId`` replaces it."""
    stem = os.path.basename(path)
    if stem.endswith(".json"):
        stem = stem[:-len(".json")]
    return SessionInfo(session_id=stem, harness=HARNESS, source=H.SOURCE_GEMINI)


def discover(env: Mapping[str, str], home: str) -> list[str]:
    roots = [os.path.join(env["GEMINI_CLI_HOME"], ".gemini")] if env.get("GEMINI_CLI_HOME") else []
    roots.append(os.path.join(home, ".gemini"))
    found: set[str] = set()
    for root in roots:
        pattern = os.path.join(glob.escape(root), "tmp", "*", "chats", "session-*.json")
        found.update(p for p in glob.glob(pattern) if os.path.isfile(p))
    return sorted(found)


# --- the document --------------------------------------------------------------------------------

def parse_document(obj: Any, info: SessionInfo) -> list[Event]:
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise Malformed("not a Gemini CLI session document (an object with a messages list)")
    if _text(obj.get("sessionId")):
        info.session_id = obj["sessionId"]
    if _text(obj.get("summary")):
        info.summary = obj["summary"]
    prev_ts = time_ms(obj.get("startTime"))
    events: list[Event] = []
    seen: set[str] = set()
    for index, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict):
            continue
        ts = time_ms(msg.get("timestamp"))
        ts = prev_ts if ts is None else ts
        if ts is None:
            continue
        prev_ts = ts
        base = msg["id"] if _text(msg.get("id")) else f"@{index}"
        base = base if base not in seen else f"{base}@{index}"
        seen.add(base)
        events.extend(_message(msg, base, ts, info))
    return events


def _message(msg: dict[str, Any], key: str, ts: int, info: SessionInfo) -> list[Event]:
    mtype = msg.get("type")
    text = _content_text(msg.get("content"))
    if mtype == "user":
        if not text.strip():
            return []
        if info.first_prompt is None:
            info.first_prompt = text
        return [Event(key, ts, H.USER_INPUT, text)]
    if mtype in _NOTES:
        return [Event(key, ts, H.SYSTEM, _NOTES[mtype] + text)] if text.strip() else []
    if mtype != "gemini":
        return []
    model = msg["model"] if _text(msg.get("model")) else None
    if model:
        info.model = model
    events = _thoughts(msg.get("thoughts"), key, ts, model)
    if text.strip():
        events.append(Event(key, ts, H.ASSISTANT_RESPONSE, text, model=model))
    calls = msg.get("toolCalls") if isinstance(msg.get("toolCalls"), list) else []
    for i, call in enumerate(calls):
        if isinstance(call, dict) and _text(call.get("name")):
            events.extend(_tool(call, f"{key}#call{i}", f"{key}#result{i}", ts, info, model))
    return events


def _thoughts(thoughts: Any, key: str, ts: int, model: str | None) -> list[Event]:
    events = []
    for i, t in enumerate(thoughts if isinstance(thoughts, list) else []):
        if not isinstance(t, dict):
            continue
        text = "\n".join(t[k] for k in ("subject", "description") if _text(t.get(k)) and t[k].strip())
        if text:
            own = time_ms(t.get("timestamp"))
            events.append(Event(f"{key}#thought{i}", ts if own is None else own, H.REASONING, text, model=model))
    return events


def _tool(call: dict[str, Any], call_key: str, result_key: str, ts: int, info: SessionInfo,
          model: str | None) -> list[Event]:
    name = call["name"]
    own = time_ms(call.get("timestamp"))
    ts = ts if own is None else own
    # the call's result is in the same record: nothing waits in info.calls for a later one
    call_id = call["id"] if _text(call.get("id")) else None
    args = decode_args(call.get("args", {}))
    text = _result_text(call)
    return [Event(call_key, ts, H.TOOL_CALL, args_text(args), tool_name=name, call_id=call_id, model=model,
                  files=touches(name, args)),
            Event(result_key, ts, H.TOOL_RESPONSE, text, tool_name=name, call_id=call_id,
                  is_error=call.get("status") == "error",
                  exit_code=_shell_exit_code(text) if name == "run_shell_command" else None)]


# --- texts ---------------------------------------------------------------------------------------

def _content_text(content: Any, sep: str = "") -> str:
    """A message's parts concatenated as Gemini CLI does (a tool result's parts: one per line)."""
    if isinstance(content, dict):
        content = [content]
    return blocks_text(content, _part_text, sep)


def _part_text(part: dict[str, Any]) -> str | None:
    if isinstance(part.get("text"), str):
        return part["text"] if not part.get("thought") else None  # thought parts are in thoughts[]
    if isinstance(part.get("functionResponse"), dict):
        return _response_text(part["functionResponse"].get("response"))
    if isinstance(part.get("inlineData"), dict) or isinstance(part.get("fileData"), dict):
        data = part.get("inlineData") or part.get("fileData")
        mime = data.get("mimeType") if isinstance(data.get("mimeType"), str) else ""
        return "[image]" if mime.startswith("image/") else f"[{mime or 'file'}]"
    return None


def _response_text(response: Any) -> str:
    if isinstance(response, dict):
        for field in ("output", "error"):
            if isinstance(response.get(field), str):
                return response[field]
    return response if isinstance(response, str) else compact_json(response)


def _result_text(call: dict[str, Any]) -> str:
    result = call.get("result")
    text = _content_text(result, "\n") if result not in (None, [], "") else ""
    if not text and _text(call.get("resultDisplay")):
        text = call["resultDisplay"]
    if not text and call.get("status") == "cancelled":
        text = "[cancelled]"
    return text


def _shell_exit_code(text: str) -> int | None:
    for line in reversed(text.rsplit("\n", 8)[-8:]):
        m = _SHELL_EXIT.match(line)
        if m:
            return int_or_none(int(m.group(1)))
    return None


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)

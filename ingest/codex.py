"""Codex CLI rollouts: one JSON Lines file per session, appended to as the session runs.

Where: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl`` (``CODEX_HOME`` defaults to
``~/.codex``) and ``$CODEX_HOME/archived_sessions/rollout-*.jsonl`` (archived sessions keep their id,
and keys derive from the session id and line offsets, so a moved file stores nothing twice).

Every line is ``{timestamp, type, payload}``:
- ``session_meta``: ``id`` (the session id), ``cwd``, ``git.branch``, ``originator``,
  ``model_provider``. The id is first guessed from the file name's trailing uuid; a resumed or
  forked rollout may repeat *another* session's meta further down, so a meta is only taken when its
  id is the file's (or when the file name carried no uuid). ``info.mode`` is never set: an
  originator (``codex_exec``, an IDE, an MCP client) says who drove the session, not which mode it
  was in.
- ``turn_context``: ``model`` and ``cwd`` into ``info`` (the model then labels assistant events).
- ``response_item``: ``message`` (user ``input_text`` -> user_input, assistant ``output_text`` ->
  assistant_response; ``developer``/``system`` messages and injected context — parts starting with
  ``<environment_context>``, ``<user_instructions>``, ``<permissions``, ``# AGENTS.md`` — are
  skipped), ``function_call`` (``arguments`` is a JSON string, decoded), ``custom_tool_call``
  (``input`` is raw text such as an apply_patch patch, kept as is unless it is JSON),
  ``local_shell_call`` (tool ``local_shell``, its ``action`` as arguments), ``web_search_call`` (tool
  ``web_search_call``, its ``action`` as arguments), ``function_call_output`` /
  ``custom_tool_call_output`` (the output text; the ``{"output", "metadata": {"exit_code"}}``
  wrapper is unwrapped into text and exit code, a leading ``Exit code: N`` header gives the exit
  code; ``is_error`` is exit code != 0, or the payload's ``success`` flag, else unknown (None)),
  ``reasoning`` (summary texts, else raw ``reasoning_text`` content, else
  ``[encrypted reasoning omitted]`` when only ``encrypted_content`` is there).
- ``event_msg``: mostly duplicates of response items (``user_message``, ``agent_message``,
  ``agent_reasoning``) or accounting (``token_count``): no events. ``user_message`` gives
  ``info.first_prompt`` when not yet set (its text is the user's alone: no image parts, no injected
  context; every enveloped rollout writes it). ``turn_aborted`` is a system note
  ``[turn aborted: <reason>]``.
- ``compacted``: a system event ``[conversation compacted]`` plus the summary ``message``; the
  replacement history it carries is a copy of earlier items and is not re-emitted.

Keys: ``<offset>`` of the line (``<offset>#<n>`` if a line ever yields several events). A record
that yields events must carry a usable ``timestamp`` (else ``Malformed``). Lines of the 2025
pre-envelope format (no ``payload``) and unknown types yield nothing.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Callable, Mapping

from protocol import history as H

from .events import Event, Malformed, SessionInfo
from .tooltouch import args_text, blocks_text, decode_args, exit_code_in, int_or_none, time_ms, touches

HARNESS = H.HARNESS_CODEX
SOURCES = (H.SOURCE_CODEX,)

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID_TAIL = re.compile(f"({_UUID})$")
_INJECTED = ("<environment_context>", "<user_instructions>", "<permissions", "# AGENTS.md")
_ENVELOPES = ("session_meta", "turn_context", "response_item", "event_msg", "compacted")


# --- files ---------------------------------------------------------------------------------------

def new_info(path: str) -> SessionInfo:
    stem = os.path.basename(path)
    if stem.endswith(".jsonl"):
        stem = stem[:-len(".jsonl")]
    m = _UUID_TAIL.search(stem)
    return SessionInfo(session_id=m.group(1) if m else stem, harness=HARNESS, source=H.SOURCE_CODEX)


def discover(env: Mapping[str, str], home: str) -> list[str]:
    """Every rollout file (live and archived) under CODEX_HOME, sorted; regular files only."""
    base = glob.escape(env.get("CODEX_HOME") or os.path.join(home, ".codex"))
    found = glob.glob(os.path.join(base, "sessions", "*", "*", "*", "rollout-*.jsonl"))
    found += glob.glob(os.path.join(base, "archived_sessions", "rollout-*.jsonl"))
    return sorted({p for p in found if os.path.isfile(p)})


# --- lines ---------------------------------------------------------------------------------------

def parse_line(obj: Any, info: SessionInfo, offset: int) -> list[Event]:
    if not isinstance(obj, dict):
        raise Malformed("line is not a JSON object")
    kind = obj.get("type")
    if kind not in _ENVELOPES:
        return []  # unknown record types, and the pre-envelope format
    payload = obj.get("payload")
    if not isinstance(payload, dict):
        raise Malformed(f"{kind} line without a payload object")
    events = _HANDLERS[kind](payload, info)
    if not events:
        return []
    ts = time_ms(obj.get("timestamp"))
    if ts is None:
        raise Malformed(f"{kind} line without a usable timestamp")
    for n, event in enumerate(events):
        event.key = str(offset) if len(events) == 1 else f"{offset}#{n}"
        event.ts_ms = ts
    return events


def _session_meta(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    sid = p.get("id")
    if not isinstance(sid, str) or not sid:
        return []
    if sid.lower() != info.session_id.lower():
        if re.fullmatch(_UUID, info.session_id):
            return []  # another session's meta, copied into a resumed or forked rollout
        info.session_id = sid
    if _text(p.get("cwd")):
        info.cwd = p["cwd"]
    git = p.get("git")
    if isinstance(git, dict) and _text(git.get("branch")):
        info.branch = git["branch"]
    return []


def _turn_context(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    if _text(p.get("model")):
        info.model = p["model"]
    if _text(p.get("cwd")):
        info.cwd = p["cwd"]
    return []


def _event_msg(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    ptype = p.get("type")
    if ptype == "user_message":
        text = p.get("message")
        if info.first_prompt is None and p.get("kind") in (None, "plain") and _text(text) \
                and text.strip() and not text.lstrip().startswith(_INJECTED):
            info.first_prompt = text
    elif ptype == "turn_aborted":
        reason = p.get("reason") if _text(p.get("reason")) else "unknown"
        return [_event(H.SYSTEM, f"{H.TURN_ABORTED}: {reason}]")]
    return []


def _compacted(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    summary = p.get("message")
    text = "[conversation compacted]" + (f"\n{summary}" if _text(summary) and summary.strip() else "")
    return [_event(H.SYSTEM, text)]


def _response_item(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    handler = _ITEMS.get(p.get("type"))  # type: ignore[arg-type]
    return handler(p, info) if handler else []


# --- response items ------------------------------------------------------------------------------

def _message(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    role, content = p.get("role"), p.get("content")
    if role not in ("user", "assistant"):
        return []
    if not isinstance(content, (list, str)):
        raise Malformed("message without content")
    parts = [content] if isinstance(content, str) else [_part_text(b) for b in content if isinstance(b, dict)]
    parts = [t for t in parts if t is not None and not (role == "user" and t.lstrip().startswith(_INJECTED))]
    text = "\n".join(parts)
    if not text.strip():
        return []
    if role == "assistant":
        return [_event(H.ASSISTANT_RESPONSE, text, model=info.model)]
    return [_event(H.USER_INPUT, text)]


def _part_text(block: dict[str, Any]) -> str | None:
    if isinstance(block.get("text"), str):
        return block["text"]
    return "[image]" if block.get("type") == "input_image" else None


def _call(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    ptype = p.get("type")
    if ptype == "function_call":
        name, args = p.get("name"), decode_args(p.get("arguments", {}))
    elif ptype == "custom_tool_call":
        name, args = p.get("name"), decode_args(p.get("input", ""))
    elif ptype == "local_shell_call":
        name, args = "local_shell", p.get("action", {})
    else:  # web_search_call
        name, args = "web_search_call", p.get("action", {})
    if not _text(name):
        raise Malformed(f"{ptype} without a name")
    call_id = next((p[k] for k in ("call_id", "id") if _text(p.get(k))), None)
    if call_id:
        info.calls[call_id] = name
    return [_event(H.TOOL_CALL, args_text(args), tool_name=name, call_id=call_id, model=info.model,
                   files=touches(name, args))]


def _call_output(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    call_id = p.get("call_id") if _text(p.get("call_id")) else None
    text, code, success = _output(p.get("output"))
    is_error = (code != 0) if code is not None else (not success if success is not None else None)
    return [_event(H.TOOL_RESPONSE, text, tool_name=info.calls.pop(call_id, None) if call_id else None,
                   call_id=call_id, is_error=is_error, exit_code=code)]


def _output(raw: Any) -> tuple[str, int | None, bool | None]:
    """(text, exit code, success flag) of a tool output, in any of the shapes Codex wrote."""
    success = None
    if isinstance(raw, dict):  # {content | content_items, success}
        success = raw.get("success") if isinstance(raw.get("success"), bool) else None
        raw = raw.get("content", raw.get("content_items", raw.get("output")))
    if isinstance(raw, list):
        return blocks_text(raw, _part_text), None, success
    if not isinstance(raw, str):
        return ("" if raw is None else json.dumps(raw, ensure_ascii=False, separators=(",", ":"))), None, success
    wrapped = decode_args(raw)
    if isinstance(wrapped, dict) and isinstance(wrapped.get("output"), str) \
            and isinstance(wrapped.get("metadata"), dict):
        return wrapped["output"], int_or_none(wrapped["metadata"].get("exit_code")), success
    return raw, exit_code_in(raw), success


def _reasoning(p: dict[str, Any], info: SessionInfo) -> list[Event]:
    text = _joined(p.get("summary")) or _joined(p.get("content"))
    if text:
        return [_event(H.REASONING, text, model=info.model)]
    if p.get("encrypted_content"):
        return [_event(H.REASONING, H.ENCRYPTED_REASONING, model=info.model)]
    return []


def _joined(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    texts = [b["text"] for b in parts if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return "\n\n".join(t for t in texts if t.strip())


# --- small helpers -------------------------------------------------------------------------------

def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _event(etype: str, text: str, **fields: Any) -> Event:
    """An event whose key and time parse_line fills in from the line."""
    return Event("", 0, etype, text, **fields)


_ITEMS: dict[str, Callable[[dict[str, Any], SessionInfo], list[Event]]] = {
    "message": _message,
    "function_call": _call,
    "custom_tool_call": _call,
    "local_shell_call": _call,
    "web_search_call": _call,
    "function_call_output": _call_output,
    "custom_tool_call_output": _call_output,
    "reasoning": _reasoning,
}
_HANDLERS: dict[str, Callable[[dict[str, Any], SessionInfo], list[Event]]] = {
    "session_meta": _session_meta,
    "turn_context": _turn_context,
    "response_item": _response_item,
    "event_msg": _event_msg,
    "compacted": _compacted,
}

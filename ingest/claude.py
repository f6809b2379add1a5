"""Claude Code transcripts: one JSON Lines file per session, appended to as the session runs.

Where: ``<config>/projects/<project>/<sessionId>.jsonl`` for ``<config>`` in ``$CLAUDE_CONFIG_DIR``,
``~/.claude`` and ``~/.config/claude``. Subagents (the Task tool) write their own files, either
``<project>/<sessionId>/subagents/agent-<agentId>.jsonl`` or, in older versions,
``<project>/agent-<agentId>.jsonl``; their lines carry ``isSidechain: true``, ``agentId`` and the
*parent's* ``sessionId``. A subagent file is its own session ``<parent sessionId>/agent-<agentId>``
(source ``claude-subagents``, ``parent_session_id`` the parent). With the older layout the file name
does not name the parent: ``new_info`` guesses ``agent-<agentId>`` and the first line carrying a
``sessionId`` completes it, before any event of that line is returned (every line carries it, so
reading from any offset gives the same id). A sidechain line with an ``agentId`` found in a main
session file belongs to that subagent's session (``Event.session``); one without ``agentId`` (very
old versions wrote subagents inline) stays in the file's session.

Lines (``type``): ``user`` / ``assistant`` (``uuid``, ``timestamp``, ``message`` with a string
content or blocks), ``system`` (``subtype`` ``compact_boundary``, local commands, notes),
``summary`` (no time: gives ``info.summary``), ``custom-title`` (``info.title``); ``progress``,
``file-history-snapshot``, ``queue-operation``, ``isMeta`` user lines are harness-internal and
skipped, as is every type this module does not know. Session facts come from any line: ``cwd``,
``gitBranch``, ``slug``; the model from assistant messages (not ``<synthetic>``).

Events and keys:
- assistant blocks, one event each, key ``<uuid>#<i>``: ``text`` -> assistant_response,
  ``thinking`` -> reasoning (empty thinking with a signature, and ``redacted_thinking``, ->
  ``[encrypted reasoning omitted]``), ``tool_use`` / ``server_tool_use`` -> tool_call,
  ``*_tool_result`` (server tools such as web search) -> tool_response; a plain string content is
  one assistant_response keyed ``<uuid>``. API error lines (``isApiErrorMessage``) are system notes.
- user lines: each ``tool_result`` block -> tool_response keyed ``<uuid>#<i>`` (blocks joined with
  newlines, images ``[image]``; ``exit_code`` from ``toolUseResult`` or an ``Exit code N`` header;
  ``is_error`` false unless the block says true, as in the Messages API). The rest of the line's
  blocks (text, images) form one prompt keyed ``<uuid>``: a user_input, except harness notes that
  look like user text — the summary written after a compaction (``isCompactSummary``), the output
  of local commands and ``!`` shell commands (``<local-command-stdout>``, ``<bash-stdout>``, their
  stderr twins) and ``[Request interrupted by user...]`` — which become system events. Slash
  commands (``<command-name>``) and ``!`` commands (``<bash-input>``) are kept as user_input,
  wrapper and all: they are what the user typed and start the turn (a slash command's expansion
  follows as an ``isMeta`` line, skipped); they are not taken as ``first_prompt``.
- ``system`` lines with content -> system (``compact_boundary`` -> ``[conversation compacted]``
  plus its trigger and token count), keyed ``<uuid>``.

Every user/assistant line needs a ``uuid``, a ``timestamp`` and a ``message``, or it is
``Malformed`` (a time is never guessed); lines that are legitimately timeless produce no events.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Callable, Mapping

from protocol import history as H

from .events import Event, Malformed, SessionInfo
from .tooltouch import args_text, blocks_text, exit_code_in, int_or_none, time_ms, touches

HARNESS = H.HARNESS_CLAUDE_CODE
SOURCES = (H.SOURCE_CLAUDE, H.SOURCE_CLAUDE_SUBAGENTS)

_SYSTEM_PROMPT_PREFIXES = ("<local-command-stdout>", "<local-command-stderr>", "<bash-stdout>", "<bash-stderr>",
                           H.REQUEST_INTERRUPTED)  # an interrupt ends the turn (protocol.history)
_COMMAND_PREFIXES = ("<command-name>", "<bash-input>")


# --- files ---------------------------------------------------------------------------------------

def new_info(path: str) -> SessionInfo:
    stem = os.path.basename(path)
    if stem.endswith(".jsonl"):
        stem = stem[:-len(".jsonl")]
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "subagents":
        parent = os.path.basename(os.path.dirname(folder))
        return SessionInfo(session_id=f"{parent}/{stem}", harness=HARNESS, source=H.SOURCE_CLAUDE_SUBAGENTS,
                           parent_session_id=parent)
    if stem.startswith("agent-"):
        return SessionInfo(session_id=stem, harness=HARNESS, source=H.SOURCE_CLAUDE_SUBAGENTS)
    return SessionInfo(session_id=stem, harness=HARNESS, source=H.SOURCE_CLAUDE)


def discover(env: Mapping[str, str], home: str) -> list[str]:
    """Every session and subagent file under every Claude config dir, sorted; regular files only
    (a symlink counts when it resolves to one)."""
    roots = [os.path.join(env["CLAUDE_CONFIG_DIR"], "projects")] if env.get("CLAUDE_CONFIG_DIR") else []
    roots += [os.path.join(home, ".claude", "projects"), os.path.join(home, ".config", "claude", "projects")]
    found: set[str] = set()
    seen_roots: set[str] = set()
    for root in roots:
        real = os.path.realpath(root)
        if real in seen_roots or not os.path.isdir(root):
            continue
        seen_roots.add(real)
        base = glob.escape(root)
        for pattern in ("*/*.jsonl", "*/*/subagents/*.jsonl"):
            found.update(p for p in glob.glob(os.path.join(base, pattern)) if os.path.isfile(p))
    return sorted(found)


# --- lines ---------------------------------------------------------------------------------------

def parse_line(obj: Any, info: SessionInfo, offset: int) -> list[Event]:
    """One decoded line as events; ``offset`` is unused (every event line carries a uuid)."""
    if not isinstance(obj, dict):
        raise Malformed("line is not a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise Malformed("line without a type")
    _take_facts(obj, info)
    handler = _HANDLERS.get(kind)
    return handler(obj, info) if handler else []


def _take_facts(obj: dict[str, Any], info: SessionInfo) -> None:
    sid = obj.get("sessionId")
    if info.source == H.SOURCE_CLAUDE_SUBAGENTS and info.parent_session_id is None and _text(sid):
        info.parent_session_id = sid
        info.session_id = f"{sid}/{info.session_id}"
    for field, attr in (("cwd", "cwd"), ("gitBranch", "branch"), ("slug", "slug")):
        if _text(obj.get(field)):
            setattr(info, attr, obj[field])


def _summary(obj: dict[str, Any], info: SessionInfo) -> list[Event]:
    if _text(obj.get("summary")):
        info.summary = obj["summary"]
    return []


def _custom_title(obj: dict[str, Any], info: SessionInfo) -> list[Event]:
    title = obj.get("customTitle", obj.get("title"))
    if _text(title):
        info.title = title
    return []


def _system(obj: dict[str, Any], info: SessionInfo) -> list[Event]:
    if obj.get("subtype") == "compact_boundary":
        text = "[conversation compacted]" + _compact_details(obj.get("compactMetadata"))
    elif _text(obj.get("content")):
        text = obj["content"]
    else:
        return []  # turn durations, hook summaries...: nothing to read
    uuid, ts = _ident(obj)
    return [Event(uuid, ts, H.SYSTEM, text, session=_session_of(obj, info))]


def _compact_details(meta: Any) -> str:
    if not isinstance(meta, dict):
        return ""
    parts = []
    if _text(meta.get("trigger")):
        parts.append(f"trigger: {meta['trigger']}")
    if int_or_none(meta.get("preTokens")) is not None:
        parts.append(f"tokens before: {meta['preTokens']}")
    return " " + ", ".join(parts) if parts else ""


def _assistant(obj: dict[str, Any], info: SessionInfo) -> list[Event]:
    uuid, ts = _ident(obj)
    msg = _message(obj)
    model = msg.get("model") if _text(msg.get("model")) and msg.get("model") != "<synthetic>" else None
    if model:
        info.model = model
    session = _session_of(obj, info)
    content = msg.get("content")
    if obj.get("isApiErrorMessage"):
        text = blocks_text(content, lambda b: b.get("text") if isinstance(b.get("text"), str) else None)
        return [Event(uuid, ts, H.SYSTEM, text, session=session)] if text else []
    if isinstance(content, str):
        return [Event(uuid, ts, H.ASSISTANT_RESPONSE, content, model=model, session=session)] if content else []
    if not isinstance(content, list):
        raise Malformed("assistant message content is neither text nor blocks")
    events = []
    for i, block in enumerate(content):
        event = _assistant_block(block, info, model) if isinstance(block, dict) else None
        if event is not None:
            event.key, event.ts_ms, event.session = f"{uuid}#{i}", ts, session
            events.append(event)
    return events


def _assistant_block(block: dict[str, Any], info: SessionInfo, model: str | None) -> Event | None:
    btype = block.get("type")
    if btype == "text":
        text = block.get("text")
        return Event("", 0, H.ASSISTANT_RESPONSE, text, model=model) if _text(text) else None
    if btype in ("thinking", "redacted_thinking"):
        return _reasoning(block, model)
    if btype in ("tool_use", "server_tool_use"):
        return _tool_call(block, info, model)
    if isinstance(btype, str) and btype.endswith("_tool_result"):
        return _tool_result(block, info, None)
    return None


def _reasoning(block: dict[str, Any], model: str | None) -> Event | None:
    thinking = block.get("thinking")
    if block.get("type") == "thinking" and _text(thinking) and thinking.strip():
        return Event("", 0, H.REASONING, thinking, model=model)
    if block.get("type") == "redacted_thinking" or block.get("signature") or block.get("data"):
        return Event("", 0, H.REASONING, H.ENCRYPTED_REASONING, model=model)
    return None


def _tool_call(block: dict[str, Any], info: SessionInfo, model: str | None) -> Event | None:
    name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
    if not _text(name):
        return None
    if _text(call_id):
        info.calls[call_id] = name
    return Event("", 0, H.TOOL_CALL, args_text(args), tool_name=name, call_id=call_id if _text(call_id) else None,
                 model=model, files=touches(name, args))


def _tool_result(block: dict[str, Any], info: SessionInfo, tool_use_result: Any) -> Event:
    call_id = block.get("tool_use_id") if _text(block.get("tool_use_id")) else None
    text = _result_text(block.get("content"))
    code = _exit_code(tool_use_result)
    if code is None:
        code = exit_code_in(text)
    return Event("", 0, H.TOOL_RESPONSE, text, tool_name=info.calls.pop(call_id, None) if call_id else None,
                 call_id=call_id, is_error=block.get("is_error") is True, exit_code=code)


def _result_text(content: Any) -> str:
    def block_text(b: dict[str, Any]) -> str | None:
        if isinstance(b.get("text"), str):
            return b["text"]
        if isinstance(b.get("url"), str):  # a server tool's search result
            return f"{b['title']} {b['url']}" if isinstance(b.get("title"), str) else b["url"]
        return f"[{b.get('type')}]" if isinstance(b.get("type"), str) else None
    return blocks_text(content, block_text)


def _exit_code(tool_use_result: Any) -> int | None:
    if isinstance(tool_use_result, dict):
        for key in ("exitCode", "exit_code", "returnCode"):
            if int_or_none(tool_use_result.get(key)) is not None:
                return tool_use_result[key]
        return None
    return exit_code_in(tool_use_result) if isinstance(tool_use_result, str) else None


def _user(obj: dict[str, Any], info: SessionInfo) -> list[Event]:
    if obj.get("isMeta"):
        return []
    uuid, ts = _ident(obj)
    content = _message(obj).get("content")
    if not isinstance(content, (str, list)):
        raise Malformed("user message content is neither text nor blocks")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    events, prompt_at, prompt = _results_and_prompt(obj, blocks, info, uuid)
    if prompt.strip():
        events.insert(prompt_at, _prompt_event(obj, info, uuid, prompt))
    session = _session_of(obj, info)
    for event in events:
        event.ts_ms, event.session = ts, session
    return events


def _results_and_prompt(obj: dict[str, Any], blocks: list[Any], info: SessionInfo,
                        uuid: str) -> tuple[list[Event], int, str]:
    """(a user line's tool results, where its prompt goes among them, the prompt text)."""
    results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    tool_use_result = obj.get("toolUseResult") if len(results) == 1 else None
    events: list[Event] = []
    prompt: list[str] = []
    prompt_at = None
    for i, block in enumerate(blocks):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            event = _tool_result(block, info, tool_use_result)
            event.key = f"{uuid}#{i}"
            events.append(event)
        elif (text := _prompt_part(block)) is not None:
            prompt_at = len(events) if prompt_at is None else prompt_at
            prompt.append(text)
    return events, prompt_at or 0, "\n".join(prompt)


def _prompt_part(block: Any) -> str | None:
    if isinstance(block, str):
        return block
    if not isinstance(block, dict):
        return None
    if block.get("type") == "text":
        return block.get("text") if isinstance(block.get("text"), str) else None
    return f"[{block['type']}]" if isinstance(block.get("type"), str) else None


def _prompt_event(obj: dict[str, Any], info: SessionInfo, uuid: str, text: str) -> Event:
    if obj.get("isCompactSummary"):
        return Event(uuid, 0, H.SYSTEM, "[conversation summary]\n" + text)
    if text.lstrip().startswith(_SYSTEM_PROMPT_PREFIXES):
        return Event(uuid, 0, H.SYSTEM, text)
    if info.first_prompt is None and not text.lstrip().startswith(_COMMAND_PREFIXES) \
            and _session_of(obj, info) is None:
        info.first_prompt = text
    return Event(uuid, 0, H.USER_INPUT, text)


# --- small readers -------------------------------------------------------------------------------

def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _ident(obj: dict[str, Any]) -> tuple[str, int]:
    uuid, ts = obj.get("uuid"), time_ms(obj.get("timestamp"))
    if not _text(uuid) or ts is None:
        raise Malformed(f"{obj.get('type')} line without a uuid or a usable timestamp")
    return uuid, ts


def _message(obj: dict[str, Any]) -> dict[str, Any]:
    msg = obj.get("message")
    if not isinstance(msg, dict):
        raise Malformed(f"{obj.get('type')} line without a message")
    return msg


def _session_of(obj: dict[str, Any], info: SessionInfo) -> str | None:
    """The subagent session of a sidechain line found in a main session file, else None."""
    if info.source != H.SOURCE_CLAUDE or obj.get("isSidechain") is not True:
        return None
    sid, agent = obj.get("sessionId"), obj.get("agentId")
    return f"{sid}/agent-{agent}" if _text(sid) and _text(agent) else None


_HANDLERS: dict[str, Callable[[dict[str, Any], SessionInfo], list[Event]]] = {
    "user": _user,
    "assistant": _assistant,
    "system": _system,
    "summary": _summary,
    "custom-title": _custom_title,
}

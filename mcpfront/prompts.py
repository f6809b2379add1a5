"""Prompts: the few recall tasks hosts show as commands (Claude Code: ``/mcp__convmem__recall``).

Why prompts: a user who wants "what did we decide about X" should not have to know which tools answer
it or in what order. Each prompt is a short user message that tells the model which of *this server's*
tools to call, narrow to wide, with the user's arguments filled in — the tools stay the one way data is
read, so a prompt never bypasses their bounds or error handling. Which prompts exist depends on the
tool family served (``--tools``): a prompt is listed only when every tool it names is.

Arguments are checked here (required, and the same byte limits the tools apply) and a failure is a
``PromptError`` whose message names the argument and the constraint, never its value.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import mcp_types as types

from protocol import history as H
from protocol import limits as L


class PromptError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = types.INVALID_PARAMS
        self.message = message


@dataclass(frozen=True)
class Arg:
    name: str
    description: str
    max_bytes: int
    required: bool = True
    completes_session_id: bool = False


@dataclass(frozen=True)
class PromptSpec:
    name: str
    title: str
    description: str
    args: tuple[Arg, ...]
    tools: frozenset[str]                      # every tool the text names; listed only if all are served
    render: Callable[[dict[str, str]], str]


def _q(value: str) -> str:
    """An argument as a JSON string literal: quotes and newlines in it cannot break the instructions."""
    return json.dumps(value, ensure_ascii=False)


def _recall_both(a: dict[str, str]) -> str:
    return (f"Recall what we decided or concluded about {_q(a['topic'])}.\n\n"
            f"1. Call search_messages with query={_q(a['topic'])} for memories written on purpose.\n"
            f"2. Call search_sessions with query={_q(a['topic'])} for past agent sessions; call open on the best "
            "hits' event ids for the exact text (and on a turn id for what surrounded it).\n"
            "3. Answer with the decision(s), when and in which session each was made, and quote the deciding "
            "lines. If a later message revises an earlier decision, say so. If nothing is found, say that "
            "plainly (get_ingest_status tells whether the history is complete) instead of guessing.")


def _recall_memory(a: dict[str, str]) -> str:
    return (f"Recall what we decided or concluded about {_q(a['topic'])}.\n\n"
            f"1. Call search_messages with query={_q(a['topic'])}.\n"
            "2. For the best results, call read_messages view=context with their message_id to see what "
            "surrounded them (and view=content for a long message).\n"
            "3. Answer with the decision(s), when and in which session each was made, quoting the deciding "
            "lines; say plainly if nothing is found instead of guessing.")


def _recall_history(a: dict[str, str]) -> str:
    return (f"Recall what we decided or concluded about {_q(a['topic'])}.\n\n"
            f"1. Call search_sessions with query={_q(a['topic'])}.\n"
            "2. Call open on the best hits' event ids for the exact text, and on their turn ids for context.\n"
            "3. Answer with the decision(s), when and in which session each was made, quoting the deciding "
            "lines. If nothing is found, say so (get_ingest_status tells whether the history is complete).")


def _summarise(a: dict[str, str]) -> str:
    return (f"Summarise the conversation session {_q(a['session_id'])}.\n\n"
            f"Read it with read_messages view=history session_id={_q(a['session_id'])} (limit 200; pass each "
            "nextCursor back until there is none). Then write: the goal, what was decided (with who/when), "
            "what was done or changed, and what is still open. Keep it short and quote message ids for the "
            "key points. If the session does not exist or is empty, say so.")


def _file_history(a: dict[str, str]) -> str:
    return (f"What happened to the file {_q(a['path'])} in past agent sessions?\n\n"
            f"1. Call file_attention with path={_q(a['path'])} (granularity sessions).\n"
            "2. For the most relevant sessions, call open on their event ids to see exactly what was read or "
            "changed, and on the turn ids for why.\n"
            "3. Answer as a short timeline: when, which session, what changed and why.")


TOPIC = Arg("topic", f"What to recall (a few words), at most {L.QUERY_MAX_BYTES} UTF-8 bytes.", L.QUERY_MAX_BYTES)
SESSION = Arg("session_id", f"The session to summarise (completes from recent sessions), at most "
              f"{L.SESSION_ID_MAX_BYTES} UTF-8 bytes.", L.SESSION_ID_MAX_BYTES, completes_session_id=True)
PATH = Arg("path", f"The file, project-relative or absolute, at most {H.PATH_MAX_BYTES} UTF-8 bytes.",
           H.PATH_MAX_BYTES)
_RECALL = "Find what was decided about a topic in stored memories and past agent sessions, with sources."

# Several variants of one prompt name: the first whose tools are all served wins.
SPECS: tuple[PromptSpec, ...] = (
    PromptSpec("recall", "Recall a decision", _RECALL, (TOPIC,),
               frozenset({"search_messages", "search_sessions", "open", "get_ingest_status"}), _recall_both),
    PromptSpec("recall", "Recall a decision", _RECALL, (TOPIC,),
               frozenset({"search_messages", "read_messages"}), _recall_memory),
    PromptSpec("recall", "Recall a decision", _RECALL, (TOPIC,),
               frozenset({"search_sessions", "open", "get_ingest_status"}), _recall_history),
    PromptSpec("summarise_session", "Summarise a session",
               "Summarise one stored conversation: goal, decisions, changes, open questions.", (SESSION,),
               frozenset({"read_messages"}), _summarise),
    PromptSpec("file_history", "History of a file",
               "Which past agent sessions read or changed a file, and what they did to it.", (PATH,),
               frozenset({"file_attention", "open"}), _file_history),
)


def prompts_for(tools: frozenset[str]) -> dict[str, PromptSpec]:
    out: dict[str, PromptSpec] = {}
    for spec in SPECS:
        if spec.name not in out and spec.tools <= tools:
            out[spec.name] = spec
    return out


def list_prompts(specs: dict[str, PromptSpec]) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[
        types.Prompt(name=s.name, title=s.title, description=s.description, arguments=[
            types.PromptArgument(name=a.name, description=a.description, required=a.required) for a in s.args])
        for s in specs.values()])


def get_prompt(specs: dict[str, PromptSpec], name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
    spec = specs.get(name)
    if spec is None:
        raise PromptError("Unknown prompt; prompts/list gives the available prompts")
    given = arguments or {}
    known = {a.name for a in spec.args}
    if any(k not in known for k in given):
        raise PromptError(f"{spec.name} takes only the arguments " + ", ".join(sorted(known)))
    values: dict[str, str] = {}
    for a in spec.args:
        v = given.get(a.name)
        if not isinstance(v, str) or not v.strip():
            raise PromptError(f"argument {a.name} is required (a non-empty string)")
        if len(v.encode("utf-8", "surrogatepass")) > a.max_bytes:
            raise PromptError(f"argument {a.name} must be at most {a.max_bytes} UTF-8 bytes")
        values[a.name] = v
    return types.GetPromptResult(description=spec.description, messages=[
        types.PromptMessage(role="user", content=types.TextContent(type="text", text=spec.render(values)))])


def completes_session_id(specs: dict[str, PromptSpec], prompt: str, argument: str) -> bool:
    spec = specs.get(prompt)
    return spec is not None and any(a.name == argument and a.completes_session_id for a in spec.args)

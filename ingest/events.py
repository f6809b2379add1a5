"""What a harness parser produces: events and what it learned about the session, harness-neutral.

A parser never talks to the daemon and never touches the filesystem beyond the bytes it is given:
it turns one transcript record (a JSON line, or a whole JSON document for Gemini CLI) into zero or
more ``Event`` values, updating a ``SessionInfo`` as it goes. Everything after that — ids, redaction,
file-path resolution, batching, checkpoints — is the same for every harness (``service``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from protocol import history as H


class Malformed(ValueError):
    """A record that is not what its harness writes (counted and skipped, never fatal)."""


@dataclass
class FileTouch:
    """A file a tool call read or changed, as the call named it (absolute, or relative to the cwd)."""
    path: str
    op: str                      # one of protocol.history.FILE_OPS


@dataclass
class Event:
    key: str                     # unique within the session and stable across re-reads of the same bytes
    ts_ms: int
    type: str                    # one of protocol.history.EVENT_TYPES
    text: str                    # the content: message text, tool arguments as JSON, tool output...
    tool_name: str | None = None
    call_id: str | None = None   # joins a tool_call to its tool_response (metadata.tool_call_id)
    is_error: bool | None = None
    exit_code: int | None = None
    model: str | None = None
    files: list[FileTouch] = field(default_factory=list)
    session: str | None = None   # set when one file holds several sessions (Claude subagents)


@dataclass
class SessionInfo:
    """What a transcript says about its session; fields stay None until a record says otherwise."""
    session_id: str = ""         # the harness's own id (the store's session id is "<harness>:<this>")
    harness: str = ""
    source: str = ""
    title: str | None = None
    cwd: str | None = None
    branch: str | None = None
    mode: str | None = None      # one of protocol.history.MODES, only when the transcript says so
    slug: str | None = None
    summary: str | None = None
    first_prompt: str | None = None
    parent_session_id: str | None = None   # the harness's id of the parent session (subagents)
    model: str | None = None
    # parser state carried across records of one file (not sent to the daemon)
    # call id -> tool name of the calls whose result has not come yet (a result takes its call's entry
    # out): what names a result that comes later, and all a checkpoint carries of the calls, so a
    # checkpoint stays a few hundred bytes however long the session (the daemon keeps one a file)
    calls: dict[str, str] = field(default_factory=dict)


EVENT_TYPES = H.EVENT_TYPES
FILE_OPS = H.FILE_OPS
ENCRYPTED_REASONING = H.ENCRYPTED_REASONING

"""Agent session transcripts (Claude Code, Codex) as store messages.

One store session per transcript session; user and assistant text become messages in their
original order with their original time; tool calls are summarised in one line each. Message ids
are derived from the transcript itself (time + a hash of the entry's own id), so importing the
same entry twice can never store it twice, whatever happened to the checkpoint file.

Files are read from a durable per-file checkpoint (device, inode, byte offset of the last complete
line): a re-run or ``--watch`` reads only what was appended. A line still being written (no final
newline) waits for the next run. Malformed lines are skipped and counted, never fatal.
"""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator

from ulid import ULID

from protocol import limits as L

HARNESSES = ("claude-code", "codex")
TOOL_PREVIEW_CHARS = 160
CONTENT_CUT_MARK = "\n[... truncated by convmem import]"
_SKIP_USER_PREFIXES = ("<environment_context>", "<user_instructions>", "<permissions", "# AGENTS.md")


def default_paths(harness: str, home: str | None = None) -> list[str]:
    home = home or os.path.expanduser("~")
    if harness == "claude-code":
        return sorted(glob.glob(os.path.join(home, ".claude", "projects", "*", "*.jsonl")))
    codex_home = os.environ.get("CODEX_HOME") or os.path.join(home, ".codex")
    return sorted(glob.glob(os.path.join(codex_home, "sessions", "**", "rollout-*.jsonl"), recursive=True))


def parse_time_ms(value: Any) -> int | None:
    """RFC 3339 / ISO 8601 with an offset (or Z), or epoch milliseconds."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return None
        ms = int(value)
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if dt.tzinfo is None:
            return None
        ms = int(dt.timestamp() * 1000)
    else:
        return None
    return ms if 0 <= ms <= L.TIME_MS_MAX else None  # what a message's timestamp may be


def derived_ulid(ms: int, key: str) -> str:
    rand = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:10], "big")
    ms = max(0, min(ms, (1 << 48) - 1))
    return str(ULID.from_bytes(((ms << 80) | rand).to_bytes(16, "big")))


def _clip_utf8(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8", "replace")  # lone surrogates (JSON can carry them) become "?"
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    keep = max_bytes - len(CONTENT_CUT_MARK.encode())
    return data[:keep].decode("utf-8", "ignore") + CONTENT_CUT_MARK


def _preview(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= TOOL_PREVIEW_CHARS else text[:TOOL_PREVIEW_CHARS - 1] + "…"


@dataclass
class Entry:
    """One transcript entry on its way to becoming a message."""
    session: str
    key: str          # unique within the harness: the entry's own id
    ts_ms: int
    role: str
    text: str
    project: str


class Malformed(ValueError):
    pass


# -- Claude Code: ~/.claude/projects/<project>/<session>.jsonl ----------------------------------
def claude_entries(obj: Any, path: str) -> list[Entry]:
    if not isinstance(obj, dict):
        raise Malformed("line is not an object")
    kind = obj.get("type")
    if kind not in ("user", "assistant") or obj.get("isMeta"):
        return []  # summaries, system notes, file snapshots: not conversation
    msg = obj.get("message")
    session = obj.get("sessionId") or os.path.splitext(os.path.basename(path))[0]
    uuid = obj.get("uuid")
    ts = parse_time_ms(obj.get("timestamp"))
    if not isinstance(msg, dict) or not isinstance(uuid, str) or ts is None or not isinstance(session, str):
        raise Malformed("user/assistant line without message, uuid, sessionId or timestamp")
    cwd = obj.get("cwd")
    project = (os.path.basename(cwd) if isinstance(cwd, str) else "") or os.path.basename(os.path.dirname(path))
    content = msg.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif btype == "tool_use":
                parts.append(f"[tool call] {block.get('name', '?')}: {_preview(block.get('input', {}))}")
            # tool_result, thinking, images: not conversation text
    else:
        raise Malformed("message content is neither text nor blocks")
    text = "\n".join(p for p in parts if p.strip())
    if not text:
        return []
    role = "assistant" if kind == "assistant" else "user"
    return [Entry(session, uuid, ts, role, text, project)]


# -- Codex: ~/.codex/sessions/**/rollout-*.jsonl --------------------------------------------------
@dataclass
class CodexState:
    session: str = ""
    project: str = ""


def codex_entries(obj: Any, path: str, offset: int, state: CodexState) -> list[Entry]:
    if not isinstance(obj, dict) or not isinstance(obj.get("payload"), dict):
        raise Malformed("line is not an object with a payload")
    kind, payload = obj.get("type"), obj["payload"]
    if kind == "session_meta":
        if isinstance(payload.get("id"), str):
            state.session = payload["id"]
        if isinstance(payload.get("cwd"), str):
            state.project = os.path.basename(payload["cwd"])
        return []
    if kind != "response_item":
        return []
    ts = parse_time_ms(obj.get("timestamp"))
    if ts is None:
        raise Malformed("response_item without a timestamp")
    session = state.session or os.path.splitext(os.path.basename(path))[0]
    key = f"{session}@{offset}"
    ptype = payload.get("type")
    if ptype == "message":
        role = payload.get("role")
        if role not in ("user", "assistant"):
            return []  # developer/system prompts
        blocks = payload.get("content")
        if not isinstance(blocks, list):
            raise Malformed("message without content blocks")
        text = "\n".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
                         and b.get("type") in ("input_text", "output_text", "text"))
        if not text.strip() or (role == "user" and text.lstrip().startswith(_SKIP_USER_PREFIXES)):
            return []
        return [Entry(session, key, ts, role, text, state.project)]
    if ptype in ("function_call", "custom_tool_call", "local_shell_call"):
        name = payload.get("name") or ptype
        args = payload.get("arguments", payload.get("input", payload.get("action", {})))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        return [Entry(session, key, ts, "assistant", f"[tool call] {name}: {_preview(args)}", state.project)]
    return []


def to_message(harness: str, e: Entry) -> dict[str, Any]:
    """The contract's Message object, as import_messages takes it."""
    tags = [harness]
    if e.project:
        tags.append(_clip_utf8(f"project:{e.project}", L.TAG_MAX_BYTES))
    return {
        "message_id": derived_ulid(e.ts_ms, f"{harness}:{e.session}:{e.key}"),
        "session_id": _clip_utf8(f"{harness}:{e.session}", L.SESSION_ID_MAX_BYTES),
        "timestamp": e.ts_ms,
        "role": e.role,
        "content": _clip_utf8(e.text, L.CONTENT_MAX_BYTES),
        "revision": 1,
        "updated_at": e.ts_ms,
        "metadata": {"tags": tags, "memory_kind": "episode", "memory_tier": "short", "importance": 50,
                     "relations": [], "source_message_ids": []},
    }


# -- reading files from checkpoints ---------------------------------------------------------------
@dataclass
class FileResult:
    messages: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0
    malformed: int = 0
    malformed_lines: list[int] = field(default_factory=list)
    end_offset: int = 0


def read_new(harness: str, path: str, checkpoint: dict[str, Any] | None) -> tuple[FileResult, dict[str, Any]]:
    """Parse what was appended to ``path`` since ``checkpoint``; returns (result, new checkpoint).

    The new checkpoint must be saved only after the messages were stored."""
    st = os.stat(path)
    ident = [st.st_dev, st.st_ino]
    start = 0
    state = CodexState()
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("offset"), int) \
            or not isinstance(checkpoint.get("lines", 0), int):
        checkpoint = None  # none, or not one we wrote: read the file from the start
    if checkpoint and checkpoint.get("file") == ident and 0 <= checkpoint["offset"] <= st.st_size:
        start = checkpoint["offset"]
        state = CodexState(str(checkpoint.get("session") or ""), str(checkpoint.get("project") or ""))
    res = FileResult(end_offset=start)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(st.st_size - start)
    pos = 0
    lineno = checkpoint.get("lines", 0) if start else 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # an incomplete last line: still being written
        raw = data[pos:nl]
        offset = start + pos
        pos = nl + 1
        lineno += 1
        if not raw.strip():
            continue
        res.lines += 1
        try:
            obj = json.loads(raw)
            if harness == "claude-code":
                entries = claude_entries(obj, path)
            else:
                entries = codex_entries(obj, path, offset, state)
        except (ValueError, UnicodeDecodeError, RecursionError):  # Malformed is a ValueError
            res.malformed += 1
            if len(res.malformed_lines) < 20:
                res.malformed_lines.append(lineno)
            continue
        res.messages.extend(to_message(harness, e) for e in entries)
    res.end_offset = start + pos
    new_cp = {"file": ident, "offset": res.end_offset, "lines": lineno, "session": state.session,
              "project": state.project}
    return res, new_cp


def iter_files(harness: str, paths: list[str]) -> Iterator[str]:
    for p in paths:
        if os.path.isdir(p):
            pattern = "*.jsonl" if harness == "claude-code" else "rollout-*.jsonl"
            yield from sorted(glob.glob(os.path.join(p, "**", pattern), recursive=True))
        elif os.path.isfile(p):
            yield p


class Checkpoints:
    """Per-file read positions, saved atomically (write, fsync, rename) after each file's messages
    were acknowledged by the daemon: a crash re-reads at most one file's new lines, which the
    derived ids make harmless."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path) as f:
                self.data: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            self.data = {}
        if not isinstance(self.data, dict) or not all(isinstance(v, dict) for v in self.data.values()):
            self.data = {}  # not a checkpoint file: start over (the derived ids make that harmless)

    def get(self, harness: str, path: str) -> dict[str, Any] | None:
        return self.data.get(harness, {}).get(os.path.abspath(path))

    def put(self, harness: str, path: str, cp: dict[str, Any]) -> None:
        self.data.setdefault(harness, {})[os.path.abspath(path)] = cp

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

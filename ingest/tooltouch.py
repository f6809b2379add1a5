"""Which files a tool call reads or changes, from its structured arguments only — plus the few
record helpers every harness parser shares (times, argument text, tool output text, exit codes).

``touches(tool_name, arguments)`` knows the file tools of the three harnesses by their exact names:

- Claude Code: ``Read`` (file_path) read, ``Write`` write, ``Edit`` / ``MultiEdit`` edit,
  ``NotebookEdit`` (notebook_path) edit;
- Codex: ``apply_patch`` (the patch under ``input``, or the custom tool's raw input text):
  ``*** Add File: p`` write, ``*** Update File: p`` edit, ``*** Delete File: p`` delete,
  ``*** Move to: p`` write; ``view_image`` (path) read;
- Gemini CLI: ``read_file`` (absolute_path or file_path) read, ``read_many_files`` (paths, each
  without glob characters) read, ``write_file`` write, ``replace`` / ``edit`` edit.

Choices: shell commands are never parsed (a path mentioned in ``cat x`` or ``sed -i`` is not a
touch: quoting, pipes and variables make that guesswork, and a wrong "this session edited x" is
worse than a missing one); search/listing tools (Glob, Grep, list_directory) name directories and
patterns, not files; MCP tools are never file touches even with a ``path`` argument (the name must
match exactly). A path that is empty, has a control character, ends with ``/`` (or is ``.``/``..``),
is a URL (``scheme://`` or ``file:``), or is longer than the store accepts is dropped. Codex's
``shell`` tool called with the argv ``["apply_patch", patch]`` is not read either: tool names match
exactly, and that argv is still a shell command. Paths are kept as the call named them (absolute,
or relative to the cwd); the service resolves them. Duplicates within one call are dropped, order
kept, at most ``FILES_PER_EVENT_MAX`` per call.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any, Callable

from protocol import history as H
from protocol import limits as L
from protocol.validation import epoch_ms

from .events import FileTouch

# --- the file tools ------------------------------------------------------------------------------

_SIMPLE: dict[str, tuple[tuple[str, ...], str]] = {
    # tool name -> (argument names tried in order, op)
    "Read": (("file_path",), "read"),
    "Write": (("file_path",), "write"),
    "Edit": (("file_path",), "edit"),
    "MultiEdit": (("file_path",), "edit"),
    "NotebookEdit": (("notebook_path",), "edit"),
    "view_image": (("path",), "read"),
    "read_file": (("absolute_path", "file_path"), "read"),
    "write_file": (("file_path",), "write"),
    "replace": (("file_path",), "edit"),
    "edit": (("file_path",), "edit"),
}
_PATCH_LINE = re.compile(r"^\*\*\* (Add File|Update File|Delete File|Move to): (.+?)\s*$", re.MULTILINE)
_PATCH_OPS = {"Add File": "write", "Update File": "edit", "Delete File": "delete", "Move to": "write"}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB_CHARS = frozenset("*?[{")


def touches(tool_name: str, arguments: Any) -> list[FileTouch]:
    """The files the call ``tool_name(arguments)`` reads or changes; [] for any other tool."""
    if tool_name in _SIMPLE:
        names, op = _SIMPLE[tool_name]
        found = [(_first_str(arguments, names), op)]
    elif tool_name == "apply_patch":
        found = _patch_touches(arguments)
    elif tool_name == "read_many_files":
        found = _many_touches(arguments)
    else:
        return []
    return _clean(found)


def _first_str(arguments: Any, names: tuple[str, ...]) -> str | None:
    if not isinstance(arguments, dict):
        return None
    for name in names:
        value = arguments.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _patch_touches(arguments: Any) -> list[tuple[str | None, str]]:
    patch = arguments.get("input") if isinstance(arguments, dict) else arguments
    if not isinstance(patch, str):
        return []
    return [(m.group(2), _PATCH_OPS[m.group(1)]) for m in _PATCH_LINE.finditer(patch)]


def _many_touches(arguments: Any) -> list[tuple[str | None, str]]:
    paths = arguments.get("paths") if isinstance(arguments, dict) else None
    if not isinstance(paths, list):
        return []
    return [(p, "read") for p in paths
            if isinstance(p, str) and not _GLOB_CHARS.intersection(p)]


def is_file_path(path: Any) -> bool:
    """A plausible single file path: not empty, a directory, a URL, or multi-line."""
    if not isinstance(path, str) or not path or path != path.strip():
        return False
    if path.endswith("/") or path.endswith("/.") or path.endswith("/..") or path in (".", ".."):
        return False
    if _URL.match(path) or path.lower().startswith("file:"):
        return False
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        return False
    return len(path.encode("utf-8", "surrogatepass")) <= H.PATH_MAX_BYTES


def _clean(found: list[tuple[str | None, str]]) -> list[FileTouch]:
    out: list[FileTouch] = []
    seen: set[tuple[str, str]] = set()
    for path, op in found:
        if not is_file_path(path) or (path, op) in seen:
            continue
        seen.add((path, op))  # type: ignore[arg-type]
        out.append(FileTouch(path, op))  # type: ignore[arg-type]
    return out[:H.FILES_PER_EVENT_MAX]


# --- helpers every parser shares -----------------------------------------------------------------

def time_ms(value: Any) -> int | None:
    """RFC 3339 with an offset (or Z), or epoch milliseconds -> epoch ms in 0 .. 2**48-1; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return None
        ms = int(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
        except ValueError:
            return None
        if dt.tzinfo is None:
            return None
        ms = epoch_ms(dt)
    else:
        return None
    return ms if 0 <= ms <= L.TIME_MS_MAX else None


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def decode_args(raw: Any) -> Any:
    """Tool arguments as the harness gave them; a JSON string is decoded, other text kept as is."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def args_text(args: Any) -> str:
    """A tool call's event text: the arguments as compact JSON (raw text stays raw)."""
    return args if isinstance(args, str) else compact_json(args)


_EXIT_LINE = re.compile(r"^(?:Error: )?(?:Exit code:? |Process exited with code )(-?\d{1,10})\s*$")


def exit_code_in(text: str) -> int | None:
    """An exit code a tool output states in its header lines (before an ``Output:`` line), if any:
    ``Exit code: N`` (Codex), ``Exit code N`` / ``Error: Exit code N`` (Claude Code's Bash),
    ``Process exited with code N`` (Codex's exec sessions)."""
    for line in text.split("\n", 8)[:8]:
        if line.startswith("Output:"):
            break
        m = _EXIT_LINE.match(line)
        if m:
            code = int(m.group(1))
            return code if -2**31 <= code < 2**31 else None
    return None


def int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
        return None
    return value


def blocks_text(content: Any, block_text: Callable[[dict[str, Any]], str | None], sep: str = "\n") -> str:
    """Content that is a string, or a list of blocks each rendered by ``block_text`` (None: skipped),
    as one text (blocks joined with ``sep``, newlines unless told)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else compact_json(content)
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict):
            text = block_text(block)
            if text is not None:
                parts.append(text)
    return sep.join(parts)

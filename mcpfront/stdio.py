"""A stdio transport without thread hops.

The SDK's ``stdio_server()`` reads and writes through ``anyio.wrap_file``: every line read, every
write and every flush is a trip to a worker thread — about three per tool call, which on a busy
2-core machine cost more than the whole durable write behind it. This module hands the SDK the same
kind of streams built on asyncio's native pipe transports instead, and keeps the SDK's protection
of the wire: fd 0 is pointed at /dev/null and fd 1 at stderr while serving, so nothing a handler or
a child process prints can corrupt the protocol stream.

Every line is checked here before the SDK sees it, because the SDK's reader decodes stdin with
``errors="replace"`` (invalid UTF-8 would be stored as U+FFFD), answers nothing to a line it cannot
parse (a lone surrogate escape such as ``"\\ud800"``, a JSON text that is no JSON-RPC message) and logs
the offending line. Here a malformed line is answered with a JSON-RPC error — -32700 (id null) for
bytes that are not UTF-8 JSON or a line over LINE_LIMIT, -32600 with the request's id when it can be
read for JSON that is no JSON-RPC message — the log says what was wrong and never echoes the input,
and the session goes on. Blank lines carry nothing and are skipped.

Pipes, sockets and terminals work this way; anything else (a regular file on stdin) makes
``native_stdio`` yield None and the caller falls back to the SDK's transport.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

# A JSON-RPC line carries at most a request of MAX_REQUEST_BYTES, JSON-escaped (up to 6x for
# control characters); longer lines are refused by the SDK's parser anyway.
LINE_LIMIT = 32 * 1024 * 1024

PARSE_ERROR = -32700      # JSON-RPC 2.0: invalid JSON was received
INVALID_REQUEST = -32600  # JSON-RPC 2.0: the JSON sent is not a valid Request object

log = logging.getLogger("convmem.mcp.stdio")


class _Lines:
    """``async for line in stdin`` as the SDK's reader expects (text lines, newline included), each
    one already known to be a JSON-RPC message: malformed lines are answered here and skipped."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None = None) -> None:
        self.reader = reader
        self.writer = writer

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self.reader.readline()
            except ValueError:
                # an over-long line: drop it up to its newline and say so; the session goes on
                await self._skip_long_line()
                await self._refuse(PARSE_ERROR, f"Parse error: a line must be at most {LINE_LIMIT} bytes",
                                   "an over-long line")
                continue
            if not line:
                raise StopAsyncIteration
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                await self._refuse(PARSE_ERROR, "Parse error: the line is not valid UTF-8", "invalid UTF-8", line)
                continue
            problem = _check_message(text)
            if problem is None:
                return text
            code, message, what, rid = problem
            await self._refuse(code, message, what, line, rid)

    async def _skip_long_line(self) -> None:
        while True:
            try:
                await self.reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:  # still no newline within the limit: drop what was read
                await self.reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    async def _refuse(self, code: int, message: str, what: str, line: bytes = b"", rid: object = None) -> None:
        log.warning("stdin: answered a malformed JSON-RPC line (%s, %d bytes) with error %d", what, len(line), code)
        if self.writer is None:
            return
        reply = {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}
        self.writer.write(json.dumps(reply).encode("utf-8") + b"\n")
        await self.writer.drain()  # a peer that floods bad lines and never reads is slowed, not buffered


def _check_message(text: str) -> tuple[int, str, str, object] | None:
    """None for a line the SDK will accept as a JSON-RPC message (the same validation it runs), else
    (code, reply message, what to log, request id or None). The SDK's JSON parser refuses lone
    surrogate escapes, which Python's json module would let through into stored text."""
    import mcp_types as types
    from pydantic import ValidationError

    try:
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        return None
    except ValidationError as exc:
        if any(e.get("type") == "json_invalid" for e in exc.errors(include_input=False, include_url=False)):
            return (PARSE_ERROR, "Parse error: the line is not valid JSON text (or holds an escape that is no "
                                 "Unicode character, such as a lone surrogate)", "invalid JSON", None)
    return (INVALID_REQUEST, "Invalid Request: the line is JSON but not a JSON-RPC 2.0 message", "not JSON-RPC",
            _request_id(text))


def _request_id(text: str) -> object:
    """The id of a JSON object that failed JSON-RPC validation, if it is one JSON-RPC allows (else null)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        try:
            json.dumps(rid, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return None
        return rid
    return None


class _Writer:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


@asynccontextmanager
async def native_stdio() -> AsyncIterator[tuple[_Lines, _Writer] | None]:
    loop = asyncio.get_running_loop()
    try:
        in_fd, out_fd = os.dup(0), os.dup(1)
    except OSError:
        yield None
        return
    rfile = os.fdopen(in_fd, "rb", buffering=0)
    wfile = os.fdopen(out_fd, "wb", buffering=0)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), rfile)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, wfile)
    except (ValueError, OSError):
        rfile.close()
        wfile.close()
        yield None
        return
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    try:
        yield _Lines(reader, writer), _Writer(writer)
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
        transport.close()

"""A stdio transport without thread hops.

The SDK's ``stdio_server()`` reads and writes through ``anyio.wrap_file``: every line read, every
write and every flush is a trip to a worker thread — about three per tool call, which on a busy
2-core machine cost more than the whole durable write behind it. This module hands the SDK the same
kind of streams built on asyncio's native pipe transports instead, and keeps the SDK's protection
of the wire: fd 0 is pointed at /dev/null and fd 1 at stderr while serving, so nothing a handler or
a child process prints can corrupt the protocol stream.

Pipes, sockets and terminals work this way; anything else (a regular file on stdin) makes
``open_stdio`` return None and the caller falls back to the SDK's transport.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

# A JSON-RPC line carries at most a request of MAX_REQUEST_BYTES, JSON-escaped (up to 6x for
# control characters); longer lines are refused by the SDK's parser anyway.
LINE_LIMIT = 32 * 1024 * 1024


class _Lines:
    """``async for line in stdin`` as the SDK's reader expects (text lines, newline included)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self.reader.readline()
            except ValueError:
                # an over-long line: drop it up to its newline; the peer gets no reply for it
                # (as with any unparseable line), the session goes on
                try:
                    await self.reader.readuntil(b"\n")
                except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                    pass
                continue
            if not line:
                raise StopAsyncIteration
            return line.decode("utf-8", "replace")


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
        yield _Lines(reader), _Writer(writer)
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
        transport.close()

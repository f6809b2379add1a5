"""The client core: what every program that talks to the storage daemon does around a request.

The MCP front-end, the ``convmem`` CLI and the transcript ingester all hold one ``Daemon``: the
transport (``transport.DaemonClient``) and, unless told not to spawn, a ``spawn.Spawner``. A call
first makes sure a daemon answers (starting one for the data dir if none does; one that cannot start
at all is an IO_ERROR in its own words), then sends the request under the caller's request id or a
new one, and when no daemon answered tells the spawner to look again before the next call. The caller
says which kinds of reply (``replies.Kind``) it waits out and sends again — the CLI a busy daemon, the
ingester a busy or an absent one, the front-end none (its host decides) — and whether a daemon that
died while a reply was awaited is replaced at once and the request sent to its successor (the
front-end's choice). ``rebuild_index`` answers REBUILDING at once; the core then polls
``rebuild_status`` until the figures are in, reporting progress to an optional callback; cancelling
the call stops the polling (the daemon finishes the rebuild on its own). Nothing here knows MCP.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from protocol import errors as E
from protocol import limits as L
from protocol.config import default_data_dir, default_endpoint
from protocol.wire import REBUILDING

from .replies import NO_RETRY, Kind, is_unavailable, kind, retry_after_s
from .spawn import Spawner
from .transport import DEFAULT_TIMEOUT_S, DaemonClient, identity_data_dir, new_request_id

log = logging.getLogger(__name__)

REBUILD_POLL_S = 0.05
REBUILD_MAX_S = 30 * 60.0
PROGRESS_EVERY_S = 0.25  # at most this often a progress report while a rebuild runs

# (progress so far, total or None, message): the shape of MCP's progress notification, which the
# front-end passes straight in; any other caller may pass any coroutine function of that shape.
Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class Daemon:
    """The storage daemon as its clients see it. ``call`` and ``send`` never raise (except cancellation)."""

    def __init__(self, client: DaemonClient, spawner: Spawner | None = None, *, data_dir: str | None = None,
                 rebuild_max_s: float = REBUILD_MAX_S) -> None:
        self.client = client
        self.spawner = spawner
        self.data_dir = data_dir
        self.rebuild_max_s = rebuild_max_s

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    def close(self) -> None:
        self.client.close()

    async def ensure(self) -> dict[str, Any] | None:
        """None when a request may go (a daemon answers, or none could be started this time: the
        request then says "unavailable"); the IO_ERROR to answer instead when the daemon cannot start."""
        return await self.spawner.ensure_or_error() if self.spawner is not None else None

    async def call(self, op: str, args: dict[str, Any], request_id: str | None = None, *,
                   retry: frozenset[Kind] = NO_RETRY, known: frozenset[str] = frozenset(),
                   context: dict[str, Any] | None = None, revive: bool = False,
                   progress: Progress | None = None) -> dict[str, Any]:
        """``ensure``, then ``send``; while the reply is of a kind in ``retry``, wait its retry_after_ms
        and do both again (each time under ``request_id``, or a new id when none was given)."""
        while True:
            reply = await self.ensure()
            if reply is None:
                reply = await self.send(op, args, request_id, known=known, context=context, revive=revive,
                                        progress=progress)
            if kind(reply) not in retry:
                return reply
            await asyncio.sleep(retry_after_s(reply))

    async def send(self, op: str, args: dict[str, Any], request_id: str | None = None, *,
                   known: frozenset[str] = frozenset(), context: dict[str, Any] | None = None,
                   revive: bool = False, progress: Progress | None = None) -> dict[str, Any]:
        """One request (for rebuild_index: until its figures are in). ``known``: the argument names an
        encoding error may quote; ``context``: what the caller adds beside the arguments (the launch
        directory of history tools); ``revive``: replace a daemon that dies while the reply is awaited
        and send again to its successor."""
        rid = request_id or new_request_id()
        if op == "rebuild_index":
            reply = await self._rebuild(args, rid, known, progress)
        else:
            watch = self.spawner.revive_if_gone if revive and self.spawner is not None else None
            reply = await self.client.request(op, args, rid, known=known, context=context, watch=watch)
        if self.spawner is not None and is_unavailable(reply):
            self.spawner.invalidate()
        return reply

    async def _rebuild(self, arguments: dict[str, Any], rid: str, known: frozenset[str],
                       progress: Progress | None) -> dict[str, Any]:
        """rebuild_index answers REBUILDING at once; poll rebuild_status until the final figures.

        While it waits it reports progress (when given a callback): once as soon as the daemon has
        started, then every ``PROGRESS_EVERY_S`` — the daemon reports no fraction, so ``progress`` counts
        the reports and the message carries the elapsed time. A cancelled call stops polling at once and
        answers nothing; the daemon finishes the rebuild on its own (it has no way to stop one for a
        client), so its result stays known under the request id and get_system_health shows
        ``rebuilding`` until then."""
        t0 = time.monotonic()
        deadline = t0 + self.rebuild_max_s
        sent = 0
        last = -PROGRESS_EVERY_S
        try:
            reply = await self.client.request("rebuild_index", arguments, rid, known=known)
            while reply.get("status") == REBUILDING:
                now = time.monotonic()
                if progress is not None and now - last >= PROGRESS_EVERY_S:
                    try:
                        await progress(float(sent), None, f"rebuild_index running ({now - t0:.1f} s)")
                    except Exception:  # a transport that cannot carry it: the rebuild's answer still counts
                        log.debug("could not send a progress notification", exc_info=True)
                        progress = None
                    sent += 1
                    last = now
                if now > deadline:
                    return E.error_reply(E.BUSY, "rebuild_index is still running; see get_system_health",
                                         L.BUSY_RETRY_AFTER_MS)
                rebuild_id = reply.get("rebuild_id")
                if not isinstance(rebuild_id, str):
                    rebuild_id = rid
                await asyncio.sleep(REBUILD_POLL_S)
                status = await self.client.request("rebuild_status", {"rebuild_id": rebuild_id})
                if kind(status) is Kind.NOT_FOUND:
                    # The daemon restarted and forgot the rebuild: ask again under the same request id,
                    # which either starts it again or answers with the result it recorded.
                    reply = await self.client.request("rebuild_index", arguments, rid, known=known)
                else:
                    reply = status
        except asyncio.CancelledError:
            log.info("rebuild_index %s: the client cancelled the call; stopped waiting (the daemon finishes "
                     "the rebuild on its own)", rid)
            raise
        return reply


def connect(data_dir: str | None = None, endpoint: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
            curve_server_key: bytes | None = None, curve_client_keys: tuple[bytes, bytes] | None = None,
            spawn: bool = True) -> Daemon:
    """The daemon of ``data_dir`` (as named by an option; None: $CONVMEM_DATA_DIR, else the XDG default)
    at ``endpoint`` (None: $CONVMEM_ENDPOINT, else the data dir's own socket), with a spawner unless
    ``spawn`` is False. A data dir that was named, or the data dir's own endpoint, makes the transport
    refuse a daemon serving another store (``transport.IdentityCheck``)."""
    where = os.path.abspath(data_dir or default_data_dir())
    endpoint = endpoint or default_endpoint(where)
    client = DaemonClient(endpoint, timeout=timeout, curve_server_key=curve_server_key,
                          curve_client_keys=curve_client_keys,
                          expected_data_dir=identity_data_dir(data_dir, endpoint, where))
    return Daemon(client, Spawner(client, where, endpoint) if spawn else None, data_dir=where)

"""The MCP server: tools/list from ``tools``, tools/call forwarded to the storage daemon.

The front-end holds no memory data and re-validates nothing: the daemon validates every argument
(``protocol.validation``) and its reply is the tool's result object. This module only turns that
object into an MCP result (JSON text + structuredContent, isError iff status is ERROR), and makes
sure that every failure of its own also comes back in the contract's error shape.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from protocol import errors as E
from protocol import limits as L
from protocol.wire import REBUILDING, TOOLS

from . import __version__
from .client import DaemonClient, is_unavailable, new_request_id
from .spawn import Spawner
from .tools import INPUT_SCHEMAS, TOOL_LIST

log = logging.getLogger(__name__)

REBUILD_POLL_S = 0.05
REBUILD_MAX_S = 30 * 60.0
INTERNAL_MESSAGE = "internal error in the MCP front-end"

INSTRUCTIONS = (
    "convmem is a durable conversation memory shared by every MCP host on this machine. Remember with "
    "write_message (metadata_json classifies: tags, memory_kind, importance, summary, relations). Recall "
    "narrow-to-wide: search_messages first, then read_messages view='context' around a hit or "
    "view='content' for a long message; view='history' and view='sessions' browse. Results are JSON; "
    "errors are {status:ERROR, error:{code, message}}, BUSY ones with retry_after_ms."
)


class Backend:
    """Runs one tool call against the daemon. ``call`` never raises (except cancellation)."""

    def __init__(self, client: DaemonClient, spawner: Spawner | None = None,
                 rebuild_max_s: float = REBUILD_MAX_S) -> None:
        self.client = client
        self.spawner = spawner
        self.rebuild_max_s = rebuild_max_s

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.spawner is not None:
            await self.spawner.ensure()
        known = frozenset(INPUT_SCHEMAS[name]["properties"])
        rid = new_request_id()
        if name == "rebuild_index":
            reply = await self._rebuild(arguments, rid, known)
        else:
            reply = await self.client.request(name, arguments, rid, known=known)
        if self.spawner is not None and is_unavailable(reply):
            self.spawner.invalidate()
        return reply

    async def _rebuild(self, arguments: dict[str, Any], rid: str, known: frozenset[str]) -> dict[str, Any]:
        """rebuild_index answers REBUILDING at once; poll rebuild_status until the final figures."""
        deadline = time.monotonic() + self.rebuild_max_s
        reply = await self.client.request("rebuild_index", arguments, rid, known=known)
        while reply.get("status") == REBUILDING:
            if time.monotonic() > deadline:
                return E.error_reply(E.BUSY, "rebuild_index is still running; see get_system_health",
                                     L.BUSY_RETRY_AFTER_MS)
            rebuild_id = reply.get("rebuild_id")
            if not isinstance(rebuild_id, str):
                rebuild_id = rid
            await asyncio.sleep(REBUILD_POLL_S)
            status = await self.client.request("rebuild_status", {"rebuild_id": rebuild_id})
            if _is_not_found(status):
                # The daemon restarted and forgot the rebuild: ask again under the same request id,
                # which either starts it again or answers with the result it recorded.
                reply = await self.client.request("rebuild_index", arguments, rid, known=known)
            else:
                reply = status
        return reply


def _is_not_found(reply: dict[str, Any]) -> bool:
    if reply.get("status") == "NOT_FOUND":
        return True
    err = reply.get("error")
    return E.is_error_reply(reply) and isinstance(err, dict) and err.get("code") == E.NOT_FOUND


def to_result(reply: Any) -> types.CallToolResult:
    """The contract's result object as an MCP tool result: JSON text + the same structuredContent."""
    try:
        if not isinstance(reply, dict):
            raise TypeError("reply is not an object")
        text = json.dumps(reply, ensure_ascii=False, allow_nan=False)
    except Exception:
        log.exception("could not serialise a tool result")
        reply = E.error_reply(E.INTERNAL_ERROR, INTERNAL_MESSAGE)
        text = json.dumps(reply, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=reply,
        is_error=reply.get("status") == "ERROR",
    )


def build_server(backend: Backend) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOL_LIST)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.ErrorData:
        name = params.name
        if name not in TOOLS:
            # Not a tool result: MCP says an unknown tool is a JSON-RPC error. The name is not echoed.
            return types.ErrorData(code=types.INVALID_PARAMS,
                                   message="Unknown tool; tools/list gives the available tools")
        try:
            reply = await backend.call(name, params.arguments or {})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tool %s failed in the front-end", name)
            reply = E.error_reply(E.INTERNAL_ERROR, INTERNAL_MESSAGE)
        return to_result(reply)

    return Server(
        "convmem",
        version=__version__,
        title="convmem conversation memory",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )

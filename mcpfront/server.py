"""The MCP server: tools/list from ``tools``, tools/call forwarded to the storage daemon through the
daemon client (``daemonclient.core.Daemon``: spawn, request ids, retries, rebuild polling live there).

The front-end holds no memory data and re-validates nothing: the daemon validates every argument
(``protocol``) and its reply is the tool's result. This module only turns that into an MCP result —
for the memory tools the contract's JSON as text and as structuredContent (isError iff status is
ERROR); for the history tools the interface's envelope as structuredContent with a short text
summary — and makes sure every failure of its own also comes back in its family's error shape.
For file_attention it adds what only a process on the client's side knows: where it was launched.
Resources (past sessions), prompts and completion are in ``resources`` and ``prompts``; this module
registers them and turns their failures into JSON-RPC errors. While the daemon client waits for a
rebuild_index, this module turns its progress reports into MCP progress notifications; a cancelled call
stops the waiting.
"""
from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import time
import warnings
from urllib.parse import unquote, urlparse
from typing import Any, Awaitable, Callable

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from daemonclient.core import Daemon, Progress
from ingest.workspace import launch_context
from protocol import errors as E
from protocol import history as H
from protocol.errors import ProtocolError
from protocol.validation import take_request_id
from protocol.wire import HISTORY_TOOLS

from . import __version__
from . import history_tools as HT
from . import prompts as P
from . import resources as R
from .tools import FAMILIES, FAMILY_DEFAULT, INPUT_SCHEMAS, tool_list

log = logging.getLogger(__name__)

ROOTS_TIMEOUT_S = 2.0
INTERNAL_MESSAGE = "internal error in the MCP front-end"

INSTRUCTIONS = {
    "memory": (
        "convmem is a durable conversation memory shared by every MCP host on this machine. Remember with "
        "write_message (metadata_json classifies: tags, memory_kind, importance, summary, relations). Recall "
        "narrow-to-wide: search_messages first, then read_messages view='context' around a hit or "
        "view='content' for a long message; view='history' and view='sessions' browse. Results are JSON; "
        "errors are {status:ERROR, error:{code, message}}, BUSY ones with retry_after_ms."),
    "history": (
        "convmem keeps the history of agent sessions (Claude Code, Codex, Gemini CLI transcripts, tool calls and "
        "outputs included, and every message written to memory) as sessions -> turns -> events. Navigate it "
        "narrow-to-wide: search_sessions returns short snippets with open handles; open an event id for the exact "
        "text, a turn or session id for a bounded summary (add limit to page through it); list_sessions browses by "
        "time; file_attention finds every session that touched a file; get_ingest_status says whether ingestion "
        "is complete. Pass ids back exactly as returned."),
}
INSTRUCTIONS["all"] = (
    INSTRUCTIONS["memory"] + " " + INSTRUCTIONS["history"] + " Which family: write, update and delete memories, "
    "and recall what was explicitly remembered, with the memory tools; find what happened in past agent sessions "
    "(what was asked, decided, run, printed, which files were touched) with the history tools, which return "
    "pointers instead of whole messages.")


# How the running tools/call reports progress (``ctx.session.report_progress``: a no-op unless the caller
# sent a progressToken), handed to the daemon client's rebuild polling. A context variable rather than an
# argument of ``Backend.call``: each request runs in its own task, and only the rebuild polling needs it.
PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("convmem_progress", default=None)


class Backend:
    """Runs one tool call against the daemon (``daemonclient.core.Daemon``), adding what is MCP's: the
    host-given request_id taken out of the tool's arguments, the argument names a message may quote,
    the client's launch context for history tools, progress notifications for rebuild_index, and the
    history envelope. ``call`` never raises (except cancellation)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def call(self, name: str, arguments: dict[str, Any], launch_dir: str | None = None) -> dict[str, Any]:
        """The tool's result: the memory contract's reply, or a history envelope. ``launch_dir`` is where
        the client runs (file_attention resolves paths and the project from it)."""
        t0 = time.perf_counter()
        reply = await self.daemon.ensure()
        if reply is None:
            reply = await self._dispatch(name, arguments, launch_dir)
        if name in HISTORY_TOOLS:
            return HT.envelope(name, arguments, reply, (time.perf_counter() - t0) * 1000)
        return reply

    async def _dispatch(self, name: str, arguments: dict[str, Any], launch_dir: str | None) -> dict[str, Any]:
        known = frozenset(INPUT_SCHEMAS[name]["properties"])
        try:
            arguments, host_rid = take_request_id(name, arguments)
        except ProtocolError as exc:
            return exc.reply()
        context = None
        if name in H.LAUNCH_CONTEXT_TOOLS:
            context = await asyncio.to_thread(self._launch_context, arguments, launch_dir)
        return await self.daemon.send(name, arguments, host_rid, known=known, context=context, revive=True,
                                      progress=PROGRESS.get())

    @staticmethod
    def _launch_context(arguments: Any, launch_dir: str | None) -> dict[str, Any] | None:
        """The client's launch project and what the requested path is relative to it (None when the path
        is not a usable string: the daemon's validation then says why)."""
        path = arguments.get("path") if isinstance(arguments, dict) else None
        if not isinstance(path, str) or not path.strip() or path != path.strip() or "\x00" in path \
                or len(path) > H.PATH_MAX_BYTES:
            return None
        try:
            return launch_context(path, launch_dir)
        except (OSError, ValueError):
            return None


def to_result(reply: Any, name: str | None = None) -> types.CallToolResult:
    """A tool's result object as an MCP tool result. Memory tools: the contract's JSON as text and the
    same object as structuredContent. History tools: the envelope, with a short text summary."""
    history = name in HISTORY_TOOLS
    try:
        if not isinstance(reply, dict):
            raise TypeError("reply is not an object")
        if history:
            json.dumps(reply, ensure_ascii=False, allow_nan=False)  # serialisable, or an internal error
            text = HT.render_text(reply)
        else:
            text = json.dumps(reply, ensure_ascii=False, allow_nan=False)
    except Exception:
        log.exception("could not serialise a tool result")
        reply = E.error_reply(E.INTERNAL_ERROR, INTERNAL_MESSAGE)
        if history:
            reply = HT.envelope(name, {}, reply, 0.0)
            text = HT.render_text(reply)
        else:
            text = json.dumps(reply, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=reply,
        is_error=HT.is_error(reply) if history else reply.get("status") == "ERROR",
    )


async def client_launch_dir(ctx: ServerRequestContext[Any], local: str | None) -> str | None:
    """Where the client runs: the first ``file://`` root it declares (the way an MCP client tells a server
    its workspace; asked only of clients that have the roots capability), else ``local`` — the
    front-end's own working directory for a stdio server, which its host starts there; nothing for
    HTTP, which may serve clients from anywhere."""
    session = ctx.session
    try:
        caps = session.client_params.capabilities if session.client_params is not None else None
        if caps is not None and caps.roots is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # roots are deprecated in the newest protocol, not gone
                result = await asyncio.wait_for(session.list_roots(), ROOTS_TIMEOUT_S)
            for root in result.roots:
                uri = str(root.uri)
                if uri.startswith("file://"):
                    path = unquote(urlparse(uri).path)
                    if os.path.isabs(path):
                        return os.path.normpath(path)
    except (asyncio.TimeoutError, Exception):  # a client that does not answer: fall back
        log.debug("could not list the client's roots", exc_info=True)
    return local


def build_server(backend: Backend, family: str = FAMILY_DEFAULT, local_launch_dir: str | None = None) -> Server[Any]:
    """``local_launch_dir``: the launch directory to assume for clients that declare no roots (stdio:
    the working directory the host started this process in)."""
    tools = tool_list(family)
    names = frozenset(FAMILIES[family])

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.ErrorData:
        name = params.name
        if name not in names:
            # Not a tool result: MCP says an unknown tool is a JSON-RPC error. The name is not echoed.
            return types.ErrorData(code=types.INVALID_PARAMS,
                                   message="Unknown tool; tools/list gives the available tools")
        try:
            launch = await client_launch_dir(ctx, local_launch_dir) if name in H.LAUNCH_CONTEXT_TOOLS else None
            PROGRESS.set(ctx.session.report_progress)  # this request's task only
            reply = await backend.call(name, params.arguments or {}, launch)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tool %s failed in the front-end", name)
            reply = E.error_reply(E.INTERNAL_ERROR, INTERNAL_MESSAGE)
            if name in HISTORY_TOOLS:
                reply = HT.envelope(name, params.arguments, reply, 0.0)
        return to_result(reply, name)

    prompt_specs = P.prompts_for(names)

    async def read_daemon(op: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await backend.call(op, arguments)

    async def guarded(what: str, work: Callable[[], Awaitable[Any]]) -> Any:
        """A resource/prompt/completion failure as a JSON-RPC error with a clear message: ours as they
        are (they name the field and the constraint), anything unexpected as a generic one (logged, never
        a traceback or the input on the wire)."""
        try:
            return await work()
        except asyncio.CancelledError:
            raise
        except (R.ResourceError, P.PromptError) as exc:
            return types.ErrorData(code=exc.code, message=exc.message)
        except Exception:
            log.exception("%s failed in the front-end", what)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=INTERNAL_MESSAGE)

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult | types.ErrorData:
        return await guarded("resources/list", lambda: R.list_resources(read_daemon))

    async def list_resource_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                                      ) -> types.ListResourceTemplatesResult:
        return R.list_templates()

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult | types.ErrorData:
        return await guarded("resources/read", lambda: R.read_session(read_daemon, str(params.uri)))

    async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                           ) -> types.ListPromptsResult:
        return P.list_prompts(prompt_specs)

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
                         ) -> types.GetPromptResult | types.ErrorData:
        async def work() -> types.GetPromptResult:
            return P.get_prompt(prompt_specs, params.name, params.arguments)
        return await guarded("prompts/get", work)

    async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
                       ) -> types.CompleteResult | types.ErrorData:
        ref, arg = params.ref, params.argument
        if isinstance(ref, types.ResourceTemplateReference):
            wanted = ref.uri == R.TEMPLATE and arg.name == "session_id"
        else:
            wanted = P.completes_session_id(prompt_specs, ref.name, arg.name)
        if not wanted:
            return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))

        async def work() -> types.CompleteResult:
            return types.CompleteResult(completion=await R.complete_session_id(read_daemon, arg.value))
        return await guarded("completion/complete", work)

    return Server(
        "convmem",
        version=__version__,
        title="convmem conversation memory",
        instructions=INSTRUCTIONS[family],
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
    )

"""``convmem-mcp``: the MCP server an MCP host launches (stdio), or an HTTP one with ``--http``.

Stdout belongs to the MCP protocol in stdio mode: every log line goes to stderr, and nothing is
printed at import.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from protocol import config
from protocol import limits as L

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8765
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")

log = logging.getLogger("mcpfront")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .client import DEFAULT_TIMEOUT_S

    p = argparse.ArgumentParser(prog="convmem-mcp", description="convmem MCP server (stdio by default).")
    p.add_argument("--data-dir", help="data directory (default: $CONVMEM_DATA_DIR, else $XDG_DATA_HOME/convmem)")
    p.add_argument("--endpoint", help="daemon endpoint (default: $CONVMEM_ENDPOINT, else an ipc:// socket in "
                                      "the data dir's run/ directory)")
    p.add_argument("--no-spawn", action="store_true", help="never start a storage daemon (e.g. under supervisord)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds to wait for the daemon per attempt (default %(default)s)")
    p.add_argument("--tools", choices=("memory", "history", "all"), default="all",
                   help="which tools to serve: memory (the seven memory tools), history (the five read-only "
                        "agent-history tools) or all twelve (default)")
    p.add_argument("--http", action="store_true", help="serve MCP streamable HTTP at /mcp instead of stdio")
    p.add_argument("--host", default=DEFAULT_HTTP_HOST, help="HTTP bind address (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT, help="HTTP port (default %(default)s)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="with --http: another Host name to accept (DNS-rebinding protection accepts only "
                        "loopback names and the bind address otherwise); repeatable")
    p.add_argument("--curve-server-key-file", help="the daemon's CURVE public key, for a tcp:// endpoint "
                                                   "(default: $CONVMEM_CURVE_SERVER_KEY_FILE)")
    p.add_argument("--log-level", default=os.environ.get("CONVMEM_LOG_LEVEL", "WARNING"),
                   help="log level for stderr (default WARNING)")
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    from .client import read_curve_server_key

    try:
        args.curve_server_key = read_curve_server_key(args.curve_server_key_file)
    except (OSError, ValueError) as exc:
        p.error(f"--curve-server-key-file: {getattr(exc, 'strerror', None) or exc}")
    return args


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s convmem-mcp %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        root.setLevel(logging.WARNING)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def transport_security(host: str, extra: list[str]) -> Any:
    """Host/Origin checks for whatever address is bound (the SDK only turns them on for loopback)."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = list(_LOOPBACK_NAMES)
    if host not in _WILDCARD_HOSTS:
        names.append(_bracket(host))
    names.extend(_bracket(h) for h in extra)
    names = list(dict.fromkeys(names))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names],
        allowed_origins=[f"{scheme}://{n}:*" for n in names for scheme in ("http", "https")],
    )


async def _run(args: argparse.Namespace) -> None:
    import anyio

    from .client import DaemonClient
    from .server import Backend, build_server
    from .spawn import Spawner

    data_dir = os.path.abspath(args.data_dir) if args.data_dir else config.default_data_dir()
    endpoint = args.endpoint or config.default_endpoint(data_dir)
    client = DaemonClient(endpoint, timeout=args.timeout, curve_server_key=args.curve_server_key)
    spawner = None if args.no_spawn else Spawner(client, data_dir, endpoint)
    # stdio: the host started this process in its project; HTTP: clients must say (MCP roots)
    server = build_server(Backend(client, spawner), args.tools, None if args.http else os.getcwd())
    try:
        async with anyio.create_task_group() as tg:
            if spawner is not None:
                # In the background: initialize and tools/list must not wait for a daemon.
                tg.start_soon(spawner.ensure)
            if args.http:
                await _serve_http(server, args)
            else:
                from mcp.server.stdio import stdio_server

                from .stdio import native_stdio

                async with native_stdio() as native:
                    stdin, stdout = native if native is not None else (None, None)
                    async with stdio_server(stdin, stdout) as (read, write):
                        await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        client.close()


async def _serve_http(server: Any, args: argparse.Namespace) -> None:
    import uvicorn

    if args.host in _WILDCARD_HOSTS:
        log.warning("listening on all interfaces; only loopback Host names and --allow-host are accepted")
    app = server.streamable_http_app(
        host=args.host,
        transport_security=transport_security(args.host, args.allow_host),
        # A request may carry a full-size content with JSON escaping: allow what the wire allows, twice.
        max_request_body_size=2 * L.MAX_REQUEST_BYTES,
    )
    cfg = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, access_log=False,
                         server_header=False, lifespan="on")
    await uvicorn.Server(cfg).serve()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    import anyio

    if args.http:
        # uvicorn shuts down gracefully on SIGTERM, then restores the previous handler and raises the
        # signal again; with this (no-op) handler in place the process then ends normally, exit 0,
        # as supervisord expects of a clean stop.
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        anyio.run(_run, args, backend="asyncio")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

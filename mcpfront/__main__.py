"""``convmem-mcp``: the MCP server an MCP host launches (stdio), or an HTTP one with ``--http``.

Stdout belongs to the MCP protocol in stdio mode: every log line goes to stderr, and nothing is
printed at import.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from typing import Any

from protocol import config
from protocol import limits as L

from .auth import BearerTokenMiddleware, TokenFileError, is_loopback_host, load_or_create_token

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8765
EXIT_CANNOT_LISTEN = 4
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")

log = logging.getLogger("mcpfront")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from daemonclient.transport import DEFAULT_TIMEOUT_S

    p = argparse.ArgumentParser(prog="convmem-mcp", description="convmem MCP server (stdio by default).",
                                epilog=f"exit status: 0 stopped cleanly, 2 bad command line or configuration, "
                                       f"{EXIT_CANNOT_LISTEN} cannot listen (--http: address in use or not "
                                       f"allowed), 130 interrupted")
    p.add_argument("--data-dir", help=config.DATA_DIR_HELP)
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
    p.add_argument("--http-token-file", metavar="PATH",
                   help="with --http: the file of the bearer token clients must send (default: "
                        "$CONVMEM_HTTP_TOKEN_FILE, else DATA_DIR/http-token; created 0600 on first start)")
    p.add_argument("--no-auth", action="store_true",
                   help="with --http on a loopback address only: accept requests without a bearer token")
    p.add_argument("--print-token", action="store_true",
                   help="print the HTTP bearer token (creating its file if needed) to stdout and exit")
    p.add_argument("--curve-server-key-file", help="the daemon's CURVE public key, for a tcp:// endpoint "
                                                   "(default: $CONVMEM_CURVE_SERVER_KEY_FILE)")
    p.add_argument("--curve-client-key-file",
                   help="this client's CURVE key pair (a zmq.auth secret-key certificate), whose public key "
                        "is in the daemon's allow-list (default: $CONVMEM_CURVE_CLIENT_KEY_FILE)")
    p.add_argument("--log-level", default=os.environ.get("CONVMEM_LOG_LEVEL", "WARNING"),
                   help="log level for stderr (default WARNING)")
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    from daemonclient.transport import read_curve_client_keys, read_curve_server_key

    try:
        args.curve_server_key = read_curve_server_key(args.curve_server_key_file)
    except (OSError, ValueError) as exc:
        p.error(f"--curve-server-key-file: {getattr(exc, 'strerror', None) or exc}")
    try:
        args.curve_client_keys = read_curve_client_keys(args.curve_client_key_file)
    except (OSError, ValueError) as exc:
        p.error(f"--curve-client-key-file: {getattr(exc, 'strerror', None) or exc}")
    if args.no_auth and args.http and not is_loopback_host(args.host):
        p.error(f"--no-auth is allowed only on a loopback bind address, not {args.host!r}: anyone who can "
                f"reach the port could read and change the memory")
    args.data_dir = os.path.abspath(args.data_dir) if args.data_dir else None
    return args


def http_token(args: argparse.Namespace, data_dir: str) -> str | None:
    """The bearer token HTTP clients must send (None with --no-auth); says on stderr where it is."""
    if args.no_auth and not args.print_token:
        print("convmem-mcp: --no-auth: HTTP requests are not authenticated (loopback bind only)", file=sys.stderr)
        return None
    path = os.path.abspath(args.http_token_file or os.environ.get(config.ENV_HTTP_TOKEN_FILE)
                           or config.http_token_path(data_dir))
    token, created = load_or_create_token(path)
    if not args.print_token:
        print(f"convmem-mcp: HTTP clients must send 'Authorization: Bearer <token>'; the token is in {path}"
              f"{' (created now)' if created else ''}", file=sys.stderr)
    return token


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


async def _run(args: argparse.Namespace, token: str | None = None, listener: Any = None) -> None:
    import anyio

    from daemonclient.core import connect

    from .server import Backend, build_server

    daemon = connect(args.data_dir, args.endpoint, timeout=args.timeout, curve_server_key=args.curve_server_key,
                     curve_client_keys=args.curve_client_keys, spawn=not args.no_spawn)
    # stdio: the host started this process in its project; HTTP: clients must say (MCP roots)
    server = build_server(Backend(daemon), args.tools, None if args.http else os.getcwd())
    try:
        async with anyio.create_task_group() as tg:
            if daemon.spawner is not None:
                # In the background: initialize and tools/list must not wait for a daemon.
                tg.start_soon(daemon.spawner.ensure)
            if args.http:
                await _serve_http(server, args, token, listener)
            else:
                from mcp.server.stdio import stdio_server

                from .stdio import native_stdio

                async with native_stdio() as native:
                    stdin, stdout = native if native is not None else (None, None)
                    async with stdio_server(stdin, stdout) as (read, write):
                        await server.run(read, write, server.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        daemon.close()


_uvicorn_serving = False


def _on_sigterm(*_: Any) -> None:
    """SIGTERM with --http. Once uvicorn serves it handles SIGTERM itself (a graceful shutdown), then
    restores this handler and raises the signal again: ignored then, so the process ends normally, exit
    0, as supervisord expects of a clean stop. Before that (the port already listens while the process
    starts) it is a stop at once, also exit 0: ``os._exit``, since nothing has been served, and an
    exception raised wherever the signal lands is not always one: inside an import (anyio's backend,
    a class body's ``__set_name__``) SystemExit came out as a RuntimeError, exit 1, once in 40 tries."""
    if not _uvicorn_serving:
        sys.stderr.flush()
        os._exit(0)


def http_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts: an address in use is then one clear line
    and exit status EXIT_CANNOT_LISTEN, not uvicorn's exit from inside a task group."""
    family, kind, proto, _, addr = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def _serve_http(server: Any, args: argparse.Namespace, token: str | None, listener: Any = None) -> None:
    import uvicorn

    if args.host in _WILDCARD_HOSTS:
        log.warning("listening on all interfaces; only loopback Host names and --allow-host are accepted")
    # the token (and Host/peer) check runs before the SDK sees anything
    app = BearerTokenMiddleware(server.streamable_http_app(
        host=args.host,
        transport_security=transport_security(args.host, args.allow_host),
        # A request may carry a full-size content with JSON escaping: allow what the wire allows, twice.
        max_request_body_size=2 * L.MAX_REQUEST_BYTES,
    ), token)
    cfg = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, access_log=False,
                         server_header=False, lifespan="on")
    global _uvicorn_serving
    _uvicorn_serving = True  # uvicorn's own SIGTERM handler goes in before serve() first yields
    await uvicorn.Server(cfg).serve(sockets=[listener] if listener is not None else None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    token = None
    if args.http or args.print_token:
        try:
            token = http_token(args, args.data_dir or config.default_data_dir())
        except (OSError, TokenFileError) as exc:
            why = f"cannot use the HTTP token file: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
            print(f"convmem-mcp: {why}", file=sys.stderr)
            return 2
        if args.print_token:
            print(token)
            return 0
    import anyio

    if args.http:
        signal.signal(signal.SIGTERM, _on_sigterm)
    listener = None
    if args.http:
        try:
            listener = http_listener(args.host, args.port)
        except OSError as exc:
            print(f"convmem-mcp: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (another server "
                  f"there? choose another with --port)", file=sys.stderr)
            return EXIT_CANNOT_LISTEN
        host = _bracket(args.host) if args.host not in _WILDCARD_HOSTS else "127.0.0.1"
        print(f"convmem-mcp: serving MCP (streamable HTTP) at http://{host}:{args.port}/mcp"
              f"{'' if token is None else ' (bearer token required)'}; Ctrl-C stops it", file=sys.stderr)
    try:
        anyio.run(_run, args, token, listener, backend="asyncio")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Access control of the HTTP front-end: a bearer token, checked before the MCP SDK sees a request.

Why not the SDK's own pieces (``BearerAuthBackend`` + ``RequireAuthMiddleware`` via
``streamable_http_app(auth=..., token_verifier=...)``): they need ``AuthSettings`` with an OAuth
``issuer_url``, i.e. an authorization server we do not have, and they only wrap the ``/mcp`` route.
A static secret shared through a 0600 file is what a single-user local service needs; the wire
format is the same MCP/OAuth one (``Authorization: Bearer <token>``; 401 with
``WWW-Authenticate: Bearer error="invalid_token"`` and a small JSON body, like the SDK's).

The middleware wraps the whole Starlette app, so every HTTP path is covered, and it also refuses a
request whose ``Host`` names a loopback address but which did not come from a loopback peer: on a
wildcard or LAN bind a remote client could otherwise forge ``Host: 127.0.0.1`` past the SDK's
DNS-rebinding check (which only compares the header with an allow-list).
"""
from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import os
import secrets
import stat
import time
from typing import Any, Awaitable, Callable

TOKEN_BYTES = 32
TOKEN_MIN_CHARS = 16
_READ_RETRIES = 50      # a token file being written by a concurrent first start is empty for a moment
_READ_PAUSE_S = 0.02

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class TokenFileError(Exception):
    """The token file cannot be used (the message says why; it never contains the token)."""


def load_or_create_token(path: str) -> tuple[str, bool]:
    """(token, created). Creates the file on first use (O_EXCL|O_NOFOLLOW, 0600, 32 random bytes,
    URL-safe); refuses a symlink, a non-regular file, a file of another user, one that group or others
    may read or write, and one holding fewer than 16 characters."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return _read_token(path), False
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return token, True


def _read_token(path: str) -> str:
    for _ in range(_READ_RETRIES):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise TokenFileError(f"the token file {path} is a symbolic link; refusing it") from None
            raise TokenFileError(f"cannot read the token file {path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TokenFileError(f"the token file {path} is not a regular file")
            if st.st_uid != os.getuid():
                raise TokenFileError(f"the token file {path} belongs to another user")
            if st.st_mode & 0o077:
                raise TokenFileError(f"the token file {path} is accessible to other users "
                                     f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
            token = os.read(fd, 4096).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
        if token:
            if len(token) < TOKEN_MIN_CHARS or any(c.isspace() for c in token):
                raise TokenFileError(f"the token file {path} must hold one token of at least "
                                     f"{TOKEN_MIN_CHARS} characters without spaces")
            return token
        time.sleep(_READ_PAUSE_S)  # created a moment ago by another process, not yet written
    raise TokenFileError(f"the token file {path} is empty")


def is_loopback_host(name: str) -> bool:
    """True for 'localhost' and loopback IP literals (brackets allowed)."""
    name = name.strip().lower().strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The name part of a Host header ('[::1]:8765' -> '::1', 'a:80' -> 'a')."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class BearerTokenMiddleware:
    """ASGI middleware: HTTP requests need ``Authorization: Bearer <token>`` (constant-time compare);
    a loopback Host name is accepted only from a loopback peer. ``token`` None turns the token check
    off (``--no-auth``, loopback binds only); the Host/peer check stays."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._expected = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") == "websocket":  # no route speaks it; refuse before any check could matter
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope.get("type") != "http":
            await self.app(scope, receive, send)  # lifespan
            return
        headers = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k.lower(), v)
        peer = (scope.get("client") or ("", 0))[0] or ""
        host = headers.get(b"host", b"").decode("latin-1")
        if is_loopback_host(_host_name(host)) and not is_loopback_host(peer):
            await _send(send, 421, {"error": "invalid_host",
                                    "error_description": "a loopback Host name from a non-loopback peer"})
            return
        if self._expected is not None and not self._authorized(headers.get(b"authorization", b"")):
            await _send(send, 401, {"error": "invalid_token", "error_description": "Authentication required"},
                        www_authenticate=b'Bearer error="invalid_token", '
                                         b'error_description="Authentication required"')
            return
        await self.app(scope, receive, send)

    def _authorized(self, value: bytes) -> bool:
        scheme, _, given = value.partition(b" ")
        if scheme.lower() != b"bearer":
            given = b""
        # compare_digest takes time independent of where the first difference is
        return hmac.compare_digest(given.strip(), self._expected)


async def _send(send: Any, status: int, body: dict[str, str], www_authenticate: bytes | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if www_authenticate is not None:
        headers.append((b"www-authenticate", www_authenticate))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})

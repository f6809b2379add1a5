"""The transport: one request to the storage daemon, one reply, never a hang.

The lowest layer of ``daemonclient`` (``replies`` say what a reply means, ``spawn`` starts a daemon,
``core`` puts them together for every program that talks to the daemon). A call takes an idle
connected REQ socket or opens one, so concurrent calls really run concurrently (one REQ socket can
have only one request in flight); a socket goes back to the idle pool only after a complete round
trip. Lazy Pirate: an attempt that gets no reply in time closes its socket (LINGER 0) and the request
is sent again on a new socket with the *same* request id, which the daemon uses to apply a mutation
at most once. When every attempt timed out the caller gets a contract BUSY error made here
(``replies.unavailable`` / ``replies.outcome_unknown``), never an exception. Over tcp:// it speaks
CURVE; with a data dir to insist on, it checks that the daemon serves that store (``IdentityCheck``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import ulid
import zmq
import zmq.asyncio

from protocol import errors as E
from protocol import limits as L
from protocol.config import ENV_CURVE_CLIENT_KEY_FILE, ENV_CURVE_SERVER_KEY_FILE, store_id_path
from protocol.validation import HOST_REQUEST_ID_TOOLS
from protocol.wire import LOADING_KEY, encode_request

from .replies import outcome_unknown, unavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_ATTEMPTS = 3
PING_TIMEOUT_S = 0.5
IDLE_SOCKETS_MAX = 16
# While waiting for a reply the caller's watch (is the daemon process gone?) is asked this often, so a
# daemon that died is replaced at once instead of after the whole timeout.
WATCH_INTERVAL_S = 0.2
RESTARTS_PER_REQUEST = 3


def new_request_id() -> str:
    return str(ulid.ULID())


def _encode_problem(value: Any) -> str:
    """Why ``value`` cannot go into msgpack, as a constraint (never the value itself)."""
    try:
        msgpack.packb(value, use_bin_type=True)
    except OverflowError:
        return "integers must be between -2**63 and 2**64-1"
    except UnicodeEncodeError:
        return "text must be valid Unicode (no lone surrogates)"
    except ValueError:
        return f"nesting must be at most {L.MAX_NESTING_DEPTH} levels"
    except Exception:
        return "must be JSON data"
    return ""


def encode_or_error(op: str, args: dict[str, Any], request_id: str,
                    known: frozenset[str] = frozenset(), context: dict[str, Any] | None = None) -> bytes | dict[str, Any]:
    """The request frame, or a VALIDATION_ERROR reply when the arguments cannot be encoded.

    ``known`` are the argument names that may be quoted in a message (the tool's own parameters);
    any other name is untrusted input and is not echoed.
    """
    try:
        frame = encode_request(op, args, request_id, context)
    except Exception:
        for key, value in args.items():
            problem = _encode_problem(value)
            if problem:
                name = key if key in known else "an argument"
                return E.error_reply(E.VALIDATION_ERROR, f"{name}: {problem}")
        return E.error_reply(E.VALIDATION_ERROR, "arguments must be JSON data that fits the request encoding")
    if len(frame) > L.MAX_REQUEST_BYTES:
        return E.error_reply(E.VALIDATION_ERROR, f"request must be at most {L.MAX_REQUEST_BYTES} bytes encoded")
    return frame


def ipc_path(endpoint: str) -> str | None:
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


class DaemonRestarted(Exception):
    """The watch found the daemon gone and started another: send the request again at once."""


class DaemonClient:
    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT_S, attempts: int = DEFAULT_ATTEMPTS,
                 context: zmq.asyncio.Context | None = None, curve_server_key: bytes | None = None,
                 curve_client_keys: tuple[bytes, bytes] | None = None,
                 expected_data_dir: str | None = None) -> None:
        self.endpoint = endpoint
        # CURVE (for a tcp:// daemon): the daemon's public key, and a key pair of our own — the persistent
        # one whose public key is in the daemon's allow-list (a fresh pair only reaches --curve-allow-any)
        self.curve_server_key = curve_server_key
        if curve_server_key is not None and curve_client_keys is None:
            curve_client_keys = read_curve_client_keys(None)
        self._curve_keys = (curve_client_keys or zmq.curve_keypair()) if curve_server_key is not None else None
        # Endpoint identity: the daemon must serve this data dir (checked by ping once per connection)
        self.identity = IdentityCheck(expected_data_dir) if expected_data_dir else None
        # With an identity to keep: a monitor per socket, so a connection that dropped while the socket sat
        # idle (libzmq reconnects it silently, maybe to another daemon now on the path) is noticed.
        self._monitors: dict[zmq.asyncio.Socket, zmq.asyncio.Socket] = {}
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self._ctx = context
        self._own_ctx = context is None
        # Idle connected REQ sockets. Each call takes one (or opens one), so concurrent calls still
        # run concurrently; a socket goes back only after a complete round trip, so a timed-out
        # socket (in REQ's send-wait state, its late reply pending) is never reused: Lazy Pirate.
        self._idle: list[zmq.asyncio.Socket] = []

    @property
    def ctx(self) -> zmq.asyncio.Context:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        return self._ctx

    def close(self) -> None:
        for sock in self._idle:
            self._close_socket(sock)
        self._idle.clear()
        if self._ctx is not None and self._own_ctx:
            self._ctx.destroy(linger=0)
            self._ctx = None

    async def request(self, op: str, args: dict[str, Any], request_id: str | None = None, *,
                      timeout: float | None = None, attempts: int | None = None,
                      known: frozenset[str] = frozenset(), context: dict[str, Any] | None = None,
                      watch: Callable[[], Awaitable[bool]] | None = None) -> dict[str, Any]:
        """Send one request; return the daemon's reply map or a contract error. Never raises (except
        cancellation). ``watch``, asked while a reply is awaited, returns True when it found the daemon
        process gone and started a new one: the request then goes again at once, same request id."""
        if self.identity is not None and op != "ping":
            refused = await self.identity.verify(self)
            if refused is not None:
                return refused
        rid = request_id or new_request_id()
        frame = encode_or_error(op, args, rid, known, context)
        if isinstance(frame, dict):
            return frame
        timeout = self.timeout if timeout is None else timeout
        level = logging.DEBUG if op == "ping" else logging.WARNING  # probes are expected to fail at times
        attempts = self.attempts if attempts is None else max(1, attempts)
        # A daemon that is still opening its store answers "loading" at once: wait that out within
        # the time the attempts would have had, then pass the (retryable) answer on.
        load_deadline = time.monotonic() + timeout * attempts
        attempt = restarts = 0
        sent: list[bool] = []  # one entry per attempt whose request left this process
        while attempt < attempts:
            try:
                raw = await self._attempt(frame, timeout, watch if restarts < RESTARTS_PER_REQUEST else None, sent)
            except DaemonRestarted:
                log.warning("the storage daemon went away during %s (request %s); sent again to its successor",
                            op, rid)
                restarts += 1
                continue
            except asyncio.TimeoutError:
                log.log(level, "daemon did not answer %s (request %s) within %.1fs (attempt %d)",
                        op, rid, timeout, attempt + 1)
                attempt += 1
                continue
            except zmq.ZMQError as exc:
                log.log(level, "daemon request %s (request %s) failed: %s (attempt %d)", op, rid, exc, attempt + 1)
                await asyncio.sleep(min(timeout, 0.1))
                attempt += 1
                continue
            reply = self._decode(raw, op)
            if op != "ping" and reply.pop(LOADING_KEY, False) is True:
                err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
                pause = min(1.0, max(0.01, err.get("retry_after_ms", 100) / 1000))
                if time.monotonic() + pause < load_deadline:
                    await asyncio.sleep(pause)
                    continue
            return reply
        if sent and op in HOST_REQUEST_ID_TOOLS:
            # The daemon may have applied it (and died, or been stopped, before answering). A request that
            # never left (no daemon to take it) is known not to have been applied: plain "unavailable".
            return outcome_unknown(rid)
        return unavailable()

    async def _attempt(self, frame: bytes, timeout: float, watch: Callable[[], Awaitable[bool]] | None = None,
                       sent: list[bool] | None = None) -> bytes:
        if self._idle:
            sock = self._idle.pop()
        else:
            sock = self.ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if self._curve_keys is not None:
                sock.curve_serverkey = self.curve_server_key
                sock.curve_publickey, sock.curve_secretkey = self._curve_keys
            if self.identity is not None:
                self._monitors[sock] = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(self.endpoint)
        done = False
        # One deadline for the whole attempt, send included (with IMMEDIATE a send waits for a connection)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            await self._settle(sock.send(frame), deadline, watch)
            if sent is not None:
                sent.append(True)
            reply = await self._settle(sock.recv(), deadline, watch)
            done = True
            return reply
        finally:
            if done and len(self._idle) < IDLE_SOCKETS_MAX:
                self._idle.append(sock)
            else:
                self._close_socket(sock)
            if not done and self.identity is not None:
                self.identity.reset()  # whoever answers next may be another daemon: ask again

    def _close_socket(self, sock: zmq.asyncio.Socket) -> None:
        mon = self._monitors.pop(sock, None)
        if mon is not None:
            sock.disable_monitor()
            mon.close(linger=0)
        sock.close(linger=0)

    def drop_disconnected(self) -> bool:
        """Close the idle sockets whose connection dropped since they were last used; True if any did
        (whoever answers them now may be another daemon)."""
        lost = False
        for sock in list(self._idle):
            mon = self._monitors.get(sock)
            if mon is not None and mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._idle.remove(sock)
                self._close_socket(sock)
                lost = True
        return lost

    @staticmethod
    async def _settle(fut: "asyncio.Future[Any]", deadline: float,
                      watch: Callable[[], Awaitable[bool]] | None) -> Any:
        """The socket's send or receive future's result by ``deadline`` (the loop's clock), asking
        ``watch`` every WATCH_INTERVAL_S meanwhile; a future left pending is cancelled (the caller then
        closes the socket). The future is awaited as it is — asyncio.timeout, not wait_for: no task per
        request (a task and its extra loop turns cost ~0.1 ms of CPU per call, on the path of every
        write). A watch that starts a daemon runs outside the deadline, as a start may take longer."""
        if fut.done():
            return fut.result()
        try:
            if watch is None:
                async with asyncio.timeout_at(deadline):
                    return await fut
            loop = asyncio.get_running_loop()
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError()
                done, _ = await asyncio.wait({fut}, timeout=min(WATCH_INTERVAL_S, left))
                if done:
                    return fut.result()
                if await watch():
                    raise DaemonRestarted()
        finally:
            fut.cancel()  # a no-op when it finished

    @staticmethod
    def _decode(raw: bytes, op: str) -> dict[str, Any]:
        try:
            reply = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except Exception:
            reply = None
        if not isinstance(reply, dict):
            log.error("undecodable reply from the daemon to %s (%d bytes)", op, len(raw))
            return E.error_reply(E.INTERNAL_ERROR, "the storage daemon sent an unreadable reply")
        return reply

    async def probe(self, timeout: float = PING_TIMEOUT_S) -> str:
        """One quick liveness probe: "ready", "loading" (a daemon answers but is still opening its
        store) or "down"."""
        path = ipc_path(self.endpoint)
        if path is not None and not os.path.exists(path):
            return "down"
        reply = await self.request("ping", {}, timeout=timeout, attempts=1)
        if reply.get("status") != "OK":
            return "down"
        if self.identity is not None:
            self.identity.judge(reply, self.endpoint)
        return "loading" if reply.get("loading") else "ready"

    async def ping(self, timeout: float = PING_TIMEOUT_S) -> bool:
        """True iff a daemon answered and is ready to serve."""
        return await self.probe(timeout) == "ready"


class IdentityCheck:
    """Is the daemon at our endpoint the one of our data directory? Its ping says which store it serves
    (``store_id``, ``data_dir``); a front-end that knows its data dir refuses a daemon serving another one
    — it would read and write the wrong store — with a contract IO_ERROR (not BUSY: retrying will not
    help until someone fixes the endpoint configuration or stops the other daemon).

    The store matches when its ``store_id`` equals the one in our data dir, or (no id file yet, e.g. before
    the first start) when its real path equals ours. Verified once, then again only after an attempt
    failed or a pooled connection dropped (the daemon may have been replaced) — never a ping per call."""

    MESSAGE = ("the storage daemon at this endpoint serves another data directory; refusing to use it "
               "(fix --endpoint / CONVMEM_ENDPOINT, or stop that daemon)")

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.realpath(data_dir)
        self.store_id_file = store_id_path(data_dir)
        self.verified = False
        self.foreign: str | None = None  # the other daemon's data dir, when refused

    def reset(self) -> None:
        self.verified = False

    async def verify(self, client: "DaemonClient") -> dict[str, Any] | None:
        """None when the daemon may be used (or did not answer: the request then says so itself)."""
        if client.drop_disconnected():
            self.verified = False
        if not self.verified:
            reply = await client.request("ping", {}, timeout=min(client.timeout, 2.0), attempts=1)
            if reply.get("status") == "OK":
                self.judge(reply, client.endpoint)
        if self.foreign is not None:
            return E.error_reply(E.IO_ERROR, self.MESSAGE)
        return None

    def judge(self, ping: dict[str, Any], endpoint: str) -> None:
        their_id, their_dir = ping.get("store_id"), ping.get("data_dir")
        if not isinstance(their_id, str) and not isinstance(their_dir, str):
            self.verified, self.foreign = True, None  # a daemon too old to say: nothing to compare
            return
        try:
            with open(self.store_id_file, encoding="ascii") as f:
                ours = f.read().strip()
        except (OSError, ValueError):
            ours = None
        same = (ours is not None and their_id == ours) or their_dir == self.data_dir
        if not same and self.foreign != their_dir:
            log.error("the storage daemon at %s serves %s, not this front-end's data directory %s: refusing "
                      "to use it", endpoint, their_dir, self.data_dir)
        self.verified, self.foreign = True, (None if same else str(their_dir))


def identity_data_dir(named: str | None, endpoint: str, data_dir: str) -> str | None:
    """The data dir a client may insist the daemon serves: one that was named (option or
    $CONVMEM_DATA_DIR), or any when the endpoint is the data dir's own. A bare CONVMEM_ENDPOINT to some
    daemon elsewhere, with no data dir named, is taken as it is."""
    from protocol.config import default_endpoint

    if named or os.environ.get("CONVMEM_DATA_DIR") or endpoint == default_endpoint(data_dir):
        return data_dir
    return None


def read_curve_client_keys(path: str | None) -> tuple[bytes, bytes] | None:
    """This client's persistent CURVE key pair from a zmq.auth secret certificate (``*.key_secret`` as
    written by ``zmq.auth.create_certificates``); None when no file is named."""
    path = path or os.environ.get(ENV_CURVE_CLIENT_KEY_FILE)
    if not path:
        return None
    import zmq.auth

    public, secret = zmq.auth.load_certificate(path)
    if secret is None or len(public) != 40 or len(secret) != 40:
        raise ValueError("the CURVE client key file must be a secret-key certificate (public-key and secret-key, "
                         "40 Z85 characters each; see zmq.auth.create_certificates)")
    return public, secret


def read_curve_server_key(path: str | None) -> bytes | None:
    """The daemon's CURVE public key (40 Z85 characters) from a file; None when no file is named."""
    path = path or os.environ.get(ENV_CURVE_SERVER_KEY_FILE)
    if not path:
        return None
    with open(path, "rb") as f:
        key = f.read().strip()
    if len(key) != 40:
        raise ValueError("the CURVE server key file must hold a 40-character Z85 public key")
    return key
